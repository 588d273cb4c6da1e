"""Runs in every rank of `mpiexec -n N python -m pytest tests/torch/mpi` (see
tests/test_mpi_launch.py). A rank whose test fails aborts the whole job, so the others do
not wait in the next collective until the outer timeout. torch.distributed (gloo) is set up
once per session for the tests that compare against torch's own DDP."""
import sys
from pathlib import Path

import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/_ranks.py
from _ranks import _same_config, pytest_runtest_logreport, pytest_runtest_setup  # noqa: E402,F401

WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="session")
def gloo():
    """torch.distributed over gloo with COMM_WORLD's ranks."""
    import mpicomp.torch as mt

    dist = mt.init_process_group(WORLD, "gloo")
    yield dist
    dist.destroy_process_group()
