"""The base of every codec (mpicomp.codecs): its options, checked by the core's rules, and
one encode/decode in a single process."""

import types

import numpy as np

from . import _core
from ._dtypes import DTYPE_IDS, ITEMSIZE, canonical
from .config import config
from .errors import ArgumentError, CodecError

_DEFAULTS = {}  # {name: the options of a spec that names none}


def parse_value(text):
    """An option's value as written in a spec: an int, a float, else the text."""
    for parse in (lambda t: int(t, 0), float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


class Codec:
    """A codec with its options. ``name`` is the spec name, ``options`` its keyword options
    with their values in force. The options of the wire codecs, their defaults and their
    ranges are the core's (cpp/codecs/spec.h), which the interposer reads too."""

    id = _core.CODEC_IDS["none"]
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
        return block, {k: parse_value(v) for k, v in in_force}

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
