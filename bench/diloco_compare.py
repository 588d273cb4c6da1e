"""DiLoCo against data-parallel training on the example GPT, same seed and tokens: held-out
loss, training loss and bytes sent.

    mpiexec -n 4 python bench/diloco_compare.py --pretrain 500 --steps 2000 --out bench/results

Every worker trains examples/train_gpt.py's model (byte-level GPT, --layers blocks of
--width) on its own batches of the Python standard library's sources (train_gpt's corpus and
batches). As in the DiLoCo paper (Douillard et al., arXiv 2311.08105, section 3: every run
starts from one model pretrained with synchronous training), all runs start from the same
--pretrain steps of data-parallel AdamW, model and AdamW state; --pretrain 0 starts them
from the random initialisation. Runs: "ddp" (gradients averaged every step, AdamW), DiLoCo
with H = 10, 50 and 200 (inner AdamW, outer Nesterov SGD lr --outer-lr, momentum 0.9, codec
none), H = 50 with outer codecs bf16, int8 and int4 (int4 with error feedback), and
Streaming DiLoCo at H = 50 with 4 fragments, without and with overlap.

Held-out loss: rank 0's model after the last step, on --eval sequences from bytes outside
the training slice (the paper's measure: evaluation loss of the final model). Training
loss: the mean over ranks of the last 50 steps. Bytes: payload rank 0 sent
(mpicomp.torch.traffic's count), in all and at most in one step. One JSON file per run,
diloco-gpt-<run>.json, and diloco-gpt-runs.png (loss against steps and against bytes).
"""

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from mpi4py import MPI

import mpicomp
import mpicomp.torch as mt
from mpicomp.optim import DiLoCo

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from train_gpt import Stage, batch, cross_entropy, load_corpus  # noqa: E402
from _driver import add_gpt_flags  # noqa: E402

WORLD = MPI.COMM_WORLD
# name: (H, outer codec, fragments, overlap); None: DDP
RUNS = {"ddp": None, "h10": (10, "none", 1, False), "h50": (50, "none", 1, False), "h200": (200, "none", 1, False),
        "h50-bf16": (50, "bf16", 1, False), "h50-int8": (50, "int8", 1, False), "h50-int4": (50, "int4", 1, False),
        "h50-f4": (50, "none", 4, False), "h50-f4-overlap": (50, "none", 4, True)}


def gpt(args):
    """train_gpt's model, whole on every rank (data parallel only)."""
    return Stage(args, mt.Mesh(dp=WORLD.Get_size(), comm=WORLD), mt.Policy.preset("none"))


def ddp_step(net, opt, data, args, step):
    inputs, targets = batch(data, args, step, WORLD.Get_rank())
    opt.zero_grad()
    loss = cross_entropy(net(inputs), targets)
    loss.backward()
    return loss


def pretrain(data, args):
    """--pretrain steps of data-parallel AdamW from the seed: the model and optimizer state
    every run starts from."""
    net = gpt(args)
    opt = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.1)
    for step in range(args.pretrain):
        ddp_step(net, opt, data, args, step)
        mt.allreduce_gradients(net, comm=WORLD, codec="none")
        opt.step()
    return net.state_dict(), opt.state_dict()


def evaluate(net, held_out, args):
    starts = np.linspace(0, held_out.size - args.context - 1, args.eval).astype(np.int64)
    rows = torch.from_numpy(np.stack([held_out[s:s + args.context + 1] for s in starts]).astype(np.int64))
    with torch.no_grad():
        return cross_entropy(net(rows[:, :-1]), rows[:, 1:]).item()


