"""nvCOMP's lossless codecs on device buffers (skipped without a GPU and nvCOMP): exact round
trips, real compression where the data repeats, and LZ4 frames that the host decodes and
the GPU reads from the host (the same format both ways)."""
import numpy as np
import pytest

import mpicomp
from mpicomp import _core

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (_core.cuda_available() and torch.cuda.is_available()
                                      and mpicomp.codecs.nvcomp_loaded()),
                                 reason="needs a CUDA GPU, a CUDA build and nvCOMP (pip install 'mpicomp[cuda]')")]
NVCOMP = ["nvcomp-lz4", "nvcomp-bitcomp", "nvcomp-ans"]
IDS = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def sparse(n, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    rows = torch.rand(n // 256 + 1, generator=g) < 0.2
    return (torch.randn(n, generator=g) * torch.repeat_interleave(rows, 256)[:n]).to(dtype)


def encode(c, x, offset=0):
    """Frame of x (a CUDA tensor) as a CUDA uint8 tensor; `offset` bytes into a bigger buffer."""
    room = torch.zeros(c.encoded_bytes(x.numel(), x.dtype) + offset, dtype=torch.uint8, device="cuda")
    st = torch.cuda.current_stream().cuda_stream
    n = _core.cuda_encode(c.id, 0, IDS[x.dtype], x.data_ptr(), x.numel(), 0, room.data_ptr() + offset, st)
    return room[offset:offset + n]


def decode(c, frame, n, dtype):
    room = torch.zeros(c.encoded_bytes(n, dtype), dtype=torch.uint8, device="cuda")
    room[:frame.numel()] = frame
    y = torch.empty(n, dtype=dtype, device="cuda")
    _core.cuda_decode(c.id, 0, IDS[dtype], room.data_ptr(), n, 1.0, y.data_ptr(), torch.cuda.current_stream().cuda_stream)
    return y


@pytest.mark.parametrize("name", NVCOMP)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 1000, 16384, 16385, 1_000_003])
@pytest.mark.parametrize("kind", ["noise", "sparse", "zeros"])
def test_roundtrip_is_exact(name, dtype, n, kind):
    c = mpicomp.codec(name)
    x = {"noise": lambda: torch.randn(n).to(dtype), "sparse": lambda: sparse(n, dtype),
         "zeros": lambda: torch.zeros(n, dtype=dtype)}[kind]().cuda()
    frame = encode(c, x)
    assert frame.numel() % 16 == 0 and frame.numel() <= c.encoded_bytes(n, dtype)
    if kind == "zeros" and n >= 16384:  # ANS in nvCOMP's float modes: 1.88 for 16-bit zeros on an H200
        assert x.nbytes / frame.numel() > (1.25 if name == "nvcomp-ans" else 20)
    y = decode(c, frame, n, dtype)
    assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("name", NVCOMP)
def test_unaligned_buffers(name):
    c = mpicomp.codec(name)
    base = sparse(100_001).cuda()
    x = base[1:]  # 4 bytes off the allocation's alignment
    frame = encode(c, x, offset=16)
    y = torch.empty(100_001, device="cuda")[1:]
    room = torch.zeros(c.encoded_bytes(x.numel()), dtype=torch.uint8, device="cuda")
    room[:frame.numel()] = frame
    _core.cuda_decode(c.id, 0, 0, room.data_ptr(), x.numel(), 1.0, y.data_ptr(), torch.cuda.current_stream().cuda_stream)
    assert torch.equal(y, x)


def test_gpu_lz4_frames_decode_on_the_host_and_back():
    x = sparse(700_000)
    gpu_frame = encode(mpicomp.codec("nvcomp-lz4"), x.cuda()).cpu().numpy()
    assert np.array_equal(mpicomp.codec("lz4").decode(gpu_frame, x.numel()), x.numpy())
    host_frame = mpicomp.codec("lz4").encode(x.numpy())
    y = decode(mpicomp.codec("nvcomp-lz4"), torch.from_numpy(host_frame).cuda(), x.numel(), torch.float32)
    assert torch.equal(y.cpu(), x)


def test_corrupt_frame_raises_codec_error():
    c = mpicomp.codec("nvcomp-ans")
    x = sparse(200_000).cuda()
    frame = encode(c, x).clone()
    frame[64:128] ^= 0x5A
    with pytest.raises(mpicomp.MpicompError):
        decode(c, frame, x.numel(), torch.float32)
