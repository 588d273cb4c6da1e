"""The torch.distributed backend "mpicomp": unmodified DDP, FSDP2 and DeviceMesh scripts get
mpicomp's compressed collectives by naming it.

    import mpicomp.torch                       # registers the backend
    torch.distributed.init_process_group("mpicomp")   # under mpiexec: rank and size from MPI

It is a ``ProcessGroup`` written in Python (as torch's own threaded test group and torchft's
groups are), registered with ``Backend.register_backend`` so that ``init_process_group``,
``new_group`` and ``init_device_mesh`` make it, and named, so that functional collectives
(FSDP2, DTensor) find it. Every operation runs on the group's MPI communicator in the order
the calls were made, on mpicomp's worker thread (one per group): ``async_op=True`` returns at
once and the work overlaps with the caller's.

What is compressed is configuration (:class:`BackendOptions`): floating-point sums and means
(all_reduce, reduce_scatter_tensor) and gathers (all_gather_into_tensor, all_gather) with
the codec set for them, at least ``mpicomp.config.min_bytes`` long; everything else (max,
min, product, integers, bool, broadcast, all_to_all, send/recv, barrier) goes through MPI
uncompressed and exact. Every collective first agrees on count and dtype, so a tensor whose
size differs between ranks raises ``ShapeMismatchError`` on every rank (through
``work.wait()``), never a hang, and the group stays usable.
"""
import threading
from collections import OrderedDict

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI

import mpicomp

from .. import _comm, _waits
from .._agree import agree
from ..errors import ArgumentError, BackendError, CommTimeoutError
from . import _futures, rendezvous
from ._futures import Work, all_works
from .options import BackendOptions

__all__ = ["ProcessGroupMpicomp"]

_RED = dist.ReduceOp.RedOpType
_EXACT_OPS = {_RED.SUM: MPI.SUM, _RED.MAX: MPI.MAX, _RED.MIN: MPI.MIN, _RED.PRODUCT: MPI.PROD,
              _RED.BAND: MPI.BAND, _RED.BOR: MPI.BOR, _RED.BXOR: MPI.BXOR}
# bool: what torch's reductions mean for truth values
_BOOL_OPS = {_RED.SUM: MPI.LOR, _RED.MAX: MPI.LOR, _RED.BOR: MPI.LOR, _RED.MIN: MPI.LAND, _RED.PRODUCT: MPI.LAND,
             _RED.BAND: MPI.LAND, _RED.BXOR: MPI.LXOR}
_FEEDBACK_STREAMS = 4096  # error-feedback residuals kept (least recently used dropped)


def _apart(x, out):
    """x, or a copy of it where it shares memory with out: FSDP2 gathers in place (each
    rank's input is its slice of the output), which mpicomp's collectives refuse."""
    x = x.contiguous()
    lo, hi = x.data_ptr(), x.data_ptr() + x.numel() * x.element_size()
    olo = out.data_ptr()
    return x.clone() if lo < olo + out.numel() * out.element_size() and olo < hi else x


