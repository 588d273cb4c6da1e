"""config.timeout_s (MPICOMP_TIMEOUT): a rank that never reaches a call makes the ranks that
wait for it raise CommTimeoutError once the time is up, instead of hanging (issue 21 item 6).
The communicator is refused from then on (the call's messages may still arrive); a fresh one
works. A recv that nobody sends to times out too, and leaves its communicator usable."""
import time

import numpy as np
import pytest

import mpicomp
from _mpiutil import WORLD, node_per_rank
from _ranks import wait_asleep

pytestmark = pytest.mark.waits

TIMEOUT = 1.0


@pytest.fixture
def timeout():
    old = mpicomp.config.timeout_s
    mpicomp.config.timeout_s = TIMEOUT
    yield
    mpicomp.config.timeout_s = old


def _input(coll, n, p):
    return np.full(n * (p if coll == "reduce_scatter" else 1), 1.0, np.float32)


def _expected(coll, n, p):
    return np.full(n * (p if coll == "allgather" else 1), 1.0 if coll == "allgather" else float(p), np.float32)


# Compressed, uncompressed through MPI, small enough to ride the agreement step, and codec
# bound's small sums (their largest input agreed with the call, then MPI's sums or its own).
@pytest.mark.parametrize("codec,n", [("int8", 100_000), ("none", 100_000), ("none", 64), ("bound:rel=1e-3", 64)])
@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
def test_a_rank_that_never_arrives(timeout, coll, codec, n):
    fn = getattr(mpicomp, coll)
    comm = WORLD.Dup()
    p, r = comm.Get_size(), comm.Get_rank()
    x = _input(coll, n, p)
    fn(x, comm=comm, codec=codec)  # the set-up (private duplicate) is MPI's blocking Comm_dup
    if r != p - 1:  # the last rank skips the call
        t0 = time.perf_counter()
        with pytest.raises(mpicomp.CommTimeoutError, match="timeout_s"):
            fn(x, comm=comm, codec=codec)
        waited = time.perf_counter() - t0
        assert 0.9 * TIMEOUT <= waited < TIMEOUT + 10, waited
        t0 = time.perf_counter()
        with pytest.raises(mpicomp.CommTimeoutError, match="earlier call"):
            fn(x, comm=comm, codec=codec)
        assert time.perf_counter() - t0 < 0.5 * TIMEOUT  # refused at once
    wait_asleep(WORLD)
    comm.Free()
    fresh = WORLD.Dup()
    np.testing.assert_allclose(fn(x, comm=fresh, codec=codec), _expected(coll, n, p), rtol=1e-2)
    fresh.Free()


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter"])
def test_a_rank_that_never_arrives_between_nodes(timeout, coll):
    """Every rank a node of its own: small uncompressed calls ride the agreement with 16 KiB
    whole in its header messages (cpp/coll/exchange.h: rest), reduce-scatters by recursive
    halving; the ranks waiting for one that never arrives raise within the timeout."""
    fn = getattr(mpicomp, coll)
    comm = node_per_rank()
    fn(np.ones(8, np.float32) if coll == "allreduce" else np.ones(8 * comm.size, np.float32), comm=comm)
    p, r = comm.Get_size(), comm.Get_rank()
    x = _input(coll, 4096 // (p if coll == "reduce_scatter" else 1), p)  # 16 KiB of input
    if r != p - 1:
        t0 = time.perf_counter()
        with pytest.raises(mpicomp.CommTimeoutError, match="timeout_s"):
            fn(x, comm=comm, codec="none")
        assert 0.9 * TIMEOUT <= time.perf_counter() - t0 < TIMEOUT + 10
    wait_asleep(WORLD)
    comm.Free()


def test_a_rank_that_never_arrives_at_an_allreduce_in_pieces(timeout):
    """An uncompressed allreduce above cache_bytes goes in pieces, agreed as a whole first: the
    ranks waiting for one that never arrives raise there, within the timeout, and a fresh
    communicator then works."""
    mpicomp.config.cache_bytes = 2 << 20
    comm = WORLD.Dup()
    p, r = comm.Get_size(), comm.Get_rank()
    x = np.ones(3 << 20 >> 1, np.float32)  # 6 MiB: pieces of 1 MiB
    mpicomp.allreduce(x, comm=comm, codec="none")
    if r != p - 1:
        t0 = time.perf_counter()
        with pytest.raises(mpicomp.CommTimeoutError, match="timeout_s"):
            mpicomp.allreduce(x, comm=comm, codec="none")
        assert 0.9 * TIMEOUT <= time.perf_counter() - t0 < TIMEOUT + 10
    wait_asleep(WORLD)
    comm.Free()
    fresh = WORLD.Dup()
    assert (mpicomp.allreduce(x, comm=fresh, codec="none") == p).all()
    fresh.Free()


def test_without_a_timeout_a_late_rank_is_waited_for():
    """timeout_s 0 waits as MPI does: a rank two timeouts late still meets the others."""
    old = mpicomp.config.timeout_s
    mpicomp.config.timeout_s = 0
    try:
        if WORLD.Get_rank() == WORLD.Get_size() - 1:
            time.sleep(2 * TIMEOUT)
        y = mpicomp.allreduce(np.ones(1000, np.float32), comm=WORLD, codec="none")
    finally:
        mpicomp.config.timeout_s = old
    assert (y == WORLD.Get_size()).all()


def test_python_waits_half_an_hour_by_default():
    """torch's process-group default (the interposer has none: tests/test_pmpi_limits.py)."""
    import os
    if "MPICOMP_TIMEOUT" not in os.environ:
        assert mpicomp.config.timeout_s == 1800


def test_a_communicators_own_timeout_wins_and_its_duplicates_inherit_it():
    """mpicomp.set_timeout(comm, s): calls on comm, and on duplicates made of it afterwards,
    time out after s with no configured limit; calls on other communicators do not. A waiting
    rank sleeps rather than spins (its CPU time stays well below the time it waited)."""
    old = mpicomp.config.timeout_s
    mpicomp.config.timeout_s = 0
    try:
        comm = WORLD.Dup()
        mpicomp.set_timeout(comm, TIMEOUT)
        dup = comm.Dup()
        x = np.ones(100_000, np.float32)
        for c in (comm, dup):
            mpicomp.allreduce(x, comm=c, codec="int8")  # set-up
        late = comm.Get_rank() == comm.Get_size() - 1
        if not late:
            for c in (comm, dup):
                t0, cpu0 = time.perf_counter(), time.process_time()
                with pytest.raises(mpicomp.CommTimeoutError, match=r"still waiting after 1 s"):
                    mpicomp.allreduce(x, comm=c, codec="int8")
                waited, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                assert 0.9 * TIMEOUT <= waited < TIMEOUT + 10 and cpu < 0.5 * waited, (waited, cpu)
        other = WORLD.Dup()  # no limit
        if late:
            time.sleep(3 * TIMEOUT)
        assert (mpicomp.allreduce(x, comm=other, codec="int8") == WORLD.Get_size()).all()
        wait_asleep(WORLD)
        for c in (comm, dup, other):
            c.Free()
    finally:
        mpicomp.config.timeout_s = old


def test_set_timeout_checks_its_arguments():
    for bad in (-1, "5", float("nan"), True):
        with pytest.raises(mpicomp.ArgumentError, match="set_timeout"):
            mpicomp.set_timeout(WORLD, bad)
    with pytest.raises(mpicomp.ArgumentError, match="communicator"):
        mpicomp.set_timeout(None, 1.0)


@pytest.mark.parametrize("n", [10, 100_000])
def test_recv_from_a_rank_that_never_sends(timeout, n):
    comm = WORLD.Dup()
    r = comm.Get_rank()
    x = np.arange(n, dtype=np.float32)
    if r == 0:
        with pytest.raises(mpicomp.CommTimeoutError):
            mpicomp.recv(np.empty(n, np.float32), source=1, comm=comm, codec="int8", tag=3)
    wait_asleep(comm)
    # The cancelled receive took nothing: the next message between the pair is the one sent.
    if r == 1:
        mpicomp.send(x, 0, comm=comm, codec="int8", tag=3)
    elif r == 0:
        y = mpicomp.recv(np.empty(n, np.float32), source=1, comm=comm, codec="int8", tag=3)
        np.testing.assert_allclose(y, x, atol=n / 100)
    comm.Free()


def test_timeout_setting_is_checked():
    for bad in (-1, "5", float("nan"), True):
        with pytest.raises(mpicomp.ArgumentError, match="timeout_s"):
            mpicomp.config.timeout_s = bad
