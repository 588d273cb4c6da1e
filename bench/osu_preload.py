#!/usr/bin/env python3
"""The real OSU micro-benchmarks, unmodified, under mpicomp's LD_PRELOAD interposer.

    bench/osu_preload.py OSU_DIR [--netem "--rate 1gbit"] [-n 2] [-m 1K:64M] [-i 10] [-x 2]
                         [--codecs plain,off,none,int8,int4,sign] [--rounds 1] [--json PATH]

OSU_DIR holds osu_allreduce (e.g. <prefix>/libexec/osu-micro-benchmarks/mpi/collective of
an OSU 7.x built with this venv's mpicc, outside this repository). Runs `osu_allreduce -T
mpi_float -c` once per codec (MPICOMP_CODEC; `plain` runs it without the preload at all),
optionally inside bench/netem, and prints one table: latency per codec and the speed-up of
each over `off` (pure pass-through). With --rounds R the codecs run R times, interleaved, and
each size keeps its best latency, so slow drift of the machine does not favour one codec.
"""
import argparse
import json
import subprocess
import sys
from pathlib import Path

from _driver import launch


def run_osu(osu, n, sizes, iters, warmup, codec, netem, preload):
    env = [] if codec == "plain" else ["env", f"LD_PRELOAD={preload}", f"MPICOMP_CODEC={codec}"]
    out = launch(n, [*env, Path(osu) / "osu_allreduce", "-T", "mpi_float", "-c", "-m", sizes, "-i", iters,
                     "-x", warmup], f"osu_preload: {codec}", link=netem.split(), echo=False, timeout=3600)
    rows = {}
    for line in out.stdout.splitlines():
        f = line.split()
        if len(f) >= 2 and f[0].isdigit():
            rows[int(f[0])] = (float(f[1]), f[2] if len(f) > 2 else "")
    return rows


def osu_sizes(text):
    from mpicomp.bench.options import size  # the installed package, as mpicomp-bench parses -m

    lo, _, hi = text.partition(":")
    return f"{size(lo)}:{size(hi)}" if hi else str(size(lo))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("osu_dir", help="the folder holding osu_allreduce (OSU 7.x built with this venv's mpicc)")
    p.add_argument("--netem", default="", help='bench/netem options, e.g. "--rate 1gbit" (default: shared memory)')
    p.add_argument("-n", type=int, default=2, help="ranks")
    p.add_argument("-m", default="1K:64M", type=osu_sizes, metavar="MIN:MAX",
                   help="bytes, K/M/G suffixes accepted (passed to OSU in plain bytes, which is all it reads)")
    p.add_argument("-i", type=int, default=10, help="OSU's iterations per size (its -i)")
    p.add_argument("-x", type=int, default=2, help="OSU's warm-up iterations per size (its -x)")
    p.add_argument("--codecs", default="plain,off,none,int8,int4,sign",
                   help="MPICOMP_CODEC values, one run each; plain: without the preload")
    p.add_argument("--rounds", type=int, default=1, help="runs of every codec, interleaved; each size keeps "
                   "its best latency")
    p.add_argument("--json", help="also write the table as JSON to this path")
    a = p.parse_args()
    preload = subprocess.run([sys.executable, "-m", "mpicomp", "--preload"], capture_output=True, text=True,
                             check=True).stdout.strip()
    codecs = a.codecs.split(",")
    if "off" not in codecs:
        p.error("--codecs must include off (the baseline of the speed-ups)")
    results = {}
    for _ in range(a.rounds):
        for c in codecs:
            for size, row in run_osu(a.osu_dir, a.n, a.m, a.i, a.x, c, a.netem, preload).items():
                best = results.setdefault(c, {}).get(size)
                if best is None or row[0] < best[0]:
                    results[c][size] = row
    link = a.netem or "shared memory"
    print(f"# osu_allreduce -T mpi_float -c under LD_PRELOAD={preload}")
    print(f"# {a.n} ranks, {link}, -i {a.i} -x {a.x}, best of {a.rounds} rounds; latency in us; "
          f"x codec = off / codec (plain: no preload)")
    others = [c for c in codecs if c != "off"]
    print("# " + f"{'Size':>10}" + "".join(f"{c:>14}" for c in codecs) + "".join(f"{'x ' + c:>10}" for c in others))
    records = []
    for size in sorted(results["off"]):
        lat = {c: results[c][size][0] for c in codecs}
        print(f"  {size:>10}" + "".join(f"{lat[c]:>14.2f}" for c in codecs)
              + "".join(f"{lat['off'] / lat[c]:>10.2f}" for c in others))
        for c in codecs:
            records.append({"op": "allreduce", "impl": "osu_allreduce" + ("" if c == "plain" else "+preload"),
                            "codec": c, "size": size, "np": a.n, "link": link, "avg_latency_us": lat[c],
                            "validation": results[c][size][1], "speedup_vs_off": lat["off"] / lat[c]})
    if a.json:
        Path(a.json).write_text(json.dumps(records, indent=1) + "\n")


if __name__ == "__main__":
    main()
