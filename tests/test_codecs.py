"""Every codec against a numpy float64 reference, on every SIMD target this CPU has."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import mpicomp
from mpicomp import _core

from _reference import CODECS

TARGETS = _core.cpu_targets()


@pytest.fixture(params=TARGETS)
def target(request):
    before = _core.cpu_target()
    assert _core.set_cpu_target(request.param)
    yield request.param
    _core.set_cpu_target(before)


def data(n, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    # magnitudes that vary from block to block, as gradients do
    scale = np.repeat(10.0 ** rng.uniform(-3, 3, size=n // 64 + 1), 64)[:n]
    return (rng.standard_normal(n) * scale).astype(dtype)


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("n", [1, 7, 255, 256, 257, 65537, 1_000_003])
def test_roundtrip_within_stated_bound(target, name, n):
    c = mpicomp.codec(name)
    x = data(n)
    enc = c.encode(x)
    assert enc.size == c.encoded_bytes(n)
    y = c.decode(enc, n)
    err = np.abs(y.astype(np.float64) - x)
    assert np.all(err <= c.tolerance(x)), (name, n, err.max())


@pytest.mark.parametrize("name", ["int8", "int4", "sign"])
@pytest.mark.parametrize("block", [32, 128, 256, 4096])
def test_block_option(name, block):
    c = mpicomp.codec(name, block=block)
    assert c == mpicomp.codec(f"{name}:block={block}")
    x = data(3 * block + 5)
    y = c.decode(c.encode(x), x.size)
    assert np.all(np.abs(y - x) <= c.tolerance(x))
    records = -(-x.size // block)
    payload = {"int8": x.size, "int4": 3 * block // 2 + 3, "sign": 3 * block // 8 + 1}[name]
    assert c.encoded_bytes(x.size) == 4 * records + payload


@pytest.mark.parametrize("name", CODECS)
def test_float16_input(name):
    c = mpicomp.codec(name)
    x = data(5000, np.float64).clip(-6e4, 6e4).astype(np.float16)
    y = c.decode(c.encode(x), x.size, dtype="float16")
    assert y.dtype == np.float16
    x64 = x.astype(np.float64)
    rounding = np.abs(x64) * 2.0**-11 + 6e-8
    assert np.all(np.abs(y.astype(np.float64) - x64) <= c.tolerance(x64) * (1 + 1e-3) + rounding)


def test_int8_is_exact_on_representable_data(target):
    # absmax 127 * 2^-3 in every block: the step is 2^-3, so k * 2^-3 (|k| <= 127) is exact.
    k = np.random.default_rng(1).integers(-127, 128, size=4096)
    k[::256] = 127
    x = (k * 0.125).astype(np.float32)
    c = mpicomp.codec("int8")
    np.testing.assert_array_equal(c.decode(c.encode(x), x.size), x)


@pytest.mark.parametrize("name,levels", [("int8", 127), ("int4", 7)])
def test_half_steps_stay_within_the_stated_bound(target, name, levels):
    """Values within float32 rounding of a half quantisation step, in blocks of random absmax:
    where rounding tips them onto the farther level, the error passes half a step by a few
    ulps, which the stated bound covers (the smallest absmax/254 once missed 1 in 4 million)."""
    rng = np.random.default_rng(7)
    blocks = 2048
    am = (10.0 ** rng.uniform(-3, 3, blocks)).astype(np.float32)
    k = rng.integers(-levels, levels, size=(blocks, 256))
    x = (k + 0.5) * am[:, None].astype(np.float64) / levels
    x = np.nextafter(x.astype(np.float32), rng.choice([-np.inf, np.inf], size=x.shape).astype(np.float32))
    x[:, 0] = am
    c = mpicomp.codec(name)
    x = x.ravel()
    err = np.abs(c.decode(c.encode(x), x.size).astype(np.float64) - x)
    half = np.repeat(am.astype(np.float64), 256) / (2 * levels)
    assert np.mean(err > half) > 0.01  # the test reaches past half a step
    assert np.all(err <= c.tolerance(x.astype(np.float64)))


def test_int4_and_sign_exact_cases():
    x = (np.tile(np.arange(-7, 8), 20)[:256] * 0.5).astype(np.float32)
    x[0] = 3.5  # absmax 3.5 -> step 0.5
    c = mpicomp.codec("int4")
    np.testing.assert_array_equal(c.decode(c.encode(x), x.size), x)
    s = np.where(np.arange(512) % 3 == 0, -2.0, 2.0).astype(np.float32)  # all |x| = 2: exact
    np.testing.assert_array_equal(mpicomp.codec("sign").decode(mpicomp.codec("sign").encode(s), 512), s)


def _all_f16_bits():
    return np.arange(1 << 16, dtype=np.uint16)


def test_fp16_matches_numpy_bit_for_bit(target):
    c = mpicomp.codec("fp16")
    # every float16 value through float32 and back, and float32 values near every rounding tie
    h = _all_f16_bits().view(np.float16)
    f = h.astype(np.float32)
    ties = (np.nextafter(f[np.isfinite(f)], np.float32(np.inf)) + f[np.isfinite(f)]) / 2
    rng = np.random.default_rng(2).standard_normal(200_000).astype(np.float32) * 1e3
    for x in (f, ties.astype(np.float32), rng, np.array([7e4, -7e4, 65519, 65520, 1e-8, -3e-6], np.float32)):
        got = c.encode(x).view(np.uint16)
        with np.errstate(over="ignore"):
            want = x.astype(np.float16).view(np.uint16)
        finite = np.isfinite(x)
        np.testing.assert_array_equal(got[finite], want[finite])
        assert np.all(np.isnan(got[~np.isfinite(x) & np.isnan(x)].view(np.float16)))
    back = c.decode(h.view(np.uint8), h.size)
    np.testing.assert_array_equal(back[np.isfinite(f)], f[np.isfinite(f)])


def test_bf16_matches_torch_bit_for_bit(target):
    c = mpicomp.codec("bf16")
    rng = np.random.default_rng(3)
    x = np.concatenate([(rng.standard_normal(100_000) * 10.0 ** rng.integers(-30, 30, 100_000)).astype(np.float32),
                        np.array([1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.4e38, -3.4e38, 1e-40, np.inf, -np.inf], np.float32)])
    got = c.encode(x).view(np.int16)
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().copy()
    # Except where torch rounds a finite value up to Inf (+-3.4e38): mpicomp keeps the largest
    # finite bfloat16 (finite input never decodes to Inf).
    overflowed = np.isfinite(x) & ((want & 0x7fff) == 0x7f80)
    assert overflowed.sum() == 2
    want[overflowed] = (want[overflowed] & np.int16(-0x8000)) | 0x7f7f
    np.testing.assert_array_equal(got, want)
    back = c.decode(c.encode(x), x.size)
    np.testing.assert_array_equal(back, torch.from_numpy(want).view(torch.bfloat16).float().numpy())


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "int4", "sign"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_poisons_its_block_only(target, name, bad):
    c = mpicomp.codec(name)
    x = data(1024)
    x[300] = bad  # block 1 of 4 (256 elements each)
    y = c.decode(c.encode(x), x.size)
    assert not np.isfinite(y[300])
    if c.block:  # the whole block, and nothing else
        assert not np.isfinite(y[256:512]).any()
        assert np.isfinite(np.delete(y, np.s_[256:512])).all()
    else:
        assert np.isfinite(np.delete(y, 300)).all()


def same_on_every_target(run):
    """run() (a tuple of arrays) on every SIMD target of this CPU; asserts that every target
    gives the first one's bytes, and returns those."""
    before = _core.cpu_target()
    outs = []
    try:
        for t in TARGETS:
            _core.set_cpu_target(t)
            outs.append(run())
    finally:
        _core.set_cpu_target(before)
    for o in outs[1:]:
        for a, b in zip(outs[0], o):
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    return outs[0]


