"""Errors raised by mpicomp. All derive from :class:`MpicompError`.

A collective that rejects its arguments on one rank still takes part in the agreement step
with the other ranks, so every rank raises (the others :class:`ShapeMismatchError`) instead
of waiting forever for the rank that gave up.
"""

__all__ = ["MpicompError", "CodecError", "ShapeMismatchError", "BackendError", "ArgumentError", "CommTimeoutError",
           "CheckpointError", "RankFailedError"]


class MpicompError(Exception):
    """Base class of every error mpicomp raises."""


class CodecError(MpicompError, ValueError):
    """Unknown codec spec, bad codec option, or a dtype the codec does not support."""


class ShapeMismatchError(MpicompError, ValueError):
    """Ranks disagree on element count, dtype, codec or operation (raised on every rank),
    or a buffer does not match the shape it must have."""


class BackendError(MpicompError, RuntimeError):
    """No usable GPU or CUDA-aware MPI where one is needed, or an MPI call failed."""


class CommTimeoutError(BackendError, TimeoutError):
    """A call waited longer than ``mpicomp.config.timeout_s`` (``MPICOMP_TIMEOUT``) for the
    other ranks: one of them never reached it, or stopped in it. Raised on every rank that
    waits; mpicomp does not use that communicator again (its late messages could match a
    later call's), so free it and make a new one."""


class ArgumentError(MpicompError, ValueError):
    """An argument that is neither a codec nor a shape problem: bad op, non-contiguous or
    unsupported array, wrong communicator type."""


class CheckpointError(MpicompError, ValueError):
    """A checkpoint (an optimizer's state_dict or saved file) that cannot be loaded: not one
    of this optimizer's, unreadable or corrupt, or made for another model, optimizer class or
    configuration. Raised on every rank that loads it."""


class RankFailedError(MpicompError, RuntimeError):
    """Raised on the other ranks when one rank failed inside a step (its closure raised):
    every rank stops there instead of waiting for the one that gave up."""
