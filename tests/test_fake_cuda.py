"""The GPU path without a GPU: staging through pinned buffers or passing device pointers to
MPI, lossless frames through nvCOMP's batched API (headers, chunk plans, alignment, raw
chunks, status checks), error feedback on the device, the CUDA kernels themselves, and the
Python layer on GPU arrays. tests/fake_cuda builds mpicomp's core with a stand-in CUDA
runtime whose "device" memory is registered host memory (every copy and kernel argument
checks its pointers' kinds, guard bytes catch writes out of bounds) and a stand-in nvCOMP;
kernels.cu is compiled as C++ and its kernels run on the CPU, a warp's lanes as fibers so
that shuffles and votes behave as on a GPU, under -fsanitize=alignment (a misaligned load
faults on a GPU). Built into a program (engine_check.cpp: the GPU engine against the host
engine) and into mpicomp._core (python_check.py: __cuda_array_interface__ arrays against
numpy), every collective, codec and dtype must give the host's bytes, under mpiexec. What
only a GPU can show (real nvCOMP, streams, speed) is tests/gpu's."""
import os
import shutil
import subprocess
import sys
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mpi4py
import pybind11
import pytest
from mpi4py import MPI
from _launch import mpiexec
from _native import blosc2_include, blosc2_link, built_once

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FAKE = ROOT / "tests" / "fake_cuda"
FLAGS = ["-std=c++17", "-O1", "-fPIC", "-ffp-contract=off", f"-I{FAKE}", blosc2_include(), "-fsanitize=alignment",
         "-fno-sanitize-recover=alignment", "-pthread"]
_INCLUDES = [f"-I{pybind11.get_include()}", f"-I{mpi4py.get_include()}", f"-I{sysconfig.get_paths()['include']}",
             "-DMPICOMP_WITH_CUDA"]


def _cxx(*args):
    subprocess.run([str(BIN / "mpicxx"), *FLAGS, *map(str, args)], check=True, timeout=600)


@pytest.fixture(scope="module")
def built():
    """engine_check, the stand-in nvCOMP, and a copy of the mpicomp package whose _core runs
    on the stand-in runtime."""
    compiler = subprocess.run([str(BIN / "mpicxx"), "--version"], capture_output=True, text=True).stdout
    key = (FLAGS, compiler, str(BIN), MPI.Get_library_version(), _INCLUDES, blosc2_link(),
           sysconfig.get_config_var("EXT_SUFFIX"))
    return built_once("fake_cuda", [ROOT / "cpp", FAKE, ROOT / "python" / "mpicomp", Path(__file__)], key, _build)


def _build(out):
    core = sorted((ROOT / "cpp" / "coll").glob("*.cpp")) + [
        p for p in sorted((ROOT / "cpp" / "codecs").glob("*.cpp")) if not p.name.startswith("cpu_avx")]
    common = [*core, ROOT / "cpp" / "codecs" / "cuda" / "nvcomp.cpp", FAKE / "fake_runtime.cpp",
              FAKE / "fake_device.cpp"]
    jobs = [(src, out / f"{i}.o", ["-x", "c++"] if src.suffix == ".cu" else [])
            for i, src in enumerate([*common, ROOT / "cpp" / "codecs" / "cuda" / "kernels.cu"])]
    bind = sorted((ROOT / "cpp" / "bind").glob("*.cpp"))
    jobs += [(src, out / f"{src.name}.o", _INCLUDES) for src in bind]
    jobs += [(FAKE / "engine_check.cpp", out / "engine_check.o", [])]
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        list(pool.map(lambda j: _cxx(*j[2], "-c", j[0], "-o", j[1]), jobs))
    objects = [o for _, o, _ in jobs]
    _cxx("-rdynamic", "-o", out / "engine_check", *objects[:-len(bind) - 1], objects[-1], *blosc2_link())
    pkg = out / "pkg" / "mpicomp"
    shutil.copytree(ROOT / "python" / "mpicomp", pkg, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    _cxx("-shared", "-o", pkg / f"_core{sysconfig.get_config_var('EXT_SUFFIX')}", *objects[:-1], *blosc2_link())
    _cxx("-shared", "-o", out / "libfake_nvcomp.so", FAKE / "fake_nvcomp.cpp")


@pytest.mark.parametrize("mode, n, nodes", [(m, n, ()) for m in ("staged", "direct") for n in (2, 3)] +
                         [("staged", 4, ("2",)), ("direct", 3, ("2",))],
                         ids=["staged-2", "staged-3", "direct-2", "direct-3", "staged-nodes-2x2", "direct-nodes-2+1"])
def test_gpu_engine_matches_the_host_engine(built, mode, n, nodes):
    """nodes: config.ranks_per_node, so that both engines take the two-level collectives (all
    three on 2x2; allreduce on 2+1), their exact stages inside the node on device buffers."""
    r = mpiexec(n, built / "engine_check", built / "libfake_nvcomp.so", mode, *nodes, timeout=600)
    assert r.returncode == 0 and f"engine_check {mode}: 0 failed checks" in r.stdout, \
        r.stdout[-3000:] + r.stderr[-3000:]


def _python_check(built, n, *args):
    env = dict(os.environ, PYTHONPATH=str(built / "pkg"), MPICOMP_NVCOMP_LIBRARY=str(built / "libfake_nvcomp.so"))
    return mpiexec(n, sys.executable, FAKE / "python_check.py", *args, timeout=300, env=env)


@pytest.mark.parametrize("n", [2, 3])
def test_python_layer_on_gpu_arrays_matches_numpy(built, n):
    r = _python_check(built, n)
    assert r.returncode == 0 and "python_check: 0 failed checks" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]


def test_calls_on_a_second_gpu_restore_the_device_and_keep_buffers_apart(built):
    """Issue 21 item 7: a collective on device 1's arrays made device 1 current and left it so,
    and reused the per-thread buffers made on device 0 for device 1's kernels."""
    r = _python_check(built, 2, "two_devices")
    assert r.returncode == 0 and "python_check: 0 failed checks" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
