"""The agreement on nodes of several ranks, and the small uncompressed calls that ride it
(cpp/coll/rounds.cpp, two_levels): each node's ranks among themselves, one rank per node
between nodes, the outcome handed down each node. Sums and gathers against numpy, on layouts
whose nodes are runs of the communicator's ranks and on one whose nodes are not (a gather
then collects in node order and puts the blocks back in rank order); ranks that disagree raise
on every rank and the communicator works for the next call, as on one node
(test_mismatch.py). tests/test_mpi_launch.py runs this file at 4 and 6 ranks too."""
import functools
import time

import numpy as np
import pytest

import mpicomp

from _mpiutil import WORLD, assert_identical_on_all_ranks, config, data, sum64
from _ranks import wait_asleep
from test_mismatch import COLLS, call, check_still_works, disagreement

# Bytes of the data that rides: inside the agreement's header message, beyond it inside a
# node (the first 7 KiB travel inside, the rest as a message of its own), from 16 KiB, where on
# nodes of 2 it crosses between nodes in one lane, and beyond the header message between nodes
# (which take up to 32 KiB whole), under EAGER_BYTES.
PAYLOADS = [400, 9000, 20000, 40000]
EAGER_BYTES = 1 << 16


def elements(payload, dtype, parts=1):
    """Elements of dtype in `parts` equal parts whose sum rides as about `payload` bytes
    (16-bit floats are summed as float32)."""
    size = 4 if dtype == "float16" else np.dtype(dtype).itemsize
    return payload // size // parts * parts


ORDERS = ("in order", "reversed", "interleaved")
LAYOUTS = [k for k in (2, 3) if k < WORLD.size]  # ranks per node: two levels on this run's ranks


def layout_comm(k, order):
    """A new communicator laid out in blocks of k world ranks, its ranks in the world's order,
    reversed, or interleaved (the first rank of every node, then the second, ...), where the
    ranks of a node are not next to each other."""
    nodes = -(-WORLD.size // k)
    key = {"in order": WORLD.rank, "reversed": WORLD.size - WORLD.rank,
           "interleaved": WORLD.rank % k * nodes + WORLD.rank // k}[order]
    with config(ranks_per_node=k):
        c = WORLD.Split(0, key)
        assert mpicomp.node_layout(c).ranks_per_node == k
    return c


@functools.cache
def layout_comms(k):
    """layout_comm(k, order) for every order, made once on every rank."""
    return {order: layout_comm(k, order) for order in ORDERS}


def node_comms():
    """(k, order, communicator) for every layout of two levels this run can make."""
    return [(k, name, c) for k in LAYOUTS for name, c in layout_comms(k).items()]


def test_interleaved_layout_is_not_in_rank_order():
    for k, name, comm in node_comms():
        node_of = mpicomp.node_layout(comm).node_of
        assert (list(node_of) != sorted(node_of)) == (name == "interleaved"), (k, name, node_of)


def sum_tolerance(comm, x, result, div=1):
    """How far an uncompressed sum of x over the ranks, divided by div, may be from the float64
    `result`: the accumulation's roundings (float32 for 16-bit floats), the division's and the
    output's."""
    if x.dtype.kind in "iu":
        return np.zeros_like(result)
    acc = np.finfo(np.float64 if x.dtype == np.float64 else np.float32)
    out = np.finfo(x.dtype)
    absum = sum64(comm, np.abs(x.astype(np.float64)))
    return comm.size * acc.eps * absum / div + 2 * out.eps * np.abs(result) + out.smallest_subnormal


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("dtype,op", [("float32", "sum"), ("float32", "avg"), ("float16", "sum"),
                                      ("float64", "avg"), ("int32", "sum")])
def test_small_allreduce_rides_the_agreement_on_nodes(dtype, op, payload):
    n = elements(payload, dtype)
    for k, name, comm in node_comms():
        x = (data(comm, n, k) * (1000 if dtype == "int32" else 1)).astype(dtype)
        mpicomp.reset_stats()
        with config(eager_bytes=EAGER_BYTES):
            y = mpicomp.allreduce(x, comm=comm, codec="none", op=op)
        assert mpicomp.stats()["allreduce"]["algorithms"] == {"eager": 1}
        div = comm.size if op == "avg" else 1
        exact = sum64(comm, x) / div
        err = np.abs(y.astype(np.float64) - exact)
        assert y.dtype == x.dtype and np.all(err <= sum_tolerance(comm, x, exact, div)), (k, name, err.max())
        assert_identical_on_all_ranks(comm, y)


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_small_reduce_scatter_rides_the_agreement_on_nodes(dtype, payload):
    for k, name, comm in node_comms():
        n = elements(payload, dtype, comm.size) // comm.size  # each rank's part
        x = data(comm, n * comm.size, k, 1).astype(dtype)
        mpicomp.reset_stats()
        with config(eager_bytes=EAGER_BYTES):
            y = mpicomp.reduce_scatter(x, comm=comm, codec="none")
        assert mpicomp.stats()["reduce_scatter"]["algorithms"] == {"eager": 1}
        part = slice(comm.rank * n, (comm.rank + 1) * n)
        exact = sum64(comm, x)
        err = np.abs(y.astype(np.float64) - exact[part])
        assert y.dtype == x.dtype and np.all(err <= sum_tolerance(comm, x, exact)[part]), (k, name)


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "uint8"])
def test_small_allgather_rides_the_agreement_on_nodes_in_rank_order(dtype, payload):
    for k, name, comm in node_comms():
        n = payload // comm.size // np.dtype(dtype).itemsize  # each rank's block
        x = (data(comm, n, k, 2) * 50).astype(dtype)
        mpicomp.reset_stats()
        with config(eager_bytes=EAGER_BYTES):
            y = mpicomp.allgather(x, comm=comm, codec="none")
        assert mpicomp.stats()["allgather"]["algorithms"] == {"eager": 1}
        assert np.array_equal(y, np.concatenate(comm.allgather(x))), (k, name)


