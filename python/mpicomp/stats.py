"""What this process's collectives did: calls, how many were compressed, bytes in and on the
wire, and for every call that travelled uncompressed, why.

The codec you name is the codec applied. The exceptions are policies, each counted here
under its reason: ``none`` (codec "none"), ``small`` (input below ``config.min_bytes``),
``one_rank`` (a communicator of one rank), ``local`` (all ranks on one node with
``config.skip_local`` set), and codec "auto"'s decisions (mpicomp.auto): ``auto_probe``
(measuring: a communicator's first call of its kind, or a call sent uncompressed to time
that way), ``auto_small`` (below the size from which compression wins there) and
``auto_link`` (the link is faster than the codec). ``MPICOMP_STATS=1`` prints the table at
exit (rank 0 of COMM_WORLD, its own counts); ``MPICOMP_VERBOSE=1`` prints one line the first time a call
is not compressed for a new reason.

Bytes on the wire: for a compressed call, the payload this rank sent; for an uncompressed
one, what the bandwidth-optimal algorithm sends ((size - 1) / size of the data per stage:
two stages for allreduce), whichever path MPI took. Headers are left out. The table's
``saved`` column is the uncompressed bytes over the bytes on the wire.
"""

import atexit
import sys

from . import _core
from .config import from_environment

__all__ = ["stats", "reset_stats", "stats_table"]


def stats():
    """Counters per collective since start (or the last reset_stats()): a dict keyed by
    "allreduce", "reduce_scatter", "allgather" and "send/recv", each a dict of ``calls``,
    ``compressed``, ``bytes_in``, ``bytes_wire``, ``bytes_plain`` (what the same calls send
    uncompressed: bytes_plain / bytes_wire is the saving), ``bytes_inter`` and
    ``bytes_intra`` (what mpicomp's own messages carried to other nodes and inside this one,
    the data that rides the agreement included; MPI's own calls count in neither),
    ``algorithms`` (how calls ran -> calls: "eager", "mpi", "flat", "two_level"),
    ``seconds``, ``skipped`` (reason -> uncompressed calls), ``probes`` and
    ``probe_seconds`` (codec "auto"'s measurements and their time). docs/cluster.md: nodes and their two levels."""
    return _core.stats()


def reset_stats():
    """Sets every counter back to zero (this process)."""
    _core.stats_reset()


def stats_table(title=None):
    """The counters as a table: '#' comment lines, one row per collective that ran."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return _core.stats_table(title or f"mpicomp statistics, rank {comm.Get_rank()} of {comm.Get_size()}")


def thread_bytes():
    """(payload bytes, the same calls' bytes uncompressed) that the mpicomp calls run on this
    thread have sent so far: its share of stats()'s ``bytes_wire`` and ``bytes_plain``. Read
    around one's own calls to count them by purpose (mpicomp.torch.traffic does)."""
    return _core.thread_bytes()


def _print_at_exit():
    from mpi4py import MPI

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_rank() == 0:
        sys.stdout.write(stats_table())
        sys.stdout.flush()


if from_environment("stats", 0):
    # Registered after mpi4py's own exit handler (imported first), so it runs before MPI_Finalize.
    atexit.register(_print_at_exit)
