"""Codec "auto" across ranks: it measures once per communicator and kind of call, every rank
takes the same decision from agreed numbers, the results are those of the path it chose, and
re-measuring follows drift, at most as often as configured. Runs in every rank."""
import time

import numpy as np
import pytest

import mpicomp
from mpicomp import _core
from mpicomp._dtypes import DTYPE_IDS

from _mpiutil import WORLD, allreduce_bound
from _ranks import wait_asleep

ALLREDUCE = _core.COLL_IDS["allreduce"]
INT8 = mpicomp.codec("int8")
SIZES = [1024.0, 16384.0, 262144.0]

pytestmark = pytest.mark.skipif(WORLD.size == 1, reason="a communicator of one rank sends nothing: no choice")


@pytest.fixture
def comm():
    c = WORLD.Dup()  # a model of its own
    yield c
    c.Free()


def install(comm, plain, packed, sizes=SIZES, **flat):
    """Gives comm's private duplicate (where allreduce runs) the model plain/packed (and
    plain_flat/packed_flat). Its time for small calls sets how often the ranks check (enough of
    it for a check's cost)."""
    mpicomp.allreduce(np.ones(1, np.float32), comm=comm, codec="none")  # makes the duplicate
    pcomm = mpicomp._comm.private(comm)
    _core.auto_install(pcomm, ALLREDUCE, DTYPE_IDS["float32"], INT8.id, INT8.block, sizes, plain, packed, **flat)
    return pcomm


def counts(coll="allreduce"):
    s = mpicomp.stats()[coll]
    return s["compressed"], dict(s["skipped"]), s["probes"]


def every_rank_has(comm, value):
    values = comm.allgather(value)
    return all(v == values[0] for v in values)


