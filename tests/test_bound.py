"""Codec bound on its own (one process): its spec, that one encode/decode keeps every finite
element within the bound (hypothesis, every float dtype, magnitudes from tiny to huge), NaN
and Inf passed through, damaged frames refused, and what it compresses."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mpicomp

DTYPES = ["float32", "float64", "float16"]


def test_spec_names_one_bound():
    c = mpicomp.codec("bound:abs=1e-3")
    assert c.options == {"abs": 1e-3, "cname": "lz4"} and c.spec == "bound:abs=0.001"
    assert mpicomp.codec("bound:rel=1e-4,cname=zstd").spec == "bound:cname=zstd,rel=0.0001"
    assert mpicomp.codec("bound", abs=2.5).options["abs"] == 2.5
    assert mpicomp.codec("bound:abs=1e200").options["abs"] == 1e200  # float64's range
    # its frames' size depends on the data, under codec "auto" too (the benchmarks measure it)
    assert mpicomp.codec("bound:abs=1").framed and mpicomp.codec("auto:bound:abs=1").framed
    for bad, why in [("bound", "takes one bound"), ("bound:abs=1e-3,rel=1e-3", "takes one bound"),
                     ("bound:abs=0", "abs must be a number"), ("bound:abs=-1", "abs must be a number"),
                     ("bound:rel=2", "rel must be a number"), ("bound:abs=nan", "abs must be a number"),
                     ("bound:abs=1e-3,cname=zlib", "cname must be one of zstd, lz4"),
                     ("bound:abs=1e-3,block=256", "has no option 'block'")]:
        with pytest.raises(mpicomp.CodecError, match=why):
            mpicomp.codec(bad)


def tolerance(spec, x64):
    """The bound (rel: of the largest finite magnitude), rounding to the dtype included."""
    c = mpicomp.codec(spec)
    finite = np.abs(x64[np.isfinite(x64)])
    return c.options["abs"] if "abs" in c.options else c.options["rel"] * (finite.max() if finite.size else 0)


@settings(max_examples=200, deadline=None)
@given(dtype=st.sampled_from(DTYPES), n=st.sampled_from([1, 7, 16383, 16385, 40_000]),
       exponent=st.integers(-30, 30), rel=st.booleans(), bound_exp=st.integers(-6, 0),
       shape=st.sampled_from(["smooth", "noise", "spikes", "constant"]), seed=st.integers(0, 2**32 - 1),
       cname=st.sampled_from(["lz4", "zstd"]))
def test_one_encoding_keeps_the_bound(dtype, n, exponent, rel, bound_exp, shape, seed, cname):
    if dtype == "float16":
        exponent = min(max(exponent, -4), 4)
    g = np.random.default_rng(seed)
    i = np.arange(n)
    x64 = {"smooth": np.sin(i / 40.0), "noise": g.standard_normal(n),
           "spikes": np.where(g.random(n) < 0.01, 1e3, 1e-3) * g.standard_normal(n),
           "constant": np.full(n, 0.7)}[shape] * 2.0**exponent
    with np.errstate(over="ignore"):  # float16 spikes may overflow to Inf, meant: it passes through
        x = x64.astype(dtype)
    x64 = x.astype(np.float64)
    e = 10.0**bound_exp * (1 if rel else 2.0**exponent)
    spec = f"bound:{'rel' if rel else 'abs'}={e:.3g},cname={cname}"
    c = mpicomp.codec(spec)
    try:
        data = c.encode(x)
    except mpicomp.CodecError as err:  # only a bound rounding to the dtype would use half of
        top = np.abs(x64[np.isfinite(x64)]).max()
        assert "cannot be kept" in str(err) and tolerance(spec, x64) < 4 * top * float(np.finfo(dtype).eps)
        return
    y = c.decode(data, n, dtype).astype(np.float64)
    finite = np.isfinite(x64)
    assert np.array_equal(y[~finite], x64[~finite])
    assert np.all(np.abs(y - x64)[finite] <= tolerance(spec, x64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_nan_and_inf_pass_through(dtype):
    x = np.linspace(-3, 3, 50_000).astype(dtype)
    x[[5, 17_000, 40_000]] = [np.nan, np.inf, -np.inf]
    c = mpicomp.codec("bound:abs=1e-2")
    y = c.decode(c.encode(x), x.size, dtype).astype(np.float64)
    x64 = x.astype(np.float64)
    assert np.isnan(y[5]) and y[17_000] == np.inf and y[40_000] == -np.inf
    finite = np.isfinite(x64)
    assert np.all(np.abs(y[finite] - x64[finite]) <= tolerance("bound:abs=1e-2", x64))


def test_all_zeros_and_empty():
    c = mpicomp.codec("bound:rel=1e-3")
    assert c.decode(c.encode(np.zeros(0, np.float32)), 0).size == 0
    z = np.zeros(70_000, np.float32)
    z[3] = -0.0
    assert np.array_equal(c.decode(c.encode(z), z.size), z)


def test_a_bound_the_codes_cannot_keep_is_refused():
    with pytest.raises(mpicomp.CodecError, match="ask for at least"):
        mpicomp.codec("bound:abs=1e-300").encode(np.array([1e3, 1.0]))


def test_smooth_data_compresses_and_noise_costs_its_entropy():
    n = 1 << 20
    i = np.arange(n)
    smooth = (np.sin(i / 300.0) * 3 + np.cos(i / 41.0)).astype(np.float32)
    noise = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    c = mpicomp.codec("bound:abs=1e-3")
    ratio = {k: v.nbytes / c.encode(v).size for k, v in (("smooth", smooth), ("noise", noise))}
    # noise at 1e-3 of a unit Gaussian: about 10 bits of entropy per value (of 32)
    assert 2.2 < ratio["noise"] < 3.6 and ratio["smooth"] > 1.6 * ratio["noise"], ratio
    # zstd finds more of the redundancy than lz4
    assert mpicomp.codec("bound:abs=1e-3,cname=zstd").encode(smooth).size < 0.95 * c.encode(smooth).size
    # a coarser bound costs fewer bytes
    assert mpicomp.codec("bound:abs=1e-1").encode(noise).size < 0.7 * c.encode(noise).size


@pytest.mark.parametrize("damage", ["step", "width", "codes", "cut"])
def test_damaged_frames_are_refused(damage):
    """Damage to the structure (the head, the codes' frame) is refused; a flipped bit inside
    a chunk of codes is not seen, as with the lossless codecs (no checksum)."""
    c = mpicomp.codec("bound:abs=1e-3")
    x = np.random.default_rng(2).standard_normal(100_000).astype(np.float32)
    data = c.encode(x).copy()
    if damage == "step":
        data[:8] = np.frombuffer(np.float64(-1.0).tobytes(), np.uint8)
    elif damage == "width":
        data[8] = 3
    elif damage == "codes":  # the codes' frame: its first chunk's stored size (the frame's own check)
        data[32:36] = np.frombuffer(np.array([10**6], "<u4").tobytes(), np.uint8)
    else:
        data = data[:len(data) // 2 // 16 * 16]
    with pytest.raises(mpicomp.CodecError, match="corrupt"):
        c.decode(data, x.size)


def test_float64_keeps_bounds_far_outside_float32s_range():
    x = np.random.default_rng(3).standard_normal(10_000) * 1e250
    for spec in ("bound:abs=1e247", "bound:rel=1e-6"):
        c = mpicomp.codec(spec)
        y = c.decode(c.encode(x), x.size, "float64")
        assert np.all(np.abs(y - x) <= tolerance(spec, x))
