"""The decoders' coverage-guided fuzz target (tests/fuzz/decode_fuzzer.cpp: libFuzzer, ASan,
UBSan) for a bounded time: no crash, no read past a frame, no write past an output, no
exception but a codec Error from a lossless frame, and every lossless frame that decodes
round-trips. `make fuzz` runs it longer (FUZZ_SECONDS, default 600)."""
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "fuzz"))
import build  # noqa: E402
from _native import blosc2_link, built_once  # noqa: E402

SECONDS = 30


@pytest.mark.skipif(build.clang() is None, reason="needs clang++ with libFuzzer (`make test` installs it when "
                    "root on Debian; else apt-get install clang libclang-rt-dev)")
def test_decoders_survive_fuzzing(tmp_path):
    clang = subprocess.run([build.clang(), "--version"], capture_output=True, text=True).stdout
    fuzz = Path(build.__file__).parent
    exe = built_once("decode_fuzzer", [build.ROOT / "cpp", fuzz / "decode_fuzzer.cpp", fuzz / "build.py"],
                     (build.FLAGS, clang, blosc2_link()), build.build) / "decode_fuzzer"
    build.seeds(tmp_path / "seeds")
    (tmp_path / "corpus").mkdir()
    r = subprocess.run([str(exe), f"-max_total_time={SECONDS}", "-timeout=10", "-rss_limit_mb=4096",
                        f"-artifact_prefix={tmp_path}/", str(tmp_path / "corpus"), str(tmp_path / "seeds")],
                       capture_output=True, text=True, timeout=SECONDS + 120)
    assert r.returncode == 0, r.stderr[-4000:]
    runs = int(r.stderr.rsplit("Done ", 1)[1].split()[0])
    assert runs > 1000, r.stderr[-2000:]  # it really ran
