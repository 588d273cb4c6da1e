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


def _is_torch(a):
    return not isinstance(a, np.ndarray)


def _float32(x):
    if _is_torch(x):
        import torch

        return x.to(torch.float32, copy=True)
    return x.astype(np.float32, copy=True)


def _random(shape, like, seed):
    """The same pseudo-random matrix on every rank, as an array like `like`."""
    q = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if _is_torch(like):
        import torch

        return torch.from_numpy(q).to(like.device)
    return q


def _orthonormal(p):
    if _is_torch(p):
        import torch

        return torch.linalg.qr(p, mode="reduced")[0]
    return np.linalg.qr(p)[0]


def _finite(a):
    if _is_torch(a):
        import torch

        return bool(torch.isfinite(a).all())
    return bool(np.isfinite(a).all())


def _result(r, x, out):
    r = r.reshape(x.shape)
    r = r.to(x.dtype) if _is_torch(x) else r.astype(x.dtype)
    if out is None:
        return r
    out[...] = r
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
    n, m = x.shape[0], int(np.prod(x.shape[1:]))
    r = min(c.options["rank"], n, m)
    mat = _float32(x).reshape(n, m)
    ef = error_feedback
    if ef is not None:
        ef._buffer(n * m, mat)
        mat += ef.residual.reshape(n, m)
    q = ef.q if ef is not None else None
    if q is None or tuple(q.shape) != (m, r):
        q = _random((m, r), mat, seed=m * 1000003 + r)
    p = reduce(mat @ q)
    if _finite(p):  # the same on every rank: all take the same branch
        p = _orthonormal(p)
        q = reduce(mat.T @ p)
        if _finite(q):
            if ef is not None:
                ef.residual.reshape(n, m)[...] = mat - p @ (p.T @ mat)
                ef.q = q / comm.Get_size()  # any scale: P is orthonormalised
            result = p @ q.T
            return _result(result / comm.Get_size() if avg else result, x, out)
    return _result(mat * float("nan"), x, out)
