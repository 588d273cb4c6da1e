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
    """Tests that change mpicomp.config get it back as it was. All ranks of these tests
    share one machine, where collectives skip compression unless config.compress_local is
    set: the tests set it, to exercise the codecs (test_collectives.py checks the default)."""
    import mpicomp

    fields = ("min_bytes", "eager_bytes", "segment_bytes", "compress_local")
    saved = [getattr(mpicomp.config, f) for f in fields]
    mpicomp.config.compress_local = 1
    yield
    for f, v in zip(fields, saved):
        setattr(mpicomp.config, f, v)
