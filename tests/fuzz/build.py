"""Builds the libFuzzer target decode_fuzzer.cpp (clang, ASan + UBSan) and writes its seed
corpus: real frames of every codec, which start the fuzzer inside the formats rather than at
their first check. Used by tests/test_fuzz.py and `make fuzz`:

    python tests/fuzz/build.py OUT_DIR        -> OUT_DIR/decode_fuzzer, OUT_DIR/seeds/
    python tests/fuzz/build.py --check        exit status 0 when clang++ has libFuzzer
"""
import platform
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from _native import blosc2_include, blosc2_link  # noqa: E402
CODECS = ROOT / "cpp" / "codecs"
FLAGS = ["-std=c++17", "-O1", "-g", "-fsanitize=fuzzer-no-link,address,undefined", "-fno-sanitize-recover=undefined",
         f"-I{ROOT / 'cpp'}", blosc2_include()]
# The per-target flags of CMakeLists.txt.
X86 = {"cpu_avx2.cpp": ["-mavx2", "-mfma", "-mf16c"],
       "cpu_avx512.cpp": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c"]}
HEADER_CODECS = ("none", "fp16", "bf16", "int8", "int4", "sign", "lz4", "blosc", "bound:abs=1e-2")  # its kFuzzCodecs
HEADER_DTYPES = ("float32", "float16", "bfloat16")  # the first of each of its dtype lists


def clang():
    """clang++ with libFuzzer's runtime, or None (Debian: apt-get install clang libclang-rt-dev)."""
    exe = shutil.which("clang++")
    if exe is None:
        return None
    probe = subprocess.run([exe, "-fsanitize=fuzzer", "-x", "c++", "-", "-o", "/dev/null"], capture_output=True, text=True,
                           input="extern \"C\" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }")
    return exe if probe.returncode == 0 else None


def build(out):
    cxx = clang()
    if cxx is None:
        sys.exit("decode_fuzzer needs clang++ with libFuzzer (Debian: apt-get install clang libclang-rt-dev)")
    out.mkdir(parents=True, exist_ok=True)
    x86 = platform.machine() in ("x86_64", "AMD64")
    sources = [CODECS / n for n in ("cpu_baseline.cpp", "cpu_dispatch.cpp", "host_codec.cpp", "parallel.cpp",
                                    "lossless.cpp", "blosc.cpp", "bound.cpp")]
    sources += [CODECS / n for n in X86] if x86 else []
    defines = ["-DMPICOMP_X86_TARGETS"] if x86 else []

    def compile_one(src):
        obj = out / (src.stem + ".o")
        subprocess.run([cxx, *FLAGS, *defines, *X86.get(src.name, []), "-c", str(src), "-o", str(obj)], check=True)
        return obj

    with ThreadPoolExecutor() as pool:
        objects = list(pool.map(compile_one, [*sources, Path(__file__).with_name("decode_fuzzer.cpp")]))
    exe = out / "decode_fuzzer"
    subprocess.run([cxx, *FLAGS, "-fsanitize=fuzzer", *map(str, objects), "-o", str(exe), *blosc2_link()], check=True)
    return exe


def seeds(corpus):
    """One file per codec and floating dtype: decode_fuzzer's 5 header bytes, then a frame."""
    import mpicomp

    corpus.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for ci, name in enumerate(HEADER_CODECS):
        for di, dtype in enumerate(HEADER_DTYPES):
            if dtype == "bfloat16":
                continue  # numpy has no bfloat16: the fuzzer reaches it from the float16 seeds' bytes
            n = 700
            x = rng.standard_normal(n).astype(dtype)
            x[100:400] = 0  # runs that lz4 compresses
            frame = mpicomp.codec(name, **({"block": 64} if name in ("int8", "int4", "sign") else {})).encode(x)
            # block 64 (32 * (1 + 1)); for blosc, byte 2 = 9 names zstd and shuffle, its defaults
            header = bytes([ci, di, 9 if name == "blosc" else 1, n & 255, n >> 8])
            (corpus / f"{name.split(':')[0]}-{dtype}").write_bytes(header + frame.tobytes())


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:  # exit 0 when clang++ with libFuzzer is here
        sys.exit(clang() is None)
    out = Path(sys.argv[1])
    print(build(out))
    seeds(out / "seeds")
