"""nvcomp.cpp's own declarations of nvCOMP 6's C API against the real nvCOMP: its headers at
compile time and its library at run time (nvcomp_abi.cpp says what is checked). nvCOMP's
library loads and answers these queries without a GPU; the headers and library come from
the pip package nvidia-libnvcomp-cu13 (requirements-dev.txt), the CUDA runtime's headers
from the CUDA toolkit that builds mpicomp's kernels."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mpicomp._framed import wheel_nvcomp

ROOT = Path(__file__).resolve().parents[1]
CUDA = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))


@pytest.mark.skipif(not (CUDA / "include" / "cuda_runtime.h").is_file(),
                    reason="no CUDA toolkit (mpicomp builds without its CUDA path here too)")
def test_nvcomp_declarations_match_nvcomp_6(tmp_path):
    lib = wheel_nvcomp()
    assert lib, "nvidia-libnvcomp-cu13 is not installed (requirements-dev.txt)"
    include = Path(lib).parents[1] / "include"
    exe = tmp_path / "nvcomp_abi"
    subprocess.run([shutil.which("c++") or "g++", "-std=c++17", "-O1", f"-I{include}", f"-I{CUDA / 'include'}",
                    str(ROOT / "tests" / "nvcomp_abi.cpp"), "-o", str(exe), f"-L{CUDA / 'lib64'}", "-lcudart", "-ldl",
                    f"-Wl,-rpath,{CUDA / 'lib64'}"], check=True, timeout=600)
    r = subprocess.run([str(exe), lib], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "nvcomp_abi: 0 failed checks" in r.stdout, r.stdout + r.stderr
