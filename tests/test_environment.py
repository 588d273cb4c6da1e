"""One rule for the codec variables in every layer (the interposer's, tests/test_pmpi.py): a
call that names no codec takes MPICOMP_<OP>_CODEC, else MPICOMP_CODEC, else the layer's own
default (the Python API int8, the torch backend none, the interposer off); "off" means MPI's
own collective; an invalid value is refused at import, naming the variable; so is an
MPICOMP_ERROR_FEEDBACK other than 0 or 1. One byte-count syntax (64K, 16MiB) everywhere."""
import os
import sys

import pytest
from _launch import mpiexec


# The bytes sent by an allreduce and an allgather that name no codec, and by the same calls
# naming the codecs the variables should give (printed by rank 0).
PROGRAM = r"""
import sys, numpy as np, mpicomp
x = np.random.default_rng(0).standard_normal(1 << 18).astype(np.float32)
def sent(coll, codec=None):
    mpicomp.reset_stats()
    getattr(mpicomp, coll)(x, codec=codec)
    return mpicomp.stats()[coll]["bytes_wire"]
got = [sent("allreduce"), sent("allreduce", sys.argv[1]), sent("allgather"), sent("allgather", sys.argv[2])]
if mpicomp.MPI.COMM_WORLD.rank == 0:
    print(*got)
"""


