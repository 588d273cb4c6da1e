"""Collectives against a float64 reduction of every rank's input, gathered with mpi4py.
Runs in every rank (see tests/test_mpi_launch.py); must pass at any size, 1 included."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

import mpicomp
from mpicomp import _core
from mpicomp._dtypes import DTYPE_IDS

from _mpiutil import CODECS, COMM_KINDS, WORLD, allreduce_bound, check_close, comm_of, config


@pytest.fixture(params=COMM_KINDS)
def comm(request):
    return comm_of(request.param)


def inputs(comm, n, dtype=np.float32, seed=0):
    """This rank's input and every rank's, as float64."""
    def make(r):
        rng = np.random.default_rng(seed * 1000 + r)
        scale = np.repeat(10.0 ** rng.uniform(-2, 2, size=n // 256 + 1), 256)[:n]
        return (rng.standard_normal(n) * scale).astype(dtype)

    return make(comm.rank), [make(r).astype(np.float64) for r in range(comm.size)]


def identical_everywhere(comm, y):
    ys = comm.allgather(np.asarray(y))
    return all(np.array_equal(ys[0], v, equal_nan=True) for v in ys)


@pytest.fixture
def compress_small():
    mpicomp.config.min_bytes = 0  # compress the small arrays of these tests too


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("n", [1, 7, 65537, 1_000_000])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_allreduce(compress_small, name, n, op):
    c = mpicomp.codec(name)
    x, xs = inputs(WORLD, n, seed=n)
    exact = np.sum(xs, axis=0) / (WORLD.size if op == "avg" else 1)
    y = mpicomp.allreduce(x, codec=name, op=op)
    assert y.dtype == x.dtype and y.shape == x.shape
    check_close(y.astype(np.float64), exact, allreduce_bound(WORLD, c, xs[WORLD.rank], True, op == "avg", "float32")[1],
                f"{name} n={n} {op}")
    assert identical_everywhere(WORLD, y)


@pytest.mark.parametrize("name", ["none", "int8", "sign"])
def test_allreduce_on_sub_communicators(comm, compress_small, name):
    c = mpicomp.codec(name)
    x, xs = inputs(comm, 20_001, seed=3)
    exact = np.sum(xs, axis=0)
    y = mpicomp.allreduce(x, comm=comm, codec=name)
    check_close(y.astype(np.float64), exact, allreduce_bound(comm, c, xs[comm.rank], True, False, "float32")[1], name)
    assert identical_everywhere(comm, y)


@pytest.mark.parametrize("dtype,name", [(np.float16, "none"), (np.float16, "bf16"), (np.float16, "int4"),
                                        (np.float64, "none")])
def test_allreduce_numpy_dtypes(compress_small, dtype, name):
    x, xs = inputs(WORLD, 5000, dtype=dtype, seed=4)
    exact = np.sum(xs, axis=0)
    y = mpicomp.allreduce(x, codec=name)
    assert y.dtype == dtype
    bound = allreduce_bound(WORLD, mpicomp.codec(name), xs[WORLD.rank], True, False, np.dtype(dtype).name)[1]
    check_close(y.astype(np.float64), exact, bound, name)


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter"])
def test_float64_is_summed_exactly_or_refused(compress_small, coll):
    """float64 near its range's ends and with tails float32 would drop: codec none (the
    default codec, for float64) and the lossless codecs exact; every lossy codec refused on
    every rank."""
    n = 1024 * WORLD.size
    x = np.full(n, 2.0 ** 993)  # 1.25e299; up to 8 of them add exactly in any order (1e300 / 7 would not)
    x[:3] = [1 + 1e-12, -2.5e-310, 3.0]
    want = np.empty_like(x)
    WORLD.Allreduce(x, want, op=MPI.SUM)  # every rank holds the same x, summed exactly: any order gives these bits
    if coll == "reduce_scatter":
        want = want[WORLD.rank * 1024:(WORLD.rank + 1) * 1024]
    for codec in ("none", None, "lz4", "lossless"):
        y = getattr(mpicomp, coll)(x, codec=codec)
        assert y.dtype == np.float64 and np.array_equal(y, want), codec
    for codec in ("bf16", "int8", "sign"):
        with pytest.raises(mpicomp.CodecError, match="float64"):
            getattr(mpicomp, coll)(x, codec=codec)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["none", "int8", "sign"])
def test_allreduce_torch_tensors(compress_small, dtype, name):
    x, xs = inputs(WORLD, 3 * 4 * 500, seed=5)
    t = torch.from_numpy(x).to(dtype).reshape(3, 4, 500)
    xs = [torch.from_numpy(v.astype(np.float32)).to(dtype).double().numpy() for v in xs]  # what was sent
    exact = np.sum(xs, axis=0)
    y = mpicomp.allreduce(t, codec=name, op="sum")
    assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.shape == t.shape
    bound = allreduce_bound(WORLD, mpicomp.codec(name), xs[WORLD.rank], True, False, str(dtype)[6:])[1]
    check_close(y.double().numpy().ravel(), exact, bound, name)


def test_in_place_shapes_and_empty(compress_small):
    x, xs = inputs(WORLD, 6000, seed=6)
    exact = np.sum(xs, axis=0).reshape(20, 300)
    x2 = x.reshape(20, 300)
    y = mpicomp.allreduce(x2, codec="int8", out=x2)
    assert y is x2
    bound = allreduce_bound(WORLD, mpicomp.codec("int8"), xs[WORLD.rank], True, False, "float32")[1]
    check_close(y.astype(np.float64).ravel(), exact.ravel(), bound, "in place")
    e = mpicomp.allreduce(np.empty((0, 3), np.float32), codec="int4")
    assert e.shape == (0, 3)
    assert mpicomp.reduce_scatter(np.empty(0, np.float32)).size == 0
    assert mpicomp.allgather(np.empty(0, np.float16), codec="fp16").size == 0


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_reduce_scatter(comm, compress_small, name, op):
    c = mpicomp.codec(name)
    k = 3001
    x, xs = inputs(comm, k * comm.size, seed=7)
    mine = slice(comm.rank * k, (comm.rank + 1) * k)
    exact = np.sum([v[mine] for v in xs], axis=0)
    y = mpicomp.reduce_scatter(x, comm=comm, codec=name, op=op)
    assert y.shape == (k,)
    accumulation = np.sum([np.abs(v[mine]) for v in xs], axis=0) * 2.0**-22 * comm.size
    bound = (sum(c.tolerance(v[mine]) for v in xs) if comm.size > 1 else 0) * (1 + 1e-4) + accumulation + 1e-12
    scale = 1 / comm.size if op == "avg" else 1
    assert np.all(np.abs(y - exact * scale) <= bound * scale)


@pytest.mark.parametrize("name", CODECS)
def test_allgather(comm, compress_small, name):
    c = mpicomp.codec(name)
    x, xs = inputs(comm, 2999, seed=8)
    y = mpicomp.allgather(x, comm=comm, codec=name)
    assert y.shape == (2999 * comm.size,)
    want = np.concatenate(xs)
    bound = np.concatenate([c.tolerance(v) for v in xs]) if comm.size > 1 else 0
    assert np.all(np.abs(y - want) <= bound)
    assert identical_everywhere(comm, y)


@pytest.mark.parametrize("name", ["int8", "sign"])
def test_outputs_from_32_mib_are_streamed_with_the_same_bits(name):
    """From 32 MiB of output the decodes write around the cache (streaming stores, issue 20).
    An allreduce gives the bits of the same tiles reduced in two calls too small for that,
    within the codec's bound of the float64 sum; an allgather gives each rank's part decoded
    from its encoding, as one process computes it."""
    c = mpicomp.codec(name)
    tile = WORLD.size * _core.segment_elements(c.id, c.block, DTYPE_IDS["float32"], mpicomp.config.segment_bytes)
    n = ((32 << 20) // 4 // tile + 1) * tile + 777
    x = np.random.default_rng(WORLD.rank).standard_normal(n).astype(np.float32)
    y = mpicomp.allreduce(x, codec=name)
    half = n // tile // 2 * tile
    parts = [mpicomp.allreduce(x[:half].copy(), codec=name), mpicomp.allreduce(x[half:].copy(), codec=name)]
    assert y.tobytes() == np.concatenate(parts).tobytes()
    check_close(y.astype(np.float64), *allreduce_bound(WORLD, c, x.astype(np.float64), True, False, "float32"), name)
    k = n // WORLD.size + 1
    g = mpicomp.allgather(x[:k], codec=name)
    heads = np.empty((WORLD.size, k), np.float32)
    WORLD.Allgather(x[:k], heads)
    mine = [c.decode(c.encode(v), k) for v in heads] if WORLD.size > 1 else [x[:k]]
    assert g.tobytes() == np.concatenate(mine).tobytes()


def test_reduce_scatter_rejects_indivisible_input():
    if WORLD.size == 1:
        pytest.skip("every count divides by 1")
    with pytest.raises(mpicomp.ArgumentError, match="not a multiple"):
        mpicomp.reduce_scatter(np.zeros(WORLD.size + 1, np.float32))


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "int4", "sign"])
def test_non_finite_reaches_every_rank(compress_small, name):
    x = np.ones(4096, np.float32)
    if WORLD.rank == WORLD.size - 1:
        x[1000] = np.nan  # block 3 of 16 (256 elements)
    y = mpicomp.allreduce(x, codec=name)
    assert np.isnan(y[1000])
    if mpicomp.codec(name).block and WORLD.size > 1:
        assert not np.isfinite(y[768:1024]).any()
    assert np.isfinite(np.delete(y, np.s_[768:1024])).all()


@pytest.mark.parametrize("name", ["sign", "int4"])
@pytest.mark.parametrize("segment", [1 << 19, 1024])  # one tile; 9 (int4) or 3 (sign) tiles on 2 ranks
def test_error_feedback_mean_converges(compress_small, name, segment):
    """Each call's error is the codec's; with feedback the mean over calls approaches the
    exact mean (relative L2 error), without it the bias stays. Also when the allreduce goes
    tile by tile (a segment per rank), each tile's residual kept for its own elements."""
    if WORLD.size == 1:
        pytest.skip("nothing is compressed on one rank")
    x, xs = inputs(WORLD, 4096 + 300, seed=9)
    exact = np.mean(xs, axis=0)
    rel = lambda y: np.linalg.norm(y - exact) / np.linalg.norm(exact)
    ef = mpicomp.ErrorFeedback()
    with config(segment_bytes=segment):
        results = [mpicomp.allreduce(x, codec=name, op="avg", error_feedback=ef) for _ in range(60)]
        single = rel(mpicomp.allreduce(x, codec=name, op="avg"))
    early, late = rel(np.mean(results[:6], axis=0)), rel(np.mean(results, axis=0))
    assert late < single / 4 and late < early / 2, (single, early, late)
    plain = rel(np.mean([mpicomp.allreduce(x, codec=name, op="avg") for _ in range(5)], axis=0))
    assert plain > 3 * late


