"""What the benchmarks send: float32 data of a chosen kind, and the ratio a codec achieves on it."""
import numpy as np

KINDS = ("normal", "sparse", "relu", "osu", "subnormal")


def make(kind, n, seed):
    """n float32 values. normal: standard normal noise (no codec's best case: LZ4 gains
    nothing on it, Blosc2's shuffle about 1.17x from the exponents). sparse: rows of 256 that
    are zero with probability 0.8, else normal, as the gradient of a token embedding is (rows
    of tokens not in the batch are zero). relu: normal noise through a ReLU, as activations
    are (half of them zero, the rest dense). osu:
    what the OSU micro-benchmarks send (memset(buf, 1, size): every float 2.37e-38).
    subnormal: normal noise times 1e-42. The last two show that a codec's speed does not
    depend on the values (subnormal arithmetic is tens of times slower on some CPUs)."""
    if kind == "osu":
        return np.frombuffer(b"\x01" * (4 * n), np.float32).copy()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    if kind == "sparse":
        x[np.repeat(rng.random(n // 256 + 1) < 0.8, 256)[:n]] = 0
    elif kind == "relu":
        np.maximum(x, 0, out=x)
    elif kind == "subnormal":
        x *= np.float32(1e-42)
    return x


def ratio(c, x):
    """Input bytes / bytes one encoding of x puts on the wire (measured for lossless codecs)."""
    return x.nbytes / (c.encode(x).size if c.exact and c.id else c.encoded_bytes(x.size))