@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
def test_first_call_measures_then_each_size_goes_as_the_model_says(comm, coll):
    mpicomp.reset_stats()
    rng = np.random.default_rng(comm.rank)
    fn = getattr(mpicomp, coll)
    fn(rng.standard_normal(comm.size * 64).astype(np.float32), comm=comm, codec="auto")
    assert counts(coll) == (0, {"auto_probe": 1}, 1)
    m = mpicomp.auto.model(comm, coll)
    assert m["probes"] == 1 and len(m["bytes"]) >= 2 and every_rank_has(comm, m)
    sizes = [comm.size * 2**k for k in (8, 12, 16, 19)]  # elements
    nbytes = [4 * n // (1 if coll == "reduce_scatter" else comm.size if coll == "allgather" else 1) for n in sizes]
    _, decisions, _ = _core.auto_evaluate(m["bytes"], m["plain"], m["packed"], [float(b) for b in nbytes])
    for n, decision in zip(sizes, decisions):
        k = n // comm.size if coll == "allgather" else n
        xs = [np.random.default_rng(r).standard_normal(k).astype(np.float32) for r in range(comm.size)]
        before = counts(coll)
        y = fn(xs[comm.rank], comm=comm, codec="auto")
        after = counts(coll)
        if decision == "compress":
            assert after[0] == before[0] + 1, (n, decision, after)
        else:
            assert after[1].get(decision, 0) == before[1].get(decision, 0) + 1, (n, decision, after)
        exact = {"allreduce": lambda: np.sum(xs, axis=0, dtype=np.float64),
                 "reduce_scatter": lambda: np.sum(xs, axis=0, dtype=np.float64).reshape(comm.size, -1)[comm.rank],
                 "allgather": lambda: np.concatenate(xs).astype(np.float64)}[coll]()
        if decision == "compress":
            bound = (allreduce_bound(comm, INT8, xs[comm.rank].astype(np.float64), True, False, "float32")[1]
                     if coll == "allreduce" else 0.05 * comm.size * np.abs(exact).max())
            assert np.all(np.abs(y - exact) <= bound), (coll, n)
        else:
            np.testing.assert_allclose(y, exact, rtol=1e-5, atol=1e-5)
    assert counts(coll)[2] == 1  # measured once


def test_every_rank_takes_the_same_decision_from_different_measurements(comm):
    # Each rank measured its own times (rank r's compressed ones 1 + r times slower): the
    # slowest rank's are agreed, so the model and every decision are the same everywhere.
    r = comm.rank
    plain = [10e-6, 40e-6, 400e-6]
    packed = [t * f * (1 + r) for t, f in zip(plain, (3.0, 0.9 / comm.size, 0.5 / comm.size))]
    install(comm, plain, packed)
    m = mpicomp.auto.model(comm)
    assert every_rank_has(comm, m)
    slowest = [t * f * comm.size for t, f in zip(plain, (3.0, 0.9 / comm.size, 0.5 / comm.size))]
    np.testing.assert_allclose(m["packed"], slowest)
    mpicomp.reset_stats()
    for n in (256, 4096, 65536):
        mpicomp.allreduce(np.ones(n, np.float32), comm=comm, codec="auto")
    assert every_rank_has(comm, counts()[:2])
    assert counts()[:2] == (2, {"auto_small": 1})


def test_installing_a_malformed_model_fails_on_every_rank(comm):
    sizes = SIZES if comm.rank else SIZES[:2]
    with pytest.raises(mpicomp.ShapeMismatchError, match="same number of sizes"):
        install(comm, [1.0] * 3, [1.0] * 3, sizes=sizes)
    install(comm, [1.0] * 3, [2.0] * 3)  # the communicator stays usable


# Nodes of 2 ranks (config.ranks_per_node; MPI sees one): two levels need 3 ranks or more.
needs_nodes = pytest.mark.skipif(WORLD.size < 3, reason="nodes of 2 ranks with two levels need 3 ranks or more")


@needs_nodes
@pytest.mark.parametrize("hierarchy", ["auto", "flat"])
@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
def test_on_nodes_the_probe_times_the_flat_hierarchy_where_it_is_another_path(comm, coll, hierarchy):
    mpicomp.config.ranks_per_node = 2
    mpicomp.config.hierarchy = hierarchy
    fn = getattr(mpicomp, coll)
    fn(np.ones(comm.size * 64, np.float32), comm=comm, codec="auto")
    m = mpicomp.auto.model(comm, coll)
    # Uncompressed float32 sums on nodes MPI does not know of go two levels or flat (MPI's own);
    # reduce_scatter's and allgather's are MPI's either way, except where they ride the
    # agreement: in one lane or in every lane, on nodes of two lanes (4 ranks). Compressed, the
    # two levels of reduce_scatter and allgather need nodes of equal size.
    lanes = 2 if comm.size % 2 == 0 else 1
    two = coll == "allreduce" or lanes == 2
    expected = (coll == "allreduce" or lanes == 2, two) if hierarchy == "auto" else (False, False)
    assert (len(m["plain_flat"]) > 0, len(m["packed_flat"]) > 0) == expected
    for times in ("plain_flat", "packed_flat"):
        assert len(m[times]) in (0, len(m["bytes"])) and all(t > 0 for t in m[times])
    if coll != "allreduce" and expected[0]:
        # Timed apart only up to where calls ride the agreement (eager_bytes of the output)
        rides = mpicomp.config.eager_bytes // (comm.size if coll == "allgather" else 1)
        apart = [b <= rides for b in m["bytes"]]
        assert any(apart) and not all(apart)
        assert all(f == p for b, f, p in zip(m["bytes"], m["plain_flat"], m["plain"]) if b > rides)
    assert every_rank_has(comm, m)


def install_five_paths(comm):
    """On nodes of 2: at 16 KiB uncompressed flat, riding the agreement in every lane
    (eager_bytes is 32 KiB); at 32 KiB int8 on two levels; at 64 KiB uncompressed flat, MPI's
    own allreduce; at 128 KiB uncompressed on two levels; at 256 KiB int8 flat. Seconds."""
    mpicomp.config.ranks_per_node = 2
    kib = 1024.0
    install(comm, [100e-6] * 5, [300e-6, 40e-6, 300e-6, 300e-6, 300e-6],
            sizes=[16 * kib, 32 * kib, 64 * kib, 128 * kib, 256 * kib],
            plain_flat=[50e-6, 100e-6, 50e-6, 200e-6, 200e-6], packed_flat=[300e-6, 200e-6, 300e-6, 300e-6, 30e-6])


@needs_nodes
def test_on_nodes_each_way_takes_the_hierarchy_the_model_says(comm):
    install_five_paths(comm)
    said = mpicomp.auto.model(comm)["describe"]
    assert said.endswith("; flat hierarchy: uncompressed 16.0 KiB, 64.0 KiB; int8 256.0 KiB")
    mpicomp.reset_stats()
    for k in (16, 32, 64, 128, 256):
        n = k * 256  # float32 elements
        xs = [np.random.default_rng([k, r]).standard_normal(n).astype(np.float32) for r in range(comm.size)]
        y = mpicomp.allreduce(xs[comm.rank], comm=comm, codec="auto")
        exact = np.sum(xs, axis=0, dtype=np.float64)
        assert np.all(np.abs(y - exact) <= 0.05 * comm.size * np.abs(exact).max()), k
        if k in (16, 64, 128):
            np.testing.assert_allclose(y, exact, rtol=1e-5, atol=1e-5)
    s = mpicomp.stats()["allreduce"]
    assert s["compressed"] == 2 and dict(s["skipped"]) == {"auto_small": 3}
    assert dict(s["algorithms"]) == {"eager": 1, "two_level": 2, "mpi": 1, "flat": 1}


@needs_nodes
@pytest.mark.waits
@pytest.mark.parametrize("kib,algorithm", [(16, "eager"), (32, "two_level"), (64, "mpi"), (128, "two_level"),
                                           (256, "flat")])
def test_on_nodes_a_stalled_rank_makes_the_others_raise_on_each_path(comm, kib, algorithm):
    """config.timeout_s on each path auto takes on nodes: the ranks waiting for one that never
    arrives raise CommTimeoutError, none hangs, the communicator is refused after; a fresh one
    works."""
    install_five_paths(comm)
    x = np.ones(kib * 256, np.float32)
    mpicomp.config.timeout_s = 1.0
    mpicomp.reset_stats()
    mpicomp.allreduce(x, comm=comm, codec="auto")
    assert dict(mpicomp.stats()["allreduce"]["algorithms"]) == {algorithm: 1}
    if comm.rank != comm.size - 1:  # the last rank stalls
        t0 = time.perf_counter()
        with pytest.raises(mpicomp.CommTimeoutError, match="timeout_s"):
            mpicomp.allreduce(x, comm=comm, codec="auto")
        assert time.perf_counter() - t0 < 11
        with pytest.raises(mpicomp.CommTimeoutError, match="earlier call"):
            mpicomp.allreduce(x, comm=comm, codec="auto")
    wait_asleep(WORLD)
    fresh = WORLD.Dup()
    install_five_paths(fresh)
    np.testing.assert_allclose(mpicomp.allreduce(x, comm=fresh, codec="auto"), comm.size, rtol=1e-2)
    fresh.Free()


def grew(before, after):
    """The key whose count grew between two of mpicomp.stats()'s counters."""
    return next(k for k, v in after.items() if v > before.get(k, 0))


def way(before, after):
    """How a call went, from mpicomp.stats()["allreduce"] around it: "compressed", else its skip reason."""
    return "compressed" if after["compressed"] > before["compressed"] else grew(before["skipped"], after["skipped"])


def path(before, after):
    """The way and hierarchy a call took: its algorithm, after "compressed " if it was."""
    algorithm = grew(before["algorithms"], after["algorithms"])
    return "compressed " + algorithm if way(before, after) == "compressed" else algorithm


def ways_taken(comm, calls, n, between=0, read=way):
    """What `read` makes of each of `calls` allreduces of n float32, the same on every rank, with
    re-measuring off; each followed by one of `between` elements if given (a training loop's
    other bucket)."""
    mpicomp.config.auto_reprobe_s = 0
    try:
        ways = []
        for _ in range(calls):
            before = mpicomp.stats()["allreduce"]
            mpicomp.allreduce(np.ones(n, np.float32), comm=comm, codec="auto")
            ways.append(read(before, mpicomp.stats()["allreduce"]))
            if between:
                mpicomp.allreduce(np.ones(between, np.float32), comm=comm, codec="auto")
    finally:
        mpicomp.config.auto_reprobe_s = 60.0
    assert every_rank_has(comm, ways)
    return ways


@needs_nodes
def test_on_nodes_calls_turn_to_another_hierarchy_after_timing_every_path_side_by_side(comm):
    # As below for the two ways: installed, two-level uncompressed looks fastest (10 us for 1
    # MiB) and flat uncompressed next (20 us); a window of calls times two levels as they are
    # (milliseconds), which makes the model prefer flat on an older time: the next window
    # sends its calls on every path in turn, 4 calls each, the path they took first, compressed
    # ones too (a second each, installed).
    mpicomp.config.ranks_per_node = 2
    sizes = [1024.0, 16384.0, float(1 << 20)]
    install(comm, [1e-7, 1e-5, 1e-5], [1.0] * 3, sizes=sizes, plain_flat=[2e-7, 2e-5, 2e-5],
            packed_flat=[1.0] * 3)
    paths = ways_taken(comm, 24, 1 << 18, read=path)
    assert paths[:8] == ["two_level"] * 8, paths  # uncompressed, two levels, as installed
    runs = ("two_level", "compressed two_level", "compressed flat", "mpi")  # the path taken first, 4 calls each
    assert paths[8:] == [p for p in runs for _ in range(4)], paths


def drifting_calls(comm, reprobe_s, calls=64, late=0.0, n=1024):
    """Up to calls allreduces of n elements (rank 0 arriving `late` seconds after the others),
    ending at the first that measured the model again (on every rank alike: the ranks probe
    together); returns 1 if one did, else 0. Not counted on: that the calls after a probe
    stay within its kDrift, which a loaded machine (3 ranks on 2 cores) does not keep."""
    mpicomp.config.auto_reprobe_s = reprobe_s
    try:
        x = np.ones(n, np.float32)
        time.sleep(0.02)  # the interval since the last measurement, for reprobe_s = 0.01
        before = counts()[2]
        for _ in range(calls):
            if comm.rank == 0 and late:
                time.sleep(late)
            mpicomp.allreduce(x, comm=comm, codec="auto")
            if counts()[2] > before:
                return 1
        return 0
    finally:
        mpicomp.config.auto_reprobe_s = 60.0


def test_calls_slower_than_measured_measure_again_at_most_as_configured(comm):
    big = 1 << 20
    for reprobe_s, expected in ((3600, 0), (0, 0), (0.01, 1)):  # measured less than an hour ago; never; due
        # A link since become slow: 4 MiB in 100 us (measured at that size: not measured further).
        install(comm, [1e-6, 100e-6, 100e-6], [2e-6, 200e-6, 200e-6], sizes=[1024.0, 16384.0, 4.0 * big])
        assert drifting_calls(comm, reprobe_s=reprobe_s, n=big) == expected, reprobe_s
    assert mpicomp.auto.model(comm)["plain"][-1] > 200e-6  # measured again: the link as it is now


def test_latency_bound_calls_are_not_judged(comm):
    install(comm, [1e-9] * 3, [2e-9] * 3)  # 4 KiB calls take microseconds, not a nanosecond: noise
    assert drifting_calls(comm, reprobe_s=0.01) == 0


def test_calls_faster_than_measured_measure_again(comm):
    install(comm, [1e-6, 0.2, 0.2], [2e-6, 0.4, 0.4])  # a congested link that has since cleared: 4 KiB in 40 ms
    assert drifting_calls(comm, reprobe_s=0.01) == 1


@pytest.mark.waits
def test_a_late_rank_alone_does_not_measure_again(comm):
    # The others wait 0.05 s for rank 0 in each call, more than the model's 40 ms, but rank 0's
    # own calls run at the link's speed: that is skew between ranks, not a faster link.
    install(comm, [1e-6, 0.2, 0.2], [2e-6, 0.4, 0.4])
    assert drifting_calls(comm, reprobe_s=0.01, calls=24, late=0.05) == 0


def test_the_calls_own_times_correct_the_model_at_their_size(comm):
    # A probe's bursts can miss what a stream of calls meets (a token bucket's credit): here a
    # model that says 1 MiB goes in a microsecond uncompressed, two compressed. The calls' own
    # times replace it at 1 MiB, each way the calls went, until the faster way is the one taken.
    install(comm, [1e-9, 1e-6, 1e-6], [2e-9, 2e-6, 2e-6], sizes=[1024.0, 16384.0, float(1 << 20)])
    assert drifting_calls(comm, reprobe_s=0, calls=200, n=1 << 18) == 0
    m = mpicomp.auto.model(comm)
    assert every_rank_has(comm, m)
    at = m["bytes"].index(float(1 << 20))
    plain, packed = m["plain"][at], m["packed"][at]
    assert plain > 20e-6 and packed > 20e-6, m  # both ways measured by calls, neither as installed
    # The next calls go the way the model now says is faster, but for a window that times both
    # ways in turn (its uncompressed calls counted as auto_probe), which may be under way. The
    # model is read before each call (on a loaded machine the two ways' times can change places
    # at a check): a call not in a window goes its way.
    for _ in range(200):
        m = mpicomp.auto.model(comm)
        compress = m["packed"][at] < m["plain"][at]
        mpicomp.reset_stats()
        mpicomp.allreduce(np.ones(1 << 18, np.float32), comm=comm, codec="auto")
        compressed, skipped, _ = counts()
        assert compressed or not compress or "auto_probe" in skipped, (m, skipped)  # a window's, if not its way
        if compressed == compress and "auto_probe" not in skipped:
            break
    else:
        raise AssertionError(f"200 calls, none outside a window the way the model says: {m}")


def test_a_call_far_beyond_the_sizes_measured_is_measured_at_its_size(comm):
    # Beyond its largest size the model extrapolates, which caches make wrong. A model that
    # says compressing is free: a call at 16x its largest size is timed both ways at its size
    # (once, counted in probe_seconds, not as a probe), and where that would cost more than
    # the probe's half second by the model, it is not.
    n = 1 << 20  # 4 MiB of float32
    for plain, measured in (([10e-6, 20e-6, 40e-6], True), ([1e-3, 1e-2, 0.1], False)):
        install(comm, plain, [1e-9] * 3)
        for call in range(2):
            before = mpicomp.stats()["allreduce"]
            mpicomp.allreduce(np.ones(n, np.float32), comm=comm, codec="auto")
            after = mpicomp.stats()["allreduce"]
            m = mpicomp.auto.model(comm)
            assert every_rank_has(comm, m) and after["probes"] == before["probes"]
            assert (4.0 * n in m["bytes"]) == measured, m
            if measured:
                assert m["packed"][m["bytes"].index(4.0 * n)] > 1e-5, m  # as long as the call takes, not 1 ns
            # Measured once: the second call finds its size measured.
            assert (after["probe_seconds"] > before["probe_seconds"]) == (measured and call == 0)


def test_calls_turn_to_the_other_way_after_timing_both_side_by_side(comm):
    # The way not taken has only an older time (here the installed one, 20 us for 1 MiB
    # compressed). When a window's calls make the model prefer it, the next window goes both
    # ways in turn, timed side by side, rather than all that way: on a machine whose speed
    # changes (2 shared cores), times taken at different moments mislead.
    install(comm, [1e-7, 1e-5, 1e-5], [1e-6, 2e-5, 2e-5], sizes=[1024.0, 16384.0, float(1 << 20)])
    # two windows of 8 calls: the model's times make each check due at 8 (and 4 each way)
    ways = ways_taken(comm, 16, 1 << 18)
    assert "compressed" not in ways[:8] and len(set(ways[:8])) == 1, ways  # uncompressed, as installed
    assert ways[8:] == ["auto_probe"] * 4 + ["compressed"] * 4, ways  # in turn, runs of 4, not all compressed


def test_a_window_times_the_way_taken_first_then_goes_on_that_way_until_its_check(comm):
    # The way the calls took is timed first, where its run follows its own stream, not another
    # way's run: a lighter way's leaves credit on a token bucket (docs/auto.md, item 4). After
    # the runs, the calls go that way again until the check. Installed: 1 KiB in 1 ns
    # uncompressed, 100 ns compressed; a check every 200 calls' worth of the uncompressed time
    # of 1 KiB. The calls' own times (microseconds) make the model prefer compressing: the
    # window after that check is 4 uncompressed, 4 compressed, then uncompressed, its check
    # due about 200 calls on, as the first.
    install(comm, [1e-9] * 3, [1e-7] * 3, sizes=[1024.0, 16384.0, float(1 << 20)])
    ways = ways_taken(comm, 400, 256)
    turn = next(i for i, w in enumerate(ways) if w != "auto_link")  # compressing never wins, as installed
    assert 190 <= turn <= 210, ways
    assert ways[turn:turn + 150] == ["auto_probe"] * 4 + ["compressed"] * 4 + ["auto_probe"] * 142, ways[turn:]


def test_a_window_waits_for_its_runs_while_other_sizes_come_between(comm):
    # As above, with a 4 KiB call (compressing it takes a second, installed: it never turns)
    # between every two 1 MiB calls, as a training loop's buckets of other sizes would: the
    # window after the turn still sends the 1 MiB calls 4 uncompressed (as before), then 4
    # compressed, before its check, though the calls between make that due after 8 calls.
    install(comm, [1e-7, 1e-7, 1e-5], [1.0, 1.0, 2e-5], sizes=[1024.0, 4096.0, float(1 << 20)])
    ways = ways_taken(comm, 12, 1 << 18, between=1024)
    assert ways[:4] == ["auto_small"] * 4, ways  # the first window: 4 of each size
    assert ways[4:] == ["auto_probe"] * 4 + ["compressed"] * 4, ways


def test_nonblocking_calls_measure_on_their_own_communicator(comm):
    x = np.random.default_rng(comm.rank).standard_normal(4096).astype(np.float32)
    exact, bound = allreduce_bound(comm, INT8, x.astype(np.float64), True, False, "float32")
    for _ in range(3):
        y = mpicomp.iallreduce(x, comm=comm, codec="auto").wait()
        assert np.all(np.abs(y - exact) <= bound)
    assert mpicomp.auto.model(comm) is None  # the blocking calls' communicator: none made yet


def test_a_way_not_taken_is_timed_again_now_and_then(comm):
    # A model that says compressing takes a second (a probe gone wrong): the calls go
    # uncompressed, and now and then a window of them goes compressed to be timed, which
    # corrects it.
    install(comm, [1e-9, 1e-6, 1e-6], [1.0] * 3)
    drifting_calls(comm, reprobe_s=0, calls=2400, n=1 << 16)  # windows of 8 calls; every 256th timed
    m = mpicomp.auto.model(comm)
    assert m["packed"][m["bytes"].index(float(1 << 18))] < 0.1, m
