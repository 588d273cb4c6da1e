"""DiLoCo against independent references (torch's own optimizers on single-process models,
averages exchanged with plain mpi4py), its fragments, bit-identical replicas with lossy
codecs, checkpoints (also loaded by fewer and more workers), and errors on every rank."""
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mpi4py import MPI

import mpicomp
from mpicomp.optim import DiLoCo

WORLD = MPI.COMM_WORLD
RANK, N = WORLD.Get_rank(), WORLD.Get_size()


def toy_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 4))


def batch(step, rank=RANK):
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(5, 8, generator=g)
    return x, torch.sin(2 * x[:, :4])


def inner_step(model, opt, step, rank=RANK):
    x, y = batch(step, rank)
    opt.zero_grad()
    F.mse_loss(model(x), y).backward()
    opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def same_on_all_ranks(t, comm=WORLD):
    """True if t is bit-identical on every rank of comm."""
    return all(np.array_equal(a, t.numpy()) for a in comm.allgather(t.numpy()))


@pytest.fixture
def tmp_path_shared():
    """A directory every rank sees (rank 0 makes it)."""
    d = WORLD.bcast(tempfile.mkdtemp(prefix="diloco-") if RANK == 0 else None)
    yield d
    WORLD.Barrier()


def node_islands(k):
    """DiLoCo's islands from the node layout (mpicomp.node_comms) on emulated nodes of k ranks."""
    saved = mpicomp.config.ranks_per_node
    mpicomp.config.ranks_per_node = k
    try:
        inner, cross = mpicomp.node_comms(WORLD.Dup())
    finally:
        mpicomp.config.ranks_per_node = saved
    return dict(inner_comm=inner, comm=cross)


@pytest.mark.parametrize("islands", ["none", "one", "nodes"])
def test_h1_outer_lr1_equals_synchronous_sgd(islands):
    # one: one island of all ranks (gradients averaged every step), one outer worker;
    # nodes: an island per node of 2 ranks, from the node layout
    if islands == "nodes" and N % 2:
        pytest.skip("nodes of 2 ranks need an even number of ranks")
    kw = {"none": lambda: dict(comm=WORLD), "one": lambda: dict(inner_comm=WORLD, comm=MPI.COMM_SELF),
          "nodes": lambda: node_islands(2)}[islands]()
    model = toy_model()
    opt = DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=1, outer_lr=1.0,
                 outer_momentum=0.0, **kw)
    ref = toy_model()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(4):
        inner_step(model, opt, step)
        xs, ys = zip(*(batch(step, r) for r in range(N)))  # equal batches: mean of means = mean
        ref_opt.zero_grad()
        F.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
        ref_opt.step()
        torch.testing.assert_close(flat(model), flat(ref), rtol=0, atol=2e-6)
    assert opt.outer_steps == 4 and same_on_all_ranks(flat(model))


def test_outer_nesterov_matches_torch_sgd():
    H = 3
    model = toy_model()
    opt = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=1e-2), sync_every=H)
    # the reference: the same inner AdamW on a copy, the mean outer gradient in float64 over
    # mpi4py, and torch's SGD(nesterov=True) on a global copy
    local = toy_model()
    local_opt = torch.optim.AdamW(local.parameters(), lr=1e-2)
    glob = torch.nn.Parameter(flat(local).clone())
    outer = torch.optim.SGD([glob], lr=0.7, momentum=0.9, nesterov=True)
    for step in range(3 * H):
        inner_step(model, opt, step)
        inner_step(local, local_opt, step)
        if (step + 1) % H == 0:
            delta = (glob.detach() - flat(local)).double().numpy()
            glob.grad = torch.from_numpy(WORLD.allreduce(delta) / N).float()
            outer.step()
            torch.nn.utils.vector_to_parameters(glob.detach().clone(), local.parameters())  # a copy, not a view
            torch.testing.assert_close(flat(model), glob.detach(), rtol=0, atol=1e-6)
            assert same_on_all_ranks(flat(model))
    assert opt.outer_steps == 3


