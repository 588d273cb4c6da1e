"""Edge values through one encode/decode, against float64 references: tiny, subnormal and
near-overflow blocks keep their signs, stay finite and within the documented bound; float64,
foreign byte orders, partially overlapping buffers and bad codec options are refused with a
typed error instead of a wrong number (issue 23)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import mpicomp
from mpicomp.errors import ArgumentError, CodecError

torch = pytest.importorskip("torch")
LOSSY_BLOCK = ["int8", "int4", "sign"]
FLOAT_MAX = float(np.finfo(np.float32).max)


def roundtrip(name, x):
    c = mpicomp.codec(name)
    return c, c.decode(c.encode(x), x.size)


def assert_faithful(c, x, y):
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    assert np.all(np.isfinite(y)), "finite input decoded to inf or NaN"
    assert not np.any(np.sign(x64) * np.sign(y64) < 0), "a value changed sign"
    assert np.all(np.abs(y64 - x64) <= c.tolerance(x64))


@pytest.mark.parametrize("name", LOSSY_BLOCK)
@pytest.mark.parametrize("magnitude", [1e-45, 1e-42, 1e-39, 2.37e-38, 1e-37, 1e-30, 1e-20])
def test_tiny_and_subnormal_blocks_keep_sign_and_bound(name, magnitude):
    # absmax below ~3.7e-37 made 127 / absmax overflow and positive values quantise to -127.
    x = (np.random.default_rng(3).standard_normal(4096) * magnitude).astype(np.float32)
    assert np.count_nonzero(x) > 1000
    c, y = roundtrip(name, x)
    assert_faithful(c, x, y)


def test_osu_memset_pattern_roundtrips():
    # osu_allreduce fills its buffers with memset(buf, 1, n): every float is 2.37e-38.
    x = np.frombuffer(b"\x01" * 4 * 1024, np.float32)
    for name in LOSSY_BLOCK:
        c, y = roundtrip(name, x)
        assert_faithful(c, x, y)
        assert np.all(y > 0)


def _units(name, payload, n):
    """The quantised values of one record's payload, as the wire format stores them."""
    if name == "int8":
        return payload.view(np.int8)[:n].astype(np.float32)
    if name == "int4":
        lo = (payload.astype(np.int8) << 4).astype(np.int8) >> 4
        hi = payload.astype(np.int8) >> 4
        return np.stack([lo, hi], axis=1).reshape(-1)[:n].astype(np.float32)
    return np.where(np.unpackbits(payload, bitorder="little")[:n], np.float32(-1), np.float32(1))


@pytest.mark.parametrize("name", LOSSY_BLOCK)
@pytest.mark.parametrize("magnitude", [1e-45, 1e-41, 2.37e-38, 1e-36, 1e-3])
def test_decode_is_the_float32_product_bit_for_bit(name, magnitude):
    """Each decoded element is unit * scale rounded to float32, numpy's own float32 product,
    also where the scale is subnormal and the decoder multiplies in double (a subnormal
    float32 product costs Intel cores a microcode assist per element)."""
    x = (np.random.default_rng(5).standard_normal(1024) * magnitude).astype(np.float32)
    c = mpicomp.codec(name)
    wire = c.encode(x)
    per = len(wire) // (x.size // c.block)  # one record: its scale, then its payload
    expected = []
    for k in range(x.size // c.block):
        rec = wire[k * per:(k + 1) * per]
        scale = rec[:4].view(np.float32)[0]
        expected.append(_units(name, rec[4:], c.block) * scale)  # float32 x float32: one rounding
    assert np.array_equal(c.decode(wire, x.size).view(np.uint32), np.concatenate(expected).view(np.uint32))


@pytest.mark.parametrize("name", LOSSY_BLOCK + ["fp16", "bf16"])
def test_huge_blocks_stay_finite(name):
    rng = np.random.default_rng(4)
    x = (rng.uniform(1e37, FLOAT_MAX, 4096) * rng.choice([-1.0, 1.0], 4096)).astype(np.float32)
    x[:256] = FLOAT_MAX  # one block all at the largest float
    c, y = roundtrip(name, x)
    if name == "fp16":  # outside float16's range by definition: documented to become Inf
        assert np.all(np.isinf(y))
        return
    assert_faithful(c, x, y)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(LOSSY_BLOCK), st.integers(-149, 127), st.integers(1, 700), st.integers(0, 2**32 - 1))
