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
nothing is lost for good. Computed in float32 (float64 input too). Without a warm start each
call starts from the same pseudo-random Q; without error feedback the result is a biased
compressor, fine for a one-off reduction, not for training. Vectors, scalars and matrices too
small to gain (r (n + m) min_compression_rate > n m) go through the uncompressed allreduce,
exactly.

Non-finite input: P or Q holds a NaN or Inf on every rank, and the whole result is NaN; the
residual and warm start stay as they were before the call.

Used as torch's powerSGD_hook is, with a state object per tensor stream:

    state = mpicomp.powersgd.PowerSGDState(rank=4)           # one per weight matrix
    y = mpicomp.powersgd.allreduce(grad, state, comm=comm, op="avg")

``mpicomp.allreduce(x, codec="powersgd:rank=4", error_feedback=...)`` runs the same
algorithm: error_feedback is then a PowerSGDState of that rank (residual and warm start), a
plain ErrorFeedback (residual only: each call starts from the same Q), or None (neither).
"""
import numpy as np
from mpi4py import MPI

from . import collectives
from ._buffers import collective_args, is_torch
from ._calls import ALLREDUCE, spec_args, tell_others
from ._dtypes import name_of
from .codecs import PowerSGDCodec
from .errors import ArgumentError, MpicompError, ShapeMismatchError
from .feedback import ErrorFeedback

__all__ = ["PowerSGDState", "allreduce"]


class PowerSGDState:
    """PowerSGD's memory of ONE tensor stream (e.g. one weight matrix's gradient): pass the
    same object on every call for that tensor, never one object for two tensors.

    Args:
        rank: r, the number of directions kept (``rank * (n + m)`` numbers sent instead of
            ``n * m``; torch's ``matrix_approximation_rank``).
        min_compression_rate: matrices that would not shrink by this factor go exactly.
        error_feedback: keep what each call's projection dropped and add it to the next
            call's input (the paper's e_i; torch's ``use_error_feedback``).
        warm_start: start each call's power iteration from the previous call's Q (the
            paper's section 3; torch's ``warm_start``), which tracks a slowly changing
            gradient's leading directions far better than a fresh random Q.

    Attributes:
        codec: the codec ("powersgd" with this rank and rate) naming these settings.
        feedback: the ErrorFeedback holding the residual (float32, n * m), or None.
        q: the warm start (m x rank, float32, on the tensor's device), or None before the
            first compressed call.
    """

    def __init__(self, rank=4, min_compression_rate=2, error_feedback=True, warm_start=True):
        self.codec = PowerSGDCodec(rank=rank, min_compression_rate=min_compression_rate)
        for name, v in (("error_feedback", error_feedback), ("warm_start", warm_start)):
            if not isinstance(v, bool):
                raise ArgumentError(f"PowerSGDState: {name} must be a bool, got {v!r}")
        self.feedback = ErrorFeedback() if error_feedback else None
        self.warm_start = warm_start
        self.q = None

    def compresses(self, shape):
        """True when a tensor of this shape is compressed (else it goes exactly)."""
        return self.codec.compresses(shape)

    def reset(self):
        """Forgets the residual and the warm start (e.g. after the tensor's values were replaced)."""
        if self.feedback is not None:
            self.feedback.reset()
        self.q = None

    def __repr__(self):
        return (f"PowerSGDState(rank={self.codec.options['rank']}, min_compression_rate="
                f"{self.codec.options['min_compression_rate']}, error_feedback={self.feedback is not None}, "
                f"warm_start={self.warm_start})")


def allreduce(x, state=None, comm=MPI.COMM_WORLD, op="sum", out=None):
    """Sum (op="sum") or mean (op="avg") over comm's ranks of matrix x, low-rank compressed.

    Args:
        x: contiguous numpy array or torch tensor (CPU or CUDA) of a floating-point dtype;
            n-D tensors are viewed as shape[0] x the rest. Every rank passes the same shape.
        state: this tensor stream's PowerSGDState, kept across calls; None: a call without
            residual or warm start (PowerSGDState's defaults otherwise: rank 4).
        comm, op, out: as for mpicomp.allreduce.

    Returns:
        out, or a new array like x; identical on every rank. No per-element error bound
        (see the module docstring); exact when the ranks' matrices together span at most
        ``rank`` columns, and for tensors that are not compressed.
    """
    c = state.codec if isinstance(state, PowerSGDState) else PowerSGDCodec()
    return _run(*_prepare(comm, x, c, state, op, out, state_given=True))


def _state_for(c, given, state_given):
    """The PowerSGDState a call with codec c runs with, from what the caller passed (the
    state argument, or mpicomp.allreduce's error_feedback)."""
    if isinstance(given, PowerSGDState):
        if given.codec != c:
            raise ArgumentError(f"error_feedback is a PowerSGDState of codec {given.codec.spec!r}, but the call "
                                f"names codec {c.spec!r}: pass the state of this codec's settings")
        return given
    if given is not None and (state_given or not isinstance(given, ErrorFeedback)):
        wanted = "a PowerSGDState" if state_given else "an mpicomp.ErrorFeedback, a PowerSGDState"
        raise ArgumentError(f"{'state' if state_given else 'error_feedback'} must be {wanted} or None, got "
                            f"{type(given).__name__}")
    state = PowerSGDState(**c.options, error_feedback=False, warm_start=False)
    state.feedback = given
    return state


def _prepare(comm, x, codec, given, op, out, tell=None, state_given=False):
    """The checks of one call (every rank takes part in the agreement when one fails);
    returns the arguments of _run."""
    pcomm, c, avg = spec_args(ALLREDUCE, comm, codec, op, tell)
    try:
        out, _, _, _, dt, _ = collective_args(x, out, 0, pcomm.Get_size())
        if not (isinstance(x, np.ndarray) or is_torch(x)):
            raise ArgumentError(f"allreduce: codec powersgd takes numpy arrays and torch tensors, got "
                                f"{type(x).__module__}.{type(x).__name__}")
        c.check_dtype(name_of(dt))
        state = _state_for(c, given, state_given)
    except MpicompError as own:
        (tell or tell_others)(pcomm, ALLREDUCE)
        raise own
    return comm, x, state, avg, out, dt


def _run(comm, x, state, avg, out, dt):
    # The factors' sizes need not tell two shapes apart (a 256 x 256 matrix at rank 4 sends
    # as many numbers as a 4 x 256 one sent whole): agree on shape and dtype first, with sums
    # of v and v * v, equal on every rank only if all v are (Cauchy-Schwarz).
    n = x.shape[0] if len(x.shape) else 1
    v = np.array([n, int(np.prod(x.shape)) // max(n, 1), dt], np.float64)
    s = collectives.allreduce(np.concatenate([v, v * v]), comm=comm, codec="none")
    if np.any(s[3:] * comm.Get_size() != s[:3] ** 2):
        raise ShapeMismatchError(f"allreduce: ranks disagree on the shape or dtype of x (codec powersgd); this "
                                 f"rank has {tuple(x.shape)} {name_of(dt)}")
    if not state.compresses(tuple(x.shape)):
        return collectives.allreduce(x, comm, "none", "avg" if avg else "sum", out)
    return _low_rank(x, comm, state, avg, out, lambda a: collectives.allreduce(a, comm=comm, codec="none"))


def _low_rank(x, comm, state, avg, out, reduce):
    """Steps 1-6 of the module docstring; reduce(a): the exact allreduce (sum) of a float32 array."""
    n, m = x.shape[0], int(np.prod(x.shape[1:]))
    r = min(state.codec.options["rank"], n, m)
    mat = _float32(x).reshape(n, m)
    ef = state.feedback
    if ef is not None:
        ef._buffer(n * m, mat)
        mat += ef.residual.reshape(n, m)
    q = state.q if state.warm_start else None
    if q is None or tuple(q.shape) != (m, r):
        q = _random((m, r), mat, seed=m * 1000003 + r)
    p = reduce(mat @ q)
    if _finite(p):  # the same on every rank: all take the same branch
        p = _orthonormal(p)
        q = reduce(mat.T @ p)
        if _finite(q):
            if ef is not None:
                ef.residual.reshape(n, m)[...] = mat - p @ (p.T @ mat)
            if state.warm_start:
                state.q = q / comm.Get_size()  # any scale: P is orthonormalised
            result = p @ q.T
            return _result(result / comm.Get_size() if avg else result, x, out)
    return _result(mat * float("nan"), x, out)


def _float32(x):
    if is_torch(x):
        import torch

        return x.to(torch.float32, copy=True)
    return x.astype(np.float32, copy=True)


def _random(shape, like, seed):
    """The same pseudo-random matrix on every rank, as an array like `like`."""
    q = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if is_torch(like):
        import torch

        return torch.from_numpy(q).to(like.device)
    return q


def _orthonormal(p):
    if is_torch(p):
        import torch

        return torch.linalg.qr(p, mode="reduced")[0]
    return np.linalg.qr(p)[0]


def _finite(a):
    if is_torch(a):
        import torch

        return bool(torch.isfinite(a).all())
    return bool(np.isfinite(a).all())


def _result(r, x, out):
    r = r.reshape(x.shape)
    r = r.to(x.dtype) if is_torch(x) else r.astype(x.dtype)
    if out is None:
        return r
    out[...] = r
    return out


collectives.register_allreduce_algorithm(PowerSGDCodec.name, _prepare, _run)