def run(name, start, data, held_out, args):
    net = gpt(args)
    net.load_state_dict(start[0])
    inner = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.1)
    inner.load_state_dict(copy.deepcopy(start[1]))
    mt.traffic.reset()
    if RUNS[name] is None:
        opt = inner
    else:
        h, codec, fragments, overlap = RUNS[name]
        opt = DiLoCo(net, inner, comm=WORLD, sync_every=h, outer_lr=args.outer_lr, codec=codec,
                     error_feedback=codec == "int4", fragments=fragments, overlap=overlap)
    losses, step_bytes, begin = [], [], time.perf_counter()
    for step in range(args.pretrain, args.pretrain + args.steps):
        loss = ddp_step(net, opt, data, args, step)
        before = mt.traffic.total()
        if opt is inner:
            mt.allreduce_gradients(net, comm=WORLD, codec="none")
        opt.step()
        step_bytes.append(mt.traffic.total() - before)
        losses.append(loss.item())
    seconds = time.perf_counter() - begin
    h, codec, fragments, overlap = RUNS[name] or (None, None, None, None)
    return {"run": name, "workers": WORLD.Get_size(), "pretrain_steps": args.pretrain, "steps": args.steps,
            "sync_every": h, "codec": codec, "fragments": fragments, "overlap": overlap,
            "outer_lr": None if h is None else args.outer_lr,
            "train_loss_last50": WORLD.allreduce(float(np.mean(losses[-50:]))) / WORLD.Get_size(),
            "held_out_loss": evaluate(net, held_out, args), "bytes_sent_rank0": mt.traffic.total(),
            "peak_bytes_per_step_rank0": max(step_bytes), "loss_per_step_rank0": losses,
            "bytes_per_step_rank0": step_bytes, "seconds": seconds,
            "params": sum(p.numel() for p in net.parameters()), "min_bytes": mpicomp.config.min_bytes}


def plot(out, names):
    """Loss (smoothed over 50 steps) against steps and against bytes rank 0 sent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name in names:
        r = json.load(open(os.path.join(out, f"diloco-gpt-{name}.json")))
        w = min(50, len(r["loss_per_step_rank0"]))
        loss = np.convolve(r["loss_per_step_rank0"], np.ones(w) / w, mode="valid")
        sent = np.cumsum(r["bytes_per_step_rank0"])[w - 1:] / 1e6
        axes[0].plot(r["pretrain_steps"] + np.arange(w, w + loss.size), loss, label=name, lw=1)
        axes[1].plot(sent, loss, label=name, lw=1)
    axes[0].set_xlabel("step (after the shared pretraining)")
    axes[1].set_xlabel("MB sent by rank 0 (log)")
    axes[1].set_xscale("log")
    for ax in axes:
        ax.set_ylabel("training loss, rank 0, mean of 50 steps")
        ax.legend(fontsize=8)
    fig.suptitle(f"DiLoCo vs DDP on the example GPT, {WORLD.Get_size()} workers (bench/diloco_compare.py)")
    fig.tight_layout()
    fig.savefig(os.path.join(out, "diloco-gpt-runs.png"), dpi=80)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--pretrain", type=int, default=500, help="shared data-parallel steps before the runs")
    p.add_argument("--steps", type=int, default=2000, help="steps of each run")
    add_gpt_flags(p)
    p.add_argument("--outer-lr", type=float, default=0.7, help="DiLoCo's outer Nesterov learning rate")
    p.add_argument("--eval", type=int, default=512, help="held-out sequences")
    p.add_argument("--corpus-bytes", type=int, default=4_000_000, help="training bytes (held-out: the next 200,000)")
    p.add_argument("--runs", default=",".join(RUNS), help="comma-separated, of: " + ",".join(RUNS))
    p.add_argument("--out", default=None, help="directory for diloco-gpt-<run>.json and the plot (rank 0)")
    p.add_argument("--plot-only", action="store_true", help="only plot the runs' JSON files already in --out")
    args = p.parse_args(argv)
    names = args.runs.split(",")
    if args.plot_only:
        return plot(args.out, names)
    torch.set_num_threads(1)
    corpus = load_corpus(args.corpus_bytes + 200_000)
    data, held_out = corpus[:args.corpus_bytes], corpus[args.corpus_bytes:]
    start = pretrain(data, args)
    for name in names:
        r = run(name, start, data, held_out, args)
        if WORLD.Get_rank() == 0:
            summary = {k: v for k, v in r.items() if not isinstance(v, list)}
            print(json.dumps(summary), flush=True)
            if args.out:
                os.makedirs(args.out, exist_ok=True)
                command = " ".join(["mpiexec", "-n", str(WORLD.Get_size()), "python"] + sys.argv)
                with open(os.path.join(args.out, f"diloco-gpt-{name}.json"), "w") as f:
                    json.dump(dict(r, command=command), f, indent=1)
    if WORLD.Get_rank() == 0 and args.out:
        plot(args.out, names)


if __name__ == "__main__":
    main()
