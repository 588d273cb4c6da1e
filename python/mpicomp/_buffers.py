"""Arrays in and out: numpy arrays and torch tensors in host memory; torch CUDA tensors and
arrays with ``__cuda_array_interface__`` (cupy) in GPU memory. Checked at the boundary so
the C++ core only ever sees a valid address, an element count, a dtype and, for GPU memory,
the stream the caller's work is on. numpy arrays are checked in C++ (_core.numpy_args):
that check runs on every call and must cost well under a microsecond next to a small
message's latency. The rules all kinds of arrays share (supported dtypes, output sizes,
overlap) are written there once; the other kinds call them."""

import numpy as np

from . import _core
from ._dtypes import DTYPE_IDS, ITEMSIZE, canonical, name_of
from .errors import ArgumentError, BackendError

__all__ = ["collective_args", "array_info", "is_torch"]


def is_torch(x):
    return type(x).__module__.startswith("torch")


def _usable_gpu(name):
    if not hasattr(_core, "cuda_collective"):
        raise BackendError(f"{name} is in GPU memory, but this mpicomp build has no CUDA support; "
                           f"rebuild with a CUDA compiler (MPICOMP_CUDA=ON) or move it to the CPU")
    if not _core.cuda_available():
        raise BackendError(f"{name} is in GPU memory, but no CUDA device is usable in this process "
                           f"(no GPU or no driver)")


def _checked_dtype(dtype, name):
    dt = DTYPE_IDS.get(canonical(dtype))
    if dt is None:
        _core.unsupported_dtype(name, str(dtype))
    return dt


def _torch_info(x, name):
    """(address, elements, dtype id, stream): stream None for host memory, else the caller's
    current CUDA stream on x's device, on which the collective runs."""
    if x.is_cuda:
        _usable_gpu(name)
    elif x.device.type != "cpu":
        raise BackendError(f"{name} is on device {x.device}; mpicomp takes CPU and CUDA tensors")
    if not x.is_contiguous():
        raise ArgumentError(f"{name} must be contiguous (got strides {tuple(x.stride())}); pass {name}.contiguous()")
    dt = _checked_dtype(x.dtype, name)
    if not x.is_cuda:
        return x.data_ptr(), x.numel(), dt, None
    import torch

    return x.data_ptr(), x.numel(), dt, torch.cuda.current_stream(x.device).cuda_stream


def _cai_info(x, name):
    """As _torch_info, from __cuda_array_interface__ (version 3: its "stream" is where the
    data is valid; absent or None: valid now, and the legacy default stream serves)."""
    _usable_gpu(name)
    cai = x.__cuda_array_interface__
    shape = tuple(cai["shape"])
    itemsize = np.dtype(cai["typestr"]).itemsize
    contiguous = [itemsize * int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    if cai.get("strides") is not None and any(n > 1 and s != c for n, s, c in zip(shape, cai["strides"], contiguous)):
        raise ArgumentError(f"{name} must be C-contiguous (got strides {tuple(cai['strides'])})")
    return int(cai["data"][0]), int(np.prod(shape)), _checked_dtype(np.dtype(cai["typestr"]), name), \
        cai.get("stream") or 1


def buffer_info(x, name="x"):
    """(address, elements, dtype id, stream) of a contiguous array of a supported dtype;
    stream None for host memory."""
    if isinstance(x, np.ndarray):
        return (*_core.numpy_info(x, name), None)
    if is_torch(x) and hasattr(x, "data_ptr"):
        return _torch_info(x, name)
    if hasattr(x, "__cuda_array_interface__"):
        return _cai_info(x, name)
    raise ArgumentError(f"{name} must be a numpy array, a torch tensor or a CUDA array (cupy), "
                        f"got {type(x).__name__}")


def array_info(x, name="x"):
    """(address, elements, dtype id) of a contiguous host array of a supported dtype."""
    ptr, n, dt, stream = buffer_info(x, name)
    if stream is not None:
        raise BackendError(f"{name} is in GPU memory; send and recv take host buffers (the collectives take both)")
    return ptr, n, dt


def _kind(a):
    return "torch" if is_torch(a) else type(a).__module__.partition(".")[0]


def new_like(x, shape, dtype=None, zero=False):
    """A new array of x's kind (numpy, torch, cupy) on x's device, of x's dtype unless
    `dtype` (a numpy dtype name) says otherwise; zeros when `zero`."""
    if isinstance(x, np.ndarray):
        return (np.zeros if zero else np.empty)(shape, dtype or x.dtype)
    if is_torch(x):
        import torch

        dt = getattr(torch, dtype) if dtype else x.dtype
        return (torch.zeros if zero else torch.empty)(shape, dtype=dt, device=x.device)
    if type(x).__module__.startswith("cupy"):
        import cupy

        with x.device:
            return (cupy.zeros if zero else cupy.empty)(shape, dtype or x.dtype)
    raise ArgumentError(f"pass out= for a {type(x).__name__} (mpicomp allocates torch tensors and cupy arrays only)")


def collective_args(x, out, out_mode, size):
    """Checks a collective's input and (optional) output; allocates the output when None.
    out_mode: 0 out is like x, 1 it has count / size elements (1-D), 2 count * size (1-D).
    Returns (out, x address, out address, x elements, dtype id, stream): stream None for
    host memory, else the CUDA stream (handle) to run on."""
    if type(x) is np.ndarray:
        return (*_core.numpy_args(x, out, out_mode, size), None)
    xptr, n, dt, stream = buffer_info(x, "x")
    m = _core.result_elems(n, out_mode, size)
    if out is None:
        out = new_like(x, tuple(x.shape) if out_mode == 0 else (m,))
    elif _kind(out) != _kind(x) or str(out.dtype) != str(x.dtype):
        kind = f"{_kind(x)} {'tensor' if is_torch(x) else 'array'}"
        raise ArgumentError(f"out must be a {kind} of {x.dtype} like x, got {type(out).__name__}"
                            + (f" of {out.dtype}" if hasattr(out, "dtype") else ""))
    yptr, got, _, ystream = buffer_info(out, "out")
    if (ystream is None) != (stream is None):
        raise ArgumentError("out must be in the same kind of memory as x (both host or both GPU)")
    size = ITEMSIZE[name_of(dt)]
    _core.check_out(xptr, n * size, yptr, m * size, got, m, out_mode == 0)
    return out, xptr, yptr, n, dt, stream
