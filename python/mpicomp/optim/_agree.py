"""How DiLoCo's ranks agree that nobody failed, so that an error on one rank (bad argument,
unreadable checkpoint, an exception in the training loop) raises on every rank instead of
leaving the others blocked in the next collective.

Each agreement is a few tiny allgathers: over ``comm`` (the workers), and with islands also
over ``inner_comm`` and ``comm`` again, so news from any rank reaches every rank of the grid
in at most two hops. A rank that failed between two agreement points takes part in the
next one with its error; every rank then raises: the failed one its own error, the others
an error of the same mpicomp class (ShapeMismatchError for errors that are not mpicomp's)
naming the rank and the message.
"""

from mpi4py import MPI

from .. import errors

__all__ = ["agree", "raise_reported"]


def _report(error):
    return (MPI.COMM_WORLD.Get_rank(), type(error).__name__, str(error))


def _first_difference(mine, theirs):
    for key in mine:
        if theirs.get(key) != mine[key]:
            return key, theirs.get(key), mine[key]
    return next(((k, theirs[k], None) for k in theirs if k not in mine), (None, None, None))


def agree(who, comms, error=None, signature=None):
    """Collective over every communicator of ``comms`` (in order; all ranks the same list).

    error: this rank's exception or None. signature: a dict every rank must have equal
    (configuration, shapes, step count), or None. Returns None when no rank failed and all
    signatures agree; otherwise every rank raises (see the module docstring)."""
    report = None if error is None else _report(error)
    for comm in comms:
        got = comm.allgather((report, signature))
        if report is None:
            report = next((r for r, _ in got if r is not None), None)
        if report is None and signature is not None:
            for other, theirs in got:
                if theirs != signature:
                    key, value, own = _first_difference(signature, theirs)
                    report = (MPI.COMM_WORLD.Get_rank(), "ShapeMismatchError",
                              f"{who}: ranks disagree on {key}: {value!r} on one rank, {own!r} on rank "
                              f"{MPI.COMM_WORLD.Get_rank()}")
                    break
    if error is not None:
        raise error
    if report is not None:
        raise_reported(who, report)


def raise_reported(who, report):
    """Raises, on a rank that did not fail, the error another rank reported."""
    rank, name, message = report
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.MpicompError):
        raise cls(message if message.startswith(who) else f"{who}: rank {rank}: {message}")
    raise errors.ShapeMismatchError(f"{who}: rank {rank} failed ({name}: {message}); every rank stops here")
