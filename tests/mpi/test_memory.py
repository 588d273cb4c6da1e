"""Bounded memory (issue 21 item 4): scratch buffers are reused between calls, but what a thread
keeps after a call is capped by config.cache_bytes (MPICOMP_CACHE_BYTES); 10,000 calls of mixed
sizes leave resident memory flat."""
import os
import re

import numpy as np
import pytest

import mpicomp
from mpicomp import _core
from _mpiutil import WORLD, comm_of, data

MiB = 1 << 20


def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_large_call_does_not_stay_held():
    """Measured before: 451 MiB still held after one 256 MiB int8 call and one `none` call."""
    mpicomp.config.cache_bytes = 32 * MiB
    n = 64 * MiB  # 256 MiB of float32
    x = np.ones(n, np.float32)
    before = rss()
    y = mpicomp.allreduce(x, comm=WORLD, codec="int8")
    assert y[0] == WORLD.Get_size()
    mpicomp.allreduce(np.ones(1 << 20, np.float32), comm=WORLD, codec="none")
    assert _core.scratch_held() <= 32 * MiB
    del y
    # x (256 MiB) is still held; the output was freed: what remains is the cap at most.
    assert rss() - before < 48 * MiB, (rss() - before) / MiB


def test_cache_zero_frees_everything():
    mpicomp.config.cache_bytes = 0
    mpicomp.allreduce(np.ones(1 << 20, np.float32), comm=WORLD, codec="int4")
    assert _core.scratch_held() == 0


def test_repeated_calls_keep_their_buffers():
    """Under the cap, a loop's buffers stay: the second call of a size allocates nothing."""
    mpicomp.config.cache_bytes = 64 * MiB
    x = np.ones(1 << 20, np.float32)
    mpicomp.allreduce(x, comm=WORLD, codec="int8")
    held = _core.scratch_held()
    assert held > 0
    mpicomp.allreduce(x, comm=WORLD, codec="int8")
    assert _core.scratch_held() == held


@pytest.mark.parametrize("dtype, op, in_place", [(np.float32, "sum", False), (np.float64, "avg", False),
                                                 (np.float16, "sum", True), (np.int32, "sum", False)])
@pytest.mark.parametrize("kind", ["world", "split"])
def test_uncompressed_allreduce_above_the_cache_goes_in_pieces(kind, dtype, op, in_place):
    """An uncompressed allreduce larger than cache_bytes (input and output) goes in pieces of
    half of it, each staged as a call that fits (a GPU's pinned buffers): the result is the
    whole call's, counted as one call, and no more than the cap is kept after it. 2 MiB:
    pieces of 1 MiB, the smallest cut."""
    comm = comm_of(kind)
    mpicomp.config.cache_bytes = 2 * MiB
    n = (5 * MiB) // np.dtype(dtype).itemsize + 3  # two whole pieces and a part, and an odd tail
    x64 = np.round(data(comm, n, "pieces") * 8) if dtype == np.int32 else data(comm, n, "pieces")
    x = x64.astype(dtype)
    want = comm.allreduce(x.astype(np.float64))
    if op == "avg":
        want /= comm.Get_size()
    mpicomp.reset_stats()
    y = mpicomp.allreduce(x, comm=comm, codec="none", op=op, **({"out": x} if in_place else {}))
    calls = mpicomp.stats()["allreduce"]["calls"]
    tol = 0 if dtype == np.int32 else np.finfo(dtype).eps * comm.Get_size() * np.abs(want).max()
    assert np.abs(y.astype(np.float64) - want.astype(dtype).astype(np.float64)).max() <= tol
    assert calls == 1 and _core.scratch_held() <= 2 * MiB


def test_pieces_on_ranks_that_disagree_name_the_whole_counts():
    """A call that goes in pieces is agreed as a whole first: a rank with a count of its own
    learns it with both counts, not a piece's."""
    mpicomp.config.cache_bytes = 2 * MiB
    n = MiB + 1000 * WORLD.Get_rank()
    with pytest.raises(mpicomp.ShapeMismatchError) as e:
        mpicomp.allreduce(np.ones(n, np.float32), comm=WORLD, codec="none")
    named = [(int(a), int(c)) for a, c in re.findall(r"rank (\d+) allreduce of (\d+)", str(e.value))]
    assert len(named) == 2 and all(c == MiB + 1000 * a for a, c in named), str(e.value)
    assert mpicomp.allreduce(np.ones(n - 1000 * WORLD.Get_rank(), np.float32), comm=WORLD, codec="none")[-1] == \
        WORLD.Get_size()


def test_ranks_whose_cache_differs_are_told_rather_than_meet_in_pieces_and_whole():
    """cache_bytes shapes the wire of an uncompressed allreduce above it: a rank that would
    cut it in pieces while the others send it whole (one MPI_Allreduce against several calls:
    a hang) raises ShapeMismatchError on every rank, naming the pieces, and the next call
    works."""
    rank, size = WORLD.Get_rank(), WORLD.Get_size()
    mpicomp.config.cache_bytes = 2 * MiB if rank == 0 else 128 * MiB
    x = np.ones(MiB + 7, np.float32)
    with pytest.raises(mpicomp.ShapeMismatchError, match=f"pieces of {MiB} bytes"):
        mpicomp.allreduce(x, comm=WORLD, codec="none")
    mpicomp.config.cache_bytes = 2 * MiB
    assert (mpicomp.allreduce(x, comm=WORLD, codec="none") == size).all()


def test_ten_thousand_mixed_calls_keep_memory_flat():
    """10 rounds of the same 1,000 mixed calls: resident memory, read at the same point of
    every round (what is held there is then the same), does not grow from round to round. (Read at
    arbitrary points it swings by +-15 MiB with the scratch and outputs held at that moment.)"""
    mpicomp.config.cache_bytes = 16 * MiB
    rng = np.random.default_rng(7)  # the same sizes on every rank
    # The largest need more scratch than the cap: freed after each such call, made again by the next.
    sizes = rng.choice([1, 100, 3000, 20_000, 150_000, 1_000_000, 5_000_000], size=1000,
                       p=[.3, .3, .2, .12, .068, .01, .002])
    codecs = rng.choice(["none", "bf16", "int8", "int4"], size=1000)
    colls = rng.choice(["allreduce", "reduce_scatter", "allgather"], size=1000)
    inputs = {n: np.ones(int(n) * WORLD.Get_size(), np.float32) for n in set(sizes.tolist())}
    p = WORLD.Get_size()
    marks = []
    for _ in range(10):
        for n, codec, coll in zip(sizes.tolist(), codecs, colls):
            x = inputs[n] if coll == "reduce_scatter" else inputs[n][:n]
            y = getattr(mpicomp, coll)(x, comm=WORLD, codec=str(codec))
            assert y[0] == (1.0 if coll == "allgather" else p)
            del y
        assert _core.scratch_held() <= 16 * MiB
        marks.append(rss())
    # A leak grows every round, a one-time step does not: Open MPI at 4 ranks on 2 cores once
    # grew 4.7 MiB in round 3 and stayed there for the 7 rounds after (its own buffers, at a
    # moment of skew). From round 2 on: at most one step over 256 KiB (a leak of 256 bytes a
    # call steps every round), and under 8 MiB in all.
    steps = np.diff(marks[1:])
    assert np.count_nonzero(steps > MiB // 4) <= 1 and max(marks[1:]) - marks[1] < 8 * MiB, \
        [(m - marks[1]) / MiB for m in marks]
