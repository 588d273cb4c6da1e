"""MPI calls made from Python (mpi4py) that wait at most a timeout, as the core's do: the
exact operations of the torch backend and the agreements above the core. Each posts a
non-blocking call and polls it, sleeping between polls once 0.1 ms has passed (a rank whose
peer is late or gone does not hold a core for the whole timeout), and raises
CommTimeoutError when the time is up. A collective request cannot be cancelled (MPI): its
communicator must not be used again, which the callers see to."""
import pickle
import time

import numpy as np
from mpi4py import MPI

from .errors import CommTimeoutError

__all__ = ["wait", "allgather"]


def wait(request, seconds, what):
    """Waits for an mpi4py request, at most ``seconds`` (0 or None: no limit); raises
    CommTimeoutError naming ``what`` when the time is up."""
    start = time.monotonic()
    nap = 0.0
    while not request.Test():
        elapsed = time.monotonic() - start
        if seconds and elapsed >= seconds:
            raise CommTimeoutError(f"{what}: still waiting after {seconds:g} s: a rank of the communicator has not "
                                   f"reached this call, or has stopped in it")
        if elapsed > 1e-4:
            nap = min(nap + 1e-5, 1e-3)
            time.sleep(nap)


def allgather(comm, obj, seconds, what):
    """``comm.allgather(obj)`` (any picklable object) within ``seconds``."""
    data = np.frombuffer(pickle.dumps(obj), np.uint8)
    sizes = np.zeros(comm.Get_size(), np.int64)
    wait(comm.Iallgather(np.array([data.size], np.int64), sizes), seconds, what)
    out = np.empty(int(sizes.sum()), np.uint8)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    wait(comm.Iallgatherv(data, [out, (sizes, offsets), MPI.BYTE]), seconds, what)
    return [pickle.loads(out[o:o + n].tobytes()) for o, n in zip(offsets, sizes)]
