"""mpicomp-bench: command line, output formats, and -c catching a wrong result."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

MPIEXEC = str(Path(sys.executable).parent / "mpiexec")


def bench(*args, n=None, env=None, timeout=180):
    cmd = [sys.executable, "-m", "mpicomp.bench", *args]
    if n:
        cmd = [MPIEXEC, "-n", str(n), *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,needle", [
    (["allreduce", "-m", "1X:2M"], "bad size '1X'"),
    (["allreduce", "-m", "4M:1K"], "MIN is larger than MAX"),
    (["allreduce", "--codec", "int9"], "unknown codec 'int9'"),
    (["allgather", "--codec", "int8:block=7"], "block must be a multiple of 32"),
    (["nosuch"], "invalid choice"),
])
def test_bad_arguments_exit_2_with_a_message(args, needle):
    r = bench(*args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_bad_arguments_exit_2_on_every_rank():
    r = bench("allreduce", "-m", "lots", n=2)
    assert r.returncode == 2 and r.stderr.count("bad size") == 1


def test_codecs_table_and_json(tmp_path):
    out = tmp_path / "c.json"
    r = bench("codecs", "-n", "100000", "-r", "1", "--codec", "int8,sign", "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "Memcpy" in r.stdout and "int8" in r.stdout
    recs = json.loads(out.read_text())
    assert {x["codec"] for x in recs} == {"int8", "sign"}
    assert all(x["encode_gbps"] > 0 and x["memcpy_gbps"] > 0 for x in recs)


@pytest.mark.parametrize("op", ["allreduce", "reduce_scatter", "allgather"])
def test_end_to_end_osu_table_and_json_schema(tmp_path, op):
    out = tmp_path / "r.json"
    r = bench(op, "-m", "1K:128K", "-i", "3", "-x", "1", "--rounds", "1", "-f", "-c", "--codec", "none,int4",
              "--compare", "mpi", "--json", str(out), n=2)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert any(l.startswith("# Size") and "Avg Latency(us)" in l and "Min Latency(us)" in l for l in lines)
    rows = [l.split() for l in lines if l and l[0].isdigit()]
    assert len(rows) == 3 * 8 and all(len(x) == 8 for x in rows)  # mpi, none, int4 x 1K..128K
    recs = json.loads(out.read_text())
    keys = {"op", "codec", "size", "np", "device", "avg_latency_us", "min_latency_us", "max_latency_us",
            "iterations", "ratio", "max_rel_error", "impl"}
    assert all(keys <= set(x) for x in recs) and {x["op"] for x in recs} == {op}
    big = [x for x in recs if x["codec"] == "int4" and x["size"] == 128 << 10]
    assert big[0]["ratio"] > 7 and 0 < big[0]["max_rel_error"] < 0.2


def test_validation_catches_a_wrong_result():
    r = bench("allreduce", "-m", "128K:128K", "-i", "2", "--rounds", "1", "-c", "--codec", "int8", n=2,
              env={"MPICOMP_BENCH_CORRUPT": "1"})
    assert r.returncode == 1 and "VALIDATION FAILED" in r.stdout


def test_pt2pt_table_json_and_validation(tmp_path):
    out = tmp_path / "p.json"
    r = bench("pt2pt", "-m", "1K:128K", "-i", "4", "--rounds", "1", "-c", "--codec", "none,int8", "--compare", "mpi",
              "--json", str(out), n=2)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Bandwidth (MB/s)" in r.stdout and "# mpi (the MPI library's Send/Recv)" in r.stdout
    recs = json.loads(out.read_text())
    assert {(x["impl"], x["codec"]) for x in recs} == {("mpi", "none"), ("mpicomp", "none"), ("mpicomp", "int8")}
    assert len(recs) == 3 * 8 and all(x["bandwidth_mbps"] > 0 and x["link"] == "local" for x in recs)
    big = next(x for x in recs if x["codec"] == "int8" and x["size"] == 128 << 10)
    assert big["ratio"] > 3.9 and 0 < big["max_rel_error"] < 0.01
    exact = [x for x in recs if x["impl"] == "mpicomp" and x["codec"] == "none"]
    assert all(x["max_rel_error"] == 0 for x in exact)
    bad = bench("pt2pt", "-m", "128K:128K", "-i", "2", "--rounds", "1", "-c", "--codec", "int8", n=2,
                env={"MPICOMP_BENCH_CORRUPT": "1"})
    assert bad.returncode == 1 and "VALIDATION FAILED" in bad.stdout


def test_pt2pt_needs_two_ranks():
    r = bench("pt2pt", "-m", "1K:1K")
    assert r.returncode == 2 and "needs at least 2 ranks" in r.stdout


def test_plot_draws_a_png_from_results(tmp_path):
    recs = [dict(op="allreduce", impl=impl, codec=codec, size=s, np=2, link="1gbit", avg_latency_us=t * s / 1024)
            for impl, codec, t in (("mpi", "none", 4.0), ("mpicomp", "none", 4.1), ("mpicomp", "int8", 1.0))
            for s in (1024, 2048, 4096)]
    (tmp_path / "r.json").write_text(json.dumps(recs))
    fig = tmp_path / "fig.png"
    r = bench("plot", str(tmp_path / "r.json"), "-o", str(fig))
    assert r.returncode == 0, r.stderr
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and fig.stat().st_size > 10_000
    (tmp_path / "empty.json").write_text("[]")
    r = bench("plot", str(tmp_path / "empty.json"), "-o", str(fig))
    assert r.returncode != 0 and "no latency records" in r.stderr


def test_summary_tables_speedups_and_crossover(tmp_path):
    def rec(impl, codec, s, t):
        return dict(op="allreduce", impl=impl, codec=codec, size=s, np=2, link="1gbit", avg_latency_us=t)

    recs = [rec("mpi", "none", 1 << 20, 16000.0), rec("mpicomp", "none", 1 << 20, 16000.0),
            rec("mpicomp", "int8", 1 << 20, 4000.0), rec("gloo", "none", 1 << 20, 8000.0),
            rec("mpicomp", "none", 1024, 40.0), rec("mpicomp", "int8", 1024, 50.0),
            rec("mpicomp", "none", 4096, 60.0), rec("mpicomp", "int8", 4096, 55.0)]
    (tmp_path / "r.json").write_text(json.dumps(recs))
    r = bench("summary", str(tmp_path / "r.json"), "--sizes", "1M")
    assert r.returncode == 0, r.stderr
    assert "| allreduce | 1gbit | 2 | 1M | 16.000 | 2.00 | 1.00 | 4.00 |" in r.stdout
    r = bench("summary", str(tmp_path / "r.json"), "--crossover")
    assert "| allreduce | 1gbit | 2 | int8 | 4K |" in r.stdout  # faster from 4K on, slower at 1K
