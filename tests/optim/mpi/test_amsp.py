"""AMSP against torch's AdamW on one process with the mean gradient of every rank's batch,
for every valid partition (DP, ZeRO-1/2/3 and the ones between), one node or 2-rank
"nodes"; the plan's bytes against mpicomp's own counters; memory against the formula;
invalid partitions raising on every rank."""
import copy

import pytest
import torch
from _toy import loss_of, mean_gradient, toy_batch, toy_model
from mpi4py import MPI

import mpicomp
from mpicomp.optim import AMSP, CheckpointError, ZeRO1, amsp

WORLD = MPI.COMM_WORLD
RANK, N = WORLD.Get_rank(), WORLD.Get_size()
# (shard, ranks_per_node): every valid partition on one node, and on nodes of 2 ranks
CASES = [(s, N) for s in amsp.valid_partitions(N, N)]
CASES += [(s, 2) for s in amsp.valid_partitions(N, 2) if N % 2 == 0 and N > 2]
KW = {"lr": 1e-2, "weight_decay": 0.1}


def amsp_step(model, opt, step, micro_batches=1):
    opt.zero_grad()
    for m in range(micro_batches):
        loss_of(model, toy_batch(RANK, micro_batches * step + m)).backward()
    opt.step()


def reference_step(model, opt, step, micro_batches=1):
    """Gradients summed over micro-batches, averaged over ranks (DDP with no_sync)."""
    mean_gradient(model, [toy_batch(r, micro_batches * step + m) for r in range(N) for m in range(micro_batches)])
    for p in model.parameters():
        p.grad *= micro_batches
    opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def assert_same_on_all_ranks(t):
    everyone = WORLD.allgather(t.numpy().tobytes())
    assert all(b == everyone[0] for b in everyone), "replicas differ"


@pytest.mark.parametrize("shard,rpn", CASES, ids=[f"{s}-rpn{r}" for s, r in CASES])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_matches_single_process_adamw(shard, rpn, micro_batches):
    model, ref = toy_model(), toy_model()
    opt = AMSP(model, torch.optim.AdamW, shard=shard, ranks_per_node=rpn, **KW)
    ref_opt = torch.optim.AdamW(ref.parameters(), **KW)
    for step in range(4):
        amsp_step(model, opt, step, micro_batches)
        reference_step(ref, ref_opt, step, micro_batches)
        got = opt.full_parameters()
        # summation order differs (MPI's reductions vs the reference's loop): float32 rounding
        torch.testing.assert_close(got, flat(ref), rtol=1e-5, atol=1e-6)
        assert_same_on_all_ranks(got)
        if shard[0] == 1:  # unsharded parameters: the model itself holds them
            assert torch.equal(flat(model), got)
    with torch.no_grad():  # evaluation works whatever the partition (s_p > 1 gathers)
        torch.testing.assert_close(loss_of(model, toy_batch(99, 0)), loss_of(ref, toy_batch(99, 0)),
                                   rtol=1e-5, atol=1e-6)


