"""The codecs whose frames' sizes depend on the data (mpicomp.codecs): the lossless ones, on
host arrays (lz4, blosc, lossless) and through NVIDIA nvCOMP on GPU buffers, and the
error-bounded one (bound)."""

import importlib.util
import os

import numpy as np

from . import _core
from ._codec import Codec
from ._dtypes import ITEMSIZE
from .errors import BackendError, CodecError

_IDS = _core.CODEC_IDS
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
    smooth fields cost a few bits per value, noise what its entropy asks. A collective splits
    the bound over the encodings a value goes through (an allreduce on p ranks: p, a
    reduce_scatter p - 1, an allgather 1) and sums in float64, so the bound holds on the
    result at any rank count, with ``op="avg"`` on the mean;
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


_NVCOMP = []


def nvcomp_loaded():
    """Whether nvCOMP is loaded (tried once): a CUDA build with a usable GPU, and the library
    at $MPICOMP_NVCOMP_LIBRARY or from the pip package nvidia-libnvcomp-cu13."""
    if not _NVCOMP:
        path = os.environ.get("MPICOMP_NVCOMP_LIBRARY") or wheel_nvcomp()
        _NVCOMP.append(bool(path and hasattr(_core, "nvcomp_load") and _core.cuda_available()
                            and _core.nvcomp_load(path) == ""))
    return _NVCOMP[0]


def wheel_nvcomp():
    try:
        spec = importlib.util.find_spec("nvidia.libnvcomp")
    except ImportError:
        return None
    for d in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(d, "lib64", "libnvcomp.so.6")
        if os.path.isfile(path):
            return path
    return None
