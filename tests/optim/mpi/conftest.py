"""Runs in every rank of `mpiexec -n N python -m pytest tests/optim/mpi` (see
tests/test_mpi_launch.py): a failing rank aborts the job instead of leaving the others
waiting in the next collective."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/_ranks.py, tests/optim/_toy.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _ranks import _same_config, pytest_runtest_logreport, pytest_runtest_setup  # noqa: E402,F401
