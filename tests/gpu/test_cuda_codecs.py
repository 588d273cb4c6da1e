"""The CUDA codecs against the CPU's: the same bytes from the same input, and the same values
from the same bytes (format.h is the single definition of both). Skipped without a GPU."""
import pytest

import mpicomp
from mpicomp import _core

from _reference import CODECS

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu
needs_gpu = pytest.mark.skipif(not (_core.cuda_available() and torch.cuda.is_available()),
                               reason="needs a CUDA GPU and a CUDA build of mpicomp")

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}
IDS = {"float32": 0, "float16": 1, "bfloat16": 2, "float64": 3}


def stream():
    return torch.cuda.current_stream().cuda_stream


def make(n, dtype, seed=0, poison=False):
    g = torch.Generator().manual_seed(seed)
    scale = torch.repeat_interleave(10.0 ** (torch.rand(n // 64 + 1, generator=g) * 6 - 3), 64)[:n]
    x = (torch.randn(n, generator=g) * scale).to(TORCH[dtype])
    if poison and n > 300:
        x[300] = float("nan")
        x[n - 1] = float("inf")
    return x


def same(a, b):
    """Bit-identical, except that a NaN only has to be a NaN: the GPU's arithmetic returns
    the canonical NaN where the CPU's keeps an operand's payload."""
    a, b = a.cpu(), b.cpu()
    if a.is_floating_point():
        nan = torch.isnan(a)
        if not torch.equal(nan, torch.isnan(b)):
            return False
        a, b = a[~nan], b[~nan]
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.view(bits), b.view(bits))
    return torch.equal(a, b)


def cpu_encode(c, x, residual=None):
    out = torch.empty(c.encoded_bytes(x.numel(), str(x.dtype)[6:]), dtype=torch.uint8)
    _core.encode(c.id, c.block, IDS[str(x.dtype)[6:]], x.data_ptr(), x.numel(),
                 0 if residual is None else residual.data_ptr(), out.data_ptr())
    return out


def gpu_encode(c, x, residual=None):
    out = torch.empty(c.encoded_bytes(x.numel(), str(x.dtype)[6:]), dtype=torch.uint8, device="cuda")
    _core.cuda_encode(c.id, c.block, IDS[str(x.dtype)[6:]], x.data_ptr(), x.numel(),
                      0 if residual is None else residual.data_ptr(), out.data_ptr(), stream())
    torch.cuda.synchronize()
    return out


# The lossy codecs compute in float32 and refuse float64 (the core's check_combination,
# tested on the host): float64 goes through codec none only.
PAIRS = [(name, dtype) for dtype in TORCH for name in CODECS if dtype != "float64" or name == "none"]


@needs_gpu
@pytest.mark.parametrize("name,dtype", PAIRS)
@pytest.mark.parametrize("n", [1, 31, 257, 4097, 1_000_003])
def test_gpu_encodes_the_cpu_bytes_and_decodes_them_alike(name, dtype, n):
    c = mpicomp.codec(name)
    x = make(n, dtype, seed=n, poison=True)
    cpu_bytes = cpu_encode(c, x)
    gpu_bytes = gpu_encode(c, x.cuda())
    assert torch.equal(gpu_bytes.cpu(), cpu_bytes)
    # decode the CPU's bytes on the GPU, and the GPU's on the CPU
    cpu_bytes_on_gpu, gpu_bytes_on_cpu = cpu_bytes.cuda(), gpu_bytes.cpu()  # kept alive while in use
    y_gpu = torch.empty(n, dtype=TORCH[dtype], device="cuda")
    _core.cuda_decode(c.id, c.block, IDS[dtype], cpu_bytes_on_gpu.data_ptr(), n, 0.5, y_gpu.data_ptr(), stream())
    y_cpu = torch.empty(n, dtype=TORCH[dtype])
    _core.decode(c.id, c.block, IDS[dtype], gpu_bytes_on_cpu.data_ptr(), n, 0.5, y_cpu.data_ptr())
    torch.cuda.synchronize()
    assert same(y_gpu, y_cpu)
    # float64 through none sums in float64 (the core's acc_dtype), the rest in float32
    acc = {v: k for k, v in IDS.items()}[_core.acc_dtype(c.id, IDS[dtype])]
    acc_gpu = torch.ones(n, dtype=TORCH[acc], device="cuda")
    acc_cpu = torch.ones(n, dtype=TORCH[acc])
    _core.cuda_decode_accumulate(c.id, c.block, IDS[dtype], gpu_bytes.data_ptr(), n, acc_gpu.data_ptr(), stream())
    _core.decode_accumulate(c.id, c.block, IDS[dtype], cpu_bytes.data_ptr(), n, acc_cpu.data_ptr())
    torch.cuda.synchronize()
    assert same(acc_gpu, acc_cpu)


@needs_gpu
@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "int4", "sign"])
@pytest.mark.parametrize("block", [32, 256, 4096])
def test_gpu_residual_matches_cpu(name, block):
    c = mpicomp.codec(name, **({"block": block} if name in ("int8", "int4", "sign") else {}))
    x = make(100_001, "float32", seed=block, poison=True)
    r_cpu = make(100_001, "float32", seed=7) * 0.01
    r_gpu = r_cpu.cuda()
    b_cpu = cpu_encode(c, x, r_cpu)
    b_gpu = gpu_encode(c, x.cuda(), r_gpu)
    assert torch.equal(b_gpu.cpu(), b_cpu)
    assert same(r_gpu, r_cpu)
    assert torch.isfinite(r_cpu).all()


@needs_gpu
def test_gpu_non_finite_poisons_its_block():
    c = mpicomp.codec("int8")
    x = torch.ones(1024, device="cuda")
    x[600] = float("inf")
    b = gpu_encode(c, x)
    y = torch.empty(1024, device="cuda")
    _core.cuda_decode(c.id, c.block, 0, b.data_ptr(), 1024, 1.0, y.data_ptr(), stream())
    torch.cuda.synchronize()
    assert not torch.isfinite(y[512:768]).any() and torch.isfinite(y[:512]).all() and torch.isfinite(y[768:]).all()


def test_without_a_gpu_device_tensors_are_refused_clearly():
    """Runs everywhere: a device tensor into a collective is a BackendError naming it."""
    with pytest.raises(mpicomp.BackendError, match="meta"):
        mpicomp.allreduce(torch.ones(4, device="meta"))
    if not _core.cuda_available():
        assert not hasattr(_core, "cuda_encode") or _core.cuda_available() is False
