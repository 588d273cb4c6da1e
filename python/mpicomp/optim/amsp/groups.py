"""AMSP's partitions and the four rank groups a partition (s_p, s_g, s_os) makes.

Pure Python (no torch, no MPI): the planner and the optimizer share it, so the groups the
plan prices are the groups the optimizer communicates on.

A partition is valid when 1 <= s_p <= s_g <= s_os <= world, each divides the world size,
each divides the next (the groups nest, so one gradient shard holds whole optimizer-state
shards and one parameter shard is made of whole optimizer-state shards: no data crosses
group boundaries), and each either divides ``ranks_per_node`` or is a multiple of it
(groups fill a node before they span nodes; Chen et al., arXiv 2311.00257, section 3).

Ranks are numbered as MPI places them: ``ranks_per_node`` consecutive ranks per node.
Within an optimizer-state group (s_os consecutive ranks) a rank's local index j is written
in mixed radix as j = j0 + s_p * (j1 + b * j2), with b = s_g / s_p and c = s_os / s_g:

- parameter group ("param"): the s_p consecutive ranks sharing j1, j2; this rank holds
  parameter shard j0 of s_p;
- gradient group ("grad"): the s_g consecutive ranks sharing j2, ordered so that this rank
  receives gradient shard g = j0 * b + j1 of s_g;
- state group ("state"): the c ranks of this optimizer-state group holding the same
  gradient shard, ordered by j2: a reduce-scatter over it leaves each the part of the
  gradient shard that its optimizer-state shard covers;
- replica group ("replica"): the world / s_os ranks owning the same optimizer-state shard
  (one per optimizer-state group), which average its gradient;
- update group ("update"): the s_os / s_p ranks of this optimizer-state group sharing j0;
  this rank owns optimizer-state shard o = g * c + j2 = j0 * b * c + (j1 * c + j2).

So shard o lies inside gradient shard g (o // c == g) and inside parameter shard j0
(o // (b * c) == j0): the optimizer reads its gradient from a slice of the gradient shard,
and the update group's allgather (in its key order) rebuilds exactly parameter shard j0.
"""

from ...errors import ArgumentError

__all__ = ["check_partition", "check_ranks_per_node", "valid_partitions", "Groups", "GROUPS"]

GROUPS = ("param", "grad", "state", "replica", "update")


def check_ranks_per_node(ranks_per_node, world_size, who="AMSP"):
    if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or ranks_per_node < 1:
        raise ArgumentError(f"{who}: ranks_per_node must be a positive int, got {ranks_per_node!r}")
    if world_size % ranks_per_node and ranks_per_node < world_size:
        raise ArgumentError(f"{who}: ranks_per_node={ranks_per_node} must divide the world size {world_size} "
                            f"(every node holds as many ranks)")
    return min(ranks_per_node, world_size)


def check_partition(shard, world_size, ranks_per_node, who="AMSP"):
    """The partition as a tuple of ints; ArgumentError naming the rule it breaks."""
    try:
        sizes = tuple(shard)
    except TypeError:
        sizes = ()
    if len(sizes) != 3 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise ArgumentError(f"{who}: shard must be three positive ints (s_p, s_g, s_os), got {shard!r}")
    s_p, s_g, s_os = sizes
    if not s_p <= s_g <= s_os:
        raise ArgumentError(f"{who}: shard={sizes} must satisfy s_p <= s_g <= s_os (parameters are sharded over "
                            f"at most as many ranks as gradients, gradients as optimizer states)")
    for name, s in zip(("s_p", "s_g", "s_os"), sizes):
        if s > world_size:
            raise ArgumentError(f"{who}: shard={sizes}: {name}={s} is larger than the world ({world_size} ranks)")
        if world_size % s:
            raise ArgumentError(f"{who}: shard={sizes}: {name}={s} does not divide the world size {world_size}")
        if s % ranks_per_node and ranks_per_node % s:
            raise ArgumentError(f"{who}: shard={sizes}: {name}={s} neither divides nor is a multiple of "
                                f"ranks_per_node={ranks_per_node} (a group must fill nodes, not straddle them)")
    if s_g % s_p or s_os % s_g:
        raise ArgumentError(f"{who}: shard={sizes}: s_p must divide s_g and s_g must divide s_os (nested groups)")
    return sizes


def valid_partitions(world_size, ranks_per_node):
    """Every valid (s_p, s_g, s_os), in lexicographic order."""
    sizes = [s for s in range(1, world_size + 1)
             if world_size % s == 0 and (s % ranks_per_node == 0 or ranks_per_node % s == 0)]
    return [(a, b, c) for a in sizes for b in sizes for c in sizes if b % a == 0 and c % b == 0]


class Groups:
    """The groups of one rank under partition ``shard`` (see the module docstring).

    ``color[name], key[name]``: the arguments of ``comm.Split`` that make group ``name``
    (ranks ordered by key); ``members(name)``: its ranks in that order; ``index``: this
    rank's shard number in each of "param", "grad" and "os"."""

    def __init__(self, shard, world_size, rank):
        s_p, s_g, s_os = shard
        self.shard, self.world_size, self.rank = tuple(shard), world_size, rank
        b, c = s_g // s_p, s_os // s_g
        j = rank % s_os
        j0, j1, j2 = j % s_p, (j // s_p) % b, j // s_g
        g = j0 * b + j1
        self.index = {"param": j0, "grad": g, "os": g * c + j2}
        self.color = {"param": rank // s_p, "grad": rank // s_g, "state": (rank // s_os) * s_g + rank % s_g,
                      "replica": j, "update": (rank // s_os) * s_p + j0}
        self.key = {"param": j0, "grad": g, "state": j2, "replica": rank // s_os, "update": j1 * c + j2}

    def members(self, name):
        s_p, s_g, s_os = self.shard
        b, c = s_g // s_p, s_os // s_g
        base, j0 = self.rank - self.rank % s_os, self.index["param"]
        if name == "param":
            return [self.rank - j0 + t for t in range(s_p)]
        if name == "grad":
            start = self.rank - self.rank % s_g
            return [start + g // b + s_p * (g % b) for g in range(s_g)]
        if name == "state":
            return [base + self.rank % s_g + s_g * k for k in range(c)]
        if name == "replica":
            return [self.rank % s_os + s_os * k for k in range(self.world_size // s_os)]
        return [base + j0 + s_p * (k // c + b * (k % c)) for k in range(b * c)]

    def spans_nodes(self, name, ranks_per_node):
        """Whether group ``name`` has ranks on more than one node."""
        return len({r // ranks_per_node for r in self.members(name)}) > 1

    def size(self, name):
        s_p, s_g, s_os = self.shard
        return {"param": s_p, "grad": s_g, "state": s_os // s_g, "replica": self.world_size // s_os,
                "update": s_os // s_p}[name]
