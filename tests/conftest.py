"""Serial test session. tests/mpi, tests/torch/mpi and tests/optim/mpi hold the multi-rank tests:
test_mpi_launch.py runs them under mpiexec with 2 and 3 ranks.
Collected here, in one process, they would pair ranks that do not exist (a send to oneself
blocks like MPI_Send does), so a serial run leaves them out."""
import os

collect_ignore = [] if "PMI_RANK" in os.environ else ["mpi", "torch/mpi", "gpu/mpi", "optim/mpi"]