@pytest.mark.parametrize("mix,fragments", [(0.5, 1), (0.0, 2)])
def test_overlap_applies_each_sync_one_inner_step_late(mix, fragments):
    """overlap=True against a single-process rendering of Streaming DiLoCo's tau = 1: the
    average of the outer gradients taken at a sync step is applied after the next inner
    step, and the fragment's local parameters merged as mix * local + (1 - mix) * global."""
    H = 3
    model = toy_model()
    opt = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=1e-2), sync_every=H, fragments=fragments,
                 overlap=True, overlap_mix=mix)
    local = toy_model()
    local_opt = torch.optim.AdamW(local.parameters(), lr=1e-2)
    bounds = opt.fragment_bounds  # fragment f: elements [b_f, b_f+1) of the flat parameters
    glob = [torch.nn.Parameter(flat(local)[bounds[f]:bounds[f + 1]].clone()) for f in range(fragments)]
    outer = torch.optim.SGD(glob, lr=0.7, momentum=0.9, nesterov=True)
    pending = []
    for step in range(4 * H):
        inner_step(model, opt, step)
        inner_step(local, local_opt, step)
        for f, avg in pending:  # lands one inner step after it started
            for g in glob:
                g.grad = None
            glob[f].grad = avg
            outer.step()
            glob[f].grad = None
            v = flat(local)
            v[bounds[f]:bounds[f + 1]] = mix * v[bounds[f]:bounds[f + 1]] + (1 - mix) * glob[f].detach()
            torch.nn.utils.vector_to_parameters(v, local.parameters())
        pending = []
        s = step + 1
        for f in range(fragments):
            if (s - f * H // fragments) % H == 0:
                delta = (glob[f].detach() - flat(local)[bounds[f]:bounds[f + 1]]).double().numpy()
                pending.append((f, torch.from_numpy(WORLD.allreduce(delta) / N).float()))
    torch.testing.assert_close(flat(model), flat(local), rtol=0, atol=2e-6)
    assert opt.outer_steps == sum(1 for s in range(1, 4 * H) for f in range(fragments)
                                  if (s - f * H // fragments) % H == 0)
    if mix == 0.0:  # the global parameters taken whole: replicas equal again after each landing
        assert same_on_all_ranks(torch.cat([g.detach() for g in opt.global_params]))


def test_fragments_cover_every_parameter_once_and_sync_staggered():
    H, Fr = 6, 3
    model = toy_model()
    opt = DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.05), sync_every=H, fragments=Fr)
    b = opt.fragment_bounds
    total = sum(p.numel() for p in model.parameters())
    assert b[0] == 0 and b[-1] == total and all(x < y for x, y in zip(b, b[1:]))
    assert max(y - x for x, y in zip(b, b[1:])) - min(y - x for x, y in zip(b, b[1:])) <= 1  # equal sizes
    assert [g.numel() for g in opt.global_params] == [y - x for x, y in zip(b, b[1:])]
    synced = {f: [] for f in range(Fr)}
    for step in range(2 * H):
        before = [g.detach().clone() for g in opt.global_params]
        inner_step(model, opt, step)
        s = step + 1
        for f in range(Fr):
            moved = not torch.equal(before[f], opt.global_params[f].detach())
            frag = flat(model)[b[f]:b[f + 1]]
            if moved:
                synced[f].append(s)
                assert same_on_all_ranks(frag)  # local := global after its outer step
            elif N > 1:
                assert not same_on_all_ranks(frag)  # still apart: each rank trains on its own data
    assert synced == {f: [s for s in range(1, 2 * H + 1) if (s - f * H // Fr) % H == 0] for f in range(Fr)}


@pytest.mark.parametrize("codec", ["int4", "auto:int4"])
def test_int4_error_feedback_replicas_bit_identical(codec):
    mpicomp.config.min_bytes = 0  # compress even this small model
    model = toy_model()
    opt = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=1e-2), sync_every=2, codec=codec,
                 error_feedback=True, fragments=2)
    mpicomp.reset_stats()
    for step in range(8):
        inner_step(model, opt, step)
        for f in opt.due(step + 1):  # just synced: bit-identical on every rank
            b = opt.fragment_bounds
            assert same_on_all_ranks(flat(model)[b[f]:b[f + 1]])
    assert all(ef.residual is not None for ef in opt.feedback)
    sent = mpicomp.stats()["allreduce"]
    assert opt.bytes_sent == sent["bytes_wire"] > 0  # the core's own count of the outer allreduces
    if codec == "int4":
        # int4, even on parts of a few elements, each with its scale (4 ranks: 4.4x fewer than fp32)
        assert sent["bytes_wire"] < sent["bytes_plain"] / 3
    else:  # measured, then each fragment's call compressed or not as measured
        assert sent["probes"] >= 1 and sent["compressed"] + sum(sent["skipped"].values()) == sent["calls"]


def test_checkpoint_round_trip_bit_exact(tmp_path_shared):
    path = os.path.join(tmp_path_shared, "ck.pt")
    model = toy_model()
    opt = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=1e-2), sync_every=2)
    for step in range(4):
        inner_step(model, opt, step)
    opt.save(path, data_position={"step": 4})
    for step in range(4, 8):
        inner_step(model, opt, step)
    want = flat(model)
    model2 = toy_model(seed=5)
    opt2 = DiLoCo(model2, torch.optim.AdamW(model2.parameters(), lr=1e-2), sync_every=2)
    assert opt2.load(path) == {"step": 4} and opt2.inner_step == 4
    for step in range(4, 8):
        inner_step(model2, opt2, step)
    assert torch.equal(flat(model2), want)


