"""`mpicomp-bench summary RESULTS.json [...] [--sizes 1M,64M]`: Markdown tables of --json
results, as the README shows them.

- Speed-ups: for each (op, link, ranks) and size, the MPI library's latency and each codec's
  speed-up over it (MPI latency / codec latency; both measured in the same run).
- Crossover (--crossover): for each (op, link, ranks) and lossy codec, the smallest size from
  which the codec is faster than mpicomp's codec none at that size and at every larger one:
  below it compression does not pay on that link (how config.min_bytes was chosen).
"""
from .options import fmt_size, size
from .plot import load


def _groups(records):
    groups = {}
    for r in records:
        groups.setdefault((r["op"], r.get("link", ""), r["np"]), []).append(r)
    return groups


def speedups(records, sizes):
    codecs = sorted({r["codec"] for r in records if r["impl"] == "mpicomp"}, key=_codec_order)
    peers = sorted({r["impl"] for r in records if r["impl"] not in ("mpicomp", "mpi")})
    lines = ["| op | link | ranks | size | MPI (ms) | " + " | ".join(f"{p} x" for p in peers)
             + (" | " if peers else "") + " | ".join(f"{c} x" for c in codecs) + " |"]
    lines.append("|" + "---|" * (5 + len(peers) + len(codecs)))
    for (op, link, np_), rows in sorted(_groups(records).items()):
        at = {(r["impl"], r["codec"], r["size"]): r["avg_latency_us"] for r in rows}
        for s in sizes:
            mpi = at.get(("mpi", "none", s))
            if mpi is None:
                continue
            cells = [f"{mpi / at[(p, 'none', s)]:.2f}" if (p, "none", s) in at else "-" for p in peers]
            cells += [f"{mpi / at[('mpicomp', c, s)]:.2f}" if ("mpicomp", c, s) in at else "-" for c in codecs]
            lines.append(f"| {op} | {link} | {np_} | {fmt_size(s)} | {mpi / 1e3:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def crossover(records):
    lines = ["| op | link | ranks | codec | pays from |", "|---|---|---|---|---|"]
    for (op, link, np_), rows in sorted(_groups(records).items()):
        base = {r["size"]: r["avg_latency_us"] for r in rows if r["impl"] == "mpicomp" and r["codec"] == "none"}
        for c in sorted({r["codec"] for r in rows if r["impl"] == "mpicomp"} - {"none"}, key=_codec_order):
            lat = {r["size"]: r["avg_latency_us"] for r in rows if r["impl"] == "mpicomp" and r["codec"] == c}
            sizes = sorted(set(lat) & set(base))
            pays = None
            for s in reversed(sizes):
                if lat[s] >= base[s]:
                    break
                pays = s
            lines.append(f"| {op} | {link} | {np_} | {c} | {fmt_size(pays) if pays else 'never'} |")
    return "\n".join(lines)


def _codec_order(c):
    order = ["none", "fp16", "bf16", "int8", "int4", "sign"]
    return (order.index(c) if c in order else len(order), c)


def run(args):
    records = load(args.results)
    if args.crossover:
        print(crossover(records))
    else:
        print(speedups(records, [size(s) for s in args.sizes.split(",")]))
    return 0
