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

import importlib.util
import os
import types

import numpy as np

from . import _core
from ._dtypes import DTYPE_IDS, INTEGER_DTYPES, ITEMSIZE, canonical
from .config import config
from .errors import ArgumentError, BackendError, CodecError

__all__ = ["Codec", "codec", "available_codecs"]

# The core's tables (format.h), by name.
_IDS = _core.CODEC_IDS


class Codec:
    """A codec with its options. ``name`` is the spec name, ``options`` its keyword options
    with their values in force. The options of the wire codecs, their defaults and their
    ranges are the core's (cpp/codecs/spec.h), which the interposer reads too."""

    id = _IDS["none"]
    name = "none"
    device_only = False  # whether it runs on GPU buffers only
    host_only = False  # whether it runs on host arrays only
    exact = False  # decodes to its input (none, lossless): no error feedback to keep
    framed = False  # a frame whose size depends on the data (lossless, bound): len(encode(x)) measures it
    wire = True  # a message format every collective sends; False: an allreduce algorithm (powersgd)
    adaptive = False  # codec "auto" (mpicomp.auto): this codec or none, by size, as measured

    def __init__(self, **options):
        # Read-only: codecs are shared (codec() caches them by spec), and an option changed
        # after its check would reach the kernels unchecked.
        self.block, options = self._in_force(options)
        self.options = types.MappingProxyType(options)
        self.call_id = self.id  # the codec as the core's collectives take it (mpicomp.auto adds its bit)

    def _in_force(self, options):
        """(block as the core takes it, the options with the defaults filled in), checked."""
        _, block, in_force = _core.wire_codec_spec(self.name, [(k, str(v)) for k, v in options.items()])
        return block, {k: _parse_value(v) for k, v in in_force}

    @property
    def spec(self):
        """The spec string that names this codec with its options."""
        if self.name not in _DEFAULTS:
            _DEFAULTS[self.name] = type(self)().options
        defaults = _DEFAULTS[self.name]
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()) if v != defaults[k])
        return f"{self.name}:{opts}" if opts else self.name

    def __repr__(self):
        return f"mpicomp.codec({self.spec!r})"

    def __eq__(self, other):
        return isinstance(other, Codec) and (self.name, self.options) == (other.name, other.options)

    def __hash__(self):
        return hash((self.name, tuple(sorted(self.options.items()))))

    def check_dtype(self, dtype_name, argument="x"):
        """CodecError unless this codec carries arrays of this dtype (the core's rule, which
        the collectives apply too: lossless codecs carry and sum float64, lossy ones do not)."""
        if dtype_name not in DTYPE_IDS:
            _core.unsupported_dtype(argument, dtype_name)
        _core.check_combination(DTYPE_IDS[dtype_name], self.id, False, argument)

    def check_memory(self, on_device):
        """Raises BackendError when this codec cannot run on host (or device) buffers here."""

    def encoded_bytes(self, count, dtype="float32"):
        """Size in bytes of ``count`` elements of ``dtype`` once encoded: exact for lossy
        codecs, the largest it can be for lossless ones."""
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count < 2**48:
            raise ArgumentError(f"count must be an element count (an int in [0, 2**48)), got {count!r}")
        dtype = canonical(dtype)
        self.check_dtype(dtype)
        return _core.encoded_bytes(self.id, self.block, DTYPE_IDS[dtype], int(count))

    def message_bytes(self, shape, dtype="float32"):
        """Bytes one rank's tensor of ``shape`` takes on the wire in a collective: encoded,
        or as it is below ``config.min_bytes`` (the core sends small messages uncompressed)."""
        count = int(np.prod(shape))
        raw = count * ITEMSIZE[canonical(dtype)]
        return raw if raw < config.min_bytes else self.encoded_bytes(count, dtype)

    def ratio(self, dtype="float32"):
        """Nominal compression ratio (input bytes / encoded bytes) for ``dtype`` input."""
        dtype = canonical(dtype)
        n = max(self.block, 1) * 64
        return n * ITEMSIZE[dtype] / self.encoded_bytes(n, dtype)

    def tolerance(self, x):
        """Largest error of one encode/decode of each element of numpy array ``x`` (float64)."""
        raise NotImplementedError

    # Encoding single-process, for tests, inspection and benchmarks (numpy, host memory).
    def encode(self, x, residual=None):
        """Encodes a contiguous numpy array; returns the bytes as a uint8 array. With a
        float32 ``residual`` of x's size, encodes x + residual and leaves in it what the
        codec dropped (error feedback)."""
        x = np.ascontiguousarray(x)
        dtype = canonical(x.dtype)
        self.check_dtype(dtype)
        out = np.empty(self.encoded_bytes(x.size, dtype), np.uint8)
        rptr = 0
        if residual is not None:
            if residual.dtype != np.float32 or residual.size != x.size or not residual.flags.c_contiguous:
                raise CodecError(f"residual must be a contiguous float32 array of {x.size} elements")
            rptr = residual.ctypes.data
        n = _core.encode(self.id, self.block, DTYPE_IDS[dtype], x.ctypes.data, x.size, rptr, out.ctypes.data)
        return out[:n]

    def decode(self, data, count, dtype="float32"):
        """Decodes ``count`` elements from the bytes ``encode`` returned."""
        dtype = canonical(dtype)
        self.check_dtype(dtype)
        data = np.ascontiguousarray(data, dtype=np.uint8)
        self._check_data(data, count, dtype)
        room = np.zeros(self.encoded_bytes(count, dtype), np.uint8)  # a frame's decoder may read up to its bound
        room[: data.size] = data
        out = np.empty(count, np.dtype(dtype))
        _core.decode(self.id, self.block, DTYPE_IDS[dtype], room.ctypes.data, count, 1.0, out.ctypes.data)
        return out

    def _check_data(self, data, count, dtype):
        self._check_size(data.size, count, dtype)

    def _check_size(self, size, count, dtype):
        if size != self.encoded_bytes(count, dtype):
            raise CodecError(f"data has {size} bytes but {count} {dtype} elements encode to "
                             f"{self.encoded_bytes(count, dtype)} with {self!r}")


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


