#!/usr/bin/env python3
"""AMSP's planner on the paper's settings (Chen et al., arXiv 2311.00257: LLaMA 7B / 13B /
30B, 8 GPUs per node, 80 GB each, 64 to 1024 GPUs), beside the paper's choices. Prints a
Markdown table per activation assumption; the inputs are the arguments below.

    bench/amsp_paper_table.py [--intra 150e9] [--inter 25e9] [--seq 4096] [--batch-tokens 4194304]
"""
import argparse

from mpicomp.optim import amsp

# LLaMA (Touvron et al. 2023, arXiv 2302.13971, table 2): parameters, layers, width
MODELS = {"7B": (6_700_000_000, 32, 4096), "13B": (13_000_000_000, 40, 5120), "30B": (32_500_000_000, 60, 6656)}
PAPER = {"7B": (1, 1, 8), "13B": (4, 4, 8), "30B": (8, 8, 32)}  # the summary of the paper's picks
WORLDS = (64, 128, 256, 512, 1024)


def activations(layers, width, seq, recompute):
    """Bytes per GPU for one sequence: 34 s h per layer in 16-bit without the attention
    matrix (flash attention), after Korthikanti et al. 2022 (arXiv 2205.05198, section 4.1);
    with full recomputation only each layer's input (2 s h) is kept, plus one layer's set."""
    return layers * 2 * seq * width + 34 * seq * width if recompute else layers * 34 * seq * width


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--intra", type=float, default=150e9, help="intra-node bytes/s per GPU")
    p.add_argument("--inter", type=float, default=25e9, help="inter-node bytes/s per GPU (200 Gbit/s)")
    p.add_argument("--latency", type=float, default=10e-6, help="seconds per ring step")
    p.add_argument("--seq", type=int, default=4096, help="sequence length")
    p.add_argument("--batch-tokens", type=int, default=4 << 20, help="global batch in tokens (LLaMA: 4M)")
    a = p.parse_args()
    for recompute in (True, False):
        print(f"\nActivations {'with full recomputation' if recompute else 'without recomputation'}; "
              f"one {a.seq}-token sequence per GPU per micro-batch, {a.batch_tokens} tokens per step\n")
        columns = " | ".join(f"{w} GPUs" for w in WORLDS)
        print(f"| model | activations GB | {columns} | paper | paper's pick here |")
        print("|---" * (len(WORLDS) + 4) + "|")
        for name, (f, layers, width) in MODELS.items():
            act = activations(layers, width, a.seq, recompute)
            cells = []
            for world in WORLDS:
                micro = max(1, a.batch_tokens // (a.seq * world))
                try:
                    plan = amsp.plan(f, world, 8, 80e9, activation_bytes=act, intra_bandwidth=a.intra,
                                     inter_bandwidth=a.inter, latency=a.latency, modules=7 * layers + 2,
                                     micro_batches=micro)
                    cells.append(f"{plan.shard} {plan.best.memory['total'] / 1e9:.0f} GB "
                                 f"{plan.best.seconds * 1e3:.0f} ms")
                except amsp.PlanError:
                    cells.append("none fits")
            theirs = next((c for c in plan.candidates if c.shard == PAPER[name]), None) if cells[-1] != "none fits" \
                else None
            note = (f"{theirs.memory['total'] / 1e9:.0f} GB {theirs.seconds * 1e3:.0f} ms"
                    + ("" if theirs.fits else " (over 80 GB)")) if theirs else "-"
            print(f"| {name} | {act / 1e9:.1f} | " + " | ".join(cells) + f" | {PAPER[name]} | {note} (1024 GPUs) |")


if __name__ == "__main__":
    main()
