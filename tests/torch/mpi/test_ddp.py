"""The DDP hook against torch's own DDP over gloo, and allreduce_gradients against a float64
mean exchanged with plain mpi4py."""
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mpi4py import MPI

import mpicomp
import mpicomp.torch as mt

WORLD = MPI.COMM_WORLD
RANK, N = WORLD.Get_rank(), WORLD.Get_size()


def toy_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def toy_batch(step, rank=RANK):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(6, 8, generator=g)
    return x, torch.sin(x[:, :4] * 2) + 0.1 * torch.randn(6, 4, generator=g)


def ddp(model, group=None):
    # a tiny bucket cap: several buckets, so per-bucket state is exercised
    return torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0005, process_group=group)


@pytest.mark.parametrize("codec", ["none", "lz4", "auto:lz4"])
def test_exact_hook_matches_plain_ddp(gloo, codec):
    mpicomp.config.min_bytes = 0  # lz4 even on these small buckets
    mesh = mt.Mesh(dp=N)
    plain, hooked = ddp(toy_model()), ddp(toy_model(), mesh.torch_group("dp"))
    hooked.register_comm_hook(*mt.ddp_hook(codec=codec, comm=mesh.dp))
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (plain, hooked)]
    for step in range(3):
        x, y = toy_batch(step)
        grads = []
        for m, opt in zip((plain, hooked), opts):
            opt.zero_grad()
            F.mse_loss(m(x), y).backward()
            grads.append([p.grad.clone() for p in m.parameters()])
            opt.step()
        for a, b in zip(*grads):
            if N == 2:
                torch.testing.assert_close(b, a, rtol=0, atol=0)
            else:
                # Both scale by 1/3 first, then gloo's ring and MPICH add the three terms
                # in different orders: a few ulps of the largest term apart
                torch.testing.assert_close(b, a, rtol=0, atol=4e-7 * a.abs().max().item())


def train_toy(codec, error_feedback, steps=60, overlap=True):
    model = toy_model()
    m = ddp(model)
    state, hook = mt.ddp_hook(codec=codec, comm=WORLD, error_feedback=error_feedback, overlap=overlap)
    m.register_comm_hook(state, hook)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    x, y = toy_batch(0)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.mse_loss(m(x), y)
        loss.backward()
        opt.step()
        losses.append(WORLD.allreduce(loss.item()) / N)
    return model, state, losses


@pytest.mark.parametrize("codec", ["int8", "powersgd:rank=2"])
def test_overlapped_hook_trains_as_the_blocking_one(gloo, codec):
    """The same compressed allreduces, started on mpicomp's worker instead of inside the hook:
    the same parameters, bit for bit, and the same losses."""
    mpicomp.config.min_bytes = 0
    runs = [train_toy(codec, True, steps=8, overlap=overlap) for overlap in (True, False)]
    (m1, _, l1), (m2, _, l2) = runs
    assert l1 == l2
    for a, b in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(a, b)


class _Bucket:
    """What the hook reads of torch's GradBucket."""

    def __init__(self, buffer, params):
        self._buffer, self._params = buffer, params

    def buffer(self):
        return self._buffer

    def index(self):
        return 0

    def parameters(self):
        return self._params

    def gradients(self):
        return [self._buffer]


def test_the_hook_returns_before_its_allreduce_is_done():
    """overlap: the Future comes back at once while the last rank is still away, and completes
    with the mean once it arrives."""
    state, hook = mt.ddp_hook(codec="int8", comm=WORLD, error_feedback=False)
    buf = torch.full((1 << 16,), float(RANK))
    if RANK == N - 1:
        time.sleep(0.5)
    t0 = time.perf_counter()
    fut = hook(state, _Bucket(buf, [torch.nn.Parameter(buf.clone())]))
    returned = time.perf_counter() - t0
    if RANK != N - 1:
        assert returned < 0.2 and not fut.done(), returned
    out = fut.wait()
    assert out is buf and torch.allclose(buf, torch.full_like(buf, (N - 1) / 2), atol=0.02)


def test_an_error_in_an_overlapped_bucket_reaches_its_future():
    state, hook = mt.ddp_hook(codec="int8", comm=WORLD, error_feedback=False)
    buf = torch.ones((1 << 16) + RANK)  # a different size on every rank
    fut = hook(state, _Bucket(buf, [torch.nn.Parameter(buf.clone())]))
    with pytest.raises(mpicomp.ShapeMismatchError):
        fut.wait()
    ok = hook(state, _Bucket(torch.ones(1 << 16), [torch.nn.Parameter(torch.ones(1))]))
    assert torch.allclose(ok.wait(), torch.ones(1 << 16), atol=0.01)  # the communicator still works


def test_sign_with_error_feedback_still_learns(gloo):
    mpicomp.config.min_bytes = 0  # compress even these small buckets
    model, state, losses = train_toy("sign", True)
    assert losses[-1] < 0.5 * losses[0], losses
    assert len(state.buckets) > 1 and all(b.feedback.residual is not None for _, b in state.buckets.values())
    members = sorted(i for ids, _ in state.buckets.values() for i in ids)
    assert members == sorted(id(p) for p in model.parameters())  # one residual per bucket, all covered
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert all(torch.equal(flat, other) for other in WORLD.allgather(flat)), "replicas diverged"