@pytest.mark.parametrize("name", CODECS)
def test_all_targets_encode_identical_bytes(name):
    c = mpicomp.codec(name, **({"block": 128} if name in ("int8", "int4", "sign") else {}))
    x = data(100_003)
    x[17] = np.nan

    def run():
        enc = c.encode(x)
        res = np.full(x.size, 0.25, np.float32)
        enc_ef = c.encode(x, residual=res)
        return enc, c.decode(enc, x.size), enc_ef, res

    same_on_every_target(run)


@pytest.mark.parametrize("name", CODECS + ["lz4"])
def test_decode_onto_a_base_is_copy_then_accumulate(name):
    """acc = base + decoded (how an allreduce adds the first peer's part onto its own float32
    input, issue 20): on every SIMD target the bits of copying base into acc and accumulating,
    numpy's float32 sum, and base left as it was."""
    c = mpicomp.codec(name)
    n = 100_003
    base = data(n, seed=1)
    base[:4] = [-0.0, 1e-40, -3e38, np.inf]
    enc = c.encode(data(n, seed=2))
    ids = _core.DTYPES["float32"][0]

    def run():
        acc, b, ref = np.full(n, np.nan, np.float32), base.copy(), base.copy()
        _core.decode_accumulate(c.id, c.block, ids, enc.ctypes.data, n, acc.ctypes.data, b.ctypes.data)
        _core.decode_accumulate(c.id, c.block, ids, enc.ctypes.data, n, ref.ctypes.data)
        assert b.tobytes() == base.tobytes()
        return acc, ref

    acc, ref = same_on_every_target(run)
    np.testing.assert_array_equal(acc.view(np.uint32), ref.view(np.uint32))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(acc, base + c.decode(enc, n))


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "int4", "sign"])
@pytest.mark.parametrize("count", [1, 2])
def test_streamed_decode_writes_the_same_floats(threads, name, count):
    """decode(stream=True) (streaming stores around the cache, for large outputs; issue 20)
    writes the bits of a plain decode, at any alignment of the output and on every SIMD target,
    and nothing past its n elements."""
    c = mpicomp.codec(name, **({"block": 96} if name in ("int8", "int4", "sign") else {}))
    n = 3 * 65536 + 4096 + 13
    x = data(n, seed=3)
    x[7] = np.nan
    enc = c.encode(x)
    ids = _core.DTYPES["float32"][0]
    threads(count)

    def run():
        outs = []
        for offset in (0, 1, 3):  # y 16-byte aligned, and 4 and 12 bytes past it
            y = np.full(n + 8, -7.0, np.float32)
            _core.decode(c.id, c.block, ids, enc.ctypes.data, n, 0.5, y[offset:].ctypes.data, True)
            assert np.all(y[:offset] == -7.0) and np.all(y[offset + n:] == -7.0)
            outs.append(y[offset:offset + n].copy())
        return tuple(outs)

    outs = same_on_every_target(run)
    plain = np.empty(n, np.float32)
    _core.decode(c.id, c.block, ids, enc.ctypes.data, n, 0.5, plain.ctypes.data)
    for y in outs:
        np.testing.assert_array_equal(y.view(np.uint32), plain.view(np.uint32))


