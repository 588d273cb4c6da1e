"""Error feedback: what a lossy codec drops is remembered and added to the next message of
the same stream, so nothing is lost for good and the mean of many results converges to the
exact mean (Seide et al. 2014, "1-bit SGD"; Karimireddy et al. 2019, "Error feedback fixes
SignSGD"). Used by compressed gradient allreduce."""

import numpy as np

from ._buffers import buffer_info, new_like
from .errors import ArgumentError

__all__ = ["ErrorFeedback"]


class ErrorFeedback:
    """Residual memory of ONE tensor stream: pass the same object on every call that
    compresses that tensor (e.g. one per gradient bucket), never one object for two tensors.

    The residual is a float32 array with as many elements as the input, created (zeros) on
    the first call. In an allreduce it holds, for the parts this rank sends to others, what
    their encoding dropped, and for the part this rank reduces, what encoding the reduced sum
    dropped; both are added to the next call's input. On several nodes (two-level
    collectives, ``mpicomp.node_layout``) it holds the error of what this rank compresses
    between nodes: the part of its node's sum it carries. A block that held a NaN or Inf leaves
    a zero residual, so one overflowing step (skipped by a loss scaler) does not poison all
    later ones. Messages sent uncompressed (below ``config.min_bytes``) leave it unchanged.

    Attributes:
        residual: the float32 residual array (numpy or torch, like the input), or None
            before the first call.

    PowerSGD keeps a warm start besides its residual: its state is a
    :class:`mpicomp.powersgd.PowerSGDState`, which holds one of these.
    """

    def __init__(self):
        self.residual = None

    def reset(self):
        """Forgets the residual (e.g. after the tensor's values were replaced)."""
        if self.residual is not None:
            self.residual[...] = 0

    def _buffer(self, count, like):
        """The residual for `count` elements of array `like` (created on first use, of like's
        kind and device: numpy, torch, cupy); its address."""
        r = self.residual
        if r is None:
            r = self.residual = new_like(like, (count,), "float32", zero=True)
        ptr, n, _, _ = buffer_info(r, "error_feedback.residual")
        if n != count:
            raise ArgumentError(f"error_feedback holds the residual of a stream of {n} elements, but x has "
                                f"{count}: use one ErrorFeedback per tensor")
        return ptr

    def __repr__(self):
        n = None if self.residual is None else int(np.prod(tuple(self.residual.shape)))
        return f"ErrorFeedback(elements={n})"
