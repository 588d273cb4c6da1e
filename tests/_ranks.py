"""What every multi-rank test session needs (imported by tests/mpi/conftest.py and
tests/torch/mpi/conftest.py, so pytest finds these hooks and fixtures there)."""
import os
import sys
import time

import pytest
from _launch import FAILURES, under_mpiexec
from mpi4py import MPI


def pytest_runtest_setup(item):
    """Run without mpiexec (pytest tests/mpi) these tests would pair ranks that do not exist
    and block: they skip, saying how to run them."""
    if not under_mpiexec():
        suite = os.path.relpath(item.path.parent)
        pytest.skip(f"multi-rank test: run 'make test', or '.venv/bin/mpiexec -n 2 .venv/bin/python -m pytest "
                    f"{suite}'")


def pytest_runtest_logreport(report):
    """A rank whose test fails aborts the whole job: otherwise the other ranks would wait in
    the next collective until the outer timeout. Its report goes to stderr and, where the
    launching test names one (tests/test_mpi_launch.py), to a file of its own: the launcher
    may end the job before it has passed on what the rank wrote (seen once: an empty stderr)."""
    if report.failed and MPI.COMM_WORLD.Get_size() > 1:
        rank = MPI.COMM_WORLD.Get_rank()
        text = f"\n[rank {rank}] FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n"
        if FAILURES in os.environ:
            with open(os.path.join(os.environ[FAILURES], f"rank{rank}.txt"), "a") as f:
                f.write(text)
        sys.stderr.write(text)
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


@pytest.fixture(autouse=True)
def _same_config():
    """Tests that change mpicomp.config get it back as it was: every setting of the core's, in
    the core's own order (a setting added there is restored too)."""
    from mpicomp import _core

    saved = _core.get_config()
    yield
    _core.set_config(*saved)


def wait_asleep(comm):
    """comm.Barrier(), asleep between looks: the rank the others time out waiting for (the
    tests marked "waits") sits here for the whole timeout, and MPI's own Barrier would spin
    through it, taking a core from the ranks that wait for it (4 ranks on 2 cores: 78 against
    34 CPU-seconds for those tests in tests/mpi)."""
    request = comm.Ibarrier()
    while not request.Test():
        time.sleep(0.002)
