"""The public compressed collectives. Each checks its arguments, then runs the C++ core
without the GIL on a private duplicate of the communicator (see _comm.py).

Arguments are checked on every rank before any data moves. A rank whose own arguments are
invalid still takes part in the agreement step, so it raises its own error (CodecError,
ArgumentError, ...) and every other rank raises ShapeMismatchError naming it: no rank is
left waiting. Ranks that pass different counts, dtypes, codecs or ops all raise
ShapeMismatchError, and the communicator stays usable.
"""

import numpy as np
from mpi4py import MPI

from . import _comm, _core
from ._buffers import array_info, collective_args, is_torch
from ._calls import ALLGATHER, ALLREDUCE, NAMES, REDUCE_SCATTER, avg_of, spec_args, tell_others
from ._dtypes import name_of
from .codecs import Codec, cached, codec_from_environment, wire_codec
from .errors import ArgumentError, BackendError, CodecError, CommTimeoutError, MpicompError
from .feedback import ErrorFeedback
from .stats import thread_bytes

__all__ = ["allreduce", "reduce_scatter", "allgather", "iallreduce", "ireduce_scatter", "iallgather", "Request", "send",
           "recv"]

_OUT_MODE = {ALLREDUCE: 0, REDUCE_SCATTER: 1, ALLGATHER: 2}  # collective_args: out's size against x's

DEFAULT_CODEC = "int8"
"""The codec of a call that names none (codec=None) when no variable names one: blockwise
int8 for float32, float16 and bfloat16 arrays. float64 and integer arrays, which int8 cannot
carry, always default to "none" (exact; float64 may name a lossless codec, exact too)."""


# The default codec of each collective (None: send and recv), from the environment as the
# interposer's and the torch backend's are; an invalid value fails the import.
_DEFAULTS = {None: codec_from_environment(None, DEFAULT_CODEC),
             **{i: codec_from_environment(n, DEFAULT_CODEC) for n, i in _core.COLL_IDS.items()}}


def _torch_float64():
    import torch

    return torch.float64


def _default_codec(x, coll=None):
    """The codec of a call of collective coll (None: send, recv) on x that names none."""
    named = _DEFAULTS[coll]
    if is_torch(x):
        return named if x.is_floating_point() and x.dtype != _torch_float64() else "none"
    try:
        return named if np.dtype(x.dtype).kind == "f" and np.dtype(x.dtype).itemsize < 8 else "none"
    except (AttributeError, TypeError):  # not an array, or bfloat16 spelled by another library
        return named


def _prepare(coll, comm, x, codec, out, error_feedback, op, out_mode, tell=None):
    """Checks everything local to this rank; on failure tells the other ranks (tell(private
    comm, coll)), then raises. Returns (private comm, out, x address, out address, count,
    dtype id, codec, avg, residual address)."""
    tell = tell or tell_others
    pcomm, c, avg = spec_args(coll, comm, codec, op, tell)
    try:
        out, xptr, yptr, count, dt, stream = collective_args(x, out, out_mode, pcomm.Get_size())
        _core.check_combination(dt, c.id, avg)
        c.check_memory(stream is not None)
        rptr = 0
        if error_feedback is not None:
            if not isinstance(error_feedback, ErrorFeedback):
                raise ArgumentError(f"error_feedback must be an mpicomp.ErrorFeedback or None, "
                                    f"got {type(error_feedback).__name__}")
            if not c.exact:
                rptr = error_feedback._buffer(count, x)
    except MpicompError as own:
        tell(pcomm, coll)
        raise own
    return pcomm, out, xptr, yptr, count, dt, c, avg, rptr, stream


def _run(coll, pcomm, xptr, yptr, count, dt, c, avg, rptr, stream):
    """The C++ collective on host buffers, or on GPU buffers on the given stream. count: of
    x's elements for allreduce and allgather, of out's for reduce_scatter."""
    args = (coll, pcomm, xptr, yptr, count, dt, c.call_id, c.block, avg, rptr)
    if stream is None:
        _core.collective(*args)
    else:
        _core.cuda_collective(*args, stream)


