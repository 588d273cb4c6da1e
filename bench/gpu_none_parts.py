"""Where an uncompressed allreduce of GPU tensors spends its time, every rank on the same GPU:
MPI's allreduce of host arrays (pageable, and pinned as the staging is), mpicomp's `none` on
host arrays (MPI's allreduce after the agreement), the staged MPI allreduce a user would
write (copy down, MPI_Allreduce, copy up without waiting: the next use on the stream waits),
mpicomp's `none` on GPU tensors (the same, the copy up waited for: the call returns with the
result in place), and each copy alone. Milliseconds, the best of 2 batches, rank 0 prints.
    mpiexec -n 4 python bench/gpu_none_parts.py [-m 1M:16M]
"""
import argparse
import time

import numpy as np
import torch
from mpi4py import MPI

import mpicomp
from mpicomp.bench.options import size_range


def timed(f, k, comm):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(k):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / k * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--message-size", dest="sizes", type=size_range, default=size_range("1M:16M"))
    a = p.parse_args()
    w = MPI.COMM_WORLD
    for nbytes in a.sizes[::2]:
        n = nbytes // 4
        xh, yh = np.ones(n, np.float32), np.empty(n, np.float32)
        xg = torch.ones(n, device="cuda")
        yg = torch.empty_like(xg)
        ph, pt = torch.empty(n, pin_memory=True), torch.empty(n, pin_memory=True)

        def staged():
            ph.copy_(xg)
            w.Allreduce(ph.numpy(), pt.numpy())
            yg.copy_(pt, non_blocking=True)

        parts = {"host MPI": lambda: w.Allreduce(xh, yh),
                 "host pinned MPI": lambda: w.Allreduce(ph.numpy(), pt.numpy()),
                 "host mpicomp none": lambda: mpicomp.allreduce(xh, comm=w, codec="none", out=yh),
                 "GPU staged MPI": staged,
                 "GPU mpicomp none": lambda: mpicomp.allreduce(xg, comm=w, codec="none", out=yg),
                 "copy down": lambda: ph.copy_(xg), "copy up": lambda: yg.copy_(pt)}
        k = max(5, min(50, (64 << 20) // nbytes))
        best = {name: min(timed(f, k, w) for _ in range(2)) for name, f in parts.items()}
        if w.rank == 0:
            print(f"{nbytes:>10} " + "  ".join(f"{name} {t:.3f}" for name, t in best.items()), flush=True)


if __name__ == "__main__":
    main()
