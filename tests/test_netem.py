"""bench/netem: namespaces and shaping set up as asked, and always torn down."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import _launch as launch
from _launch import MPIEXEC, open_mpi

NETEM = str(Path(__file__).resolve().parents[1] / "bench" / "netem")
root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None, reason="needs root and iproute2")


def namespaces():
    return set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


def netem(*args, timeout=120, env=None):
    return launch.run([sys.executable, NETEM, *args], timeout=timeout, env=env)


@root
def test_shared_loopback_is_shaped_and_removed():
    before = namespaces()
    r = netem("--rate", "100mbit", "--", "sh", "-c", 'tc qdisc show dev lo; echo "link=$MPICOMP_NETEM"')
    assert r.returncode == 0, r.stderr
    assert "tbf" in r.stdout and "100Mbit" in r.stdout
    assert "link=100mbit" in r.stdout  # what benchmarks record as their link
    assert namespaces() == before


def tc_burst(text):
    """The bytes of `tc qdisc show`'s "burst 130000b" (or 128Kb, 4882Kb, 5Mb)."""
    number, unit = re.search(r"burst (\d+(?:\.\d+)?)([KM]?)b", text).groups()
    return float(number) * {"": 1, "K": 1024, "M": 1 << 20}[unit]


@root
def test_burst_sets_the_token_buckets_size():
    r = netem("--rate", "10gbit", "--burst", "128K", "--", "sh", "-c",
              'tc qdisc show dev lo; echo "link=$MPICOMP_NETEM"')
    assert r.returncode == 0, r.stderr
    assert "link=10gbit burst 131072" in r.stdout, r.stdout
    assert tc_burst(r.stdout) == pytest.approx(131072, rel=0.05)  # tc keeps it in its own time units
    r = netem("--rate", "10gbit", "--", "sh", "-c", "tc qdisc show dev lo")
    assert tc_burst(r.stdout) == pytest.approx(5e6, rel=0.05), r.stdout  # the default: 4 ms at the rate
    r = netem("--burst", "4K", "--", "true")
    assert r.returncode == 2 and "bad burst" in r.stderr


@root
def test_command_exit_code_is_passed_on_and_cleanup_happens():
    before = namespaces()
    r = netem("--", "sh", "-c", "exit 7")
    assert r.returncode == 7
    assert namespaces() == before


mpich_only = pytest.mark.skipif(open_mpi(), reason="per-rank namespaces are MPICH only (Open MPI's refusal: "
                                "test_open_mpi_on_the_shared_loopback_and_refused_per_rank)")


@root
@mpich_only
def test_per_rank_links_carry_mpi_traffic():
    before = namespaces()
    prog = ("from mpi4py import MPI; import socket, subprocess; c = MPI.COMM_WORLD; "
            "a = subprocess.run(['ip', '-4', 'addr', 'show', 'eth0'], capture_output=True, text=True).stdout; "
            "import os; mine = '10.213.0.%d' % (c.rank + 1); "
            "r = c.gather((c.allreduce(c.rank + 1), mine in a and os.environ['MPICOMP_NETEM_ADDR'] == mine)); "
            "print(r if c.rank == 0 else '', flush=True)")
    r = netem("--rate", "1gbit", "--per-rank", "--", MPIEXEC, "-n", "2", sys.executable, "-c", prog)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["[(3,", "True),", "(3,", "True)]"]
    assert namespaces() == before


@root
@pytest.mark.skipif(not open_mpi(), reason="Open MPI's launcher (the MPICH suite runs the per-rank tests)")
def test_open_mpi_on_the_shared_loopback_and_refused_per_rank():
    """Open MPI's ranks talk over the shaped loopback by TCP; per rank, where they could not
    reach mpirun's PMIx server and failed in MPI_Init, netem refuses before creating anything."""
    before = namespaces()
    prog = "from mpi4py import MPI; c = MPI.COMM_WORLD; print(c.allreduce(c.rank + 1), flush=True)"
    tcp = ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo", "--mca", "pml", "ob1"]
    r = netem("--rate", "1gbit", "--", MPIEXEC, "-n", "2", *tcp, sys.executable, "-c", prog)
    assert r.returncode == 0 and r.stdout.split() == ["3", "3"], r.stdout + r.stderr
    r = netem("--per-rank", "--", MPIEXEC, "-n", "2", *tcp, sys.executable, "-c", prog)
    assert r.returncode == 2 and "need MPICH" in r.stderr and "PMIx" in r.stderr, r.stderr
    assert namespaces() == before


