"""`mpicomp-bench plot RESULTS.json [...] -o FIG.png`: latency against message size for every
implementation and codec in the records (left), and each one's speed-up over a baseline
measured in the same run (right: the MPI library's own collective when the records have it,
else mpicomp's codec none). One row of panels per (op, ranks, link) found in the records."""
import json
from pathlib import Path


def _label(r):
    return r["codec"] if r["impl"] == "mpicomp" else f"{r['impl']} (library)"


def _baseline(rows):
    for impl, codec in (("mpi", "none"), ("osu_allreduce", "none"), ("mpicomp", "none"), ("mpicomp", "off")):
        base = {r["size"]: r["avg_latency_us"] for r in rows if r["impl"] == impl and r["codec"] == codec}
        if base:
            return f"{impl} {codec}" if impl == "mpicomp" else impl, base
    return None, {}


def load(paths):
    records = []
    for p in paths:
        data = json.loads(Path(p).read_text())
        for r in data:
            r.setdefault("impl", "mpicomp")
            r.setdefault("link", Path(p).stem)
        records.extend(r for r in data if "avg_latency_us" in r and "size" in r)
    if not records:
        raise SystemExit(f"mpicomp-bench plot: no latency records in {', '.join(map(str, paths))}")
    return records


def run(args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = load(args.results)
    panels = {}
    for r in records:
        panels.setdefault((r["op"], r["np"], r.get("link", "")), []).append(r)
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 4.2 * len(panels)), squeeze=False)
    for (op, np_, link), (ax_lat, ax_up) in zip(sorted(panels), axes):
        rows = panels[(op, np_, link)]
        base_name, base = _baseline(rows)
        series = {}
        for r in rows:
            series.setdefault(_label(r), []).append(r)
        for label, rs in sorted(series.items()):
            rs.sort(key=lambda r: r["size"])
            sizes = [r["size"] for r in rs]
            ax_lat.plot(sizes, [r["avg_latency_us"] for r in rs], marker=".", label=label)
            ups = [(r["size"], base[r["size"]] / r["avg_latency_us"]) for r in rs if r["size"] in base]
            if ups:
                ax_up.plot(*zip(*ups), marker=".", label=label)
        title = f"{op}, {np_} ranks" + (f", {link}" if link else "")
        ax_lat.set(xscale="log", yscale="log", xlabel="bytes of float32 input per rank", ylabel="latency (us)",
                   title=title)
        ax_up.set(xscale="log", xlabel="bytes of float32 input per rank",
                  ylabel=f"speed-up over {base_name}" if base_name else "speed-up", title=title)
        ax_up.axhline(1.0, color="gray", lw=0.8)
        for ax in (ax_lat, ax_up):
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"mpicomp-bench plot: wrote {args.output} ({len(panels)} panel rows from {len(records)} records)")
    return 0
