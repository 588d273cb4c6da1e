"""The time a collective cannot beat on this machine and link, printed beside what it took.

Two lower bounds per call, and the larger is the bound (perfect overlap of the two):
- link: the bytes that cross the busiest shaped link over its rate. bench/netem's default
  shapes one loopback that all ranks share, so the link carries every rank's bytes; with
  --per-rank each rank has its own full-duplex link and carries its own; with
  --ranks-per-node K each node of K ranks has one, which carries what its ranks send to
  ranks of other nodes (traffic inside a node is not shaped). MPICOMP_NETEM says which (and
  the rate); --link-gbit gives a rate for other links (then taken as per-rank).
- codec: this rank's codec work at the speeds measured here for each size, on that size's
  data (one core, the SIMD target in use; as `mpicomp-bench codecs -n`), decodes streamed
  where the collective streams them, and every rank timing its kernels at the same moments:
  a node's ranks do their codec work together in the collective and share its memory, and a
  rank timed alone, or on a sample that fits in cache when the call's buffers do not, gives a
  bound the collective cannot reach (16 MiB samples timed unsynchronised put sign's 16 MiB
  bound anywhere from 1.7 to 2.5 ms on a 2-core Xeon).

Per rank, for p ranks, n elements of input, wire bytes w(k) of k elements, nodes of K ranks
(K = 1: a link per rank), N = p / K nodes. Full-duplex links carry as much in as out, so
the bytes sent are the bytes on a link in either direction.

flat (every rank exchanges with every other; allreduce = reduce-scatter, then allgather):
a rank sends each peer 2 w(n) / p (allreduce), w(n) / p (reduce_scatter) or w(n)
(allgather); its p - K peers on other nodes are the ones that cross its node's link, so
the link carries K (p - K) of those (node sizes may differ: the fullest node's link is the
busiest). Codec work: allreduce encodes n (its p-1 parts, then its reduced part),
decode-accumulates (p-1)/p n, decodes n; reduce_scatter encodes and decode-accumulates
(p-1)/p n; allgather encodes n, decodes p n.

two_level (exact inside the node, compressed between nodes, so a byte crosses a node's
link once): allreduce = an exact reduce-scatter inside the node (rank k of the node keeps
the node's sum of the k-th n/K elements), a compressed allreduce of those n/K elements
among the N ranks with local index k, an exact allgather inside the node. Each rank sends
2 (N-1)/N w(n/K) across; the node link carries K of those, 2 (N-1)/N w(n): 1/K of flat's
2 K (N-1)/N w(n). reduce_scatter: the same first two steps, a reduce_scatter among the N
on n/K elements: the link carries (N-1)/N w(n), (N-1)/N of the node's share compressed.
allgather: first among the N ranks of equal local index (each rank's n elements, encoded
once, to N-1 peers), then exact inside the node: a node receives (N-1) K parts, (N-1) K w(n).
Codec work: the flat formulas with p -> N, and n -> n/K for allreduce and reduce_scatter.
The exact stages inside the node do no codec work and, but on a shared link (which carries
their bytes too), cross no shaped link: left out, the bound stays a lower bound.

MPI's own collectives (and codec none) move the input's bytes and do no codec work. On
nodes of K > 1 ranks they are modelled node-aware (two_level with uncompressed bytes):
MPICH's (MPIR_Allreduce_intra_smp) and Open MPI's (coll/han) allreduces reduce inside the
node first, and ring allgathers in rank order cross each node boundary once; MPICH's
pairwise reduce_scatter does not, so there the bound is lower than it could be, still a
bound. On unequal nodes (p not a multiple of K: the last node is smaller) the two-level
allreduce exchanges between nodes over as many lanes as the smallest node has ranks, each
lane's rank on n/lanes elements, so every node's link still carries 2 (N-1)/N w(n), N
the number of nodes; two-level reduce_scatter and allgather are not modelled there (MPI's
get no bound, mpicomp's are refused), nor is two_level on a shared link (no link bound).
"%Bound" is bound / measured: 100% runs at the bound.
"""
import os
import re

import numpy as np

from .codec_speed import seconds

__all__ = ["ALGORITHMS", "Link", "Speeds", "bound_us", "lanes", "traffic", "work"]

ALGORITHMS = ("flat", "two_level")
_MIN_SAMPLE = 1 << 16  # elements timed at least: 256 KiB of float32, 10-50 us a kernel


class Link:
    """Rate in bits/s (None: unknown, no link bound), whether all ranks share it, and the
    ranks behind each link otherwise (bench/netem's "between nodes of K": K, else 1)."""

    def __init__(self, gbit=None):
        text = os.environ.get("MPICOMP_NETEM", "")
        m = re.match(r"(\d+(?:\.\d+)?)([kmg])bit", text.lower())
        nodes = re.search(r"between nodes of (\d+)", text)
        self.ranks_per_node = 1
        if gbit:
            self.rate, self.shared = gbit * 1e9, False
        elif m:
            self.rate = float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
            self.shared = "per-rank" not in text and not nodes
            self.ranks_per_node = int(nodes.group(1)) if nodes else 1
        else:
            self.rate, self.shared = None, False

    def describe(self):
        if self.rate is None:
            return "link unknown (not bench/netem, no --link-gbit): codec bound only"
        where = ("shared by the ranks" if self.shared else "one per rank" if self.ranks_per_node == 1
                 else f"one per node of {self.ranks_per_node} ranks")
        return f"link {self.rate / 1e9:g} Gbit/s, {where}"


