"""The torch backend's options: which traffic a group compresses, from the environment
(``MPICOMP_CODEC``, the per-operation ``MPICOMP_*_CODEC``, ``MPICOMP_ERROR_FEEDBACK``) unless
given for the group."""
from ..codecs import codec_from_environment, wire_codec
from ..config import from_environment

__all__ = ["BackendOptions", "backend_options"]


class BackendOptions:
    """Which traffic the backend compresses, and how.

    Args:
        codec: codec of floating-point sums, means and gathers (mpicomp.codec spec), from
            ``MPICOMP_CODEC``; default "none" (exact: MPI's own collectives).
        allreduce, reduce_scatter, allgather: per-operation codecs, from
            ``MPICOMP_ALLREDUCE_CODEC``, ``MPICOMP_REDUCE_SCATTER_CODEC``,
            ``MPICOMP_ALLGATHER_CODEC``; default ``codec``.
        error_feedback: keep what a lossy codec drops from each tensor stream and add it to
            the stream's next call (``MPICOMP_ERROR_FEEDBACK=1``); a stream is a (operation,
            buffer address, size), as DDP's buckets and FSDP2's gradient buffers reuse theirs.

    Messages below ``mpicomp.config.min_bytes`` (``MPICOMP_MIN_BYTES``) travel uncompressed;
    ``mpicomp.stats()`` counts every call, compressed or not, with its bytes.
    """

    def __init__(self, codec=None, allreduce=None, reduce_scatter=None, allgather=None, error_feedback=None):
        named = {"allreduce": allreduce, "reduce_scatter": reduce_scatter, "allgather": allgather}
        self.codecs = {op: spec or codec or codec_from_environment(op, "none") for op, spec in named.items()}
        for op, spec in self.codecs.items():
            wire_codec(spec, f"backend_options: the {op} codec")
        if error_feedback is None:
            error_feedback = bool(from_environment("error_feedback", 0))
        self.error_feedback = bool(error_feedback)

    def __repr__(self):
        return f"BackendOptions({self.codecs}, error_feedback={self.error_feedback})"


def backend_options(**kwargs):
    """``BackendOptions(**kwargs)``: pass as ``pg_options`` to ``init_process_group`` or
    ``new_group`` to override the environment for that group."""
    return BackendOptions(**kwargs)
