"""ZeRO1 against torch's own optimizers on one process, with the mean gradient of every
rank's batch; replicas bit-identical with lossy codecs; state 1/N; checkpoints across rank
counts; bad arguments raising on every rank."""
import copy

import pytest
import torch
from _toy import loss_of, mean_gradient, toy_batch, toy_model
from mpi4py import MPI

import mpicomp
from mpicomp.optim import CheckpointError, ZeRO1

WORLD = MPI.COMM_WORLD
RANK, N = WORLD.Get_rank(), WORLD.Get_size()


def zero1_step(model, opt, step, comm=WORLD):
    opt.zero_grad()
    loss_of(model, toy_batch(comm.Get_rank(), step)).backward()
    opt.step()


def reference_step(model, opt, step, size=N):
    mean_gradient(model, [toy_batch(r, step) for r in range(size)])
    opt.step()


def assert_same_on_all_ranks(model, comm=WORLD):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = comm.allgather(flat.numpy().tobytes())
    assert all(b == everyone[0] for b in everyone), "replicas differ"


# codec "auto" with a lossless codec: compressed or not, as measured, the values are exact.
@pytest.mark.parametrize("codecs", [{}, {"grad_codec": "auto:lz4", "param_codec": "auto:lz4"}], ids=["default", "auto"])
@pytest.mark.parametrize("cls,kwargs", [(torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
                                        (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}),
                                        (torch.optim.Adam, {"lr": 1e-2})])
def test_matches_single_process_optimizer_on_mean_gradient(cls, kwargs, codecs):
    model, ref = toy_model(), toy_model()
    assert sum(p.numel() for p in model.parameters()) % N != 0  # uneven shards
    opt, ref_opt = ZeRO1(model.parameters(), cls, **codecs, **kwargs), cls(ref.parameters(), **kwargs)
    mpicomp.reset_stats()
    for step in range(5):
        zero1_step(model, opt, step)
        reference_step(ref, ref_opt, step)
        for p, q in zip(model.parameters(), ref.parameters()):
            # summation order differs (MPI's reduction vs the reference's loop): float32 rounding
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert_same_on_all_ranks(model)
    if codecs and N > 1:  # measured once per collective on its communicator
        assert mpicomp.stats()["reduce_scatter"]["probes"] == mpicomp.stats()["allgather"]["probes"] == 1


