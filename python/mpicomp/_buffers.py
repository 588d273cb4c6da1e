"""Arrays in and out: numpy arrays and torch tensors (host memory), checked at the boundary
so the C++ core only ever sees a valid address, an element count and a dtype. numpy arrays
are checked in C++ (mpicomp._core.numpy_args): that check runs on every call and must cost
well under a microsecond next to a small message's latency."""

import numpy as np

from . import _core
from .codecs import DTYPE_IDS, _dtype_name
from .errors import ArgumentError, BackendError, CodecError

__all__ = ["collective_args", "array_info", "dtype_name"]
_NAMES = {i: name for name, i in DTYPE_IDS.items()}


def dtype_name(dtype_id):
    return _NAMES[dtype_id]


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _torch_info(x, name):
    if x.device.type != "cpu":
        raise BackendError(f"{name} is on device {x.device}, but this mpicomp build has no GPU support "
                           f"(built without CUDA); move it to the CPU or rebuild with CUDA")
    if not x.is_contiguous():
        raise ArgumentError(f"{name} must be contiguous (got strides {tuple(x.stride())}); pass {name}.contiguous()")
    dtype = _dtype_name(x.dtype)
    if dtype not in DTYPE_IDS:
        raise CodecError(f"{name} has dtype {x.dtype}, which mpicomp does not support")
    return x.data_ptr(), x.numel(), DTYPE_IDS[dtype]


def array_info(x, name="x"):
    """(address, elements, dtype id) of a contiguous host array of a supported dtype."""
    if isinstance(x, np.ndarray):
        return _core.numpy_info(x, name)
    if _is_torch(x) and hasattr(x, "data_ptr"):
        return _torch_info(x, name)
    raise ArgumentError(f"{name} must be a numpy array or a torch tensor, got {type(x).__name__}")


def collective_args(x, out, out_mode, size):
    """Checks a collective's input and (optional) output; allocates the output when None.
    out_mode: 0 out is like x, 1 it has count / size elements (1-D), 2 count * size (1-D).
    Returns (out, x address, out address, x elements, dtype id)."""
    if type(x) is np.ndarray:
        return _core.numpy_args(x, out, out_mode, size)
    xptr, n, dt = array_info(x, "x")
    if out_mode == 1 and n % size:
        raise ArgumentError(f"reduce_scatter: x has {n} elements, which is not a multiple of the "
                            f"communicator size {size}")
    m = n if out_mode == 0 else n // size if out_mode == 1 else n * size
    if out is None:
        import torch

        out = torch.empty(tuple(x.shape) if out_mode == 0 else (m,), dtype=x.dtype, device=x.device)
    elif not (_is_torch(out) and hasattr(out, "data_ptr")) or out.dtype != x.dtype:
        raise ArgumentError(f"out must be a torch tensor of {x.dtype} like x, got {type(out).__name__}"
                            + (f" of {out.dtype}" if hasattr(out, "dtype") else ""))
    yptr, got, _ = array_info(out, "out")
    if got != m:
        raise ArgumentError(f"out has {got} elements but the result has {m}")
    return out, xptr, yptr, n, dt
