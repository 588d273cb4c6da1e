"""mpicomp-bench: command line, output formats, and -c catching a wrong result."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from _launch import MPIEXEC, mpiexec

from mpicomp.bench.options import fmt_size

BENCH = Path(__file__).resolve().parents[1] / "bench"


def bench(*args, n=None, env=None, timeout=180):
    cmd = [sys.executable, "-m", "mpicomp.bench", *args]
    env = {**os.environ, **(env or {})}
    if n:
        return mpiexec(n, *cmd, timeout=timeout, env=env)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("args,needle", [
    (["allreduce", "-m", "1X:2M"], "bad size '1X'"),
    (["allreduce", "-m", "4M:1K"], "MIN is larger than MAX"),
    (["allreduce", "--codec", "int9"], "unknown codec 'int9'"),
    (["allgather", "--codec", "int8:block=7"], "block must be a multiple of 32"),
    (["nosuch"], "invalid choice"),
    (["allreduce", "--compare", "mpi,nccl"], "unknown peer 'nccl'"),
    (["pt2pt", "--compare", "gloo"], "unknown peer 'gloo'"),
    (["allreduce", "--table", "wide"], "--table wide shows speed-ups over the MPI library: it needs --compare mpi"),
    (["allreduce", "-i", "5", "--volume", "1M"], "not allowed with argument"),
    (["allreduce", "--hierarchy", "auto,tree"], "unknown hierarchy 'tree'"),
    (["allreduce", "--compare", "mpi", "--table", "wide", "--hierarchy", "auto,flat"], "give one --hierarchy"),
])
def test_bad_arguments_exit_2_with_a_message(args, needle):
    r = bench(*args)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_bad_arguments_exit_2_on_every_rank():
    r = bench("allreduce", "-m", "lots", n=2)
    assert r.returncode == 2 and r.stderr.count("bad size") == 1


def test_hierarchies_side_by_side_on_emulated_nodes(tmp_path):
    """--hierarchy auto,flat on 2 nodes of 2: both timed in one run, checked (-c), labelled,
    and each bound taken for the algorithm that ran."""
    out = tmp_path / "h.json"
    r = bench("allreduce", "-m", "256K:256K", "-i", "3", "-x", "1", "--rounds", "1", "-c", "--codec", "int8",
              "--hierarchy", "auto,flat", "--compare", "mpi", "--json", str(out), n=4,
              env={"MPICOMP_RANKS_PER_NODE": "2", "MPICOMP_NETEM": "1gbit between nodes of 2"})  # as netem says
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    recs = {x["impl"]: x for x in json.loads(out.read_text())}
    assert set(recs) == {"mpi", "mpicomp", "mpicomp/flat"}
    assert recs["mpicomp"]["hierarchy"] == "auto" and recs["mpicomp/flat"]["hierarchy"] == "flat"
    # A link per node: two-level sends 1/2 of what flat sends across it.
    assert recs["mpicomp/flat"]["link_bound_us"] == pytest.approx(2 * recs["mpicomp"]["link_bound_us"], rel=1e-6)


def test_auto_reports_the_share_of_timed_calls_it_compressed(tmp_path):
    """codec auto's rows: the share of the kept round's calls sent compressed, in the JSON and a
    closing line; the Ratio column the codec's where most went compressed. Which sizes do is
    measured on this machine: the test checks that the three agree."""
    out = tmp_path / "a.json"
    r = bench("allreduce", "-m", "1K:1M", "-i", "20", "-x", "2", "--rounds", "2", "-c", "--codec", "int8,auto",
              "--json", str(out), n=2, env={"MPICOMP_MIN_BYTES": "0"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    recs = [x for x in json.loads(out.read_text()) if x["codec"] == "auto"]
    ratio = next(x for x in json.loads(out.read_text()) if x["codec"] == "int8")["ratio"]
    assert len(recs) == 11 and all(0 <= x["auto_compressed_share"] <= 1 for x in recs)
    assert all(x["ratio"] == (ratio if x["auto_compressed_share"] >= 0.5 else 1.0) for x in recs)
    line = next(line for line in r.stdout.splitlines() if "share of the timed calls sent compressed" in line)
    assert line.split("compressed: ", 1)[1] == ", ".join(
        f"{fmt_size(x['size'])} {100 * x['auto_compressed_share']:.0f}%" for x in recs)


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
    assert any(line.split()[1:3] == ["Size", "Avg"] and "Min Latency(us)" in line and line.endswith("Impl   Codec")
               for line in lines)
    rows = [line.split() for line in lines if line and line[0].isdigit()]
    assert len(rows) == 3 * 8 and all(len(x) == 12 for x in rows)  # mpi, none, int4 x 1K..128K
    # No link rate (not bench/netem): MPI's rows have no bound, compressed ones the codec's.
    assert all(x[5:7] == ["-", "-"] for x in rows if x[10] == "mpi")
    # Compressed from min_bytes (64 KiB) of input per part: a reduce_scatter's size is all parts.
    first = (128 if op == "reduce_scatter" else 64) << 10
    assert all(float(x[5]) > 0 for x in rows if x[11] == "int4" and int(x[0]) >= first)
    assert all(x[5] == "-" for x in rows if x[11] == "int4" and int(x[0]) < first)
    # In the order measured: each size's implementations side by side, sizes ascending.
    assert [(int(x[0]), x[10], x[11]) for x in rows[:4]] == [
        (1024, "mpi", "none"), (1024, "mpicomp", "none"), (1024, "mpicomp", "int4"), (2048, "mpi", "none")]
    recs = json.loads(out.read_text())
    keys = {"op", "codec", "size", "np", "device", "avg_latency_us", "min_latency_us", "max_latency_us",
            "iterations", "ratio", "max_rel_error", "impl"}
    assert all(keys <= set(x) for x in recs) and {x["op"] for x in recs} == {op}
    big = [x for x in recs if x["codec"] == "int4" and x["size"] == 128 << 10]
    assert big[0]["ratio"] > 7 and 0 < big[0]["max_rel_error"] < 0.2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["allreduce", "allgather"])
def test_16_bit_data_checked_against_float64(tmp_path, dtype, op):
    out = tmp_path / "r.json"
    r = bench(op, "-m", "256K:256K", "-i", "2", "--rounds", "1", "-c", "--dtype", dtype, "--data", "relu",
              "--codec", "none,int8,blosc:cname=lz4,filter=none,lossless", "--compare", "mpi", "--json", str(out), n=2)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert f"bytes of {dtype} input" in r.stdout
    recs = json.loads(out.read_text())
    assert {x["dtype"] for x in recs} == {dtype}
    assert {x["impl"] for x in recs} == ({"mpi", "mpicomp"} if op == "allgather" else {"mpicomp"})
    by = {x["codec"]: x for x in recs if x["impl"] == "mpicomp"}
    assert set(by) == {"none", "int8", "blosc:cname=lz4,filter=none", "lossless"}
    assert by["lossless"]["ratio"] > 1.3 and by["int8"]["ratio"] > 1.9  # 2-byte input: int8 halves it
    if op == "allgather":  # exact codecs move the bytes as they are
        assert by["lossless"]["max_rel_error"] == 0 and by["none"]["max_rel_error"] == 0


def test_float64_with_lossless_codecs_beside_mpis_float64_sum(tmp_path):
    """--dtype float64: the lossless codecs' sums are float64 ones (within float64 rounding of
    the exact sum: -c), beside MPI's own float64 allreduce."""
    out = tmp_path / "r.json"
    r = bench("allreduce", "-m", "256K:256K", "-i", "2", "--rounds", "1", "-c", "--dtype", "float64", "--data",
              "sparse", "--codec", "none,lz4,lossless", "--compare", "mpi", "--json", str(out), n=2)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    recs = json.loads(out.read_text())
    assert {x["dtype"] for x in recs} == {"float64"} and {x["impl"] for x in recs} == {"mpi", "mpicomp"}
    by = {x["codec"]: x for x in recs if x["impl"] == "mpicomp"}
    assert by["lossless"]["ratio"] > 3 and all(x["max_rel_error"] < 1e-14 for x in by.values())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_validation_catches_a_wrong_16_bit_result(dtype):
    r = bench("allreduce", "-m", "128K:128K", "-i", "2", "--rounds", "1", "-c", "--codec", "int8", "--dtype", dtype,
              n=2, env={"MPICOMP_BENCH_CORRUPT": "1"})
    assert r.returncode == 1 and "VALIDATION FAILED" in r.stdout


