"""Codec "auto": compress where it pays, by size, from times measured on the communicator.

``codec="auto"`` (int8) or ``"auto:<codec>"`` (``"auto:int4"``, ``"auto:int8:block=128"``)
sends a call compressed with that codec, or uncompressed, whichever the communicator's own
measurements say is faster at the call's size. Compression pays on slow links and costs on
fast ones: on one node's shared memory the MPI library moves data about as fast as a core
encodes it; on a 1 Gbit/s link every codec wins from a few KiB; on a 200 Gbit/s card a CPU
codec is slower than the wire at every size.

After a communicator's first ``auto`` call of a kind (collective, dtype, codec), which goes
uncompressed, its ranks time that collective both ways at sizes from 1 KiB up (under half a
second; the caller's data, tiled) and agree on the slowest rank's times; every later call of
that kind is compressed exactly where the model's compressed time is the shorter. Every few
calls the ranks exchange their calls' median times, which replace the model's at those sizes
(a probe's bursts can miss what a stream of calls meets), and now and then send a size the
way it did not go, to time it; they measure everything again when calls drift from the model
(``config.auto_reprobe_s``). Calls sent uncompressed are counted in ``mpicomp.stats()`` under
``auto_small`` (below break-even), ``auto_link`` (the link is faster than the codec at every
size) or ``auto_probe`` (measuring); ``MPICOMP_VERBOSE=1`` prints each measurement's outcome.
``config.min_bytes`` does not apply: ``auto`` finds the size itself. Host buffers only (GPU
buffers: name the codec). docs/auto.md; the mechanism: cpp/coll/adaptive.h.
"""

import types

from . import _comm, _core
from ._dtypes import DTYPE_IDS, canonical
from .codecs import Codec, codec, register_codec, wire_codec
from .errors import ArgumentError, BackendError, CodecError

__all__ = ["AutoCodec", "model"]

DEFAULT = _core.split_auto("auto")
"""The codec "auto" uses when it names none (the core's: int8, the default of gradients)."""


class AutoCodec(Codec):
    """``"auto"`` / ``"auto:<codec>"``: ``codec`` (a host wire codec, default int8) where it
    pays on the communicator, else none (see the module). ``options``: ``{"codec": spec}``.
    Its format, bounds and dtypes are its codec's."""

    name = "auto"
    host_only = True
    adaptive = True

    def __init__(self, **options):
        unknown = set(options) - {"codec"}
        if unknown:
            raise CodecError(f"codec 'auto' has one option, codec (e.g. 'auto:int4'), not {sorted(unknown)[0]!r}")
        inner = wire_codec(options.get("codec", DEFAULT), "codec 'auto'")
        if isinstance(inner, AutoCodec) or inner.device_only:
            raise CodecError(f"codec 'auto' may use a host wire codec, not {inner.spec!r}")
        self.inner = inner
        self.id, self.block, self.exact, self.framed = inner.id, inner.block, inner.exact, inner.framed
        self.call_id = inner.id | _core.AUTO_BIT
        self.options = types.MappingProxyType({"codec": inner.spec})

    @property
    def spec(self):
        return "auto" if self.inner.spec == DEFAULT else f"auto:{self.inner.spec}"

    def check_dtype(self, dtype_name, argument="x"):
        self.inner.check_dtype(dtype_name, argument)

    def check_memory(self, on_device):
        if on_device:
            raise BackendError("codec 'auto' runs on host buffers (its measurements time the host's paths); "
                               f"name the codec for GPU buffers, e.g. {self.inner.spec!r}")

    # Single-process encoding, sizes and bounds: its codec's (what a compressed call sends).
    def encoded_bytes(self, count, dtype="float32"):
        return self.inner.encoded_bytes(count, dtype)

    def ratio(self, dtype="float32"):
        return self.inner.ratio(dtype)

    def tolerance(self, x):
        return self.inner.tolerance(x)

    def encode(self, x, residual=None):
        return self.inner.encode(x, residual)

    def decode(self, data, count, dtype="float32"):
        return self.inner.decode(data, count, dtype)


register_codec(AutoCodec, _core.split_auto)


def model(comm, collective="allreduce", dtype="float32", codec_spec="auto"):
    """What ``auto`` measured on ``comm`` for a collective ("allreduce", "reduce_scatter",
    "allgather") of ``dtype`` with ``codec_spec``, or None before its first call: a dict of
    ``bytes`` (sizes, input bytes as mpicomp.stats() counts them), ``plain`` and ``packed``
    (seconds uncompressed and compressed, the slowest rank's: the probe's, or the calls' own
    where they replaced it), ``plain_flat`` and ``packed_flat`` (the same on the flat
    hierarchy, where the communicator spans nodes of several ranks and that is another path:
    each way takes the faster; at sizes where it is the same path, the two-level times; else
    empty), ``break_even`` (bytes from
    which it compresses; inf: never), ``probes`` (measurements so far) and ``describe``.
    Local. Blocking calls' models: the non-blocking ones (iallreduce, ...) run on a
    communicator of their own, measured on its own."""
    c = codec(codec_spec)
    if not isinstance(c, AutoCodec):
        raise CodecError(f"auto.model: codec_spec must name codec 'auto', got {c.spec!r}")
    ids = _core.COLL_IDS
    if collective not in ids:
        raise ArgumentError(f"auto.model: collective must be one of {', '.join(map(repr, ids))}, got {collective!r}")
    ctx = _comm.known(_comm.checked(comm, "auto.model"))
    if ctx is None:
        return None
    return _core.auto_model(ctx.comm, ids[collective], DTYPE_IDS[canonical(dtype)], c.id, c.block)
