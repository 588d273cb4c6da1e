# .venv/bin/mpiexec -n 2 .venv/bin/python examples/quickstart.py   (any number of ranks)
import numpy as np
from mpi4py import MPI

import mpicomp

comm = MPI.COMM_WORLD
x = np.random.default_rng(comm.rank).standard_normal(1 << 20).astype(np.float32)  # 4 MiB per rank

y = mpicomp.allreduce(x, comm=comm, codec="int8", op="avg")  # int8 on the wire, float32 out
exact = np.empty(x.size)                                      # float64 reference
comm.Allreduce(x.astype(np.float64), exact)
exact /= comm.size

s = mpicomp.stats()["allreduce"]  # what was compressed, and why not where it was not
if comm.rank == 0:
    print(f"{comm.size} ranks: int8 max error {np.abs(y - exact).max():.2e}; {s['compressed']} of {s['calls']} "
          f"calls compressed, {s['bytes_wire']} bytes sent instead of {s['bytes_plain']}; not compressed: {s['skipped']}")
    if comm.size == 1:
        print("one rank: nothing travels; start it under mpiexec (first line)")
