#!/usr/bin/env python3
"""Loss curves from examples/train_gpt.py JSON logs: one panel per layout (dp x tp x pp), one
curve per policy, smoothed over --window steps.

    bench/plot_training.py LOG.json [...] -o losses.png [--window 20]
"""
import argparse
import json

import numpy as np


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+")
    p.add_argument("-o", "--output", required=True)
    p.add_argument("--window", type=int, default=20)
    a = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = {}
    for path in a.logs:
        log = json.load(open(path))
        m = log["mesh"]
        layout = " x ".join(f"{k}={m[k]}" for k in ("dp", "tp", "pp") if m[k] > 1) or "1 rank"
        runs.setdefault(layout, []).append(log)
    fig, axes = plt.subplots(1, len(runs), figsize=(5.5 * len(runs), 4), squeeze=False)
    kernel = np.ones(a.window) / a.window
    for ax, (layout, logs) in zip(axes[0], sorted(runs.items())):
        for log in sorted(logs, key=lambda l: l["args"]["policy"]):
            loss = np.array([s["loss"] for s in log["steps"]])
            smooth = np.convolve(loss, kernel, mode="valid")
            mb = log["bytes_per_step"] / 1e6
            ax.plot(np.arange(len(smooth)) + a.window, smooth,
                    label=f"{log['args']['policy']}: final {log['final_loss']:.3f}, {mb:.2f} MB/step")
        ax.set(title=layout, xlabel="step", ylabel=f"loss (mean of {a.window} steps)")
        ax.set_ylim(top=min(ax.get_ylim()[1], 3.2))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    print(f"plot_training: wrote {a.output}")


if __name__ == "__main__":
    main()
