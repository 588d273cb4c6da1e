"""Two-level collectives on nodes of several ranks (config.ranks_per_node emulates the nodes;
MPI itself sees one). Runs in every rank at any size; a layout that needs more ranks than the
run has is skipped, and tests/test_mpi_launch.py runs this file at 4 (2x2, 3+1) and 6 (3x2)
ranks too. Each layout is made on a fresh Dup, since a communicator's layout is fixed at
its first use."""
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpicomp

import _reference as ref
from _mpiutil import WORLD, config, sum64
from _ranks import wait_asleep

CODECS = [*ref.CODECS, "lossless"]  # and a framed one


def nodes_comm(k):
    """A fresh duplicate of the world whose layout is blocks of k world ranks."""
    with config(ranks_per_node=k):
        c = WORLD.Dup()
        mpicomp.node_layout(c)  # made now, with k
    return c


def layouts():
    """(ranks per node, two levels apply) for the layouts this run can make."""
    p = WORLD.size
    return [k for k in (2, 3) if k < p]


def node_sums(comm, k, x64):
    """float64 sum of x64 over each node (block of k world ranks), the one of this rank's node
    stacked per node: (nodes, n)."""
    allx = np.stack(comm.allgather(x64))
    return np.stack([allx[i:i + k].sum(axis=0) for i in range(0, comm.size, k)]), np.abs(allx).sum(axis=0)


def two_level_bound(c, comm, k, x64, avg, out_dtype):
    """Error bound of the two-level allreduce: exact float32 sums inside each node, each
    node's sum encoded once between nodes, the float32 total encoded once more, then the
    division and the output rounding. Slack terms as in _mpiutil.allreduce_bound."""
    sums, absum = node_sums(comm, k, x64)
    exact = sums.sum(axis=0)
    acc = (comm.size + 1) * 2.0**-24 * absum + 2.0**-149  # float32 sums inside the node and between
    t1 = sum(c.tolerance(np.abs(s) + acc) for s in sums)
    t2 = c.tolerance(np.abs(exact) + t1 + acc)
    div = comm.size if avg else 1
    mag = (np.abs(exact) + t1 + acc + t2) / div
    return exact / div, (t1 + acc + t2) / div + 2 * ref.f32_rounding(mag) + ref.output_rounding(out_dtype, mag)


