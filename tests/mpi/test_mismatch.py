"""Ranks that disagree, or a bad argument on one rank only: every rank raises (never a hang),
and the communicator works for the next call."""

import re

import numpy as np
import pytest

import mpicomp

from _mpiutil import WORLD, comm_of, compressed, config, sum64  # noqa: F401

COLLS = ["allreduce", "reduce_scatter", "allgather"]


def call(coll, x, comm, **kw):
    return getattr(mpicomp, coll)(x, comm=comm, **kw)


def check_still_works(comm, coll="allreduce"):
    """A correct call right after: exact with codec none."""
    size = comm.Get_size()
    x = np.arange(size * 8, dtype=np.float64) + comm.Get_rank()
    y = call(coll, x, comm, codec="none")
    if coll == "allreduce":
        assert np.array_equal(y, sum64(comm, x))
    elif coll == "reduce_scatter":
        assert np.array_equal(y, sum64(comm, x)[comm.Get_rank() * 8:(comm.Get_rank() + 1) * 8])
    else:
        assert np.array_equal(y, np.concatenate(comm.allgather(x)))


def disagreement(what, rank, n):
    """This rank's (x, kwargs) for a call where rank 1 differs from the others in `what`."""
    odd = rank == 1
    x = np.ones(n, np.float32)
    kw = {"codec": "int8"}
    if what == "count":
        x = np.ones(n + (3 if odd else 0), np.float32)
    elif what == "dtype":
        x = x.astype(np.float16 if odd else np.float32)
    elif what == "codec":
        kw["codec"] = "int4" if odd else "int8"
    elif what == "block":
        kw["codec"] = mpicomp.codec("int8", block=128 if odd else 256)
    elif what == "op":
        kw["op"] = "avg" if odd else "sum"
    return x, kw


@pytest.mark.parametrize("size_class", ["eager", "small", "large"])
@pytest.mark.parametrize("what", ["count", "dtype", "codec", "block", "op"])
@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("kind", ["world", "cart"])
def test_disagreement(kind, coll, what, size_class):
    comm = comm_of(kind)
    if comm.Get_size() < 2:
        pytest.skip("needs 2 ranks")  # same on every rank of this communicator
    if what == "op" and coll == "allgather":
        pytest.skip("allgather has no op")
    size = comm.Get_size()
    n = {"eager": 64, "small": 6000, "large": 70000}[size_class] * size
    x, kw = disagreement(what, comm.Get_rank(), n)
    # eager: the default configuration, a small allreduce rides along with the agreement
    with config() if size_class == "eager" else config(eager_bytes=0):
        with pytest.raises(mpicomp.ShapeMismatchError, match="disagree") as e:
            if what == "count" and coll == "reduce_scatter":
                x = np.ones(n + (size if comm.Get_rank() == 1 else 0), np.float32)
            call(coll, x, comm, **kw)
    msg = str(e.value)
    assert "rank" in msg and coll in msg
    check_still_works(comm, coll)
    check_still_works(comm, "allreduce")


@pytest.mark.parametrize("theirs", [(np.float32, 5000), (np.float32, 100), (np.float32, 30000), (np.float32, 0),
                                    (np.float16, 20000), (np.float64, 20000)])
@pytest.mark.parametrize("kind", ["world", "a node per rank"])
def test_uncompressed_payloads_that_differ(kind, theirs):
    """Rank 1's uncompressed allreduce carries another payload than the others' 20000 float32
    (on two ranks all travel with the agreement step): one inside the header message against
    one beside it (the first 7 KiB go inside; between nodes up to 32 KiB go whole), two beside
    it of different sizes (one receive truncated), none against some. Every rank raises, and
    no stray message reaches the next calls."""
    comm = comm_of(kind)
    if comm.Get_size() < 2:
        pytest.skip("needs 2 ranks")
    dtype, n = theirs if comm.Get_rank() == 1 else (np.float32, 20000)
    with pytest.raises(mpicomp.ShapeMismatchError, match="disagree"):
        mpicomp.allreduce(np.ones(n, dtype), comm=comm, codec="none")
    for k in range(3):
        x = np.arange(40000, dtype=np.float64) * (k + 1) + comm.Get_rank()
        assert np.array_equal(mpicomp.allreduce(x, comm=comm, codec="none"), sum64(comm, x))
    check_still_works(comm)


def test_disagreement_names_values():
    comm = comm_of("world")
    x = np.ones(1000 + comm.Get_rank(), np.float32)
    with pytest.raises(mpicomp.ShapeMismatchError) as e:
        mpicomp.allreduce(x, comm=comm, codec="int8")
    # Two ranks that disagree, each named with its own count (the pair found first depends on
    # the number of ranks).
    named = [(int(a), int(n)) for a, n in re.findall(r"rank (\d+) allreduce of (\d+)", str(e.value))]
    assert len(named) == 2 and all(n == 1000 + a for a, n in named) and named[0][0] != named[1][0]


@pytest.mark.parametrize("n,codec", [(10, "none"), (100_000, "int8")])
def test_disagreement_on_collective(n, codec):
    """One rank calls allgather, the others allreduce."""
    comm = comm_of("world")
    x = np.ones(n, np.float32)
    with pytest.raises(mpicomp.ShapeMismatchError, match="ranks disagree"):
        if comm.Get_rank() == comm.Get_size() - 1:
            mpicomp.allgather(x, comm=comm, codec=codec)
        else:
            mpicomp.allreduce(x, comm=comm, codec=codec)
    check_still_works(comm)


