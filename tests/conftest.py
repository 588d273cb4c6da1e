"""Serial test session. tests/mpi, tests/torch/mpi, tests/gpu/mpi and tests/optim/mpi hold the
multi-rank tests: test_mpi_launch.py runs them under mpiexec with 2, 3 and 4 ranks. Collected
here, in one process, they would pair ranks that do not exist (a send to oneself blocks like
MPI_Send does), so a serial run leaves them out; named on the command line without mpiexec
they skip (tests/_ranks.py says how to run them)."""
from collections import Counter

from _launch import allow_open_mpi_here, under_mpiexec

allow_open_mpi_here()
collect_ignore = [] if under_mpiexec() else ["mpi", "torch/mpi", "gpu/mpi", "optim/mpi"]


def pytest_terminal_summary(terminalreporter):
    """One line that says why tests were skipped, e.g. '277 skipped: needs a CUDA GPU (277)'."""
    reasons = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if reasons:
        terminalreporter.write_line(f"{sum(reasons.values())} skipped: "
                                    + "; ".join(f"{r} ({n})" for r, n in reasons.most_common()))