def test_any_finite_block_keeps_sign_and_bound(name, exponent, n, seed):
    """Blocks of one magnitude 2**exponent, subnormal to near overflow, of any length."""
    rng = np.random.default_rng(seed)
    x = (rng.uniform(-2.0, 2.0, n) * 2.0**exponent).clip(-FLOAT_MAX, FLOAT_MAX).astype(np.float32)
    c, y = roundtrip(name, x)
    assert_faithful(c, x, y)


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "int4", "sign", "lz4"])
def test_float64_is_refused_where_it_would_be_rounded(name):
    x = np.full(1024, 1e300)
    x[:2] = [1 + 1e-12, 1e-310]
    c = mpicomp.codec(name)
    if c.exact:  # lossless frames move float64 exactly, and its reductions sum in float64
        assert np.array_equal(c.decode(c.encode(x), x.size, dtype="float64"), x)
        assert np.array_equal(mpicomp.allgather(x, comm=MPI.COMM_SELF, codec=name), x)
        assert np.array_equal(mpicomp.allreduce(x, comm=MPI.COMM_SELF, codec=name), x)
        assert torch.equal(mpicomp.allreduce(torch.from_numpy(x), comm=MPI.COMM_SELF, codec=name), torch.from_numpy(x))
        return
    with pytest.raises(CodecError, match="float64"):
        c.encode(x)
    with pytest.raises(CodecError, match="float64.*codec='none' or a lossless codec"):
        mpicomp.allreduce(x, comm=MPI.COMM_SELF, codec=name)
    with pytest.raises(CodecError, match="float64"):
        mpicomp.allreduce(torch.from_numpy(x), comm=MPI.COMM_SELF, codec=name)


def test_float64_default_codec_is_exact():
    x = np.array([1e300, 1 + 1e-12, -2.5, 1e-310])
    assert np.array_equal(mpicomp.allreduce(x, comm=MPI.COMM_SELF), x)
    t = torch.from_numpy(x.copy())
    assert torch.equal(mpicomp.allreduce(t, comm=MPI.COMM_SELF), t)


@pytest.mark.parametrize("codec", ["none", "int8"])
def test_foreign_byte_order_is_refused(codec):
    x = np.ones(4096, dtype=np.dtype("float32").newbyteorder("S"))
    with pytest.raises(ArgumentError, match="byte order"):
        mpicomp.allreduce(x, comm=MPI.COMM_SELF, codec=codec)


@pytest.mark.parametrize("make", [np.arange, lambda n, dtype: torch.arange(n, dtype=getattr(torch, dtype))])
def test_partial_overlap_is_refused_and_in_place_works(make):
    x = make(4097, dtype="float32")
    with pytest.raises(ArgumentError, match="overlaps"):
        mpicomp.allreduce(x[1:], comm=MPI.COMM_SELF, codec="int8", out=x[:-1])
    with pytest.raises(ArgumentError, match="overlaps"):
        mpicomp.allgather(x[:2048], comm=MPI.COMM_SELF, codec="none", out=x[1024:3072])
    as64 = (lambda a: a.numpy().astype(np.float64)) if torch.is_tensor(x) else (lambda a: a.astype(np.float64))
    before = as64(x[:4096])
    y = mpicomp.allreduce(x[:4096], comm=MPI.COMM_SELF, codec="none", out=x[:4096])  # in place
    assert np.array_equal(as64(y), before)


def test_codec_options_are_read_only():
    c = mpicomp.codec("int8")
    with pytest.raises(TypeError):
        c.options["block"] = 0
    assert mpicomp.codec("int8").block == 256  # the cached codec is unharmed


@pytest.mark.parametrize("count", [-1, 2**63, 1.5, "8"])
def test_decode_with_a_bad_count_names_it(count):
    c = mpicomp.codec("int8")
    with pytest.raises(ArgumentError, match="count"):
        c.decode(c.encode(np.ones(256, np.float32)), count)
