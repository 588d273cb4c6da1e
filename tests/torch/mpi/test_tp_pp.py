"""Tensor-parallel layers and the GPipe schedule against the same model in one process
(every rank builds the reference from the same seed and compares its own shard)."""
import copy

import pytest
import torch
import torch.nn.functional as F
from mpi4py import MPI

import mpicomp
import mpicomp.torch as mt

WORLD = MPI.COMM_WORLD
RANK, N = WORLD.Get_rank(), WORLD.Get_size()
TOL = {"rtol": 1e-5, "atol": 1e-6}


def tp_and_reference(policy=None):
    torch.manual_seed(3)
    ref = torch.nn.Sequential(torch.nn.Linear(8, 12), torch.nn.GELU(), torch.nn.Linear(12, 8))
    torch.manual_seed(3)
    tp = torch.nn.Sequential(mt.ColumnParallelLinear(8, 12, WORLD, policy=policy), torch.nn.GELU(),
                             mt.RowParallelLinear(12, 8, WORLD, policy=policy))
    return tp, ref


def run(model, seed=5):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 5, 8, generator=g).requires_grad_()
    w = torch.randn(4, 5, 8, generator=g)
    y = model(x)
    (y * w).sum().backward()
    return y.detach(), x.grad


def test_mlp_matches_single_process():
    tp, ref = tp_and_reference()
    (y, gx), (y_ref, gx_ref) = run(tp), run(ref)
    torch.testing.assert_close(y, y_ref, **TOL)
    torch.testing.assert_close(gx, gx_ref, **TOL)
    k = 12 // N
    rows = slice(RANK * k, (RANK + 1) * k)
    torch.testing.assert_close(tp[0].weight.grad, ref[0].weight.grad[rows], **TOL)
    torch.testing.assert_close(tp[0].bias.grad, ref[0].bias.grad[rows], **TOL)
    torch.testing.assert_close(tp[2].weight.grad, ref[2].weight.grad[:, rows], **TOL)
    torch.testing.assert_close(tp[2].bias.grad, ref[2].bias.grad, **TOL)


def test_compressed_tp_is_close_and_counted():
    mpicomp.config.min_bytes = 0
    mt.traffic.reset()
    tp, ref = tp_and_reference(mt.Policy(tp={"forward": "int8", "backward": "bf16"}))
    mpicomp.reset_stats()
    (y, gx), (y_ref, gx_ref) = run(tp), run(ref)
    assert 0 < (y - y_ref).abs().max() < 0.02 * y_ref.abs().max()
    assert 0 < (gx - gx_ref).abs().max() < 0.02 * gx_ref.abs().max()
    sent = dict(mt.traffic.bytes)
    assert set(sent) == {("tp", "forward"), ("tp", "backward")}
    assert sum(sent.values()) == mpicomp.stats()["allreduce"]["bytes_wire"]  # the core's own count, by purpose
    assert 0 < sent["tp", "forward"] < sent["tp", "backward"]  # int8 against bf16, on tensors of one size


def test_layer_arguments():
    with pytest.raises(mpicomp.ArgumentError, match=f"out_features={N + 1} is not divisible by the tensor-parallel "
                                                    f"size {N}"):
        mt.ColumnParallelLinear(4, N + 1, WORLD)
    with pytest.raises(mpicomp.ArgumentError, match="policy must be an mpicomp.torch.Policy or None, got str"):
        mt.RowParallelLinear(N, 4, WORLD, policy="int8")


def stages_and_reference():
    torch.manual_seed(11)
    ref = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh()) for _ in range(N)])
    return copy.deepcopy(ref[RANK]), ref


def micro_batches(count=3):
    g = torch.Generator().manual_seed(2)
    return [torch.randn(4, 6, generator=g) for _ in range(count)], [torch.randn(4, 6, generator=g) for _ in range(count)]


