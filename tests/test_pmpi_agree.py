"""Settings that decide whether and how a call is compressed, differing between ranks under
the interposer (issue 23 item 8): every rank's call fails through the communicator's error
handler, and stderr names the variable and both values, instead of MPICH's "Message
truncated" inside MPI_Comm_dup or a hang. Rank 1's environment is changed before MPI_Init,
which is when the interposer reads it."""
import sys

import pytest
from test_pmpi import mpiexec

PROGRAM = r"""
import os
import sys
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
if rank == 1 and sys.argv[1]:
    os.environ[sys.argv[1]] = sys.argv[2]
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD.Dup()
c.Set_errhandler(MPI.ERRORS_RETURN)
x = np.ones(1 << 15, np.float32)  # 128 KiB: compressed at the default MPICOMP_MIN_BYTES
y = np.empty_like(x)
out = []
for call in (lambda: c.Allreduce(x, y), lambda: c.Allgather(x[:1024], np.empty(1024 * c.size, np.float32))):
    try:
        call()
        out.append(f"ok {y[0]}")
    except MPI.Exception as e:
        out.append(f"error {e.Get_error_class() == MPI.ERR_OTHER}")
os.write(1, f"RESULT {rank} {' | '.join(out)}\n".encode())
"""


@pytest.mark.parametrize("var,value,named", [
    ("MPICOMP_MIN_BYTES", "1048576", "MPICOMP_MIN_BYTES is"),
    ("MPICOMP_CODEC", "off", "MPICOMP_CODEC / MPICOMP_ALLREDUCE_CODEC is"),
    ("MPICOMP_CODEC", "int8:block=128", "int8:block=256"),
    ("MPICOMP_DTYPES", "float,double", "MPICOMP_DTYPES is"),
    ("MPICOMP_SKIP_LOCAL", "1", "MPICOMP_SKIP_LOCAL is"),
])
def test_differing_settings_fail_on_every_rank_naming_them(var, value, named):
    r = mpiexec(3, sys.executable, "-c", PROGRAM, var, value, timeout=120, MPICOMP_CODEC="int8")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    results = sorted(line for line in r.stdout.splitlines() if line.startswith("RESULT"))
    assert results == [f"RESULT {k} error True | error True" for k in range(3)], r.stdout + r.stderr[-2000:]
    assert named in r.stderr and r.stderr.count("must be the same on every rank") == 3, r.stderr[-3000:]


def test_equal_settings_compress_as_before():
    r = mpiexec(3, sys.executable, "-c", PROGRAM, "", "", timeout=120, MPICOMP_CODEC="int8")
    assert r.returncode == 0, r.stderr[-3000:]
    results = sorted(line for line in r.stdout.splitlines() if line.startswith("RESULT"))
    assert results == [f"RESULT {k} ok 3.0 | ok 3.0" for k in range(3)], r.stdout