# The buffers of calls that timed out. MPI's own collectives (the exact paths) can be neither
# cancelled nor freed, and one that a late rank completes still writes its output and reads
# its input: those stay alive (cpp/coll/deadline.h: mpi_collective; the numpy path keeps its
# own in C++). Timeouts are rare, and their communicators are given up anyway.
_abandoned = []


def _execute(coll, prepared, x):
    """Runs a call _prepare checked on x; returns its output."""
    pcomm, out, xptr, yptr, n, dt, c, avg, rptr, stream = prepared
    if coll == REDUCE_SCATTER:
        n //= pcomm.Get_size()  # _run counts out's elements
    try:
        _run(coll, pcomm, xptr, yptr, n, dt, c, avg, rptr, stream)
    except CommTimeoutError:
        _abandoned.append((x, out))
        raise
    return out


# The allreduce algorithms of the codecs that are not wire formats, by codec name: {name:
# (prepare, run)}. prepare(comm, x, codec, error_feedback, op, out, tell) checks a call as
# _prepare does and returns the arguments of run, which returns the result. Their modules
# (mpicomp.powersgd) build on this one and register themselves when imported.
_ALGORITHMS = {}


def register_allreduce_algorithm(name, prepare, run):
    """Makes allreduce(x, codec=name...) (and iallreduce) run an algorithm of its own."""
    _ALGORITHMS[name] = (prepare, run)


def _algorithm(codec):
    """The (prepare, run) of the algorithm codec names, or None for a wire codec (found by
    name: a bad option must fail in that algorithm's argument checks, on every rank)."""
    if isinstance(codec, Codec):
        return None if codec.wire else _ALGORITHMS.get(codec.name)
    return _ALGORITHMS.get(codec.partition(":")[0].strip()) if type(codec) is str else None


def _numpy(coll, comm, x, codec, out, op, c=None):
    """The whole call in C++ for numpy arrays without error feedback (most calls). A codec
    spec string and communicator seen before are found with two dict lookups (a small
    collective on shared memory takes a few microseconds: every 100 ns shows)."""
    ctx = _comm.known(comm)
    c = c or cached(codec)
    avg = avg_of(op)
    if ctx is None or c is None or not c.wire or avg is None or c.device_only:
        pcomm, c, avg = spec_args(coll, comm, codec, op, on_device=False)
    else:
        pcomm = ctx.comm
    return _core.numpy_collective(coll, pcomm, x, out, c.call_id, c.block, avg)


def allreduce(x, comm=MPI.COMM_WORLD, codec=None, op="sum", out=None, error_feedback=None):
    """Sum (op="sum") or mean (op="avg") of x over all ranks of comm, compressed with codec.

    Args:
        x: contiguous numpy array, torch tensor (CPU or CUDA) or CUDA array (cupy), of
            float32, float16, bfloat16 or float64 (integers with codec "none"), any shape.
            GPU arrays are reduced on their GPU, on the current stream (CUDA builds).
        comm: an mpi4py intra-communicator (COMM_WORLD, a Split, Dup or Create_cart of it).
        codec: spec string or Codec (see mpicomp.codec); None (the default):
            ``MPICOMP_ALLREDUCE_CODEC``, else ``MPICOMP_CODEC``, else "int8" for float32 and
            16-bit x, "none" (exact) for float64 and integers. "none" uses the MPI library's own
            allreduce. Below ``config.min_bytes`` the data is sent uncompressed (counted in
            mpicomp.stats(), like every call sent uncompressed). "auto" ("auto:int4", ...):
            the codec where measured to pay on comm at x's size, else none (mpicomp.auto).
        op: "sum", "avg" (the sum divided by the communicator size) or MPI.SUM.
        out: optional output array like x (may be x itself: in place). Reused across calls
            it saves the fresh pages a new result costs: 2 ranks, 64 MiB of float32,
            codec none 24.5 -> 18.4 ms a call, int8 17.8 -> 11.6 ms (page faults).
        error_feedback: an ErrorFeedback for this tensor stream (lossy codecs); with codec
            "powersgd", a mpicomp.powersgd.PowerSGDState (residual and warm start).

    Returns:
        out, or a new array of x's type, dtype, shape and device. All ranks get identical
        values. The error is within the sum over ranks of the codec's per-element bound for
        each rank's x, plus the bound for the summed value. Codec "powersgd" has no such
        bound (see mpicomp.powersgd).
    """
    if codec is None:
        codec = _default_codec(x, ALLREDUCE)
    known = cached(codec)
    if (known is None or not known.wire) and (algorithm := _algorithm(codec)):
        prepare, run = algorithm
        return run(*prepare(comm, x, codec, error_feedback, op, out))
    if error_feedback is None and type(x) is np.ndarray:
        return _numpy(ALLREDUCE, comm, x, codec, out, op, known)
    return _execute(ALLREDUCE, _prepare(ALLREDUCE, comm, x, codec, out, error_feedback, op,
                                         _OUT_MODE[ALLREDUCE]), x)