def test_error_feedback_is_one_per_stream():
    ef = mpicomp.ErrorFeedback()
    mpicomp.allreduce(np.ones(100, np.float32), codec="int8", error_feedback=ef)
    with pytest.raises(mpicomp.ArgumentError, match="one ErrorFeedback per tensor"):
        mpicomp.allreduce(np.ones(101, np.float32), codec="int8", error_feedback=ef)


def test_iallreduce_overlaps_and_matches_allreduce(compress_small):
    x, _ = inputs(WORLD, 300_000, seed=10)
    want = mpicomp.allreduce(x, codec="int8")
    req = mpicomp.iallreduce(x, codec="int8")
    busy = sum(float(np.sum(np.sqrt(np.abs(x[:10000])))) for _ in range(20))  # compute meanwhile
    got = req.wait()
    assert busy > 0 and req.test()
    np.testing.assert_array_equal(got, want)
    reqs = [mpicomp.iallreduce(x * (i + 1), codec="none") for i in range(3)]
    for i, r in enumerate(reqs):
        np.testing.assert_allclose(r.wait(), (x * (i + 1)).astype(np.float64) * 0 + r.wait(), rtol=0)
        assert identical_everywhere(WORLD, r.wait())


@pytest.mark.parametrize("codec", ["none", "int8"])
def test_ireduce_scatter_and_iallgather_equal_their_blocking_forms(compress_small, codec):
    """Started together (they run in order on the worker), each gives the blocking form's
    bytes, into out= or a new array, numpy and torch alike."""
    torch = pytest.importorskip("torch")
    p = WORLD.Get_size()
    x, _ = inputs(WORLD, 30_000 * p, seed=11)
    part = x[:30_000].copy()
    want_rs = mpicomp.reduce_scatter(x, codec=codec, op="avg")
    want_ag = mpicomp.allgather(part, codec=codec)
    out = torch.empty(30_000 * p)
    reqs = [mpicomp.ireduce_scatter(x, codec=codec, op="avg"), mpicomp.iallgather(part, codec=codec),
            mpicomp.iallgather(torch.from_numpy(part), codec=codec, out=out)]
    rs, ag, ag_torch = (r.wait() for r in reqs)
    np.testing.assert_array_equal(rs, want_rs)
    np.testing.assert_array_equal(ag, want_ag)
    assert ag_torch is out
    np.testing.assert_array_equal(out.numpy(), want_ag)
    with pytest.raises(mpicomp.ArgumentError, match="op"):  # checked at the start, every rank alike
        mpicomp.ireduce_scatter(x, codec=codec, op="max")


