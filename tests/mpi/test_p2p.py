"""Compressed send / recv: below and above the threshold, ANY_SOURCE, mismatching messages."""

import numpy as np
import pytest
from mpi4py import MPI

import mpicomp

import _reference as ref
from _mpiutil import CODECS, as_kind, check_close, comm_of, config, data, dtype_name, to64


def one_way_bound(c, x64, compressed_path):
    """One encode/decode into float32; nothing lost when sent uncompressed."""
    if not compressed_path:
        return np.zeros_like(x64)
    tol = c.tolerance(x64)
    return tol + ref.f32_rounding(np.abs(x64) + tol)


@pytest.mark.parametrize("n", [0, 1, 7, 1000, 300_000])
@pytest.mark.parametrize("codec", CODECS)
def test_send_recv(codec, n):
    """Rank 0 sends to the last rank; with the default threshold (1000 float32 go uncompressed
    and exactly) and with segments smaller than the message (300_000 elements)."""
    comm = comm_of("world")
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    c = mpicomp.codec(codec)
    x = data(comm, n, "p2p", codec).astype(np.float32)
    with config(segment_bytes=256 * 1024):
        if rank == 0:
            mpicomp.send(x, last, comm=comm, codec=codec, tag=7)
            comm.send(x, dest=last, tag=8)  # the reference, with mpi4py
        elif rank == last:
            out = np.full(n, np.nan, np.float32)
            y = mpicomp.recv(out, 0, comm=comm, codec=codec, tag=7)
            assert y is out
            x0 = comm.recv(source=0, tag=8).astype(np.float64)
            compressed_path = n * 4 >= mpicomp.config.min_bytes
            check_close(y.astype(np.float64), x0, one_way_bound(c, x0, compressed_path), "recv")
            if not compressed_path or codec == "none":
                assert np.array_equal(y.astype(np.float64), x0)
    comm.Barrier()


@pytest.mark.parametrize("codec", ["none", "bf16", "int8", "int4"])
@pytest.mark.parametrize("akind", ["np-float16", "np-float32", "torch-bfloat16", "torch-float32"])
def test_send_recv_kinds_compressed(akind, codec):
    comm = comm_of("cart")
    rank, size = comm.Get_rank(), comm.Get_size()
    x, x64 = as_kind(data(comm, 50_000, "p2p-kinds", akind, codec, shape=(100, 500)), akind)
    right, left = (rank + 1) % size, (rank - 1) % size
    with config(min_bytes=0):
        # a ring without deadlock: even ranks send first, odd ranks receive first
        out, _ = as_kind(np.zeros((100, 500)), akind)
        if rank % 2 == 0:
            mpicomp.send(x, right, comm=comm, codec=codec)
            mpicomp.recv(out, left, comm=comm, codec=codec)
        else:
            mpicomp.recv(out, left, comm=comm, codec=codec)
            mpicomp.send(x, right, comm=comm, codec=codec)
    sent = comm.sendrecv(x64, dest=right, source=left)  # the left neighbour's values
    c = mpicomp.codec(codec)
    tol = c.tolerance(sent.ravel())
    check_close(to64(out).ravel(), sent.ravel(), tol + ref.output_rounding(dtype_name(x), np.abs(sent.ravel()) + tol),
                "ring recv")


@pytest.mark.parametrize("codec", ["none", "int8", "sign"])
@pytest.mark.parametrize("n", [10, 100_000])
def test_recv_any_source(codec, n):
    """Every other rank sends to rank 0, which receives with ANY_SOURCE; each message comes
    whole from one sender (told apart by an offset per rank)."""
    comm = comm_of("world")
    rank, size = comm.Get_rank(), comm.Get_size()
    base = data(comm, n, "anysrc").astype(np.float32) * 0 + np.float32(1)  # ones
    with config(min_bytes=0):
        if rank != 0:
            mpicomp.send(base * np.float32(1000 * rank), 0, comm=comm, codec=codec, tag=3)
        else:
            seen = []
            for _ in range(size - 1):
                out = np.empty(n, np.float32)
                mpicomp.recv(out, MPI.ANY_SOURCE, comm=comm, codec=codec, tag=3)
                r = int(round(out[0] / 1000))
                assert 1 <= r < size and np.array_equal(out, np.full(n, 1000 * r, np.float32)), out[:5]
                seen.append(r)
            assert sorted(seen) == list(range(1, size))
    comm.Barrier()


@pytest.mark.parametrize("what", ["count", "dtype", "codec", "block"])
@pytest.mark.parametrize("n", [10, 200_000])
def test_recv_mismatch(what, n):
    """The receiver expects something else: ShapeMismatchError on the receiver, the sender
    returns normally, and the next send/recv on the pair works."""
    comm = comm_of("world")
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    x = np.arange(n, dtype=np.float32)
    with config(min_bytes=0, segment_bytes=64 * 1024):
        if rank == 0:
            mpicomp.send(x, last, comm=comm, codec="int8")
            mpicomp.send(x, last, comm=comm, codec="none")
        elif rank == last:
            out, codec = np.empty(n, np.float32), "int8"
            if what == "count":
                out = np.empty(n + 1, np.float32)
            elif what == "dtype":
                out = np.empty(n, np.float16)
            elif what == "codec":
                codec = "int4"
            else:
                codec = mpicomp.codec("int8", block=128)
            with pytest.raises(mpicomp.ShapeMismatchError, match="rank 0") as e:
                mpicomp.recv(out, 0, comm=comm, codec=codec)
            assert "recv" in str(e.value)
            y = mpicomp.recv(np.empty(n, np.float32), 0, comm=comm, codec="none")
            assert np.array_equal(y, x)
    comm.Barrier()


