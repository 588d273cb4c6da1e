"""The LD_PRELOAD interposer on unmodified programs: a C program (tests/pmpi/check_collectives.c,
compiled here with the venv's mpicc) and mpi4py, under mpiexec."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpicomp.config import preload_path

BIN = Path(sys.executable).parent
PRELOAD = preload_path()
SOURCE = Path(__file__).parent / "pmpi" / "check_collectives.c"


def mpiexec(n, *cmd, timeout=240, **env):
    # All ranks share this machine: compress there too, unless a test says otherwise.
    full = {**os.environ, "LD_PRELOAD": PRELOAD, "MPICOMP_COMPRESS_LOCAL": "1", **env}
    return subprocess.run([str(BIN / "mpiexec"), "-n", str(n), *map(str, cmd)], capture_output=True, text=True,
                          timeout=timeout, env=full)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    exe = tmp_path_factory.mktemp("pmpi") / "check_collectives"
    subprocess.run([str(BIN / "mpicc"), "-O2", "-o", str(exe), str(SOURCE), "-lm"], check=True)
    return exe


def test_preload_library_is_installed():
    assert Path(PRELOAD).is_file()


@pytest.mark.parametrize("n,codec", [(3, c) for c in ("off", "none", "fp16", "bf16", "int8", "int4", "sign", "lz4")]
                         + [(2, "off"), (2, "int8"), (2, "sign")])
def test_c_program_results_within_codec_bounds(program, n, codec):
    r = mpiexec(n, program, codec, MPICOMP_CODEC=codec)
    assert r.returncode == 0 and f"{codec}: 0 failed checks" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def test_check_program_detects_a_looser_codec(program):
    # The same program, told to expect exact results while int8 is on, must fail.
    r = mpiexec(2, program, "none", MPICOMP_CODEC="int8")
    assert r.returncode != 0 and "FAIL" in r.stderr


def test_stats_table_at_finalize(program):
    r = mpiexec(2, program, "int4", MPICOMP_CODEC="int4", MPICOMP_STATS="1")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line.strip().startswith("MPI_")}
    calls, compressed, bytes_in, bytes_sent, _ = rows["MPI_Allreduce"]
    assert int(compressed) > 0 and int(calls) > int(compressed)  # small and integer calls pass through
    assert float(bytes_sent) < float(bytes_in) / 3               # int4: ~7.8x smaller per stage
    assert int(rows["MPI_Reduce_scatter_block"][1]) > 0 and int(rows["MPI_Allgather"][1]) > 0


def test_node_local_calls_pass_through_by_default(program):
    """Without MPICOMP_COMPRESS_LOCAL the ranks of one node keep the MPI library's own
    shared-memory collectives: exact results, nothing compressed."""
    r = mpiexec(2, program, "off", MPICOMP_CODEC="int4", MPICOMP_STATS="1", MPICOMP_COMPRESS_LOCAL="0")
    assert r.returncode == 0 and "off: 0 failed checks" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line.strip().startswith("MPI_")}
    assert int(rows["MPI_Allreduce"][0]) > 0 and all(int(v[1]) == 0 for v in rows.values())


@pytest.mark.parametrize("var,value", [("MPICOMP_CODEC", "int9"), ("MPICOMP_ALLREDUCE_CODEC", "int8:block=33"),
                                       ("MPICOMP_MIN_BYTES", "lots"), ("MPICOMP_STATS", "yes")])
def test_invalid_setting_aborts_naming_the_variable(program, var, value):
    r = mpiexec(2, program, "off", timeout=60, **{var: value})
    assert r.returncode != 0
    assert f"invalid setting {var}={value}" in r.stderr


MPI4PY_PROGRAM = r"""
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
n = 1 << 18
xs = [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in range(c.size)]
exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
y = np.empty(n, np.float32)
c.Allreduce(xs[c.rank], y)                      # mpi4py 4 calls MPI_Allreduce_c
err = np.abs(y - exact).max() / np.abs(exact).max()
part = np.empty(n // c.size, np.float32)
c.Reduce_scatter_block(xs[c.rank], part)
k = n // c.size
err_rs = np.abs(part - exact[c.rank * k:(c.rank + 1) * k]).max() / np.abs(exact).max()
full = np.empty(n * c.size, np.float32)
c.Allgather(xs[c.rank], full)
err_ag = max(np.abs(full[r * n:(r + 1) * n] - xs[r]).max() / np.abs(xs[r]).max() for r in range(c.size))
if c.rank == 0:
    print("ERR", err, err_rs, err_ag, flush=True)
"""


def test_mpi4py_large_count_calls_are_compressed():
    r = mpiexec(2, sys.executable, "-c", MPI4PY_PROGRAM, MPICOMP_CODEC="int8", MPICOMP_STATS="1")
    assert r.returncode == 0, r.stderr[-2000:]
    errs = [float(v) for v in r.stdout.split("ERR")[1].split()[:3]]
    # int8: within 2 stages of absmax/254 per rank-sum, far from exact but far below 1%.
    assert 0 < errs[0] < 0.01 and 0 < errs[1] < 0.01 and 0 < errs[2] < 0.01
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line.strip().startswith("MPI_")}
    assert all(int(rows[k][1]) == 1 for k in ("MPI_Allreduce", "MPI_Reduce_scatter_block", "MPI_Allgather"))
