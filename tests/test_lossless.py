"""The lossless frames (format.h) on the host: exact round trips, real compression where the
data repeats, chunks stored as they are where it does not, LZ4 blocks that the lz4 library
(an independent implementation) decodes and writes, and corrupt frames rejected."""
import lz4.block
import numpy as np
import pytest
import torch

import mpicomp

CHUNK = 65536


def gradient_like(n, dtype=np.float32, seed=0):
    """Mostly-zero rows among dense ones, as embedding and padded-batch gradients are."""
    rng = np.random.default_rng(seed)
    x = np.zeros(n, np.float64)
    rows = rng.random(n // 256 + 1) < 0.2
    dense = np.repeat(rows, 256)[:n]
    x[dense] = rng.standard_normal(int(dense.sum()))
    return x.astype(dtype)


def frame_words(frame, raw):
    m = -(-raw // CHUNK)
    return np.frombuffer(frame[: 4 * m].tobytes(), "<u4"), -(-4 * m // 16) * 16


def chunks(frame, raw):
    """(stored bytes, stored as is, length) of every chunk of a frame."""
    words, pos = frame_words(frame, raw)
    out = []
    for i, w in enumerate(words):
        size, as_is = int(w & 0x7FFFFFFF), bool(w >> 31)
        out.append((frame[pos:pos + size].tobytes(), as_is, min(CHUNK, raw - i * CHUNK)))
        pos += -(-size // 16) * 16
    assert pos == frame.size
    return out


@pytest.mark.parametrize("codec", ["lz4", "lossless"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
@pytest.mark.parametrize("n", [0, 1, 13, CHUNK // 4 - 1, CHUNK // 4, CHUNK // 4 + 1, 300_001])
@pytest.mark.parametrize("kind", ["noise", "zeros", "sparse"])
def test_roundtrip_is_exact(codec, dtype, n, kind):
    c = mpicomp.codec(codec)
    x = {"noise": lambda: np.random.default_rng(n).standard_normal(n).astype(dtype),
         "zeros": lambda: np.zeros(n, dtype), "sparse": lambda: gradient_like(n, dtype, n)}[kind]()
    frame = c.encode(x)
    assert frame.size % 16 == 0 and frame.size <= c.encoded_bytes(n, x.dtype)
    y = c.decode(frame, n, x.dtype)
    assert y.tobytes() == x.tobytes()


@pytest.mark.parametrize("codec", ["lz4", "lossless"])
def test_float64_frames_accumulate_in_float64(codec):
    """What a reduction does with a received float64 frame: base + its values in float64, so
    a 1e-13 tail on 1.0 (which float32 drops) and magnitudes beyond float32's range are kept."""
    from mpicomp import _core
    from mpicomp._dtypes import DTYPE_IDS

    c = mpicomp.codec(codec)
    n = 100_003
    x = gradient_like(n, np.float64, 1) * 1e300
    x[::3] = 1e-13
    base = np.ones(n)
    frame = c.encode(x)
    acc = np.full(n, np.nan)
    _core.decode_accumulate(c.id, c.block, DTYPE_IDS["float64"], frame.ctypes.data, n, acc.ctypes.data,
                            base.ctypes.data)
    assert acc.tobytes() == (base + x).tobytes()


def test_bfloat16_roundtrip_is_exact():
    x = torch.from_numpy(gradient_like(100_000)).to(torch.bfloat16)
    raw = x.view(torch.int16).numpy()
    frame = mpicomp.codec("lz4").encode(raw.view(np.uint16).view(np.float16))  # the bytes are what count
    back = mpicomp.codec("lz4").decode(frame, x.numel(), "float16")
    assert back.view(np.int16).tobytes() == raw.tobytes()


def test_compresses_what_repeats_and_stores_noise_as_is():
    c = mpicomp.codec("lz4")
    n = 1 << 20
    assert n * 4 / c.encode(np.zeros(n, np.float32)).size > 200
    sparse = gradient_like(n)
    assert n * 4 / c.encode(sparse).size > 3
    noise = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    frame = c.encode(noise)
    stored = chunks(frame, noise.nbytes)
    assert all(as_is and len(b) == length for b, as_is, length in stored)  # nothing to gain: as is
    assert frame.size == c.encoded_bytes(n)


def test_chunks_are_lz4_blocks_the_lz4_library_reads():
    x = gradient_like(200_000)
    frame = mpicomp.codec("lz4").encode(x)
    raw = x.tobytes()
    compressed = 0
    for i, (block, as_is, length) in enumerate(chunks(frame, len(raw))):
        want = raw[i * CHUNK:i * CHUNK + length]
        if as_is:
            assert block == want
        else:
            compressed += 1
            assert lz4.block.decompress(block, uncompressed_size=length) == want
    assert compressed > 0


def test_decodes_frames_of_lz4_library_blocks():
    """A frame assembled in Python around blocks the lz4 library compressed (its own match
    finder, long matches, overlapping copies) decodes to the input."""
    rng = np.random.default_rng(2)
    raw = (bytes(5000) + rng.integers(0, 4, 3000, np.uint8).tobytes() + b"abc" * 20000
           + rng.bytes(CHUNK) + bytes(CHUNK + 100))[: 3 * CHUNK + 12]
    header, body = [], b""
    for i in range(0, len(raw), CHUNK):
        piece = raw[i:i + CHUNK]
        block = lz4.block.compress(piece, store_size=False, mode="high_compression")
        word, stored = (len(block), block) if len(block) < len(piece) else (len(piece) | 1 << 31, piece)
        header.append(word)
        body += stored + bytes(-len(stored) % 16)
    head = np.array(header, "<u4").tobytes()
    frame = np.frombuffer(head + bytes(-len(head) % 16) + body, np.uint8)
    y = mpicomp.codec("lz4").decode(frame, len(raw) // 4, "float32")
    assert y.tobytes() == raw


@pytest.mark.parametrize("damage", ["size", "flag", "payload", "truncate"])
def test_corrupt_frames_raise_codec_error(damage):
    c = mpicomp.codec("lz4")
    x = gradient_like(50_000)
    frame = c.encode(x).copy()
    if damage == "size":
        frame[:4] = np.frombuffer(np.array([10**6], "<u4").tobytes(), np.uint8)
    elif damage == "flag":
        frame[3] |= 0x80  # claims "as is" with a compressed chunk's size
    elif damage == "payload":
        frame[16:80] = 0xFF  # literal lengths running far past the block
    else:
        frame = frame[: frame.size // 2 // 16 * 16]
    with pytest.raises(mpicomp.CodecError):
        c.decode(frame, x.size)


@pytest.mark.parametrize("kind", ["sparse", "noise", "mixed"])
def test_every_cut_of_a_frame_raises(kind):
    """Cut anywhere (every 16-byte boundary; other lengths are never frames), a frame raises
    CodecError: none decodes to zeros past the cut."""
    rng = np.random.default_rng(5)
    x = {"sparse": gradient_like(200_000), "noise": rng.standard_normal(70_000).astype(np.float32),
         "mixed": np.concatenate([np.zeros(40_000, np.float32), rng.standard_normal(40_000).astype(np.float32)])}[kind]
    c = mpicomp.codec("lz4")
    frame = c.encode(x)
    assert np.array_equal(c.decode(frame, x.size), x)
    for cut in range(0, frame.size, 16):
        with pytest.raises(mpicomp.CodecError):
            c.decode(frame[:cut], x.size)


def test_nvcomp_names_only_where_nvcomp_is():
    names = mpicomp.available_codecs()
    assert "lz4" in names
    if not mpicomp.codecs.nvcomp_loaded():
        assert not any(n.startswith("nvcomp-") for n in names)
        with pytest.raises(mpicomp.CodecError, match="nvCOMP"):
            mpicomp.codec("nvcomp-ans")


@pytest.fixture
def threads():
    before = mpicomp.config.codec_threads
    yield lambda n: setattr(mpicomp.config, "codec_threads", n)
    mpicomp.config.codec_threads = before


@pytest.mark.parametrize("name", ["lz4", "lossless", "blosc:cname=lz4,filter=bitshuffle"])
def test_chunks_on_threads_give_the_frame_of_one_thread(threads, name):
    """A frame's chunks are compressed and decoded side by side (config.codec_threads): the
    same bytes as on one thread, compressed and as-is chunks mixed, a short last chunk."""
    c = mpicomp.codec(name)
    rng = np.random.default_rng(8)
    x = np.concatenate([gradient_like(9 * CHUNK // 4), rng.integers(0, 2**32, 5 * CHUNK // 4, np.uint32).view(np.float32),
                        gradient_like(3 * CHUNK // 4 + 123, seed=1)])
    frames = []
    for t in (1, 2, 3):
        threads(t)
        frames.append(c.encode(x))
        np.testing.assert_array_equal(c.decode(frames[-1], x.size).view(np.uint32), x.view(np.uint32))
    assert frames[0].tobytes() == frames[1].tobytes() == frames[2].tobytes()
    stored = [as_is for _, as_is, _ in chunks(frames[0], x.nbytes)]
    assert any(stored) and not all(stored)


def test_threads_report_the_first_corrupt_chunk(threads):
    c = mpicomp.codec("lossless")
    x = gradient_like(12 * CHUNK // 4)
    frame = c.encode(x)
    words, pos = frame_words(frame, x.nbytes)
    starts = []
    for w in words:
        starts.append(pos)
        pos += -(-int(w & 0x7FFFFFFF) // 16) * 16
    for k in (9, 4):  # corrupt two chunks' payloads: the error names the first
        frame[starts[k] + 20: starts[k] + 40] ^= 0x5A
    for t in (1, 3):
        threads(t)
        with pytest.raises(mpicomp.CodecError, match="chunk 4 of 12"):
            c.decode(frame, x.size)
