"""Run by tests/test_damaged_frames.py under mpiexec with damage/shim.c preloaded: rank
DAMAGE_RANK's first stage message of a lossless codec (argv[2]) arrives as 0xFF bytes. Every rank must raise
CodecError (none may return the damaged result or wait forever), and the next call on the
same communicator must be right."""
import sys

import numpy as np
from mpi4py import MPI

import mpicomp

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
coll, codec = sys.argv[1], sys.argv[2]
mpicomp.config.min_bytes = 0
mpicomp.config.eager_bytes = 0  # no data riding inside the agreement: the stages carry it
x = np.zeros(size * 40_000, np.float32)  # compressible: lz4 sends frames, not stored chunks
x[rank::97] = rank + 1
call = {"allreduce": mpicomp.allreduce, "reduce_scatter": mpicomp.reduce_scatter,
        "allgather": mpicomp.allgather}[coll]
try:
    call(x, codec=codec)
    outcome = "returned"
except mpicomp.CodecError as e:
    outcome = "CodecError: " + str(e)
want = {"allreduce": lambda: comm.allreduce(x.astype(np.float64)),
        "reduce_scatter": lambda: comm.allreduce(x.astype(np.float64)).reshape(size, -1)[rank],
        "allgather": lambda: np.concatenate(comm.allgather(x))}[coll]()
again = call(x, codec=codec)  # the damage was one message: this call is whole
lines = comm.gather(f"rank {rank}: {outcome} | next call right: {np.array_equal(again, want)}")
if rank == 0:
    print("\n".join(lines), flush=True)
