"""MPI calls made from Python (mpi4py) that wait at most a timeout, as the core's do: the
exact operations of the torch backend, the optimizers' own messages and the agreements
above the core (mpicomp._agree). Each posts a
non-blocking call and polls it, backing off to sleeping between polls as the core's waits do
(``_core.WAIT_BACKOFF``, cpp/coll/deadline.h: a rank whose peer is late or gone does not hold
a core for the whole timeout), and raises
CommTimeoutError when the time is up. A collective request cannot be cancelled (MPI): its
communicator must not be used again, which the callers see to."""
import pickle
import time

import numpy as np
from mpi4py import MPI

from . import _core
from .errors import BackendError, CommTimeoutError

__all__ = ["wait", "call", "allgather", "Timed"]

_SPIN, _NAP, _MAX_NAP = _core.WAIT_BACKOFF
_abandoned = []  # requests of timed-out collectives (MPI cannot cancel them)


def wait(request, seconds, what):
    """Waits for an mpi4py request, at most ``seconds`` (0 or None: no limit); raises
    CommTimeoutError naming ``what`` when the time is up, BackendError when MPI reports a
    failure (a lost rank: ``MPI_ERR_PROC_FAILED`` under Open MPI's ULFM)."""
    start = time.monotonic()
    nap = 0.0
    while not call(what, request.Test):
        elapsed = time.monotonic() - start
        if seconds and elapsed >= seconds:
            _abandoned.append(request)  # it holds its buffers, which a late rank may still fill
            raise CommTimeoutError(f"{what}: still waiting after {seconds:g} s (the timeout: config.timeout_s, "
                                   f"mpicomp.set_timeout, a torch group's timeout=): a rank of the communicator "
                                   f"has not reached this call, or has stopped in it")
        if elapsed > _SPIN:
            nap = min(nap + _NAP, _MAX_NAP)
            time.sleep(nap)


def call(what, fn, *args, **kwargs):
    """fn(*args, **kwargs), an mpi4py call, its MPI error raised as BackendError."""
    try:
        return fn(*args, **kwargs)
    except MPI.Exception as e:
        raise BackendError(f"{what}: MPI failed ({e.Get_error_string()}): a rank of the communicator has "
                           f"failed, or MPI has") from e


def allgather(comm, obj, seconds, what):
    """``comm.allgather(obj)`` (any picklable object) within ``seconds``."""
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.zeros(comm.Get_size(), np.int64)
    wait(call(what, comm.Iallgather, np.array([data.size], np.int64), sizes), seconds, what)
    out = np.empty(int(sizes.sum()), np.uint8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    wait(call(what, comm.Iallgatherv, data, [out, (sizes, offsets), MPI.BYTE]), seconds, what)
    return [pickle.loads(out[o:o + n].tobytes()) for o, n in zip(offsets, sizes)]


class Timed:
    """A communicator whose collectives wait at most ``seconds`` (None: the communicator's own
    timeout, mpicomp.set_timeout, else config.timeout_s, at each call; 0: no limit): the
    buffer ones (``Allreduce``, ``Allgather``, ``Bcast``, ..., ``Barrier``) posted
    non-blocking and polled, the object ones (``allgather``, ``bcast``, ``gather``,
    ``scatter``) as pickled bytes the same way. ``comm`` is the communicator."""

    def __init__(self, comm, seconds=None):
        self.comm, self._seconds = comm, seconds

    @property
    def seconds(self):
        if self._seconds is not None:
            return self._seconds
        from ._comm import timeout_of
        return timeout_of(self.comm)

    def Get_rank(self):
        return self.comm.Get_rank()

    def Get_size(self):
        return self.comm.Get_size()

    def __getattr__(self, name):  # Allreduce -> Iallreduce, waited for
        if not name[:1].isupper():
            raise AttributeError(name)
        start = getattr(self.comm, "I" + name[0].lower() + name[1:])
        return lambda *args, **kwargs: wait(call(f"MPI_{name}", start, *args, **kwargs), self.seconds, f"MPI_{name}")

    def allgather(self, obj):
        return allgather(self.comm, obj, self.seconds, "allgather")

    def bcast(self, obj, root=0):
        mine = self.comm.Get_rank() == root
        data = np.frombuffer(pickle.dumps(obj), np.uint8) if mine else None
        n = np.array([data.size if mine else 0], np.int64)
        self.Bcast(n, root=root)
        buf = data.copy() if mine else np.empty(int(n[0]), np.uint8)
        self.Bcast(buf, root=root)
        return pickle.loads(buf.tobytes())

    def gather(self, obj, root=0):
        data = np.frombuffer(pickle.dumps(obj), np.uint8)
        mine = self.comm.Get_rank() == root
        sizes = np.zeros(self.comm.Get_size(), np.int64)
        self.Gather(np.array([data.size], np.int64), sizes if mine else None, root=root)
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        out = np.empty(int(sizes.sum()), np.uint8) if mine else None
        self.Gatherv(data, [out, (sizes, offsets), MPI.BYTE] if mine else None, root=root)
        return [pickle.loads(out[o:o + k].tobytes()) for o, k in zip(offsets, sizes)] if mine else None

    def scatter(self, objs, root=0):
        mine = self.comm.Get_rank() == root
        parts = [np.frombuffer(pickle.dumps(o), np.uint8) for o in objs] if mine else []
        sizes = np.array([p.size for p in parts], np.int64) if mine else None
        n = np.zeros(1, np.int64)
        self.Scatter(sizes, n, root=root)
        buf = np.empty(int(n[0]), np.uint8)
        send = None
        if mine:
            send = [np.concatenate(parts) if parts else np.empty(0, np.uint8),
                    (sizes, np.concatenate([[0], np.cumsum(sizes)[:-1]])), MPI.BYTE]
        self.Scatterv(send, buf, root=root)
        return pickle.loads(buf.tobytes())
