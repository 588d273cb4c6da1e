"""What every collective call starts with: the collective's id, its op and its codec
checked, on the communicator's private duplicate; and, when this rank's own arguments fail,
the rejection that tells the other ranks so (they raise ShapeMismatchError naming it, this
rank its own error: nobody waits). Shared by mpicomp.collectives and the allreduce
algorithms registered with it (mpicomp.powersgd)."""
from mpi4py import MPI

from . import _comm, _core
from .codecs import codec, wire_codec
from .errors import ArgumentError, MpicompError

ALLREDUCE, REDUCE_SCATTER, ALLGATHER = (_core.COLL_IDS[n] for n in ("allreduce", "reduce_scatter", "allgather"))
NAMES = {i: name for name, i in _core.COLL_IDS.items()}
_OPS = {"sum": False, "avg": True}
_MPI_OPS = ("SUM", "MAX", "MIN", "PROD", "LAND", "LOR", "BAND", "BOR", "MAXLOC", "MINLOC")


def avg_of(op):
    """True for a mean, False for a sum, None for an op mpicomp does not do. mpi4py's MPI.SUM
    is a sum (MPI.Op objects are not hashable: no dict lookup)."""
    if type(op) is str:
        return _OPS.get(op)
    return False if isinstance(op, MPI.Op) and op == MPI.SUM else None


def op_error(op):
    if isinstance(op, MPI.Op):
        name = next((f"MPI.{n}" for n in _MPI_OPS if op == getattr(MPI, n)), "this MPI.Op")
        return ArgumentError(f"op must be 'sum', 'avg' or MPI.SUM, got {name}: mpicomp's collectives sum; for "
                             f"{name} use mpi4py's own collective (e.g. comm.Allreduce(x, y, op={name}))")
    return ArgumentError(f"op must be 'sum', 'avg' or MPI.SUM, got {op!r}")


def spec_args(coll, comm, spec, op, tell=None, on_device=None):
    """(private comm, codec, avg): the checks every call starts with; with on_device (True
    or False), also whether the codec runs on that memory. tell(private comm, coll) rejects
    the call on the other ranks when one fails. Allreduce also takes the codecs that are
    algorithms (PowerSGD) rather than wire formats."""
    tell = tell or tell_others
    pcomm = _comm.private(comm)
    try:
        c = codec(spec) if coll == ALLREDUCE else wire_codec(spec, NAMES[coll])
        avg = avg_of(op)
        if avg is None:
            raise op_error(op)
        if on_device is not None:
            c.check_memory(on_device)
    except MpicompError as own:
        tell(pcomm, coll)
        raise own
    return pcomm, c, avg


def tell_others(pcomm, coll):
    """Rejects this call on the other ranks of pcomm, now."""
    try:
        _core.reject(pcomm, coll)
    except MpicompError:
        pass  # the others now raise ShapeMismatchError; this rank raises its own error
