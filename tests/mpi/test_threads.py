"""Threads (MPI_THREAD_MULTIPLE): each thread with its own communicator, all at once. A
communicator's first mpicomp call makes its private duplicate, a collective: made by two
threads at once on two communicators, it must not deadlock, whatever order the ranks'
threads get there in. Repeated with fresh communicators so that the race is met."""
import threading
import time

import numpy as np
import pytest

import mpicomp
from _mpiutil import WORLD, allreduce_bound, check_close, data

N, CALLS, ROUNDS = 50_000, 50, 4
CODECS = ("int8", "int4")


def in_threads(work, n, timeout):
    """Runs work(k) for k < n in n threads at once; the errors they raised, or fails when any
    is still running after `timeout` seconds (a deadlock: conftest then ends the job). Odd
    ranks start the threads in the opposite order, a moment apart, so that the ranks' threads
    reach their first call in different orders (the case that deadlocked)."""
    errors = []

    def guarded(k):
        try:
            work(k)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the main thread below
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(k,), daemon=True) for k in range(n)]
    for t in threads if WORLD.Get_rank() % 2 == 0 else threads[::-1]:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), f"threads still inside mpicomp after {timeout} s: deadlock"
    return errors


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_two_threads_first_use_of_their_own_dups(round_):
    xs = [data(WORLD, N, "threads", round_, k).astype(np.float32) for k in range(len(CODECS))]
    refs = [allreduce_bound(WORLD, mpicomp.codec(c), x.astype(np.float64), True, False, "float32")
            for c, x in zip(CODECS, xs)]
    comms = [WORLD.Dup() for _ in CODECS]  # new: their first mpicomp call is made in the threads
    results = [[] for _ in CODECS]

    def work(k):
        for _ in range(CALLS):
            results[k].append(mpicomp.allreduce(xs[k], comm=comms[k], codec=CODECS[k]))

    errors = in_threads(work, len(CODECS), timeout=60)
    for c in comms:
        c.Free()
    assert not errors, errors
    for k, (exact, bound) in enumerate(refs):
        assert len(results[k]) == CALLS
        for y in results[k]:
            check_close(y.astype(np.float64), exact, bound, CODECS[k])
