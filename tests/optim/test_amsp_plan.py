"""AMSP's partitions, groups and planner (pure Python): the groups' shards nest as the
optimizer needs, the planner never picks a partition over the memory limit, and says how
much the smallest needs when none fits."""
import itertools
import json
import random

import pytest

import mpicomp
from mpicomp.bench.__main__ import main as bench_main
from mpicomp.optim import amsp
from mpicomp.optim.amsp import Groups, check_partition, valid_partitions

GIB = 1e9


@pytest.mark.parametrize("world,rpn", [(1, 1), (3, 3), (4, 2), (4, 4), (8, 4), (12, 4), (16, 8)])
def test_valid_partitions_are_those_check_partition_accepts(world, rpn):
    valid = set(valid_partitions(world, rpn))
    for shard in itertools.product(range(1, world + 2), repeat=3):
        try:
            check_partition(shard, world, rpn)
            ok = True
        except mpicomp.ArgumentError:
            ok = False
        assert ok == (shard in valid), shard
    for corner in [(1, 1, 1), (1, 1, world), (1, world, world), (world, world, world)]:
        assert corner in valid  # DP, ZeRO-1, ZeRO-2, ZeRO-3


@pytest.mark.parametrize("shard,match", [((2, 1, 4), "s_p <= s_g <= s_os"), ((1, 3, 6), "does not divide"),
                                         ((1, 1, 8), "larger than the world"), ((1, 2), "three positive ints"),
                                         ((0, 1, 1), "three positive ints"), ("1,1,4", "three positive ints")])
def test_invalid_partitions_name_the_rule(shard, match):
    with pytest.raises(mpicomp.ArgumentError, match=match):
        check_partition(shard, 4, 4)


def test_groups_must_not_straddle_nodes_and_must_nest():
    with pytest.raises(mpicomp.ArgumentError, match="straddle"):
        check_partition((1, 1, 4), 12, 6)
    with pytest.raises(mpicomp.ArgumentError, match="nested"):
        check_partition((2, 3, 6), 6, 6)


