"""The torch.distributed backend "mpicomp" against gloo on the same tensors, in one process:
the default group is gloo (conftest's fixture), and groups of the "mpicomp" backend are made
beside it with new_group. Each op, dtype and async form; subgroups; DDP and FSDP2 training
equal to gloo's with codec none; mismatched sizes raising on every rank with the group
usable afterwards; a lossy codec within its bound; errors of coalesced operations and of
send/recv reaching wait(), the group's timeout, work.wait(timeout) and the group's end."""
import datetime
import time

import pytest
import torch
import torch.distributed as dist
from mpi4py import MPI

import mpicomp
import mpicomp.torch as mt
from _ranks import wait_asleep

WORLD = MPI.COMM_WORLD
RANK, N = WORLD.Get_rank(), WORLD.Get_size()
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64]


@pytest.fixture(scope="module")
def groups(gloo):
    """(gloo's default group, an "mpicomp" group over all ranks with codec none)."""
    group = dist.new_group(backend="mpicomp", pg_options=mt.backend_options(codec="none"))
    yield dist.group.WORLD, group


def data(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 4).round().to(dtype)  # small integers: sums exact
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", ["SUM", "AVG", "MAX", "MIN", "PRODUCT"])
def test_all_reduce_equals_gloo(groups, dtype, op):
    if op == "AVG" and not dtype.is_floating_point:
        pytest.skip("AVG is for floating-point tensors")
    if op == "AVG" and dtype != torch.float32:
        pytest.skip("gloo has no AVG for 16-bit floats")
    reduce_op = getattr(dist.ReduceOp, op)
    x = data((1000,), dtype, RANK) if op != "PRODUCT" else torch.full((7,), 1.0 + (RANK == 1)).to(dtype)
    a, b = x.clone(), x.clone()
    dist.all_reduce(a, op=reduce_op, group=groups[0])
    dist.all_reduce(b, op=reduce_op, group=groups[1])
    tol = 1e-6 if op == "AVG" else 0  # the sums are exact; dividing by 3 may round either way
    torch.testing.assert_close(b, a, rtol=tol, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gathers_scatters_broadcast_all_to_all_equal_gloo(groups, dtype):
    gl, mc = groups
    x = data((6,), dtype, 10 + RANK)
    outs = {}
    for name, g in (("gloo", gl), ("mpicomp", mc)):
        ag = torch.empty(6 * N, dtype=dtype)
        dist.all_gather_into_tensor(ag, x, group=g)
        lst = [torch.empty(6, dtype=dtype) for _ in range(N)]
        dist.all_gather(lst, x, group=g)
        rs = torch.empty(2, dtype=dtype)
        dist.reduce_scatter_tensor(rs, data((2 * N,), dtype, 20 + RANK), group=g)
        bc = x.clone()
        dist.broadcast(bc, src=N - 1, group=g)
        a2a = torch.empty(2 * N, dtype=dtype)
        dist.all_to_all_single(a2a, data((2 * N,), dtype, 30 + RANK), group=g)
        outs[name] = [ag, *lst, rs, bc, a2a]
    for a, b in zip(outs["gloo"], outs["mpicomp"]):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64], ids=str)
def test_reduce_gather_scatter_alltoall_lists_equal_gloo(groups, dtype):
    gl, mc = groups
    root = N - 1
    outs = {}
    for name, g in (("gloo", gl), ("mpicomp", mc)):
        red = data((5,), dtype, 40 + RANK)
        dist.reduce(red, dst=root, group=g)
        gathered = [torch.empty(3, dtype=dtype) for _ in range(N)] if RANK == root else None
        dist.gather(data((3,), dtype, 50 + RANK), gathered, dst=root, group=g)
        got = torch.empty(4, dtype=dtype)
        dist.scatter(got, [data((4,), dtype, 60 + r) for r in range(N)] if RANK == root else None, src=root,
                     group=g)
        a2a = [torch.empty(2, dtype=dtype) for r in range(N)]  # gloo takes equal sizes only
        dist.all_to_all(a2a, [data((2,), dtype, 70 + 10 * RANK + r) for r in range(N)], group=g)
        outs[name] = ([red] if RANK == root else []) + (gathered or []) + [got, *a2a]
    for a, b in zip(outs["gloo"], outs["mpicomp"]):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


