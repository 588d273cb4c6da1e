"""Codec specs: which compression a collective applies to its messages.

``mpicomp.codec("int4", block=128)`` or the string ``"int4:block=128"`` names a codec with
options; every collective accepts either, or a :class:`Codec`. Codecs are stateless: error
feedback lives in :class:`mpicomp.ErrorFeedback`.

Error bounds below are for one encode/decode of a block (``B`` elements, ``absmax`` its
largest magnitude); a compressed allreduce applies two such stages (each rank's parts, then
the reduced sum), so its error is at most the sum of those stages' bounds. A block holding
a NaN or an Inf decodes to all NaN (it is never hidden). Every finite float32 block decodes
finite and with its signs (a value may become zero, never change sign), tiny, subnormal and
near-overflow blocks included; the bounds add ``2**-142`` for rounding on float32's subnormal
grid. float64 is refused by every lossy codec (they compute in float32); ``none`` and the
lossless codecs carry it exactly and sum it in float64.
"""

import os

import numpy as np

from . import _core
from ._codec import Codec, parse_value
from ._dtypes import INTEGER_DTYPES, ITEMSIZE, canonical
from ._framed import (BloscCodec, BoundCodec, LosslessCodec, Lz4Codec, NvcompAnsCodec, NvcompBitcompCodec,
                      NvcompLz4Codec, nvcomp_loaded)
from .errors import CodecError

__all__ = ["Codec", "codec", "available_codecs"]

# The core's tables (format.h), by name.
_IDS = _core.CODEC_IDS


class NoneCodec(Codec):
    """No compression: the input's bytes as they are. Exact."""

    name, id, exact = "none", _IDS["none"], True

    def tolerance(self, x):
        return np.zeros(np.shape(x))


class Fp16Codec(Codec):
    """IEEE half precision, round to nearest even. Error per element at most
    ``2**-11 * |x|`` for ``6.1e-5 <= |x| < 65504``, ``2**-25`` below; values of magnitude
    65520 and above become Inf (outside float16's range)."""

    name, id = "fp16", _IDS["fp16"]

    def tolerance(self, x):
        a = np.abs(np.asarray(x, np.float64))
        return np.maximum(a * 2.0**-11, 2.0**-25)


class Bf16Codec(Codec):
    """bfloat16 (float32's exponent, 8 significant bits), round to nearest even. Error per
    element at most ``2**-8 * |x|`` (relative), for any finite float32 input."""

    name, id = "bf16", _IDS["bf16"]

    def tolerance(self, x):
        a = np.abs(np.asarray(x, np.float64))
        return np.maximum(a * 2.0**-8, 2.0**-133)


# Float32 rounding in a blockwise codec, relative to the block's absmax: the scale and its
# inverse (2**-24 each), x times the inverse (2**-24, relative to |x| <= absmax, then scaled
# by the scale), and the decoded product (2**-24), with margin.
_ROUNDING = 2.0**-21
# Absolute: for blocks below ~1e-36 the scale (absmax / qmax) and the decoded q * scale are
# rounded on float32's subnormal grid (2**-149), half a step each, the scale's error times
# |q| <= 127: (127 + 1) * 2**-150, with margin.
_SUBNORMAL = 2.0**-142


class _BlockCodec(Codec):
    """A scale per block of ``block`` elements (default 256; a multiple of 32 up to 65536)."""

    def _block_absmax(self, x):
        a = np.abs(np.asarray(x, np.float64).ravel())
        b = self.block
        pad = (-a.size) % b
        m = np.pad(a, (0, pad)).reshape(-1, b)
        return m, np.repeat(m.max(axis=1), b)[: a.size]


class Int8Codec(_BlockCodec):
    """Blockwise absmax int8: per block of ``block`` elements (default 256) a float32 scale
    ``absmax / 127`` and one signed byte per element, ``q = round(x * 127 / absmax)``. Error
    per element at most ``absmax / 254`` (half a quantisation step) plus ``2**-22 * absmax``
    (float32 rounding of the scale, of its inverse, and of ``x`` times it, which can tip a
    value within that distance of a half step onto the farther level). Ratio for float32:
    3.94 at block 256."""

    name, id = "int8", _IDS["int8"]

    def tolerance(self, x):
        _, am = self._block_absmax(x)
        return (am / 254.0 + am * _ROUNDING + _SUBNORMAL).reshape(np.shape(x))