def reduce_scatter(x, comm=MPI.COMM_WORLD, codec=None, op="sum", out=None, error_feedback=None):
    """x holds size * k elements (any shape; flattened in C order); returns a 1-D array of k
    elements: the sum (or mean) over ranks of their elements [rank * k, (rank + 1) * k).
    Each rank compresses each part once; its own part is added exactly. codec and op as
    for allreduce."""
    if codec is None:
        codec = _default_codec(x, REDUCE_SCATTER)
    if error_feedback is None and type(x) is np.ndarray:
        return _numpy(REDUCE_SCATTER, comm, x, codec, out, op)
    return _execute(REDUCE_SCATTER, _prepare(REDUCE_SCATTER, comm, x, codec, out, error_feedback, op,
                                              _OUT_MODE[REDUCE_SCATTER]), x)


def allgather(x, comm=MPI.COMM_WORLD, codec=None, out=None, error_feedback=None):
    """Concatenation (1-D, size * k elements, rank order) of every rank's x (k elements).
    Each rank's x is compressed once; every rank, its owner included, decodes the same bytes,
    so all ranks get identical results. codec as for allreduce."""
    if codec is None:
        codec = _default_codec(x, ALLGATHER)
    if error_feedback is None and type(x) is np.ndarray:
        return _numpy(ALLGATHER, comm, x, codec, out, "sum")
    return _execute(ALLGATHER, _prepare(ALLGATHER, comm, x, codec, out, error_feedback, "sum",
                                         _OUT_MODE[ALLGATHER]), x)


class Request:
    """A non-blocking collective in flight. ``wait()`` returns its result (or raises its
    error); ``test()`` tells whether it has completed. Do not touch the input or output
    arrays until it has. Once it has, ``bytes_sent`` holds the payload bytes it sent (its
    share of mpicomp.stats()'s ``bytes_wire``)."""

    __slots__ = ("_future", "bytes_sent")

    def __init__(self, executor, fn, *args):
        """Runs fn(*args) on executor's thread, counting the bytes it sends there."""
        self.bytes_sent = None
        self._future = executor.submit(self._counted, fn, *args)

    def _counted(self, fn, *args):
        before = thread_bytes()[0]
        try:
            return fn(*args)
        finally:
            self.bytes_sent = thread_bytes()[0] - before

    def wait(self, timeout=None):
        """Blocks until complete; returns the result array."""
        return self._future.result(timeout)

    def test(self):
        """True when complete (then wait() returns at once)."""
        return self._future.done()

    def add_done_callback(self, fn):
        """Calls fn(self) when complete (at once if it is): on the worker thread, or this one."""
        self._future.add_done_callback(lambda _: fn(self))


