"""The interposer's limits (issue 21 items 4 and 6), on mpi4py programs under LD_PRELOAD: a rank
that never reaches MPI_Allreduce makes the others' calls fail through the communicator's
error handler after MPICOMP_TIMEOUT seconds; error feedback's residuals stay within
MPICOMP_RESIDUAL_BYTES however many buffers a program reduces."""
import sys

import pytest
from test_pmpi import mpiexec

TIMEOUT_PROGRAM = r"""
import os
import sys
import time
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD.Dup()
c.Set_errhandler(MPI.ERRORS_RETURN)
x = np.ones(int(sys.argv[1]), np.float32)
y = np.empty_like(x)
c.Allreduce(x, y)  # the first call makes the private duplicate (MPI's blocking Comm_dup)
if c.rank != c.size - 1:
    t0 = time.perf_counter()
    try:
        c.Allreduce(x, y)
        os.write(1, b"RESULT no error\n")
    except MPI.Exception as e:
        os.write(1, f"RESULT error {e.Get_error_class() == MPI.ERR_OTHER} {time.perf_counter() - t0:.1f}\n".encode())
MPI.COMM_WORLD.Barrier()
fresh = MPI.COMM_WORLD.Dup()
fresh.Allreduce(x, y)
os.write(1, f"FRESH {y[0]}\n".encode())  # one write: lines of ranks do not mix
"""


# Compressed, and codec bound's small sums, which ride the agreement (MPICOMP_EAGER_BYTES).
@pytest.mark.parametrize("codec,n", [("int8", 1 << 18), ("bound:rel=1e-3", 64)])
def test_a_rank_that_never_calls_gets_the_others_an_error(codec, n):
    r = mpiexec(3, sys.executable, "-c", TIMEOUT_PROGRAM, str(n), timeout=120, MPICOMP_CODEC=codec,
                MPICOMP_TIMEOUT="1.5")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    results = [line.split()[1:] for line in r.stdout.splitlines() if line.startswith("RESULT")]
    assert len(results) == 2 and all(res[:2] == ["error", "True"] for res in results), r.stdout
    assert all(1.4 <= float(res[2]) < 10 for res in results), results
    assert "MPICOMP_TIMEOUT" in r.stderr
    assert r.stdout.count("FRESH 3.0") == 3, r.stdout


RESIDUALS_PROGRAM = r"""
import os
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
start = None
for i in range(100):  # a new (buffer, count) key each call: 4 MiB of residual each
    n = (1 << 20) + i
    x = np.ones(n, np.float32)
    y = np.empty_like(x)
    c.Allreduce(x, y)
    if i == 10:
        start = rss()
os.write(1, f"GROWTH {c.rank} {(rss() - start) >> 20}\n".encode())
"""


def test_error_feedback_residuals_are_bounded():
    r = mpiexec(2, sys.executable, "-c", RESIDUALS_PROGRAM, timeout=120, MPICOMP_CODEC="int8",
                MPICOMP_ERROR_FEEDBACK="1", MPICOMP_RESIDUAL_BYTES=str(16 << 20))
    assert r.returncode == 0, r.stderr[-3000:]
    growth = [int(line.split()[2]) for line in r.stdout.splitlines() if line.startswith("GROWTH")]
    assert len(growth) == 2 and max(growth) < 48, growth  # unbounded: 360 MiB
