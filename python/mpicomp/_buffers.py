"""Arrays in and out: numpy arrays and torch tensors (host memory), checked at the boundary
so the C++ core only ever sees a valid address, an element count and a dtype."""

import numpy as np

from . import _core
from .codecs import DTYPE_IDS, _dtype_name
from .errors import ArgumentError, BackendError, CodecError

__all__ = ["Buffer", "as_buffer", "empty_like", "check_out"]


class Buffer:
    """A checked view of a caller's array: address, element count, dtype name and id."""

    __slots__ = ("obj", "ptr", "count", "dtype", "dtype_id", "shape", "is_torch")

    def __init__(self, obj, ptr, count, dtype, shape, is_torch):
        self.obj, self.ptr, self.count, self.dtype, self.shape, self.is_torch = obj, ptr, count, dtype, shape, is_torch
        self.dtype_id = DTYPE_IDS[dtype]


# np.dtype.name is computed in Python on every access: look dtypes up instead.
_NUMPY_DTYPES = {np.dtype(name).char: name for name in DTYPE_IDS if name != "bfloat16"}


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def as_buffer(x, name="x"):
    """Checks that x is a contiguous host array of a supported dtype; returns a Buffer."""
    if isinstance(x, np.ndarray):
        ptr, count, char, contiguous = _core.ndarray_info(x)
        if not contiguous:
            raise ArgumentError(f"{name} must be C-contiguous (got strides {x.strides}); pass np.ascontiguousarray({name})")
        dtype = _NUMPY_DTYPES.get(char)
        if dtype is None:
            raise CodecError(f"{name} has dtype {x.dtype}, which mpicomp does not support")
        return Buffer(x, ptr, count, dtype, x.shape, False)
    if _is_torch(x) and hasattr(x, "data_ptr"):
        if x.device.type != "cpu":
            raise BackendError(f"{name} is on device {x.device}, but this mpicomp build has no GPU support "
                               f"(built without CUDA); move it to the CPU or rebuild with CUDA")
        if not x.is_contiguous():
            raise ArgumentError(f"{name} must be contiguous (got strides {tuple(x.stride())}); pass {name}.contiguous()")
        dtype = _dtype_name(x.dtype)
        if dtype not in DTYPE_IDS:
            raise CodecError(f"{name} has dtype {x.dtype}, which mpicomp does not support")
        return Buffer(x, x.data_ptr(), x.numel(), dtype, tuple(x.shape), True)
    raise ArgumentError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")


def empty_like(buf, shape=None):
    """A new array of buf's kind and dtype (and device), of `shape` (default: buf's)."""
    shape = buf.shape if shape is None else shape
    if buf.is_torch:
        import torch

        return torch.empty(shape, dtype=buf.obj.dtype, device=buf.obj.device)
    return np.empty(shape, dtype=buf.obj.dtype)


def check_out(out, like, count, name="out"):
    """Checks a caller-provided output: same kind and dtype as the input, `count` elements."""
    b = as_buffer(out, name)
    if b.is_torch != like.is_torch or b.dtype != like.dtype:
        kind = lambda v: ("torch tensor" if v.is_torch else "numpy array") + f" of {v.dtype}"
        raise ArgumentError(f"{name} must be a {kind(like)} like x, got a {kind(b)}")
    if b.count != count:
        raise ArgumentError(f"{name} has {b.count} elements but the result has {count}")
    return b