def data(comm, n, seed):
    g = np.random.default_rng([seed, comm.rank])
    return g.standard_normal(n) * np.exp(g.uniform(-3, 3, n))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_layout_follows_world_ranks(k):
    if k >= WORLD.size and k > 1:
        pytest.skip("needs more ranks")
    lay = mpicomp.node_layout(nodes_comm(k))
    assert lay.node_of == tuple(r // k for r in range(WORLD.size))
    assert lay.node == WORLD.rank // k and lay.local == WORLD.rank % k
    assert lay.lanes == min(lay.sizes) and lay.ranks_per_node == k
    # A sub-communicator (reversed order) takes its members' nodes in the world.
    with config(ranks_per_node=k):
        rev = WORLD.Split(0, WORLD.size - WORLD.rank)
        lay = mpicomp.node_layout(rev)
    members = rev.allgather(WORLD.rank)
    first = {}
    for w in members:
        first.setdefault(w // k, len(first))
    assert lay.node_of == tuple(first[w // k] for w in members)


def test_node_comms_split_by_the_layout():
    for k in layouts():
        comm = nodes_comm(k)
        if comm.size % k:
            with pytest.raises(mpicomp.ArgumentError, match="differ in size"):
                mpicomp.node_comms(comm)
            continue
        intra, inter = mpicomp.node_comms(comm)
        assert intra.allgather(comm.rank) == [r for r in range(comm.size) if r // k == comm.rank // k]
        assert inter.allgather(comm.rank) == [r for r in range(comm.size) if r % k == comm.rank % k]
        intra.Free(), inter.Free()


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_two_level_allreduce_within_its_bound(name, dtype, op):
    for k in layouts():
        comm = nodes_comm(k)
        x64 = data(comm, 300_001, 7)
        x = x64.astype(dtype)
        mpicomp.reset_stats()
        with config(min_bytes=0, eager_bytes=0):
            y = mpicomp.allreduce(x, comm=comm, codec=name, op=op)
        exact, bound = two_level_bound(mpicomp.codec(name), comm, k, x.astype(np.float64), op == "avg", dtype)
        err = np.abs(y.astype(np.float64) - exact)
        assert np.all(err <= bound), (k, name, float((err / bound).max()))
        ys = comm.allgather(y)
        assert all(np.array_equal(ys[0], v) for v in ys)
        algos = mpicomp.stats()["allreduce"]["algorithms"]
        assert algos == {"two_level": 1} or (name == "none" and dtype == "float32" and algos == {"two_level": 1}), algos


def test_in_place_and_tiles_of_any_length():
    for k in layouts():
        comm = nodes_comm(k)
        with config(min_bytes=0, eager_bytes=0, segment_bytes=4096):
            for n in (1, 33, 4097, 50_001):
                x = data(comm, n, n).astype(np.float32)
                want = mpicomp.allreduce(x, comm=comm, codec="int8")
                mpicomp.allreduce(x, comm=comm, codec="int8", out=x)
                assert np.array_equal(x, want)


def expected_algorithm(comm, k, name, dtype):
    """Compressed reduce_scatter and allgather go two-level on nodes of equal size; uncompressed
    float32 to MPI's own (16-bit floats, which MPI cannot sum, take the stages)."""
    if name == "none" and dtype == "float32":
        return "mpi"
    return "two_level" if comm.size % k == 0 else "flat"


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_two_level_reduce_scatter_within_its_bound(name, dtype, op):
    """Each rank's block of the sum: the node sums it exactly, the ranks of its index on the
    other nodes send their node's sum once, compressed (the allreduce's bound, which has
    one encoding more, holds)."""
    for k in layouts():
        comm = nodes_comm(k)
        n = 40_001
        x64 = data(comm, n * comm.size, 8)
        x = x64.astype(dtype)
        mpicomp.reset_stats()
        with config(min_bytes=0, eager_bytes=0, segment_bytes=32768):
            y = mpicomp.reduce_scatter(x, comm=comm, codec=name, op=op)
        # Flat on unequal nodes: every rank encodes its own input, a node of one.
        level = k if expected_algorithm(comm, k, name, dtype) == "two_level" else 1
        # Each block is cut into codec blocks from its own start: the bound of every rank's block
        # (a collective: all ranks compute all of them).
        exact, bound = [two_level_bound(mpicomp.codec(name), comm, level, b.astype(np.float64), op == "avg", dtype)
                        for b in np.split(x, comm.size)][comm.rank]
        err = np.abs(y.astype(np.float64) - exact)
        assert np.all(err <= bound), (k, name, float((err / bound).max()))
        assert mpicomp.stats()["reduce_scatter"]["algorithms"] == {expected_algorithm(comm, k, name, dtype): 1}


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_two_level_allgather_is_the_flat_one(name, dtype):
    """Each rank encodes its own block in the same segments either way, so the two-level
    result is the flat one bit for bit, on every rank (exact codecs: the blocks themselves)."""
    for k in layouts():
        comm = nodes_comm(k)
        x = data(comm, 30_011, 10).astype(dtype)
        got = {}
        for h in ("auto", "flat"):
            mpicomp.reset_stats()
            with config(min_bytes=0, eager_bytes=0, segment_bytes=16384, hierarchy=h):
                got[h] = mpicomp.allgather(x, comm=comm, codec=name).tobytes()
            # Uncompressed blocks of any dtype: MPI's own allgather.
            want = "mpi" if name == "none" else expected_algorithm(comm, k, name, dtype) if h == "auto" else "flat"
            assert mpicomp.stats()["allgather"]["algorithms"] == {want: 1}
        assert got["auto"] == got["flat"], (k, name)
        if name in ("none", "lossless") or (name == "fp16" and dtype == "float16"):
            assert got["auto"] == b"".join(b.tobytes() for b in comm.allgather(x))
        assert len(set(comm.allgather(got["auto"]))) == 1


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter"])
@pytest.mark.parametrize("name", ["int4", "sign"])
def test_error_feedback_converges_in_two_levels(coll, name):
    """With feedback the mean over calls approaches the exact mean (relative L2 error), also
    over several tiles, each rank keeping the residual of the part it compresses."""
    for k in layouts():
        comm = nodes_comm(k)
        if coll == "reduce_scatter" and comm.size % k:
            continue  # runs flat: tests/mpi covers that
        x = data(comm, (4400 if coll == "allreduce" else comm.size * 4400), 11).astype(np.float32)
        exact = sum64(comm, x) / comm.size
        if coll == "reduce_scatter":
            exact = np.split(exact, comm.size)[comm.rank]
        call = getattr(mpicomp, coll)

        def rel(y):
            return np.linalg.norm(y - exact) / np.linalg.norm(exact)

        late = {}
        for h in ("auto", "flat"):
            ef = mpicomp.ErrorFeedback()
            with config(min_bytes=0, eager_bytes=0, segment_bytes=1024, hierarchy=h):
                results = [call(x, comm=comm, codec=name, op="avg", error_feedback=ef) for _ in range(60)]
                single = rel(call(x, comm=comm, codec=name, op="avg"))
            early, late[h] = rel(np.mean(results[:6], axis=0)), rel(np.mean(results, axis=0))
            assert late[h] < single / 3 and late[h] < early / 2, (k, h, single, early, late)
        assert late["auto"] <= 1.2 * late["flat"], (k, late)


@pytest.mark.parametrize("name", ["int8", "int4", "sign"])
def test_two_level_error_no_larger_than_flat(name):
    for k in layouts():
        comm = nodes_comm(k)
        x = data(comm, 1 << 18, 5).astype(np.float32)
        exact = sum64(comm, x)
        rms = {}
        for h in ("auto", "flat"):
            with config(hierarchy=h):
                y = mpicomp.allreduce(x, comm=comm, codec=name)
            rms[h] = np.sqrt(np.mean((y - exact) ** 2))
        assert rms["auto"] <= rms["flat"] * 1.05, (k, rms)


def test_ranks_that_disagree_on_the_layout_raise_everywhere():
    if WORLD.size < 2:
        pytest.skip("needs 2 ranks")
    with config(ranks_per_node=1 if WORLD.rank == 0 else 2):
        c = WORLD.Dup()
        with pytest.raises(mpicomp.ShapeMismatchError, match="ranks_per_node"):
            mpicomp.allreduce(np.ones(1 << 16, np.float32), comm=c, codec="int8")
    # Nothing was cached: agreeing ranks make the layout on the same communicator next.
    with config(ranks_per_node=2):
        y = mpicomp.allreduce(np.ones(1 << 16, np.float32), comm=c, codec="int8")
    assert np.all(y == WORLD.size)
    assert mpicomp.node_layout(c).ranks_per_node == 2


def test_ranks_that_disagree_on_the_hierarchy_raise_everywhere():
    if WORLD.size < 2:
        pytest.skip("needs 2 ranks")
    c = nodes_comm(2)
    with config(hierarchy="flat" if WORLD.rank == 0 else "auto"):
        with pytest.raises(mpicomp.ShapeMismatchError, match="hierarchy flat"):
            mpicomp.allreduce(np.ones(1 << 16, np.float32), comm=c, codec="int8")
    assert np.all(mpicomp.allreduce(np.ones(1 << 16, np.float32), comm=c, codec="int8") == WORLD.size)


def test_float64_and_uncompressed_stay_exact_on_nodes():
    for k in layouts():
        comm = nodes_comm(k)
        x = data(comm, 100_000, 9)
        assert np.array_equal(mpicomp.allreduce(x, comm=comm, codec="none"), sum64(comm, x))
        x32 = x.astype(np.float32)
        with config(min_bytes=0, eager_bytes=0):
            y = mpicomp.allreduce(x32, comm=comm, codec="none")
        # float32 sums in the fixed two-level order: within float32 rounding of the exact sum.
        assert np.all(np.abs(y - sum64(comm, x32)) <= (comm.size + 1) * 2.0**-24 * sum64(comm, np.abs(x32)))


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter"])
def test_float64_lossless_sums_in_float64_on_nodes(coll):
    """float64 with a lossless codec through the two levels: the node's exact sums and the
    frames between nodes in float64, so within float64 rounding of the exact sum (float32 node
    sums, as the lossy codecs take, would be 2**29 times further off)."""
    for k in layouts():
        comm = nodes_comm(k)
        with config(min_bytes=0):
            x = data(comm, 6 * 20_000, 10)
            y = getattr(mpicomp, coll)(x, comm=comm, codec="lossless")
        exact, magnitude = sum64(comm, x), sum64(comm, np.abs(x))
        if coll == "reduce_scatter":
            exact, magnitude = (v.reshape(comm.size, -1)[comm.rank] for v in (exact, magnitude))
        bound = 2 * (comm.size - 1) * 2.0**-53 * magnitude  # p terms in any order, as the reference's
        assert y.dtype == np.float64 and np.all(np.abs(y - exact) <= bound)


@pytest.mark.parametrize("min_bytes", [0, 1 << 40])  # compressed; uncompressed where the sums keep it
@pytest.mark.parametrize("spec", ["bound:abs=2e-3", "bound:rel=1e-4"])
@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
def test_bound_holds_on_nodes(coll, spec, min_bytes):
    """Codec bound through the two levels: its bound is split over the encodings between
    nodes only (the node sums exactly, in float64), and holds on every element."""
    for k in layouts():
        comm = nodes_comm(k)
        x = data(comm, 6 * 20_000, 11).astype(np.float32)
        for op in ("sum", "avg") if coll != "allgather" else ("sum",):
            with config(min_bytes=min_bytes):
                mpicomp.reset_stats()
                y = getattr(mpicomp, coll)(x, comm=comm, codec=spec, **({} if coll == "allgather" else {"op": op}))
                assert "two_level" in mpicomp.stats()[coll]["algorithms"] or coll != "allreduce"
            x64 = x.astype(np.float64)
            if coll == "allgather":
                exact = np.concatenate(comm.allgather(x64))
            else:
                exact = sum64(comm, x64) / (comm.size if op == "avg" else 1)
                if coll == "reduce_scatter":
                    exact = exact.reshape(comm.size, -1)[comm.rank]
            c = mpicomp.codec(spec)
            bound = c.options.get("abs") or c.options["rel"] * comm.allreduce(np.abs(exact).max(), op=MPI.MAX)
            err = np.abs(y.astype(np.float64) - exact).max()
            assert err <= bound, (k, op, err, bound)


@pytest.mark.waits
@pytest.mark.parametrize("codec", ["int8", "none", "bound:rel=1e-3"])  # float32 "none" is two-level too on these nodes
def test_a_stalled_rank_makes_the_others_raise(codec):
    """config.timeout_s on the two-level path: the ranks waiting for one that never arrives
    raise CommTimeoutError on every layout, none hangs; a fresh communicator then works."""
    if WORLD.size < 3:
        pytest.skip("needs 3 ranks for nodes of several ranks")
    x = np.ones(1 << 17, np.float32)
    for k in layouts():
        comm = nodes_comm(k)
        with config(timeout_s=1.0, min_bytes=0, eager_bytes=0):
            mpicomp.reset_stats()
            mpicomp.allreduce(x, comm=comm, codec=codec)  # set-up: MPI's blocking Comm_dup
            assert mpicomp.stats()["allreduce"]["algorithms"] == {"two_level": 1}
            if comm.rank != comm.size - 1:  # the last rank stalls
                t0 = time.perf_counter()
                with pytest.raises(mpicomp.CommTimeoutError, match="timeout_s"):
                    mpicomp.allreduce(x, comm=comm, codec=codec)
                assert time.perf_counter() - t0 < 11
                with pytest.raises(mpicomp.CommTimeoutError, match="earlier call"):
                    mpicomp.allreduce(x, comm=comm, codec=codec)
            wait_asleep(WORLD)
            fresh = nodes_comm(k)
            assert np.all(np.abs(mpicomp.allreduce(x, comm=fresh, codec=codec) - comm.size) <= 1e-3 * comm.size)


@pytest.mark.waits
@pytest.mark.parametrize("coll", ["reduce_scatter", "allgather"])
def test_a_stalled_rank_makes_the_others_raise_in_two_level_reduce_scatter_and_allgather(coll):
    """As above, on the two-level reduce_scatter and allgather (nodes of equal size)."""
    fn = getattr(mpicomp, coll)
    for k in layouts():
        if WORLD.size % k or WORLD.size == k:
            continue
        comm = nodes_comm(k)
        x = np.ones(comm.size * (1 << 15), np.float32)
        with config(timeout_s=1.0, min_bytes=0, eager_bytes=0):
            mpicomp.reset_stats()
            fn(x, comm=comm, codec="int8")  # set-up: MPI's blocking Comm_dup
            assert mpicomp.stats()[coll]["algorithms"] == {"two_level": 1}
            if comm.rank != comm.size - 1:  # the last rank stalls
                t0 = time.perf_counter()
                with pytest.raises(mpicomp.CommTimeoutError, match="timeout_s"):
                    fn(x, comm=comm, codec="int8")
                assert time.perf_counter() - t0 < 11
            wait_asleep(WORLD)
