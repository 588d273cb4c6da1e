"""What the benchmarks send: float32 data of a chosen kind, and the ratio a codec achieves on it."""
import numpy as np

KINDS = ("normal", "sparse")


def make(kind, n, seed):
    """n float32 values. normal: standard normal noise (no codec's best case: a lossless one
    gains nothing). sparse: rows of 256 that are zero with probability 0.8, else normal, as
    the gradient of a token embedding is (rows of tokens not in the batch are zero)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32)
    if kind == "sparse":
        x[np.repeat(rng.random(n // 256 + 1) < 0.8, 256)[:n]] = 0
    return x


def ratio(c, x):
    """Input bytes / bytes one encoding of x puts on the wire (measured for lossless codecs)."""
    return x.nbytes / (c.encode(x).size if c.exact and c.id else c.encoded_bytes(x.size))
