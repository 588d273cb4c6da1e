"""What the benchmarks send: float32 data of a chosen kind, and the ratio a codec achieves on it."""
import numpy as np

KINDS = ("normal", "sparse", "relu", "smooth", "random", "osu", "subnormal")
DTYPES = ("float32", "float16", "bfloat16", "float64")


def make(kind, n, seed):
    """n float32 values. normal: standard normal noise (no codec's best case: LZ4 gains
    nothing on it, Blosc2's shuffle about 1.17x from the exponents). sparse: rows of 256 that
    are zero with probability 0.8, else normal, as the gradient of a token embedding is (rows
    of tokens not in the batch are zero). relu: normal noise through a ReLU, as activations
    are (half of them zero, the rest dense). smooth: a smooth 3-D field (sums of sines over a
    grid of 128 x 128 planes, largest magnitude about 5; each seed shifts the phases), as a
    simulation's fields are, where an error-bounded codec (bound) beats a fixed rate: ZCCL's
    and SZ's case (issue 38). random: random bytes, which nothing compresses
    (the 1/256 of them that would be Inf or NaN get a finite exponent, so that sums stay
    finite). osu:
    what the OSU micro-benchmarks send (memset(buf, 1, size): every float 2.37e-38).
    subnormal: normal noise times 1e-42. The last two show that a codec's speed does not
    depend on the values (subnormal arithmetic is tens of times slower on some CPUs)."""
    if kind == "osu":
        return np.frombuffer(b"\x01" * (4 * n), np.float32).copy()
    rng = np.random.default_rng(seed)
    if kind == "smooth":
        i = np.arange(n, dtype=np.float64)
        a, b, c = i // 16384 + rng.uniform(0, 50), (i // 128) % 128, i % 128
        return (1.7 * (np.sin(a / 20) + np.cos(b / 15) * np.sin(c / 10) + np.cos((a + c) / 30))).astype(np.float32)
    if kind == "random":
        bits = rng.integers(0, 2**32, n, dtype=np.uint32)
        bits[(bits & 0x7F800000) == 0x7F800000] ^= 0x40000000
        return bits.view(np.float32)
    x = rng.standard_normal(n).astype(np.float32)
    if kind == "sparse":
        x[np.repeat(rng.random(n // 256 + 1) < 0.8, 256)[:n]] = 0
    elif kind == "relu":
        np.maximum(x, 0, out=x)
    elif kind == "subnormal":
        x *= np.float32(1e-42)
    return x


def typed(x, dtype):
    """(the array mpicomp is given, a numpy array of its bytes) for float32 data x as dtype:
    bfloat16 is a torch tensor (numpy has no bfloat16), its bytes seen as float16."""
    if dtype == "float32":
        return x, x
    if dtype in ("float16", "float64"):
        x = x.astype(dtype)
        return x, x
    import torch

    t = torch.from_numpy(x).to(torch.bfloat16)
    return t, t.view(torch.int16).numpy().view(np.float16)


def as_float64(x):
    """x (numpy array or torch tensor) as a float64 numpy array."""
    return x.double().numpy() if hasattr(x, "double") else x.astype(np.float64)


def ratio(c, x, dtype="float32"):
    """Input bytes / bytes one encoding of x puts on the wire (measured for lossless codecs,
    which see bytes only: x is the numpy array of the data's bytes, and for bound)."""
    return x.nbytes / (c.encode(x).size if c.framed else c.encoded_bytes(x.size, dtype))