def doubling_messages(p):
    """Messages of recursive doubling among p ranks: the first 2 * rem pair up, one hands its
    data over and gets the result back; the pof2 others send log2(pof2) times each."""
    pof2 = 1 << (p.bit_length() - 1)
    return 2 * (p - pof2) + pof2 * (pof2.bit_length() - 1)


@pytest.mark.parametrize("hierarchy", ["auto", "flat"])
@pytest.mark.parametrize("n", [1000, 6000])
def test_where_small_sums_cross_between_nodes(n, hierarchy):
    """The data that rides the agreement, as mpicomp.stats() counts it. Each node's ranks sum
    by recursive doubling; the ranks with the same index on every node (lanes: as many as the
    smallest node has ranks) then among themselves; the node's first rank hands the sum to
    the ranks that no lane holds. On two levels, where the other lanes' copies would come to
    16 KiB, only lane 0 carries it between nodes and hands it down to all of its node: the
    node's card carries one copy, not one per lane (doubling over all ranks: one per rank)."""
    for k, name, comm in node_comms():
        sizes = mpicomp.node_layout(comm).sizes
        x = np.ones(n, np.float32)
        mpicomp.reset_stats()
        with config(hierarchy=hierarchy):
            mpicomp.allreduce(x, comm=comm, codec="none")
        s = mpicomp.stats()["allreduce"]
        got = comm.allreduce(np.array([s["bytes_inter"], s["bytes_intra"]]))
        lanes = min(sizes)
        if hierarchy == "auto" and (lanes - 1) * x.nbytes >= 16 << 10:
            lanes = 1
        inside = sum(doubling_messages(m) + m - lanes for m in sizes)
        assert list(got) == [x.nbytes * lanes * doubling_messages(len(sizes)), x.nbytes * inside], (k, name, sizes)


