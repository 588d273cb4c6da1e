"""Codec throughput on one core (or --threads T sharing each call, config.codec_threads):
encode, decode and decode-accumulate GB/s per codec and SIMD target, beside memcpy measured in
the same run on one thread (GB/s count input bytes, float32 unless --dtype says otherwise, so a
codec "at memcpy speed" takes as long as copying its input once)."""
import time

import numpy as np

from .. import _core, available_codecs, codec as get_codec, config
from .._dtypes import DTYPE_IDS
from . import inputs, report


def _best(fn, repeats, sync=None):
    fn()
    best = float("inf")
    for _ in range(repeats):
        if sync:
            sync()
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def kernels(c, x, dtype=None, stream=False):
    """Codec c's encode, decode and decode-accumulate of numpy array x, as calls of no
    arguments on buffers made once (x holds dtype's bytes, default x's own dtype; the
    accumulator is what the collectives sum in: float64 for float64 through an exact codec and
    for bound, else float32; stream: decode with streaming stores, as the collectives decode outputs of
    _core.STREAM_BYTES and more)."""
    dtype = dtype or x.dtype.name
    n, t = x.size, DTYPE_IDS[dtype]
    acc = np.zeros(n, np.float64 if _core.acc_dtype(c.id, t) == DTYPE_IDS["float64"] else np.float32)
    buf, y = np.empty(c.encoded_bytes(n, dtype), np.uint8), np.empty_like(x)
    _core.encode(c.id, c.block, t, x.ctypes.data, n, 0, buf.ctypes.data)
    return (lambda: _core.encode(c.id, c.block, t, x.ctypes.data, n, 0, buf.ctypes.data),
            lambda: _core.decode(c.id, c.block, t, buf.ctypes.data, n, 1.0, y.ctypes.data, stream),
            lambda: _core.decode_accumulate(c.id, c.block, t, buf.ctypes.data, n, acc.ctypes.data))


def seconds(c, x, repeats, dtype=None, stream=False, sync=None):
    """(encode, decode, decode-accumulate) seconds of codec c on numpy array x (holding
    dtype's bytes), best of repeats, on this thread's SIMD target; sync() before each timed
    run (a barrier, so that ranks time their kernels together)."""
    return tuple(_best(fn, repeats, sync) for fn in kernels(c, x, dtype, stream))


def memcpy_gbps(x, repeats):
    """GB/s of numpy array x copied by this thread (np.copyto), best of repeats."""
    y = np.empty_like(x)
    return x.nbytes / _best(lambda: np.copyto(y, x), repeats) / 1e9


def run(args):
    n, dtype = args.elements, args.dtype
    x = inputs.typed(inputs.make(args.data, n, 0), dtype)[1]  # the data's bytes (bfloat16's seen as float16)
    # bound takes its bound (--codec bound:abs=...): no default suits every data
    specs = args.codecs or [get_codec(s) for s in available_codecs() if s not in ("none", "bound")]
    specs = [c for c in specs if c.wire]  # powersgd is an allreduce, not a wire format
    records = []
    targets = _core.cpu_targets() if args.all_targets else [_core.cpu_target()]
    if args.threads < 1:
        raise SystemExit(f"mpicomp-bench codecs: --threads must be at least 1, got {args.threads}")
    where = "one core" if args.threads == 1 else f"{args.threads} threads per call"
    print(f"# mpicomp-bench codecs: {n} {dtype} elements ({x.nbytes >> 20} MiB), {where}, best of {args.repeats}")
    print(f"# GB/s of {dtype} input; xMemcpy = codec GB/s / memcpy GB/s (same run)")
    t = report.Table([("Target", 10, "s"), ("Codec", 14, "s"), ("Encode", 9, ".2f"), ("Decode", 9, ".2f"),
                      ("DecodeAcc", 11, ".2f"), ("Memcpy", 9, ".2f"), ("xEnc", 7, ".2f"), ("xDec", 7, ".2f"),
                      ("xAcc", 7, ".2f"), ("Ratio", 7, ".2f")])
    start, threads = _core.cpu_target(), config.codec_threads
    config.codec_threads = args.threads
    try:
        for target in targets:
            _core.set_cpu_target(target)
            memcpy = memcpy_gbps(x, args.repeats)
            for c in specs:
                g = [x.nbytes / s / 1e9 for s in seconds(c, x, args.repeats, dtype)]
                ratio = inputs.ratio(c, x, dtype)
                t.row(target, c.spec, *g, memcpy, *(v / memcpy for v in g), ratio)
                records.append(dict(op="codec", target=target, codec=c.spec, elements=n, dtype=dtype, device="cpu",
                                    threads=args.threads, encode_gbps=g[0], decode_gbps=g[1],
                                    decode_accumulate_gbps=g[2], memcpy_gbps=memcpy, ratio=ratio))
    finally:
        _core.set_cpu_target(start)
        config.codec_threads = threads
    if args.json:
        report.write_json(args.json, records)
    return 0
