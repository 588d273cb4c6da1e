"""mpicomp's Python layer on GPU arrays, without a GPU (tests/test_fake_cuda.py). Runs with
PYTHONPATH at a copy of the package whose _core is built over the stand-in CUDA runtime
(kernels on the CPU) and MPICOMP_NVCOMP_LIBRARY at the stand-in nvCOMP. DeviceArray stands
for a cupy array: memory from the stand-in cudaMalloc, handed over by
__cuda_array_interface__. Every call must give the bytes the same call gives on numpy
arrays, and bad input the errors it gives there, on every rank. With "two_devices", only
the checks of calls on the stand-in's second device.
    mpiexec -n N python python_check.py [two_devices]
"""
import ctypes
import os
import sys
import time

import numpy as np
from mpi4py import MPI

sys.setdlopenflags(os.RTLD_NOW | os.RTLD_GLOBAL)  # the stand-in nvCOMP links to _core's symbols
import mpicomp  # noqa: E402
from mpicomp import _core  # noqa: E402

LIB = ctypes.CDLL(_core.__file__)
LIB.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
LIB.cudaFree.argtypes = [ctypes.c_void_p]
LIB.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
LIB.cudaGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
HOST_TO_DEVICE, DEVICE_TO_HOST = 1, 2

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
failed = []


def expect(ok, what):
    if not ok:
        failed.append(what)
        print(f"rank {rank}: FAIL {what}", file=sys.stderr, flush=True)


def current_device():
    d = ctypes.c_int(-1)
    assert LIB.cudaGetDevice(ctypes.byref(d)) == 0
    return d.value


class DeviceArray:
    """A C-contiguous array in stand-in device memory, `offset` bytes into its allocation
    (as a slice of a larger array would be), on `device` (default: the current one);
    `strides` only to be reported."""

    def __init__(self, host, offset=0, strides=None, device=None):
        host = np.ascontiguousarray(host)
        self.shape, self.dtype, self.strides = host.shape, host.dtype, strides
        self._base = ctypes.c_void_p()
        current = current_device()
        assert LIB.cudaSetDevice(current if device is None else device) == 0
        assert LIB.cudaMalloc(ctypes.byref(self._base), host.nbytes + offset) == 0
        assert LIB.cudaSetDevice(current) == 0
        self.ptr = self._base.value + offset
        assert LIB.cudaMemcpyAsync(self.ptr, host.ctypes.data, host.nbytes, HOST_TO_DEVICE, None) == 0

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False), "version": 3,
                "strides": self.strides, "stream": 1}

    def get(self):
        h = np.empty(self.shape, self.dtype)
        assert LIB.cudaMemcpyAsync(h.ctypes.data, self.ptr, h.nbytes, DEVICE_TO_HOST, None) == 0
        return h

    def __del__(self):
        LIB.cudaFree(self._base)


