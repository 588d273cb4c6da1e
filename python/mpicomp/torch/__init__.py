"""mpicomp for PyTorch: a DP x TP x PP mesh over MPI, a compressed DDP communication hook,
compressed tensor- and pipeline-parallel layers, and the policy that picks a codec for each
(hybrid compression, Xu et al., arXiv 2409.02423). Imported explicitly:

    import mpicomp.torch as mt
    mesh = mt.Mesh(dp=2, tp=2, pp=1)
    policy = mt.Policy.preset("hybrid")
    state, hook = mt.ddp_hook(codec=policy.codec("dp", "gradients"), comm=mesh.dp)

Importing it also registers the torch.distributed backend "mpicomp" (backend.py):
``torch.distributed.init_process_group("mpicomp")`` under mpiexec, for unmodified scripts,
with rank, size and store from MPI. Other backends' rendezvous stay torch's own unless
``rendezvous_from_mpi()`` is called.
"""

from .backend import ProcessGroupMpicomp
from .options import BackendOptions, backend_options
from .rendezvous import init_process_group, rendezvous_from_mpi
from .ddp import DDPHookState, GradientReducer, allreduce_gradients, compressed_allreduce_hook, ddp_hook
from .mesh import Mesh
from .pipeline import GPipe
from .policy import Policy
from .tensor_parallel import (ColumnParallelLinear, RowParallelLinear, copy_to_tensor_parallel,
                              reduce_from_tensor_parallel)
from .traffic import Traffic, traffic

__all__ = [
    "Mesh", "Policy", "init_process_group", "rendezvous_from_mpi", "BackendOptions", "backend_options", "ProcessGroupMpicomp",
    "ddp_hook", "DDPHookState", "compressed_allreduce_hook", "GradientReducer", "allreduce_gradients",
    "ColumnParallelLinear", "RowParallelLinear", "copy_to_tensor_parallel", "reduce_from_tensor_parallel",
    "GPipe", "Traffic", "traffic",
]
