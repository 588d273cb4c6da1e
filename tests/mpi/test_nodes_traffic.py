"""The bytes two-level and flat collectives put inside nodes and between them, as mpicomp.stats()
counts them: two levels send 1/R of flat's between nodes of R ranks, flat counts each peer's
share by its node, and bench.bound.traffic (the %Bound column's and the scale model's bytes)
is what the counters hold. Nodes emulated as in test_nodes.py; tests/test_mpi_launch.py runs
this file at 6 ranks too."""
import numpy as np
import pytest

import mpicomp

from _mpiutil import WORLD, config
from test_nodes import data, layouts, nodes_comm


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
def test_bytes_between_nodes_are_one_rth_of_flat(coll):
    for k in layouts():
        if WORLD.size % k:
            continue  # equal nodes: R is the same everywhere
        comm = nodes_comm(k)
        x = data(comm, comm.size << 16, 3).astype(np.float32)
        inter = {}
        for h in ("auto", "flat"):
            mpicomp.reset_stats()
            with config(hierarchy=h):
                getattr(mpicomp, coll)(x, comm=comm, codec="int8")
            s = mpicomp.stats()[coll]
            inter[h] = comm.allreduce(s["bytes_inter"])
            assert s["algorithms"] == {"two_level" if h == "auto" else "flat": 1}
        assert abs(inter["flat"] / inter["auto"] - k) < 0.02 * k, (k, inter)


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
@pytest.mark.parametrize("hierarchy", ["auto", "flat"])
def test_the_bound_models_traffic_is_what_the_stats_count(coll, hierarchy):
    """bench.bound.traffic (the %Bound column's and the scale model's bytes) against the bytes
    each rank's messages carried, inside the node and between nodes, summed over ranks."""
    from mpicomp.bench import bound

    int8 = mpicomp.codec("int8")
    for k in layouts():
        if WORLD.size % k:
            continue
        comm = nodes_comm(k)
        n = comm.size * 256 * 1024  # whole codec blocks in every part and tile
        x = data(comm, n, 12).astype(np.float32)
        mpicomp.reset_stats()
        with config(hierarchy=hierarchy, segment_bytes=1 << 20):
            getattr(mpicomp, coll)(x, comm=comm, codec="int8")
        s = mpicomp.stats()[coll]
        algorithm = "two_level" if hierarchy == "auto" else "flat"
        inside, across = bound.traffic(coll, algorithm, n, comm.size, k, int8.encoded_bytes(n) / n)
        got = comm.allreduce(np.array([s["bytes_intra"], s["bytes_inter"]], np.float64))
        assert got == pytest.approx([comm.size * inside, comm.size * across], rel=1e-6), (k, got)


@pytest.mark.parametrize("coll", ["reduce_scatter", "allgather"])
def test_flat_reduce_scatter_and_allgather_count_bytes_by_node(coll):
    """Flat (asked for, or on nodes of unequal size): every peer's share counted by its node."""
    for k in layouts():
        comm = nodes_comm(k)
        x = data(comm, comm.size * (1 << 14), 4).astype(np.float32)
        mpicomp.reset_stats()
        with config(hierarchy="flat" if comm.size % k == 0 else "auto"):
            getattr(mpicomp, coll)(x, comm=comm, codec="int8")
        s = mpicomp.stats()[coll]
        assert s["algorithms"] == {"flat": 1}, s
        peers = [j for j in range(comm.size) if j != comm.rank]
        inter = sum(1 for j in peers if j // k != comm.rank // k)
        # Every peer gets a part of one size (reduce_scatter) or the same part (allgather).
        assert s["bytes_inter"] + s["bytes_intra"] == s["bytes_wire"]
        assert s["bytes_inter"] * len(peers) == s["bytes_wire"] * inter, (k, s)
