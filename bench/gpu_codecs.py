#!/usr/bin/env python3
"""GPU codec throughput: mpicomp's CUDA encode / decode / decode-accumulate per codec, beside
a device-to-device copy of the same input measured in the same run, and our int8 encode
beside straightforward torch and cupy implementations of the same blockwise quantisation.

    python bench/gpu_codecs.py [--mib 256] [--json bench/results/gpu-codecs-<device>.json]

Times are CUDA-event medians of 20 runs after 3 warm-ups. GB/s are given two ways: float32
input bytes per second ("in"), and bytes read + written per second ("rw"; a copy of B bytes
moves 2B), which is the number to hold against the memory system.
"""
import argparse
import statistics

import torch

import mpicomp
from mpicomp import _core
from mpicomp.bench.report import write_json


def timed(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def torch_int8_encode(x, block=256):
    """The same quantisation written plainly in torch: absmax per block, scale, round, clamp."""
    v = x.view(-1, block)
    absmax = v.abs().amax(dim=1, keepdim=True)
    inv = torch.where(absmax > 0, 127.0 / absmax, torch.zeros_like(absmax))
    q = torch.round(v * inv).clamp_(-127, 127).to(torch.int8)
    return q, absmax / 127.0


def cupy_int8_encode(x, block=256):
    """The same in cupy (on torch's current stream, so the timing events see it)."""
    import cupy as cp

    with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
        v = cp.asarray(x).reshape(-1, block)
        absmax = cp.abs(v).max(axis=1, keepdims=True)
        inv = cp.where(absmax > 0, 127.0 / absmax, 0.0).astype(cp.float32)
        q = cp.clip(cp.rint(v * inv), -127, 127).astype(cp.int8)
        return q, absmax / 127.0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256, help="MiB of float32 input (default 256)")
    p.add_argument("--json")
    a = p.parse_args()
    if not (_core.cuda_available() and torch.cuda.is_available()):
        raise SystemExit("gpu_codecs: needs a CUDA GPU and a CUDA build of mpicomp")
    dev = torch.cuda.get_device_name()
    n = a.mib << 18
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    acc = torch.zeros_like(x)
    st = torch.cuda.current_stream().cuda_stream
    copy = timed(lambda: y.copy_(x))
    copy_in = x.nbytes / copy / 1e9
    print(f"# {dev}: {n} float32 ({a.mib} MiB); device-to-device copy {copy_in:.0f} GB/s in, "
          f"{2 * copy_in:.0f} GB/s read+write")
    print(f"# {'codec':<6} {'op':<18} {'ms':>8} {'GB/s in':>9} {'GB/s rw':>9} {'x copy':>7}")
    records = [dict(device=dev, op="d2d_copy", codec="none", elements=n, seconds=copy, gbps_in=copy_in,
                    gbps_rw=2 * copy_in)]
    for name in ("fp16", "bf16", "int8", "int4", "sign"):
        c = mpicomp.codec(name)
        nb = c.encoded_bytes(n)
        buf = torch.empty(nb, dtype=torch.uint8, device="cuda")
        runs = {
            "encode": (lambda: _core.cuda_encode(c.id, c.block, 0, x.data_ptr(), n, 0, buf.data_ptr(), st), x.nbytes + nb),
            "decode": (lambda: _core.cuda_decode(c.id, c.block, 0, buf.data_ptr(), n, 1.0, y.data_ptr(), st), nb + x.nbytes),
            "decode_accumulate": (lambda: _core.cuda_decode_accumulate(c.id, c.block, 0, buf.data_ptr(), n,
                                                                       acc.data_ptr(), st), nb + 2 * x.nbytes),
        }
        for op, (fn, moved) in runs.items():
            t = timed(fn)
            rec = dict(device=dev, op=op, codec=name, elements=n, seconds=t, gbps_in=x.nbytes / t / 1e9,
                       gbps_rw=moved / t / 1e9, fraction_of_copy=copy / t * 1.0)
            records.append(rec)
            print(f"  {name:<6} {op:<18} {t * 1e3:8.3f} {rec['gbps_in']:9.0f} {rec['gbps_rw']:9.0f} "
                  f"{rec['fraction_of_copy']:7.2f}")
    c = mpicomp.codec("int8")
    buf = torch.empty(c.encoded_bytes(n), dtype=torch.uint8, device="cuda")
    ours = timed(lambda: _core.cuda_encode(c.id, c.block, 0, x.data_ptr(), n, 0, buf.data_ptr(), st))
    plain = timed(lambda: torch_int8_encode(x))
    q, scale = torch_int8_encode(x)  # same numbers? (the plain version rounds x * inv the same way)
    torch.cuda.synchronize()
    ours_q = buf.view(-1, 260)[:, 4:].contiguous().view(torch.int8).view(-1, 256)
    agree = float((ours_q == q).float().mean())
    print(f"# int8 encode: mpicomp {ours * 1e3:.3f} ms vs plain torch {plain * 1e3:.3f} ms "
          f"({plain / ours:.1f}x faster); identical codes for {agree * 100:.4f}% of elements")
    records.append(dict(device=dev, op="int8_encode_vs_torch", codec="int8", elements=n, seconds=ours,
                        torch_seconds=plain, speedup=plain / ours, identical_fraction=agree))
    try:
        cq, _ = cupy_int8_encode(x)
    except ImportError:
        cq = None
    if cq is not None:
        with_cupy = timed(lambda: cupy_int8_encode(x))
        same = float((torch.as_tensor(cq, device="cuda").view(-1, 256) == ours_q).float().mean())
        print(f"# int8 encode: mpicomp {ours * 1e3:.3f} ms vs plain cupy {with_cupy * 1e3:.3f} ms "
              f"({with_cupy / ours:.1f}x faster); identical codes for {same * 100:.4f}% of elements")
        records.append(dict(device=dev, op="int8_encode_vs_cupy", codec="int8", elements=n, seconds=ours,
                            cupy_seconds=with_cupy, speedup=with_cupy / ours, identical_fraction=same))
    if a.json:
        write_json(a.json, records)


if __name__ == "__main__":
    main()
