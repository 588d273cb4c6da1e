"""The fault injector of the fault tests: on the victim rank, a timer stops the process (SIGSTOP:
a stalled rank, as a hung device or a swapped-out node leaves it) or kills it (SIGKILL: a lost
rank) partway through a step, wherever the step then is: in the core's engine, in MPI, in an
optimizer's communication thread. Where torchft's tests make a wrapped process group fail its
next operation, this one fails the whole process, since a lost MPI rank does not say goodbye."""
import ctypes
import os
import signal
import subprocess
import sys
import threading

SIGNALS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP}


def sheltered(argv):
    """Runs argv (one rank) as a child of this process, and returns its exit status.

    MPICH's hydra, told to keep a job whose rank died (-disable-auto-cleanup), sends the
    process group of every rank it started SIGUSR1. A rank ends at it without a handler; with
    MPICH's, it goes on, and may then crash: a segfault in UCX's libucp (at 0x...fef4). The
    survivor of a 2-rank ZeRO1 job whose ranks hydra started itself died so in 9 of 16 runs
    while timeouts cancelled their sends (which crashed the same way: cpp/coll/deadline.cpp),
    and still in 1 of 8 since; when the signal still reached these children, a survivor
    vanished without a word about once in 200 jobs. So the child runs in a process group of
    its own, which hydra's signal does not reach, and this parent ignores the signal in its
    place: MPICH then never hears of the lost rank, which to the survivors is one that stopped
    answering, as a node lost on the network, and the timeout reports it. Both end when their
    parent does (PR_SET_PDEATHSIG), so that ending the launcher also ends a stopped rank. The
    child inherits hydra's PMI connection (close_fds=False)."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    _end_with_parent()

    def in_child():
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)
        _end_with_parent()

    child = subprocess.run([sys.executable, *argv], close_fds=False, process_group=0, preexec_fn=in_child,
                           env={**os.environ, SHELTERED: "1", "PYTHONFAULTHANDLER": "1"})
    if child.returncode:  # the test's output then says how a survivor that never reported ended
        print(f"[rank {os.environ.get('PMI_RANK', os.environ.get('OMPI_COMM_WORLD_RANK'))}: exit status "
              f"{child.returncode}]", file=sys.stderr, flush=True)
    if child.returncode < 0 and "OMPI_COMM_WORLD_RANK" in os.environ:
        # Killed: so is this process, as Open MPI must see it to keep the job (ULFM tolerates a
        # lost rank, not an error exit). MPICH's hydra keeps it after an error exit only.
        os.kill(os.getpid(), -child.returncode)
    return child.returncode


def _end_with_parent():
    """This process is killed when its parent ends (Linux's prctl PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1


SHELTERED = "FAULT_TEST_SHELTERED"  # not MPICOMP_*: mpicomp reports names it does not know


def arm(kind, after_s):
    """Sends this process kind's signal after_s seconds from now, from a timer thread."""
    timer = threading.Timer(after_s, os.kill, (os.getpid(), SIGNALS[kind]))
    timer.daemon = True
    timer.start()
