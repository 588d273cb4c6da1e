"""Codec blosc (C-Blosc2 in lossless.h's frames) on the host: exact round trips for every
compressor and filter (every dtype and size: test_lossless.py); real compression of dense floating-point data where LZ4 on raw
bytes finds none; damaged frames rejected; its options checked. Collectives: tests/mpi/
test_lossless.py."""
import numpy as np
import pytest
import torch

import mpicomp
from test_lossless import gradient_like

CNAMES = ["blosclz", "lz4", "lz4hc", "zlib", "zstd"]
FILTERS = ["none", "shuffle", "bitshuffle"]


@pytest.mark.parametrize("cname", CNAMES)
@pytest.mark.parametrize("filt", FILTERS)
def test_every_compressor_and_filter_round_trips(cname, filt):
    c = mpicomp.codec("blosc", cname=cname, filter=filt, clevel=5)
    x = gradient_like(200_001)
    frame = c.encode(x)
    assert frame.size < x.nbytes / 2  # 80% of the rows are zero
    assert c.decode(frame, x.size).tobytes() == x.tobytes()


def bf16_gradient(n, seed=0):
    """Normal values as bfloat16 (their bits viewed as float16, the bytes being what count)."""
    g = torch.from_numpy(np.random.default_rng(seed).standard_normal(n).astype(np.float32) * 1e-3)
    return g.to(torch.bfloat16).view(torch.int16).numpy().view(np.float16)


def test_dense_data_compresses_where_lz4_does_not():
    """Dense values share their exponents' high bits: the shuffle gathers them, zstd packs
    them. LZ4 on the raw bytes finds no repeats (bench/lossless_ratios.py: 1.54x on a
    transformer's bfloat16 gradients)."""
    x = bf16_gradient(1 << 20)
    lossless, lz4 = mpicomp.codec("lossless"), mpicomp.codec("lz4")
    ratio = x.nbytes / lossless.encode(x).size
    assert ratio > 1.25, ratio
    assert x.nbytes / lz4.encode(x).size < 1.01
    assert lossless.decode(lossless.encode(x), x.size, "float16").tobytes() == x.tobytes()


def test_typesize_follows_the_dtype():
    """The same bytes shuffled as 2-byte and as 4-byte elements: the dtype's size is the one
    that regroups the exponents (the float16 view of bfloat16 data compresses better)."""
    x = bf16_gradient(1 << 18)
    c = mpicomp.codec("blosc")
    as16, as32 = c.encode(x).size, c.encode(x.view(np.float32)).size
    assert as16 < as32


@pytest.mark.parametrize("damage", ["header", "sizes", "truncate"])
def test_damaged_frames_raise_codec_error(damage):
    """Damage to a frame's structure. (Neither Blosc2 chunks nor LZ4 blocks carry a checksum
    of their contents: flipped payload bits may decode to other numbers. MPI's transports
    check what they carry: TCP's checksum, InfiniBand's CRC.)"""
    c = mpicomp.codec("lossless")
    x = gradient_like(100_000)
    frame = c.encode(x).copy()
    first = 16  # the frame header: one 4-byte word per 64 KiB chunk, padded to 16 bytes
    if damage == "header":
        frame[first:first + 16] = 0xFF  # the first Blosc2 chunk's own header
    elif damage == "sizes":
        frame[first + 4:first + 8] ^= 0x10  # its uncompressed size: not the chunk's
    else:
        frame = frame[: frame.size // 2 // 16 * 16]
    with pytest.raises(mpicomp.CodecError):
        c.decode(frame, x.size)


def test_every_cut_of_a_frame_raises():
    x = gradient_like(150_000)
    c = mpicomp.codec("lossless")
    frame = c.encode(x)
    for cut in range(0, frame.size, 16):
        with pytest.raises(mpicomp.CodecError):
            c.decode(frame[:cut], x.size)


def test_options_and_names():
    assert mpicomp.codec("lossless").options == {"cname": "zstd", "filter": "shuffle", "clevel": 1}
    c = mpicomp.codec("blosc:cname=lz4,filter=shuffle,clevel=9")
    assert c.spec == "blosc:clevel=9,cname=lz4" and c.exact  # the default filter left out
    assert {"blosc", "lossless"} <= set(mpicomp.available_codecs())
    for spec, needle in (("blosc:cname=snappy", "cname must be one of blosclz, lz4, lz4hc, zlib, zstd"),
                         ("blosc:filter=delta", "filter must be one of none, shuffle, bitshuffle"),
                         ("blosc:clevel=10", r"clevel must be an integer in \[0, 9\]"),
                         ("lossless:block=256", "no option 'block'")):
        with pytest.raises(mpicomp.CodecError, match=needle):
            mpicomp.codec(spec)
    with pytest.raises(mpicomp.BackendError, match="host arrays only"):
        mpicomp.codec("lossless").check_memory(True)
