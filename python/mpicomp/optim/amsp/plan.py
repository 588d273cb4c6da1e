"""AMSP's planner: which (s_p, s_g, s_os) to train with (Chen et al., "AMSP: Reducing
Communication Overhead of ZeRO for Efficient LLM Training", arXiv 2311.00257, section 4).

Memory per rank, for F parameters in mixed precision with Adam (the paper's model, after
ZeRO, Rajbhandari et al., arXiv 1910.02054, section 3.1)::

    param_bytes * F / s_p + grad_bytes * F / s_g + state_bytes * F / s_os + activation_bytes

with param_bytes = grad_bytes = 2 (bf16 or fp16) and state_bytes = 12 (the fp32 master copy,
Adam's two fp32 moments). mpicomp's AMSP keeps the same three shards; with fp32 model
parameters pass param_bytes = grad_bytes = 4.

Communication per step is the sequence of collectives AMSP's optimizer runs (see
``communication_plan``), each on one of the four groups of groups.py; its bytes are what
``mpicomp.stats()`` counts as ``bytes_wire`` with codec "none" (an allgather of k bytes per
rank over p ranks sends (p - 1) k, a reduce-scatter of n bytes (p - 1) n / p, an allreduce
2 (p - 1) n / p). Its time: per call, ``latency`` per ring step (p - 1 for allgather and
reduce-scatter, 2 (p - 1) for allreduce), plus bytes over ``inter_bandwidth`` when the
group spans nodes, else over ``intra_bandwidth``. Both bandwidths are per rank, with every
rank of a node communicating at once (a node's NIC bandwidth divided by its ranks, when
they share one). Calls are not overlapped with computation: the model ranks partitions by
communication time, it does not predict step time.

The planner returns the valid partition with the least modelled time that fits in
``memory_per_rank`` (ties: less memory, then the smaller partition).
"""

import json
from dataclasses import dataclass, field

from ...errors import ArgumentError, MpicompError
from .groups import Groups, check_ranks_per_node, valid_partitions

__all__ = ["plan", "Plan", "Candidate", "Collective", "PlanError", "memory_bytes", "communication_plan",
           "bandwidth_from_bench"]


class PlanError(MpicompError, ValueError):
    """No valid partition fits in the memory given to the planner."""


@dataclass(frozen=True)
class Collective:
    """One kind of collective in a step: ``calls`` calls over a group of ``size`` ranks,
    ``bytes`` sent per rank in all of them together (mpicomp.stats()' bytes_wire)."""
    op: str
    what: str
    group: str
    size: int
    spans_nodes: bool
    calls: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class Candidate:
    shard: tuple
    memory: dict          # bytes per rank: "params", "grads", "optimizer", "activations", "total"
    collectives: tuple    # of Collective, in the order a step runs them
    fits: bool

    @property
    def seconds(self):
        return sum(c.seconds for c in self.collectives)

    @property
    def bytes(self):
        return sum(c.bytes for c in self.collectives)


def memory_bytes(num_params, shard, activation_bytes=0, param_bytes=2, grad_bytes=2, state_bytes=12):
    """Bytes per rank of each part of the model state under ``shard`` (module docstring)."""
    s_p, s_g, s_os = shard
    mem = {"params": param_bytes * num_params / s_p, "grads": grad_bytes * num_params / s_g,
           "optimizer": state_bytes * num_params / s_os, "activations": activation_bytes}
    mem["total"] = sum(mem.values())
    return mem


