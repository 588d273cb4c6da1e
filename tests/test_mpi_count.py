"""The fallback for an MPI without the large-count `_c` functions (Open MPI 5): counts above
the int-count limit are split (cpp/coll/mpi_count.h), blocking and started nonblocking. Built
here with the limit lowered so the splits run on small buffers, with either MPI, at 2 and 3
ranks."""
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import mpiexec

BIN = Path(sys.executable).parent
SOURCE = Path(__file__).parent / "mpi_count" / "check_mpi_count.cpp"


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    exe = tmp_path_factory.mktemp("mpi_count") / "check_mpi_count"
    subprocess.run([str(BIN / "mpicxx"), "-std=c++17", "-O1", "-DMPICOMP_MPI_LARGE_COUNT=0",
                    "-DMPICOMP_MPI_COUNT_MAX=1000", "-o", str(exe), str(SOURCE)], check=True, timeout=300)
    return exe


@pytest.mark.parametrize("n", [2, 3])
def test_split_counts_give_the_exact_results(program, n):
    r = mpiexec(n, program, timeout=120)
    assert r.returncode == 0 and "0 failed checks" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