def test_gpipe_matches_single_process():
    stage, ref = stages_and_reference()
    xs, ts = micro_batches()
    loss = mt.GPipe(stage, WORLD, activation_shape=(4, 6)).step(xs, ts, F.mse_loss)
    ref_loss = sum(F.mse_loss(ref(x), t) for x, t in zip(xs, ts)) / len(xs)
    ref_loss.backward()
    assert loss == pytest.approx(ref_loss.item(), rel=1e-6)
    for p, q in zip(stage.parameters(), ref[RANK].parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)


def test_gpipe_compressed_traffic():
    mpicomp.config.min_bytes = 0
    mt.traffic.reset()
    mpicomp.reset_stats()
    stage, ref = stages_and_reference()
    xs, ts = micro_batches()
    loss = mt.GPipe(stage, WORLD, (4, 6), policy=mt.Policy(pp="bf16")).step(xs, ts, F.mse_loss)
    ref_loss = sum(F.mse_loss(ref(x), t) for x, t in zip(xs, ts)).item() / len(xs)
    assert loss == pytest.approx(ref_loss, rel=1e-2)
    sent = {k: mt.traffic[k] for k in (("pp", "forward"), ("pp", "backward"))}
    assert sum(sent.values()) == mpicomp.stats()["send/recv"]["bytes_wire"] > 0  # the core's own count, by purpose
    assert (sent["pp", "forward"] == 0) == (RANK == N - 1) and (sent["pp", "backward"] == 0) == (RANK == 0)


def test_gpipe_wrong_shape_raises_on_every_stage():
    stage, _ = stages_and_reference()
    if RANK == 0:
        stage = torch.nn.Sequential(stage, torch.nn.Linear(6, 5))
    xs, ts = micro_batches()
    match = r"stage 0 output has shape \(4, 5\), but activation_shape is \(4, 6\)"
    with pytest.raises(mpicomp.ArgumentError, match=match if RANK == 0 else "stage 0 failed in its forward pass"):
        mt.GPipe(stage, WORLD, (4, 6)).step(xs, ts, F.mse_loss)
    WORLD.Barrier()


def test_gpipe_stages_disagreeing_on_the_shape_raise_on_every_stage():
    stage, _ = stages_and_reference()
    xs, ts = micro_batches()
    shape = (4, 7) if RANK == N - 1 else (4, 6)
    match = "24 float32 .* expects .* 28 float32" if RANK == N - 1 else f"stage {N - 1} failed in its forward pass"
    with pytest.raises(mpicomp.ShapeMismatchError, match=match):
        mt.GPipe(stage, WORLD, shape).step(xs, ts, F.mse_loss)
    WORLD.Barrier()


@pytest.mark.parametrize("codec", ["lz4", "lossless"])
def test_lossless_tp_and_pp_traffic_changes_no_number(codec):
    """Issue 25's hybrid design: lossless codecs for tensor- and pipeline-parallel traffic,
    where lossy error would change training. Forward outputs, input gradients and weight
    gradients equal the uncompressed layers' (bit for bit on 2 ranks; with more, the
    reductions add the partial sums in another order than MPI's)."""
    mpicomp.config.min_bytes = 0
    same = torch.equal if N == 2 else lambda a, b: torch.allclose(a, b, rtol=1e-6, atol=1e-7)
    plain, _ = tp_and_reference()
    packed, _ = tp_and_reference(mt.Policy(tp=codec))
    for a, b in zip(run(plain), run(packed)):
        assert same(a, b)
    for p, q in zip(plain.parameters(), packed.parameters()):
        assert same(p.grad, q.grad)
    xs, ts = micro_batches()
    losses, grads = [], []
    for policy in (None, mt.Policy(pp=codec)):
        stage, _ = stages_and_reference()
        losses.append(mt.GPipe(stage, WORLD, (4, 6), policy=policy).step(xs, ts, F.mse_loss))
        grads.append([p.grad for p in stage.parameters()])
    assert losses[0] == losses[1] and all(torch.equal(a, b) for a, b in zip(*grads))
