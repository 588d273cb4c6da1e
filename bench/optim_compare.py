#!/usr/bin/env python3
"""Sharded optimizers on examples/train_gpt.py, side by side in one invocation: each
--optimizer runs with the same seed and flags, one after the other, and the summary (final
loss, time per token, comm wait, optimizer memory) goes to bench/results/optim-NAME.json,
with loss-vs-tokens and loss-vs-seconds plots in optim-NAME.png.

    bench/optim_compare.py NAME [--np 4] [--optimizers adamw,zero1,acco] [--netem 1gbit [--ranks-per-node K]]
                           -- TRAIN_GPT_FLAGS...

--netem RATE runs every training under bench/netem (one shaped link shared by the ranks; with
--ranks-per-node K only the links between nodes of K ranks are shaped, e.g. DiLoCo's islands).
Times per token are compared with zero1's when it runs, else with the first optimizer's.
"""
import argparse
import sys
import tempfile
from pathlib import Path

from _driver import ROOT, netem, parse, run_json, write


def run(opt, args, flags, tmp):
    log = Path(tmp) / f"{opt}.json"
    return run_json(args.np, [sys.executable, ROOT / "examples" / "train_gpt.py", *flags, "--optimizer", opt,
                              "--json", log], log, opt, link=netem(args.netem, args.ranks_per_node), last_line=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name", help="results go to bench/results/optim-NAME.{json,png}")
    p.add_argument("--np", type=int, default=4, help="ranks")
    p.add_argument("--optimizers", default="adamw,zero1,acco", help="comma-separated --optimizer values")
    p.add_argument("--netem", default=None, help="emulated link rate, e.g. 1gbit (needs root)")
    p.add_argument("--ranks-per-node", type=int, default=None, help="with --netem: shape only links between nodes")
    a, flags = parse(p)  # the flags for examples/train_gpt.py
    with tempfile.TemporaryDirectory() as tmp:
        logs = {opt: run(opt, a, flags, tmp) for opt in a.optimizers.split(",")}
    summary = {"command": " ".join(sys.argv), "np": a.np, "netem": a.netem, "ranks_per_node": a.ranks_per_node,
               "flags": flags, "runs": {}}
    for opt, log in logs.items():
        steps = log["steps"]
        summary["runs"][opt] = {
            "final_loss": log["final_loss"], "seconds_per_step": log["seconds_per_step"],
            "seconds_per_token": log["seconds_per_token"], "comm_wait_s_per_step": log["comm_wait_s_per_step"],
            "wire_bytes_per_step": log["wire_bytes_per_step"], "plain_bytes_per_step": log["plain_bytes_per_step"],
            "tokens": steps[-1]["tokens"], "seconds": sum(s["seconds"] for s in steps),
            "optimizer_state_bytes_per_rank": log.get("optimizer_state_bytes"),
            "micro_batches_last_step": steps[-1]["micro_batches"],
            "loss": [s["loss"] for s in steps], "tokens_at": [s["tokens"] for s in steps],
            "peak_wire_bytes_per_step": max(s["wire_bytes"] for s in steps),
            "wire_bytes_at": [sum(t["wire_bytes"] for t in steps[:i + 1]) for i in range(len(steps))],
            "seconds_at": [sum(t["seconds"] for t in steps[:i + 1]) for i in range(len(steps))]}
    name = "zero1" if "zero1" in summary["runs"] else next(iter(summary["runs"]))
    summary["base"] = name
    for r in summary["runs"].values():
        r["time_per_token_vs_base"] = r["seconds_per_token"] / summary["runs"][name]["seconds_per_token"]
    out = write(f"optim-{a.name}", summary)
    for opt, r in summary["runs"].items():
        print(f"{opt:6s} final loss {r['final_loss']:.4f}  {r['seconds_per_token'] * 1e6:8.2f} us/token  "
              f"({r['time_per_token_vs_base']:.2f}x {name})  comm wait {r['comm_wait_s_per_step'] * 1e3:.1f} "
              f"ms/step  state {r['optimizer_state_bytes_per_rank']} B/rank  mb {r['micro_batches_last_step']}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for opt, r in summary["runs"].items():
        axes[0].plot(r["tokens_at"], r["loss"], label=opt)
        axes[1].plot(r["seconds_at"], r["loss"], label=opt)
        axes[2].plot([b / 1e6 for b in r["wire_bytes_at"]], r["loss"], label=opt)
    axes[0].set_xlabel("tokens")
    axes[1].set_xlabel("seconds")
    axes[2].set_xlabel("MB sent (all ranks)")
    axes[2].set_xscale("symlog")
    for ax in axes:
        ax.set_ylabel("training loss")
        ax.legend()
    fig.suptitle(f"optim-{a.name}: {a.np} ranks" + (f", {a.netem} link" if a.netem else ""))
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=80)


if __name__ == "__main__":
    main()
