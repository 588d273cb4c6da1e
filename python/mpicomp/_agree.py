"""Agree or fail on every rank, within a timeout: the one agreement of the layers above the
core (the optimizers, the torch backend's exact operations), so that an error on one rank (a
bad argument, an unreadable checkpoint, an exception in the training loop) or ranks that
disagree (configuration, shapes, step counts) raise on every rank, and a lost rank raises
CommTimeoutError, instead of leaving the others blocked in the next collective.

Each agreement is one tiny allgather per communicator given, in order (DiLoCo's islands:
the workers, the island, the workers again, so news from any rank of the grid reaches every
rank in two hops), through ``_waits.Timed`` (at most its timeout). The rule, on every rank:
the rank that failed raises its own exception; the others raise an error of its class
(mpicomp's classes; ShapeMismatchError for any other, e.g. the user's), naming the rank and
its message; ranks whose signatures differ raise ShapeMismatchError naming what differs.
"""
from mpi4py import MPI

from . import errors

__all__ = ["agree", "raise_reported"]


def _difference(who, a, b, describe):
    """What differs between two ranks' signatures: the first key of a dict, else both."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in list(a) + [k for k in b if k not in a]:
            if a.get(key) != b.get(key):
                return f"{who}: ranks disagree on {key}: {b.get(key)!r} on one rank, {a.get(key)!r} on another"
    return f"{who}: ranks disagree: one rank has {describe(a)}, another {describe(b)}"


def agree(comms, who, error=None, signature=None, describe=repr):
    """Collective over every communicator of ``comms`` (``_waits.Timed``; all ranks the same
    list). ``error``: this rank's exception or None; ``signature``: what every rank must have
    equal, or None. Returns None when no rank failed and the signatures agree; otherwise
    raises on every rank (module docstring)."""
    report = None if error is None else (MPI.COMM_WORLD.Get_rank(), type(error).__name__, str(error))
    for comm in comms:
        got = comm.allgather((report, signature))
        if report is None:
            report = next((r for r, _ in got if r is not None), None)
        if report is None and signature is not None:
            first = got[0][1]
            differ = [s for _, s in got if s != first]
            if differ:
                report = (None, "ShapeMismatchError", _difference(who, first, differ[0], describe))
    if error is not None:
        raise error
    if report is not None:
        raise_reported(who, report)


def raise_reported(who, report):
    """Raises, on a rank that did not fail, the error another rank reported."""
    rank, name, message = report
    if rank is None:  # a disagreement: the same message everywhere
        raise errors.ShapeMismatchError(message)
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.MpicompError):
        raise cls(f"{who}: rank {rank}: {message}")
    raise errors.ShapeMismatchError(f"{who}: rank {rank} failed ({name}: {message}); every rank stops here")