def test_powersgd_hook_learns_and_keeps_a_state_per_matrix(gloo):
    mt.traffic.reset()
    mpicomp.reset_stats()
    model, state, losses = train_toy("powersgd:rank=2", True)
    assert losses[-1] < 0.5 * losses[0], losses
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    assert all(torch.equal(flat, other) for other in WORLD.allgather(flat)), "replicas diverged"
    states = [s for _, b in state.buckets.values() for s in b.states]
    # only the 32 x 8 weight shrinks at rank 2 (2 * (32 + 8) * 2 <= 256); the rest go exactly
    assert sorted(tuple(s.q.shape) for s in states if s.q is not None) == [(8, 2)]
    assert sorted(s.feedback.residual.numel() for s in states if s.feedback.residual is not None) == [32 * 8]
    assert mt.traffic["dp", "gradients"] == mpicomp.stats()["allreduce"]["bytes_wire"] > 0  # counted on the worker


def test_allreduce_gradients_none_is_the_mean():
    model = toy_model()
    unused = torch.nn.Parameter(torch.ones(3))
    model.register_parameter("unused", unused)
    x, y = toy_batch(0)
    F.mse_loss(model(x), y).backward()
    used = [p for p in model.parameters() if p is not unused]
    mine = [p.grad.double().numpy().copy() for p in used]
    mt.allreduce_gradients(model, comm=WORLD, codec="none", bucket_bytes=600)
    assert len(mt.ddp._reducers[model][1].buckets) > 2
    for p, g in zip(used, mine):
        np.testing.assert_allclose(p.grad.double().numpy(), WORLD.allreduce(g, op=MPI.SUM) / N, rtol=1e-6, atol=1e-8)
    assert torch.equal(unused.grad, torch.zeros(3))


def test_allreduce_gradients_error_feedback_converges_to_the_mean():
    """Same gradients every step: with int4 + error feedback (one residual per bucket, kept
    between calls) the average of the results approaches the exact mean; without it the
    rounding of every step is the same and does not average out."""
    mpicomp.config.min_bytes = 0
    errors = {}
    for ef in (True, False):
        model = toy_model()
        x, y = toy_batch(0)
        F.mse_loss(model(x), y).backward()
        mine = [p.grad.clone() for p in model.parameters()]
        exact = [WORLD.allreduce(g.double().numpy(), op=MPI.SUM) / N for g in mine]
        total = [np.zeros_like(e) for e in exact]
        steps = 20
        for _ in range(steps):
            for p, g in zip(model.parameters(), mine):
                p.grad = g.clone()
            mt.allreduce_gradients(model, comm=WORLD, codec="int4", error_feedback=ef, bucket_bytes=1024)
            total = [t + p.grad.double().numpy() for t, p in zip(total, model.parameters())]
        scale = max(np.abs(e).max() for e in exact)
        errors[ef] = max(np.abs(t / steps - e).max() for t, e in zip(total, exact)) / scale
    assert errors[True] < 0.01, errors
    assert errors[False] > 5 * errors[True], errors


def test_mismatched_models_raise_on_every_rank():
    model = torch.nn.Linear(4, 4 + (RANK == 0))
    model(torch.ones(1, 4)).sum().backward()
    with pytest.raises(mpicomp.ShapeMismatchError):
        mt.allreduce_gradients(model, comm=WORLD, codec="int8")
    WORLD.Barrier()


def test_allreduce_gradients_powersgd_converges_with_error_feedback():
    """Same gradients every step: PowerSGD (rank 2, a residual and warm start per matrix)
    with error feedback averages out to the exact mean; without it the same projection
    repeats."""
    errors = {}
    for ef in (True, False):
        model = torch.nn.Linear(24, 16, bias=True)
        torch.manual_seed(RANK)
        model.weight.grad = torch.randn(16, 24)
        model.bias.grad = torch.randn(16)
        mine = [p.grad.clone() for p in model.parameters()]
        exact = [WORLD.allreduce(g.double().numpy(), op=MPI.SUM) / N for g in mine]
        total = [np.zeros_like(e) for e in exact]
        steps = 150
        for _ in range(steps):
            for p, g in zip(model.parameters(), mine):
                p.grad = g.clone()
            mt.allreduce_gradients(model, comm=WORLD, codec="powersgd:rank=2", error_feedback=ef)
            total = [t + p.grad.double().numpy() for t, p in zip(total, model.parameters())]
        assert np.allclose(total[1] / steps, exact[1], atol=1e-6)  # the bias goes exactly
        errors[ef] = np.abs(total[0] / steps - exact[0]).max() / np.abs(exact[0]).max()
    assert errors[True] < 0.05 and errors[False] > 4 * errors[True], errors
