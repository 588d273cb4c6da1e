"""mpicomp: compressed collectives (allreduce, reduce-scatter, allgather, send/recv) over MPI.

    import mpicomp
    from mpi4py import MPI
    y = mpicomp.allreduce(x, comm=MPI.COMM_WORLD, codec="int8", op="avg")
"""

import importlib.metadata

# mpi4py loads libmpi and calls MPI_Init first; the extension then uses that same library.
from mpi4py import MPI  # noqa: F401

from . import _core, auto, powersgd
from ._comm import set_timeout, timeout_of
from .codecs import Codec, available_codecs, codec
from .collectives import (Request, allgather, allreduce, iallgather, iallreduce, ireduce_scatter, recv,
                          reduce_scatter, send)
from .config import config
from .errors import (ArgumentError, BackendError, CheckpointError, CodecError, CommTimeoutError, MpicompError,
                     RankFailedError, ShapeMismatchError)
from .feedback import ErrorFeedback
from .nodes import NodeLayout, node_comms, node_layout
from .stats import reset_stats, stats, stats_table

__version__ = importlib.metadata.version("mpicomp")  # pyproject.toml's, the one place it is written

__all__ = [
    "Codec", "codec", "available_codecs",
    "allreduce", "reduce_scatter", "allgather", "iallreduce", "ireduce_scatter", "iallgather", "Request", "send",
    "recv",
    "ErrorFeedback", "powersgd", "auto", "config", "set_timeout", "timeout_of", "node_comms", "node_layout",
    "NodeLayout", "stats",
    "reset_stats", "stats_table",
    "MpicompError", "CodecError", "ShapeMismatchError", "BackendError", "ArgumentError", "CommTimeoutError",
    "CheckpointError", "RankFailedError",
]
