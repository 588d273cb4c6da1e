"""The LD_PRELOAD interposer on unmodified programs: a C program (tests/pmpi/check_collectives.c,
compiled here with the venv's mpicc) and mpi4py, under mpiexec."""
import os
import subprocess
import sys
from pathlib import Path

import _launch as launch
import pytest

from mpicomp.config import preload_path

BIN = Path(sys.executable).parent
PRELOAD = preload_path()
SOURCE = Path(__file__).parent / "pmpi" / "check_collectives.c"
THREADS_SOURCE = Path(__file__).parent / "pmpi" / "check_threads.c"


def mpiexec(n, *cmd, timeout=240, **env):
    full = {**os.environ, "LD_PRELOAD": PRELOAD, **env}
    return launch.mpiexec(n, *cmd, timeout=timeout, env=full)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    exe = tmp_path_factory.mktemp("pmpi") / "check_collectives"
    subprocess.run([str(BIN / "mpicc"), "-O2", "-o", str(exe), str(SOURCE), "-lm"], check=True)
    return exe


def test_preload_library_is_installed():
    assert Path(PRELOAD).is_file()


@pytest.mark.parametrize("n,codec", [(3, c) for c in ("off", "none", "fp16", "bf16", "int8", "int4", "sign", "lz4", "lossless",
                                                    "blosc:cname=lz4,filter=shuffle,clevel=3", "bound:abs=1e-2")]
                         + [(2, "off"), (2, "int8"), (2, "sign"), (2, "bound:abs=1e-3"),
                            # near float32's resolution of these sums, held to the bound itself
                            (3, "bound:abs=4e-6")])
def test_c_program_results_within_codec_bounds(program, n, codec):
    r = mpiexec(n, program, codec, MPICOMP_CODEC=codec, MPICOMP_DTYPES="float,double")  # its doubles' bounds too
    assert r.returncode == 0 and f"{codec}: 0 failed checks" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


@pytest.mark.parametrize("rpn", ["2", "3"])  # 4 ranks as 2 nodes of 2, and as 3 + 1
@pytest.mark.parametrize("codec", ["int8", "sign", "lossless", "bound:abs=1e-3"])
def test_c_program_on_emulated_nodes(program, rpn, codec):
    """MPICOMP_RANKS_PER_NODE makes the interposer's collectives two-level (allreduce on any
    nodes, reduce_scatter and allgather on nodes of equal size): results within the codec's
    bounds, and the table at MPI_Finalize says which algorithm ran."""
    def algorithms(stdout):
        return {ln.split()[0]: ln.split()[-1] for ln in stdout.splitlines()
                if ln.split()[:1] in (["allreduce"], ["reduce_scatter"], ["allgather"])}
    r = mpiexec(4, program, codec, MPICOMP_CODEC=codec, MPICOMP_RANKS_PER_NODE=rpn, MPICOMP_STATS="1")
    assert r.returncode == 0 and f"{codec}: 0 failed checks" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    algos = algorithms(r.stdout)
    assert "two_level=" in algos["allreduce"], algos
    if rpn == "2":
        assert "two_level=" in algos["reduce_scatter"] and "two_level=" in algos["allgather"], algos
    r = mpiexec(4, program, codec, MPICOMP_CODEC=codec, MPICOMP_RANKS_PER_NODE=rpn, MPICOMP_STATS="1",
                MPICOMP_HIERARCHY="flat")
    algos = algorithms(r.stdout)
    assert r.returncode == 0 and "flat=" in algos["allreduce"], algos
    assert not any("two_level" in v for v in algos.values()), algos


def test_check_program_detects_a_looser_codec(program):
    # The same program, told to expect exact results while int8 is on, must fail.
    r = mpiexec(2, program, "none", MPICOMP_CODEC="int8")
    assert r.returncode != 0 and "FAIL" in r.stderr


