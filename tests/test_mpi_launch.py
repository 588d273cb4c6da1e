"""The multi-rank tests (tests/mpi, tests/torch/mpi, tests/optim/mpi) under a real mpiexec with
2 and 3 ranks, and the core's (tests/mpi), the torch layer's (the "mpicomp" backend against
gloo) and the optimizers' (uneven shards) with 4 too, the two-level collectives' and
agreement's at 6 (3 nodes of 2, 2 of 3), each with a timeout so that a hang fails instead of
blocking. Three ranks take the agreement's
odd-count path, four its power-of-two rounds."""
import json
import os
import re
import sys
from pathlib import Path

import pytest
from _launch import FAILURES, mpiexec, open_mpi

HERE = Path(__file__).parent


# MPICH's blocking calls spin: 4 ranks on 2 cores, the torch tests' own mpi4py calls (their
# references, barriers) starve the ranks they wait for, unless MPICH sleeps in its yields
# (docs/internals.md, "Oversubscribed nodes": 71-182 s without, 27.5-28 s with). Open MPI
# ignores the variable; the other suites took longer with it.
MPI_SETTINGS = {(4, "torch/mpi"): {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}}


@pytest.mark.parametrize("n,suite", [(2, "mpi"), (3, "mpi"), (4, "mpi"),
                                     (2, "torch/mpi"), (3, "torch/mpi"), (4, "torch/mpi"),
                                     (2, "optim/mpi"), (3, "optim/mpi"), (4, "optim/mpi"),
                                     (6, "mpi/test_nodes.py mpi/test_nodes_traffic.py mpi/test_nodes_agreement.py")])
def test_under_mpiexec(n, suite, tmp_path):
    env = {**os.environ, **MPI_SETTINGS.get((n, suite), {}), FAILURES: str(tmp_path)}
    r = mpiexec(n, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=240",
                "--timeout-method=thread", *(HERE / s for s in suite.split()), timeout=900, env=env)
    failures = "".join(p.read_text() for p in sorted(tmp_path.glob("rank*.txt")))
    assert r.returncode == 0, f"mpiexec -n {n} {suite} failed:\n{r.stdout[-6000:]}\n{r.stderr[-6000:]}\n{failures}"


def test_cluster_recipe_shows_the_layout():
    """docs/cluster.md's command that shows the node layout, as written there."""
    code = "import mpicomp, numpy as np; print(mpicomp.node_layout(mpicomp.MPI.COMM_WORLD))"
    env = {**os.environ, "MPICOMP_VERBOSE": "1", "MPICOMP_RANKS_PER_NODE": "2"}
    r = mpiexec(4, sys.executable, "-c", code, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "mpicomp: 4 ranks on 2 nodes: 2+2 ranks (ranks_per_node = 2; two-level collectives apply)" in r.stderr
    assert r.stdout.count("node_of=(0, 0, 1, 1)") == 4
    assert code in (HERE.parent / "docs" / "cluster.md").read_text().replace(" \\\n  ", " ")


KNOWN_NODES = """
import json, numpy as np, mpicomp
w = mpicomp.MPI.COMM_WORLD
mpicomp.allreduce(np.ones(256, np.float32), comm=w, codec="auto")
m = mpicomp.auto.model(w, "allreduce")
print(json.dumps([mpicomp.node_layout(w).nodes, mpicomp.config.eager_bytes, m]) if w.rank == 0 else "")
"""


@pytest.mark.skipif(open_mpi(), reason="nodes named to hydra's fork launcher: MPICH's")
def test_auto_on_nodes_mpi_knows_of_times_one_lane_against_every_lane():
    """Nodes MPI knows of (hydra's fork launcher given two host names: MPI_Comm_split_type
    finds 2 nodes of 2). Their uncompressed allreduce is MPI's own on either hierarchy above
    eager_bytes, but up to it rides the agreement, in one lane on two levels and in every lane
    flat: codec auto times the flat hierarchy apart there, and only there (eager_bytes 8 KiB, so
    that the probe, which stops at its time budget, passes it). Above it an uncompressed call
    takes the flat path, the same one: the interposer hands it to MPI untouched."""
    r = mpiexec(4, sys.executable, "-c", KNOWN_NODES, timeout=300, env={**os.environ, "MPICOMP_EAGER_BYTES": "8K"},
                options=("-launcher", "fork", "-hosts", "node0:2,node1:2"))
    assert r.returncode == 0, r.stderr[-3000:]
    nodes, eager, m = json.loads(r.stdout.strip())
    assert nodes == 2 and len(m["plain_flat"]) == len(m["bytes"])
    apart = [b <= eager for b in m["bytes"]]
    assert any(apart) and not all(apart), m["bytes"]
    assert all(f == p for b, f, p in zip(m["bytes"], m["plain_flat"], m["plain"]) if b > eager)
    assert flat_runs(m["describe"], "uncompressed")[-1].endswith(size_text(m["bytes"][-1])), m["describe"]


def size_text(b):
    """A size as mpicomp's messages write it."""
    return f"{b / 1024:.1f} KiB" if b < 1 << 20 else f"{b / (1 << 20):.1f} MiB"


def flat_runs(describe, way):
    """The runs of sizes a way takes flat, from auto's description of its model."""
    found = re.search(rf"flat hierarchy: (?:.*; )?{way} ([^;]*)", describe)
    return found.group(1).split(", ") if found else []