def test_sgd_and_lr_scheduler():
    shard = (1, N, N)
    model, ref = toy_model(), toy_model()
    opt = AMSP(model, torch.optim.SGD, shard=shard, lr=0.1, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (opt, ref_opt)]
    for step in range(3):
        amsp_step(model, opt, step)
        reference_step(ref, ref_opt, step)
        for s in scheds:
            s.step()
        torch.testing.assert_close(opt.full_parameters(), flat(ref), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shard,rpn", CASES, ids=[f"{s}-rpn{r}" for s, r in CASES])
def test_plan_bytes_equal_traffic_counters(shard, rpn):
    model = toy_model()
    opt = AMSP(model, torch.optim.AdamW, shard=shard, ranks_per_node=rpn, **KW)
    amsp_step(model, opt, 0)
    WORLD.Barrier()
    mpicomp.reset_stats()
    amsp_step(model, opt, 1, micro_batches=2)
    counted = mpicomp.stats()
    plan = opt.communication_plan(micro_batches=2)
    for op in ("allreduce", "reduce_scatter", "allgather"):
        mine = [c for c in plan if c.op == op]
        assert counted[op]["calls"] == sum(c.calls for c in mine), op
        assert counted[op]["bytes_wire"] == sum(c.bytes for c in mine), op
    assert {c.group for c in plan} <= set(amsp.Groups(shard, N, 0).color)


@pytest.mark.parametrize("shard", [(1, 1, 1), (1, 1, N), (1, N, N), (N, N, N)])
def test_memory_per_rank_against_formula(shard):
    model = toy_model()
    opt = AMSP(model, torch.optim.AdamW, shard=shard, **KW)
    amsp_step(model, opt, 0)
    mem = opt.memory()
    padded = sum(u.padded for u in opt.units)  # each module padded to a multiple of s_os
    s_p, s_g, s_os = shard
    # fp32 model: 4 bytes per parameter and gradient, 4 + 8 for the master and AdamW's moments
    assert mem["params"] == 4 * padded // s_p  # nothing gathered outside forward/backward
    assert mem["grads"] == 4 * padded // s_g
    assert mem["optimizer"] == 12 * padded // s_os + 4  # and AdamW's step counter
    formula = mem["formula"]
    numel = sum(p.numel() for p in toy_model().parameters())
    assert formula["params"] == 4 * numel / s_p and formula["optimizer"] == 12 * numel / s_os
    for key in ("params", "grads", "optimizer"):  # padding: at most s_os - 1 per module
        assert 0 <= mem[key] - formula[key] <= 12 * len(opt.units) * (s_os - 1) + 4


@pytest.mark.parametrize("codec", ["int8", "auto"])
def test_replicas_bit_identical_with_lossy_codecs(codec):
    saved, mpicomp.config.min_bytes = mpicomp.config.min_bytes, 0  # compress even this small model
    try:
        shard = (1, 1, N) if N % 2 else (2, 2, N)
        model, exact = toy_model(), toy_model()
        opt = AMSP(model, torch.optim.AdamW, shard=shard, codec=codec, **KW)
        exact_opt = AMSP(exact, torch.optim.AdamW, shard=shard, **KW)
        mpicomp.reset_stats()
        for step in range(3):
            amsp_step(model, opt, step)
            amsp_step(exact, exact_opt, step)
            assert_same_on_all_ranks(opt.full_parameters())
        stats = mpicomp.stats().values()
        if codec == "auto":  # compressed where measured to pay: the replicas agree either way
            assert sum(s["probes"] for s in stats) > 0
        else:
            assert sum(s["compressed"] for s in stats) > 0
        torch.testing.assert_close(opt.full_parameters(), exact_opt.full_parameters(), rtol=0, atol=0.05)
    finally:
        mpicomp.config.min_bytes = saved


@pytest.mark.parametrize("shard", [(1, 1, 1), (1, N, N)])
def test_error_feedback_brings_lossy_gradients_back_to_the_exact_run(shard):
    """int4 with error feedback: residuals kept per gradient stream, replicas identical;
    where only gradients travel lossy (data parallelism's allreduce) the parameters stay far
    closer to the uncompressed run's than without it. (With s_os > 1 the updated parameters
    are allgathered with the same lossy codec, an error no gradient feedback can undo.)"""
    saved, mpicomp.config.min_bytes = mpicomp.config.min_bytes, 0
    try:
        models = [toy_model() for _ in range(3)]
        opts = [AMSP(models[0], torch.optim.SGD, shard=shard, lr=0.05),
                AMSP(models[1], torch.optim.SGD, shard=shard, codec="int4:block=32", lr=0.05),
                AMSP(models[2], torch.optim.SGD, shard=shard, codec="int4:block=32", error_feedback=True, lr=0.05)]
        for step in range(12):
            for m, o in zip(models, opts):
                amsp_step(m, o, step)
        exact, plain, fed = (o.full_parameters() for o in opts)
        assert_same_on_all_ranks(fed)
        assert opts[2]._feedback and all(ef.residual is not None for ef in opts[2]._feedback.values())
        if shard == (1, 1, 1):
            assert (fed - exact).norm() < 0.5 * (plain - exact).norm()
    finally:
        mpicomp.config.min_bytes = saved


def test_codec_options_are_applied():
    """int4:block=32 runs with blocks of 32 (a scale per 32 elements: more bytes than int4's
    default 256), not as plain int4."""
    saved, mpicomp.config.min_bytes = mpicomp.config.min_bytes, 0
    try:
        sent = {}
        for spec in ("int4", "int4:block=32"):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(256, 256))  # blocks of 256 fill every shard
            opt = AMSP(model, torch.optim.SGD, shard=(1, 1, N), codec=spec, lr=0.05)
            assert set(opt.wire.values()) == {spec}
            mpicomp.reset_stats()
            opt.zero_grad()
            model(torch.randn(4, 256)).square().mean().backward()
            opt.step()
            sent[spec] = sum(s["bytes_wire"] for s in mpicomp.stats().values())
        # Per element: 0.5 byte + a 4-byte scale per block: 0.625 at 32, 0.516 at 256.
        assert 1.15 < sent["int4:block=32"] / sent["int4"] < 1.25, sent
    finally:
        mpicomp.config.min_bytes = saved