def stats_rows(stdout):
    """The interposer's table at MPI_Finalize: collective -> (calls, compressed, bytes in, bytes
    on the wire, saving, time, {reason: uncompressed calls})."""
    rows = {}
    for line in stdout.splitlines():
        f = line.split()
        if f and f[0] in ("allreduce", "reduce_scatter", "allgather"):
            reasons = {} if f[7] == "-" else {k: int(v) for k, v in (kv.split("=") for kv in f[7].split(","))}
            rows[f[0]] = (int(f[1]), int(f[2]), float(f[3]), float(f[4]), float(f[5].rstrip("x")), float(f[6]), reasons)
    return rows


def test_stats_table_at_finalize(program):
    # Doubles too: most of the program's large sums are MPI_DOUBLE.
    r = mpiexec(2, program, "int4", MPICOMP_CODEC="int4", MPICOMP_STATS="1", MPICOMP_DTYPES="float,double")
    assert r.returncode == 0, r.stderr[-2000:]
    rows = stats_rows(r.stdout)
    calls, compressed, bytes_in, wire, ratio, _, reasons = rows["allreduce"]
    assert compressed > 0 and calls > compressed  # small and integer calls pass through...
    assert calls == compressed + sum(reasons.values()) and {"small", "datatype", "op"} <= set(reasons), reasons
    assert wire < bytes_in / 2 and ratio > 2      # int4 on the large float sums, the rest as it is
    for coll in ("reduce_scatter", "allgather"):  # nothing large passes through: int4's 7.76x
        assert rows[coll][1] > 0 and 7.5 < rows[coll][4] < 7.8, rows[coll]


def test_stats_under_codec_none_count_nothing_as_compressed(program):
    """Codec none runs mpicomp's agreement and MPI's own collective: no call is compressed,
    every one says why, and the wire carries no more bytes than went in (2 ranks)."""
    r = mpiexec(2, program, "none", MPICOMP_CODEC="none", MPICOMP_STATS="1")
    assert r.returncode == 0 and "none: 0 failed checks" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    for coll, (calls, compressed, bytes_in, wire, ratio, _, reasons) in stats_rows(r.stdout).items():
        assert calls > 0 and compressed == 0 and reasons.get("none", 0) > 0, (coll, reasons)
        assert calls == sum(reasons.values()) and 0 < wire <= bytes_in, coll


def test_the_named_codec_is_applied_on_one_node(program):
    """All ranks share this machine: by default MPICOMP_CODEC still compresses there;
    MPICOMP_SKIP_LOCAL=1 keeps the MPI library's own shared-memory collectives (exact
    results, every such call counted under "local")."""
    r = mpiexec(2, program, "int4", MPICOMP_CODEC="int4", MPICOMP_STATS="1")
    assert all(row[1] > 0 for row in stats_rows(r.stdout).values()), r.stdout[-3000:]
    r = mpiexec(2, program, "off", MPICOMP_CODEC="int4", MPICOMP_STATS="1", MPICOMP_SKIP_LOCAL="1")
    assert r.returncode == 0 and "off: 0 failed checks" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    rows = stats_rows(r.stdout)
    assert rows["allreduce"][0] > 0 and all(row[1] == 0 and row[6].get("local", 0) > 0 for row in rows.values())


def test_startup_line_says_it_is_loaded(program):
    r = mpiexec(2, program, "int8", MPICOMP_CODEC="int8", MPICOMP_REDUCE_SCATTER_CODEC="off")
    lines = [line for line in r.stderr.splitlines() if line.startswith("mpicomp (LD_PRELOAD):")]
    assert len(lines) == 1, r.stderr[-2000:]  # rank 0 only
    assert "MPI_Allreduce/MPI_Iallreduce int8" in lines[0] and "MPI_Reduce_scatter_block off" in lines[0]


def test_a_misspelt_variable_is_reported(program):
    r = mpiexec(2, program, "int8", MPICOMP_CODEC="int8", MPICOMP_SEGMENT_BYTE="4096")
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [line for line in r.stderr.splitlines() if "unknown variable" in line]
    assert lines == ["mpicomp (LD_PRELOAD): unknown variable MPICOMP_SEGMENT_BYTE ignored (a misspelling? "
                     "README: Configuration)"], r.stderr[-2000:]  # rank 0 only


