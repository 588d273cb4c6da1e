"""The public compressed collectives. Each checks its arguments, then runs the C++ core
without the GIL on a private duplicate of the communicator (see _comm.py).

Arguments are checked on every rank before any data moves. A rank whose own arguments are
invalid still takes part in the agreement step, so it raises its own error (CodecError,
ArgumentError, ...) and every other rank raises ShapeMismatchError naming it: no rank is
left waiting. Ranks that pass different counts, dtypes, codecs or ops all raise
ShapeMismatchError, and the communicator stays usable.
"""

from mpi4py import MPI

from . import _comm, _core
from ._buffers import as_buffer, check_out, empty_like
from .codecs import codec as _codec
from .errors import ArgumentError, MpicompError
from .feedback import ErrorFeedback

__all__ = ["allreduce", "reduce_scatter", "allgather", "iallreduce", "Request", "send", "recv"]

_ALLREDUCE, _REDUCE_SCATTER, _ALLGATHER = 1, 2, 3
_OPS = {"sum": False, "avg": True}


def _prepare(coll, comm, x, codec, out, error_feedback, op, out_count):
    """Checks everything local to this rank; on failure tells the other ranks, then raises.
    Returns (private comm, input, output array, output buffer, codec, avg, residual address)."""
    pcomm = _comm.private(comm)
    try:
        c = _codec(codec)
        if op not in _OPS:
            raise ArgumentError(f"op must be 'sum' or 'avg', got {op!r}")
        xb = as_buffer(x, "x")
        c.check_dtype(xb.dtype, "x")
        if _OPS[op] and xb.dtype.startswith(("int", "uint")):
            raise ArgumentError(f"op='avg' needs a floating-point x, got dtype {xb.dtype}")
        count = out_count(xb.count, pcomm.Get_size())
        if out is None:
            shape = xb.shape if count == xb.count else (count,)
            out = empty_like(xb, shape)
            ob = as_buffer(out, "out")
        else:
            ob = check_out(out, xb, count)
        if error_feedback is not None and not isinstance(error_feedback, ErrorFeedback):
            raise ArgumentError(f"error_feedback must be an mpicomp.ErrorFeedback or None, "
                                f"got {type(error_feedback).__name__}")
        rptr = error_feedback._buffer(xb) if (error_feedback is not None and c.id != 0) else 0
    except MpicompError as own:
        try:
            _core.reject(pcomm, coll)
        except MpicompError:
            pass  # the others now raise ShapeMismatchError; this rank raises its own error
        raise own
    return pcomm, xb, out, ob, c, _OPS[op], rptr


def _same(count, size):
    return count


def _scattered(count, size):
    if count % size:
        raise ArgumentError(f"reduce_scatter: x has {count} elements, which is not a multiple of the "
                            f"communicator size {size}")
    return count // size


def _gathered(count, size):
    return count * size


def allreduce(x, comm=MPI.COMM_WORLD, codec="int8", op="sum", out=None, error_feedback=None):
    """Sum (op="sum") or mean (op="avg") of x over all ranks of comm, compressed with codec.

    Args:
        x: contiguous numpy array or torch CPU tensor (float32, float16, bfloat16, float64;
            integers with codec "none"), any shape.
        comm: an mpi4py intra-communicator (COMM_WORLD, a Split, Dup or Create_cart of it).
        codec: spec string or Codec (see mpicomp.codec). Below ``config.min_bytes`` the data
            is sent uncompressed; "none" uses the MPI library's own allreduce.
        op: "sum" or "avg" (the sum divided by the communicator size).
        out: optional output array like x (may be x itself: in place).
        error_feedback: an ErrorFeedback for this tensor stream (lossy codecs).

    Returns:
        out, or a new array of x's type, dtype, shape and device. All ranks get identical
        values. The error is within the sum over ranks of the codec's per-element bound for
        each rank's x, plus the bound for the summed value.
    """
    pcomm, xb, out, ob, c, avg, rptr = _prepare(_ALLREDUCE, comm, x, codec, out, error_feedback, op, _same)
    _core.allreduce(pcomm, xb.ptr, ob.ptr, xb.count, xb.dtype_id, c.id, c.block, avg, rptr)
    return out


