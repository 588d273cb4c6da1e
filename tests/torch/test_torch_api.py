"""mpicomp.torch in one process: mesh argument errors, policies, hook arguments."""
import subprocess
import sys

import pytest
import torch
from mpi4py import MPI

import mpicomp
import mpicomp.torch as mt


def test_import_mpicomp_does_not_import_torch():
    code = "import sys, mpicomp; assert 'torch' not in sys.modules; import mpicomp.torch; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip() == "ok", r.stderr


@pytest.mark.parametrize("kwargs,match", [
    ({"dp": 2}, r"dp \* tp \* pp = dp=2 x tp=1 x pp=1 = 2, but comm has 1 ranks"),
    ({"dp": 0}, r"dp must be a positive int, got 0"),
    ({"tp": 1.0}, r"tp must be a positive int, got 1.0"),
    ({"pp": True}, r"pp must be a positive int, got True"),
    ({"dp": None, "tp": None}, r"at most one of dp, tp, pp may be None"),
    ({"dp": None, "tp": 2}, r"dp=None needs the world size 1 to be a multiple of"),
    ({"comm": "world"}, r"comm must be an mpi4py intra-communicator"),
])
def test_mesh_errors(kwargs, match):
    with pytest.raises(mpicomp.ArgumentError, match=match):
        mt.Mesh(**kwargs)


def test_mesh_of_one():
    mesh = mt.Mesh()
    assert (mesh.dp_size, mesh.tp_size, mesh.pp_size, mesh.dp_rank) == (1, 1, 1, 0)
    assert mesh.tp.Get_size() == 1 and mesh.group_ranks("pp") == [0]
    with pytest.raises(mpicomp.ArgumentError, match="tp_rank must be in 0..0, got 1"):
        mesh.rank_of(tp_rank=1)
    with pytest.raises(mpicomp.ArgumentError, match="dim must be one of"):
        mesh.group_ranks("ep")
    with pytest.raises(mpicomp.ArgumentError, match="torch.distributed is not initialised"):
        mesh.torch_group("dp")


def test_presets():
    none, naive, hybrid = (mt.Policy.preset(n) for n in ("none", "naive", "hybrid"))
    for dim, kind in (("dp", "gradients"), ("tp", "forward"), ("tp", "backward"), ("pp", "forward"),
                      ("pp", "backward")):
        assert none.codec(dim, kind) == mpicomp.codec("none")
        assert naive.codec(dim, kind) == mpicomp.codec("int4", block=32)
    assert hybrid.codec("dp", "gradients") == mpicomp.codec("int4", block=32) and hybrid.dp_error_feedback
    assert hybrid.codec("tp", "forward") == hybrid.codec("pp", "backward") == mpicomp.codec("int8")
    assert not naive.dp_error_feedback
    # the point of hybrid: dp gradients compressed harder than tp/pp traffic
    assert hybrid.codec("dp", "gradients").ratio() > 1.6 * hybrid.codec("tp", "forward").ratio()
    custom = mt.Policy.preset("hybrid", aggressive="sign", mild="bf16")
    assert custom.describe()["dp.gradients"] == "sign" and custom.describe()["pp.forward"] == "bf16"


def test_policy_per_kind_and_errors():
    p = mt.Policy(tp={"forward": "bf16", "backward": "int8"})
    assert p.codec("tp", "forward").name == "bf16" and p.codec("tp", "backward").name == "int8"
    with pytest.raises(mpicomp.ArgumentError, match="Policy.preset: name must be one of none, naive, hybrid, got 'x'"):
        mt.Policy.preset("x")
    with pytest.raises(mpicomp.ArgumentError, match="tp needs a codec for backward"):
        mt.Policy(tp={"forward": "bf16"})
    with pytest.raises(mpicomp.ArgumentError, match="pp has no traffic kind 'gradients'"):
        mt.Policy(pp={"gradients": "int8", "forward": "int8", "backward": "int8"})
    with pytest.raises(mpicomp.ArgumentError, match="dp traffic kind must be one of gradients, got 'forward'"):
        p.codec("dp", "forward")
    with pytest.raises(mpicomp.CodecError, match="unknown codec 'int3'"):
        mt.Policy(dp="int3")


def test_hook_arguments():
    with pytest.raises(mpicomp.CodecError, match="rank must be a positive integer"):
        mt.ddp_hook(codec="powersgd:rank=0")
    with pytest.raises(mpicomp.CodecError, match="unknown codec 'int3'"):
        mt.allreduce_gradients(torch.nn.Linear(2, 2), codec="int3")
    with pytest.raises(mpicomp.ArgumentError, match="comm must be an mpi4py intra-communicator"):
        mt.ddp_hook(comm=None)
    with pytest.raises(mpicomp.ArgumentError, match="error_feedback must be a bool, got 'yes'"):
        mt.ddp_hook(codec="int8", error_feedback="yes")
    with pytest.raises(mpicomp.ArgumentError, match="bucket_bytes must be a positive int, got 0"):
        mt.allreduce_gradients(torch.nn.Linear(2, 2), bucket_bytes=0)
    with pytest.raises(mpicomp.ArgumentError, match="model must be a torch.nn.Module, got list"):
        mt.allreduce_gradients([], comm=MPI.COMM_SELF)


def test_backend_options_take_wire_codecs_only():
    assert mt.backend_options(codec="int8", allgather="none").codecs == {
        "allreduce": "int8", "reduce_scatter": "int8", "allgather": "none"}
    with pytest.raises(mpicomp.CodecError, match="the allreduce codec: codec 'powersgd' is an allreduce algorithm"):
        mt.backend_options(codec="int8", allreduce="powersgd")
    with pytest.raises(mpicomp.CodecError, match="unknown codec 'int3'"):
        mt.backend_options(codec="int3")


def test_traffic_is_a_mapping_of_what_the_core_counted():
    """The bytes themselves are compared with mpicomp.stats() under mpiexec (tests/torch/mpi)."""
    t = mt.Traffic()
    with t.counting(("dp", "gradients")):  # one rank: nothing travels, and the core counts 0
        mpicomp.allreduce(torch.ones(1 << 16), comm=MPI.COMM_SELF, codec="int4")
    t.add(("pp", "forward"), 1500)
    assert repr(t) == "Traffic(total 0.002 MB; dp/gradients: 0.000 MB, pp/forward: 0.002 MB)"
    assert dict(t) == {("dp", "gradients"): 0, ("pp", "forward"): 1500}  # a mapping, as documented
    assert t["tp", "forward"] == 0 and ("tp", "forward") not in t and len(t) == 2


def test_one_rank_layers_are_plain_linear():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3))
    torch.manual_seed(0)
    tp = torch.nn.Sequential(mt.ColumnParallelLinear(4, 6, MPI.COMM_SELF), mt.RowParallelLinear(6, 3, MPI.COMM_SELF))
    x = torch.randn(5, 4)
    for m in (ref, tp):
        m(x).square().sum().backward()
    for p, q in zip(tp.parameters(), ref.parameters()):
        assert torch.equal(p, q) and torch.equal(p.grad, q.grad)
    loss = mt.GPipe(tp, MPI.COMM_SELF, (5, 3)).step([x, x], [x[:, :3], x[:, :3]], torch.nn.functional.mse_loss)
    assert loss == pytest.approx(torch.nn.functional.mse_loss(ref(x), x[:, :3]).item(), rel=1e-6)
