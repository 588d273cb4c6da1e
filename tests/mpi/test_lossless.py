"""Lossless codecs lz4 and blosc (Blosc2; "lossless" is its defaults) in the collectives and
send/recv: results as exact as codec none's (allgather and send/recv bit for bit, float64
included; sums to float32 accumulation), identical on every rank, and codecs that run on GPU
buffers only refused on host arrays by every rank."""
import numpy as np
import pytest

import mpicomp

from _mpiutil import comm_of, rng

N = 300_001  # several 64 KiB chunks per rank, and a ragged last one
CODECS = ["lz4", "lossless", "blosc:cname=lz4,filter=shuffle"]
lossless = pytest.mark.parametrize("codec", CODECS)


def mixed(comm, n, dtype=np.float32):
    """Runs of zeros (which compress) between dense stretches (which do not)."""
    g = rng(comm, n, "lossless")
    x = g.standard_normal(n)
    x[(np.arange(n) // 4096) % 3 != 0] = 0.0
    return x.astype(dtype)


@pytest.mark.parametrize("kind", ["world", "split"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@lossless
def test_allreduce(kind, dtype, codec):
    comm = comm_of(kind)
    x = mixed(comm, N, dtype)
    y = mpicomp.allreduce(x, comm=comm, codec=codec)
    exact = np.zeros(N)
    comm.Allreduce(x.astype(np.float64), exact)
    allx = np.zeros((comm.Get_size(), N))
    comm.Allgather(x.astype(np.float64), allx)
    # float32 accumulation of size terms, then (float16) the output's rounding
    bound = comm.Get_size() * 2.0**-23 * np.abs(allx).sum(0) + np.abs(exact) * float(np.finfo(dtype).eps)
    assert np.all(np.abs(y.astype(np.float64) - exact) <= bound)
    first = np.empty_like(y)
    first[:] = y
    comm.Bcast(first, root=0)
    assert y.tobytes() == first.tobytes()


@lossless
def test_allreduce_avg_matches_sum_over_size(codec):
    comm = comm_of("world")
    x = mixed(comm, N)
    s = mpicomp.allreduce(x, comm=comm, codec=codec)
    a = mpicomp.allreduce(x, comm=comm, codec=codec, op="avg")
    assert np.array_equal(a, (s * np.float32(1 / comm.Get_size())).astype(np.float32))


@lossless
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_allgather_is_bitwise(codec, dtype):
    comm = comm_of("world")
    x = mixed(comm, N, dtype)
    y = mpicomp.allgather(x, comm=comm, codec=codec)
    want = np.empty(N * comm.Get_size(), dtype)
    comm.Allgather(x, want)
    assert y.tobytes() == want.tobytes()


@lossless
def test_reduce_scatter(codec):
    comm = comm_of("world")
    p, k = comm.Get_size(), 100_003
    x = mixed(comm, p * k)
    y = mpicomp.reduce_scatter(x, comm=comm, codec=codec)
    exact = np.zeros(p * k)
    comm.Allreduce(x.astype(np.float64), exact)
    mine = exact[comm.Get_rank() * k:(comm.Get_rank() + 1) * k]
    assert np.all(np.abs(y - mine) <= p * 2.0**-23 * (np.abs(mine) + 10))


@lossless
def test_send_recv_is_bitwise(codec):
    comm = comm_of("world")
    r, p = comm.Get_rank(), comm.Get_size()
    x = mixed(comm, N)
    out = np.empty_like(x)
    if r % 2 == 0 and r + 1 < p:
        mpicomp.send(x, r + 1, comm=comm, codec=codec)
    elif r % 2 == 1:
        mpicomp.recv(out, r - 1, comm=comm, codec=codec)
        want = np.empty_like(x)
        comm.Recv(want, r - 1, tag=77)
        assert out.tobytes() == want.tobytes()
    if r % 2 == 0 and r + 1 < p:
        comm.Send(x, r + 1, tag=77)


def test_gpu_only_codec_on_host_arrays(monkeypatch):
    """Where nvCOMP is loaded, nvcomp-ans exists but cannot touch host memory: every rank
    raises (this rank BackendError, or ShapeMismatchError when only another rank erred)."""
    comm = comm_of("world")
    monkeypatch.setattr(mpicomp.codecs, "_NVCOMP", [True])
    last = comm.Get_rank() == comm.Get_size() - 1
    codec = "nvcomp-ans" if last else "lz4"
    with pytest.raises(mpicomp.BackendError if last else mpicomp.ShapeMismatchError):
        mpicomp.allreduce(mixed(comm, N), comm=comm, codec=codec)
    y = mpicomp.allreduce(np.ones(8, np.float32), comm=comm, codec="none")
    assert np.array_equal(y, np.full(8, comm.Get_size(), np.float32))
