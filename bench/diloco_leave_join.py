#!/usr/bin/env python3
"""DiLoCo through workers leaving and joining: 4 workers train, one is killed (SIGKILL) mid-run
and the MPI job ends, as it does under MPI; training resumes from the last checkpoint with 3
workers, and later with 4 again. The loss curve across the kill and the restarts goes to
bench/results/diloco-leave-join.{json,png}.

    bench/diloco_leave_join.py [--steps 600] [--sync-every 50] [--kill-at 260] [--rejoin-at 420]

Each phase is one mpiexec of this script with --phase; the model (examples/train_gpt.py's
GPT), data and DiLoCo settings are bench/diloco_compare.py's. A checkpoint is written after
every outer step (atomically); the batches are a pure function of (step, rank), so the
checkpoint's data position is the step. What a restart loses: the inner steps since the last
outer step.
"""
import argparse
import json
import os
import signal
import sys
import tempfile

from _driver import ROOT, add_gpt_flags, gpt_flags, launch, write


def phase(args):
    import torch
    from mpi4py import MPI

    sys.path.insert(0, str(ROOT / "bench"))
    from diloco_compare import batch, cross_entropy, gpt, load_corpus  # noqa: E402

    from mpicomp.optim import DiLoCo

    world = MPI.COMM_WORLD
    torch.set_num_threads(1)
    data = load_corpus(4_000_000)  # diloco_compare.py's training bytes
    net = gpt(args)
    opt = DiLoCo(net, torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.1), comm=world,
                 sync_every=args.sync_every)
    start = opt.load(args.checkpoint) if os.path.exists(args.checkpoint) else 0
    log = []
    for step in range(start, args.stop):
        if step == args.kill_at and world.Get_rank() == world.Get_size() - 1:
            os.kill(os.getpid(), signal.SIGKILL)  # a worker dies; MPI ends the job
        x, y = batch(data, args, step, world.Get_rank())
        opt.zero_grad()
        loss = cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        mean = world.allreduce(loss.item()) / world.Get_size()
        log.append({"step": step + 1, "loss": mean, "workers": world.Get_size()})
        if opt.inner_step % args.sync_every == 0:
            opt.save(args.checkpoint, data_position=step + 1)
            if world.Get_rank() == 0:  # what survives a kill: the log up to the checkpoint
                with open(args.log, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in log)
                log = []


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600, help="training steps in all, across the phases")
    p.add_argument("--sync-every", type=int, default=50, help="DiLoCo's H: inner steps between outer syncs")
    p.add_argument("--kill-at", type=int, default=260, help="step at which the last of 4 workers is killed")
    p.add_argument("--rejoin-at", type=int, default=420, help="step at which 3 workers stop and 4 resume")
    add_gpt_flags(p)
    p.add_argument("--phase", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--stop", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--checkpoint", default=None, help=argparse.SUPPRESS)
    p.add_argument("--log", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase:
        return phase(args)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, log = os.path.join(tmp, "diloco.pt"), os.path.join(tmp, "log.jsonl")
        runs = [(4, args.steps, args.kill_at), (3, args.rejoin_at, -1), (4, args.steps, -1)]
        for n, stop, kill in runs:
            what = f"{n} workers until step {stop}{f', one killed at {kill}' if kill >= 0 else ''}"
            r = launch(n, [sys.executable, __file__, "--phase", "--stop", stop, "--kill-at", kill, "--checkpoint", ckpt,
                           "--log", log, "--sync-every", args.sync_every, *gpt_flags(args)], what,
                       expect=lambda code: (code == 0) == (kill < 0), echo=False)
            print(f"# {what}: exit code {r.returncode}", flush=True)
        rows = [json.loads(line) for line in open(log)]
    losses = [r["loss"] for r in rows]
    noise = sorted(abs(a - b) for a, b in zip(losses, losses[1:]))
    restarts = [i for i in range(1, len(rows)) if rows[i]["workers"] != rows[i - 1]["workers"]]
    jumps = [abs(losses[i] - losses[i - 1]) for i in restarts]
    summary = {"command": " ".join(sys.argv), "steps": [r["step"] for r in rows], "loss": losses,
               "workers": [r["workers"] for r in rows], "restart_steps": [rows[i]["step"] for i in restarts],
               "jump_at_restarts": jumps, "step_to_step_p90": noise[int(0.9 * len(noise))]}
    out = write("diloco-leave-join", summary)
    print(f"restarts at steps {summary['restart_steps']}: loss jumps {[round(j, 4) for j in jumps]}, "
          f"step-to-step change p90 {summary['step_to_step_p90']:.4f}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(summary["steps"], losses, lw=0.8)
    for s, w in zip(summary["restart_steps"], [rows[i]["workers"] for i in restarts]):
        ax.axvline(s, color="grey", ls="--")
        ax.text(s, max(losses), f" {w} workers", va="top")
    ax.set_xlabel("inner step")
    ax.set_ylabel("training loss (mean over workers)")
    ax.set_title(f"DiLoCo H={args.sync_every}: 4 workers, one killed at step {args.kill_at}, 3 resume, 4 from "
                 f"{args.rejoin_at}")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=80)


if __name__ == "__main__":
    main()