def test_verbose_says_why_a_call_was_not_compressed(program):
    r = mpiexec(2, program, "int8", MPICOMP_CODEC="int8", MPICOMP_VERBOSE="1")
    notes = [line for line in r.stderr.splitlines() if line.startswith("mpicomp: allreduce")]
    assert any("below min_bytes" in n for n in notes) and any("not MPI_SUM" in n for n in notes), r.stderr[-3000:]
    assert len(notes) == len(set(n.split(":")[2] for n in notes))  # one line per reason


@pytest.mark.parametrize("codec", ["int8", "none"])
def test_mpi_op_null_is_mpis_error(program, codec):
    """MPI_Allreduce and MPI_Reduce_scatter_block with MPI_OP_NULL return MPI's error (the
    communicator's handler set to return) instead of being compressed and summed."""
    r = mpiexec(2, program, codec, "op-null", timeout=60, MPICOMP_CODEC=codec)
    assert r.returncode == 0 and f"{codec}: 0 failed checks" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_the_old_compress_local_variable_is_refused(program):
    r = mpiexec(2, program, "off", timeout=60, MPICOMP_COMPRESS_LOCAL="1")
    assert r.returncode != 0 and "MPICOMP_SKIP_LOCAL=1" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("var,value", [("MPICOMP_CODEC", "int9"), ("MPICOMP_ALLREDUCE_CODEC", "int8:block=33"),
                                       ("MPICOMP_MIN_BYTES", "lots"), ("MPICOMP_MIN_BYTES", "-5"),
                                       ("MPICOMP_SEGMENT_BYTES", "0"), ("MPICOMP_SEGMENT_BYTES", "99999999999"),
                                       ("MPICOMP_STATS", "yes"), ("MPICOMP_CODEC_THREADS", "2000"),
                                       ("MPICOMP_SKIP_LOCAL", "true"), ("MPICOMP_DTYPES", "float,int"),
                                       ("MPICOMP_CODEC", "blosc:cname=snappy"), ("MPICOMP_CODEC", "lossless:clevel=12"),
                                       ("MPICOMP_HIERARCHY", "tree"), ("MPICOMP_RANKS_PER_NODE", "-1")])
def test_invalid_setting_aborts_naming_the_variable(program, var, value):
    r = mpiexec(2, program, "off", timeout=60, **{var: value})
    assert r.returncode != 0
    assert f"invalid setting {var}={value}" in r.stderr


MPI4PY_PROGRAM = r"""
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
n = 1 << 18
xs = [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in range(c.size)]
exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
y = np.empty(n, np.float32)
c.Allreduce(xs[c.rank], y)                      # mpi4py 4 calls MPI_Allreduce_c
err = np.abs(y - exact).max() / np.abs(exact).max()
part = np.empty(n // c.size, np.float32)
c.Reduce_scatter_block(xs[c.rank], part)
k = n // c.size
err_rs = np.abs(part - exact[c.rank * k:(c.rank + 1) * k]).max() / np.abs(exact).max()
full = np.empty(n * c.size, np.float32)
c.Allgather(xs[c.rank], full)
err_ag = max(np.abs(full[r * n:(r + 1) * n] - xs[r]).max() / np.abs(xs[r]).max() for r in range(c.size))
if c.rank == 0:
    print("ERR", err, err_rs, err_ag, flush=True)
"""


def test_mpi4py_large_count_calls_are_compressed():
    r = mpiexec(2, sys.executable, "-c", MPI4PY_PROGRAM, MPICOMP_CODEC="int8", MPICOMP_STATS="1")
    assert r.returncode == 0, r.stderr[-2000:]
    errs = [float(v) for v in r.stdout.split("ERR")[1].split()[:3]]
    # int8: within 2 stages of absmax/254 per rank-sum, far from exact but far below 1%.
    assert 0 < errs[0] < 0.01 and 0 < errs[1] < 0.01 and 0 < errs[2] < 0.01
    assert all(row[1] == 1 for row in stats_rows(r.stdout).values())


@pytest.mark.parametrize("n", [2, 3])
def test_two_threads_on_two_communicators(tmp_path, n):
    """An MPI_THREAD_MULTIPLE program whose two threads call MPI_Allreduce on their own
    communicators at once, with error feedback: right results (tests/pmpi/check_threads.c),
    all 100 calls compressed; the loop meets the threads' first calls in either order."""
    exe = tmp_path / "check_threads"
    subprocess.run([str(BIN / "mpicc"), "-O2", "-o", str(exe), str(THREADS_SOURCE), "-lm", "-lpthread"], check=True)
    for _ in range(3):
        r = mpiexec(n, exe, timeout=120, MPICOMP_CODEC="int8", MPICOMP_ERROR_FEEDBACK="1", MPICOMP_STATS="1")
        assert r.returncode == 0 and "threads: 0 failed checks" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
        assert stats_rows(r.stdout)["allreduce"][1] == 100


DOUBLES_PROGRAM = r"""
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
xs = [np.random.default_rng(r).standard_normal(1 << 20) for r in range(c.size)]
exact = np.sum(xs, axis=0)  # two float64 terms: the correctly rounded sum, as MPI's is
y = np.empty_like(exact)
c.Allreduce(xs[c.rank], y)
if c.rank == 0:
    print("ERR", np.abs(y - exact).max() / np.abs(exact).max(), flush=True)
"""


