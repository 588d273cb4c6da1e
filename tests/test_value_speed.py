"""A codec's speed does not depend on the values (issue 23, item 3): tiny and subnormal data
(the OSU micro-benchmarks' memset(buf, 1) floats, 2.37e-38, and noise times 1e-42) encode,
decode and decode-accumulate about as fast as normal data, and the caller's floating-point
state (flush-to-zero, denormals-are-zero) is left as it was.

Subnormal arithmetic once cost 40-70x here (a microcode assist per product on Intel cores).
`mpicomp-bench codecs --data osu|subnormal` records the ratios (>= 0.8x on the project's
Xeon, docs/measurements.md); this test asserts 0.5x, which a shared CI core keeps while
any per-element assist falls far below it."""
import time

import numpy as np
import pytest

import mpicomp
from mpicomp import _core
from mpicomp.bench import inputs
from mpicomp.bench.codec_speed import kernels

N = 1 << 22
ROUNDS, MORE = 7, 21  # more rounds only while one kind looks slow: a busy moment passes, an assist stays


@pytest.fixture
def one_thread():
    before = _core.codec_threads()
    mpicomp.config.codec_threads = 1
    yield
    mpicomp.config.codec_threads = before


@pytest.mark.parametrize("name", ["int8", "int4", "sign"])
def test_tiny_and_subnormal_data_run_at_normal_speed(name, one_thread):
    c = mpicomp.codec(name)
    kinds = ("normal", "osu", "subnormal")
    ops = {k: dict(zip(("encode", "decode", "decode_accumulate"), kernels(c, inputs.make(k, N, 0)))) for k in kinds}
    best = {(k, op): float("inf") for k in kinds for op in ops["normal"]}
    for done in range(ROUNDS + MORE):  # interleaved, so a busy moment slows every kind alike
        for k in kinds:
            for op, fn in ops[k].items():
                t0 = time.perf_counter()
                fn()
                best[k, op] = min(best[k, op], time.perf_counter() - t0)
        slow = {f"{k} {op}": round(best["normal", op] / best[k, op], 2)
                for k in kinds[1:] for op in ops["normal"] if best["normal", op] / best[k, op] < 0.5}
        if done + 1 >= ROUNDS and not slow:
            break
    assert not slow, f"{name}: speed relative to normal data {slow} after {done + 1} rounds"


def test_caller_floating_point_state_is_kept():
    # With flush-to-zero a product below 2^-126 would come back 0; with denormals-are-zero a
    # subnormal operand would be read as 0. Both are per-thread flags the codecs must not set.
    tiny, sub = np.float32(1e-30), np.float32(1e-40)
    for name in ["int8", "int4", "sign", "bf16", "fp16"]:
        c = mpicomp.codec(name)
        x = inputs.make("subnormal", 4096, 1)
        c.decode(c.encode(x), x.size)
        assert tiny * np.float32(1e-10) != 0, f"{name} left flush-to-zero set"
        assert sub * np.float32(2) > 0, f"{name} left denormals-are-zero set"
