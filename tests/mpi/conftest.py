"""Runs in every rank of `mpiexec -n N python -m pytest tests/mpi` (see test_mpi_launch.py).

A rank whose test fails aborts the whole job: otherwise the other ranks would wait in the
next collective until the outer timeout."""
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/_reference.py


def pytest_runtest_logreport(report):
    if report.failed and MPI.COMM_WORLD.Get_size() > 1:
        rank = MPI.COMM_WORLD.Get_rank()
        sys.stderr.write(f"\n[rank {rank}] FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


@pytest.fixture(autouse=True)
def _same_config():
    """Tests that change mpicomp.config get it back as it was."""
    import mpicomp

    saved = (mpicomp.config.min_bytes, mpicomp.config.eager_bytes, mpicomp.config.segment_bytes)
    yield
    mpicomp.config.min_bytes, mpicomp.config.eager_bytes, mpicomp.config.segment_bytes = saved
