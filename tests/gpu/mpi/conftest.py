"""Runs in every rank of `mpiexec -n N python -m pytest tests/gpu/mpi` (tests/gpu/test_device_launch.py)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/_ranks.py

from _ranks import _same_config, pytest_runtest_logreport, pytest_runtest_setup  # noqa: E402,F401