def test_doubles_stay_exact_unless_named():
    """MPI_DOUBLE sums (norms, metrics, fields that must stay exact) pass through by default
    under a lossy codec; MPICOMP_DTYPES=float,double compresses them too. The startup line
    says which datatypes are compressed."""
    r = mpiexec(2, sys.executable, "-c", DOUBLES_PROGRAM, MPICOMP_CODEC="int8", MPICOMP_STATS="1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.split("ERR")[1].split()[0]) == 0
    calls, compressed, *_, reasons = stats_rows(r.stdout)["allreduce"]
    assert compressed == 0 and reasons.get("datatype") == calls
    assert "MPI_SUM of float/float16/bfloat16 (MPICOMP_DTYPES)" in r.stderr, r.stderr[-2000:]
    r = mpiexec(2, sys.executable, "-c", DOUBLES_PROGRAM, MPICOMP_CODEC="int8", MPICOMP_STATS="1",
                MPICOMP_DTYPES="float,double")
    assert r.returncode == 0, r.stderr[-2000:]
    assert 0 < float(r.stdout.split("ERR")[1].split()[0]) < 0.01  # int8's error, well below 1%
    assert stats_rows(r.stdout)["allreduce"][1] == 1
    assert "MPI_SUM of float/double (MPICOMP_DTYPES)" in r.stderr


BOUND_PROGRAM = r"""
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
xs = [np.random.default_rng(r).uniform(500, 1000, 200).astype(np.float32) for r in range(c.size)]
for x in xs:
    x[0] = 1000
exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
y = np.empty(200, np.float32)
c.Allreduce(xs[c.rank], y)
if c.rank == 0:
    print("ERR", np.abs(y - exact).max(), flush=True)
"""


@pytest.mark.parametrize("bound,eager_bytes,compressed,algorithm",
                         [(6e-4, None, 1, "flat"), (1e-2, None, 0, "eager"), (1e-2, "0", 0, "mpi")])
def test_a_small_bound_sum_is_compressed_where_mpis_sums_would_miss(bound, eager_bytes, compressed, algorithm):
    """800 bytes, below MPICOMP_MIN_BYTES, on 4 ranks of values up to 1000: MPI's float32 sums
    may err by three roundings of partial sums up to 4000 (7.2e-4), codec bound by one (it
    sums in float64), so a bound between the two sends even this call compressed; a looser
    one leaves it to MPI's sums, which ride the agreement as in the Python API
    (MPICOMP_EAGER_BYTES; 0: MPI's own allreduce after it)."""
    env = {} if eager_bytes is None else {"MPICOMP_EAGER_BYTES": eager_bytes}
    r = mpiexec(4, sys.executable, "-c", BOUND_PROGRAM, MPICOMP_CODEC=f"bound:abs={bound}", MPICOMP_STATS="1", **env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert float(r.stdout.split("ERR")[1].split()[0]) <= bound
    calls, done, *_, reasons = stats_rows(r.stdout)["allreduce"]
    assert (calls, done, reasons) == (1, compressed, {} if compressed else {"small": 1}), r.stdout[-2000:]
    row = next(line.split() for line in r.stdout.splitlines() if line.split()[:1] == ["allreduce"])
    assert row[-1] == f"{algorithm}=1", r.stdout[-2000:]


AUTO_PROGRAM = r"""
import numpy as np
from mpi4py import MPI
c = MPI.COMM_WORLD
bad = 0
for _ in range(3):
    for n in (256, 1 << 12, 1 << 16, 1 << 18):
        xs = [np.random.default_rng(r).standard_normal(n).astype(np.float32) for r in range(c.size)]
        y = np.empty(n, np.float32)
        c.Allreduce(xs[c.rank], y)
        if c.size == 2:  # one float32 addition: exact, compressed or not
            bad += not np.array_equal(y, xs[0] + xs[1])
        else:  # sums in another order on each path
            bad += not np.allclose(y, np.sum(xs, axis=0, dtype=np.float64), rtol=1e-5, atol=1e-5)
if c.rank == 0:
    print("BAD", bad, flush=True)
"""


def test_codec_auto_measures_once_and_decides_each_call():
    """MPICOMP_CODEC=auto:lz4: the first call goes to MPI and is followed by one measurement;
    each later one is compressed or passed to MPI as the measurements say, counted under its
    reason, and lz4 or not, the sums are MPI's exactly."""
    r = mpiexec(2, sys.executable, "-c", AUTO_PROGRAM, MPICOMP_CODEC="auto:lz4", MPICOMP_STATS="1",
                MPICOMP_VERBOSE="1")
    assert r.returncode == 0 and "BAD 0" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    calls, compressed, *_, reasons = stats_rows(r.stdout)["allreduce"]
    # auto_probe: the first call, and any sent uncompressed to time that way again.
    assert calls == 12 and reasons.get("auto_probe", 0) >= 1, reasons
    assert compressed + sum(reasons.get(k, 0) for k in ("auto_probe", "auto_small", "auto_link")) == 12, reasons
    assert r.stderr.count("auto, allreduce of float32 on 2 ranks: ") == 1 and "auto:lz4" in r.stderr, r.stderr[-2000:]


def test_codec_auto_on_nodes_sends_each_call_on_the_hierarchy_measured_faster():
    """4 ranks as 2 nodes of 2 that MPI does not know of: the measurement times both
    hierarchies; a call sent uncompressed goes to MPI's own allreduce where flat is faster,
    else to the core's two-level path, and every call is counted once, its sums right."""
    r = mpiexec(4, sys.executable, "-c", AUTO_PROGRAM, MPICOMP_CODEC="auto:lz4", MPICOMP_STATS="1",
                MPICOMP_VERBOSE="1", MPICOMP_RANKS_PER_NODE="2")
    assert r.returncode == 0 and "BAD 0" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    calls, compressed, *_, reasons = stats_rows(r.stdout)["allreduce"]
    assert calls == 12 and compressed + sum(reasons.get(k, 0) for k in ("auto_probe", "auto_small", "auto_link")) == 12
    assert r.stderr.count("auto, allreduce of float32 on 4 ranks: ") == 1, r.stderr[-2000:]
    assert "both ways, on both hierarchies, in" in r.stderr, r.stderr[-2000:]