def test_param_groups_and_lr_scheduler():
    model, ref = toy_model(), toy_model()

    def groups(m):
        return [{"params": list(m[0].parameters()), "lr": 0.02}, {"params": list(m[2].parameters())}]

    opt = ZeRO1(groups(model), torch.optim.AdamW, lr=0.01)
    ref_opt = torch.optim.AdamW(groups(ref), lr=0.01)
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=1, gamma=0.5) for o in (opt, ref_opt)]
    for step in range(4):
        zero1_step(model, opt, step)
        reference_step(ref, ref_opt, step)
        for s in scheds:
            s.step()
        assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in ref_opt.param_groups]
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_optimizer_state_is_one_nth():
    model, ref = toy_model(), toy_model()
    opt, ref_opt = ZeRO1(model.parameters(), torch.optim.AdamW), torch.optim.AdamW(ref.parameters())
    zero1_step(model, opt, 0)
    reference_step(ref, ref_opt, 0)
    full = sum(v.numel() * v.element_size() for s in ref_opt.state.values() for v in s.values())
    mine = opt.optimizer_state_bytes()
    numel = sum(p.numel() for p in ref.parameters())
    shard = -(-numel // N)
    owned = max(0, min(numel, (RANK + 1) * shard) - RANK * shard)  # the last shard holds the padding
    assert mine == 2 * 4 * owned + 4  # exp_avg and exp_avg_sq of the shard, and one step counter
    assert full == 2 * 4 * numel + 4 * len(ref_opt.state)  # torch: moments, and a step counter per tensor
    assert sum(WORLD.allgather(mine)) == 2 * 4 * numel + 4 * N  # each element's moments on one rank only
    assert mine <= 2 * 4 * shard + 4 < full / N + 8 + 4


def test_replicas_bit_identical_with_lossy_codecs():
    mpicomp.config.min_bytes = 0  # compress even this small model
    model, exact = toy_model(), toy_model()
    opt = ZeRO1(model.parameters(), torch.optim.AdamW, grad_codec="int4", param_codec="int8",
                error_feedback=True, lr=1e-2)
    exact_opt = ZeRO1(exact.parameters(), torch.optim.AdamW, lr=1e-2)
    for step in range(4):
        zero1_step(model, opt, step)
        zero1_step(exact, exact_opt, step)
        assert_same_on_all_ranks(model)
    assert opt.feedback.residual is not None and opt.feedback.residual.abs().sum() > 0
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    lay = opt._layout
    owned = flat[lay.lo:min(lay.hi, lay.numel)]
    # the model holds decoded values, not the owner's exact master: the codec really ran
    assert not torch.equal(owned, opt.master[:owned.numel()])
    torch.testing.assert_close(owned, opt.master[:owned.numel()], rtol=0, atol=0.02)
    for p, q in zip(model.parameters(), exact.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0.05)


def test_state_dict_from_two_ranks_loads_on_all():
    """Trained and saved on ranks {0, 1}; loaded on all N ranks (2 -> 3 with -n 3) and on one;
    the next step must equal torch's AdamW given the same state."""
    pair = WORLD.Split(0 if RANK < 2 else MPI.UNDEFINED, RANK)
    sd = None
    if pair != MPI.COMM_NULL:
        model = toy_model()
        opt = ZeRO1(model.parameters(), torch.optim.AdamW, comm=pair, lr=1e-2, weight_decay=0.1)
        for step in range(3):
            zero1_step(model, opt, step, comm=pair)
        sd = opt.state_dict()
        pair.Free()
    sd = WORLD.bcast(sd, root=0)
    for comm in (WORLD, MPI.COMM_SELF):
        model = toy_model(seed=5)  # other values: all must come from the checkpoint
        opt = ZeRO1(model.parameters(), torch.optim.AdamW, comm=comm, lr=0.5)
        opt.load_state_dict(sd)
        assert opt.param_groups[0]["lr"] == 1e-2
        again = opt.state_dict()
        assert torch.equal(again["master"], sd["master"]) and again["checksum"] == sd["checksum"]
        # independent reference: torch's AdamW with the checkpoint's moments and step
        ref = toy_model(seed=5)
        ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
        offset = 0
        with torch.no_grad():
            for p in ref.parameters():
                n = p.numel()
                p.copy_(sd["master"][offset:offset + n].view_as(p))
                ref_opt.state[p] = {k: (v[offset:offset + n].view_as(p).clone() if v.dim() else v.clone())
                                    for k, v in sd["state"][0].items()}
                offset += n
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.equal(p, q)
        zero1_step(model, opt, 10, comm=comm)
        reference_step(ref, ref_opt, 10, size=comm.Get_size())
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_bad_checkpoints_raise_on_every_rank():
    model = toy_model()
    opt = ZeRO1(model.parameters(), torch.optim.AdamW, lr=1e-2)
    zero1_step(model, opt, 0)
    sd = opt.state_dict()
    corrupt = copy.deepcopy(sd)
    corrupt["master"][3] += 1.0
    with pytest.raises(CheckpointError, match="checksum"):
        opt.load_state_dict(corrupt)
    with pytest.raises(CheckpointError, match="not an mpicomp.optim checkpoint"):
        opt.load_state_dict(torch.optim.AdamW(toy_model().parameters()).state_dict())
    other = torch.nn.Linear(6, 4)
    other_opt = ZeRO1(other.parameters(), torch.optim.AdamW)
    with pytest.raises(mpicomp.ShapeMismatchError, match="another model"):
        other_opt.load_state_dict(sd)
    sgd = ZeRO1(toy_model().parameters(), torch.optim.SGD, lr=0.1)
    with pytest.raises(CheckpointError, match="optimizer torch.optim.adamw.AdamW"):
        sgd.load_state_dict(sd)
    # only the last rank's copy is corrupt: it says so, the others raise its class and name it
    with pytest.raises(CheckpointError, match="checksum" if RANK == N - 1 else f"rank {N - 1}"):
        opt.load_state_dict(corrupt if RANK == N - 1 else sd)
    opt.load_state_dict(sd)  # still usable, and all ranks in step
    zero1_step(model, opt, 1)
    assert_same_on_all_ranks(model)


@pytest.mark.parametrize("case", ["unknown class", "not a class", "empty params", "bad kwarg", "bad codec"])
def test_bad_arguments_raise_on_every_rank(case):
    def args():  # fresh for each call: parameters() is a generator, used up by one call
        return {"unknown class": ([toy_model().parameters()], torch.nn.Linear, {}),
                "not a class": ([toy_model().parameters()], "adamw", {}),
                "empty params": ([[]], torch.optim.AdamW, {}),
                "bad kwarg": ([toy_model().parameters()], torch.optim.SGD, {"lr": 0.1, "betas": (0.9, 0.99)}),
                "bad codec": ([toy_model().parameters()], torch.optim.AdamW, {"grad_codec": "powersgd"})}[case]
    params, cls, kwargs = args()
    error = mpicomp.CodecError if case == "bad codec" else mpicomp.ArgumentError
    with pytest.raises(error):
        ZeRO1(*params, cls, **kwargs)
    # the same mistake on one rank only: it raises its own error, the others its class, naming it
    mine = (*args()[0], cls) if RANK == 1 else (toy_model().parameters(), torch.optim.AdamW)
    kw = kwargs if RANK == 1 else {}
    with pytest.raises(error, match=None if RANK == 1 else "rank 1"):
        ZeRO1(*mine, **kw)
    ZeRO1(toy_model().parameters(), torch.optim.AdamW)  # the communicator still works


def test_models_that_differ_between_ranks():
    model = toy_model() if RANK else torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Linear(8, 3))
    with pytest.raises(mpicomp.ShapeMismatchError, match="ranks disagree"):
        ZeRO1(model.parameters(), torch.optim.AdamW)
    with pytest.raises(mpicomp.ShapeMismatchError, match="ranks disagree"):
        ZeRO1(toy_model().parameters(), torch.optim.AdamW, lr=0.1 if RANK else 0.2)
