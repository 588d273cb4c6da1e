"""PowerSGD: low-rank compression of an allreduce of matrices (Vogels, Karimireddy and Jaggi,
"PowerSGD: Practical Low-Rank Gradient Compression for Distributed Optimization", NeurIPS
2019, arXiv 1905.13514, Algorithm 2).

Rank i holds M_i (n x m; an n-D tensor is viewed as shape[0] x the rest, as torch's
powerSGD_hook does). With error feedback e_i and the previous call's Q (m x r) as warm start:

    1. M_i <- M_i + e_i                            error feedback
    2. P <- sum_i M_i Q                            allreduce of n x r numbers, not n x m
    3. P <- orthonormal columns of P               reduced QR, identical on every rank
    4. Q <- sum_i M_i^T P                          allreduce of m x r numbers
    5. result <- P Q^T  (/ size for op "avg")      = P P^T sum_i M_i, the same on every rank
    6. e_i <- M_i - P P^T M_i                      what rank i's own matrix lost; Q kept

The residuals add up to exactly what the result lost (sum_i e_i = sum_i M_i - P Q^T), so
nothing is lost for good. Computed in float32 (float64 input too). Without an ErrorFeedback
each call starts from the same pseudo-random Q: a biased compressor, fine for a one-off
reduction, not for training. Vectors, scalars and matrices too small to gain
(r (n + m) min_compression_rate > n m) go through the uncompressed allreduce, exactly.

Non-finite input: P or Q holds a NaN or Inf on every rank, and the whole result is NaN; the
error feedback and warm start stay as they were before the call.
"""
import numpy as np

__all__ = ["allreduce", "compresses"]


def _lib(x):
    if isinstance(x, np.ndarray):
        return _Numpy
    return _Torch


class _Numpy:
    @staticmethod
    def work(x):
        return x.astype(np.float32, copy=True)

    @staticmethod
    def random(shape, like, seed):
        return np.random.default_rng(seed).standard_normal(shape).astype(like.dtype)

    @staticmethod
    def orthonormal(p):
        return np.linalg.qr(p)[0]

    @staticmethod
    def finite(a):
        return bool(np.isfinite(a).all())

    @staticmethod
    def out(result, x, out):
        if out is None:
            return result.astype(x.dtype).reshape(x.shape)
        out.reshape(-1)[...] = result.reshape(-1)
        return out


class _Torch:
    @staticmethod
    def work(x):
        import torch

        return x.to(torch.float32, copy=True)

    @staticmethod
    def random(shape, like, seed):
        import torch

        g = torch.Generator().manual_seed(seed)
        return torch.randn(shape, generator=g, dtype=like.dtype).to(like.device)

    @staticmethod
    def orthonormal(p):
        import torch

        return torch.linalg.qr(p, mode="reduced")[0]

    @staticmethod
    def finite(a):
        import torch

        return bool(torch.isfinite(a).all())

    @staticmethod
    def out(result, x, out):
        if out is None:
            return result.to(x.dtype).reshape(x.shape)
        out.reshape(-1).copy_(result.reshape(-1))
        return out


def compresses(c, shape):
    """True when PowerSGD codec c compresses a tensor of this shape (else it goes exactly)."""
    if len(shape) < 2 or 0 in tuple(shape):
        return False
    n, m = shape[0], int(np.prod(shape[1:]))
    r = min(c.options["rank"], n, m)
    return r * (n + m) * c.options["min_compression_rate"] <= n * m


def allreduce(x, comm, c, avg, out, error_feedback, reduce):
    """PowerSGD allreduce of x (checked by the caller; compresses(c, x.shape) holds) with
    codec c; reduce(a) is the exact allreduce (sum) of a float32 array on comm."""
    lib = _lib(x)
    n, m = x.shape[0], int(np.prod(x.shape[1:]))
    r = min(c.options["rank"], n, m)
    mat = lib.work(x).reshape(n, m)
    ef = error_feedback
    if ef is not None:
        ef._buffer(n * m, mat)
        mat += ef.residual.reshape(n, m)
    q = ef.q if ef is not None else None
    if q is None or tuple(q.shape) != (m, r):
        q = lib.random((m, r), mat, seed=m * 1000003 + r)
    p = reduce(mat @ q)
    if lib.finite(p):  # the same on every rank: all take the same branch
        p = lib.orthonormal(p)
        q = reduce(mat.T @ p)
        if lib.finite(q):
            if ef is not None:
                ef.residual.reshape(n, m)[...] = mat - p @ (p.T @ mat)
                ef.q = q / comm.Get_size()  # any scale: P is orthonormalised
            result = p @ q.T
            return lib.out(result / comm.Get_size() if avg else result, x, out)
    return lib.out(mat * float("nan"), x, out)