def data(n, dtype, seed):
    """Runs of zeros between stretches of noise (lossless codecs compress some chunks and
    store others), different on every rank."""
    x = np.random.default_rng(seed * 1000 + rank).standard_normal(n).astype(dtype)
    x[(np.arange(n) // 3000) % 3 != 0] = 0
    return x


def same_bits(a, b):
    """Equal bit for bit, but any NaN equals any NaN: a NaN's sign and payload after
    arithmetic depend on the processor (a GPU makes one NaN of all)."""
    nan = np.isnan(a)
    return np.array_equal(nan, np.isnan(b)) and a[~nan].tobytes() == b[~nan].tobytes()


def same(got, want, codec, coll):
    if codec == "none" and coll != "allgather":  # the host sums through MPI: another order
        tol = 1e-2 if got.dtype == np.float16 else 1e-5
        return np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    return got.tobytes() == want.tobytes()


# name, function, input and output elements per element of n
COLLECTIVES = (("allreduce", mpicomp.allreduce, 1, 1), ("reduce_scatter", mpicomp.reduce_scatter, size, 1),
               ("allgather", mpicomp.allgather, 1, size))


def collectives():
    """Every collective, codec, dtype and op on DeviceArrays equals the numpy result."""
    reference = {"nvcomp-lz4": "lz4", "nvcomp-bitcomp": "lz4", "nvcomp-ans": "lz4"}  # all restore the bytes
    # bound needs its bound (bound:abs=...) and runs on host memory only, as blosc: both below
    codecs = [c for c in mpicomp.available_codecs() if c != "bound" and mpicomp.codec(c).wire
              and not mpicomp.codec(c).host_only]
    expect({"nvcomp-lz4", "nvcomp-bitcomp", "nvcomp-ans"} <= set(codecs), f"nvcomp codecs available: {codecs}")
    for name, f, n_in, n_out in COLLECTIVES:
        for codec in codecs:
            # float64 with the lossless codecs, which sum it in float64 (on the host)
            for dtype in (np.float32, np.float16) + ((np.float64,) if mpicomp.codec(codec).exact else ()):
                for n, offset in ((1001, 0), (70001, 1)):
                    for op in ("sum", "avg") if name != "allgather" else (None,):
                        kw = {"op": op} if op else {}
                        x = data(n * n_in, dtype, n + offset)
                        want = f(x, codec=reference.get(codec, codec), **kw)
                        itemsize = np.dtype(dtype).itemsize
                        dx = DeviceArray(x, offset * itemsize)
                        dy = DeviceArray(np.full(n * n_out, 7, dtype), offset * itemsize)
                        got = f(dx, codec=codec, out=dy, **kw)
                        expect(got is dy and same(dy.get(), want, codec, name),
                               f"{name} codec {codec} {np.dtype(dtype).name} n {n} offset {offset} op {op}")


def mixed():
    """Rank 0 with host arrays and the others with GPU arrays in one call (uncompressed small
    and large, compressed, lossless: nvcomp-lz4 writes lz4's frames) give the bytes of the
    same call with host arrays everywhere, in the segments of GPU buffers: the ranks with host
    arrays learn from the agreement that the others' are on a GPU."""
    cfg = mpicomp.config
    cfg.gpu_segment_bytes = 48 << 10
    for name, f, n_in, n_out in COLLECTIVES:
        for codec, dtype, n in (("none", np.float32, 100), ("none", np.float32, 70001), ("none", np.float16, 70001),
                                ("int8", np.float32, 70001), ("fp16", np.float16, 1001), ("lz4", np.float32, 70001),
                                ("lz4", np.float64, 70001)):
            x = data(n * n_in, dtype, n)
            cfg.segment_bytes = cfg.gpu_segment_bytes
            want = f(x, codec=codec)
            cfg.segment_bytes = 64 << 10
            if rank == 0:
                got = f(x, codec=codec)
            else:
                dy = DeviceArray(np.zeros(n * n_out, dtype))
                f(DeviceArray(x), codec="nvcomp-lz4" if codec == "lz4" else codec, out=dy)
                got = dy.get()
            expect(got.tobytes() == want.tobytes(), f"{name} codec {codec} {np.dtype(dtype).name} n {n}: rank 0 on "
                                                    f"the host, the others on the GPU")
    cfg.gpu_segment_bytes = cfg.segment_bytes
    # Above cache_bytes an uncompressed allreduce goes in pieces that fit the pinned staging,
    # on the GPU and the host ranks alike (here 1 MiB pieces of 2.8 MB, rank 0 in place)
    kept, cfg.cache_bytes = cfg.cache_bytes, 2 << 20
    for op in ("sum", "avg"):
        x = data(700_001, np.float32, 9)
        want = mpicomp.allreduce(x, codec="none", op=op)
        if rank == 0:
            got = mpicomp.allreduce(x, codec="none", op=op, out=x)
        else:
            dy = DeviceArray(np.zeros_like(x))
            mpicomp.allreduce(DeviceArray(x), codec="none", op=op, out=dy)
            got = dy.get()
        expect(got.tobytes() == want.tobytes(), f"allreduce codec none {op} in pieces: rank 0 on the host")
    cfg.cache_bytes = kept


def codec_kernels():
    """Each lossy codec's kernels through the bindings: the GPU's bytes are the host's, either
    side's bytes decode (scaled) and accumulate alike on the other, and the error-feedback
    residual matches; with blocks poisoned by NaN and Inf, float16 input, odd sizes, and
    blocks so tiny (int8/int4 lift them) or so large (the sign codec's sum overflows) that
    they take the kernels' rare paths."""
    ids = {"float32": 0, "float16": 1}
    for name in ("fp16", "bf16", "int8", "int4", "sign"):
        c = mpicomp.codec(name, **({"block": 1056} if name == "int4" else {}))
        for dtype, magnitude in (("float32", 1.0), ("float16", 1.0), ("float32", 1e-39), ("float32", 2e37)):
            for n in (1, 31, 257, 4097, 100_003):
                what = f"codec {name} {dtype} x {magnitude:g} n {n}"
                x = (np.random.default_rng(n).standard_normal(n) * magnitude).astype(dtype)
                x[n // 2] = np.nan
                x[n // 3] = np.inf if n > 3 else x[n // 3]
                res = np.random.default_rng(7).standard_normal(n).astype(np.float32) * 0.01
                dres = DeviceArray(res)
                cpu = c.encode(x, residual=res)
                dx, gpu, cpu_on_gpu = DeviceArray(x), DeviceArray(np.zeros(cpu.size, np.uint8)), DeviceArray(cpu)
                _core.cuda_encode(c.id, c.block, ids[dtype], dx.ptr, n, dres.ptr, gpu.ptr, 1)
                expect(gpu.get().tobytes() == cpu.tobytes(), f"{what}: GPU bytes")
                expect(dres.get().tobytes() == res.tobytes(), f"{what}: GPU residual")
                y_gpu, y_cpu = DeviceArray(np.zeros(n, dtype)), np.zeros(n, dtype)
                gpu_on_cpu = gpu.get()
                _core.cuda_decode(c.id, c.block, ids[dtype], cpu_on_gpu.ptr, n, 0.5, y_gpu.ptr, 1)
                _core.decode(c.id, c.block, ids[dtype], gpu_on_cpu.ctypes.data, n, 0.5, y_cpu.ctypes.data)
                expect(same_bits(y_gpu.get(), y_cpu), f"{what}: decoded on the other side")
                acc_gpu, acc_cpu = DeviceArray(np.ones(n, np.float32)), np.ones(n, np.float32)
                _core.cuda_decode_accumulate(c.id, c.block, ids[dtype], gpu.ptr, n, acc_gpu.ptr, 1)
                _core.decode_accumulate(c.id, c.block, ids[dtype], cpu.ctypes.data, n, acc_cpu.ctypes.data)
                expect(same_bits(acc_gpu.get(), acc_cpu), f"{what}: accumulated")
    # Codec none: both sides sum in the core's acc_dtype, float64 for float64 input
    for dtype, tid in (("float32", 0), ("float64", 3)):
        x = np.random.default_rng(3).standard_normal(4097).astype(dtype)
        acc_t = np.float64 if _core.acc_dtype(0, tid) == 3 else np.float32
        expect(acc_t == (np.float64 if dtype == "float64" else np.float32), f"codec none {dtype}: acc_dtype")
        dx, acc_gpu, acc_cpu = DeviceArray(x), DeviceArray(np.ones(x.size, acc_t)), np.ones(x.size, acc_t)
        _core.cuda_decode_accumulate(0, 0, tid, dx.ptr, x.size, acc_gpu.ptr, 1)
        _core.decode_accumulate(0, 0, tid, x.ctypes.data, x.size, acc_cpu.ctypes.data)
        expect(same_bits(acc_gpu.get(), acc_cpu) and same_bits(acc_cpu, x.astype(acc_t) + 1),
               f"codec none {dtype}: accumulated")


def nonblocking_and_feedback():
    x = data(50001, np.float32, 5)
    dy = DeviceArray(np.zeros(x.size, np.float32))
    mpicomp.iallreduce(DeviceArray(x), codec="int8", out=dy).wait()
    expect(same(dy.get(), mpicomp.allreduce(x, codec="int8"), "int8", "allreduce"), "iallreduce int8")

    host, dev = mpicomp.ErrorFeedback(), mpicomp.ErrorFeedback()
    dev.residual = DeviceArray(np.zeros(x.size, np.float32))  # cupy arrays get one made like x
    for step in range(3):
        want = mpicomp.allreduce(x, codec="int4", error_feedback=host)
        got = mpicomp.allreduce(DeviceArray(x), codec="int4", out=DeviceArray(x), error_feedback=dev)
        expect(same(got.get(), want, "int4", "allreduce"), f"error feedback step {step}: result")
        expect(dev.residual.get().tobytes() == host.residual.tobytes(), f"error feedback step {step}: residual")


def raises(kind, what, call):
    try:
        call()
    except mpicomp.MpicompError as e:
        expect(type(e) is kind, f"{what}: {kind.__name__} expected, got {type(e).__name__}: {e}")
        return
    expect(False, f"{what}: {kind.__name__} expected, nothing raised")


def errors():
    """Bad input raises on every rank (those with good input: ShapeMismatchError), and the
    next call works."""
    x = data(4096, np.float32, 9)
    raises(mpicomp.ArgumentError, "device x, host out",
           lambda: mpicomp.allreduce(DeviceArray(x), codec="int8", out=np.empty_like(x)))
    raises(mpicomp.ArgumentError, "non-contiguous device x",
           lambda: mpicomp.allreduce(DeviceArray(np.zeros((64, 64), np.float32), strides=(4, 256)), codec="int8"))
    raises(mpicomp.BackendError if rank == 0 else mpicomp.ShapeMismatchError, "nvcomp-ans on host memory at rank 0",
           lambda: mpicomp.allreduce(x if rank == 0 else DeviceArray(x), codec="nvcomp-ans",
                                     out=None if rank == 0 else DeviceArray(x)))
    raises(mpicomp.BackendError if rank == 0 else mpicomp.ShapeMismatchError, "lossless (Blosc2) on GPU memory at rank 0",
           lambda: mpicomp.allreduce(DeviceArray(x) if rank == 0 else x, codec="lossless",
                                     out=DeviceArray(x) if rank == 0 else None))
    raises(mpicomp.BackendError if rank == 0 else mpicomp.ShapeMismatchError, "bound on GPU memory at rank 0",
           lambda: mpicomp.allreduce(DeviceArray(x) if rank == 0 else x, codec="bound:abs=1e-3",
                                     out=DeviceArray(x) if rank == 0 else None))
    y = x.astype(np.float16) if rank == 0 else x
    raises(mpicomp.ShapeMismatchError, "dtypes differ between ranks",
           lambda: mpicomp.allreduce(DeviceArray(y), codec="int8", out=DeviceArray(y)))
    dy = DeviceArray(x)
    mpicomp.allreduce(DeviceArray(x), codec="int8", out=dy)
    expect(same(dy.get(), mpicomp.allreduce(x, codec="int8"), "int8", "allreduce"), "a call after the errors")


def stalled():
    """The last rank skips a call on GPU arrays, compressed (GPU segments) or not (pinned
    staging): the others raise CommTimeoutError once the timeout is up, and a fresh
    communicator then gives the numpy bytes."""
    timeout, before = 1.0, mpicomp.config.timeout_s
    mpicomp.config.timeout_s = timeout
    try:
        for name, f, n_in, n_out in COLLECTIVES:
            for codec in ("int8", "none"):
                x = data(70001 * n_in, np.float32, 11)
                what = f"{name} codec {codec}: the last rank stalled"
                c = comm.Dup()
                f(DeviceArray(x), comm=c, codec=codec, out=DeviceArray(np.zeros(70001 * n_out, np.float32)))
                if rank != size - 1:
                    t0 = time.perf_counter()
                    raises(mpicomp.CommTimeoutError, what, lambda: f(
                        DeviceArray(x), comm=c, codec=codec, out=DeviceArray(np.zeros(70001 * n_out, np.float32))))
                    waited = time.perf_counter() - t0
                    expect(0.9 * timeout <= waited < timeout + 10, f"{what}: raised after {waited:.2f} s")
                comm.Barrier()
                c.Free()
                fresh = comm.Dup()
                dy = DeviceArray(np.zeros(70001 * n_out, np.float32))
                f(DeviceArray(x), comm=fresh, codec=codec, out=dy)
                expect(dy.get().tobytes() == f(x, comm=fresh, codec=codec).tobytes(), f"{what}: then a fresh one")
                fresh.Free()
    finally:
        mpicomp.config.timeout_s = before


def two_devices():
    """Calls on device 1's arrays while device 0 is current: equal to the host's results,
    device 0 still current after each, and device 0's buffers (kept per thread between calls)
    never handed to device 1's kernels and nvCOMP batches, which stop on them."""
    for name, f, n_in, n_out in COLLECTIVES:
        for codec in ("int8", "nvcomp-lz4", "none"):
            x = data(70001 * n_in, np.float32, 11)
            want = f(x, codec="lz4" if codec == "nvcomp-lz4" else codec)
            for device in (0, 1, 0):
                dy = DeviceArray(np.zeros(70001 * n_out, np.float32), device=device)
                f(DeviceArray(x, device=device), codec=codec, out=dy)
                what = f"{name} codec {codec} on device {device}"
                expect(same(dy.get(), want, codec, name), f"{what}: result")
                expect(current_device() == 0, f"{what}: device {current_device()} current after it, not 0")
    dy = DeviceArray(np.zeros(50001, np.float32), device=1)
    mpicomp.iallreduce(DeviceArray(data(50001, np.float32, 5), device=1), codec="int8", out=dy).wait()
    expect(same(dy.get(), mpicomp.allreduce(data(50001, np.float32, 5), codec="int8"), "int8", "allreduce"),
           "iallreduce int8 on device 1")


def main():
    mpicomp.config.min_bytes = 0
    # Several segments per part; the tiles shape lossy sums, so GPU calls take the host's to
    # give its bytes (mixed() sets them apart)
    mpicomp.config.segment_bytes = mpicomp.config.gpu_segment_bytes = 64 << 10
    expect(_core.cuda_available() and mpicomp.codecs.nvcomp_loaded(), "the stand-in GPU and nvCOMP are usable")
    if sys.argv[1:] == ["two_devices"]:
        two_devices()
    else:
        codec_kernels()
        collectives()
        mixed()
        nonblocking_and_feedback()
        errors()
        stalled()
    total = comm.allreduce(len(failed))
    if rank == 0:
        print(f"python_check: {total} failed checks", flush=True)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