class Int4Codec(_BlockCodec):
    """Blockwise absmax int4: per block a float32 scale ``absmax / 7`` and 4 bits per element
    (two per byte, even element in the low nibble), ``q = round(x * 7 / absmax)`` in [-7, 7].
    Error per element at most ``absmax / 14`` plus float32 rounding, ``2**-22 * absmax`` (as
    int8). Ratio for float32: 7.76 at block 256."""

    name, id = "int4", _IDS["int4"]

    def tolerance(self, x):
        _, am = self._block_absmax(x)
        return (am / 14.0 + am * _ROUNDING + _SUBNORMAL).reshape(np.shape(x))


class SignCodec(_BlockCodec):
    """Scaled sign (1 bit per element): per block a float32 scale ``mean(|x|)`` and one sign
    bit per element; decodes to ``sign(x) * mean(|x|)`` (zero counts as positive). Error per
    element at most ``absmax`` of its block: far from exact on its own, meant for gradients
    with :class:`mpicomp.ErrorFeedback`, which carries what it drops into the next step
    (1-bit SGD, Seide et al. 2014; signSGD with error feedback, Karimireddy et al. 2019).
    Ratio for float32: 28.4 at block 256."""

    name, id = "sign", _IDS["sign"]

    def tolerance(self, x):
        _, am = self._block_absmax(x)
        return (am * (1 + 1e-5) + _SUBNORMAL).reshape(np.shape(x))


class PowerSGDCodec(Codec):
    """PowerSGD (Vogels et al. 2019), an allreduce algorithm rather than a wire format: an
    allreduce of a matrix (n x m; n-D tensors are viewed as shape[0] x the rest) sends two
    rank-``rank`` factors, ``rank * (n + m)`` numbers instead of ``n * m``. The algorithm and
    its state (residual and warm start, a :class:`mpicomp.powersgd.PowerSGDState` per tensor)
    are in mpicomp.powersgd; this spec names its settings for ``mpicomp.allreduce`` and the
    torch hooks. Allreduce only. No per-element bound: the result is the projection of the
    exact sum onto ``rank`` directions found by one power iteration, and exact when the
    ranks' matrices together span at most ``rank`` columns. Tensors that would not shrink by
    ``min_compression_rate`` (vectors, small or thin matrices) are reduced uncompressed,
    exactly."""

    name, id, block, wire = "powersgd", None, 0, False
    _OPTIONS = {"rank": 4, "min_compression_rate": 2}

    def _in_force(self, options):
        """Its own options (an algorithm of this layer, not a wire format of the core's)."""
        unknown = set(options) - set(self._OPTIONS)
        if unknown:
            raise CodecError(f"codec {self.name!r} has no option {sorted(unknown)[0]!r} (options: "
                             f"{', '.join(sorted(self._OPTIONS))})")
        options = {**self._OPTIONS, **options}
        r, rate = options["rank"], options["min_compression_rate"]
        if not isinstance(r, (int, np.integer)) or isinstance(r, bool) or r < 1:
            raise CodecError(f"codec 'powersgd': rank must be a positive integer, got {r!r}")
        if not isinstance(rate, (int, float, np.integer, np.floating)) or isinstance(rate, bool) or rate < 1:
            raise CodecError(f"codec 'powersgd': min_compression_rate must be a number >= 1, got {rate!r}")
        return 0, options

    def check_dtype(self, dtype_name, argument="x"):
        codec("none").check_dtype(dtype_name, argument)
        if dtype_name in INTEGER_DTYPES:
            raise CodecError(f"codec 'powersgd' compresses floating-point data only, but {argument} has dtype "
                             f"{dtype_name}; use codec='none' for integer arrays")

    def encoded_bytes(self, count, dtype="float32", shape=None):
        """Bytes sent per rank for an allreduce of a tensor of ``shape`` (default: a vector
        of ``count``, which goes uncompressed)."""
        return self.message_bytes(tuple(shape) if shape is not None else (int(count),), dtype)

    def compresses(self, shape):
        """True when a tensor of this shape is compressed (else it goes exactly): a matrix
        that shrinks by min_compression_rate at least."""
        if len(shape) < 2 or 0 in tuple(shape):
            return False
        n, m = shape[0], int(np.prod(shape[1:]))
        return min(self.options["rank"], n, m) * (n + m) * self.options["min_compression_rate"] <= n * m

    def message_bytes(self, shape, dtype="float32"):
        """Its factors' float32 bytes (whatever their size), or the tensor's own bytes when
        it goes uncompressed."""
        if not self.compresses(shape):
            return int(np.prod(shape)) * ITEMSIZE[canonical(dtype)]
        n, m = shape[0], int(np.prod(shape[1:]))
        return 4 * min(self.options["rank"], n, m) * (n + m)

    def ratio(self, dtype="float32", shape=(4096, 4096)):
        """Input bytes / bytes sent for a ``shape`` matrix (default 4096 x 4096)."""
        return int(np.prod(shape)) * ITEMSIZE[canonical(dtype)] / self.message_bytes(shape, dtype)

    def tolerance(self, x):
        raise CodecError("codec 'powersgd' has no per-element error bound (see its docstring)")

    def encode(self, x, residual=None):
        raise CodecError("codec 'powersgd' is an allreduce algorithm: it has no single-process encoding")

    decode = encode


