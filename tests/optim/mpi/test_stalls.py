"""A rank that stalls in the middle of training (it never reaches the step the others are in)
makes every other rank raise CommTimeoutError within the timeout and a few seconds, in each
optimizer, instead of hanging: ZeRO1's step, ACCO's round, DiLoCo's outer sync (with and
without overlap) and AMSP's step. Each optimizer runs on a duplicate of the world, since the
communicators of a timed-out call are not used again."""
import time

import pytest
import torch
from _toy import loss_of, toy_batch, toy_model
from mpi4py import MPI

import mpicomp
from mpicomp.optim import ACCO, AMSP, DiLoCo, ZeRO1

WORLD = MPI.COMM_WORLD
RANK, N = WORLD.Get_rank(), WORLD.Get_size()
TIMEOUT = 2.0
STALLED = N - 1


@pytest.fixture
def timeout(monkeypatch):
    monkeypatch.setattr(mpicomp.config, "timeout_s", TIMEOUT)  # restored after the test


def closure_for(model, step):
    def closure():
        loss = loss_of(model, toy_batch(RANK, step))
        loss.backward()
        return loss
    return closure


def sharded_step(opt, model, step):
    opt.zero_grad()
    closure_for(model, step)()
    opt.step()


def diloco_step(opt, model, step):
    opt.zero_grad()
    closure_for(model, step)()
    opt.step()


def acco_step(opt, model, step):
    opt.step(closure_for(model, step))


CASES = {
    "zero1": (lambda m, c: ZeRO1(m.parameters(), torch.optim.AdamW, comm=c, grad_codec="int8"), sharded_step),
    "acco": (lambda m, c: ACCO(m.parameters(), torch.optim.AdamW, comm=c, grad_codec="int8"), acco_step),
    "amsp": (lambda m, c: AMSP(m, torch.optim.AdamW, shard=(1, N, N), comm=c, codec="int8"), sharded_step),
    "diloco": (lambda m, c: DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), comm=c, sync_every=1,
                                    codec="int8"), diloco_step),
    "diloco-overlap": (lambda m, c: DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), comm=c, sync_every=1,
                                            codec="int8", overlap=True), diloco_step),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stalled_rank_makes_the_others_raise(timeout, case):
    if N < 2:
        pytest.skip("needs 2 ranks")
    make, step = CASES[case]
    comm = WORLD.Dup()
    model = toy_model()
    opt = make(model, comm)
    step(opt, model, 0)  # every rank
    step(opt, model, 1)
    if RANK != STALLED:
        t0 = time.perf_counter()
        with pytest.raises(mpicomp.CommTimeoutError):
            for s in range(2, 6):  # DiLoCo with overlap lands a sync one step late
                step(opt, model, s)
        waited = time.perf_counter() - t0
        assert waited < TIMEOUT + 10, waited
    else:
        time.sleep(TIMEOUT + 1)  # stalled: never reaches the step
    WORLD.Barrier()
