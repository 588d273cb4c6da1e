#!/usr/bin/env python3
"""The plain PyTorch script examples/torch_distributed.py with backend gloo and with backend
"mpicomp" (codecs none, bf16, int8 from MPICOMP_CODEC), DDP and FSDP2, one after the other in
one invocation: time per step against gloo's and final loss. Writes
bench/results/torch-backend-NAME.{json,md}.

    bench/torch_backend_compare.py NAME [--np 2] [--netem 1gbit] [--codecs none,bf16,int8] -- SCRIPT_FLAGS...

--netem RATE runs every training under bench/netem (one shaped link shared by the ranks).
Time per step: the median over the steps after the first 5 (rank 0's clock).
"""
import argparse
import sys
import tempfile
from pathlib import Path

from _driver import ROOT, median_ms, netem, parse, run_json, write


def train(args, backend, wrap, codec, flags, tmp):
    log = Path(tmp) / f"{backend}-{wrap}-{codec}.json"
    script = ROOT / "examples" / "torch_distributed.py"
    out = run_json(args.np, ["env", f"MPICOMP_CODEC={codec}", sys.executable, script, "--backend", backend,
                             "--wrap", wrap, "--json", log, *flags], log,
                   f"{backend} {wrap} {codec}", link=netem(args.netem))
    out["ms_per_step"] = median_ms(out["step_seconds"])
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name", help="results go to bench/results/torch-backend-NAME.{json,md}")
    p.add_argument("--np", type=int, default=2, help="ranks")
    p.add_argument("--netem", default=None, help="emulated link rate, e.g. 1gbit (needs root)")
    p.add_argument("--codecs", default="none,bf16,int8", help="MPICOMP_CODEC values for the mpicomp runs")
    p.add_argument("--wraps", default="ddp,fsdp2", help="examples/torch_distributed.py --wrap values")
    a, flags = parse(p)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for wrap in a.wraps.split(","):
            gloo = train(a, "gloo", wrap, "none", flags, tmp)
            rows.append(dict(wrap=wrap, backend="gloo", codec="", ms=gloo["ms_per_step"], ratio=1.0,
                             loss=gloo["losses"][-1], bytes_wire=0, bytes_plain=0))
            for codec in a.codecs.split(","):
                r = train(a, "mpicomp", wrap, codec, flags, tmp)
                rows.append(dict(wrap=wrap, backend="mpicomp", codec=codec, ms=r["ms_per_step"],
                                 ratio=r["ms_per_step"] / gloo["ms_per_step"], loss=r["losses"][-1],
                                 loss_vs_gloo=r["losses"][-1] / gloo["losses"][-1] - 1,
                                 bytes_wire=r["bytes_wire"], bytes_plain=r["bytes_plain"]))
    summary = {"command": " ".join(sys.argv), "np": a.np, "netem": a.netem, "flags": flags, "runs": rows}
    lines = [f"`{summary['command']}`", "",
             "| script | backend | codec | ms/step | vs gloo | final loss | MB sent by mpicomp (uncompressed) |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        sent = f"{r['bytes_wire'] / 1e6:.1f} ({r['bytes_plain'] / 1e6:.1f})" if r["backend"] == "mpicomp" else ""
        lines.append(f"| {r['wrap']} | {r['backend']} | {r['codec']} | {r['ms']:.1f} | {r['ratio']:.2f}x | "
                     f"{r['loss']:.4f} | {sent} |")
    write(f"torch-backend-{a.name}", summary, lines)


if __name__ == "__main__":
    main()
