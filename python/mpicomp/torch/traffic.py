"""Counting the bytes that mpicomp.torch sends, by parallel dimension and traffic kind, so a
training script can report what each policy moves (the quantity the hybrid-compression paper,
Xu et al., arXiv 2409.02423, trades against loss)."""

from collections import defaultdict
from collections.abc import Mapping

import mpicomp

__all__ = ["Traffic", "traffic"]


def _wire_bytes(t, codec):
    """Bytes of tensor t on the wire (uncompressed below config.min_bytes, as the core sends it)."""
    return mpicomp.codec(codec).message_bytes(tuple(t.shape), t.dtype)


class Traffic(Mapping):
    """Payload bytes this rank sent, keyed by (dimension, kind), e.g. ("dp", "gradients"): a
    read-only mapping (``traffic["dp", "gradients"]``, ``dict(traffic)``, ``traffic.items()``)
    in which a key nothing was sent under reads 0.

    An allreduce over p ranks counts 2 (p - 1) / p times the encoded message (a
    reduce-scatter stage then an allgather stage, each rank sending all parts but its own);
    a send counts the encoded message. Headers (a few bytes per message) are left out.
    Messages below ``mpicomp.config.min_bytes`` count uncompressed, as the core sends them.
    With ``mpicomp.config.skip_local`` set, communicators whose ranks share one node send
    uncompressed; the counter still reports the codec's bytes (what a run across nodes
    sends). ``mpicomp.stats()`` counts what the core really sent.
    Lossless codecs (lz4, nvcomp-*) count their bound, the input's size: what they save
    depends on the data (the LD_PRELOAD statistics count the bytes actually sent).
    """

    def __init__(self):
        self.bytes = defaultdict(int)

    def allreduce(self, key, tensor, size, codec):
        """Records an allreduce of ``tensor`` over ``size`` ranks with ``codec``."""
        self.bytes[key] += 2 * (size - 1) * _wire_bytes(tensor, codec) // size

    def send(self, key, tensor, codec):
        """Records a point-to-point send of ``tensor`` with ``codec``."""
        self.bytes[key] += _wire_bytes(tensor, codec)

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