@pytest.mark.parametrize("world,rpn", [(4, 4), (8, 2), (12, 4), (16, 4)])
def test_groups_nest_shards(world, rpn):
    for shard in valid_partitions(world, rpn):
        s_p, s_g, s_os = shard
        gs = [Groups(shard, world, r) for r in range(world)]
        for g in gs:
            o = g.index["os"]
            assert o // (s_os // s_g) == g.index["grad"] and o // (s_os // s_p) == g.index["param"]
            # each group's members, in key order, hold shards 0, 1, ... of their kind
            assert [gs[r].index["param"] for r in g.members("param")] == list(range(s_p))
            assert [gs[r].index["grad"] for r in g.members("grad")] == list(range(s_g))
            assert [gs[r].index["os"] for r in g.members("state")] == \
                list(range(g.index["grad"] * s_os // s_g, (g.index["grad"] + 1) * s_os // s_g))
            assert {gs[r].index["os"] for r in g.members("replica")} == {g.index["os"]}
            assert [gs[r].index["os"] for r in g.members("update")] == \
                list(range(g.index["param"] * s_os // s_p, (g.index["param"] + 1) * s_os // s_p))
            for name in ("param", "grad", "state", "replica", "update"):
                members = g.members(name)
                assert len(members) == g.size(name) and g.rank in members
                assert all(gs[r].color[name] == g.color[name] for r in members)
                assert [gs[r].key[name] for r in members] == sorted(gs[r].key[name] for r in members)
            # groups of at most a node's ranks stay inside one node
            assert not g.spans_nodes("param", rpn) or s_p > rpn
            assert not g.spans_nodes("grad", rpn) or s_g > rpn


def test_memory_formula():
    m = amsp.memory_bytes(1000, (1, 2, 4), activation_bytes=7)
    assert m == {"params": 2000, "grads": 1000, "optimizer": 3000, "activations": 7, "total": 6007}


def test_zero_corners_communication():
    """Bytes per rank of the textbook algorithms (ZeRO paper, section 7): DP and ZeRO-1/2
    send 2 (N-1)/N of the gradients' and parameters' bytes, ZeRO-3 3 (N-1)/N."""
    n, f = 8, 800
    volumes = {}
    for shard in [(1, 1, 1), (1, 1, n), (1, n, n), (n, n, n)]:
        plan = amsp.communication_plan(f, shard, n, n)
        volumes[shard] = (sum(c.bytes for c in plan), [c.op for c in plan])
    assert volumes[(1, 1, 1)] == (2 * 7 * 2 * f // 8, ["allreduce"])
    assert volumes[(1, 1, n)] == (2 * 7 * 2 * f // 8, ["reduce_scatter", "allgather"])
    assert volumes[(1, n, n)] == (2 * 7 * 2 * f // 8, ["reduce_scatter", "allgather"])
    assert volumes[(n, n, n)] == (3 * 7 * 2 * f // 8, ["allgather", "allgather", "reduce_scatter"])


def test_planner_never_exceeds_memory():
    rng = random.Random(4)
    for _ in range(200):
        world = rng.choice([8, 16, 64, 256])
        f = rng.randrange(10**8, 10**11)
        mem = rng.uniform(4, 200) * GIB
        try:
            p = amsp.plan(f, world, 8, mem, activation_bytes=rng.uniform(0, 20) * GIB,
                          inter_bandwidth=rng.uniform(1, 50) * GIB, modules=rng.randrange(1, 100))
        except amsp.PlanError as e:
            assert "needs" in str(e)
            continue
        assert p.best.memory["total"] <= mem and p.best.fits
        fitting = [c for c in p.candidates if c.fits]
        assert all(c.memory["total"] <= mem for c in fitting)
        assert p.best.seconds == min(c.seconds for c in fitting)
        assert {c.shard for c in p.candidates} == set(valid_partitions(world, 8))


def test_nothing_fits_says_what_the_smallest_needs():
    # 70e9 parameters on 8 ranks: (8, 8, 8) needs 16 * 70e9 / 8 = 140 GB
    with pytest.raises(amsp.PlanError, match=r"shard=\(8, 8, 8\), needs 140 GB"):
        amsp.plan(70_000_000_000, 8, 8, 80 * GIB)
    assert issubclass(amsp.PlanError, mpicomp.MpicompError)


def test_slow_links_push_shards_inside_nodes():
    """With slow links between nodes, the pick keeps every collective inside a node except
    the one on the smallest data: the state shard's gradient (F / 8) across replicas. With
    several micro-batches it shards neither parameters nor gradients, which would move
    data every micro-batch: the paper's (1, 1, 8) for LLaMA 7B."""
    p = amsp.plan(1_000_000_000, 64, 8, 80 * GIB, intra_bandwidth=200 * GIB, inter_bandwidth=10 * GIB,
                  micro_batches=4, modules=32)
    inter = [c for c in p.best.collectives if c.spans_nodes]
    assert [c.group for c in inter] == ["replica"] and inter[0].bytes == 2 * 7 * (2 * 10**9 // 8) // 8
    assert p.shard == (1, 1, 8)
    text = p.explain()
    assert f"shard (s_p, s_g, s_os) = {p.shard}" in text and "across replicas" in text


@pytest.mark.parametrize("kwargs,match", [({"num_params": 0}, "num_params"), ({"world_size": 2.5}, "world_size"),
                                          ({"memory_per_rank": -1}, "memory_per_rank"),
                                          ({"ranks_per_node": 3}, "ranks_per_node"),
                                          ({"latency": -1}, "latency")])
def test_bad_planner_arguments(kwargs, match):
    args = dict(num_params=10**9, world_size=16, ranks_per_node=8, memory_per_rank=80 * GIB)
    with pytest.raises(mpicomp.ArgumentError, match=match):
        amsp.plan(**{**args, **kwargs})


def test_command_line(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert bench_main(["plan", "--params", "7G", "--world", "64", "--ranks-per-node", "8", "--memory", "80G",
                       "--activations", "20G", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert f"shard (s_p, s_g, s_os) = {tuple(saved['shard'])}" in printed
    assert saved["candidates"][0]["memory"]["total"] <= 80e9
    assert bench_main(["plan", "--params", "70G", "--world", "8", "--ranks-per-node", "8", "--memory", "80G"]) == 1
    assert "needs 140 GB" in capsys.readouterr().err


def test_bandwidth_from_benchmark_json(tmp_path, capsys):
    """4 ranks, allgather of 1 MB per rank in 2 ms: each rank sends 3 MB, 1.5 GB/s."""
    rec = {"op": "allgather", "impl": "mpi", "codec": "none", "np": 4, "avg_latency_us": 2000.0}
    path = tmp_path / "ag.json"
    path.write_text(json.dumps([{**rec, "size": 1_000_000}, {**rec, "size": 1000, "avg_latency_us": 5.0},
                                {**rec, "size": 4_000_000, "codec": "int8"}]))
    assert amsp.bandwidth_from_bench(str(path)) == pytest.approx(1.5e9)
    assert bench_main(["plan", "--params", "1G", "--world", "16", "--ranks-per-node", "8", "--memory", "80G",
                       "--inter", str(path)]) == 0
    assert "inter-node 1.5 GB/s" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(mpicomp.ArgumentError, match="codec none"):
        amsp.bandwidth_from_bench(str(tmp_path / "bad.json"))
