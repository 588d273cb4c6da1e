"""Lossless codecs lz4 and blosc (Blosc2; "lossless" is its defaults) in the collectives and
send/recv: results as exact as codec none's (allgather and send/recv bit for bit, float64
included; float32 sums to float32 accumulation, float64 sums in float64), identical on every
rank, and codecs that run on GPU buffers only refused on host arrays by every rank."""
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


def float64_data(comm, n):
    """float64 that float32 would round: magnitudes over 1e-250..1e250, runs of zeros, and
    1 + a tail of 1e-13 per rank."""
    g = rng(comm, n, "lossless64")
    x = g.standard_normal(n) * 10.0 ** g.integers(-250, 250, n)
    x[(np.arange(n) // 4096) % 3 == 1] = 0.0
    x[::5] = 1 + 1e-13 * (comm.Get_rank() + 1)
    return x


def within_float64_rounding(comm, y, allx, rows):
    """y against the sum of allx's rows (every rank's input, float64): a sum of p float64 terms
    in any order is within (p - 1) roundings of the sum of their magnitudes of the exact one, as
    is numpy's reference, so within twice that of it (float32 sums would be 2**29 times off)."""
    exact = allx[:, rows].sum(0)
    bound = 2 * (comm.Get_size() - 1) * 2.0**-53 * np.abs(allx[:, rows]).sum(0)
    return np.all(np.abs(y - exact) <= bound)


@pytest.mark.parametrize("kind", ["world", "split"])
@lossless
def test_float64_sums_in_float64(kind, codec):
    """allreduce, its average and reduce_scatter of float64: float64 sums of the exact inputs
    (lossless frames), bit for bit MPI's on two ranks (a + b in either order), the same bits on
    every rank."""
    comm = comm_of(kind)
    p, r, k = comm.Get_size(), comm.Get_rank(), 100_003
    x = float64_data(comm, p * k)
    allx = np.stack(comm.allgather(x))
    y = mpicomp.allreduce(x, comm=comm, codec=codec)
    mean = mpicomp.allreduce(x, comm=comm, codec=codec, op="avg")
    part = mpicomp.reduce_scatter(x, comm=comm, codec=codec)
    assert y.dtype == mean.dtype == part.dtype == np.float64
    assert within_float64_rounding(comm, y, allx, slice(None))
    assert within_float64_rounding(comm, mean * p, allx, slice(None))
    assert within_float64_rounding(comm, part, allx, slice(r * k, (r + 1) * k))
    if p == 2:
        want = np.empty_like(x)
        comm.Allreduce(x, want)
        assert np.array_equal(y, want) and np.array_equal(part, want[r * k:(r + 1) * k])
    first = y.copy()
    comm.Bcast(first, root=0)
    assert y.tobytes() == first.tobytes()


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
    monkeypatch.setattr(mpicomp._framed, "_NVCOMP", [True])
    last = comm.Get_rank() == comm.Get_size() - 1
    codec = "nvcomp-ans" if last else "lz4"
    with pytest.raises(mpicomp.BackendError if last else mpicomp.ShapeMismatchError):
        mpicomp.allreduce(mixed(comm, N), comm=comm, codec=codec)
    y = mpicomp.allreduce(np.ones(8, np.float32), comm=comm, codec="none")
    assert np.array_equal(y, np.full(8, comm.Get_size(), np.float32))
