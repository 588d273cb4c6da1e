"""The time a collective cannot beat on this machine and link, printed beside what it took.

Two lower bounds per call, and the larger is the bound (perfect overlap of the two):
- link: the bytes that cross the link over its rate. bench/netem's default shapes one
  loopback that all ranks share, so the link carries every rank's bytes; with --per-rank each
  rank has its own full-duplex link and carries its own. MPICOMP_NETEM says which (and the
  rate); --link-gbit gives a rate for other links (then taken as per-rank).
- codec: this rank's codec work at the speeds measured here for each size, on that size's
  data (one core, the SIMD target in use; as `mpicomp-bench codecs -n`), decodes streamed
  where the collective streams them, and every rank timing its kernels at the same moments:
  a node's ranks do their codec work together in the collective and share its memory, and a
  rank timed alone, or on a sample that fits in cache when the call's buffers do not, gives a
  bound the collective cannot reach (16 MiB samples timed unsynchronised put sign's 16 MiB
  bound anywhere from 1.7 to 2.5 ms on a 2-core Xeon).

Per rank, for p ranks, n elements of input, wire bytes w(k) of k elements:
allreduce (reduce-scatter, then allgather): sends 2 (p-1)/p w(n); encodes n (its p-1 parts,
then its reduced part), decode-accumulates (p-1)/p n, decodes n. reduce_scatter: sends
(p-1)/p w(n); encodes and decode-accumulates (p-1)/p n. allgather (n per rank): sends
(p-1) w(n); encodes n, decodes p n. MPI's own collectives (and codec none) move the input's
bytes and do no codec work. "%Bound" is bound / measured: 100% runs at the bound.
"""
import os
import re

import numpy as np

from .codecs import seconds

__all__ = ["Link", "Speeds", "bound_us"]

_MIN_SAMPLE = 1 << 16  # elements timed at least: 256 KiB of float32, 10-50 us a kernel


class Link:
    """Rate in bits/s (None: unknown, no link bound) and whether the ranks share it."""

    def __init__(self, gbit=None):
        text = os.environ.get("MPICOMP_NETEM", "")
        m = re.match(r"(\d+(?:\.\d+)?)([kmg])bit", text.lower())
        if gbit:
            self.rate, self.shared = gbit * 1e9, False
        elif m:
            self.rate = float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]
            self.shared = "per-rank" not in text and "between" not in text
        else:
            self.rate, self.shared = None, False

    def describe(self):
        if self.rate is None:
            return "link unknown (not bench/netem, no --link-gbit): codec bound only"
        return f"link {self.rate / 1e9:g} Gbit/s, {'shared by the ranks' if self.shared else 'one per rank'}"


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


def bound_us(op, spec, n, p, ratio, speeds, link, itemsize=4):
    """(link us or None, codec us) of one call: op's name, codec spec ("none" for MPI's own),
    n input elements per rank of itemsize bytes, p ranks, the codec's ratio on this data."""
    wire = itemsize * n / ratio
    sends = {"allreduce": 2 * (p - 1) / p * wire, "reduce_scatter": (p - 1) / p * wire,
             "allgather": (p - 1) * wire}[op]
    link_us = None
    if link.rate and p > 1:
        link_us = sends * (p if link.shared else 1) * 8 / link.rate * 1e6
    enc, dec, acc = speeds.per_element.get(spec, (0.0, 0.0, 0.0))
    work = {"allreduce": enc * n + acc * (p - 1) / p * n + dec * n,
            "reduce_scatter": (enc + acc) * (p - 1) / p * n,
            "allgather": enc * n + dec * p * n}[op]
    return link_us, work * 1e6 if p > 1 else 0.0
