#!/usr/bin/env python3
"""Every valid AMSP partition on examples/train_gpt.py against replicated AdamW (DDP), one
after the other with the same seed and flags: per-step losses, time per step, bytes sent,
and memory per rank measured beside the planner's formula. Writes
bench/results/amsp-partitions-NAME.{json,md}.

    bench/amsp_partitions.py NAME [--np 4] [--ranks-per-node 2] [--netem 1gbit] -- TRAIN_GPT_FLAGS...

Partitions with s_p > 1 run twice, with and without prefetching the next module's
parameter gather (AMSP's prefetch), side by side.

--netem RATE runs every training under bench/netem --ranks-per-node (links between the
emulated nodes at RATE, inside a node unshaped) and adds the planner's pick for that link
(amsp.plan with this model's size, fp32 parameters, gradients and Adam state, and
--intra-gbit inside a node) beside the measured fastest partition.
"""
import argparse
import sys
import tempfile
from pathlib import Path

from _driver import ROOT, netem, parse, run_json, write


def train(args, flags, extra, tmp, tag):
    log = Path(tmp) / f"{tag}.json"
    return run_json(args.np, [sys.executable, ROOT / "examples" / "train_gpt.py", *flags, *extra, "--json", log],
                    log, tag, link=netem(args.netem, args.ranks_per_node), last_line=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name", help="results go to bench/results/amsp-partitions-NAME.{json,md}")
    p.add_argument("--np", type=int, default=4, help="ranks")
    p.add_argument("--ranks-per-node", type=int, default=2, help="ranks per emulated node")
    p.add_argument("--netem", default=None, help="rate of the links between nodes, e.g. 1gbit (needs root)")
    p.add_argument("--intra-gbit", type=float, default=20.0,
                   help="bandwidth inside a node for the planner, Gbit/s (loopback TCP here)")
    args, args.flags = parse(p)  # the flags for examples/train_gpt.py
    from mpicomp.optim.amsp.groups import valid_partitions

    flags = ["--policy", "none", *args.flags]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        ddp = train(args, flags, ["--optimizer", "adamw"], tmp, "adamw")
        for shard in valid_partitions(args.np, args.ranks_per_node):
            amsp_flags = ["--optimizer", "amsp", "--shard", ",".join(map(str, shard)), "--ranks-per-node",
                          str(args.ranks_per_node)]
            log = train(args, flags, amsp_flags, tmp, f"amsp-{shard}")
            diff = max(abs(a["loss"] - b["loss"]) for a, b in zip(log["steps"], ddp["steps"]))
            mem = log["memory"]
            ratio = {k: max(m[k] / m["formula"][k] for m in mem) for k in ("params", "grads", "optimizer")}
            rows.append({"shard": shard, "max_loss_diff": diff, "final_loss": log["final_loss"],
                         "seconds_per_step": log["seconds_per_step"], "wire_bytes_per_step": log["wire_bytes_per_step"],
                         "memory": mem, "measured_over_formula": ratio, "seconds_per_step_no_prefetch": None})
            if shard[0] > 1:
                off = train(args, flags, amsp_flags + ["--amsp-prefetch", "off"], tmp, f"amsp-{shard}-off")
                rows[-1]["seconds_per_step_no_prefetch"] = off["seconds_per_step"]
    summary = {"command": " ".join(sys.argv), "np": args.np, "ranks_per_node": args.ranks_per_node,
               "netem": args.netem, "ddp_final_loss": ddp["final_loss"], "ddp_seconds_per_step": ddp["seconds_per_step"],
               "ddp_wire_bytes_per_step": ddp["wire_bytes_per_step"], "partitions": rows}
    pick_line = ""
    if args.netem:
        from mpicomp.optim import amsp

        gbit = float(args.netem.lower().removesuffix("gbit")) if args.netem.lower().endswith("gbit") else None
        if gbit:
            chosen = amsp.plan(num_params=ddp["parameters"], world_size=args.np, ranks_per_node=args.ranks_per_node,
                               memory_per_rank=1e15, intra_bandwidth=args.intra_gbit * 1e9 / 8,
                               inter_bandwidth=gbit * 1e9 / 8, param_bytes=4, grad_bytes=4, state_bytes=12,
                               modules=log["amsp_modules"]).shard
            fastest = min(rows, key=lambda r: r["seconds_per_step"])["shard"]
            summary.update(planner_pick=list(chosen), measured_fastest=list(fastest))
            pick_line = f"Planner's pick {tuple(chosen)}, measured fastest {tuple(fastest)}."
    lines = [f"`{summary['command']}`", "",
             f"DDP (replicated AdamW, allreduce): final loss {ddp['final_loss']:.6f}, "
             f"{ddp['seconds_per_step'] * 1e3:.1f} ms/step, {ddp['wire_bytes_per_step'] / 1e6:.3f} MB/step", "",
             "| (s_p, s_g, s_os) | max abs loss diff vs DDP | ms/step | ms/step without prefetch | "
             "MB sent/step (all ranks) | measured / formula: params, grads, optimizer (worst rank) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        m = r["measured_over_formula"]
        off = r["seconds_per_step_no_prefetch"]
        lines.append(f"| {tuple(r['shard'])} | {r['max_loss_diff']:.2e} | {r['seconds_per_step'] * 1e3:.1f} | "
                     f"{'' if off is None else f'{off * 1e3:.1f}'} | "
                     f"{r['wire_bytes_per_step'] / 1e6:.3f} | "
                     f"{m['params']:.3f}, {m['grads']:.3f}, {m['optimizer']:.3f} |")
    if pick_line:
        lines += ["", pick_line]
    write(f"amsp-partitions-{args.name}", summary, lines)


if __name__ == "__main__":
    main()