def _train_and_save(comm, path, steps=4):
    model = toy_model()
    opt = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=1e-2), comm=comm, sync_every=2)
    for step in range(steps):
        inner_step(model, opt, step)
    opt.save(path, data_position=steps)
    return opt


@pytest.mark.parametrize("change", ["fewer", "more"])
def test_resume_with_fewer_and_more_workers(tmp_path_shared, change):
    # "fewer": all ranks save, ranks 0..N-2 resume (the last is its own group of one);
    # "more": ranks 0..N-2 save (the last saves elsewhere, alone), all ranks resume
    small = WORLD.Split(0 if RANK < N - 1 else 1, RANK)
    path = os.path.join(tmp_path_shared, f"{change}.pt")
    save_comm, load_comm = (WORLD, small) if change == "fewer" else (small, WORLD)
    own = path if save_comm is WORLD or RANK < N - 1 else path + ".alone"
    saved = _train_and_save(save_comm, own)
    model = toy_model(seed=7)
    inner = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt = DiLoCo(model, inner, comm=load_comm, sync_every=2)
    load_path = path if load_comm is WORLD or RANK < N - 1 else own
    assert opt.load(load_path) == 4 and opt.inner_step == 4
    written = WORLD.bcast(torch.cat([g.detach() for g in saved.global_params]))  # what rank 0 wrote
    assert torch.equal(flat(model), written)
    # worker i of load_comm takes saved worker i: WORLD rank i's state in both cases
    saved_states = WORLD.allgather([saved.inner_optimizer.state[p]["exp_avg"] for p in saved.params])
    if change == "more" and RANK == N - 1:
        assert len(inner.state) == 0  # a joining worker starts its inner state fresh
    else:
        want = saved_states[load_comm.Get_rank()]
        assert all(torch.equal(inner.state[q]["exp_avg"], w) for q, w in zip(opt.params, want))
    for step in range(4, 6):  # and training goes on, replicas equal after the outer step
        inner_step(model, opt, step)
    assert same_on_all_ranks(flat(model), load_comm)
    small.Free()


def _raises_everywhere(cls, fn, match=None):
    with pytest.raises(cls, match=match):
        fn()


