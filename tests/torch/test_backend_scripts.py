"""examples/torch_distributed.py, a plain DDP / FSDP2 script, under mpiexec -n 2 and 4 with
init_process_group("mpicomp") and no MASTER_ADDR, RANK or WORLD_SIZE: losses bitwise equal to
the same script with gloo on 2 ranks (codec none), to float rounding on 4, and within 1% with
MPICOMP_CODEC=int8, which sends about a quarter of the bytes; and a 2 x 2 DeviceMesh."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from _launch import MPIEXEC, allow_open_mpi_here, mpiexec  # noqa: E402
from _launch import run as run_ranks  # noqa: E402

allow_open_mpi_here()


def run(tmp_path, backend, wrap, n=2, **env):
    """n ranks under mpiexec; n=None: one process started as `python script.py`."""
    out = tmp_path / f"{backend}-{wrap}-{n}-{len(env)}.json"
    clean = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    launcher = [] if n is None else [MPIEXEC, "-n", n]
    r = run_ranks([*launcher, sys.executable, ROOT / "examples" / "torch_distributed.py", "--backend", backend,
                   "--wrap", wrap, "--steps", "6", "--width", "64", "--json", out], timeout=300, env={**clean, **env})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "Warning" not in r.stderr, r.stderr[-3000:]  # e.g. FSDP2's about a module output that is a view
    return json.loads(out.read_text())


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_unmodified_script_equals_gloo(tmp_path, wrap):
    gloo, ours = run(tmp_path, "gloo", wrap), run(tmp_path, "mpicomp", wrap)
    assert ours["losses"] == gloo["losses"]
    assert ours["bytes_wire"] == ours["bytes_plain"] > 0 and gloo["bytes_wire"] == 0


def test_without_mpiexec(tmp_path):
    """`python examples/torch_distributed.py`, one process: neither backend asks for RANK."""
    gloo, ours = run(tmp_path, "gloo", "ddp", None), run(tmp_path, "mpicomp", "ddp", None)
    assert ours["losses"] == gloo["losses"] and len(ours["losses"]) == 6


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_four_ranks_equal_gloo_to_float_rounding(tmp_path, wrap):
    """At 4 ranks the sums are taken in another order than gloo's (MPI's reduction tree):
    the losses agree to float rounding, not bitwise."""
    gloo, ours = run(tmp_path, "gloo", wrap, 4), run(tmp_path, "mpicomp", wrap, 4)
    assert ours["losses"] == pytest.approx(gloo["losses"], rel=1e-4)
    assert ours["bytes_wire"] == ours["bytes_plain"] > 0


def test_int8_from_the_environment(tmp_path):
    exact, int8 = run(tmp_path, "mpicomp", "ddp"), run(tmp_path, "mpicomp", "ddp", MPICOMP_CODEC="int8")
    assert abs(int8["losses"][-1] / exact["losses"][-1] - 1) < 0.01
    assert int8["bytes_wire"] < 0.3 * int8["bytes_plain"]


MESH = """
import json, sys
import torch, torch.distributed as dist
import torch.distributed._functional_collectives as fc
from torch.distributed.device_mesh import init_device_mesh
import mpicomp.torch  # noqa: F401  (registers the backend)
dist.init_process_group("mpicomp")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
out = {"backend": dist.get_backend(), "world": dist.get_world_size()}
for dim in ("dp", "tp"):
    g = mesh.get_group(dim)
    x = torch.full((3,), float(rank + 1))
    dist.all_reduce(x, group=g)
    y = fc.all_reduce(torch.full((2,), float(rank + 1)), "sum", g)
    z = torch.empty(2 * 4, dtype=torch.int64)
    dist.all_gather_into_tensor(z, torch.arange(4) + 10 * rank, group=g)
    out[dim] = {"backend": dist.get_backend(g), "members": dist.get_process_group_ranks(g),
                "all_reduce": x.tolist(), "functional": y.tolist(), "gathered": z.tolist()}
everyone = [None] * 4
dist.all_gather_object(everyone, out)
if rank == 0:
    json.dump(everyone, open(sys.argv[1], "w"))
"""


def test_two_dimensional_device_mesh_at_four_ranks(tmp_path):
    """init_process_group("mpicomp") then init_device_mesh("cpu", (2, 2)): each dimension's
    subgroups are mpicomp groups over the right ranks, and their collectives (plain and
    functional, as FSDP2 and tensor parallelism call them) give each subgroup's own sums."""
    out = tmp_path / "mesh.json"
    clean = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    r = mpiexec(4, sys.executable, "-c", MESH, out, timeout=300, env=clean)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    everyone = json.loads(out.read_text())
    for rank, got in enumerate(everyone):
        assert got["backend"] == "mpicomp" and got["world"] == 4
        for dim, stride in (("dp", 2), ("tp", 1)):
            first = rank % 2 if dim == "dp" else rank - rank % 2  # mesh [[0, 1], [2, 3]]
            members = [first, first + stride]
            assert got[dim]["members"] == members and got[dim]["backend"] == "mpicomp", got[dim]
            total = float(sum(m + 1 for m in members))
            assert got[dim]["all_reduce"] == [total] * 3 and got[dim]["functional"] == [total] * 2
            assert got[dim]["gathered"] == [v + 10 * m for m in members for v in range(4)]


GLOO = """
import sys
import torch.distributed as dist
import mpicomp.optim  # noqa: F401  (imports mpicomp.torch, which registers the backend)
import mpicomp.torch as mt
if sys.argv[1] == "explicit":
    mt.rendezvous_from_mpi()
try:
    dist.init_process_group("gloo")
except ValueError as e:
    print("torch's own rendezvous:", e)
    sys.exit(0)
print("gloo from MPI, rank", dist.get_rank(), "of", dist.get_world_size())
dist.destroy_process_group()
"""


def test_importing_mpicomp_leaves_other_backends_rendezvous_alone(tmp_path):
    """Importing mpicomp.optim or mpicomp.torch changes nothing for gloo: without rendezvous
    variables its env:// rendezvous is torch's (which wants RANK); the named call
    mt.rendezvous_from_mpi() makes it take them from MPI."""
    clean = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    for mode, expected in (("implicit", "torch's own rendezvous"), ("explicit", "gloo from MPI, rank")):
        r = mpiexec(2, sys.executable, "-c", GLOO, mode, timeout=120, env=clean)
        assert r.returncode == 0 and r.stdout.count(expected) == 2, r.stdout[-2000:] + r.stderr[-2000:]


def test_the_backend_needs_mpi_thread_multiple():
    script = ("import mpi4py; mpi4py.rc.thread_level = 'serialized'\n"
              "import torch.distributed as dist, mpicomp, mpicomp.torch\n"
              "try:\n"
              "    dist.init_process_group('mpicomp', store=dist.HashStore(), rank=0, world_size=1)\n"
              "except mpicomp.BackendError as e:\n"
              "    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert "refused:" in r.stdout and "MPI_THREAD_MULTIPLE" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]
