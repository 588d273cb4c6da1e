#!/usr/bin/env python3
"""Loss curves from examples/train_gpt.py JSON logs: one panel per layout (dp x tp x pp), one
curve per policy, smoothed over --window steps; --table prints the README's table instead.

    bench/plot_training.py LOG.json [...] -o losses.png [--window 20]
    bench/plot_training.py LOG.json [...] --table
"""
import argparse
import json

import numpy as np


def policy(log):
    """The run's policy preset, with its mild codec where that is not the default int8."""
    a = log["args"]
    return a["policy"] + (f" ({a['mild']})" if a["policy"] == "hybrid" and a.get("mild", "int8") != "int8" else "")


def sent(log):
    """Bytes per step on the wire: measured (mpicomp.stats) where the log has it, which a
    lossless codec needs (its size depends on the data); else the policy's nominal count."""
    return log.get("wire_bytes_per_step") or log["bytes_per_step"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+")
    p.add_argument("-o", "--output")
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--table", action="store_true",
                   help="print final loss, bytes and median seconds per step of each run against the layout's none")
    a = p.parse_args()
    if a.table == bool(a.output):
        p.error("give either -o OUTPUT or --table")
    runs = {}
    for path in a.logs:
        log = json.load(open(path))
        m = log["mesh"]
        layout = ", ".join(f"{k}={m[k]}" for k in ("dp", "tp", "pp") if m[k] > 1) or "1 rank"
        runs.setdefault(layout, []).append(log)
    if a.table:
        return table(runs)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4), squeeze=False)
    kernel = np.ones(a.window) / a.window
    for ax, (layout, logs) in zip(axes[0], sorted(runs.items())):
        for log in sorted(logs, key=policy):
            loss = np.array([s["loss"] for s in log["steps"]])
            smooth = np.convolve(loss, kernel, mode="valid")
            mb = sent(log) / 1e6
            ax.plot(np.arange(len(smooth)) + a.window, smooth,
                    label=f"{policy(log)}: final {log['final_loss']:.3f}, {mb:.2f} MB/step")
        ax.set(title=layout, xlabel="step", ylabel=f"loss (mean of {a.window} steps)")
        ax.set_ylim(top=min(ax.get_ylim()[1], 3.2))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    print(f"plot_training: wrote {a.output}")


def table(runs):
    print("| layout | policy | final loss | vs none | MB / step | fewer bytes | ms / step | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    order = {"none": 0, "naive": 1, "hybrid": 2}
    for layout, logs in sorted(runs.items()):
        base = next((l for l in logs if l["args"]["policy"] == "none"), None)
        for log in sorted(logs, key=lambda l: (order.get(l["args"]["policy"], 9), policy(l))):
            loss, mb, s = log["final_loss"], sent(log), log.get("seconds_per_step")
            vs = fewer = speed = ""
            if base is not None and log is not base:
                vs = f"{(loss / base['final_loss'] - 1) * 100:+.2f}%"
                fewer = f"{sent(base) / mb:.2f}x"
                if s and base.get("seconds_per_step"):
                    speed = f"{base['seconds_per_step'] / s:.2f}x"
            ms = "-" if s is None else f"{s * 1e3:.1f}"
            print(f"| {layout} | {policy(log)} | {loss:.4f} | {vs} | {mb / 1e6:.3f} | {fewer or '1x'} "
                  f"| {ms} | {speed} |")


if __name__ == "__main__":
    main()
