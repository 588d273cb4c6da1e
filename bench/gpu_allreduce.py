#!/usr/bin/env python3
"""Allreduce of GPU tensors, every rank on the same GPU: mpicomp per codec beside the MPI
library's own allreduce of the same data staged through host memory (copy down, MPI_Allreduce,
copy up), in one run. Whether mpicomp kept its wire bytes on the GPU (CUDA-aware MPI) or
staged them through pinned host buffers is recorded as `transport`.

    mpiexec -n 2 python bench/gpu_allreduce.py [-m 1M:1G] [--json bench/results/gpu-allreduce-np2.json]

Latency: a barrier, ITER calls, time per call averaged over ranks (OSU's method); the best of
--rounds rounds, implementations interleaved. --device cpu runs the same on host tensors.
Ranks sharing one GPU: start MPS first (`nvidia-cuda-mps-control -d`), or they take turns on
it and every synchronisation waits for the others' time slices (docs/gpu.md).
"""
import argparse
import time

import torch
from mpi4py import MPI

import mpicomp
from mpicomp import _core
from mpicomp.bench.options import size, size_range
from mpicomp.bench.report import write_json

LOSSY = ["none", "fp16", "bf16", "int8", "int4", "sign"]


def timed(fn, iters, comm, sync):
    fn()
    sync()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return comm.allreduce((time.perf_counter() - t0) / iters, MPI.SUM) / comm.size


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--message-size", dest="sizes", type=size_range, default=size_range("1M:1G"))
    p.add_argument("--codec", default=None, help="comma-separated (default: all lossy, and nvcomp-* where loaded)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--step", type=int, default=2, help="keep every STEP-th power of two of the size range")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--gpu-segment-bytes", type=size, help="mpicomp.config.gpu_segment_bytes for the run (a size, "
                   "e.g. 8M; default: the library's): longer segments, fewer kernel launches and synchronisations")
    p.add_argument("--json")
    a = p.parse_args()
    comm = MPI.COMM_WORLD
    if a.gpu_segment_bytes:
        mpicomp.config.gpu_segment_bytes = a.gpu_segment_bytes
    codecs = a.codec.split(",") if a.codec else LOSSY + [n for n in mpicomp.available_codecs() if n.startswith("nvcomp-")]
    cuda = a.device == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    where = torch.cuda.get_device_name() if cuda else "cpu"
    transport = ("cuda-aware" if _core.mpi_cuda_aware() else "staged") if cuda else "host"
    if comm.rank == 0:
        print(f"# {where}, {comm.size} ranks, mpicomp wire bytes {transport}, gpu_segment_bytes "
              f"{mpicomp.config.gpu_segment_bytes}; latency in ms, speed-up = MPI / mpicomp")
        print(f"# {'bytes':>11} {'MPI staged':>11} " + " ".join(f"{c:>15}" for c in codecs))
    records = []
    for nbytes in a.sizes[::a.step]:
        n = nbytes // 4
        g = torch.Generator().manual_seed(comm.rank)
        x = torch.randn(n, generator=g).to(a.device)
        host = torch.empty(n, pin_memory=cuda)
        total = torch.empty(n, pin_memory=cuda)
        y = torch.empty_like(x)

        def staged():
            host.copy_(x)
            comm.Allreduce(host.numpy(), total.numpy())
            y.copy_(total, non_blocking=True)

        calls = {"mpi-staged": staged}
        calls.update({c: (lambda c=c: mpicomp.allreduce(x, codec=c, out=y)) for c in codecs})
        iters = max(3, min(50, (256 << 20) // nbytes))
        best = {}
        for _ in range(a.rounds):
            for name, fn in calls.items():
                t = timed(fn, iters, comm, sync)
                best[name] = min(best.get(name, t), t)
        for name, t in best.items():
            records.append(dict(device=where, np=comm.size, size=nbytes, impl="mpi" if name == "mpi-staged" else "mpicomp",
                                codec="none" if name == "mpi-staged" else name, transport="staged" if
                                name == "mpi-staged" else transport, latency_ms=t * 1e3,
                                speedup=best["mpi-staged"] / t, iterations=iters,
                                gpu_segment_bytes=mpicomp.config.gpu_segment_bytes))
        if comm.rank == 0:
            print(f"  {nbytes:11d} {best['mpi-staged'] * 1e3:11.3f} " + " ".join(
                f"{best[c] * 1e3:8.3f} {best['mpi-staged'] / best[c]:5.2f}x" for c in codecs), flush=True)
            if a.json:  # after every size: a run its time limit cuts keeps what it measured
                write_json(a.json, records)
        del x, y, host, total
        if cuda:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