def test_bool_and_send_recv(groups):
    _, mc = groups
    flags = torch.tensor([RANK == 0, True, False])
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=mc)
    assert flags.tolist() == [True, True, False]
    if N > 1:
        if RANK == 0:
            dist.send(torch.arange(4.0), dst=1, group=mc, tag=3)
        elif RANK == 1:
            got = torch.empty(4)
            dist.recv(got, src=0, group=mc, tag=3)
            assert got.tolist() == [0.0, 1.0, 2.0, 3.0]
    dist.barrier(group=mc)


def test_async_works_overlap_and_complete_in_order(groups):
    _, mc = groups
    xs = [torch.full((50_000,), float(i + RANK)) for i in range(4)]
    works = [dist.all_reduce(x, group=mc, async_op=True) for x in xs]
    busy = sum(torch.randn(200, 200).matmul(torch.randn(200, 200)).sum().item() for _ in range(5))
    for w in reversed(works):  # waited on out of order
        w.wait()
    assert busy == busy
    for i, x in enumerate(xs):
        assert torch.equal(x, torch.full((50_000,), float(N * i + N * (N - 1) // 2)))
    fut = dist.all_reduce(torch.ones(3), group=mc, async_op=True).get_future()
    assert torch.equal(fut.wait()[0], torch.full((3,), float(N)))


def test_subgroups_and_device_mesh(gloo):
    evens = [r for r in range(N) if r % 2 == 0]
    sub = dist.new_group(evens, backend="mpicomp")
    x = torch.ones(4)
    if RANK in evens:
        dist.all_reduce(x, group=sub)
        assert torch.equal(x, torch.full((4,), float(len(evens))))
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(dist.new_group(backend="mpicomp"), "cpu")
    import torch.distributed._functional_collectives as fc
    assert torch.equal(fc.all_reduce(torch.ones(2), "sum", mesh.get_group()), torch.full((2,), float(N)))


def test_mismatched_sizes_raise_on_every_rank_and_the_group_stays_usable(groups):
    _, mc = groups
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
        with pytest.raises(mpicomp.ShapeMismatchError):
            dist.all_reduce(torch.ones(5 + RANK), op=op, group=mc)
    x = torch.ones(3)
    dist.all_reduce(x, group=mc)
    assert torch.equal(x, torch.full((3,), float(N)))


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))


def _train(model, opt, steps=5):
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * RANK + step)
        x = torch.randn(8, 16, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x[:, :4]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_ddp_trains_as_with_gloo(groups):
    from torch.nn.parallel import DistributedDataParallel as DDP

    runs = []
    for g in groups:
        model = DDP(_model(), process_group=g)
        runs.append((_train(model, torch.optim.SGD(model.parameters(), lr=0.1)), model))
    (loss_g, model_g), (loss_m, model_m) = runs
    tol = 0 if N <= 2 else 1e-6  # more ranks: the two libraries sum in different orders
    torch.testing.assert_close(torch.tensor(loss_m), torch.tensor(loss_g), rtol=tol, atol=tol)
    for a, b in zip(model_g.parameters(), model_m.parameters()):
        torch.testing.assert_close(b, a, rtol=tol, atol=tol)


def test_ddp_with_codec_auto_trains_as_with_gloo(groups):
    """codec "auto" through the backend, lossless: the values are exact whichever way each
    bucket goes, and the first bucket's allreduce measured the link."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    auto = dist.new_group(backend="mpicomp", pg_options=mt.backend_options(codec="auto:lz4"))
    mpicomp.reset_stats()
    runs = []
    for g in (groups[0], auto):
        model = DDP(_model(), process_group=g)
        runs.append(_train(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    tol = 0 if N <= 2 else 1e-6
    torch.testing.assert_close(torch.tensor(runs[1]), torch.tensor(runs[0]), rtol=tol, atol=tol)
    if N > 1:
        assert mpicomp.stats()["allreduce"]["probes"] >= 1
    dist.destroy_process_group(auto)


def test_fsdp2_trains_as_with_gloo(groups):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    runs = []
    for g in groups:
        model = _model()
        mesh = DeviceMesh.from_group(g, "cpu")
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        runs.append(_train(model, torch.optim.SGD(model.parameters(), lr=0.1)))
    torch.testing.assert_close(torch.tensor(runs[1]), torch.tensor(runs[0]), rtol=1e-6, atol=1e-6)


def test_a_lossy_codec_is_applied_and_counted(gloo):
    lossy = dist.new_group(backend="mpicomp", pg_options=mt.backend_options(codec="int8"))
    old = mpicomp.config.min_bytes
    mpicomp.config.min_bytes = 0
    try:
        mpicomp.reset_stats()
        x = torch.linspace(-1, 1, 4096) * (RANK + 1)
        exact = x.double() * (N * (N + 1) / 2) / (RANK + 1)
        dist.all_reduce(x, group=lossy)
        s = mpicomp.stats()["allreduce"]
        assert s["compressed"] == 1 and s["bytes_wire"] < s["bytes_plain"] / 3
        assert (x.double() - exact).abs().max() < 0.02 * N * N  # int8: about 1/127 of each block's max
    finally:
        mpicomp.config.min_bytes = old


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 1e-3), (torch.float64, 1e-3), (torch.bfloat16, 0.1)],
                         ids=str)
def test_an_error_bound_holds_through_the_backend(gloo, dtype, bound):
    """Codec bound through all_reduce (sum and avg), reduce_scatter_tensor and
    all_gather_into_tensor: every element within the bound of gloo's float64 result
    (bfloat16 rounds sums near 6 to 0.03: a coarser bound)."""
    bounded = dist.new_group(backend="mpicomp", pg_options=mt.backend_options(codec=f"bound:abs={bound}"))
    old = mpicomp.config.min_bytes
    mpicomp.config.min_bytes = 0
    try:
        x = torch.sin(torch.arange(N * 40_000, dtype=torch.float64) / 50 + RANK).to(dtype) * 3
        for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            want = x.double().clone()  # (a float64 x's .double() is x itself)
            dist.all_reduce(want, op=op)  # gloo, float64
            y = x.clone()
            dist.all_reduce(y, op=op, group=bounded)
            assert (y.double() - want).abs().max() <= bound
        part = torch.empty(40_000, dtype=dtype)
        dist.reduce_scatter_tensor(part, x, group=bounded)
        want = x.double().clone()
        dist.all_reduce(want)
        assert (part.double() - want[RANK * 40_000:(RANK + 1) * 40_000]).abs().max() <= bound
        gathered = torch.empty(N * x.numel(), dtype=dtype)
        dist.all_gather_into_tensor(gathered, x, group=bounded)
        want = torch.empty(N * x.numel(), dtype=torch.float64)
        dist.all_gather_into_tensor(want, x.double())
        assert (gathered.double() - want).abs().max() <= bound
    finally:
        mpicomp.config.min_bytes = old


def test_coalesced_operations_raise_the_first_error_on_every_rank(groups):
    """Each tensor's operation runs (the ranks stay in step); the Work raises the first error,
    with its type, not only the last tensor's."""
    _, mc = groups
    for op in ("allreduce_coalesced", "reduce_scatter_tensor_coalesced", "allgather_into_tensor_coalesced"):
        bad, good = torch.ones(N * (5 + RANK)), torch.ones(N * 4)
        if op == "allreduce_coalesced":
            work = mc.allreduce_coalesced([bad, good])
        elif op == "reduce_scatter_tensor_coalesced":
            outs = [torch.empty(5 + RANK), torch.empty(4)]
            work = mc.reduce_scatter_tensor_coalesced(outs, [bad, good])
        else:
            outs = [torch.empty(N * N * (5 + RANK)), torch.empty(N * N * 4)]
            work = mc.allgather_into_tensor_coalesced(outs, [bad, good])
        with pytest.raises(mpicomp.ShapeMismatchError):
            work.wait()
    x = torch.ones(3)
    dist.all_reduce(x, group=mc)
    assert torch.equal(x, torch.full((3,), float(N)))


def _timed_group(seconds):
    return dist.new_group(backend="mpicomp", timeout=datetime.timedelta(seconds=seconds))


@pytest.mark.waits
def test_a_receive_nobody_matches_raises_at_the_groups_timeout(gloo):
    g = _timed_group(1.5)
    if RANK == 0 and N > 1:
        t0 = time.perf_counter()
        with pytest.raises(mpicomp.CommTimeoutError, match="send/recv"):
            dist.recv(torch.empty(3), src=1, group=g, tag=9)
        assert 1.4 < time.perf_counter() - t0 < 10
    wait_asleep(WORLD)  # not the group's: the others would time out waiting for rank 0
    # The receive was cancelled: the next message between the pair is the one sent now.
    if RANK == 1:
        dist.send(torch.arange(3.0), dst=0, group=g, tag=9)
    elif RANK == 0 and N > 1:
        got = torch.empty(3)
        dist.recv(got, src=1, group=g, tag=9)
        assert got.tolist() == [0.0, 1.0, 2.0]
    dist.destroy_process_group(g)


@pytest.mark.waits
def test_work_wait_gives_up_after_its_timeout(gloo):
    g = _timed_group(60)
    late = RANK == N - 1
    if late:
        time.sleep(1.5)
    work = dist.all_reduce(torch.ones(10), group=g, async_op=True)
    if not late:
        with pytest.raises(mpicomp.CommTimeoutError, match="work.wait"):
            work.wait(timeout=datetime.timedelta(seconds=0.3))
    work.wait()  # the operation went on
    dist.destroy_process_group(g)


@pytest.mark.waits
@pytest.mark.parametrize("op", ["all_reduce", "broadcast", "barrier", "compressed"])
def test_a_lost_rank_raises_at_the_groups_timeout(gloo, op):
    """The last rank never joins: every other rank raises CommTimeoutError after the group's
    timeout (exact operations through MPI, and the compressed ones through the core), asleep
    rather than spinning for most of it, and the group refuses what follows; a new group
    works."""
    g = _timed_group(1.0)
    codec_group = dist.new_group(backend="mpicomp", timeout=datetime.timedelta(seconds=1.0),
                                 pg_options=mt.backend_options(codec="int8"))
    x = torch.ones(1 << 17)
    run = {"all_reduce": lambda grp: dist.all_reduce(torch.ones(10, dtype=torch.int64), group=grp),
           "broadcast": lambda grp: dist.broadcast(torch.ones(10), src=0, group=grp),
           "barrier": lambda grp: dist.barrier(group=grp),
           "compressed": lambda grp: dist.all_reduce(x, group=grp)}[op]
    grp = codec_group if op == "compressed" else g
    run(grp)  # set-up, all ranks
    if RANK != N - 1:
        t0, cpu0 = time.perf_counter(), time.process_time()
        with pytest.raises(mpicomp.CommTimeoutError):
            run(grp)
        waited, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        assert 0.9 < waited < 10 and cpu < 0.5 * waited, (waited, cpu)
        with pytest.raises(mpicomp.CommTimeoutError, match="earlier"):
            run(grp)
    wait_asleep(WORLD)
    fresh = _timed_group(30)
    y = torch.ones(4)
    dist.all_reduce(y, group=fresh)
    assert torch.equal(y, torch.full((4,), float(N)))
    for h in (fresh,):
        dist.destroy_process_group(h)


def test_destroying_a_group_frees_its_communicators(gloo):
    g = dist.new_group(backend="mpicomp")
    dist.all_reduce(torch.ones(2), group=g)
    comm, p2p = g.comm, g._p2p_comm
    dist.destroy_process_group(g)
    assert comm == MPI.COMM_NULL and p2p == MPI.COMM_NULL


@pytest.mark.waits
def test_ddp_with_a_lost_rank_raises_instead_of_hanging(gloo):
    """DDP over an "mpicomp" group of timeout 4 s: the last rank never runs its second step;
    the others' step raises (the group's CommTimeoutError, through DDP) within the timeout
    and a few seconds."""
    if N < 2:
        pytest.skip("needs 2 ranks")
    g = _timed_group(4.0)  # DDP's set-up (parameter checks, broadcast) takes its time on 2 cores
    model = torch.nn.parallel.DistributedDataParallel(_model(), process_group=g)
    x = torch.randn(8, 16)
    model(x).square().mean().backward()  # every rank
    WORLD.Barrier()
    if RANK != N - 1:  # the last rank never runs the step (DDP's second forward talks too)
        t0 = time.perf_counter()
        with pytest.raises(mpicomp.CommTimeoutError, match="still waiting after 4 s"):
            model(x).square().mean().backward()
        assert time.perf_counter() - t0 < 14
    wait_asleep(WORLD)