def reduce_scatter(x, comm=MPI.COMM_WORLD, codec="int8", op="sum", out=None, error_feedback=None):
    """x holds size * k elements (any shape; flattened in C order); returns a 1-D array of k
    elements: the sum (or mean) over ranks of their elements [rank * k, (rank + 1) * k).
    Each rank compresses each part once; its own part is added exactly."""
    pcomm, xb, out, ob, c, avg, rptr = _prepare(_REDUCE_SCATTER, comm, x, codec, out, error_feedback, op,
                                                _scattered)
    _core.reduce_scatter(pcomm, xb.ptr, ob.ptr, ob.count, xb.dtype_id, c.id, c.block, avg, rptr)
    return out


def allgather(x, comm=MPI.COMM_WORLD, codec="int8", out=None, error_feedback=None):
    """Concatenation (1-D, size * k elements, rank order) of every rank's x (k elements).
    Each rank's x is compressed once; every rank, its owner included, decodes the same bytes,
    so all ranks get identical results."""
    pcomm, xb, out, ob, c, _, rptr = _prepare(_ALLGATHER, comm, x, codec, out, error_feedback, "sum", _gathered)
    _core.allgather(pcomm, xb.ptr, ob.ptr, xb.count, xb.dtype_id, c.id, c.block, rptr)
    return out


class Request:
    """A non-blocking collective in flight. ``wait()`` returns its result (or raises its
    error); ``test()`` tells whether it has completed. Do not touch the input or output
    arrays until it has."""

    __slots__ = ("_future",)

    def __init__(self, future):
        self._future = future

    def wait(self, timeout=None):
        """Blocks until complete; returns the result array."""
        return self._future.result(timeout)

    def test(self):
        """True when complete (then wait() returns at once)."""
        return self._future.done()


def iallreduce(x, comm=MPI.COMM_WORLD, codec="int8", op="sum", out=None, error_feedback=None):
    """Non-blocking allreduce: starts it on a worker thread (its own duplicate of comm) and
    returns a Request at once. All ranks must start their non-blocking collectives on comm
    in the same order; they run in that order. Arguments are checked here, before it starts."""
    acomm, executor = _comm.worker(comm)
    # Check synchronously on the worker's communicator so a bad argument raises here.
    pcomm, xb, out, ob, c, avg, rptr = _prepare(_ALLREDUCE, acomm, x, codec, out, error_feedback, op, _same)

    def run():
        _core.allreduce(pcomm, xb.ptr, ob.ptr, xb.count, xb.dtype_id, c.id, c.block, avg, rptr)
        return out

    return Request(executor.submit(run))


def _p2p_args(buf, codec, name, comm, peer, peer_name):
    if not isinstance(comm, MPI.Comm) or comm == MPI.COMM_NULL:
        raise ArgumentError(f"comm must be an mpi4py communicator, got {comm!r}")
    c = _codec(codec)
    b = as_buffer(buf, name)
    c.check_dtype(b.dtype, name)
    if not isinstance(peer, int) or not (0 <= peer < comm.Get_size() or peer == MPI.ANY_SOURCE):
        raise ArgumentError(f"{peer_name} must be a rank of comm (0..{comm.Get_size() - 1}), got {peer!r}")
    return c, b


def send(x, dest, comm=MPI.COMM_WORLD, codec="int8", tag=0, error_feedback=None):
    """Sends x to rank dest of comm, compressed; the receiver calls recv with an array of the
    same count and dtype and the same codec. Returns when x may be reused."""
    c, b = _p2p_args(x, codec, "x", comm, dest, "dest")
    rptr = error_feedback._buffer(b) if (error_feedback is not None and c.id != 0) else 0
    _core.send(comm, b.ptr, dest, tag, b.count, b.dtype_id, c.id, c.block, rptr)


def recv(out, source=MPI.ANY_SOURCE, comm=MPI.COMM_WORLD, codec="int8", tag=0):
    """Receives into out (contiguous, the sender's count and dtype) what rank source sent
    with send; returns out. A sender whose count, dtype or codec differ: ShapeMismatchError
    (the message is consumed, the communicator stays usable)."""
    c, b = _p2p_args(out, codec, "out", comm, source, "source")
    _core.recv(comm, b.ptr, source, tag, b.count, b.dtype_id, c.id, c.block)
    return out
