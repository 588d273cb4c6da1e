"""mpicomp-bench model and bound.py: the link bound against BUILD.md's measured link, node links'
formulas against sums worked out by hand (or counted rank by rank), the command's table and
JSON, --speeds files."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import mpicomp
from mpicomp.bench import bound
from mpicomp.bench.model import Kernels, Machine, predict

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
GPU = RESULTS / "gpu-codecs-h100.json"

# 1e6 float32 per rank; a link of 8 Gbit/s moves 1e9 bytes/s; 1 GB/s inside the node; sums at
# 2 GB/s (2 ns per element); codec: 1, 2, 3 ns per element to encode, decode, decode-accumulate.
N_ELEMENTS = 1_000_000
MACHINE = Machine(gbit=8, latency_us=1.0, intra_gbyte=1.0, intra_latency_us=0.5, sum_gbyte=2.0)
INT8 = Kernels(ratio=4.0, encode=1e-9, decode=2e-9, accumulate=3e-9)


def cross_bytes_flat(nodes, r, per_peer):
    """Bytes node 0's ranks send to ranks of other nodes, counted pair by pair."""
    p = nodes * r
    return sum(per_peer for a in range(p) for b in range(p) if a // r == 0 and b // r != 0)


def test_two_nodes_of_two_by_hand():
    """N = 2, R = 2, int8 at ratio 4: w(n) = 1e6 bytes."""
    s = 4 * N_ELEMENTS
    flat = predict("flat", s, 2, 2, MACHINE, INT8)
    # Each rank sends each of 3 peers 2 w / 4 = 0.5e6 bytes; node 0's 2 ranks, 2 peers each
    # on node 1: 2e6 bytes, 2 ms at 1e9 bytes/s.
    assert flat.link == pytest.approx(2e-3)
    # 1e6 encoded, 1e6 decoded, 3/4 of 1e6 decode-accumulated.
    assert flat.codec == pytest.approx(1e6 * 1e-9 + 1e6 * 2e-9 + 0.75e6 * 3e-9)
    assert flat.intra == 0 and flat.latency == pytest.approx(6e-6)  # 3 rounds per stage
    assert flat.total == pytest.approx(5.25e-3 + 6e-6)

    two = predict("two_level", s, 2, 2, MACHINE, INT8)
    # Each rank allreduces 5e5 elements (5e5 wire bytes) with its one peer on the other node:
    # it sends half of them there twice (reduce-scatter, allgather), 5e5 bytes; 2 ranks.
    assert two.link == pytest.approx(1e-3)
    # 5e5 encoded and decoded, 2.5e5 decode-accumulated.
    assert two.codec == pytest.approx(5e5 * 3e-9 + 2.5e5 * 3e-9)
    # Inside the node: reduce-scatter sends 2e6 bytes (2 ms) and sums 5e5 elements (1 ms),
    # allgather sends 2e6 bytes (2 ms).
    assert two.intra == pytest.approx(5e-3)
    assert two.latency == pytest.approx(2 * 1e-6 + 2 * 0.5e-6)
    assert two.total == pytest.approx(5e-3 + 2.25e-3 + 3e-6)

    mpi = predict("mpi", s, 2, 2, MACHINE)
    assert mpi.link == pytest.approx(4e-3)  # two_level's bytes, uncompressed: 4 bytes an element
    assert mpi.codec == pytest.approx(2.5e5 * 2e-9)  # its sums between nodes, nothing else
    assert (mpi.intra, mpi.latency) == (pytest.approx(5e-3), pytest.approx(3e-6))
    assert mpi.total == pytest.approx(9.003e-3)
    assert predict("mpi", s, 2, 2, MACHINE, INT8) == mpi  # no codec reaches MPI's own


@pytest.mark.parametrize("nodes,r", [(2, 2), (2, 3), (3, 3), (4, 2)])
def test_two_level_puts_one_rth_of_flats_bytes_on_the_node_link(nodes, r):
    s, w = 4 * N_ELEMENTS, N_ELEMENTS  # int8: 1 wire byte per element
    p = nodes * r
    flat = predict("flat", s, nodes, r, MACHINE, INT8)
    two = predict("two_level", s, nodes, r, MACHINE, INT8)
    assert flat.link * 1e9 == pytest.approx(cross_bytes_flat(nodes, r, 2 * w / p))
    # Node 0's r ranks each allreduce w / r bytes over `nodes` ranks: 2 (nodes - 1) / nodes of it out.
    assert two.link * 1e9 == pytest.approx(r * 2 * (nodes - 1) / nodes * w / r)
    assert two.link == pytest.approx(flat.link / r)
    assert predict("mpi", s, nodes, r, MACHINE).link == pytest.approx(4 * two.link)


def test_one_rank_per_node_has_no_intra_stage_and_two_level_is_flat():
    s = 4 * N_ELEMENTS
    flat, two = predict("flat", s, 4, 1, MACHINE, INT8), predict("two_level", s, 4, 1, MACHINE, INT8)
    assert two.intra == 0 and (two.link, two.codec) == (pytest.approx(flat.link), pytest.approx(flat.codec))
    assert flat.latency == two.latency == pytest.approx(6e-6)


def test_predict_rejects_an_unknown_algorithm():
    with pytest.raises(ValueError, match="algorithm must be one of mpi, flat, two_level"):
        predict("ring", 1 << 20, 2, 2, MACHINE, INT8)


def link_of(netem):
    os.environ["MPICOMP_NETEM"] = netem
    try:
        return bound.Link()
    finally:
        del os.environ["MPICOMP_NETEM"]


def kernels_ns(spec, e, d, a):
    speeds = bound.Speeds([], np.zeros(1, np.float32))
    speeds.per_element = {spec: [e * 1e-9, d * 1e-9, a * 1e-9]}
    return speeds


def test_bound_model_matches_the_measured_link():
    """The link bound of MPI's 16 MiB allreduce on 2 ranks sharing bench/netem's 1 Gbit/s
    loopback is 32 MiB over 1 Gbit/s, 268 ms: BUILD.md measured 269 ms. Codec work adds to the
    codec bound only; per-rank links carry half as much."""
    os.environ["MPICOMP_NETEM"] = "1gbit"
    try:
        shared = bound.Link()
    finally:
        del os.environ["MPICOMP_NETEM"]
    none = bound.Speeds([], np.zeros(1, np.float32))
    link_us, codec_us = bound.bound_us("allreduce", "none", 4 << 20, 2, 1.0, none, shared)
    assert shared.shared and abs(link_us / 1e3 - 268.4) < 0.1 and codec_us == 0
    per_rank = bound.Link(gbit=1)
    assert bound.bound_us("allreduce", "none", 4 << 20, 2, 1.0, none, per_rank)[0] == link_us / 2
    int8 = mpicomp.codec("int8")
    x = np.random.default_rng(0).standard_normal(1 << 16).astype(np.float32)
    for stream in (False, True):  # the collectives decode outputs of _core.STREAM_BYTES and more streamed
        speeds = bound.Speeds([int8], x, stream=stream)
        link8, codec8 = bound.bound_us("allreduce", "int8", 4 << 20, 2, 3.94, speeds, shared)
        assert abs(link8 * 3.94 - link_us) < 1 and 0 < codec8 < 1e6
    assert bound.bound_us("allreduce", "int8", 4 << 20, 1, 3.94, speeds, shared) == (None, 0.0)


def test_bound_keeps_each_kernels_fastest_round():
    """Speeds are timed once per round beside the collectives; the bound takes each kernel's
    fastest, as the table takes each collective's fastest round."""
    first, second = bound.Speeds([], np.zeros(1, np.float32)), bound.Speeds([], np.zeros(1, np.float32))
    first.per_element = {"int8": [3.0, 1.0, 2.0]}
    second.per_element = {"int8": [1.0, 2.0, 2.0], "sign": [5.0, 4.0, 6.0]}
    assert first.keep_faster(second).per_element == {"int8": [1.0, 1.0, 2.0], "sign": [5.0, 4.0, 6.0]}


def test_bound_between_nodes_of_two_against_per_rank():
    """4 ranks, int8 at ratio 4, 1e6 elements: w = 1e6 bytes; 1 Gbit/s moves 125 bytes a us."""
    nodes = link_of("1gbit between nodes of 2")
    assert (nodes.ranks_per_node, nodes.shared) == (2, False) and "one per node of 2 ranks" in nodes.describe()
    per_rank = bound.Link(gbit=1)
    assert per_rank.ranks_per_node == 1
    speeds = kernels_ns("int8", 1, 2, 3)
    us = 1e6 / 125  # us per 1e6 bytes
    args = ("int8", N_ELEMENTS, 4, 4.0, speeds)
    # per rank: 2 (3/4) w out of its own link.
    assert bound.bound_us("allreduce", *args, per_rank) == (pytest.approx(1.5 * us), pytest.approx(5250))
    # nodes of 2, flat: each rank 2 w / 4 to each of 2 ranks of the other node, 2 ranks: 2 w.
    assert bound.bound_us("allreduce", *args, nodes)[0] == pytest.approx(cross_bytes_flat(2, 2, 0.5e6) / 125)
    assert bound.bound_us("allreduce", *args, nodes)[0] == pytest.approx(2 * us)
    # two-level: 2 ranks each send half of their 5e5 wire bytes twice: w; codec on 5e5 elements among 2.
    two = bound.bound_us("allreduce", *args, nodes, algorithm="two_level")
    assert two == (pytest.approx(us), pytest.approx(5e5 * 3e-3 + 2.5e5 * 3e-3))
    # ranks_per_node names the nodes where the link does not.
    assert bound.bound_us("allreduce", *args, per_rank, ranks_per_node=2, algorithm="two_level") == two
    # reduce_scatter: flat 2 ranks x 2 peers x w/4; two-level: each rank's w/2 reduce-scattered with 1 peer, half out.
    assert bound.bound_us("reduce_scatter", *args, nodes)[0] == pytest.approx(us)
    assert bound.bound_us("reduce_scatter", *args, nodes, algorithm="two_level")[0] == pytest.approx(us / 2)
    # allgather: flat 2 ranks x 2 peers x w; two-level: each rank's w to its 1 peer, 2 ranks.
    assert bound.bound_us("allgather", *args, nodes)[0] == pytest.approx(4 * us)
    assert bound.bound_us("allgather", *args, nodes, algorithm="two_level") == (
        pytest.approx(2 * us), pytest.approx(1e6 * 1e-3 + 2e6 * 2e-3))


def test_bound_models_mpi_node_aware_and_uncompressed_on_nodes():
    nodes, speeds = link_of("1gbit between nodes of 2"), kernels_ns("int8", 1, 2, 3)
    # MPI's allreduce on 2 nodes of 2: 4e6 input bytes per rank, its node's sum allreduced
    # between 2 nodes: half of 4e6 bytes out twice, 4e6 bytes; per rank links carry 2 (3/4) 4e6.
    assert bound.bound_us("allreduce", "none", N_ELEMENTS, 4, 1.0, speeds, nodes) == (pytest.approx(4e6 / 125), 0.0)
    assert bound.bound_us("allreduce", "none", N_ELEMENTS, 4, 1.0, speeds, bound.Link(gbit=1))[0] == (
        pytest.approx(6e6 / 125))


def test_bound_on_unequal_nodes():
    """3 ranks in nodes of 2 and 1."""
    nodes, speeds = link_of("1gbit between nodes of 2"), kernels_ns("int8", 1, 2, 3)
    # flat: either node's link carries 2 x 1 x 2w/3 (w = 1e6 bytes).
    flat = bound.bound_us("allreduce", "int8", N_ELEMENTS, 3, 4.0, speeds, nodes)
    assert flat[0] == pytest.approx(4 / 3 * 1e6 / 125)
    # two-level: one lane (the smaller node has one rank); node 0 reduces into its first rank,
    # which allreduces all 1e6 elements with rank 2: half of w out in each stage.
    two = bound.bound_us("allreduce", "int8", N_ELEMENTS, 3, 4.0, speeds, nodes, algorithm="two_level")
    assert two == (pytest.approx(1e6 / 125), pytest.approx(1e6 * 3e-3 + 0.5e6 * 3e-3))
    assert bound.bound_us("allreduce", "none", N_ELEMENTS, 3, 1.0, speeds, nodes) == (pytest.approx(4e6 / 125), 0.0)
    # reduce_scatter and allgather have no two-level model on unequal nodes.
    assert bound.bound_us("reduce_scatter", "none", N_ELEMENTS, 3, 1.0, speeds, nodes) == (None, 0.0)
    with pytest.raises(ValueError, match="needs nodes of equal size"):
        bound.bound_us("allgather", "int8", N_ELEMENTS, 3, 4.0, speeds, nodes, algorithm="two_level")
    # One shared link: no two-level model on unequal nodes, flat as before (every rank's bytes).
    shared = link_of("1gbit")
    assert bound.bound_us("allreduce", "int8", N_ELEMENTS, 3, 4.0, speeds, shared, algorithm="two_level",
                          ranks_per_node=2)[0] is None
    assert bound.bound_us("allreduce", "int8", N_ELEMENTS, 3, 4.0, speeds, shared)[0] == (
        pytest.approx(3 * 2 * 2 / 3 * 1e6 / 125))


def test_bound_refuses_an_unknown_algorithm():
    nodes, speeds = link_of("1gbit between nodes of 2"), kernels_ns("int8", 1, 2, 3)
    with pytest.raises(ValueError, match="algorithm must be one of flat, two_level"):
        bound.bound_us("allreduce", "int8", N_ELEMENTS, 4, 4.0, speeds, nodes, algorithm="tree")


def model(*args):
    return subprocess.run([sys.executable, "-m", "mpicomp.bench", "model", *args], capture_output=True, text=True,
                          timeout=120)


def rows(stdout):
    return [line.split() for line in stdout.splitlines() if line and not line.startswith("#")]


def test_model_command_with_the_gpu_speeds(tmp_path):
    out = tmp_path / "m.json"
    r = model("--nodes", "2,8", "--ranks-per-node", "2,4", "--gbit", "100", "--size", "1M,256M", "--codec",
              "int8,int4", "--speeds", str(GPU), "--json", str(out))
    assert r.returncode == 0, r.stderr
    header = [line for line in r.stdout.splitlines() if line.startswith("#")]
    assert any("NVIDIA H100" in h and "gpu-codecs-h100.json" in h for h in header)
    assert any("450.0 GB/s" in h for h in header)  # NVLink, not the host's memcpy
    # A sum reads 8 bytes and writes 4 per element, a copy reads and writes 4: 2/3 of its speed.
    assert any("sums at 958.3 GB/s (2/3 of a 1437.4 GB/s copy)" in h for h in header)
    assert any(h.startswith("# int8: ratio 3.94, encode 1396.1") for h in header)
    table = rows(r.stdout)
    assert len(table) == 2 * 2 * 2 * 5 and all(len(row) == 13 for row in table)
    for size, nodes, rpn, gbit, alg, codec, ratio, link, cod, intra, lat, total, speedup in table:
        assert float(total) == pytest.approx(float(intra) + max(float(link), float(cod)) + float(lat), abs=2e-3)
        if alg == "mpi":
            assert (codec, ratio, speedup) == ("none", "1.00", "1.00")
        if alg == "flat":
            assert float(intra) == 0
    doc = json.loads(out.read_text())
    assert doc["command"].startswith("mpicomp-bench model --nodes 2,8") and doc["intra_gbyte"] == 450.0
    assert doc["codec_gbps"]["int4"]["decode"] == pytest.approx(2277.66, abs=0.01)
    recs = doc["records"]
    assert len(recs) == len(table)
    # 256 MiB on 8 nodes of 4 at 100 Gbit/s: MPI's node link carries 2 (7/8) 256 MiB.
    big = {(x["algorithm"], x["codec"]): x for x in recs
           if (x["size"], x["nodes"], x["ranks_per_node"]) == (256 << 20, 8, 4)}
    mpi, two = big["mpi", "none"], big["two_level", "int8"]
    assert mpi["link_ms"] == pytest.approx(2 * 7 / 8 * (256 << 20) * 8 / 100e9 * 1e3)
    assert two["speedup_vs_mpi"] == pytest.approx(mpi["predicted_ms"] / two["predicted_ms"])
    assert two["speedup_vs_mpi"] > 2


def test_model_command_measures_here_and_reads_cpu_codec_files(tmp_path):
    r = model("--nodes", "2", "--ranks-per-node", "2", "--gbit", "10", "--size", "1M", "--codec", "int8")
    assert r.returncode == 0, r.stderr
    assert "measured here" in r.stdout and len(rows(r.stdout)) == 3
    cpu = RESULTS / "codecs-cpu-local.json"
    r = model("--nodes", "2", "--gbit", "10", "--codec", "int8,sign", "--speeds", str(cpu), "--intra-gbyte", "20")
    assert r.returncode == 0, r.stderr
    assert "20.0 GB/s" in r.stdout and "mpicomp-bench codecs" in r.stdout
    assert {row[5] for row in rows(r.stdout)} == {"none", "int8", "sign"}


@pytest.mark.parametrize("args,needle", [
    (["--codec", "powersgd"], "has no fixed ratio"),
    (["--codec", "int8:block=64", "--speeds", str(GPU)], "has no speeds for int8:block=64"),
    (["--speeds", str(RESULTS / "diloco-gpt-h10.json")], "not a list of records"),
    (["--gbit", "0"], "not a list of positive numbers"),
])
def test_model_command_refuses_what_it_cannot_model(args, needle):
    r = model("--nodes", "2", "--gbit", "10", *args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr
