"""The GPU engine without a GPU: staging through pinned buffers or passing device pointers to
MPI, lossless frames through nvCOMP's batched API (headers, chunk plans, alignment, raw
chunks, status checks), error feedback on the device, and the CUDA kernels themselves.
tests/fake_cuda builds mpicomp's core with a stand-in CUDA runtime whose "device" memory is
registered host memory (every copy and kernel argument checks its pointers' kinds, guard
bytes catch writes out of bounds) and a stand-in nvCOMP; kernels.cu is compiled as C++ and
its kernels run on the CPU, a warp's lanes as fibers so that shuffles and votes behave as on
a GPU, under -fsanitize=alignment (a misaligned load faults on a GPU). Every collective,
codec and dtype must equal the host engine's result byte for byte, under mpiexec. What only
a GPU can show (real nvCOMP, streams, speed) is tests/gpu's."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FAKE = ROOT / "tests" / "fake_cuda"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("fake_cuda")
    core = sorted((ROOT / "cpp" / "coll").glob("*.cpp")) + [
        p for p in sorted((ROOT / "cpp" / "codecs").glob("*.cpp")) if not p.name.startswith("cpu_avx")]
    sources = [*core, ROOT / "cpp" / "codecs" / "cuda" / "nvcomp.cpp", FAKE / "fake_runtime.cpp",
               FAKE / "fake_device.cpp", FAKE / "engine_check.cpp"]
    flags = ["-std=c++17", "-O1", "-ffp-contract=off", f"-I{FAKE}", "-fsanitize=alignment",
             "-fno-sanitize-recover=alignment"]
    kernels = out / "kernels.o"
    subprocess.run([str(BIN / "mpicxx"), *flags, "-c", "-x", "c++",
                    str(ROOT / "cpp" / "codecs" / "cuda" / "kernels.cu"), "-o", str(kernels)], check=True, timeout=600)
    subprocess.run([str(BIN / "mpicxx"), *flags, "-rdynamic", "-o", str(out / "engine_check"), *map(str, sources),
                    str(kernels), "-ldl"], check=True, timeout=600)
    subprocess.run([str(BIN / "mpicxx"), *flags, "-shared", "-fPIC", "-o", str(out / "libfake_nvcomp.so"),
                    str(FAKE / "fake_nvcomp.cpp")], check=True, timeout=600)
    return out


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("mode", ["staged", "direct"])
def test_gpu_engine_matches_the_host_engine(built, n, mode):
    r = subprocess.run([str(BIN / "mpiexec"), "-n", str(n), str(built / "engine_check"),
                        str(built / "libfake_nvcomp.so"), mode], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and f"engine_check {mode}: 0 failed checks" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