def test_integers_exact_with_none_only():
    x = np.arange(1000, dtype=np.int64) * (WORLD.rank + 1)
    y = mpicomp.allreduce(x, codec="none")
    np.testing.assert_array_equal(y, np.arange(1000) * sum(range(1, WORLD.size + 1)))
    with pytest.raises(mpicomp.CodecError, match="floating-point"):
        mpicomp.allreduce(x, codec="int8")
    with pytest.raises(mpicomp.ArgumentError, match="avg"):
        mpicomp.allreduce(x, codec="none", op="avg")


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
def test_the_named_codec_is_applied_on_one_node_unless_skip_local(coll):
    """Every rank here shares one machine. By default the codec named is the codec applied
    (a lossy result, counted as compressed); with config.skip_local the collectives send
    uncompressed, exactly as codec "none", and the statistics say why."""
    x = np.random.default_rng(WORLD.rank).standard_normal(WORLD.size * 5000).astype(np.float32)
    fn = getattr(mpicomp, coll)
    mpicomp.config.min_bytes = 0
    exact = fn(x, comm=WORLD, codec="none")
    mpicomp.reset_stats()
    lossy = fn(x, comm=WORLD, codec="int4")
    assert WORLD.size == 1 or not np.array_equal(lossy, exact)
    s = mpicomp.stats()[coll]
    assert (s["calls"], s["compressed"]) == (1, 1 if WORLD.size > 1 else 0), s
    mpicomp.config.skip_local = 1
    assert np.array_equal(fn(x, comm=WORLD, codec="int4"), exact)
    s = mpicomp.stats()[coll]
    assert s["calls"] == 2 and s["skipped"] == ({"local": 1} if WORLD.size > 1 else {"one_rank": 2}), s


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.int8])
@pytest.mark.parametrize("n", [1, 1792, 1793, 8192, 8193, 300_001])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("kind", ["world", "a node per rank"])
def test_allreduce_inside_the_agreement(kind, dtype, n, in_place):
    """Uncompressed allreduces that travel with the agreement step (on two ranks at every size,
    on more up to eager_bytes): the first 7 KiB (between nodes, up to 32 KiB whole) inside
    its message, the rest as a second one straight from the buffer. Exact for integers,
    float32/64 rounding otherwise."""
    comm = comm_of(kind)
    rng = np.random.default_rng(n + comm.rank)
    if np.issubdtype(dtype, np.integer):
        top = 127 // comm.size  # the int8 sum must not wrap
        x = rng.integers(-top, top, size=n).astype(dtype)
    else:
        x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 3, size=n)).astype(dtype)
    xs = [v.astype(np.float64) for v in comm.allgather(x)]
    exact = np.sum(xs, axis=0)
    y = mpicomp.allreduce(x, comm=comm, codec="none", out=x if in_place else None)
    assert y.dtype == dtype and (y is x) == in_place
    if np.issubdtype(dtype, np.integer):
        assert np.array_equal(y.astype(np.float64), exact)
    else:
        eps = np.finfo(dtype).eps
        assert np.all(np.abs(y - exact) <= np.sum(np.abs(xs), axis=0) * eps * comm.size)
    assert identical_everywhere(comm, y)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int8])