def _start(coll, x, comm, codec, op, out, error_feedback):
    """A non-blocking collective: checked here, run on comm's worker thread (its own
    duplicate of comm), in the order the calls were started."""
    name = "i" + NAMES[coll]
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        levels = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED", MPI.THREAD_SERIALIZED: "SERIALIZED"}
        raise BackendError(f"{name} needs MPI_THREAD_MULTIPLE (it runs MPI on a worker thread), but MPI was "
                           f"initialised at MPI_THREAD_{levels.get(MPI.Query_thread(), MPI.Query_thread())}: leave "
                           f"mpi4py.rc.thread_level at 'multiple', or call {NAMES[coll]}")
    if codec is None:
        codec = _default_codec(x, coll)
    acomm, executor = _comm.worker(comm)

    # A bad argument raises here, at once; the other ranks learn of it from a rejection that
    # runs on the worker, in order: sent from this thread it could meet the agreement step
    # of an earlier call still running there (same communicator, same tag).
    def tell_in_order(pcomm, c):
        executor.submit(tell_others, pcomm, c)

    if coll == ALLREDUCE and (algorithm := _algorithm(codec)):
        prepare, run = algorithm
        return Request(executor, run, *prepare(acomm, x, codec, error_feedback, op, out, tell_in_order))
    prepared = _prepare(coll, acomm, x, codec, out, error_feedback, op, _OUT_MODE[coll], tell_in_order)

    def run(keep_alive=x):  # the caller may drop x (a temporary) before this runs
        return _execute(coll, prepared, keep_alive)

    return Request(executor, run)


def iallreduce(x, comm=MPI.COMM_WORLD, codec=None, op="sum", out=None, error_feedback=None):
    """Non-blocking allreduce: starts it on a worker thread (its own duplicate of comm) and
    returns a Request at once. All ranks must start their non-blocking collectives on comm
    in the same order; they run in that order. Arguments are checked here, before it starts.

    Raises BackendError when MPI was initialised below MPI_THREAD_MULTIPLE: MPI calls from
    the worker thread, while this thread may make its own, are undefined there."""
    return _start(ALLREDUCE, x, comm, codec, op, out, error_feedback)


def ireduce_scatter(x, comm=MPI.COMM_WORLD, codec=None, op="sum", out=None, error_feedback=None):
    """Non-blocking reduce_scatter, as iallreduce is to allreduce."""
    return _start(REDUCE_SCATTER, x, comm, codec, op, out, error_feedback)


def iallgather(x, comm=MPI.COMM_WORLD, codec=None, out=None, error_feedback=None):
    """Non-blocking allgather, as iallreduce is to allreduce (e.g. AMSP's prefetch of the
    next module's parameters while this one computes)."""
    return _start(ALLGATHER, x, comm, codec, "sum", out, error_feedback)


def _p2p_args(buf, codec, name, comm, peer, peer_name):
    _comm.checked(comm)
    c = wire_codec(codec, "send" if name == "x" else "recv")
    if c.adaptive:  # no collective step to measure or agree in: both ends name the codec
        raise CodecError(f"{'send' if name == 'x' else 'recv'}: codec 'auto' applies to collectives; name the codec "
                         f"both ends use, e.g. {c.inner.spec!r}")
    ptr, n, dt = array_info(buf, name)
    c.check_dtype(name_of(dt), name)
    c.check_memory(False)
    if not isinstance(peer, int) or not (0 <= peer < comm.Get_size() or peer == MPI.ANY_SOURCE):
        raise ArgumentError(f"{peer_name} must be a rank of comm (0..{comm.Get_size() - 1}), got {peer!r}")
    return c, ptr, n, dt


def send(x, dest, comm=MPI.COMM_WORLD, codec=None, tag=0, error_feedback=None):
    """Sends x to rank dest of comm, compressed; the receiver calls recv with an array of the
    same count and dtype and the same codec. Returns when x may be reused."""
    if codec is None:
        codec = _default_codec(x)
    c, ptr, n, dt = _p2p_args(x, codec, "x", comm, dest, "dest")
    rptr = error_feedback._buffer(n, x) if (error_feedback is not None and not c.exact) else 0
    _core.send(comm, ptr, dest, tag, n, dt, c.id, c.block, rptr)


def recv(out, source=MPI.ANY_SOURCE, comm=MPI.COMM_WORLD, codec=None, tag=0):
    """Receives into out (contiguous, the sender's count and dtype) what rank source sent
    with send; returns out. A sender whose count, dtype or codec differ: ShapeMismatchError
    (the message is consumed, the communicator stays usable)."""
    if codec is None:
        codec = _default_codec(out)
    c, ptr, n, dt = _p2p_args(out, codec, "out", comm, source, "source")
    _core.recv(comm, ptr, source, tag, n, dt, c.id, c.block)
    return out
