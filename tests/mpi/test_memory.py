"""Bounded memory (issue 21 item 4): scratch buffers are reused between calls, but what a thread
keeps after a call is capped by config.cache_bytes (MPICOMP_CACHE_BYTES); 10,000 calls of mixed
sizes leave resident memory flat."""
import os

import numpy as np

import mpicomp
from mpicomp import _core
from _mpiutil import WORLD

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
