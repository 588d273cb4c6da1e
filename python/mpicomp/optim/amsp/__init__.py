"""AMSP (Chen et al., arXiv 2311.00257): parameters, gradients and optimizer states sharded
over their own groups (s_p, s_g, s_os), the planner that picks them, and the optimizer.

    from mpicomp.optim import AMSP, amsp
    p = amsp.plan(num_params=7_000_000_000, world_size=64, ranks_per_node=8, memory_per_rank=80e9, ...)
    print(p.explain())
    opt = AMSP(model, torch.optim.AdamW, shard=p.shard, comm=mesh.dp, lr=3e-4)
"""

from .optimizer import AMSP
from .groups import Groups, check_partition, valid_partitions
from .plan import Candidate, bandwidth_from_bench, Collective, Plan, PlanError, communication_plan, memory_bytes, plan

__all__ = ["AMSP", "plan", "Plan", "Candidate", "Collective", "PlanError", "memory_bytes", "communication_plan",
           "bandwidth_from_bench", "valid_partitions", "check_partition", "Groups"]