def communication_plan(num_params, shard, world_size, ranks_per_node, param_bytes=2, grad_bytes=2,
                       modules=1, micro_batches=1, intra_bandwidth=100e9, inter_bandwidth=12.5e9, latency=10e-6):
    """The collectives of one AMSP step, in order, as a tuple of Collective (groups of one
    rank send nothing and are left out). ``num_params`` must be a multiple of s_os for the
    byte counts to be exact (the optimizer pads every module's parameters to one).

    Per micro-batch, with s_p > 1, every module gathers its parameters over the parameter
    group before its forward and again before its backward; with s_g > 1, it reduce-scatters
    its gradient over the gradient group after its backward. Once per step the gradient
    shard is reduce-scattered over the state group into optimizer-state shards, these are
    averaged over the replica group, and the updated shards are gathered over the update
    group into the parameter shards."""
    s_p, s_g, s_os = shard
    lead = Groups(shard, world_size, 0)
    steps = []

    def add(op, what, group, calls, repeat, bytes_in):
        # bytes_in: the input of all `calls / repeat` calls of one micro-batch together; the
        # bytes sent are linear in it (exactly, as each module's share divides by the group).
        p = lead.size(group)
        if p == 1:
            return
        spans = lead.spans_nodes(group, ranks_per_node)
        sent = repeat * _sent(op, p, bytes_in)
        rounds = 2 * (p - 1) if op == "allreduce" else p - 1
        seconds = calls * rounds * latency + sent / (inter_bandwidth if spans else intra_bandwidth)
        steps.append(Collective(op, what, group, p, spans, calls, sent, seconds))

    per_step = modules * micro_batches
    add("allgather", "parameters before forward", "param", per_step, micro_batches, num_params // s_p * param_bytes)
    add("allgather", "parameters before backward", "param", per_step, micro_batches, num_params // s_p * param_bytes)
    add("reduce_scatter", "gradients after backward", "grad", per_step, micro_batches, num_params * grad_bytes)
    add("reduce_scatter", "gradient shard into state shards", "state", 1, 1, num_params // s_g * grad_bytes)
    add("allreduce", "state shard's gradient across replicas", "replica", 1, 1, num_params // s_os * grad_bytes)
    add("allgather", "updated parameters into shards", "update", 1, 1, num_params // s_os * param_bytes)
    return tuple(steps)


@dataclass
class Plan:
    """The planner's answer: ``shard`` (the pick), ``candidates`` (every valid partition:
    the ones that fit by modelled time, then the others by memory) and ``inputs``."""
    shard: tuple
    candidates: list
    inputs: dict = field(default_factory=dict)

    @property
    def best(self):
        return self.candidates[0]

    def explain(self, top=None):
        """The inputs, the pick's step as a sequence of collectives, and the ranking (the
        first ``top`` candidates; all by default)."""
        i = self.inputs
        lines = [f"# AMSP plan: {i['num_params']:.4g} parameters on {i['world_size']} ranks "
                 f"({i['ranks_per_node']} per node), {_gb(i['memory_per_rank'])} per rank",
                 f"# activations {_gb(i['activation_bytes'])}, bytes/element: params {i['param_bytes']}, "
                 f"grads {i['grad_bytes']}, optimizer state {i['state_bytes']}",
                 f"# bandwidth per rank: intra-node {_gb(i['intra_bandwidth'])}/s, inter-node "
                 f"{_gb(i['inter_bandwidth'])}/s; latency {i['latency'] * 1e6:.3g} us; {i['modules']} modules, "
                 f"{i['micro_batches']} micro-batches per step",
                 f"shard (s_p, s_g, s_os) = {self.shard}: {_gb(self.best.memory['total'])} per rank, "
                 f"{self.best.seconds * 1e3:.4g} ms of communication per step", "",
                 "# step   collective      group    ranks  link   calls  bytes/rank  ms  (what)"]
        for n, c in enumerate(self.best.collectives, 1):
            lines.append(f"  {n:<6} {c.op:<15} {c.group:<8} {c.size:>5}  {'inter' if c.spans_nodes else 'intra'}  "
                         f"{c.calls:>5}  {c.bytes:>10.4g}  {c.seconds * 1e3:.4g}  ({c.what})")
        if not self.best.collectives:
            lines.append("  (none: every group has one rank)")
        lines += ["", "# rank  s_p  s_g  s_os  params   grads    optimizer  total     fits  comm ms  inter bytes"]
        for n, c in enumerate(self.candidates[:top], 1):
            m = c.memory
            inter = sum(x.bytes for x in c.collectives if x.spans_nodes)
            lines.append(f"  {n:<5} {c.shard[0]:>3} {c.shard[1]:>4} {c.shard[2]:>5}  {_gb(m['params']):>8} "
                         f"{_gb(m['grads']):>8} {_gb(m['optimizer']):>9}  {_gb(m['total']):>8}  "
                         f"{'yes' if c.fits else 'no':<4}  {c.seconds * 1e3:>7.4g}  {inter:.4g}")
        return "\n".join(lines)


def _sent(op, p, bytes_in):
    """Bytes one rank sends in a call over p ranks with ``bytes_in`` bytes of input (as
    mpicomp.stats() counts them: the bandwidth-optimal algorithms)."""
    return {"allgather": (p - 1) * bytes_in, "reduce_scatter": (p - 1) * bytes_in // p,
            "allreduce": 2 * (p - 1) * bytes_in // p}[op]


def bandwidth_from_bench(path):
    """Bytes/s per rank measured by ``mpicomp-bench allgather|reduce_scatter|allreduce
    --json PATH``: what each rank sends in the largest call of codec "none" in the file
    (its ``size`` is the input per rank), over that call's average latency. Run the
    benchmark with all ranks of a node at once (intra-node) or one group spanning nodes
    (inter-node), as the collectives it stands for run."""
    try:
        with open(path) as f:
            records = [r for r in json.load(f) if r.get("codec") == "none"
                       and r.get("op") in ("allgather", "reduce_scatter", "allreduce") and r.get("np", 1) > 1]
    except (OSError, ValueError, TypeError, AttributeError) as e:
        raise ArgumentError(f"amsp: cannot read benchmark results {path!r}: {e}") from None
    if not records:
        raise ArgumentError(f"amsp: {path!r} has no multi-rank collective measured with codec none")
    r = max(records, key=lambda r: (r["size"], -r["avg_latency_us"]))
    return _sent(r["op"], r["np"], r["size"]) / (r["avg_latency_us"] * 1e-6)


def _gb(n):
    return f"{n / 1e9:.3g} GB"


def _positive(name, value, integer=False):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not value > 0:
        raise ArgumentError(f"amsp.plan: {name} must be a positive {'int' if integer else 'number'}, got {value!r}")
    return value


def plan(num_params, world_size, ranks_per_node, memory_per_rank, activation_bytes=0, intra_bandwidth=100e9,
         inter_bandwidth=12.5e9, latency=10e-6, param_bytes=2, grad_bytes=2, state_bytes=12, modules=1,
         micro_batches=1):
    """The partition with the least modelled communication time per step that fits.

    Args:
        num_params: F, the model's parameter count.
        world_size: the data-parallel size (ranks AMSP shards over).
        ranks_per_node: ranks per node (GPUs per node).
        memory_per_rank: bytes each rank may hold (model state and activations).
        activation_bytes: activation (and workspace) bytes per rank, the same for every
            partition.
        intra_bandwidth, inter_bandwidth: bytes/s each rank sends within a node and across
            nodes, all ranks at once (e.g. from ``mpicomp-bench`` measurements).
        latency: seconds per ring step of a collective.
        param_bytes, grad_bytes, state_bytes: bytes per parameter of each part (2, 2, 12
            for mixed precision with Adam).
        modules: modules that gather their parameters and scatter their gradients one by one.
        micro_batches: forward/backward passes per optimizer step.

    Returns:
        Plan. Its ``shard`` never needs more than ``memory_per_rank``.

    Raises:
        ArgumentError: an argument out of range.
        PlanError: no partition fits; says how much the smallest one needs.
    """
    for name, v in (("num_params", num_params), ("world_size", world_size), ("modules", modules),
                    ("micro_batches", micro_batches)):
        _positive(name, v, integer=True)
    for name, v in (("memory_per_rank", memory_per_rank), ("intra_bandwidth", intra_bandwidth),
                    ("inter_bandwidth", inter_bandwidth), ("param_bytes", param_bytes), ("grad_bytes", grad_bytes),
                    ("state_bytes", state_bytes)):
        _positive(name, v)
    for name, v in (("activation_bytes", activation_bytes), ("latency", latency)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
            raise ArgumentError(f"amsp.plan: {name} must be a number >= 0, got {v!r}")
    rpn = check_ranks_per_node(ranks_per_node, world_size, "amsp.plan")
    inputs = dict(num_params=num_params, world_size=world_size, ranks_per_node=rpn, memory_per_rank=memory_per_rank,
                  activation_bytes=activation_bytes, intra_bandwidth=intra_bandwidth,
                  inter_bandwidth=inter_bandwidth, latency=latency, param_bytes=param_bytes, grad_bytes=grad_bytes,
                  state_bytes=state_bytes, modules=modules, micro_batches=micro_batches)
    candidates = []
    for shard in valid_partitions(world_size, rpn):
        mem = memory_bytes(num_params, shard, activation_bytes, param_bytes, grad_bytes, state_bytes)
        comm = communication_plan(num_params, shard, world_size, rpn, param_bytes, grad_bytes, modules,
                                  micro_batches, intra_bandwidth, inter_bandwidth, latency)
        candidates.append(Candidate(shard, mem, comm, mem["total"] <= memory_per_rank))
    candidates.sort(key=lambda c: (not c.fits, c.seconds if c.fits else 0, c.memory["total"], c.shard))
    if not candidates[0].fits:
        least = candidates[0]
        raise PlanError(f"amsp.plan: no partition of {world_size} ranks fits in memory_per_rank="
                        f"{_gb(memory_per_rank)}: the smallest, shard={least.shard}, needs "
                        f"{_gb(least.memory['total'])} per rank ({_gb(least.memory['params'])} parameters, "
                        f"{_gb(least.memory['grads'])} gradients, {_gb(least.memory['optimizer'])} optimizer "
                        f"state, {_gb(activation_bytes)} activations)")
    return Plan(candidates[0].shard, candidates, inputs)