class Speeds:
    """Encode, decode and decode-accumulate seconds per element, per codec, at one size:
    timed on x, a numpy array of that size's data (its bytes, of dtype ``dtype``: bfloat16's
    seen as float16 by numpy), best of 3; stream: the decodes with streaming stores; comm:
    the ranks that time together (a barrier before each run)."""

    def __init__(self, codecs, x, dtype="float32", stream=False, comm=None):
        sample = x if x.size >= _MIN_SAMPLE else np.resize(x, _MIN_SAMPLE)
        sync = comm.Barrier if comm is not None and comm.Get_size() > 1 else None
        self.per_element = {c.spec: [t / sample.size for t in seconds(c, sample, 3, dtype, stream, sync)]
                            for c in codecs if c.id}  # none: no work

    def keep_faster(self, other):
        """Each kernel's faster time of the two: a benchmark times its speeds once per round,
        beside that round's collectives, and keeps the best, as it keeps each collective's best
        round (one timing at one moment of a busy 2-core machine put sign's 64 MiB bound 17%
        above the collective's own best time)."""
        for spec, times in other.per_element.items():
            self.per_element[spec] = [min(a, b) for a, b in zip(self.per_element.get(spec, times), times)]
        return self


def lanes(p, k):
    """(nodes, lanes) of p consecutive ranks in nodes of k: the last node may be smaller, and
    the two-level allreduce exchanges between nodes over as many lanes as it has ranks."""
    nodes = -(-p // k)
    return nodes, p - (nodes - 1) * k


def traffic(op, algorithm, n, p, k, wire, itemsize=4):
    """(bytes to ranks of its own node, bytes to ranks of other nodes) that one rank of a node
    of k ranks sends in one call (module docstring): n input elements per rank, p ranks,
    wire bytes per element on the compressed legs, itemsize on the exact ones. two_level on
    unequal nodes (allreduce only): a lane's rank, its node taken as its lanes."""
    if algorithm == "flat":
        to_each = {"allreduce": 2 * n / p, "reduce_scatter": n / p, "allgather": n}[op] * wire
        return (k - 1) * to_each, (p - k) * to_each
    nodes, k = lanes(p, k)
    if op != "allreduce" and nodes * k != p:
        raise ValueError(f"bound: a two-level {op} needs nodes of equal size, not {p} ranks in nodes of {k}")
    inside, across = {"allreduce": (2 * (k - 1) / k * n, 2 * (nodes - 1) / nodes * n / k),
                      "reduce_scatter": ((k - 1) / k * n, (nodes - 1) / nodes * n / k),
                      "allgather": ((k - 1) * nodes * n, (nodes - 1) * n)}[op]
    return inside * itemsize, across * wire


def work(op, algorithm, n, p, k):
    """(encoded, decoded, decode-accumulated) elements of one rank's codec work in one call
    (two_level: a lane's rank)."""
    if algorithm == "two_level":
        nodes, k = lanes(p, k)
        p, n = nodes, n if op == "allgather" else n / k
    return {"allreduce": (n, n, (p - 1) / p * n), "reduce_scatter": ((p - 1) / p * n, 0.0, (p - 1) / p * n),
            "allgather": (n, p * n, 0.0)}[op]


def bound_us(op, spec, n, p, ratio, speeds, link, itemsize=4, algorithm="flat", ranks_per_node=None):
    """(link us or None, codec us) of one call: op's name, codec spec ("none" for MPI's own),
    n input elements per rank of itemsize bytes, p ranks, the codec's ratio on this data;
    algorithm "flat" or "two_level" on nodes of ranks_per_node ranks (default: the link's)."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"bound_us: algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    k = min(ranks_per_node or link.ranks_per_node, p)
    if spec == "none" and k > 1:
        algorithm = "two_level"  # MPI's own reduce inside the node first (module docstring)
    if p == 1:
        return None, 0.0
    equal = p % k == 0
    if algorithm == "two_level" and not equal and spec == "none" and op != "allreduce":
        return None, 0.0  # MPI's reduce_scatter and allgather on unequal nodes: no model
    inside, across = traffic(op, algorithm, n, p, k, itemsize / ratio, itemsize)
    link_us = None
    if link.rate and (equal or algorithm == "flat" or not link.shared):
        if link.shared:
            busiest = p * (inside + across)
        else:  # flat: the fullest node's link (a last, smaller node's carries less); two_level: its lanes'
            busiest = (k if algorithm == "flat" else lanes(p, k)[1]) * across
        link_us = busiest * 8 / link.rate * 1e6
    enc, dec, acc = speeds.per_element.get(spec, (0.0, 0.0, 0.0))
    counts = work(op, algorithm, n, p, k)
    return link_us, (enc * counts[0] + dec * counts[1] + acc * counts[2]) * 1e6
