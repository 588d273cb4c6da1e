#!/usr/bin/env python3
"""Codec bound's ratio and speed at absolute and relative bounds from 1e-2 to 1e-5, beside int8
and int4 at the same measured largest error, on one core (issue 38). Data, float32, largest
magnitude about 5 in each:

- smooth: a smooth 3-D field on a 160^3 grid, a sum of sines (what simulations exchange, and
  where an error bound beats a fixed rate: ZCCL's and SZ's case);
- gaussian: standard normal noise, as gradients are (each value its own: no codec can
  predict it);
- relu: the same noise through a ReLU, as activations are (half of them zero).

For every codec: the bytes one encoding takes (ratio = input / encoded), encode and decode
GB/s of input on one core (best of --repeats), and the largest error of one encode/decode.
Rows "bound @ int8 error" run bound at abs = int8's measured largest error on that data (and
the same for int4): the bytes and time an error bound costs where int8 or int4 would do.

    python bench/error_bound.py [--json bench/results/error-bound-ratios.json]
"""
import argparse

import numpy as np

import mpicomp
from mpicomp.bench import codec_speed
from mpicomp.bench.report import write_json

BOUNDS = (1e-2, 1e-3, 1e-4, 1e-5)


def datasets(side=160, seed=0):
    a, b, c = np.meshgrid(*(np.arange(side, dtype=np.float64),) * 3, indexing="ij")
    smooth = 1.7 * (np.sin(a / 20) + np.cos(b / 15) * np.sin(c / 10) + np.cos((a + c) / 30))
    noise = np.random.default_rng(seed).standard_normal(side**3)
    return {"smooth": smooth.ravel().astype(np.float32), "gaussian": noise.astype(np.float32),
            "relu": np.maximum(noise, 0).astype(np.float32)}


def measure(spec, x, repeats):
    c = mpicomp.codec(spec)
    frame = c.encode(x)
    err = float(np.abs(c.decode(frame, x.size).astype(np.float64) - x).max())
    enc, dec, _ = codec_speed.seconds(c, x, repeats)
    return dict(codec=c.spec, ratio=x.nbytes / frame.size, max_error=err, encode_gbps=x.nbytes / enc / 1e9,
                decode_gbps=x.nbytes / dec / 1e9)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", help="also write the records as JSON")
    a = p.parse_args()
    mpicomp.config.codec_threads = 1
    records = []
    print(f"# bench/error_bound.py: 160^3 float32 per data, one core, best of {a.repeats}; GB/s of float32 input; "
          f"max error of one encode/decode (rel: of the largest |x|, about 5)")
    print(f"{'data':9} {'codec':32} {'asked':>9} {'max error':>10} {'ratio':>7} {'enc GB/s':>9} {'dec GB/s':>9}")
    for name, x in datasets().items():
        def row(spec, asked, note=""):
            r = dict(data=name, asked=asked, note=note, elements=x.size, **measure(spec, x, a.repeats))
            if asked is not None:
                kind = "rel" if "rel=" in spec else "abs"
                allowed = asked * (np.abs(x).max() if kind == "rel" else 1)
                assert r["max_error"] <= allowed, (spec, r)  # a miss would be a bug, not a figure
            records.append(r)
            print(f"{name:9} {r['codec'] + note:32} {'' if asked is None else f'{asked:.3g}':>9} {r['max_error']:10.3g} "
                  f"{r['ratio']:7.2f} {r['encode_gbps']:9.2f} {r['decode_gbps']:9.2f}")
        for fixed in ("int8", "int4"):
            row(fixed, None)
            row(f"bound:abs={records[-1]['max_error']:.6g}", records[-1]["max_error"], f" @ {fixed} error")
        for kind in ("abs", "rel"):
            for e in BOUNDS:
                for cname in ("lz4", "zstd"):
                    row(f"bound:{kind}={e:g},cname={cname}", e)
    if a.json:
        write_json(a.json, records)


if __name__ == "__main__":
    main()
