"""Counting the bytes that mpicomp.torch sends, by parallel dimension and traffic kind, so a
training script can report what each policy moves (the quantity the hybrid-compression paper,
Xu et al., arXiv 2409.02423, trades against loss)."""

from collections import defaultdict
from collections.abc import Mapping
from contextlib import contextmanager

from ..stats import thread_bytes

__all__ = ["Traffic", "traffic"]


class Traffic(Mapping):
    """Payload bytes this rank sent, keyed by (dimension, kind), e.g. ("dp", "gradients"): a
    read-only mapping (``traffic["dp", "gradients"]``, ``dict(traffic)``, ``traffic.items()``)
    in which a key nothing was sent under reads 0.

    The bytes are the core's own count of each call (``mpicomp.stats()``'s ``bytes_wire``,
    split by purpose): an allreduce over p ranks sends about 2 (p - 1) / p of its encoded
    message, a send the message; calls below ``mpicomp.config.min_bytes`` or skipped by
    ``skip_local`` count what they sent uncompressed, lossless codecs what they really sent.
    Headers (a few bytes per message) are left out.
    """

    def __init__(self):
        self.bytes = defaultdict(int)

    @contextmanager
    def counting(self, key):
        """Counts under ``key`` what the mpicomp calls this thread makes in the block send."""
        before = thread_bytes()[0]
        try:
            yield
        finally:
            self.bytes[key] += thread_bytes()[0] - before

    def add(self, key, n):
        """Counts n bytes under ``key`` (e.g. a completed mpicomp.Request's bytes_sent)."""
        self.bytes[key] += n

    def __getitem__(self, key):
        return self.bytes.get(key, 0)

    def __contains__(self, key):
        return key in self.bytes

    def __iter__(self):
        return iter(self.bytes)

    def __len__(self):
        return len(self.bytes)

    def total(self):
        return sum(self.bytes.values())

    def reset(self):
        self.bytes.clear()

    def __repr__(self):
        parts = ", ".join(f"{'/'.join(map(str, k)) if isinstance(k, tuple) else k}: {v / 1e6:.3f} MB"
                          for k, v in sorted(self.bytes.items(), key=lambda kv: str(kv[0])))
        return f"Traffic(total {self.total() / 1e6:.3f} MB" + (f"; {parts})" if parts else ")")


traffic = Traffic()
"""The counter every mpicomp.torch layer and hook records into (this process's traffic)."""