def test_disagreement_on_threshold():
    """Ranks whose min_bytes differ: their calls disagree (wire codec), they do not hang."""
    comm = comm_of("world")
    x = np.ones(20000, np.float32)
    with config(min_bytes=0 if comm.Get_rank() == 0 else 1 << 20, eager_bytes=0):
        with pytest.raises(mpicomp.ShapeMismatchError):
            mpicomp.allreduce(x, comm=comm, codec="int8")
    check_still_works(comm)


@pytest.mark.parametrize("setting,said", [("segment_bytes", "segments of {} bytes"),
                                          ("gpu_segment_bytes", "({} with GPU buffers)")])
@pytest.mark.parametrize("coll", COLLS)
def test_disagreement_on_segment_size(coll, setting, said):
    """Ranks whose segment_bytes (or gpu_segment_bytes, which host buffers take where another
    rank's are on a GPU) differ, as when one rank's environment differs, would post messages
    of other sizes: every rank raises ShapeMismatchError naming both, and the communicator
    works for the next call."""
    comm = comm_of("world")
    rank, size = comm.Get_rank(), comm.Get_size()
    x = np.ones(size * 100_000, np.float32)
    segment = 1 << 16 if rank == 0 else 1 << 18
    with config(min_bytes=0, eager_bytes=0, **{setting: segment}):
        with pytest.raises(mpicomp.ShapeMismatchError, match=re.escape(said.format(65536))) as e:
            call(coll, x, comm, codec="int8")
    assert said.format(262144) in str(e.value)
    check_still_works(comm, coll)


BAD = {
    "codec": (lambda x: dict(x=x, codec="no-such-codec"), mpicomp.CodecError, "no-such-codec"),
    "option": (lambda x: dict(x=x, codec="int8:block=33"), mpicomp.CodecError, "33"),
    "noncontiguous": (lambda x: dict(x=np.repeat(x, 2)[::2]), mpicomp.ArgumentError, "contiguous"),
    "transposed": (lambda x: dict(x=x.reshape(2, -1).T), mpicomp.ArgumentError, "contiguous"),
    "op": (lambda x: dict(x=x, op="max"), mpicomp.ArgumentError, "'max'"),
    "dtype": (lambda x: dict(x=x.astype(np.int32), codec="int8"), mpicomp.CodecError, "int32"),
    "out": (lambda x: dict(x=x, out=np.empty(x.size + 1, x.dtype)), mpicomp.ArgumentError, "out"),
    "type": (lambda x: dict(x=list(x)), mpicomp.ArgumentError, "list"),
    "complex": (lambda x: dict(x=x.astype(np.complex64)), mpicomp.CodecError, "complex64"),
    "float64": (lambda x: dict(x=x.astype(np.float64), codec="int4"), mpicomp.CodecError, "float64"),
    "byteorder": (lambda x: dict(x=x.astype(x.dtype.newbyteorder("S"))), mpicomp.ArgumentError, "byte order"),
}


@pytest.mark.parametrize("coll", COLLS)
@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("kind", ["world", "split"])
def test_bad_argument_on_one_rank(kind, bad, coll):
    comm = comm_of(kind)
    if coll == "allgather" and bad == "op":
        pytest.skip("allgather has no op")
    size, rank = comm.Get_size(), comm.Get_rank()
    culprit = size - 1
    x = np.ones(size * 100, np.float32)
    make, cls, text = BAD[bad]
    kw = dict(x=x, codec="int8")
    if rank == culprit:
        kw.update(make(x))
    xx = kw.pop("x")
    if rank == culprit:
        with pytest.raises(cls, match=text):
            call(coll, xx, comm, **kw)
    else:
        with pytest.raises(mpicomp.ShapeMismatchError, match=f"rank {culprit} rejected its own arguments"):
            call(coll, xx, comm, **kw)
    check_still_works(comm, coll)


def test_bad_argument_on_every_rank():
    comm = comm_of("world")
    with pytest.raises(mpicomp.ArgumentError, match="'prod'"):
        mpicomp.allreduce(np.ones(4, np.float32), comm=comm, op="prod")
    check_still_works(comm)


def test_error_feedback_wrong_stream_on_one_rank():
    comm = comm_of("world")
    ef = mpicomp.ErrorFeedback()
    with compressed():
        mpicomp.allreduce(np.ones(1000, np.float32), comm=comm, codec="int4", error_feedback=ef)
        n = 2000 if comm.Get_rank() == 0 else 1000
        if comm.Get_rank() == 0:
            with pytest.raises(mpicomp.ArgumentError, match="1000.*2000"):
                mpicomp.allreduce(np.ones(n, np.float32), comm=comm, codec="int4", error_feedback=ef)
        else:
            with pytest.raises(mpicomp.ShapeMismatchError):
                mpicomp.allreduce(np.ones(n, np.float32), comm=comm, codec="int4", error_feedback=ef)
    check_still_works(comm)


def test_many_mismatches_in_a_row():
    """Repeated failures leave nothing behind (no unmatched message shifts later calls)."""
    comm = comm_of("dup")
    for i in range(20):
        with pytest.raises(mpicomp.ShapeMismatchError):
            mpicomp.allreduce(np.ones(10 + (i + 1) * comm.Get_rank(), np.float32), comm=comm, codec="int8")
    check_still_works(comm)
    WORLD.Barrier()