def test_bad_checkpoints_raise_on_every_rank(tmp_path_shared):
    path = os.path.join(tmp_path_shared, "good.pt")
    _train_and_save(WORLD, path)
    if RANK == 0:
        data = Path(path).read_bytes()
        Path(path + ".cut").write_bytes(data[:len(data) // 2])
        Path(path + ".junk").write_bytes(b"not a checkpoint at all")
    WORLD.Barrier()
    model = toy_model()
    for bad in (path + ".cut", path + ".junk", path + ".missing"):
        opt = DiLoCo(model, torch.optim.AdamW(model.parameters()), sync_every=2)
        _raises_everywhere(mpicomp.CheckpointError, lambda: opt.load(bad), "checkpoint")
    other = torch.nn.Sequential(torch.nn.Linear(8, 4))
    opt = DiLoCo(other, torch.optim.AdamW(other.parameters()), sync_every=2)
    _raises_everywhere(mpicomp.CheckpointError, lambda: opt.load(path), "another model")
    opt = DiLoCo(model, torch.optim.AdamW(model.parameters()), sync_every=3)
    _raises_everywhere(mpicomp.CheckpointError, lambda: opt.load(path), "sync_every=2")
    opt = DiLoCo(model, torch.optim.AdamW(model.parameters()), sync_every=2, codec="int4:block=32")
    _raises_everywhere(mpicomp.CheckpointError, lambda: opt.load(path), "codec")


def test_load_state_dict_is_collective():
    """A state only one rank cannot load raises CheckpointError on every rank, and no rank
    changes; states of different steps raise ShapeMismatchError; the right ones load."""
    model = toy_model()
    opt = DiLoCo(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=2)
    for step in range(2):
        inner_step(model, opt, step)
    sd = opt.state_dict()
    before = flat(model).clone()
    bad = dict(sd, format="something else") if RANK == N - 1 else sd
    _raises_everywhere(mpicomp.CheckpointError, lambda: opt.load_state_dict(bad),
                       "not a DiLoCo checkpoint" if RANK == N - 1 else f"rank {N - 1}")
    assert torch.equal(flat(model), before)
    if N > 1:
        other = dict(sd, inner_step=sd["inner_step"] + (RANK == 0))
        _raises_everywhere(mpicomp.ShapeMismatchError, lambda: opt.load_state_dict(other), "inner_step")
    opt.load_state_dict(sd)
    for step in (2, 3):  # to the next outer step, after which the replicas are equal
        inner_step(model, opt, step)
    assert same_on_all_ranks(flat(model))


def test_bad_or_different_arguments_raise_on_every_rank():
    model = toy_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    _raises_everywhere(mpicomp.ArgumentError, lambda: DiLoCo(model, sgd, fragments=0 if RANK == N - 1 else 1))
    _raises_everywhere(mpicomp.ShapeMismatchError, lambda: DiLoCo(model, sgd, sync_every=10 + (RANK == N - 1)),
                       "sync_every")
    _raises_everywhere(mpicomp.CodecError, lambda: DiLoCo(model, sgd, codec="int3" if RANK == 0 else "int8"))
    if N > 1:  # the codec's options are part of it: int4 with blocks of 32 is not int4
        _raises_everywhere(mpicomp.ShapeMismatchError,
                           lambda: DiLoCo(model, sgd, codec="int4:block=32" if RANK == 0 else "int4"), "codec")


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("where", ["inner_optimizer", "training_loop", "island"])
def test_a_worker_raising_between_outer_steps_makes_every_rank_raise(where):
    model = toy_model()
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    kw = dict(inner_comm=WORLD, comm=MPI.COMM_SELF) if where == "island" else {}
    opt = DiLoCo(model, sgd, sync_every=4, **kw)
    bad = N - 1
    if RANK == bad and where != "training_loop":
        def fail(closure=None):
            raise Boom("inner step failed")
        sgd.step = fail
    expected = Boom if RANK == bad else mpicomp.ShapeMismatchError
    with pytest.raises(expected, match="failed"):
        with opt:
            for step in range(8):
                if where == "training_loop" and RANK == bad and step == 1:
                    raise Boom("data loader failed")
                inner_step(model, opt, step)
    with pytest.raises(mpicomp.ArgumentError, match="earlier step failed"):
        opt.step()
