#!/usr/bin/env python3
"""mpicomp's powersgd against torch's own powerSGD_hook, same rank, same gradients.

    mpiexec -n 2 python bench/powersgd_vs_torch.py [--rank 4] [--steps 50] [--json PATH]

Both run inside DistributedDataParallel (gloo) on a model of transformer-like matrices whose
gradients are fixed per rank (the gradient of sum(p * G_rank)), so the exact mean is known
(float64, mpi4py). Reported per implementation: bytes sent per step by each rank for the
compressed gradients, the relative error of one step's mean (max |approx - exact| / max
|exact|), and the error of the mean of all steps' results, which error feedback drives down.
"""
import argparse
import json

import numpy as np
import torch
import torch.distributed as dist
from mpi4py import MPI
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd

import mpicomp
import mpicomp.torch as mt

SHAPES = [(512, 512), (2048, 512), (512, 2048), (512,)]  # attention, MLP up / down, a bias


class Fixed(torch.nn.Module):
    """Parameters whose gradient is G: forward returns sum(p * G)."""

    def __init__(self):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in SHAPES])

    def forward(self, grads):
        return sum((p * g).sum() for p, g in zip(self.ps, grads))


def run(register, grads, exact, steps, skip=2):
    """Errors of step `skip` (torch's hook sends its first steps uncompressed) and of the
    mean of the steps from there on."""
    model = torch.nn.parallel.DistributedDataParallel(Fixed(), bucket_cap_mb=64)
    register(model)
    total = [np.zeros(s) for s in SHAPES]
    first = None
    for step in range(skip + steps):
        model.zero_grad()
        model(grads).backward()
        if step < skip:
            continue
        got = [p.grad.double().numpy() for p in model.module.ps]
        total = [t + g for t, g in zip(total, got)]
        if first is None:
            first = got
    scale = max(np.abs(e).max() for e in exact[:3])
    err = lambda ys: max(np.abs(y - e).max() for y, e in zip(ys[:3], exact[:3])) / scale
    return err(first), err([t / steps for t in total])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rank", type=int, default=4)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--json")
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    mt.init_process_group(comm, "gloo")
    # low-rank-ish gradients, as in training: a few strong directions plus noise
    g = torch.Generator().manual_seed(comm.rank)
    grads = [torch.randn(s[0], 8, generator=g) @ torch.randn(8, s[1], generator=g) + 0.3 * torch.randn(s, generator=g)
             if len(s) == 2 else torch.randn(s, generator=g) for s in SHAPES]
    exact = [comm.allreduce(x.double().numpy()) / comm.size for x in grads]

    def torch_hook(model):
        state = torch_psgd.PowerSGDState(process_group=None, matrix_approximation_rank=a.rank,
                                         start_powerSGD_iter=2, min_compression_rate=2, use_error_feedback=True,
                                         warm_start=True, orthogonalization_epsilon=1e-8)
        model.register_comm_hook(state, torch_psgd.powerSGD_hook)

    def ours(model):
        model.register_comm_hook(*mt.ddp_hook(codec=f"powersgd:rank={a.rank}", comm=comm, error_feedback=True))

    c = mpicomp.codec("powersgd", rank=a.rank)
    raw = sum(int(np.prod(s)) * 4 for s in SHAPES)
    factors = sum(c.encoded_bytes(0, shape=s) for s in SHAPES)  # the same formula as torch's hook
    records = []
    for name, register in (("torch powerSGD_hook", torch_hook), ("mpicomp powersgd", ours)):
        one, mean = run(register, grads, exact, a.steps)
        records.append(dict(impl=name, rank=a.rank, np=comm.size, steps=a.steps, bytes_per_step=factors,
                            uncompressed_bytes=raw, one_step_rel_error=one, mean_rel_error=mean))
    if comm.rank == 0:
        print(f"# PowerSGD rank {a.rank}, {comm.size} ranks, {a.steps} steps, matrices {SHAPES[:3]} + a bias")
        print(f"# {'implementation':<22}{'bytes/step':>12}{'ratio':>8}{'1-step err':>12}{'mean err':>12}")
        for r in records:
            print(f"  {r['impl']:<22}{r['bytes_per_step']:>12}{raw / r['bytes_per_step']:>8.1f}"
                  f"{r['one_step_rel_error']:>12.4f}{r['mean_rel_error']:>12.5f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(records, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
