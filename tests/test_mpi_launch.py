"""The multi-rank tests (tests/mpi, tests/torch/mpi, tests/optim/mpi) under a real mpiexec with
2 and 3 ranks, and the core's (tests/mpi), the torch layer's (the "mpicomp" backend against
gloo) and the optimizers' (uneven shards) with 4 too, the two-level collectives' and
agreement's at 6 (3 nodes of 2, 2 of 3), each with a timeout so that a hang fails instead of
blocking. Three ranks take the agreement's
odd-count path, four its power-of-two rounds."""
import os
import sys
from pathlib import Path

import pytest
from _launch import FAILURES, mpiexec

HERE = Path(__file__).parent


# MPICH's blocking calls spin: 4 ranks on 2 cores, the torch tests' own mpi4py calls (their
# references, barriers) starve the ranks they wait for, unless MPICH sleeps in its yields
# (docs/internals.md, "Oversubscribed nodes": 71-182 s without, 27.5-28 s with). Open MPI
# ignores the variable; the other suites took longer with it.
MPI_SETTINGS = {(4, "torch/mpi"): {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}}


@pytest.mark.parametrize("n,suite", [(2, "mpi"), (3, "mpi"), (4, "mpi"),
                                     (2, "torch/mpi"), (3, "torch/mpi"), (4, "torch/mpi"),
                                     (2, "optim/mpi"), (3, "optim/mpi"), (4, "optim/mpi"),
                                     (6, "mpi/test_nodes.py mpi/test_nodes_agreement.py")])
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
