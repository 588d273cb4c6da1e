"""A rank that stalls in the middle of training (it never reaches the step the others are in)
makes every other rank raise CommTimeoutError within the timeout and a few seconds, in each
optimizer, instead of hanging: ZeRO1's step, ACCO's round, DiLoCo's outer sync (with and
without overlap) and AMSP's step. Each optimizer runs on a duplicate of the world, since the
communicators of a timed-out call are not used again."""
import datetime
import time

import pytest
from _cases import CASES
from _toy import toy_model
from mpi4py import MPI

import mpicomp

WORLD = MPI.COMM_WORLD
RANK, N = WORLD.Get_rank(), WORLD.Get_size()
TIMEOUT = 2.0
STALLED = N - 1


@pytest.mark.waits
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("set_by", ["config", "timeout="])
def test_a_stalled_rank_makes_the_others_raise(monkeypatch, case, set_by):
    """The timeout from config.timeout_s, set after the optimizer was made (every call reads
    it), or from the optimizer's own timeout= (config left at its 30 minutes)."""
    if N < 2:
        pytest.skip("needs 2 ranks")
    make, step = CASES[case]
    comm = WORLD.Dup()
    model = toy_model()
    opt = make(model, comm, **({"timeout": datetime.timedelta(seconds=TIMEOUT)} if set_by == "timeout=" else {}))
    if set_by == "config":
        monkeypatch.setattr(mpicomp.config, "timeout_s", TIMEOUT)  # restored after the test
    step(opt, model, RANK, 0)  # every rank
    step(opt, model, RANK, 1)
    if RANK != STALLED:
        t0 = time.perf_counter()
        with pytest.raises(mpicomp.CommTimeoutError):
            for s in range(2, 6):  # DiLoCo with overlap lands a sync one step late
                step(opt, model, RANK, s)
        waited = time.perf_counter() - t0
        assert waited < TIMEOUT + 10, waited
    else:
        time.sleep(TIMEOUT + 1)  # stalled: never reaches the step
    WORLD.Barrier()
    assert mpicomp.timeout_of(comm) == mpicomp.config.timeout_s  # the caller's communicator is left as it was


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_timeout_on_one_rank_raises_on_every_rank(case):
    make, _ = CASES[case]
    with pytest.raises(mpicomp.ArgumentError, match="timeout must be"):
        make(toy_model(), WORLD, timeout=-1.0 if RANK == 0 else 30.0)
