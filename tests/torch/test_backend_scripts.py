"""examples/torch_distributed.py, a plain DDP / FSDP2 script, under mpiexec -n 2 with
init_process_group("mpicomp") and no MASTER_ADDR, RANK or WORLD_SIZE: losses bitwise equal to
the same script with gloo (codec none), and within 1% with MPICOMP_CODEC=int8, which sends
about a quarter of the bytes."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
sys.path.insert(0, str(ROOT / "tests"))
from _launch import allow_open_mpi_here  # noqa: E402

allow_open_mpi_here()


def run(tmp_path, backend, wrap, **env):
    out = tmp_path / f"{backend}-{wrap}-{len(env)}.json"
    clean = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    r = subprocess.run([MPIEXEC, "-n", "2", sys.executable, str(ROOT / "examples" / "torch_distributed.py"),
                        "--backend", backend, "--wrap", wrap, "--steps", "6", "--width", "64", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env={**clean, **env})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("wrap", ["ddp", "fsdp2"])
def test_unmodified_script_equals_gloo(tmp_path, wrap):
    gloo, ours = run(tmp_path, "gloo", wrap), run(tmp_path, "mpicomp", wrap)
    assert ours["losses"] == gloo["losses"]
    assert ours["bytes_wire"] == ours["bytes_plain"] > 0 and gloo["bytes_wire"] == 0


def test_int8_from_the_environment(tmp_path):
    exact, int8 = run(tmp_path, "mpicomp", "ddp"), run(tmp_path, "mpicomp", "ddp", MPICOMP_CODEC="int8")
    assert abs(int8["losses"][-1] / exact["losses"][-1] - 1) < 0.01
    assert int8["bytes_wire"] < 0.3 * int8["bytes_plain"]