@pytest.mark.parametrize("size_class", ["eager", "small"])
@pytest.mark.parametrize("what", ["count", "dtype", "codec", "op"])
@pytest.mark.parametrize("coll", COLLS)
def test_ranks_that_disagree_raise_everywhere_on_nodes(coll, what, size_class):
    if what == "op" and coll == "allgather":
        pytest.skip("allgather has no op")
    for k, name, comm in node_comms():
        size = comm.size
        n = {"eager": 64, "small": 6000}[size_class] * size
        x, kw = disagreement(what, comm.rank, n)
        if what == "count" and coll == "reduce_scatter":
            x = np.ones(n + (size if comm.rank == 1 else 0), np.float32)
        with config() if size_class == "eager" else config(eager_bytes=0):
            with pytest.raises(mpicomp.ShapeMismatchError, match="disagree"):
                call(coll, x, comm, **kw)
        check_still_works(comm, coll)


@pytest.mark.parametrize("theirs", [(np.float32, 5000), (np.float32, 100), (np.float32, 0), (np.float64, 2000)])
def test_uncompressed_payloads_that_differ_on_nodes(theirs):
    """The last rank's payload against the others' 2000 float32 (7.8 KiB: beyond the header
    message): inside it, beyond it at another size, none, and larger. The last rank is a
    node's last, which receives the outcome from its node's first rank."""
    for k, name, comm in node_comms():
        dtype, n = theirs if comm.rank == comm.size - 1 else (np.float32, 2000)
        with pytest.raises(mpicomp.ShapeMismatchError, match="disagree"):
            mpicomp.allreduce(np.ones(n, dtype), comm=comm, codec="none")
        check_still_works(comm)


def test_disagreement_on_collective_on_nodes():
    for k, name, comm in node_comms():
        x = np.ones(10, np.float32)
        with pytest.raises(mpicomp.ShapeMismatchError):
            if comm.rank == comm.size - 1:
                mpicomp.allgather(x, comm=comm, codec="none")
            else:
                mpicomp.allreduce(x, comm=comm, codec="none")
        check_still_works(comm)


@pytest.mark.parametrize("odd", ["first", "last"])
def test_ranks_that_disagree_on_the_hierarchy_of_a_small_sum_raise_everywhere(odd):
    """One rank flat, the others on two levels, with 24 KiB that ride the agreement: that rank
    sends it in its lane, the others in lane 0 only. Every rank raises, and no stray message
    reaches the next calls."""
    for k, name, comm in node_comms():
        which = 0 if odd == "first" else comm.size - 1
        with config(hierarchy="flat" if comm.rank == which else "auto"):
            with pytest.raises(mpicomp.ShapeMismatchError, match="hierarchy flat"):
                mpicomp.allreduce(np.ones(6000, np.float32), comm=comm, codec="none")
        check_still_works(comm)
        check_still_works(comm, "allgather")


@pytest.mark.waits
@pytest.mark.parametrize("stalled", ["first", "last"])
@pytest.mark.parametrize("n", [1000, 6000])
def test_a_stalled_rank_makes_the_others_raise_on_nodes(n, stalled):
    """config.timeout_s with the data riding the agreement by node, in every lane (4 KB) and in
    one (24 KB): the ranks waiting for one that never arrives (a node's first rank, which
    hands the sum down, or the last rank) raise CommTimeoutError, none hangs; a fresh
    communicator then works."""
    x = np.ones(n, np.float32)
    for k in LAYOUTS:
        comm = layout_comm(k, "interleaved")  # one wait of the timeout per layout is enough
        which = 0 if stalled == "first" else comm.size - 1
        with config(timeout_s=1.0):
            mpicomp.reset_stats()
            mpicomp.allreduce(x, comm=comm, codec="none")  # set-up: MPI's blocking Comm_dup
            assert mpicomp.stats()["allreduce"]["algorithms"] == {"eager": 1}
            if comm.rank != which:
                t0 = time.perf_counter()
                with pytest.raises(mpicomp.CommTimeoutError, match="timeout_s"):
                    mpicomp.allreduce(x, comm=comm, codec="none")
                assert time.perf_counter() - t0 < 11
            wait_asleep(WORLD)
        fresh = WORLD.Dup()
        assert np.array_equal(mpicomp.allreduce(x, comm=fresh, codec="none"), np.full(n, comm.size, np.float32))
        fresh.Free()