def _numpy(t):
    """A numpy view of CPU tensor t's memory (bfloat16 as its 16-bit patterns)."""
    t = t.detach()
    return (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy()


class ProcessGroupMpicomp(dist.ProcessGroup):
    """One torch process group over one MPI communicator (ranks in the same order)."""

    def __init__(self, comm, options, timeout_s=None):
        super().__init__(comm.Get_rank(), comm.Get_size())
        self.comm, self.options = comm, options
        self._closed = self._timed_out = False
        # The group's timeout (init_process_group's or new_group's timeout=): every operation
        # on its communicators waits at most this long for the other ranks.
        self.timeout_s = mpicomp.config.timeout_s if timeout_s is None else timeout_s
        mpicomp.set_timeout(comm, self.timeout_s)
        self._acomm, self._executor = _comm.worker(comm)
        # The worker's private duplicate and node layout are made now, while every rank makes
        # the group, rather than in the group's first operation, where MPI's blocking
        # MPI_Comm_dup would wait for a late rank without the group's timeout.
        mpicomp.node_layout(self._acomm)
        self._feedback = OrderedDict()
        # Point-to-point on a communicator of its own: tags of the user's choosing never meet
        # the collectives' messages.
        self._p2p_comm = comm.Dup()
        self._name = None

    # -- naming: functional collectives (FSDP2) find a group by its name ------------------
    def _set_group_name(self, name):
        self._name = name
        super()._set_group_name(name)

    @property
    def group_name(self):
        return self._name

    def getBackendName(self):
        return "mpicomp"

    # -- plumbing --------------------------------------------------------------------------
    def _done(self, req, result):
        """A Work completed when the mpicomp Request ``req`` is, with ``result`` (or its error)."""
        return Work(_futures.from_request(req, lambda: result))

    def _exact(self, result, fn, *tensors):
        """Runs fn(comm) on the worker, after the ranks agreed on the tensors' sizes; comm's
        collectives wait at most the group's timeout. After one timed out, the group's exact
        operations raise at once (MPI cannot cancel it: its messages may still arrive)."""
        shapes = [(t.numel(), str(t.dtype)) for t in tensors]

        def run():
            if self._timed_out:
                raise CommTimeoutError("mpicomp backend: an earlier operation of this group timed out; its messages "
                                       "may still arrive, so the group is not used again: make a new one")
            c = _waits.Timed(self._acomm, self.timeout_s)
            try:
                agree([c], "mpicomp backend", None, shapes,
                      lambda sh: f"tensors (numel, dtype) {sh}")
                fn(c)
            except CommTimeoutError:
                self._timed_out = True
                raise

        return self._done(mpicomp.Request(self._executor, run), result)

    def _compressible(self, t, op=None):
        return t.is_floating_point() and t.device.type == "cpu" and (op is None or op in (_RED.SUM, _RED.AVG))

    def _ef(self, kind, t):
        if not self.options.error_feedback or mpicomp.codec(self.options.codecs[kind]).exact:
            return None
        key = (kind, t.data_ptr(), t.numel())
        ef = self._feedback.pop(key, None) or mpicomp.ErrorFeedback()
        self._feedback[key] = ef
        if len(self._feedback) > _FEEDBACK_STREAMS:
            self._feedback.popitem(last=False)
        return ef

    # -- reductions ------------------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        (t,) = tensors
        op = _op(opts.reduceOp if opts else _RED.SUM)
        if self._compressible(t, op):
            req = mpicomp.iallreduce(t, comm=self.comm, codec=self.options.codecs["allreduce"],
                                     op="avg" if op == _RED.AVG else "sum", out=t,
                                     error_feedback=self._ef("allreduce", t))
            return self._done(req, tensors)
        return self._exact(tensors, lambda c: _reduce_in_place(c, t, op), t)

    def allreduce_coalesced(self, tensors, opts=None):
        return all_works([self.allreduce([t], opts) for t in tensors], tensors)

    def reduce_scatter_single(self, out, inp, opts=None):
        op = _op(opts.reduceOp if opts else _RED.SUM)
        if self._compressible(inp, op) and out.dtype == inp.dtype:
            req = mpicomp.ireduce_scatter(_apart(inp, out), comm=self.comm, codec=self.options.codecs["reduce_scatter"],
                                          op="avg" if op == _RED.AVG else "sum", out=out.view(-1),
                                          error_feedback=self._ef("reduce_scatter", out))
            return self._done(req, [out])

        def run(c):
            whole = inp.clone()
            _reduce_in_place(c, whole, op)
            out.view(-1).copy_(whole.view(-1)[c.Get_rank() * out.numel():(c.Get_rank() + 1) * out.numel()])
        return self._exact([out], run, inp)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        (out,), (parts,) = outputs, input_lists
        return self.reduce_scatter_single(out, torch.cat([p.reshape(-1) for p in parts]), opts)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        return all_works([self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    # -- gathers ---------------------------------------------------------------------------
    def all_gather_single(self, out, inp, opts=None):
        if self._compressible(inp) and out.dtype == inp.dtype:
            req = mpicomp.iallgather(_apart(inp, out), comm=self.comm, codec=self.options.codecs["allgather"],
                                     out=out.view(-1), error_feedback=self._ef("allgather", inp))
            return self._done(req, [out])
        return self._exact([out], lambda c: c.Allgather(_numpy(_apart(inp, out)), _numpy(out)), inp)

    def allgather(self, output_lists, inputs, opts=None):
        (outs,), (inp,) = output_lists, inputs
        flat = torch.empty(len(outs) * inp.numel(), dtype=inp.dtype)

        def scatter(_):
            for o, part in zip(outs, flat.chunk(len(outs))):
                o.copy_(part.view_as(o))
            return output_lists

        return Work(_futures.then(self.all_gather_single(flat, inp, opts).fut, scatter))

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return all_works([self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    # -- the rest: MPI, exact --------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        (t,) = tensors
        return self._exact(tensors, lambda c: c.Bcast(_numpy(t), root=opts.rootRank), t)

    def reduce(self, tensors, opts=None):
        (t,) = tensors
        op = _op(opts.reduceOp)

        def run(c):
            result = t.clone()  # the root's result; the others' tensors stay as they were
            _reduce_in_place(c, result, op)
            if c.Get_rank() == opts.rootRank:
                t.copy_(result)
        return self._exact(tensors, run, t)

    def gather(self, output_lists, inputs, opts=None):
        (t,) = inputs
        root = self.rank() == opts.rootRank

        def run(c):
            flat = torch.empty(c.Get_size() * t.numel(), dtype=t.dtype) if root else None
            c.Gather(_numpy(t.contiguous()), _numpy(flat) if root else None, root=opts.rootRank)
            if root:
                for o, part in zip(output_lists[0], flat.chunk(c.Get_size())):
                    o.copy_(part.view_as(o))
        return self._exact(output_lists, run, t)

    def scatter(self, outputs, input_lists, opts=None):
        (t,) = outputs
        root = self.rank() == opts.rootRank

        def run(c):
            flat = torch.cat([x.reshape(-1) for x in input_lists[0]]) if root else None
            c.Scatter(_numpy(flat) if root else None, _numpy(t), root=opts.rootRank)
        return self._exact(outputs, run, t)

    def alltoall(self, outputs, inputs, opts=None):
        so, si = [o.numel() for o in outputs], [i.numel() for i in inputs]

        def run(c):
            o, i = torch.cat([x.reshape(-1) for x in outputs]), torch.cat([x.reshape(-1) for x in inputs])
            c.Alltoallv([_numpy(i), (si, np.cumsum([0] + si[:-1]).tolist())],
                        [_numpy(o), (so, np.cumsum([0] + so[:-1]).tolist())])
            for x, part in zip(outputs, o.split(so)):
                x.copy_(part.view_as(x))
        return self._exact(outputs, run, *inputs)

    def barrier(self, opts=None):
        return self._exact([], lambda c: c.Barrier())

    def alltoall_base(self, out, inp, out_splits, in_splits, opts=None):
        p = self.size()
        row_out, row_in = out[0].numel() if out.dim() else 1, inp[0].numel() if inp.dim() else 1
        so = [s * row_out for s in out_splits] if out_splits else [out.numel() // p] * p
        si = [s * row_in for s in in_splits] if in_splits else [inp.numel() // p] * p

        def run(c):
            o, i = _numpy(out).reshape(-1), _numpy(inp.contiguous()).reshape(-1)
            c.Alltoallv([i, (si, np.cumsum([0] + si[:-1]).tolist())], [o, (so, np.cumsum([0] + so[:-1]).tolist())])
        return self._exact([out], run)

    def send(self, tensors, dst, tag):
        (t,) = tensors
        return self._p2p(self._p2p_comm.Isend(_numpy(t.contiguous()), dest=dst, tag=tag), tensors)

    def recv(self, tensors, src, tag):
        (t,) = tensors
        return self._p2p(self._p2p_comm.Irecv(_numpy(t), source=src, tag=tag), tensors, recv=True)

    def _p2p(self, req, result, recv=False):
        # Point-to-point completes apart from the collectives' queue: a receive must not hold
        # up the collectives started after it (torch's groups behave so). Its thread waits
        # at most the group's timeout, then cancels the request; any error reaches wait().
        fut = torch.futures.Future()
        timeout = self.timeout_s

        def wait():
            try:
                _waits.wait(req, timeout, "mpicomp backend: send/recv (the group's timeout)")
                fut.set_result(result)
            except CommTimeoutError as e:
                # A receive is cancelled: a late message must not land in a tensor given up
                # on. A send cannot be taken back (MPI-4): it completes when matched.
                if recv:
                    req.Cancel()
                    req.Wait()
                fut.set_exception(e)
            except Exception as e:  # noqa: BLE001 -- handed to whoever waits
                fut.set_exception(e)

        threading.Thread(target=wait, daemon=True).start()
        return Work(fut)

    # -- the end ---------------------------------------------------------------------------
    def shutdown(self):
        """Waits for the operations started, then frees the group's communicators
        (``destroy_process_group`` calls it)."""
        self._close(wait=True)

    def abort(self):
        """Drops the operations not yet started and leaves those running to MPI; the group's
        communicators are not freed (MPI may still use them). Later operations raise."""
        self._close(wait=False)

    def _close(self, wait):
        if self._closed:
            return
        self._closed = True
        if not wait:
            self._executor.shutdown(wait=False, cancel_futures=True)
            return
        if not MPI.Is_finalized():
            # Freeing comm frees its private duplicates and stops its worker (mpicomp._comm).
            for c in (self._p2p_comm, self.comm):
                if c != MPI.COMM_NULL and c not in (MPI.COMM_WORLD, MPI.COMM_SELF):
                    c.Free()


def _op(reduce_op):
    op = getattr(reduce_op, "op", reduce_op)
    if op not in _EXACT_OPS and op != _RED.AVG:
        raise ArgumentError(f"mpicomp backend: reduce op {op} is not supported (SUM, AVG, MAX, MIN, PRODUCT, "
                            f"BAND, BOR, BXOR are)")
    return op


def _reduce_in_place(comm, t, op):
    """An exact reduction of CPU tensor t over comm, in place."""
    if t.dtype == torch.bool:
        buf = t.view(torch.uint8).numpy()
        comm.Allreduce(MPI.IN_PLACE, buf, op=_BOOL_OPS.get(op, MPI.LOR))
        return
    if op == _RED.AVG and not t.is_floating_point():
        raise ArgumentError(f"mpicomp backend: AVG of {t.dtype} (an integer type) is not defined")
    wide = t.dtype in (torch.float16, torch.bfloat16)  # MPI has no reduction for them: float32
    work = t.float() if wide else t
    buf = work.detach().numpy()
    comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM if op == _RED.AVG else _EXACT_OPS[op])
    if op == _RED.AVG:
        work.div_(comm.Get_size())
    if wide:
        t.copy_(work)


def _create(dist_opts, options):
    """The backend's creator (extended API): the group's MPI communicator, same rank order."""
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        raise BackendError("mpicomp backend: MPI was initialised below MPI_THREAD_MULTIPLE, but the group runs MPI "
                           "on its worker thread and send/recv threads: leave mpi4py.rc.thread_level at "
                           "'multiple' (its default)")
    world = MPI.COMM_WORLD
    ranks = list(dist_opts.global_ranks_in_group)
    if not ranks:  # the default group: torch's ranks must be MPI's
        if (dist_opts.group_rank, dist_opts.group_size) != (world.Get_rank(), world.Get_size()):
            raise ArgumentError(f"mpicomp backend: torch rank {dist_opts.group_rank} of {dist_opts.group_size} is MPI "
                                f"rank {world.Get_rank()} of {world.Get_size()}: start the processes with mpiexec and "
                                f"leave RANK and WORLD_SIZE unset (or equal to MPI's)")
        comm = world.Dup()
    else:
        group = world.Get_group().Incl(ranks)
        comm = world.Create_group(group, tag=7)
        group.Free()
    if not isinstance(options, BackendOptions):
        options = BackendOptions()
    timeout = getattr(dist_opts, "timeout", None)
    return ProcessGroupMpicomp(comm, options, timeout.total_seconds() if timeout else None)


if "MPICOMP" not in dist.Backend._plugins:  # registered once per process, whoever imports first
    dist.Backend.register_backend("mpicomp", _create, extended_api=True, devices=["cpu"])
    rendezvous.install_rendezvous()  # init_process_group("mpicomp") only (rendezvous.py)
