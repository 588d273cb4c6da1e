"""The AMSP optimizer: ZeRO generalised to three sharding degrees (Chen et al., "AMSP:
Reducing Communication Overhead of ZeRO for Efficient LLM Training", arXiv 2311.00257)."""

import time
import zlib

import torch
from mpi4py import MPI

import mpicomp

from ...codecs import wire_codec
from ...errors import ArgumentError, MpicompError
from ...nodes import node_layout
from ..._agree import agree
from ... import _comm
from ..._waits import Timed
from .._sharded import ShardedOptimizer, build_optimizer, owned_dup, state_bytes, timed_dup
from . import checkpoint
from .groups import GROUPS, Groups, check_partition, check_ranks_per_node
from .plan import communication_plan, memory_bytes
from .units import Hooks, check_model, make_units

__all__ = ["AMSP"]


class AMSP(torch.optim.Optimizer):
    """Parameters sharded over s_p ranks, gradients over s_g, optimizer state and fp32 master
    parameters over s_os (s_p <= s_g <= s_os, nested; groups as in groups.py).

    A step, as the paper's communication plan (section 4.3) runs it:

    1. forward and backward of each module that owns parameters: with s_p > 1 its
       parameters are allgathered over its parameter group before its forward and again
       before its backward, and released after each. The gather of the module that runs
       next is started (mpicomp.iallgather) as soon as this one's parameters are in, so it
       travels while this module computes: the order is the one the previous forward and
       backward passes ran in (as PyTorch FSDP's prefetch records it); where a pass departs
       from it, prefetching stops until the next pass;
    2. when a module's gradients are complete, they are reduce-scattered (op "avg") over the
       gradient group into this rank's gradient shard (summed over micro-batches until
       ``zero_grad``) and the full gradients are dropped;
    3. ``step()``: the gradient shard is reduce-scattered over the state group into the
       optimizer-state shards' pieces, and each piece averaged over the replica group (the
       ranks owning the same optimizer-state shard), so it is the mean over all ranks;
    4. the wrapped optimizer steps this rank's fp32 master shard (a slice of the gradient
       shard's range) with that mean gradient;
    5. the update group allgathers the updated shards, in the parameters' dtype, into this
       rank's parameter shard (with s_p = 1: the whole model).

    (1, 1, 1) is data parallelism with an allreduce, (1, 1, N) ZeRO-1, (1, N, N) ZeRO-2 and
    (N, N, N) ZeRO-3. Every rank decodes the same bytes in each allgather and allreduce, so
    the replicas stay bit-identical, also with lossy codecs.

    Args:
        model: the torch.nn.Module, identical (shapes and values) on every rank. Each
            module's parameters must only be used in its own forward (no weight tying).
            With s_p > 1 its parameters hold no memory outside forward/backward: read them
            with ``full_parameters()``.
        optimizer_class: an elementwise torch.optim.Optimizer subclass (AdamW, Adam, SGD).
        shard: (s_p, s_g, s_os); see ``mpicomp.optim.amsp.plan`` to choose one.
        comm: the data-parallel communicator (``mesh.dp`` or COMM_WORLD).
        ranks_per_node: ranks per node (ranks are assumed placed in blocks: node i holds
            ranks i*rpn ... (i+1)*rpn-1); default: from ``mpicomp.node_layout(comm)``, the
            nodes the collectives' two levels use (MPI_COMM_TYPE_SHARED, or
            ``config.ranks_per_node`` / MPICOMP_RANKS_PER_NODE for emulated nodes), which
            must then be blocks of equal size.
        codec: wire codec of every collective, or {"intra": spec, "inter": spec} by whether
            a collective's group spans nodes (e.g. {"intra": "none", "inter": "int8"}).
        error_feedback: with a lossy codec on the gradients' collectives (the s_g
            reduce-scatter of each module, the state reduce-scatter, the replica allreduce),
            carry what it dropped into the next step's gradients, one residual per
            collective and module (mpicomp.ErrorFeedback). Residuals are not checkpointed.
        prefetch: with s_p > 1, start the next module's gather while this one computes
            (step 1). It holds one more module's parameters at a time; False gathers each
            module only when it runs (the memory of one module at a time).
        timeout: seconds (or a ``datetime.timedelta``) its calls wait for the other ranks
            before raising CommTimeoutError, as torch's ``timeout=``; 0: no limit. None:
            ``comm``'s own (``mpicomp.set_timeout``), else ``config.timeout_s`` (30 minutes).
        **opt_kwargs: passed to ``optimizer_class``.

    Attributes:
        stats: {"comm_wait_s": seconds in this rank's collectives from the end of the
            previous step to the end of the last one (forward, backward and step)}.

    Raises:
        ArgumentError: a bad argument on this rank (invalid partition: order, not dividing,
            larger than the world, not nested, straddling nodes; bad codec; kwargs the class
            rejects); ShapeMismatchError on the other ranks, and on every rank when the
            ranks' models or arguments differ. Nothing is sent before all ranks agree.
    """

    def __init__(self, model, optimizer_class, shard, comm=MPI.COMM_WORLD, ranks_per_node=None, codec="none",
                 error_feedback=False, prefetch=True, timeout=None, **opt_kwargs):
        who = "AMSP"
        _comm.checked(comm, who, intra=True, hint="e.g. mesh.dp")
        self.comm, bad_timeout = timed_dup(self, comm, timeout)
        world, rank = comm.Get_size(), comm.Get_rank()
        self._meta = Timed(owned_dup(self, self.comm))  # agreements and metadata: at most the timeout
        layout = node_layout(comm) if ranks_per_node is None else None  # collective: before any raise
        error, signature = None, None
        try:
            if bad_timeout is not None:
                raise bad_timeout
            if layout is not None:
                ranks_per_node = layout.block
                if ranks_per_node is None:
                    raise ArgumentError(f"{who}: the nodes of comm are not blocks of consecutive ranks of equal "
                                        f"size ({layout.node_of}): pass ranks_per_node")
            if not isinstance(model, torch.nn.Module):
                raise ArgumentError(f"{who}: model must be a torch.nn.Module, got {type(model).__name__}")
            groups = ShardedOptimizer._check(model.parameters(), optimizer_class, "none", "none", False, ())
            problem = check_model(model)
            if problem:
                raise ArgumentError(f"{who}: {problem}")
            if len({p.dtype for p in groups[0]["params"]}) > 1:
                raise ArgumentError(f"{who}: all parameters must have one dtype, got "
                                    f"{sorted({str(p.dtype) for p in groups[0]['params']})}")
            self.ranks_per_node = check_ranks_per_node(ranks_per_node, world, who)
            self.shard = check_partition(shard, world, self.ranks_per_node, who)
            self.codecs = _codecs(codec, who)
            for name, flag in (("error_feedback", error_feedback), ("prefetch", prefetch)):
                if not isinstance(flag, bool):
                    raise ArgumentError(f"{who}: {name} must be a bool, got {flag!r}")
            build_optimizer(optimizer_class, groups, [torch.zeros(1)], opt_kwargs)  # the class takes them?
            crc = 0
            for p in groups[0]["params"]:
                crc = zlib.crc32(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes(), crc)
            signature = (f"{optimizer_class.__module__}.{optimizer_class.__qualname__}",
                         [(tuple(p.shape), str(p.dtype)) for p in groups[0]["params"]], crc,
                         sorted((k, repr(v)) for k, v in opt_kwargs.items()), self.shard, self.ranks_per_node,
                         sorted(self.codecs.items()), error_feedback, prefetch)
        except MpicompError as e:
            error = e
        agree([self._meta], who, error, signature, _describe)
        super().__init__(groups, dict(opt_kwargs))
        self.optimizer_class, self.model = optimizer_class, model
        self.groups = Groups(self.shard, world, rank)
        # Split is collective over comm: every rank makes every group, in this order.
        self.comms = {g: self.comm.Split(self.groups.color[g], self.groups.key[g]) for g in GROUPS}
        _comm.inherit_timeout(self.comm, self.comms.values())
        self.wire = {g: self.codecs["inter" if self.groups.spans_nodes(g, self.ranks_per_node) else "intra"]
                     for g in GROUPS}
        self.error_feedback, self._feedback, self.prefetch = error_feedback, {}, prefetch
        s_p, s_g, s_os = self.shard
        self.units = make_units(model, s_os, sharded=s_p > 1)
        for i, u in enumerate(self.units):
            u.index = i
        dtype, dev = self.units[0].full.dtype, self.units[0].full.device
        sizes = [u.padded for u in self.units]
        self._p_at, self._g_at, self._os_at = _offsets(sizes, s_p), _offsets(sizes, s_g), _offsets(sizes, s_os)
        self.p_shard = torch.zeros(self._p_at[-1], dtype=dtype, device=dev)
        self.g_shard = torch.zeros(self._g_at[-1], dtype=dtype, device=dev)
        self.master = torch.zeros(self._os_at[-1], dtype=torch.float32, device=dev)
        jp, jo = self.groups.index["param"], self.groups.index["os"]
        for i, u in enumerate(self.units):
            flat = u.flat_values()
            k, ko = u.padded // s_p, u.padded // s_os
            self._p_slice(u)[:] = flat[jp * k:(jp + 1) * k]
            self.master[self._os_at[i]:self._os_at[i + 1]] = flat[jo * ko:(jo + 1) * ko].float()
            if s_p == 1:  # the parameter shard is the model: parameters are views of it
                u.adopt(self._p_slice(u))
            else:
                u.adopt()
                u.release()
        self.inner = build_optimizer(optimizer_class, self.param_groups, [self.master], opt_kwargs)
        self.param_groups[0].update({k: v for k, v in self.inner.param_groups[0].items() if k != "params"})
        # Prefetch (step 1): gathers by phase in the last complete pass, and in this one so far.
        self._order, self._seen, self._phase = {"forward": [], "backward": []}, {"forward": [], "backward": []}, None
        self._inflight = {}  # unit index -> the Request of its prefetched gather
        self.hooks = Hooks(self.units, self._gather, self._forwarded, self._reduce_scatter)
        self._waited = 0.0  # seconds in collectives since the last step
        self.stats = {"comm_wait_s": 0.0}

    # -- the step --------------------------------------------------------------------

    def _gather(self, unit, phase):
        """Step 1: the unit's parameters from the parameter group's shards (waiting for its
        prefetch if one is under way); then the prefetch of the next unit of this phase."""
        if phase != self._phase:  # a new pass: the one before it is the order to follow
            if self._phase is not None and self._seen[self._phase]:
                self._order[self._phase] = self._seen[self._phase]
            self._seen[phase], self._phase = [], phase
        seen = self._seen[phase]
        seen.append(unit.index)
        request = self._inflight.pop(unit.index, None)
        if request is not None or not unit.gathered:
            start = time.perf_counter()
            if request is not None:
                request.wait()
            else:
                unit.reserve()
                mpicomp.allgather(self._p_slice(unit), comm=self.comms["param"], codec=self.wire["param"],
                                  out=unit.full)
            self._waited += time.perf_counter() - start
        order = self._order[phase]
        if self.prefetch and len(seen) < len(order) and order[:len(seen)] == seen:  # on the recorded path
            self._prefetch(order[len(seen)])

    def _forwarded(self, unit):
        """After the last unit of a forward pass that a backward may follow: prefetch the
        unit the backward starts with (in a transformer, the one just released)."""
        order, seen = self._order["forward"], self._seen["forward"]
        if self.prefetch and self._phase == "forward" and seen == order and self._order["backward"]:
            self._prefetch(self._order["backward"][0])

    def _prefetch(self, i):
        unit = self.units[i]
        if i in self._inflight or unit.gathered:
            return
        unit.reserve()
        self._inflight[i] = mpicomp.iallgather(self._p_slice(unit), comm=self.comms["param"],
                                               codec=self.wire["param"], out=unit.full)

    def _drain(self):
        """Completes the prefetches under way (before the parameter shards change)."""
        for i, request in self._inflight.items():
            request.wait()
            self.units[i].release()
        self._inflight = {}

    def _p_slice(self, unit):
        return self.p_shard[self._p_at[unit.index]:self._p_at[unit.index + 1]]

    @torch.no_grad()
    def _reduce_scatter(self, unit):
        """Step 2: the unit's gradient into this rank's gradient shard."""
        i = unit.index
        flat = unit.flat_grads()
        if self.shard[1] > 1:
            start = time.perf_counter()
            flat = mpicomp.reduce_scatter(flat, comm=self.comms["grad"], codec=self.wire["grad"], op="avg",
                                          error_feedback=self._residual("grad", i))
            self._waited += time.perf_counter() - start
        self.g_shard[self._g_at[i]:self._g_at[i + 1]] += flat
        for p in unit.params:
            p.grad = None
        unit.release()

    @torch.no_grad()
    def step(self, closure=None):
        """Steps 3-5 with the gradients of the backward passes since ``zero_grad``; with a
        closure, calls it first (with grad enabled) and returns its loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for u in self.units:  # modules some of whose parameters got no gradient
            if u.ready:
                u.ready = 0
                self._reduce_scatter(u)
        start = time.perf_counter()
        grad = self._state_gradient()
        self._waited += time.perf_counter() - start
        for k, v in self.param_groups[0].items():
            if k != "params":
                self.inner.param_groups[0][k] = v
        self.master.grad = grad
        self.inner.step()
        self.master.grad = None
        start = time.perf_counter()
        self._redistribute()
        self.stats = {"comm_wait_s": self._waited + time.perf_counter() - start}
        self._waited = 0.0
        return loss

    def _state_gradient(self):
        """Step 3: the mean gradient of this rank's optimizer-state shard, in fp32. Each
        unit's gradient shard is c state shards' pieces: laid out member by member, the
        state group's reduce-scatter leaves each member its pieces of every unit."""
        c = self.comms["state"].Get_size()
        by_member = torch.cat([self.g_shard[self._g_at[i]:self._g_at[i + 1]].view(c, -1)
                               for i in range(len(self.units))], dim=1)
        if c > 1:
            grad = mpicomp.reduce_scatter(by_member, comm=self.comms["state"], codec=self.wire["state"], op="avg",
                                          error_feedback=self._residual("state"))
        else:
            grad = by_member.view(-1)
        if self.comms["replica"].Get_size() > 1:
            grad = mpicomp.allreduce(grad, comm=self.comms["replica"], codec=self.wire["replica"], op="avg",
                                     error_feedback=self._residual("replica"))
        return grad.float()

    def _residual(self, group, unit=None):
        """The ErrorFeedback of one gradient stream (a group's collective, per module for
        the s_g reduce-scatter); None without error feedback or with an exact codec."""
        if not self.error_feedback or mpicomp.codec(self.wire[group]).exact:
            return None
        return self._feedback.setdefault((group, unit), mpicomp.ErrorFeedback())

    def _redistribute(self):
        """Step 5: the update group's master shards, in order, make this rank's parameter
        shard; each unit's piece of it is the unit's slices of every member's shard."""
        self._drain()
        update = self.comms["update"]
        mine = self.master.to(self.p_shard.dtype)
        rows = mine.view(1, -1)
        if update.Get_size() > 1:
            rows = mpicomp.allgather(mine, comm=update, codec=self.wire["update"]).view(update.Get_size(), -1)
        for i, u in enumerate(self.units):
            self._p_slice(u)[:] = rows[:, self._os_at[i]:self._os_at[i + 1]].reshape(-1)
            u.release()  # a copy still gathered (a forward that raised) is stale now

    def zero_grad(self, set_to_none=True):
        """Clears the gradient shard and any parameter's ``.grad`` (``set_to_none`` is
        accepted for torch.optim's signature: the shard is always zeroed)."""
        self.g_shard.zero_()
        for u in self.units:
            u.ready = 0
            for p in u.params:
                p.grad = None

    # -- reading the state -----------------------------------------------------------

    def state_dict(self):
        """The whole optimizer state, in ZeRO1's checkpoint format (collective: every rank
        gets the same dict); loads under any partition or rank count, and into ZeRO1."""
        return checkpoint.state_dict(self)

    def load_state_dict(self, state_dict):
        """Restores a state_dict() of AMSP or ZeRO1 (collective).

        Raises:
            CheckpointError: not a checkpoint of this format or optimizer class, or
                corrupt; on every rank.
            ShapeMismatchError: another model's, or ranks loaded different checkpoints.
        """
        checkpoint.load_state_dict(self, state_dict)

    def full_parameters(self):
        """Every parameter, flat, in ``model.parameters()`` order, on every rank (collective
        over comm): exact copies of the parameter shards."""
        s_p = self.shard[0]
        rows = self.p_shard.view(1, -1)
        if s_p > 1:
            rows = mpicomp.allgather(self.p_shard, comm=self.comms["param"], codec="none").view(s_p, -1)
        return torch.cat([rows[:, self._p_at[i]:self._p_at[i + 1]].reshape(-1)[:u.numel]
                          for i, u in enumerate(self.units)])

    def optimizer_state_bytes(self):
        """Bytes of the wrapped optimizer's state tensors on this rank (as ZeRO1's)."""
        return state_bytes(self.inner)

    def memory(self):
        """Bytes this rank holds now for parameters (its shard, and gathered modules),
        gradients (its shard, and any ``.grad``) and optimizer state (the fp32 master shard
        and the wrapped optimizer's state), beside the planner's formula for this model."""
        params = self.p_shard.numel() * self.p_shard.element_size() + sum(u.held_bytes() for u in self.units)
        grads = self.g_shard.numel() * self.g_shard.element_size() + sum(
            p.grad.numel() * p.grad.element_size() for u in self.units for p in u.params if p.grad is not None)
        state = self.master.numel() * 4 + self.optimizer_state_bytes()
        e = self.p_shard.element_size()
        model = memory_bytes(sum(u.numel for u in self.units), self.shard, 0, e, e, 12)
        return {"params": params, "grads": grads, "optimizer": state, "formula": model}

    def communication_plan(self, micro_batches=1, **bandwidths):
        """The collectives of one step of this optimizer (plan.communication_plan with this
        model's padded size, module count and dtype)."""
        e = self.p_shard.element_size()
        return communication_plan(sum(u.padded for u in self.units), self.shard, self.comm.Get_size(),
                                  self.ranks_per_node, e, e, len(self.units), micro_batches, **bandwidths)


def _offsets(sizes, parts):
    out = [0]
    for n in sizes:
        out.append(out[-1] + n // parts)
    return out


def _codecs(codec, who):
    spec = codec if isinstance(codec, dict) else {"intra": codec, "inter": codec}
    if set(spec) != {"intra", "inter"}:
        raise ArgumentError(f"{who}: codec must be a codec spec or a dict with keys 'intra' and 'inter', got {codec!r}")
    out = {}
    for k, v in spec.items():
        out[k] = wire_codec(v, f"{who}: codec[{k!r}]").spec  # with its options: int4:block=32 stays so
    return out


def _describe(sig):
    if sig is None:
        return "no signature"
    cls, shapes, crc, kwargs, shard, rpn, codecs, feedback, prefetch = sig
    return (f"{cls} over {len(shapes)} tensors (shapes {[s for s, _ in shapes][:6]}..., values crc {crc}), kwargs "
            f"{dict(kwargs)}, shard {shard}, ranks_per_node {rpn}, codecs {dict(codecs)}, error_feedback {feedback}, "
            f"prefetch {prefetch}")