@pytest.mark.parametrize("name", CODECS)
def test_all_targets_agree_on_float16_data(name):
    # float16 in (every bit pattern, then noise) and float16 out take F16C's bulk conversions
    # where the target has them; the bytes must be the scalar target's, and the float16 result
    # the float32 one rounded (numpy), every NaN as the one pattern 0x7e00.
    c = mpicomp.codec(name)
    x = np.concatenate([_all_f16_bits().view(np.float16), data(100_003).astype(np.float16)])

    def run():
        enc = c.encode(x)
        return enc, c.decode(enc, x.size, "float16")

    enc, half = same_on_every_target(run)
    if name == "none":  # exact: every pattern, NaN payloads included
        np.testing.assert_array_equal(half.view(np.uint16), x.view(np.uint16))
        return
    single = c.decode(enc, x.size, "float32")
    nan = np.isnan(single)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(half.view(np.uint16)[~nan], single[~nan].astype(np.float16).view(np.uint16))
    assert np.all(half.view(np.uint16)[nan] == 0x7E00)


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "int4", "sign"])
def test_residual_keeps_what_the_codec_dropped(name):
    c = mpicomp.codec(name)
    x = data(10_000)
    res = data(10_000, seed=5) * np.float32(0.01)
    target = (x + res).astype(np.float32)  # what gets encoded
    enc = c.encode(x, residual=res)
    np.testing.assert_array_equal(enc, c.encode(target))
    np.testing.assert_allclose(res, target - c.decode(enc, x.size), rtol=0, atol=0)


def test_residual_is_zero_in_a_poisoned_block():
    c = mpicomp.codec("int8")
    x = data(1024)
    x[5] = np.inf
    res = np.ones(1024, np.float32)
    c.encode(x, residual=res)
    assert np.all(res[:256] == 0) and np.isfinite(res).all()


def test_ratios():
    assert mpicomp.codec("none").ratio() == 1
    assert mpicomp.codec("fp16").ratio() == 2 and mpicomp.codec("bf16").ratio("float16") == 1
    assert mpicomp.codec("int8").ratio() == pytest.approx(1024 / 260)
    assert mpicomp.codec("int4").ratio() == pytest.approx(1024 / 132)
    assert mpicomp.codec("sign").ratio() == pytest.approx(1024 / 36)
    p = mpicomp.codec("powersgd:rank=8")
    assert p.ratio() == pytest.approx(4096 * 4096 / (8 * 8192))
    assert p.encoded_bytes(0, shape=(100, 300)) == 4 * 8 * 400
    assert p.encoded_bytes(1000) == 4000  # a vector goes whole