_CODECS = {c.name: c for c in (NoneCodec, Fp16Codec, Bf16Codec, Int8Codec, Int4Codec, SignCodec, PowerSGDCodec,
                               Lz4Codec, BloscCodec, LosslessCodec, NvcompLz4Codec, NvcompBitcompCodec,
                               NvcompAnsCodec, BoundCodec)}
_NVCOMP_NAMES = ("nvcomp-lz4", "nvcomp-bitcomp", "nvcomp-ans")
_CACHE = {}


def codec(spec="none", **options):
    """Returns the :class:`Codec` named by ``spec`` (``"int8"``, ``"int4:block=128"``, or a
    Codec, returned as is) with keyword ``options`` applied. Raises CodecError for an
    unknown name or option."""
    if not options:
        if isinstance(spec, Codec):
            return spec
        c = _CACHE.get(spec) if type(spec) is str else None  # every collective call parses its spec
        if c is not None:
            return c
    if isinstance(spec, Codec):
        name, opts = spec.name, {**spec.options, **options}
    elif isinstance(spec, str):
        for name, split in _SPLITS.items():
            inner = split(spec)
            if inner is not None:  # "auto:int4:block=128": one option, the wrapped codec's spec
                opts = {"codec": inner}
                break
        else:
            name, pairs = _core.split_codec_spec(spec)
            opts = {k: parse_value(v) for k, v in pairs}
        opts.update(options)
    else:
        raise CodecError(f"codec must be a spec string or an mpicomp.Codec, got {type(spec).__name__}")
    cls = _CODECS.get(name)
    if name in _NVCOMP_NAMES and not nvcomp_loaded():
        raise CodecError(f"codec {name!r} needs nvCOMP and a CUDA GPU (pip install 'mpicomp[cuda]'); "
                         f"available: {', '.join(available_codecs())}")
    if cls is None:
        raise CodecError(f"unknown codec {name!r}; available: {', '.join(available_codecs())}")
    c = cls(**opts)
    if not options and isinstance(spec, str):
        _CACHE[spec] = c
    return c


_SPLITS = {}  # {name: split(spec) -> the spec it wraps, or None}: codecs over other codecs


def register_codec(cls, split):
    """Makes codec() build cls (a codec over another codec: mpicomp.auto) for the specs
    split(spec) accepts, passing what it returns as option ``codec``."""
    _CODECS[cls.name] = cls
    _SPLITS[cls.name] = split


def cached(spec):
    """The Codec of a spec string parsed before, else None (a collective's fast path)."""
    return _CACHE.get(spec) if type(spec) is str else None


def wire_codec(spec, where):
    """The Codec of ``spec`` for ``where`` (a collective, an optimizer's argument), which
    sends it as messages: CodecError for an allreduce algorithm (powersgd)."""
    c = codec(spec)
    if not c.wire:
        wire = ", ".join(n for n in available_codecs() if _CODECS[n].wire)
        raise CodecError(f"{where}: codec {c.name!r} is an allreduce algorithm (mpicomp.powersgd), not a wire "
                         f"codec; use one of: {wire}")
    return c


def codec_from_environment(op, default):
    """The codec spec the environment names for collective ``op`` ("allreduce",
    "reduce_scatter", "allgather"; None: send and recv): ``MPICOMP_<OP>_CODEC``, else
    ``MPICOMP_CODEC``, else ``default``; "off", the interposer's pass-through, is "none"
    (MPI's own collective) here. The one rule of the Python API and the torch backend, as of
    the interposer. An invalid value raises CodecError naming the variable."""
    for var in ([f"MPICOMP_{op.upper()}_CODEC"] if op else []) + ["MPICOMP_CODEC"]:
        spec = os.environ.get(var)
        if spec:
            spec = "none" if spec.strip() == "off" else spec
            try:
                codec(spec)
            except CodecError as e:
                unknown = spec.split(":", 1)[0].strip() not in _CODECS  # e lists the codecs
                also = ", auto:<codec>, or off (MPI's own collective)" if unknown else ""
                raise CodecError(f"{var}={os.environ[var]!r}: {e}{also}") from None
            return spec
    return default


def available_codecs():
    """Spec names usable on this build and host (nvcomp-* only where nvCOMP is loaded)."""
    return [n for n in _CODECS if n not in _NVCOMP_NAMES or nvcomp_loaded()]