@pytest.mark.parametrize("n", [1, 1000, 100_000])
def test_uncompressed_allgather_moves_bytes_exactly(dtype, n):
    """codec none: random bytes (NaN payloads, -0.0, subnormals among them) arrive as sent,
    inside the agreement step (small; on two ranks any size) or through MPI's allgather."""
    bits = np.random.default_rng(n + WORLD.rank).integers(0, 256, n * np.dtype(dtype).itemsize, dtype=np.uint8)
    y = mpicomp.allgather(bits.view(dtype), codec="none")
    assert y.dtype == dtype and y.shape == (n * WORLD.size,)
    assert np.array_equal(y.view(np.uint8), np.concatenate(WORLD.allgather(bits)))


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int32])
@pytest.mark.parametrize("k", [1, 700, 50_000])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_uncompressed_reduce_scatter_dtypes(dtype, k, op):
    """codec none, inside the agreement step (small, and on two ranks any size of a type MPI
    sums) and through MPI's reduce-scatter, against a float64 reduction; integers exactly."""
    if op == "avg" and dtype == np.int32:
        pytest.skip("avg is for floating-point data")
    rng = np.random.default_rng(k + WORLD.rank)
    x = rng.integers(-50, 50, k * WORLD.size).astype(dtype) if dtype == np.int32 else \
        rng.standard_normal(k * WORLD.size).astype(dtype)
    mine = slice(WORLD.rank * k, (WORLD.rank + 1) * k)
    exact = np.sum([v.astype(np.float64)[mine] for v in WORLD.allgather(x)], axis=0)
    if op == "avg":
        exact /= WORLD.size
    y = mpicomp.reduce_scatter(x, codec="none", op=op)
    assert y.dtype == dtype and y.shape == (k,)
    if dtype == np.int32:
        assert np.array_equal(y, exact)
    else:  # float32 accumulation of 16-bit input, one rounding to the output dtype
        tol = np.abs(exact) * (2.0**-10 if dtype == np.float16 else 2.0**-50) + 2.0**-20 * WORLD.size * 8
        assert np.all(np.abs(y.astype(np.float64) - exact) <= tol)