def test_codec_by_link():
    if N < 4:
        pytest.skip("two nodes of two ranks need 4 ranks")
    opt = AMSP(toy_model(), torch.optim.AdamW, shard=(1, 2, 4), ranks_per_node=2,
               codec={"intra": "none", "inter": "int8"}, **KW)
    assert opt.wire["grad"] == "none" and opt.wire["state"] == "int8" and opt.wire["update"] == "int8"


def test_nodes_come_from_the_node_layout():
    """Without ranks_per_node, AMSP takes mpicomp.node_layout's nodes: here emulated ones
    (config.ranks_per_node), which decide which groups span nodes; nodes that are not equal
    blocks raise on every rank."""
    saved = mpicomp.config.ranks_per_node
    try:
        for k in (2, 3):
            if k >= N:
                continue
            mpicomp.config.ranks_per_node = k
            comm = WORLD.Dup()
            if N % k:
                with pytest.raises(mpicomp.ArgumentError, match="not blocks"):
                    AMSP(toy_model(), torch.optim.AdamW, shard=(1, 1, N), comm=comm, **KW)
                continue
            opt = AMSP(toy_model(), torch.optim.AdamW, shard=(1, k, N), comm=comm,
                       codec={"intra": "none", "inter": "int8"}, **KW)
            assert opt.ranks_per_node == k
            assert opt.wire["grad"] == "none" and opt.wire["state"] == "int8"
    finally:
        mpicomp.config.ranks_per_node = saved


def _bad_partitions():
    bigger = next(s for s in range(2, 3 * N) if N % s)  # divides nothing
    return {"wrong order": (N, 1, N), "not dividing": (1, 1, bigger), "larger than the world": (1, 1, 2 * N),
            "not three": (1, N)}


@pytest.mark.parametrize("case", sorted(_bad_partitions()))
def test_invalid_partitions_raise_on_every_rank(case):
    shard = _bad_partitions()[case]
    with pytest.raises(mpicomp.ArgumentError):
        AMSP(toy_model(), torch.optim.AdamW, shard=shard, **KW)
    # the same mistake on one rank only: it raises its own error, the others its class, naming it
    mine = shard if RANK == N - 1 else (1, 1, N)
    with pytest.raises(mpicomp.ArgumentError, match="shard" if RANK == N - 1 else f"rank {N - 1}: .*shard"):
        AMSP(toy_model(), torch.optim.AdamW, shard=mine, **KW)
    AMSP(toy_model(), torch.optim.AdamW, shard=(1, 1, N), **KW)  # the communicator still works


def test_models_that_differ_between_ranks():
    with pytest.raises(mpicomp.ShapeMismatchError, match="ranks disagree"):
        AMSP(toy_model(seed=RANK % 2), torch.optim.AdamW, shard=(1, 1, N))