def test_send_bad_arguments():
    comm = comm_of("world")
    size = comm.Get_size()
    x = np.ones(4, np.float32)
    with pytest.raises(mpicomp.ArgumentError, match=f"dest.*{size}"):
        mpicomp.send(x, size, comm=comm)
    with pytest.raises(mpicomp.ArgumentError, match="source.*-5"):
        mpicomp.recv(x, -5, comm=comm)
    with pytest.raises(mpicomp.CodecError, match="int32"):
        mpicomp.send(x.astype(np.int32), 0, comm=comm, codec="int4")
    with pytest.raises(mpicomp.ArgumentError, match="comm"):
        mpicomp.send(x, 0, comm="world")


def test_send_integers_exact():
    comm = comm_of("world")
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    x = np.arange(-1000, 1000, dtype=np.int64) * 12345
    if rank == 0:
        mpicomp.send(x, last, comm=comm, codec="none")
    elif rank == last:
        assert np.array_equal(mpicomp.recv(np.empty_like(x), 0, comm=comm, codec="none"), x)
    comm.Barrier()


@pytest.mark.parametrize("n_sent,n_expected", [(10, 12), (10, 100_000), (100_000, 10)])
def test_recv_mismatch_with_small_uncompressed_messages(n_sent, n_expected):
    """Messages up to config.eager_bytes travel inside the header message: a receiver that
    expects another count still raises, consumes exactly what was sent, and the pair works."""
    comm = comm_of("world")
    rank, last = comm.Get_rank(), comm.Get_size() - 1
    x = np.arange(n_sent, dtype=np.float32)
    if rank == 0:
        mpicomp.send(x, last, comm=comm, codec="none")
        mpicomp.send(x[:5] * 2, last, comm=comm, codec="none")
    elif rank == last:
        with pytest.raises(mpicomp.ShapeMismatchError, match=f"{n_sent}.*{n_expected}"):
            mpicomp.recv(np.empty(n_expected, np.float32), 0, comm=comm, codec="none")
        assert np.array_equal(mpicomp.recv(np.empty(5, np.float32), 0, comm=comm, codec="none"), x[:5] * 2)
    comm.Barrier()


@pytest.mark.parametrize("codec", ["none", "int8"])
def test_messages_from_two_threads_stay_whole(codec):
    """Two threads of rank 0 send to rank 1 with one tag, and rank 1's two threads receive
    with that tag, while a third thread pair exchanges the user's own messages on the same
    communicator. MPI lets each receive take either thread's message, but each whole: a
    message's segments travel on the pair's private communicator under their own tag. (They
    went on the caller's tag before, and a receiver took the other message's segments.)"""
    if MPI.Query_thread() < MPI.THREAD_MULTIPLE:
        pytest.skip("needs MPI_THREAD_MULTIPLE")
    import threading

    comm = comm_of("dup")
    rank, n, rounds = comm.Get_rank(), 20_000, 20
    sent = [float(1000 * t + i) for t in range(2) for i in range(rounds)]
    got, errors = [], []

    def sender(t):
        for i in range(rounds):
            mpicomp.send(np.full(n, 1000.0 * t + i, np.float32), 1, comm=comm, codec=codec, tag=5)

    def receiver():
        for _ in range(rounds):
            got.append(mpicomp.recv(np.empty(n, np.float32), source=0, comm=comm, codec=codec, tag=5))

    def user():
        for i in range(rounds):
            if rank == 0:
                comm.Send(np.full(n, -1.0 - i, np.float32), dest=1, tag=6)
            else:
                y = np.empty(n, np.float32)
                comm.Recv(y, source=0, tag=6)
                got_user.append(y)

    def guarded(f, *args):
        try:
            f(*args)
        except BaseException as e:  # noqa: BLE001 -- re-raised below
            errors.append(e)

    got_user = []
    with config(segment_bytes=4096):  # 20 segments a message
        work = [(sender, 0), (sender, 1)] if rank == 0 else [(receiver,), (receiver,)] if rank == 1 else []
        threads = [threading.Thread(target=guarded, args=w) for w in work]
        if rank in (0, 1):
            threads.append(threading.Thread(target=guarded, args=(user,)))
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        assert not any(th.is_alive() for th in threads), "deadlock"
    assert not errors, errors
    if rank == 1:
        values = []
        for y in got:
            assert (y == y[0]).all(), f"a message mixed from two: values {np.unique(y)[:6]}"
            values.append(float(y[0]))
        np.testing.assert_allclose(sorted(values), sorted(sent), rtol=1e-2)  # int8: one rounding
        assert [float(y[0]) for y in got_user] == [-1.0 - i for i in range(rounds)]
    comm.Barrier()
