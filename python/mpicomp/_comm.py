"""The private communicators mpicomp runs its collectives on.

Each user communicator gets a duplicate (made on first use, by all its ranks, inside a
collective call) cached as an MPI attribute: mpicomp's messages never match the user's, and
the duplicate is freed with the user's communicator. Non-blocking calls get a second
duplicate and one worker thread per communicator, which runs them in the order they were
started, the same order on every rank (as MPI requires of non-blocking collectives)."""

import datetime
import threading
from concurrent.futures import ThreadPoolExecutor

from mpi4py import MPI

from . import _core
from .config import config
from .errors import ArgumentError

__all__ = ["private", "worker", "known", "set_timeout"]

_lock = threading.Lock()
_keyval = None
# handle -> context: a dict lookup is 4x cheaper than Get_attr, and matters for small
# messages. The attribute's delete callback removes the entry when the communicator is
# freed, so a reused handle never finds a stale context.
_by_handle = {}


class _Context:
    __slots__ = ("handle", "comm", "async_comm", "executor")

    def __init__(self, comm):
        self.handle = comm.handle
        self.comm = _dup(comm)
        self.async_comm = None
        self.executor = None

    def free(self):
        _by_handle.pop(self.handle, None)
        if self.executor is not None:
            self.executor.shutdown(wait=True)
        for c in (self.comm, self.async_comm):
            # One on which a call timed out is left allocated (deadline.h: its late messages
            # must not meet a new communicator that reuses its context).
            if c is not None and c != MPI.COMM_NULL and not MPI.Is_finalized() and not _core.timed_out(c):
                c.Free()


def _dup(comm):
    # Errors come back as return codes whatever the user's communicator says: the agreement
    # step discards a truncated receive from a rank that disagrees, then raises.
    d = comm.Dup()
    d.Set_errhandler(MPI.ERRORS_RETURN)
    return d


def _delete(comm, keyval, ctx):
    ctx.free()


def _context(comm):
    try:
        return _by_handle[comm.handle]
    except (KeyError, AttributeError):
        return _new_context(comm)


def checked(comm, who="", name="comm", intra=False, hint=""):
    """comm, when it is a usable mpi4py communicator (an intra-communicator if intra), else
    ArgumentError naming who checks, the argument and what it got: the one check of every
    layer (hint: what to pass, e.g. "mesh.dp")."""
    if not isinstance(comm, MPI.Intracomm if intra else MPI.Comm) or comm == MPI.COMM_NULL:
        kind = "an mpi4py intra-communicator" if intra else "an mpi4py communicator"
        raise ArgumentError(f"{who + ': ' if who else ''}{name} must be {kind}{f' ({hint})' if hint else ''}, "
                            f"got {comm!r}")
    return comm


def _new_context(comm):
    global _keyval
    checked(comm)
    if isinstance(comm, MPI.Intercomm):
        raise ArgumentError("comm must be an intra-communicator (mpicomp has no inter-communicator collectives)")
    with _lock:  # local calls only
        if _keyval is None:
            _keyval = MPI.Comm.Create_keyval(delete_fn=_delete)
    # The duplicate is made without the lock: Dup is collective, and a lock held across it
    # deadlocks two threads making their first calls on two communicators (rank 0's thread A
    # holds it waiting in comm1's Dup for rank 1, whose thread B holds it waiting in comm2's).
    # No other thread can be making this communicator's context: MPI forbids two threads'
    # collectives on one communicator at once.
    ctx = comm.Get_attr(_keyval)
    if ctx is None:
        ctx = _Context(comm)
        comm.Set_attr(_keyval, ctx)
    _by_handle[ctx.handle] = ctx
    return ctx


def known(comm):
    """The context of a communicator used before, or None."""
    return _by_handle.get(getattr(comm, "handle", None))


def private(comm):
    """The duplicate of `comm` that blocking collectives use."""
    return _context(comm).comm


def worker(comm):
    """(duplicate, executor) for non-blocking collectives on `comm`."""
    ctx = _context(comm)
    if ctx.executor is None:
        ctx.async_comm = _dup(comm)
        ctx.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpicomp")
    return ctx.async_comm, ctx.executor


def timeout_of(comm):
    """The seconds mpicomp's calls on ``comm`` wait: its own (set_timeout), else
    ``config.timeout_s``."""
    return _core.timeout_of(comm, config.timeout_s)


def inherit_timeout(source, comms):
    """Gives each of ``comms`` the timeout ``source`` has of its own (set_timeout), if any: a
    split, unlike a duplicate, does not inherit it. Without one they go on following
    ``config.timeout_s``, as ``source`` does."""
    own = _core.timeout_of(source, -1.0)
    if own >= 0:
        for c in comms:
            _core.set_timeout(c, own)


def set_timeout(comm, seconds):
    """mpicomp's calls on ``comm`` wait at most ``seconds`` (a number or a
    ``datetime.timedelta``; 0: no limit) for the other ranks, then raise CommTimeoutError,
    whatever ``config.timeout_s`` says: one communicator's timeout, as a torch process group
    has its own. Local (no communication); set it on every rank."""
    if isinstance(seconds, datetime.timedelta):
        seconds = seconds.total_seconds()
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 <= seconds <= 1e9:
        raise ArgumentError(f"set_timeout: seconds must be a number in [0, 1e9] (0: no limit), got {seconds!r}")
    checked(comm, "set_timeout")
    # On comm itself (send/recv use it; its later duplicates inherit it) and on the
    # duplicates mpicomp made already.
    ctx = known(comm)
    for c in (comm, *((ctx.comm, ctx.async_comm) if ctx else ())):
        if c is not None:
            _core.set_timeout(c, float(seconds))
