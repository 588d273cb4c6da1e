"""Codec "auto" in one process: its spec, and its decisions against models whose link and codec
speeds are given, so that the right answer is known in closed form."""
import numpy as np
import pytest

import mpicomp
from mpicomp import _core

SIZES = [float(1024 << (2 * k)) for k in range(7)]  # 1 KiB .. 4 MiB, as the probe measures


def model(link_gbit, codec_gbit, ratio=4.0, latency=20e-6, codec_latency=15e-6, sizes=SIZES):
    """Times of a 2-rank allreduce: uncompressed, every byte over the link once; compressed,
    1/ratio of them, plus the codec's passes over the data and its own fixed cost."""
    link, codec = link_gbit * 1e9 / 8, codec_gbit * 1e9 / 8
    plain = [latency + b / link for b in sizes]
    packed = [latency + codec_latency + b / (ratio * link) + b / codec for b in sizes]
    return sizes, plain, packed


def evaluate(m, at):
    """(break-even, decisions) of a model of one hierarchy."""
    return _core.auto_evaluate(*m, at)[:2]


def test_a_link_faster_than_the_codec_never_compresses():
    # 200 Gbit/s InfiniBand against a 30 GB/s codec: slower than the wire at every size.
    m = model(200, 240)
    at = [2.0**k for k in range(8, 31)]
    break_even, decisions = evaluate(m, at)
    assert break_even == float("inf")
    assert set(decisions) == {"auto_link"}


@pytest.mark.parametrize("link_gbit", [1, 10])
def test_a_slow_link_compresses_from_the_break_even_size(link_gbit):
    # Uncompressed: t = L + b/link; compressed: t = L + C + b/(4 link) + b/codec. They cross at
    # b* = C / (1/link - 1/(4 link) - 1/codec).
    link, codec = link_gbit * 1e9 / 8, 80e9 / 8
    expected = 15e-6 / (1 / link - 1 / (4 * link) - 1 / codec)
    m = model(link_gbit, 80)
    break_even, decisions = evaluate(m, [expected / 1.05, expected * 1.05, 64 * 2.0**20, 2.0**30])
    assert break_even == pytest.approx(expected, rel=1e-9)
    assert decisions == ["auto_small", "compress", "compress", "compress"]


def test_a_codec_that_wins_only_in_between_stops_compressing_above():
    # Wins at 64 KiB and 256 KiB (the cache holds its buffers), loses from 1 MiB on: above, the
    # link is faster than the codec, whatever the size.
    sizes, plain, _ = model(10, 80)
    packed = [t * (0.8 if 2**16 <= b <= 2**18 else 1.2) for b, t in zip(sizes, plain)]
    _, decisions = evaluate((sizes, plain, packed), [2.0**12, 2.0**17, 2.0**22, 2.0**26])
    assert decisions == ["auto_small", "compress", "auto_link", "auto_link"]


def test_between_and_beyond_the_sizes_measured_the_model_is_linear():
    sizes, plain, packed = [1e3, 1e6], [1.0, 3.0], [2.0, 2.5]
    # plain - packed: -1 at 1e3, +0.5 at 1e6, so zero at two thirds of the way; beyond, the
    # gap grows along the last slope.
    break_even, decisions = evaluate((sizes, plain, packed), [1e2, 6e5, 7e5, 1e9])
    assert break_even == pytest.approx(1e3 + (1e6 - 1e3) * 2 / 3)
    assert decisions == ["auto_small", "auto_small", "compress", "compress"]


def test_on_nodes_each_way_takes_its_faster_hierarchy_and_compression_is_judged_by_it():
    # Nodes of 8 ranks on a 10 Gbit/s link. Uncompressed, two levels send 1/8 of the bytes
    # between nodes but add two stages inside them; flat (MPI's own) is faster below where
    # those cross. Compressed (4x), two levels are a little faster at every size.
    link, inside = 10e9 / 8, 50e9 / 8
    curves = {"plain_flat": lambda b: 10e-6 + b / link,
              "plain": lambda b: 60e-6 + b / (8 * link) + 2 * b / inside,
              "packed": lambda b: 80e-6 + b / (32 * link) + 2 * b / inside,
              "packed_flat": lambda b: 100e-6 + b / (32 * link) + 2 * b / inside}
    t = {k: [f(b) for b in SIZES] for k, f in curves.items()}
    at = [1024.0, 65536.0, 200e3, 4.0 * 2**20]
    break_even, decisions, flat = _core.auto_evaluate(SIZES, t["plain"], t["packed"], at, t["plain_flat"],
                                                      t["packed_flat"])
    assert decisions == ["auto_small", "auto_small", "auto_small", "compress"]
    assert flat == [True, True, False, False]
    # The reference: the first size where the faster compressed path beats the faster
    # uncompressed one, from the formulas (the model is exact between its points: all affine).
    grid = np.linspace(1024, 4 * 2**20, 400_001)
    wins = np.minimum(curves["packed"](grid), curves["packed_flat"](grid)) < np.minimum(
        curves["plain"](grid), curves["plain_flat"](grid))
    assert break_even == pytest.approx(grid[np.argmax(wins)], abs=grid[1] - grid[0])
    with pytest.raises(mpicomp.ShapeMismatchError, match="every curve"):
        _core.auto_evaluate(SIZES, t["plain"], t["packed"], at, t["plain_flat"][:-1])


def test_auto_specs():
    assert mpicomp.codec("auto").spec == "auto" and mpicomp.codec("auto").inner == mpicomp.codec("int8")
    c = mpicomp.codec("auto:int4:block=128")
    assert c.spec == "auto:int4:block=128" and c.options == {"codec": "int4:block=128"}
    assert c == mpicomp.codec("auto", codec="int4:block=128") and c.adaptive and c.block == 128
    assert c.encoded_bytes(1000) == mpicomp.codec("int4:block=128").encoded_bytes(1000)
    x = np.linspace(-1, 1, 512, dtype=np.float32)
    assert np.array_equal(c.decode(c.encode(x), x.size), mpicomp.codec("int4:block=128").decode(
        mpicomp.codec("int4:block=128").encode(x), x.size))
    assert mpicomp.codec(" auto : lz4 ").spec == "auto:lz4"


@pytest.mark.parametrize("spec,match", [("auto:powersgd", "allreduce algorithm"), ("auto:auto", "host wire codec"),
                                        ("auto:int9", "unknown codec"), ("auto:int8:block=7", "block")])
def test_auto_refuses_what_it_cannot_use(spec, match):
    with pytest.raises(mpicomp.CodecError, match=match):
        mpicomp.codec(spec)


def test_auto_option_and_memory_errors():
    with pytest.raises(mpicomp.CodecError, match="one option, codec"):
        mpicomp.codec("auto", block=128)
    with pytest.raises(mpicomp.CodecError, match="float64"):
        mpicomp.codec("auto").check_dtype("float64")
    with pytest.raises(mpicomp.BackendError, match="host buffers"):
        mpicomp.codec("auto").check_memory(True)


def test_send_and_recv_refuse_auto():
    with pytest.raises(mpicomp.CodecError, match="applies to collectives"):
        mpicomp.send(np.ones(4, np.float32), 0, codec="auto")
