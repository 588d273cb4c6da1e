"""The fault injector of the fault tests: on the victim rank, a timer stops the process (SIGSTOP:
a stalled rank, as a hung device or a swapped-out node leaves it) or kills it (SIGKILL: a lost
rank) partway through a step, wherever the step then is: in the core's engine, in MPI, in an
optimizer's communication thread. Where torchft's tests make a wrapped process group fail its
next operation, this one fails the whole process, since a lost MPI rank does not say goodbye."""
import os
import signal
import subprocess
import sys
import threading

SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def sheltered(argv):
    """Runs argv (one rank) as a child of this process, and returns its exit status. MPICH's
    hydra, told to keep a job whose rank died (-disable-auto-cleanup), sends the processes it
    started SIGUSR1, and a rank receiving it is ended too (MPICH's handler, or the default
    action); this parent, which hydra started, ignores it in the rank's place. The child
    inherits hydra's PMI connection (close_fds=False)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    child = subprocess.run([sys.executable, *argv], close_fds=False, env={**os.environ, SHELTERED: "1"},
                           preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_DFL))
    if child.returncode < 0 and "OMPI_COMM_WORLD_RANK" in os.environ:
        # Killed: so is this process, as Open MPI must see it to keep the job (ULFM tolerates a
        # lost rank, not an error exit). MPICH's hydra keeps it after an error exit only.
        os.kill(os.getpid(), -child.returncode)
    return child.returncode


SHELTERED = "FAULT_TEST_SHELTERED"  # not MPICOMP_*: mpicomp reports names it does not know


def arm(kind, after_s):
    """Sends this process kind's signal after_s seconds from now, from a timer thread."""
    timer = threading.Timer(after_s, os.kill, (os.getpid(), SIGNALS[kind]))
    timer.daemon = True
    timer.start()