def test_bad_arguments_exit_2():
    r = netem("--rate", "fast", "--", "true")
    assert r.returncode == 2 and "bad rate" in r.stderr
    r = netem("--rate", "1gbit")
    assert r.returncode == 2 and "no command" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root to drop it")
def test_without_root_it_says_so():
    """Run as nobody, from wherever the clone lives: a clone in a directory only root may
    enter (a 0700 home, a `mktemp -d` folder) is closed to nobody, so the script runs from a
    copy in a folder anyone can read, by the interpreter itself rather than through the
    venv's link to it (netem needs only the standard library), from /."""
    where = Path(tempfile.mkdtemp(prefix="netem-"))
    try:
        where.chmod(0o755)
        script = where / "netem"
        shutil.copy(NETEM, script)
        script.chmod(0o755)
        r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                            os.path.realpath(sys.executable), str(script), "--", "true"],
                           capture_output=True, text=True, timeout=60, cwd="/")
    finally:
        shutil.rmtree(where)
    assert r.returncode == 2 and "needs root" in r.stderr, r.stderr


@root
@mpich_only
def test_ranks_per_node_shapes_only_links_between_nodes():
    """4 ranks as 2 nodes of 2 at 100 Mbit/s: 4 MB between ranks of one node take far less
    than between nodes (0.34 s on the link), and each node's ranks share its address."""
    before = namespaces()
    prog = ("from mpi4py import MPI; import numpy as np, os, time; c = MPI.COMM_WORLD; x = np.ones(1 << 20, np.float32); "
            "y = np.empty_like(x)\n"
            "def t(a, b):\n"
            "    c.Barrier(); s = time.perf_counter()\n"
            "    if c.rank == a: c.Send(x, b); c.Recv(y, b)\n"
            "    if c.rank == b: c.Recv(y, a); c.Send(x, a)\n"
            "    return c.allreduce(time.perf_counter() - s, op=MPI.MAX)\n"
            "t(0, 1); t(0, 2); intra, inter = t(0, 1), t(0, 2)\n"
            "addrs = c.gather(os.environ['MPICOMP_NETEM_ADDR'])\n"
            "print(addrs, intra, inter) if c.rank == 0 else None")
    r = netem("--rate", "100mbit", "--ranks-per-node", "2", "--", MPIEXEC, "-n", "4", sys.executable, "-c", prog)
    assert r.returncode == 0, r.stderr
    addrs, intra, inter = r.stdout.rsplit("]", 1)[0] + "]", *map(float, r.stdout.rsplit("]", 1)[1].split())
    assert addrs == str(["10.213.0.1", "10.213.0.1", "10.213.0.2", "10.213.0.2"])
    assert inter > 0.5 and intra < inter / 4, (intra, inter)  # 8 MB both ways at 100 Mbit/s: >= 0.67 s
    assert namespaces() == before


@root
@mpich_only
def test_ranks_per_node_tells_mpicomp_the_nodes():
    """--ranks-per-node K sets MPICOMP_RANKS_PER_NODE=K for the program (MPICH itself, under
    NOLOCAL, sees a node per rank), so mpicomp's allreduce runs in two levels, unless the
    caller set it."""
    prog = ("import mpicomp, numpy as np; c = mpicomp.MPI.COMM_WORLD\n"
            "mpicomp.allreduce(np.ones(1 << 16, np.float32), comm=c, codec='int8')\n"
            "print(mpicomp.node_layout(c).node_of, mpicomp.stats()['allreduce']['algorithms']) if c.rank == 0 else None")
    r = netem("--rate", "1gbit", "--ranks-per-node", "2", "--", MPIEXEC, "-n", "4", sys.executable, "-c", prog)
    assert r.returncode == 0 and "(0, 0, 1, 1) {'two_level': 1}" in r.stdout, r.stdout + r.stderr
    r = netem("--rate", "1gbit", "--ranks-per-node", "2", "--", MPIEXEC, "-n", "4", sys.executable, "-c", prog,
              env={**os.environ, "MPICOMP_RANKS_PER_NODE": "1"})
    assert r.returncode == 0 and "(0, 1, 2, 3) {'flat': 1}" in r.stdout, r.stdout + r.stderr