def test_codecs_on_16_bit_data(tmp_path):
    out = tmp_path / "c.json"
    r = bench("codecs", "-n", "100000", "-r", "1", "--codec", "int8,lossless", "--dtype", "bfloat16",
              "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert "bfloat16 elements" in r.stdout
    recs = json.loads(out.read_text())
    assert {x["dtype"] for x in recs} == {"bfloat16"} and all(x["decode_gbps"] > 0 for x in recs)


def test_validation_catches_a_wrong_result():
    r = bench("allreduce", "-m", "128K:128K", "-i", "2", "--rounds", "1", "-c", "--codec", "int8", n=2,
              env={"MPICOMP_BENCH_CORRUPT": "1"})
    assert r.returncode == 1 and "VALIDATION FAILED" in r.stdout


def test_pt2pt_table_json_and_validation(tmp_path):
    out = tmp_path / "p.json"
    r = bench("pt2pt", "-m", "1K:128K", "-i", "4", "--rounds", "1", "-c", "--codec", "none,int8", "--compare", "mpi",
              "--json", str(out), n=2)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "Bandwidth (MB/s)" in r.stdout and "# mpi: the MPI library's own Send/Recv, through mpi4py" in r.stdout
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


def test_one_rank_says_to_start_it_under_mpiexec():
    r = bench("allgather", "-m", "1K:1K", "-i", "2", "--rounds", "1", "--codec", "none")
    assert r.returncode == 0, r.stderr
    assert "# one rank: nothing travels between ranks; start it under mpiexec (mpiexec -n 2 mpicomp-bench allgather" \
        in r.stdout
    r = bench("allgather", "-m", "1K:1K", "-i", "2", "--rounds", "1", "--codec", "none", n=2)
    assert r.returncode == 0 and "one rank" not in r.stdout, r.stdout


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


def _timed_lines(proc, out):
    """Collects (seconds since start, line) of proc's stdout as they arrive."""
    t0 = time.monotonic()
    for line in proc.stdout:
        out.append((time.monotonic() - t0, line.rstrip("\n")))


def test_header_and_rows_arrive_as_measured_through_a_pipe():
    """Under mpiexec, stdout a pipe: the header comes before the first measurement ends, each
    size's rows when it is measured, and a progress line per size on stderr once the run is
    long. 8M then 16M, 150 iterations: each size takes about a second here (at 60 the 8M
    size once took 0.24 s, under the 0.25 s this test needs to tell streaming from the end)."""
    lines = []
    with subprocess.Popen([MPIEXEC, "-n", "2", sys.executable, "-m", "mpicomp.bench", "allreduce", "-m", "8M:16M",
                           "-i", "150", "-x", "1", "--rounds", "1", "--codec", "int8", "--compare", "mpi"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        reader = threading.Thread(target=_timed_lines, args=(proc, lines))
        reader.start()
        try:
            proc.wait(timeout=120)  # stderr's few lines fit in the pipe
        finally:
            proc.kill()
            reader.join()
        err = proc.stderr.read()
    assert proc.returncode == 0, err
    assert lines[0][1].startswith("# mpicomp-bench allreduce")
    rows = [(t, line.split()) for t, line in lines if line[:1].isdigit()]
    assert [r[0] for _, r in rows] == ["8388608", "8388608", "16777216", "16777216"]
    header_at, first_row_at, last_row_at = lines[0][0], rows[0][0], rows[-1][0]
    assert first_row_at - header_at > 0.25, lines  # all at once when printed at the end
    assert last_row_at - first_row_at > 0.25, lines
    if first_row_at - header_at > 1.5:  # long enough: the 16M size is announced
        assert "# 16M (2/2): mpi, int8; rounds: 1, iterations: 150;" in err, err


def test_notes_for_what_was_left_out_or_rounded():
    r = bench("reduce_scatter", "-m", "3K:5K", "-i", "2", "--rounds", "1", "--codec", "none", "--compare", "mpi,gloo",
              n=2)
    assert r.returncode == 0, r.stderr
    assert "# --compare gloo: left out, torch's gloo has no reduce_scatter on CPU" in r.stdout
    assert "# -m 3K:5K: sizes are powers of two, so the sizes used are 4K to 4K" in r.stdout
    assert {x.split()[-2] for x in r.stdout.splitlines() if x[:1].isdigit()} == {"mpi", "mpicomp"}
    r = bench("allreduce", "-m", "4K:8K", "-i", "2", "--rounds", "1", "--codec", "none", n=2)
    assert r.returncode == 0 and "sizes are powers of two" not in r.stdout


def _options_without_help(help_text):
    """Options in an argparse --help whose entry has no description."""
    lines = [line for line in help_text.splitlines() if line.startswith("  ")]
    bare = []
    for i, line in enumerate(lines):
        entry = line.strip()
        if line.startswith("  -") and "  " not in entry:  # no description on the option's line
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if not nxt.startswith(" " * 8) or nxt.lstrip().startswith("-"):
                bare.append(entry)
    return bare


@pytest.mark.parametrize("cmd", [[sys.executable, "-m", "mpicomp.bench", c] for c in
                                 ("allreduce", "reduce_scatter", "allgather", "pt2pt", "plot", "summary", "codecs")]
                         + [[sys.executable, str(BENCH / t)] for t in ("sweep", "netem", "demo")]
                         + [[sys.executable, str(BENCH / f"{t}.py")] for t in
                            ("ddp_overlap", "torch_backend_compare", "amsp_partitions", "optim_compare",
                             "diloco_leave_join", "osu_preload")],
                         ids=lambda c: c[-1].rsplit("/", 1)[-1])
def test_every_option_has_help_text(cmd):
    r = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "options:" in r.stdout, r.stderr
    assert _options_without_help(r.stdout) == []
    assert _options_without_help("  -q, --quiet\n  --json PATH  write") == ["-q, --quiet"]  # the check can fail


def test_demo_falls_back_to_shared_memory_and_says_why():
    """Without `ip` on PATH bench/netem cannot build the link (as without root): the demo says
    so, then prints its one table: a row per size, a column per codec in the order given, each
    cell the speed-up over MPI and the error."""
    r = subprocess.run([sys.executable, str(BENCH / "demo"), "-m", "64K:128K", "--volume", "64K", "--rounds", "1"],
                       capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PATH": str(Path(MPIEXEC).parent)})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("# demo: on shared memory, not an emulated 1gbit/s link: netem: needs")
    assert "sudo make demo" in lines[1]
    head = next(line for line in lines if line.startswith("# Size"))
    assert head.split()[1:] == ["Size", "MPI(ms)", "none", "bf16", "int8", "int4", "sign"]
    rows = [line.split() for line in lines if line[:1].isdigit()]
    assert [x[0] for x in rows] == ["64K", "128K"] and all(len(x) == 2 + 2 * 5 for x in rows)
    for x in rows:
        speedups, errors = x[2::2], [float(e) for e in x[3::2]]
        assert all(s.endswith("x") and float(s[:-1]) > 0 for s in speedups)
        assert errors[0] < 1e-6 and 1e-4 < errors[2] < 0.02 and errors[4] > 0.1  # none, int8, sign


def test_diloco_compare_writes_runs_and_counts_bytes(tmp_path):
    """bench/diloco_compare.py, small: each run's JSON and the plot; H=10 sends a tenth of
    DDP's bytes, 4 fragments a quarter of the peak per step; held-out losses are finite."""
    r = mpiexec(2, sys.executable, BENCH / "diloco_compare.py", "--pretrain", "4", "--steps", "20",
                "--runs", "ddp,h10,h50-f4", "--corpus-bytes", "300000", "--eval", "16", "--out", tmp_path, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    runs = {n: json.loads((tmp_path / f"diloco-gpt-{n}.json").read_text()) for n in ("ddp", "h10", "h50-f4")}
    assert (tmp_path / "diloco-gpt-runs.png").stat().st_size > 10_000
    assert runs["ddp"]["bytes_sent_rank0"] == 10 * runs["h10"]["bytes_sent_rank0"] > 0
    assert abs(runs["ddp"]["peak_bytes_per_step_rank0"] / runs["h50-f4"]["peak_bytes_per_step_rank0"] - 4) < 0.05
    assert all(0 < run["held_out_loss"] < 10 and run["pretrain_steps"] == 4 for run in runs.values())


def test_bound_columns_in_the_table_and_json(tmp_path):
    out = tmp_path / "r.json"
    r = bench("allreduce", "-m", "1M:1M", "--codec", "none,int8", "--compare", "mpi", "-i", "3", "--rounds", "1",
              "--link-gbit", "10", "--json", str(out), n=2)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Bound(us)" in r.stdout and "%Bound" in r.stdout and "link 10 Gbit/s, one per rank" in r.stdout
    for rec in json.loads(out.read_text()):
        assert rec["link_bound_us"] > 0 and rec["bound_us"] >= rec["link_bound_us"]
        assert rec["pct_of_bound"] == pytest.approx(100 * rec["bound_us"] / rec["avg_latency_us"])


FAKE_OSU = """#!{python}
# osu_allreduce's output, its latency set by the codec it runs under; exit 3 under int4
import os, sys
codec = os.environ.get("MPICOMP_CODEC", "plain")
if codec != "plain" and not os.environ.get("LD_PRELOAD", "").endswith("libmpicomp_pmpi.so"):
    sys.exit("no preload")
if codec == "int4":
    sys.exit(3)
us = {{"plain": 12.0, "off": 10.0, "int8": 4.0}}[codec]
if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == "0":
    print("# OSU MPI Allreduce Latency Test")
    print("# Size       Avg Latency(us)        Validation")
    for size in (1024, 2048):
        print(f"{{size:<10}} {{us * size / 1024:18.2f}} {{'Pass':>17}}")
"""


def test_osu_preload_runs_each_codec_under_the_interposer(tmp_path):
    """bench/osu_preload.py on a stand-in for osu_allreduce: each codec runs under the
    preload (plain without it), the table and JSON hold each one's latency and its speed-up
    over off; a run that fails ends the driver naming its codec and exit code."""
    osu = tmp_path / "osu_allreduce"
    osu.write_text(FAKE_OSU.format(python=sys.executable))
    osu.chmod(0o755)
    out = tmp_path / "osu.json"
    cmd = [sys.executable, BENCH / "osu_preload.py", tmp_path, "-m", "1K:2K", "--codecs", "plain,off,int8",
           "--json", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    records = {(x["codec"], x["size"]): x for x in json.loads(out.read_text())}
    assert len(records) == 6 and records[("int8", 2048)]["avg_latency_us"] == 8.0
    assert records[("int8", 1024)]["speedup_vs_off"] == 2.5 and records[("plain", 1024)]["speedup_vs_off"] == 10 / 12
    assert records[("int8", 1024)]["impl"] == "osu_allreduce+preload"
    assert records[("plain", 1024)]["impl"] == "osu_allreduce"
    assert "x int8" in r.stdout and "2.50" in r.stdout
    r = subprocess.run(cmd[:-3] + ["off,int4"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "osu_preload: int4 failed (exit code 3)" in r.stderr, r.stdout + r.stderr
