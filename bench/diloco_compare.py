"""DiLoCo against data-parallel training on the same tokens: final loss and bytes sent.

    mpiexec -n 4 python bench/diloco_compare.py --steps 300 --out bench/results

Every worker trains a small byte-level language model (embedding of the last --context
bytes, a 2-layer MLP, next-byte logits) on the Python standard library's sources (the
corpus of examples/train_gpt.py), with its own batches. Runs, same seed and tokens:
"ddp" (gradients averaged every step, AdamW), DiLoCo with H = 10 and 50 (inner AdamW,
outer Nesterov SGD lr 0.7 momentum 0.9, codec none), H = 200, DiLoCo H = 50 with outer codecs
bf16, int8, int4 (int4 with error feedback), and Streaming DiLoCo at H = 50 with 4 fragments,
without and with overlap. Loss: mean over ranks of the last 20 steps'
training loss, plus the loss of rank 0's model on a held-out slice at the end. Bytes:
payload this rank sent (mpicomp.torch.traffic's count). One JSON file per run.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from mpi4py import MPI

import mpicomp
import mpicomp.torch as mt
from mpicomp.optim import DiLoCo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_gpt import load_corpus  # noqa: E402

WORLD = MPI.COMM_WORLD
# name: (H, outer codec, fragments, overlap); None: DDP
RUNS = {"ddp": None, "h10": (10, "none", 1, False), "h50": (50, "none", 1, False), "h200": (200, "none", 1, False),
        "h50-bf16": (50, "bf16", 1, False), "h50-int8": (50, "int8", 1, False), "h50-int4": (50, "int4", 1, False),
        "h50-f4": (50, "none", 4, False), "h50-f4-overlap": (50, "none", 4, True)}


def model(args):
    torch.manual_seed(args.seed)
    return torch.nn.Sequential(torch.nn.Embedding(256, 32), torch.nn.Flatten(),
                               torch.nn.Linear(32 * args.context, args.hidden), torch.nn.GELU(),
                               torch.nn.Linear(args.hidden, args.hidden), torch.nn.GELU(),
                               torch.nn.Linear(args.hidden, 256))


def batch(data, args, step, rank):
    rng = np.random.default_rng([args.seed, step, rank])
    starts = rng.integers(0, data.size - args.context - 1, size=args.batch)
    rows = torch.from_numpy(np.stack([data[s:s + args.context + 1] for s in starts]).astype(np.int64))
    return rows[:, :-1], rows[:, -1]


def run(name, data, held_out, args):
    net = model(args)
    inner = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.1)
    mt.traffic.reset()
    if RUNS[name] is None:
        opt = inner
    else:
        h, codec, fragments, overlap = RUNS[name]
        opt = DiLoCo(net, inner, comm=WORLD, sync_every=h, codec=codec, error_feedback=codec == "int4",
                     fragments=fragments, overlap=overlap)
    losses, step_bytes, start = [], [], time.perf_counter()
    for step in range(args.steps):
        x, y = batch(data, args, step, WORLD.Get_rank())
        opt.zero_grad()
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        before = mt.traffic.total()
        if opt is inner:
            mt.allreduce_gradients(net, comm=WORLD, codec="none")
        opt.step()
        step_bytes.append(mt.traffic.total() - before)
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    with torch.no_grad():
        x = torch.from_numpy(np.stack([held_out[s:s + args.context] for s in range(0, 4000, 4)]).astype(np.int64))
        y = torch.from_numpy(held_out[args.context:4000 + args.context:4].astype(np.int64))
        held = F.cross_entropy(net(x), y).item()
    train = WORLD.allreduce(float(np.mean(losses[-20:]))) / WORLD.Get_size()
    h, codec, fragments, overlap = RUNS[name] or (None, None, None, None)
    return {"run": name, "workers": WORLD.Get_size(), "steps": args.steps, "sync_every": h, "codec": codec,
            "fragments": fragments, "overlap": overlap, "train_loss_last20": train, "held_out_loss": held,
            "bytes_sent_rank0": mt.traffic.total(), "peak_bytes_per_step_rank0": max(step_bytes),
            "loss_per_step_rank0": losses, "bytes_per_step_rank0": step_bytes, "seconds": seconds,
            "params": sum(p.numel() for p in net.parameters()), "min_bytes": mpicomp.config.min_bytes}


def plot(out, names):
    """Loss (smoothed over 50 steps) against inner steps and against bytes rank 0 sent, for
    the runs' JSON files in out: diloco-runs.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in names:
        r = json.load(open(os.path.join(out, f"diloco-{name}.json")))
        loss = np.convolve(r["loss_per_step_rank0"], np.ones(50) / 50, mode="valid")
        sent = np.cumsum(r["bytes_per_step_rank0"])[49:] / 1e6
        axes[0].plot(np.arange(50, 50 + loss.size), loss, label=name, lw=1)
        axes[1].plot(sent, loss, label=name, lw=1)
    axes[0].set_xlabel("inner step")
    axes[1].set_xlabel("MB sent by rank 0 (log)")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_ylabel("training loss, rank 0, mean of 50 steps")
        ax.legend(fontsize=8)
    fig.suptitle("DiLoCo vs DDP, 4 workers (bench/diloco_compare.py)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "diloco-runs.png"), dpi=80)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--context", type=int, default=16)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--out", default=None, help="directory for diloco-<run>.json and diloco-runs.png (rank 0)")
    p.add_argument("--plot-only", action="store_true", help="only plot the runs' JSON files already in --out")
    args = p.parse_args(argv)
    if args.plot_only:
        return plot(args.out, args.runs.split(","))
    torch.set_num_threads(1)
    corpus = load_corpus(2_200_000)
    data, held_out = corpus[:2_000_000], corpus[2_000_000:]
    for name in args.runs.split(","):
        r = run(name, data, held_out, args)
        if WORLD.Get_rank() == 0:
            print(json.dumps(r), flush=True)
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                with open(os.path.join(args.out, f"diloco-{name}.json"), "w") as f:
                    json.dump(dict(r, command=" ".join(["mpiexec", "-n", str(WORLD.Get_size()), "python"] + sys.argv)),
                              f, indent=1)
    if WORLD.Get_rank() == 0 and args.out:
        plot(args.out, args.runs.split(","))


if __name__ == "__main__":
    main()
