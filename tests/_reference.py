"""Independent numpy references for the tests: the wire format of format.h decoded and
encoded with plain numpy, and tolerance helpers. Nothing here calls mpicomp."""

import numpy as np

SCALE_BYTES = 4
# The fixed-rate codecs of format.h, whose layout this module describes: the tests' codecs
# wherever an exact size, a per-element bound or the same bytes on every engine is checked.
CODECS = ["none", "fp16", "bf16", "int8", "int4", "sign"]


def payload_bytes(name, n):
    return {"int8": n, "int4": (n + 1) // 2, "sign": (n + 7) // 8}[name]


def encoded_size(name, block, n, itemsize=4):
    """Size in bytes of n elements encoded, from the documented layout."""
    if name == "none":
        return n * itemsize
    if name in ("fp16", "bf16"):
        return 2 * n
    full, rem = divmod(n, block)
    size = full * (SCALE_BYTES + payload_bytes(name, block))
    return size + (SCALE_BYTES + payload_bytes(name, rem) if rem else 0)


def records(name, block, data, n):
    """Yields (first, len, scale float32, payload uint8 array) for every record of a blockwise codec."""
    data = np.asarray(data, np.uint8)
    pos = 0
    for first in range(0, n, block):
        ln = min(block, n - first)
        scale = data[pos:pos + SCALE_BYTES].view("<f4")[0]
        pb = payload_bytes(name, ln)
        yield first, ln, scale, data[pos + SCALE_BYTES:pos + SCALE_BYTES + pb]
        pos += SCALE_BYTES + pb
    assert pos == data.size, "trailing bytes after the last record"


def quantised(name, block, data, n):
    """The integer codes (int8, int4) or sign bits (sign: 1 = negative) of every element."""
    q = np.empty(n, np.int64)
    for first, ln, _, p in records(name, block, data, n):
        if name == "int8":
            q[first:first + ln] = p.view(np.int8)
        elif name == "int4":
            lo = (p & 0xF).astype(np.int64)
            hi = (p >> 4).astype(np.int64)
            nib = np.empty(2 * p.size, np.int64)
            nib[0::2], nib[1::2] = lo, hi
            nib = np.where(nib >= 8, nib - 16, nib)
            q[first:first + ln] = nib[:ln]
        else:
            bits = np.unpackbits(p, bitorder="little")
            q[first:first + ln] = bits[:ln]
    return q


def decode(name, block, data, n):
    """float32 decode of encoded bytes, from the documented wire format only."""
    data = np.asarray(data, np.uint8)
    if name == "none":
        return data.view(np.float32)[:n].copy()
    if name == "fp16":
        return data.view("<f2").astype(np.float32)
    if name == "bf16":
        return (data.view("<u2").astype(np.uint32) << 16).view(np.float32)
    out = np.empty(n, np.float32)
    q = quantised(name, block, data, n)
    for first, ln, scale, _ in records(name, block, data, n):
        part = q[first:first + ln]
        if name == "sign":
            out[first:first + ln] = np.where(part == 1, -scale, scale)
        else:
            out[first:first + ln] = part.astype(np.float32) * np.float32(scale)
    return out


def block_ids(n, block):
    return np.arange(n) // block


def nonfinite_blocks(x, block):
    """Boolean per element: its block holds a NaN or an Inf."""
    bad = ~np.isfinite(np.asarray(x, np.float64))
    ids = block_ids(bad.size, block)
    per_block = np.zeros(ids[-1] + 1 if bad.size else 0, bool)
    np.logical_or.at(per_block, ids, bad)
    return per_block[ids]


def f16_rounding(y):
    """Largest error of storing float64 values y as float16 (round to nearest)."""
    return np.maximum(np.abs(y) * 2.0**-11, 2.0**-25)


def bf16_rounding(y):
    return np.maximum(np.abs(y) * 2.0**-8, 2.0**-133)


def f32_rounding(y):
    return np.maximum(np.abs(y) * 2.0**-24, 2.0**-150)


def output_rounding(dtype_name, y):
    """Largest error of storing the float64 values y as dtype (a float dtype name)."""
    y = np.abs(np.asarray(y, np.float64))
    return {"float16": f16_rounding, "bfloat16": bf16_rounding, "float32": f32_rounding,
            "float64": f32_rounding}[dtype_name](y)  # float64 output goes through float32 too