_FRAME_ALIGN, _CHUNK_BYTES = _core.FRAME_ALIGN, _core.CHUNK_BYTES


class _LosslessCodec(Codec):
    """Lossless: the input's bytes compressed in 64 KiB chunks, each stored as it is when
    compressing does not shrink it, so a frame is at most 4 bytes per chunk and 30 per frame
    (0.006%) larger than its input. Exact. How much it saves depends on the data: ``len(encode(x))`` measures it;
    ``ratio()`` gives the worst case (just under 1)."""

    exact = framed = True

    def tolerance(self, x):
        return np.zeros(np.shape(x))

    def _check_size(self, size, count, dtype):
        if size > self.encoded_bytes(count, dtype) or size % _FRAME_ALIGN:
            raise CodecError(f"data has {size} bytes, which is not a {self.name} frame of {count} {dtype} elements")

    def _check_data(self, data, count, dtype):
        """A frame says how long it is (format.h: a header of one stored size per 64 KiB
        chunk, each chunk padded to 16 bytes): anything shorter or longer is damaged, and the
        decoder, which reads up to the largest frame's size, would see zeros past the cut."""
        self._check_size(data.size, count, dtype)
        chunks = -(-count * ITEMSIZE[dtype] // _CHUNK_BYTES)
        header = -(-4 * chunks // _FRAME_ALIGN) * _FRAME_ALIGN
        if data.size < header:
            raise CodecError(f"{self.name} frame cut short: {data.size} bytes, its header alone has {header}")
        stored = data[:4 * chunks].view("<u4") & ~np.uint32(_core.RAW_CHUNK)
        size = header + int(np.sum(-(-stored.astype(np.int64) // _FRAME_ALIGN) * _FRAME_ALIGN))
        if size != data.size:
            raise CodecError(f"{self.name} frame damaged: its header describes {size} bytes, the data has {data.size}")

    def check_memory(self, on_device):
        if on_device and not nvcomp_loaded():
            raise BackendError(f"codec {self.name!r} on GPU buffers needs nvCOMP: pip install 'mpicomp[cuda]' "
                               f"(nvidia-nvcomp-cu13)")
        if not on_device and self.device_only:
            raise BackendError(f"codec {self.name!r} runs on GPU buffers only (nvCOMP has no host version); "
                               f"'lz4' compresses host arrays")


class Lz4Codec(_LosslessCodec):
    """LZ4 (the lz4 library's block format): on host arrays mpicomp's own greedy encoder, on
    GPU buffers NVIDIA nvCOMP's (needs the ``mpicomp[cuda]`` extra). Either side decodes the
    other's bytes. Fast; shrinks data with repeated byte runs (zeros, sparse or padded
    gradients), little else: float32 noise stays ~1.0x."""

    name, id = "lz4", _IDS["lz4"]


class BloscCodec(_LosslessCodec):
    """C-Blosc2 (the scientific-Python standard for typed lossless compression), host arrays
    only: each 64 KiB chunk is shuffled by byte position (``filter="shuffle"``) or bit
    position (``"bitshuffle"``) over elements of the dtype's size, then compressed by
    ``cname`` (``blosclz``, ``lz4``, ``lz4hc``, ``zlib``, ``zstd``) at ``clevel`` (0-9). Unlike
    LZ4 on raw bytes, the shuffles find the redundancy of dense floating-point data: bfloat16
    and fp32 activations and gradients share their exponents' high bits (about 1.15-1.4x
    measured, sparse data far more). Exact for every dtype. Blosc2 checks every chunk it
    decodes: a damaged frame raises CodecError."""

    name, id, host_only = "blosc", _IDS["blosc"], True

    def check_memory(self, on_device):
        if on_device:
            raise BackendError(f"codec {self.name!r} runs on host arrays only (Blosc2 has no GPU version); "
                               f"'lz4' or the nvcomp-* codecs compress GPU buffers")


class LosslessCodec(BloscCodec):
    """``blosc`` with its defaults, the settings measured best for training traffic (byte
    shuffle, then zstd at level 1: the best ratio in 7 of 8 of bench/lossless_ratios.py's
    gradients and ReLU activations, float32 and bfloat16, against bitshuffle and lz4), under
    a name that says what it promises."""

    name = "lossless"


class NvcompLz4Codec(Lz4Codec):
    """``lz4`` under the name the nvCOMP codecs share; listed only where nvCOMP is loaded."""

    name = "nvcomp-lz4"


class NvcompBitcompCodec(_LosslessCodec):
    """nvCOMP's Bitcomp (GPU buffers only), its compressor for numerical data, run on the
    dtype's words (16, 32 or 64 bits)."""

    name, id, device_only = "nvcomp-bitcomp", _IDS["nvcomp-bitcomp"], True


class NvcompAnsCodec(_LosslessCodec):
    """nvCOMP's ANS (GPU buffers only): rANS entropy coding, told that the bytes are float16
    or float32 words for those dtypes (nvCOMP's float modes)."""

    name, id, device_only = "nvcomp-ans", _IDS["nvcomp-ans"], True


class BoundCodec(Codec):
    """Error-bounded (host arrays only): ``bound:abs=1e-3`` keeps every element of a result
    within 1e-3 of the exact one, ``bound:rel=1e-4`` within 1e-4 times the exact result's
    largest magnitude. Each finite value is quantised to an integer code with the step the
    bound asks for, and the codes are compressed losslessly by C-Blosc2 (bit shuffle, then
    ``cname`` lz4, the default, or zstd: about 1.7x slower, up to 30% fewer bytes), per 64 KiB
    of codes either as they are or as differences of neighbours, whichever is smaller:
    smooth fields cost a few bits per value, noise what its entropy asks. A collective splits the bound over the encodings a value goes through
    (an allreduce on p ranks: p, a reduce_scatter p - 1, an allgather 1) and sums in float64,
    so the bound holds on the result at any rank count, with ``op="avg"`` on the mean;
    a relative bound is estimated from the ranks' largest inputs and checked on the result
    (where cancellation made the result smaller, the call runs again with the bound it
    shows). A bound that rounding to the dtype would use up, or below 2**-38 of the data's
    magnitude, raises CodecError on every rank. NaN and Inf pass through exactly. float64 is
    quantised and summed in float64. Error feedback does not apply (the bound holds in
    every call; an ErrorFeedback's residual is left as it is). One encode/decode keeps the
    bound too (``rel``: times the input's largest finite magnitude), its rounding back to
    the dtype included. ``ratio()`` is the worst case (8 bytes per element, whatever the
    dtype); ``x.nbytes / len(encode(x))`` measures real data's."""

    name, id, host_only, framed = "bound", _IDS["bound"], True, True

    @property
    def spec(self):
        return "bound:" + ",".join(f"{k}={v}" for k, v in sorted(self.options.items())
                                   if (k, v) != ("cname", "lz4"))

    def tolerance(self, x):
        a = np.abs(np.asarray(x, np.float64))
        finite = a[np.isfinite(a)]
        e = self.options["abs"] if "abs" in self.options else self.options["rel"] * (finite.max() if finite.size else 0)
        return np.full(a.shape, float(e))

    def _check_size(self, size, count, dtype):
        if size > self.encoded_bytes(count, dtype) or size % _FRAME_ALIGN or (count and size < 16):
            raise CodecError(f"data has {size} bytes, which is not a bound frame of {count} {dtype} elements")

    def check_memory(self, on_device):
        if on_device:
            raise BackendError("codec 'bound' runs on host arrays only (its codes are compressed by Blosc2)")


_CODECS = {c.name: c for c in (NoneCodec, Fp16Codec, Bf16Codec, Int8Codec, Int4Codec, SignCodec, PowerSGDCodec,
                               Lz4Codec, BloscCodec, LosslessCodec, NvcompLz4Codec, NvcompBitcompCodec,
                               NvcompAnsCodec, BoundCodec)}
_NVCOMP_NAMES = ("nvcomp-lz4", "nvcomp-bitcomp", "nvcomp-ans")
_CACHE = {}
_DEFAULTS = {}  # {name: the options of a spec that names none}


def _parse_value(text):
    for parse in (lambda t: int(t, 0), float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


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
            opts = {k: _parse_value(v) for k, v in pairs}
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
                raise CodecError(f"{var}={os.environ[var]!r}: {e}") from None
            return spec
    return default


def available_codecs():
    """Spec names usable on this build and host (nvcomp-* only where nvCOMP is loaded)."""
    return [n for n in _CODECS if n not in _NVCOMP_NAMES or nvcomp_loaded()]


_NVCOMP = []


def nvcomp_loaded():
    """Whether nvCOMP is loaded (tried once): a CUDA build with a usable GPU, and the library
    at $MPICOMP_NVCOMP_LIBRARY or from the pip package nvidia-libnvcomp-cu13."""
    if not _NVCOMP:
        path = os.environ.get("MPICOMP_NVCOMP_LIBRARY") or _wheel_nvcomp()
        _NVCOMP.append(bool(path and hasattr(_core, "nvcomp_load") and _core.cuda_available()
                            and _core.nvcomp_load(path) == ""))
    return _NVCOMP[0]


def _wheel_nvcomp():
    try:
        spec = importlib.util.find_spec("nvidia.libnvcomp")
    except ImportError:
        return None
    for d in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(d, "lib64", "libnvcomp.so.6")
        if os.path.isfile(path):
            return path
    return None
