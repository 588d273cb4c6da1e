"""What every multi-rank test session needs (imported by tests/mpi/conftest.py and
tests/torch/mpi/conftest.py, so pytest finds these hooks and fixtures there)."""
import sys

import pytest
from mpi4py import MPI


def pytest_runtest_logreport(report):
    """A rank whose test fails aborts the whole job: otherwise the other ranks would wait in
    the next collective until the outer timeout."""
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
