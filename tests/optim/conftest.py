"""tests/optim: the serial tests here; tests/optim/mpi holds the multi-rank ones, which
tests/test_mpi_launch.py runs under mpiexec (tests/conftest.py leaves them out of a serial run)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _toy.py