def run(*args, n=2, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MPICOMP_")}
    return mpiexec(n, sys.executable, *args, timeout=120, env={**clean, "MPICOMP_TIMEOUT": "60", **env})


@pytest.mark.parametrize("env,allreduce,allgather", [
    ({}, "int8", "int8"),
    ({"MPICOMP_CODEC": "int4"}, "int4", "int4"),
    ({"MPICOMP_CODEC": "bf16", "MPICOMP_ALLGATHER_CODEC": "int4"}, "bf16", "int4"),
    ({"MPICOMP_CODEC": "off"}, "none", "none"),
])
def test_the_python_api_default_follows_the_variables(env, allreduce, allgather):
    r = run("-c", PROGRAM, allreduce, allgather, **env)
    assert r.returncode == 0, r.stderr[-2000:]
    default_ar, named_ar, default_ag, named_ag = map(int, r.stdout.split())
    assert (default_ar, default_ag) == (named_ar, named_ag), r.stdout


def test_the_backend_default_follows_the_variables():
    code = "import mpicomp.torch as mt; print(mt.backend_options().codecs, mt.backend_options(codec='int4').codecs)"
    r = run("-c", code, n=1, MPICOMP_CODEC="off", MPICOMP_REDUCE_SCATTER_CODEC="bf16", MPICOMP_ERROR_FEEDBACK="1")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split("} {")[0] == "{'allreduce': 'none', 'reduce_scatter': 'bf16', 'allgather': 'none'", r.stdout
    assert "{'allreduce': 'int4', 'reduce_scatter': 'int4', 'allgather': 'int4'}" in r.stdout  # named beats the variables


@pytest.mark.parametrize("var,value,error", [
    ("MPICOMP_CODEC", "int9", "CodecError: MPICOMP_CODEC='int9': unknown codec 'int9'"),
    ("MPICOMP_CODEC", "Int8", ", auto, auto:<codec>, or off (MPI's own collective)"),  # what only the variables take
    ("MPICOMP_ALLREDUCE_CODEC", "int4:block=3", "CodecError: MPICOMP_ALLREDUCE_CODEC='int4:block=3'"),
    ("MPICOMP_ERROR_FEEDBACK", "yes", "ArgumentError: invalid setting MPICOMP_ERROR_FEEDBACK=yes: expected 0 or 1"),
])
def test_an_invalid_value_is_refused_at_import(var, value, error):
    module = "mpicomp.torch" if var == "MPICOMP_ERROR_FEEDBACK" else "mpicomp"
    code = f"import {module} as m; getattr(m, 'backend_options', lambda: None)()"
    r = run("-c", code, n=1, **{var: value})
    assert r.returncode != 0 and error in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("text,size", [("65536", 65536), ("64K", 65536), ("64kib", 65536), ("16MiB", 16 << 20),
                                       ("1G", 1 << 30), ("2048B", 2048), ("1e3", None), ("64 K", None),
                                       ("-5", None), ("0x100", None), ("K", None)])
def test_one_size_syntax_in_every_layer(text, size):
    """MPICOMP_MIN_BYTES in the Python API and in the interposer, and the benchmarks' -m."""
    from test_pmpi import PRELOAD

    r = run("-c", "import mpicomp; print(mpicomp.config.min_bytes)", n=1, MPICOMP_MIN_BYTES=text)
    assert (r.returncode == 0 and r.stdout.split() == [str(size)]) if size else \
        (r.returncode != 0 and f"invalid setting MPICOMP_MIN_BYTES={text}: expected a byte count" in r.stderr), r.stdout + r.stderr[-1000:]
    r = run("-c", "from mpi4py import MPI", n=1, LD_PRELOAD=PRELOAD, MPICOMP_CODEC="int8", MPICOMP_MIN_BYTES=text)
    assert (r.returncode == 0 and f"from {size} bytes" in r.stderr) if size else \
        (r.returncode != 0 and f"invalid setting MPICOMP_MIN_BYTES={text}" in r.stderr), r.stderr[-1000:]
    from mpicomp.bench.options import size as bench_size
    if size:
        assert bench_size(text) == size
    else:
        with pytest.raises(Exception, match="bad size"):
            bench_size(text)


@pytest.mark.parametrize("spec", ["int8:block=33", "int4:bits=2", "blosc:cname=snappy", "lossless:clevel=12",
                                  "fp16:block=64", "int8:block", "sign:block=64.0"])
def test_one_codec_grammar_in_every_layer(spec):
    """A bad spec gets the same words from mpicomp.codec and from the interposer: both read
    the core's grammar and option rules (cpp/codecs/spec.h)."""
    import mpicomp
    from test_pmpi import PRELOAD

    with pytest.raises(mpicomp.CodecError) as e:
        mpicomp.codec(spec)
    r = run("-c", "from mpi4py import MPI", n=1, LD_PRELOAD=PRELOAD, MPICOMP_CODEC=spec)
    assert r.returncode != 0 and f"invalid setting MPICOMP_CODEC={spec}: {e.value}" in r.stderr, r.stderr[-1000:]


def test_the_interposer_refuses_a_gpu_codec():
    from test_pmpi import PRELOAD

    r = run("-c", "from mpi4py import MPI", n=1, LD_PRELOAD=PRELOAD, MPICOMP_CODEC="nvcomp-ans")
    assert r.returncode != 0 and "runs on GPU buffers only" in r.stderr, r.stderr[-1000:]


def _rules():
    import mpicomp

    return mpicomp._core.setting_rules()


@pytest.mark.parametrize("name", sorted(_rules()))
def test_one_reading_of_every_setting_in_every_layer(name):
    """Each setting's variable, invalid, is refused with the same words by `import mpicomp`
    and by the interposer at MPI_Init (the core's table, cpp/coll/environment.h)."""
    from test_pmpi import PRELOAD

    var, kind, lo, hi = _rules()[name]
    bad = {"bytes": str(int(hi) + 1), "count": "-1", "seconds": "-2", "flag": "yes", "hierarchy": "tree"}[kind]
    python = run("-c", "import mpicomp", n=1, **{var: bad})
    interposed = run("-c", "from mpi4py import MPI", n=1, LD_PRELOAD=PRELOAD, MPICOMP_CODEC="int8", **{var: bad})
    said = f"invalid setting {var}={bad}: expected "
    assert python.returncode != 0 and said in python.stderr, python.stderr[-1000:]
    assert interposed.returncode != 0 and said in interposed.stderr, interposed.stderr[-1000:]
    line = next(s for s in python.stderr.splitlines() if said in s)
    assert line[line.index(said):] in interposed.stderr
