"""Runs in every rank of `mpiexec -n N python -m pytest tests/gpu/mpi` (tests/gpu/test_device_launch.py)."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/_ranks.py

from _ranks import _same_config, pytest_runtest_logreport, pytest_runtest_setup  # noqa: E402,F401


@pytest.fixture(autouse=True)
def host_tiles():
    """Where each rank's part of a tile starts shapes lossy sums: GPU calls take the host
    calls' segments here (_same_config puts them back), so that the two give the same
    bytes, and several segments per part."""
    import mpicomp

    mpicomp.config.segment_bytes = mpicomp.config.gpu_segment_bytes = 256 << 10