def test_prefetch_that_differs_between_ranks():
    """Prefetched gathers run on another communicator than waited ones: the ranks must agree."""
    if N == 1:
        pytest.skip("needs two ranks")
    with pytest.raises(mpicomp.ShapeMismatchError, match="prefetch"):
        AMSP(toy_model(), torch.optim.AdamW, shard=(N, N, N), prefetch=RANK == 0)


def test_checkpoint_moves_between_partitions_and_zero1():
    """Saved under one partition, loaded under another and into ZeRO1 on one rank: the next
    steps equal torch's AdamW continuing from the same state."""
    model = toy_model()
    opt = AMSP(model, torch.optim.AdamW, shard=(1, N, N) if N % 2 else (2, 2, N), **KW)
    ref = toy_model()
    ref_opt = torch.optim.AdamW(ref.parameters(), **KW)
    for step in range(3):
        amsp_step(model, opt, step)
        reference_step(ref, ref_opt, step)
    sd = opt.state_dict()
    torch.testing.assert_close(sd["master"], flat(ref), rtol=1e-5, atol=1e-6)
    for shard in [(1, 1, 1), (N, N, N)]:
        other = AMSP(toy_model(seed=5), torch.optim.AdamW, shard=shard, lr=0.5)
        other.load_state_dict(sd)
        assert other.param_groups[0]["lr"] == KW["lr"]
        assert torch.equal(other.full_parameters(), sd["master"])
        again = other.state_dict()
        assert again["checksum"] == sd["checksum"]
        amsp_step(other.model, other, 3)
        expected = copy_of(ref, ref_opt)
        reference_step(*expected, 3)
        torch.testing.assert_close(other.full_parameters(), flat(expected[0]), rtol=1e-5, atol=1e-6)
    zero1 = ZeRO1(toy_model(seed=5).parameters(), torch.optim.AdamW, comm=MPI.COMM_SELF, lr=0.5)
    zero1.load_state_dict(sd)
    assert torch.equal(zero1.state_dict()["master"], sd["master"])


def copy_of(model, opt):
    """An independent copy (torch's load_state_dict may keep the state's tensors)."""
    m = copy.deepcopy(model)
    o = torch.optim.AdamW(m.parameters(), **KW)
    o.load_state_dict(copy.deepcopy(opt.state_dict()))
    return m, o


def test_bad_checkpoints_raise_on_every_rank():
    model = toy_model()
    opt = AMSP(model, torch.optim.AdamW, shard=(1, 1, N), **KW)
    amsp_step(model, opt, 0)
    sd = opt.state_dict()
    corrupt = copy.deepcopy(sd)
    corrupt["master"][3] += 1.0
    with pytest.raises(CheckpointError, match="checksum"):
        opt.load_state_dict(corrupt)
    with pytest.raises(CheckpointError, match="checksum" if RANK == N - 1 else f"rank {N - 1}"):
        opt.load_state_dict(corrupt if RANK == N - 1 else sd)
    with pytest.raises(mpicomp.ShapeMismatchError, match="another model"):
        AMSP(torch.nn.Linear(6, 4), torch.optim.AdamW, shard=(1, 1, N)).load_state_dict(sd)
    opt.load_state_dict(sd)  # still usable, and all ranks in step
    amsp_step(model, opt, 1)
    assert_same_on_all_ranks(opt.full_parameters())


