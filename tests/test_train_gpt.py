"""examples/train_gpt.py end to end on 2 ranks with a tiny model: the JSON log, determinism
(same seed: same losses and bytes), the loss going down, and the policies' byte counts."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import mpiexec

import mpicomp

ROOT = Path(__file__).resolve().parents[1]
TINY = ["--layers", "2", "--width", "32", "--heads", "2", "--context", "32", "--batch", "4", "--steps", "4",
        "--lr", "1e-2", "--corpus-bytes", "300000"]


def train(tmp_path, name, *flags, n=2, out=None, **env):
    log = tmp_path / f"{name}.json"
    args = [sys.executable, ROOT / "examples" / "train_gpt.py", *TINY, *flags, "--json", log]
    r = mpiexec(n, *args, timeout=120, env={**os.environ, **env})
    assert r.returncode == 0, f"{' '.join(map(str, args))} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    assert "final loss" in r.stdout and "step 4/4" in r.stdout, r.stdout
    if out is not None:
        out.append(r.stdout)
    return json.loads(log.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("train_gpt")
    return {
        "dp": train(tmp, "dp", "--dp", "2", "--policy", "hybrid"),
        "dp_again": train(tmp, "dp_again", "--dp", "2", "--policy", "hybrid"),
        "tp_hybrid": train(tmp, "tp_hybrid", "--tp", "2", "--policy", "hybrid"),
        "tp_none": train(tmp, "tp_none", "--tp", "2", "--policy", "none"),
        "pp": train(tmp, "pp", "--pp", "2", "--policy", "naive", "--micro-batches", "2"),
        "adamw_none": train(tmp, "adamw_none", "--dp", "2", "--policy", "none"),
        "zero1_none": train(tmp, "zero1_none", "--dp", "2", "--policy", "none", "--optimizer", "zero1"),
        "acco": train(tmp, "acco", "--dp", "2", "--policy", "none", "--optimizer", "acco", "--steps", "4"),
    }


def losses(log):
    return [s["loss"] for s in log["steps"]]


def test_log_and_determinism(runs):
    log = runs["dp"]
    assert log["mesh"] == {"dp": 2, "tp": 1, "pp": 1} and log["world_size"] == 2
    assert log["policy"]["dp.gradients"] == "int4:block=32" and log["policy"]["dp.error_feedback"] is True
    assert [s["step"] for s in log["steps"]] == [1, 2, 3, 4]
    assert losses(log) == losses(runs["dp_again"])
    assert [s["bytes"] for s in log["steps"]] == [s["bytes"] for s in runs["dp_again"]["steps"]]
    assert log["final_loss"] == losses(log)[-1]  # the mean of the last max(1, steps // 10)
    for run in runs.values():
        assert losses(run)[-1] < losses(run)[0] - 0.3, losses(run)
    assert len({run["parameters"] for run in runs.values()}) == 1  # the same model in every layout


def test_bytes_follow_the_policy(runs):
    # dp=2: all the core sent is gradients (int4, 32-element blocks): one bucket of all parameters,
    # of which each rank sends about half twice
    dp = runs["dp"]["steps"][0]
    assert dp["bytes_by_kind"] == {"dp.gradients": dp["wire_bytes"]}
    int4 = mpicomp.codec("int4:block=32").encoded_bytes(runs["dp"]["parameters"])
    assert 2 * int4 <= dp["wire_bytes"] < 2 * int4 * 1.01
    hybrid, none = runs["tp_hybrid"]["steps"][0], runs["tp_none"]["steps"][0]
    assert set(none["bytes_by_kind"]) == {"tp.forward", "tp.backward", "dp.gradients"}
    assert none["bytes_by_kind"]["dp.gradients"] == 0  # one replica: nothing to average
    # tp traffic under hybrid is int8: 1 + 4/256 bytes per float32 instead of 4
    assert hybrid["bytes"] * 3.9 < none["bytes"] < hybrid["bytes"] * 4
    assert set(runs["pp"]["steps"][0]["bytes_by_kind"]) >= {"pp.forward", "pp.backward"}


def test_sharded_optimizers(runs, tmp_path):
    # ZeRO-1 is AdamW with its state sharded: the same losses to float tolerance
    for a, b in zip(losses(runs["adamw_none"]), losses(runs["zero1_none"])):
        assert abs(a - b) <= 1e-5 * abs(a)
    acco = runs["acco"]  # (determinism with fixed counts: tests/optim/mpi/test_acco.py)
    assert losses(acco)[-1] < losses(acco)[0] - 0.3
    # two rounds of one micro-batch on each of the 2 ranks per step (--micro-batches 2), the
    # first step also computes the first half at theta_0
    assert [s["micro_batches"] for s in acco["steps"]] == [[3, 3]] + [[2, 2]] * 3
    assert all(s["tokens"] == 4 * 2 * 32 * (i + 1) for i, s in enumerate(acco["steps"]))
    assert all(w >= 0 for s in acco["steps"] for w in s["comm_wait_s"])


def test_no_log_without_json_and_the_progress_line(tmp_path):
    """Without --json nothing is written into the working directory; the progress line
    gives bytes sent, the uncompressed baseline and their ratio (zero1 with the hybrid
    policy: int4 gradient reduce-scatter, exact parameter allgather, so about 1.7x)."""
    r = mpiexec(2, sys.executable, ROOT / "examples" / "train_gpt.py", *TINY, "--steps", "1", "--optimizer", "zero1",
                timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []
    import re
    m = re.search(r"([\d.]+) MB/step sent \(([\d.]+) MB uncompressed, ([\d.]+)x\) micro-batches \[1, 1\] comm wait",
                  r.stdout.replace("[2, 2]", "[1, 1]"))
    assert m, r.stdout
    sent, plain, ratio = map(float, m.groups())
    assert 1.5 < plain / sent < 2 and abs(ratio - plain / sent) < 0.02


def test_help_has_no_empty_entries():
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "train_gpt.py"), "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0 and "--optimizer" in r.stdout
    import re
    options = re.findall(r"^  (-[^\n]*?)(?:\n|$)", r.stdout, re.M)
    # argparse puts an option with help on one line or the help on the next; an option
    # line with nothing after it and no indented help below has no help
    lines = r.stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("  -") and len(line.split("  ")) < 3:
            assert i + 1 < len(lines) and lines[i + 1].startswith(" " * 10), f"no help for {line.strip()}"
    assert options


def test_amsp_zero3_corner(runs, tmp_path):
    """--optimizer amsp --shard 2,2,2 (ZeRO-3 on 2 ranks): AdamW's losses to float
    tolerance, and each rank holds half of the parameters, gradients and state."""
    log = train(tmp_path, "amsp", "--dp", "2", "--policy", "none", "--optimizer", "amsp", "--shard", "2,2,2")
    for a, b in zip(losses(runs["adamw_none"]), losses(log)):
        assert abs(a - b) <= 1e-5 * abs(a)
    for mem in log["memory"]:
        assert abs(mem["params"] - mem["formula"]["params"]) <= 4 * 64  # padding: < s_os per module
        assert mem["formula"]["params"] == 4 * log["parameters"] / 2


def test_bytes_between_nodes(runs, tmp_path):
    """On nodes of several ranks the total counts traffic inside a node too: the log and the
    last line say what crossed between nodes, which two levels cut below the flat ring's
    (3 ranks, nodes of 2 and 1), though they send more in all. On one node, nothing."""
    lines = []
    flat, two = (train(tmp_path, h, "--dp", "3", "--policy", "hybrid", n=3, out=lines, MPICOMP_RANKS_PER_NODE="2",
                       MPICOMP_HIERARCHY=h) for h in ("flat", "auto"))
    assert 0 < two["inter_bytes_per_step"] < flat["inter_bytes_per_step"] < flat["wire_bytes_per_step"]
    assert two["wire_bytes_per_step"] > flat["wire_bytes_per_step"]
    assert all(f"{log['inter_bytes_per_step'] / 1e6:.3f} MB of it between nodes" in out
               for log, out in zip((flat, two), lines)), lines
    assert runs["dp"]["inter_bytes_per_step"] == 0 and runs["dp"]["wire_bytes_per_step"] > 0  # one node


def test_diloco_islands_follow_the_nodes(tmp_path):
    """--islands nodes: an island per node of the node layout (mpicomp.node_comms), the same
    run as the number of islands the nodes make."""
    flags = ("--dp", "2", "--policy", "none", "--optimizer", "diloco", "--sync-every", "2")
    for rpn, islands in (("2", "1"), ("1", "2")):
        by_nodes = train(tmp_path, f"nodes{rpn}", *flags, "--islands", "nodes", MPICOMP_RANKS_PER_NODE=rpn)
        by_count = train(tmp_path, f"islands{islands}", *flags, "--islands", islands)
        assert losses(by_nodes) == losses(by_count), rpn
        assert [s["outer_bytes"] for s in by_nodes["steps"]] == [s["outer_bytes"] for s in by_count["steps"]]
    assert by_nodes["steps"][-1]["outer_bytes"] > 0  # two islands exchange outer gradients


def test_diloco_syncs_every_h_steps(tmp_path):
    """--optimizer diloco --sync-every 2: nothing crosses between workers on steps 1 and 3,
    int8 outer gradients on steps 2 and 4 (about a byte per parameter per rank, not four)."""
    log = train(tmp_path, "diloco", "--dp", "2", "--policy", "none", "--optimizer", "diloco", "--sync-every", "2",
                "--outer-codec", "int8")
    outer = [s["outer_bytes"] for s in log["steps"]]
    assert [s["wire_bytes"] for s in log["steps"]][0::2] == [0, 0]
    assert outer[0] == 0 and 0 < outer[1] == outer[2] < outer[3]
    assert outer[1] < 2 * 4 * log["parameters"] / 3
