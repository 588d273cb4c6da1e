"""What a newcomer meets first, run as they would run it: the README's "Use" example under
mpiexec on one machine (the codec named is applied there), the statistics and the verbose
notice from the environment, the renamed setting refused, a misspelt one reported,
mpicomp-config."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import mpiexec

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
QUICKSTART = ROOT / "examples" / "quickstart.py"


def run(n, *args, **env):
    return mpiexec(n, sys.executable, *args, timeout=120, env={**os.environ, **env})


def test_readme_shows_the_quickstart_verbatim():
    assert QUICKSTART.read_text().strip() in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("n", [2, 3])
def test_quickstart_compresses_on_one_node(n):
    r = run(n, str(QUICKSTART))
    assert r.returncode == 0, r.stderr[-2000:]
    line = r.stdout.strip()
    error = float(line.split("int8 max error ")[1].split(";")[0])
    assert 1e-4 < error < 0.05, line  # int8 really applied: not exact, within int8's reach
    assert "1 of 1 calls compressed" in line and "not compressed: {}" in line, line


def test_quickstart_alone_says_to_use_mpiexec():
    r = subprocess.run([sys.executable, str(QUICKSTART)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == "one rank: nothing travels; start it under mpiexec (first line)", r.stdout


PROGRAM = r"""
import numpy as np, mpicomp
from mpi4py import MPI
for n in (100, 200, 1 << 16):
    mpicomp.allreduce(np.ones(n, np.float32), codec="int4")
mpicomp.allreduce(np.ones(1 << 16, np.float32), codec="none")
"""


def test_stats_and_verbose_from_the_environment():
    r = run(2, "-c", PROGRAM, MPICOMP_STATS="1", MPICOMP_VERBOSE="1")
    assert r.returncode == 0, r.stderr[-2000:]
    notices = [line for line in r.stderr.splitlines() if line.startswith("mpicomp:")]
    assert len(notices) == 1 and "allreduce of 400 bytes sent uncompressed: input below min_bytes" in notices[0] \
        and "65536" in notices[0], r.stderr  # once per reason, rank 0 only; codec none needs no notice
    row = next(line.split() for line in r.stdout.splitlines() if line.startswith("  allreduce"))
    assert row[1:3] == ["4", "1"] and row[-2:] == ["none=1,small=2", "eager=3,flat=1"], r.stdout


def test_the_old_compress_local_variable_is_refused():
    r = run(1, "-c", "import mpicomp", MPICOMP_COMPRESS_LOCAL="1")
    assert r.returncode != 0 and "MPICOMP_SKIP_LOCAL=1" in r.stderr


def test_a_misspelt_variable_is_reported():
    """Python warns (once per process), at the program's own import line rather than inside
    mpicomp; the interposer says so at start-up (tests/test_pmpi.py)."""
    r = run(1, "-c", "import mpicomp", MPICOMP_MIN_BYTS="1", MPICOMP_MIN_BYTES="1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stderr.count("unknown variable") == 1 and "MPICOMP_MIN_BYTS ignored" in r.stderr, r.stderr
    assert r.stderr.startswith("<string>:1: UserWarning: mpicomp: unknown variable"), r.stderr


def test_mpicomp_config_prints_paths_and_flags():
    libs = subprocess.run([str(BIN / "mpicomp-config"), "--libs"], capture_output=True, text=True, check=True).stdout
    lib_dir = libs.split()[0].removeprefix("-L")
    assert libs.split()[-1] == "-lmpicomp_pmpi" and (Path(lib_dir) / "libmpicomp_pmpi.so").is_file()
    preload = subprocess.run([str(BIN / "mpicomp-config"), "--preload"], capture_output=True, text=True, check=True)
    assert Path(preload.stdout.strip()) == Path(lib_dir) / "libmpicomp_pmpi.so"
    shown = subprocess.run([str(BIN / "mpicomp-config")], capture_output=True, text=True, check=True).stdout
    assert "skip_local=0" in shown