def test_default_codec_is_int8_for_floats_and_exact_for_integers():
    x = np.random.default_rng(WORLD.rank).standard_normal(1 << 15).astype(np.float32)
    assert np.array_equal(mpicomp.allreduce(x), mpicomp.allreduce(x, codec="int8"))
    t = torch.from_numpy(x)
    assert torch.equal(mpicomp.allreduce(t), mpicomp.allreduce(t, codec="int8"))
    i = np.arange(1 << 15, dtype=np.int32) * (WORLD.rank + 1)
    assert np.array_equal(mpicomp.allreduce(i), np.arange(1 << 15) * sum(range(1, WORLD.size + 1)))
    assert torch.equal(mpicomp.allgather(torch.from_numpy(i)), torch.from_numpy(np.concatenate(WORLD.allgather(i))))


def test_mpi_sum_is_a_sum_and_other_mpi_ops_are_named_in_the_error():
    x = np.random.default_rng(WORLD.rank).standard_normal(1 << 15).astype(np.float32)
    assert np.array_equal(mpicomp.allreduce(x, codec="int8", op=MPI.SUM), mpicomp.allreduce(x, codec="int8"))
    assert np.array_equal(mpicomp.reduce_scatter(np.tile(x, WORLD.size), codec="none", op=MPI.SUM),
                          mpicomp.reduce_scatter(np.tile(x, WORLD.size), codec="none", op="sum"))
    with pytest.raises(mpicomp.ArgumentError, match=r"got MPI.MAX.*comm.Allreduce\(x, y, op=MPI.MAX\)"):
        mpicomp.allreduce(x, op=MPI.MAX)
    with pytest.raises(mpicomp.ArgumentError, match="'sum', 'avg' or MPI.SUM, got 'max'"):
        mpicomp.allreduce(x, op="max")
    assert np.array_equal(mpicomp.allreduce(x, codec="int8"), mpicomp.allreduce(x, codec="int8"))  # still usable


@pytest.mark.parametrize("codec", ["fp16", "int8", "int4", "sign"])
def test_codec_threads_change_nothing_but_speed(codec):
    """The same allreduce and error feedback with the codec work on 1 and 2 threads per rank
    (config.codec_threads, issue 20): bit-identical results and residuals."""
    comm = comm_of("world")
    x = np.random.default_rng(comm.Get_rank()).standard_normal(400_003).astype(np.float32)
    before = mpicomp.config.codec_threads
    got = []
    try:
        for t in (1, 2):
            mpicomp.config.codec_threads = t
            ef = mpicomp.ErrorFeedback()
            y = [mpicomp.allreduce(x, comm=comm, codec=codec, error_feedback=ef) for _ in range(2)]
            got.append((y[0].tobytes(), y[1].tobytes(), ef.residual.tobytes()))
    finally:
        mpicomp.config.codec_threads = before
    assert got[0] == got[1]
