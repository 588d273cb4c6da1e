#!/usr/bin/env python3
"""DDP's overlap of gradient communication with the backward pass, with mpicomp's hook started
on its worker (overlap, the default) against the hook that allreduces inside itself
(blocking), the "mpicomp" torch backend with the same codec, and gloo without compression:
time per step and loss, each run after the other in one invocation. Writes
bench/results/ddp-overlap-NAME.{json,md}.

    bench/ddp_overlap.py NAME [--np 2] [--netem 1gbit [--burst 128K]] [--codec int8] [--bucket-mb 1] [--repeat 1]
                         -- MODEL_FLAGS...

--repeat R runs the four modes R times, each time starting one further along (gloo first, then
the blocking hook first, ...), and reports each one's median run: on the emulated link runs
of one mode scatter by up to 15%, more than the differences measured.

MODEL_FLAGS: examples/torch_distributed.py's model and data flags (--width, --layers,
--heads, --context, --batch, --steps, --lr). Every rank computes on one thread, so a step's
backward compute can hide the buckets' communication only if the communication waits rather
than computes. Time per step: the median over the steps after the first 5 (rank 0's clock).
"""
import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from _driver import ROOT, median_ms, netem, parse, run_json, write

MODES = ("gloo", "hook-blocking", "hook", "backend")


def worker(argv):
    """One training run, under mpiexec: --run MODE --codec C --bucket-mb B --json PATH + model flags."""
    p = argparse.ArgumentParser()
    p.add_argument("--run", choices=MODES)
    p.add_argument("--codec")
    p.add_argument("--bucket-mb", type=float)
    p.add_argument("--json")
    for name, kind, default in (("width", int, 128), ("layers", int, 2), ("heads", int, 4), ("context", int, 64),
                                ("batch", int, 16), ("steps", int, 30), ("lr", float, 1e-3)):
        p.add_argument(f"--{name}", type=kind, default=default)
    a = p.parse_args(argv)
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import mpicomp
    import mpicomp.torch as mt

    sys.path.insert(0, str(ROOT / "examples"))
    from torch_distributed import ByteLM
    from train_gpt import load_corpus

    torch.set_num_threads(1)
    if a.run == "backend":
        os.environ.update(MPICOMP_CODEC=a.codec, MPICOMP_ERROR_FEEDBACK="1")
    mt.init_process_group(backend="mpicomp" if a.run == "backend" else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(ByteLM(a.width, a.layers, a.heads, a.context),
                                                      bucket_cap_mb=a.bucket_mb)
    if a.run.startswith("hook"):
        model.register_comm_hook(*mt.ddp_hook(codec=a.codec, comm=mpicomp.MPI.COMM_WORLD, error_feedback=True,
                                              overlap=a.run == "hook"))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    data = load_corpus(2_000_000)
    losses, seconds = [], []
    for step in range(a.steps):
        rng = np.random.default_rng([step, rank])
        rows = np.stack([data[s:s + a.context + 1] for s in rng.integers(0, data.size - a.context - 1, a.batch)])
        batch = torch.from_numpy(rows.astype(np.int64))
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(batch[:, :-1]).reshape(-1, 256), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        seconds.append((time.perf_counter() - t0, t1 - t0, t2 - t1))
        losses.append(mpicomp.MPI.COMM_WORLD.allreduce(loss.item()) / dist.get_world_size())
    if rank == 0:
        params = sum(p.numel() for p in model.parameters())
        Path(a.json).write_text(json.dumps({"losses": losses, "step_seconds": seconds, "parameters": params}))
    del model, opt
    dist.destroy_process_group()


def run(a, mode, flags, tmp):
    log = Path(tmp) / f"{mode}.json"
    out = run_json(a.np, [sys.executable, __file__, "--run", mode, "--codec", a.codec, "--bucket-mb", a.bucket_mb,
                          "--json", log, *flags], log, mode, link=netem(a.netem, burst=a.burst))
    for i, key in enumerate(("ms_per_step", "forward_ms", "backward_ms")):
        out[key] = median_ms([s[i] for s in out["step_seconds"]])
    return out


def main():
    if "--run" in sys.argv:
        return worker(sys.argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("name", help="results go to bench/results/ddp-overlap-NAME.{json,md}")
    p.add_argument("--np", type=int, default=2, help="ranks")
    p.add_argument("--netem", default=None, help="emulated link rate, e.g. 1gbit (needs root)")
    p.add_argument("--burst", default=None, help="the emulated link's token bucket (bench/netem --burst), e.g. 128K: "
                   "the default refills in the backward pass's pauses and then sends at loopback speed, which "
                   "a real card does not, and which only the hook that pauses (blocking) gains from")
    p.add_argument("--codec", default="int8", help="the hook's and the backend's codec")
    p.add_argument("--bucket-mb", type=float, default=1.0, help="DDP's bucket_cap_mb: several buckets to overlap")
    p.add_argument("--repeat", type=int, default=1, help="runs of each mode, in rotated order; each mode's median "
                   "run is reported")
    a, flags = parse(p)
    every = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeat):
            for mode in MODES[i % len(MODES):] + MODES[:i % len(MODES)]:
                every[mode].append(run(a, mode, flags, tmp))
    runs = {m: sorted(rs, key=lambda r: r["ms_per_step"])[len(rs) // 2] for m, rs in every.items()}
    gloo, blocking = runs["gloo"]["ms_per_step"], runs["hook-blocking"]["ms_per_step"]
    rows = [dict(mode=m, ms=r["ms_per_step"], forward_ms=r["forward_ms"], backward_ms=r["backward_ms"],
                 vs_gloo=gloo / r["ms_per_step"], vs_blocking=blocking / r["ms_per_step"], final_loss=r["losses"][-1],
                 ms_runs=[x["ms_per_step"] for x in every[m]])
            for m, r in runs.items()]
    summary = {"command": " ".join(sys.argv), "np": a.np, "netem": a.netem, "burst": a.burst, "codec": a.codec,
               "bucket_mb": a.bucket_mb, "flags": flags, "parameters": runs["gloo"]["parameters"], "runs": rows,
               "losses": {m: r["losses"] for m, r in runs.items()}}
    lines = [f"`{summary['command']}` ({summary['parameters']} parameters)", "",
             "| DDP with | ms/step | forward ms | backward ms (with DDP's wait) | speed-up over gloo | over the "
             "blocking hook | final loss | ms/step of each run |", "|---|---|---|---|---|---|---|---|"]
    names = {"gloo": "gloo, no hook", "hook-blocking": f"mpicomp hook {a.codec}, blocking",
             "hook": f"mpicomp hook {a.codec}, overlapped", "backend": f"mpicomp backend {a.codec}"}
    for r in rows:
        lines.append(f"| {names[r['mode']]} | {r['ms']:.1f} | {r['forward_ms']:.1f} | {r['backward_ms']:.1f} | "
                     f"{r['vs_gloo']:.2f}x | {r['vs_blocking']:.2f}x | {r['final_loss']:.4f} | "
                     f"{', '.join(f'{ms:.1f}' for ms in r['ms_runs'])} |")
    write(f"ddp-overlap-{a.name}", summary, lines)


if __name__ == "__main__":
    main()