class _DictOut(torch.nn.Module):
    """A module owning its parameter and returning a dict holding a tuple."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(3, 6, generator=torch.Generator().manual_seed(3)))

    def forward(self, x):
        return {"out": (x @ self.weight.T,)}


def test_parameters_come_back_for_backward_through_nested_outputs():
    """With s_p = N a module's parameters are released after its forward; its backward must
    find them gathered again, whatever structure holds its output."""
    model, ref = _DictOut(), _DictOut()
    opt = AMSP(model, torch.optim.SGD, shard=(N, N, N), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    assert all(u.held_bytes() == 0 for u in opt.units)
    opt.zero_grad()
    # an input that needs a gradient: the backward reads the weight itself
    x, x_ref = toy_batch(RANK, 0)[0].requires_grad_(), toy_batch(RANK, 0)[0].requires_grad_()
    mpicomp.reset_stats()
    model(x)["out"][0].sum().backward()
    # gathered before the forward and again before the backward
    assert mpicomp.stats()["allgather"]["calls"] == 2
    opt.step()
    ref(x_ref)["out"][0].sum().backward()
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=0, atol=0)
    ref_opt.zero_grad()
    sum(ref(toy_batch(r, 0)[0])["out"][0].sum() for r in range(N)).backward()
    for p in ref.parameters():
        p.grad /= N
    ref_opt.step()
    torch.testing.assert_close(opt.full_parameters(), flat(ref), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shard", [(1, N, N), (N, N, N)])
def test_mixed_precision_is_the_papers_memory_model(shard):
    """bf16 parameters and gradients, fp32 master and AdamW moments: 2F/s_p + 2F/s_g +
    12F/s_os bytes per rank (the paper's formula), the plan's bytes equal the counters, and
    the training follows fp32's within bf16 rounding."""
    model, exact = toy_model().to(torch.bfloat16), toy_model()
    opt = AMSP(model, torch.optim.AdamW, shard=shard, **KW)
    exact_opt = AMSP(exact, torch.optim.AdamW, shard=shard, **KW)
    for step in range(3):
        mpicomp.reset_stats()
        opt.zero_grad()
        x, y = toy_batch(RANK, step)
        loss_of(model, (x.bfloat16(), y.bfloat16())).backward()
        opt.step()
        counted = mpicomp.stats()
        assert sum(c.bytes for c in opt.communication_plan()) == sum(counted[op]["bytes_wire"] for op in counted)
        amsp_step(exact, exact_opt, step)
    padded = sum(u.padded for u in opt.units)
    s_p, s_g, s_os = shard
    mem = opt.memory()
    assert (mem["params"], mem["grads"], mem["optimizer"]) == (2 * padded // s_p, 2 * padded // s_g,
                                                               12 * padded // s_os + 4)
    assert opt.full_parameters().dtype == torch.bfloat16
    torch.testing.assert_close(opt.full_parameters().float(), exact_opt.full_parameters(), rtol=0, atol=0.03)


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_next_modules_gather_travels_while_one_computes(monkeypatch, prefetch):
    """s_p = N: from the second step on (the first records the order), every module's gather
    but the first forward one is started ahead (iallgather) while the module before it
    computes; when a module's forward runs, the next one is already reserved, and no more
    than two modules hold their parameters at once. Training still equals torch's. With
    prefetch=False every gather waits for its module, one module held at a time."""
    def deep():
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 7), torch.nn.Tanh(),
                                   torch.nn.Linear(7, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    model, ref = deep(), deep()
    opt = AMSP(model, torch.optim.SGD, shard=(N, N, N), lr=0.1, prefetch=prefetch)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    started = []
    real = mpicomp.iallgather
    monkeypatch.setattr(mpicomp, "iallgather", lambda *a, **k: started.append(1) or real(*a, **k))
    held = []
    for i, u in enumerate(opt.units):  # after AMSP's own pre-hook: its gather and prefetch are done
        u.module.register_forward_pre_hook(lambda m, a, i=i: held.append((i, [v.gathered for v in opt.units])))
    U = len(opt.units)
    for step in range(3):
        started.clear()
        held.clear()
        amsp_step(model, opt, step)
        reference_step(ref, ref_opt, step)
        torch.testing.assert_close(opt.full_parameters(), flat(ref), rtol=1e-5, atol=1e-6)
        # forward: units 1..U-1; the backward's first unit after the forward; backward: U-1
        assert len(started) == (0 if step == 0 or not prefetch else 2 * U - 1), (step, len(started))
        for i, gathered in held:
            assert sum(gathered) <= (2 if prefetch else 1)
            if prefetch and step > 0 and i + 1 < U:
                assert gathered[i + 1], f"step {step}: module {i + 1} not prefetched during module {i}"
    assert not opt._inflight and all(u.held_bytes() == 0 for u in opt.units)
