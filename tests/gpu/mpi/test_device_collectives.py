"""The collectives on GPU buffers (torch CUDA tensors, cupy arrays) against the same calls on
host buffers: the GPU engine runs the same algorithm with kernels bit-identical to the CPU's,
so lossy codecs must give the very same bytes; codec none (summed by MPI on the host path)
within float32 rounding. Results keep the input's type, dtype, shape and device."""
import numpy as np
import pytest
from mpi4py import MPI

import mpicomp

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not (mpicomp._core.cuda_available() and torch.cuda.is_available()),
                                                  reason="needs a CUDA GPU and a CUDA build of mpicomp")]
WORLD = MPI.COMM_WORLD
LOSSY = ["fp16", "bf16", "int8", "int4", "sign"]


@pytest.fixture(autouse=True)
def compress_everything():
    mpicomp.config.min_bytes = 0


def data(n, dtype=torch.float32, step=0):
    g = torch.Generator().manual_seed(1000 * WORLD.rank + step)
    return (torch.randn(n, generator=g) * 10.0 ** (torch.rand(n, generator=g) * 4 - 2)).to(dtype)


def check(y_gpu, y_cpu, codec):
    assert y_gpu.is_cuda and y_gpu.dtype == y_cpu.dtype and y_gpu.shape == y_cpu.shape
    got = y_gpu.cpu()
    if codec == "none":
        eps = 2.0**-7 if y_cpu.element_size() == 2 else 2.0**-20  # one rounding apart at most
        tol = y_cpu.abs().double() * eps + 1e-30
        assert torch.all((got.double() - y_cpu.double()).abs() <= tol)
    else:
        assert torch.equal(got.view(torch.int16 if got.element_size() == 2 else torch.int32),
                           y_cpu.view(torch.int16 if y_cpu.element_size() == 2 else torch.int32))


@pytest.mark.parametrize("codec", ["none", *LOSSY])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1000, 3 << 18])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_allreduce_matches_the_host(codec, dtype, n, op):
    x = data(n, dtype)
    check(mpicomp.allreduce(x.cuda(), codec=codec, op=op), mpicomp.allreduce(x, codec=codec, op=op), codec)


@pytest.mark.parametrize("codec", ["none", "int8", "sign"])
def test_reduce_scatter_and_allgather_match_the_host(codec):
    x = data(4096 * WORLD.size)
    check(mpicomp.reduce_scatter(x.cuda(), codec=codec), mpicomp.reduce_scatter(x, codec=codec), codec)
    x = data(5000)
    check(mpicomp.allgather(x.cuda(), codec=codec), mpicomp.allgather(x, codec=codec), codec)


def test_error_feedback_on_the_gpu_matches_the_host():
    ef_gpu, ef_cpu = mpicomp.ErrorFeedback(), mpicomp.ErrorFeedback()
    for step in range(3):
        x = data(70000, step=step)
        check(mpicomp.allreduce(x.cuda(), codec="int4", error_feedback=ef_gpu),
              mpicomp.allreduce(x, codec="int4", error_feedback=ef_cpu), "int4")
        assert ef_gpu.residual.is_cuda and torch.equal(ef_gpu.residual.cpu(), ef_cpu.residual)


def test_runs_after_the_callers_work_on_its_stream():
    """x is written by a kernel queued on a side stream; the collective runs on that stream
    (the current one), so it reads x only after the kernel."""
    s = torch.cuda.Stream()
    base = data(1 << 22).cuda()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        x = base * 3  # queued on s
        y = mpicomp.allreduce(x, codec="int8")
    expect = mpicomp.allreduce(base.cpu() * 3, codec="int8")
    check(y, expect, "int8")


def test_cupy_arrays_stay_cupy():
    cp = pytest.importorskip("cupy")
    x = data(10000)
    y = mpicomp.allreduce(cp.asarray(x.numpy()), codec="int8")
    assert isinstance(y, cp.ndarray) and y.dtype == cp.float32
    assert np.array_equal(cp.asnumpy(y), mpicomp.allreduce(x.numpy(), codec="int8"))


def test_iallreduce_on_the_gpu():
    x = data(100000)
    r = mpicomp.iallreduce(x.cuda(), codec="int8")
    check(r.wait(), mpicomp.allreduce(x, codec="int8"), "int8")


@pytest.mark.skipif(not mpicomp.codecs.nvcomp_loaded(), reason="needs nvCOMP (pip install 'mpicomp[cuda]')")
@pytest.mark.parametrize("codec", ["nvcomp-lz4", "nvcomp-bitcomp", "nvcomp-ans"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_lossless_collectives_match_the_host_lz4(codec, dtype):
    """The same frames' contents whatever the codec: the sums match the host's lz4 path bit
    for bit (same order of additions; float64 summed in float64), the gathers are the inputs
    themselves."""
    x = data(300_001, dtype)
    x[(torch.arange(x.numel()) // 4096) % 3 != 0] = 0
    check(mpicomp.allreduce(x.cuda(), codec=codec), mpicomp.allreduce(x, codec="lz4"), codec)
    check(mpicomp.allgather(x.cuda(), codec=codec), mpicomp.allgather(x, codec="none"), codec)
    x = data(70_000 * WORLD.size, dtype)
    check(mpicomp.reduce_scatter(x.cuda(), codec=codec), mpicomp.reduce_scatter(x, codec="lz4"), codec)


def test_powersgd_on_the_gpu_matches_the_host():
    """Low-rank allreduce of CUDA matrices: the factors are reduced on the GPU, results and
    error feedback stay there, and agree with the host computation to float32 rounding of
    the (differently ordered) matrix products and QR."""
    gpu, cpu = mpicomp.powersgd.PowerSGDState(rank=4), mpicomp.powersgd.PowerSGDState(rank=4)
    for step in range(3):
        m = data(512 * 384, step=step).view(512, 384)
        y_gpu = mpicomp.powersgd.allreduce(m.cuda(), gpu)
        y_cpu = mpicomp.powersgd.allreduce(m, cpu)
        ef_gpu, ef_cpu = gpu.feedback, cpu.feedback
        assert y_gpu.is_cuda and y_gpu.shape == m.shape and ef_gpu.residual.is_cuda and gpu.q.is_cuda
        scale = y_cpu.abs().max()
        assert torch.allclose(y_gpu.cpu(), y_cpu, rtol=0, atol=1e-3 * float(scale))
        assert torch.allclose(ef_gpu.residual.cpu(), ef_cpu.residual, rtol=0,
                              atol=1e-3 * float(ef_cpu.residual.abs().max()))
