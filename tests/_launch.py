"""What the tests need to start ranks with either MPI from PyPI: MPICH's hydra or Open MPI's
mpiexec (prterun)."""
import os
import subprocess
import sys
from pathlib import Path

MPIEXEC = str(Path(sys.executable).parent / "mpiexec")

# What a launcher prints when it could not start the job at all, before any rank ran: a
# failure of the machine, not of the code under test, so the job is started again. Seen on CI:
# Open MPI 5's PRRTE, once in a few hundred launches on 2 loaded cores.
LAUNCH_FAILURES = ("The PMIx server's listener thread failed to start",)
LAUNCH_TRIES = 3

# The folder where a multi-rank test session's ranks write the reports of their failures
# (tests/_ranks.py), named by the test that launched them.
FAILURES = "TESTS_RANK_FAILURES"  # not MPICOMP_*: mpicomp warns of names it does not know

# Each launcher tells its ranks who they are in its own variables.
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK")


def under_mpiexec():
    return any(v in os.environ for v in RANK_VARIABLES)


def launch_failed(output):
    return any(m in output for m in LAUNCH_FAILURES)


def launched(attempt, output):
    """attempt()'s result, attempt() made again (LAUNCH_TRIES in all) while the output(result)
    of a job that started ranks says the launcher itself failed to start."""
    for _ in range(LAUNCH_TRIES):
        result = attempt()
        if not launch_failed(output(result)):
            break
    return result


def run(cmd, *, timeout, **kwargs):
    """subprocess.run of a command that starts ranks (mpiexec, or bench/netem around it), its
    output captured as text, started again when the launcher itself failed to start."""
    return launched(lambda: subprocess.run(list(map(str, cmd)), capture_output=True, text=True, timeout=timeout,
                                           **kwargs),
                    lambda r: "" if r.returncode == 0 else r.stdout + r.stderr)


def mpiexec(n, *args, timeout, options=(), **kwargs):
    """`mpiexec [options] -n n args...` through run()."""
    return run([MPIEXEC, *options, "-n", n, *args], timeout=timeout, **kwargs)


def open_mpi():
    return (Path(sys.executable).parent / "ompi_info").exists()


def allow_open_mpi_here():
    """Open MPI's mpiexec refuses to run as root (CI does) and to start more ranks than there
    are cores (the tests start up to 4 on 2): both are allowed through the environment, which
    every mpiexec the tests start inherits. Changes nothing under MPICH."""
    if open_mpi():
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        os.environ.setdefault("PRTE_MCA_rmaps_default_mapping_policy", ":oversubscribe")


def keep_going_after_a_lost_rank():
    """mpiexec's options that keep a job's other ranks running when one dies (by default both
    launchers end the job): what the fault tests need to see what the survivors raise. Open
    MPI's is its run-time switch for ULFM (User Level Failure Mitigation)."""
    return ["--with-ft", "ulfm"] if open_mpi() else ["-disable-auto-cleanup"]