@pytest.mark.parametrize("spec,options,needle", [
    ("int9", {}, "unknown codec 'int9'"),
    ("int8", {"bits": 3}, "no option 'bits'"),
    ("int8", {"block": 33}, "got 33"),
    ("int4", {"block": 0}, "got 0"),
    ("sign", {"block": 1 << 20}, "got 1048576"),
    ("fp16", {"block": 64}, "no option 'block'"),
    ("int8:block", {}, "not key=value"),
    (3, {}, "got int"),
    ("powersgd", {"rank": 0}, "rank must be a positive integer"),
    ("powersgd:min_compression_rate=0.5", {}, "min_compression_rate must be a number >= 1"),
    ("powersgd", {"block": 256}, "no option 'block'"),
])
def test_bad_specs(spec, options, needle):
    with pytest.raises(mpicomp.CodecError, match=needle):
        mpicomp.codec(spec, **options)


def test_lossy_codec_rejects_integers():
    with pytest.raises(mpicomp.CodecError, match="int32"):
        mpicomp.codec("int8").encode(np.arange(10, dtype=np.int32))


def test_available_codecs():
    assert set(CODECS) | {"powersgd"} <= set(mpicomp.available_codecs())


def test_powersgd_spec_and_no_single_process_encoding():
    c = mpicomp.codec("powersgd:rank=2,min_compression_rate=1.5")
    assert c.options == {"rank": 2, "min_compression_rate": 1.5} and c.spec == "powersgd:min_compression_rate=1.5,rank=2"
    with pytest.raises(mpicomp.CodecError, match="allreduce algorithm"):
        c.encode(np.ones(4, np.float32))
    with pytest.raises(mpicomp.CodecError, match="no per-element error bound"):
        c.tolerance(np.ones(4))


@pytest.fixture
def threads():
    """Sets config.codec_threads for one test; the setting before it is restored."""
    before = _core.codec_threads()
    yield lambda n: setattr(mpicomp.config, "codec_threads", n)
    mpicomp.config.codec_threads = before


@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "int4", "sign"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_threads_give_the_bytes_of_one_thread(threads, name, dtype):
    """Codec work split over 2 and 3 threads (issue 20): the same bytes, residuals and decoded
    values as one thread, for a count no thread boundary or block divides evenly."""
    n = 3 * 65536 + 1000 + 7
    x = np.random.default_rng(4).standard_normal(n).astype(dtype)
    c = mpicomp.codec(name, **({"block": 64} if name in ("int8", "int4", "sign") else {}))
    ids = _core.DTYPES[dtype][0]
    results = []
    for t in (1, 2, 3):
        threads(t)
        assert mpicomp.config.codec_threads == t
        res = np.random.default_rng(5).standard_normal(n).astype(np.float32) * 0.01
        out = np.empty(c.encoded_bytes(n, dtype), np.uint8)
        _core.encode(c.id, c.block, ids, x.ctypes.data, n, res.ctypes.data, out.ctypes.data)
        y, acc = np.empty(n, dtype), np.ones(n, np.float32)
        _core.decode(c.id, c.block, ids, out.ctypes.data, n, 0.5, y.ctypes.data)
        _core.decode_accumulate(c.id, c.block, ids, out.ctypes.data, n, acc.ctypes.data)
        results.append((out.tobytes(), res.tobytes(), y.tobytes(), acc.tobytes()))
    assert results[0] == results[1] == results[2]


def test_codec_threads_setting(threads):
    threads(0)  # the default: the cores this process may use, per rank on this node
    assert mpicomp.config.codec_threads >= 1
    for bad in (-1, 1025, 1.5, "2"):
        with pytest.raises(mpicomp.ArgumentError, match="codec_threads must be an integer in"):
            mpicomp.config.codec_threads = bad
    assert "codec_threads=" in repr(mpicomp.config)


@pytest.mark.parametrize("env,want", [({"MPICOMP_CODEC_THREADS": "3"}, "3"),
                                      ({"MPI_LOCALNRANKS": str(len(os.sched_getaffinity(0)))}, "1"),
                                      ({"MPICOMP_CODEC_THREADS": "x"}, "invalid setting MPICOMP_CODEC_THREADS=x: expected an integer")])
def test_codec_threads_from_the_environment(env, want):
    """MPICOMP_CODEC_THREADS, and by default the cores divided among the launcher's ranks on
    this node (as many ranks as cores: one thread each)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("MPICOMP_CODEC_THREADS", "MPI_LOCALNRANKS",
                                                               "OMPI_COMM_WORLD_LOCAL_SIZE")}
    r = subprocess.run([sys.executable, "-c", "import mpicomp; print(mpicomp.config.codec_threads)"],
                       capture_output=True, text=True, timeout=120, env={**clean, **env})
    assert want in r.stdout + r.stderr
