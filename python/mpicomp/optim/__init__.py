"""Communication-efficient optimizers on mpicomp's compressed collectives (layer 5; imports
torch, which ``import mpicomp`` does not):

    from mpicomp.optim import ZeRO1, ACCO, DiLoCo, AMSP, amsp
    opt = ZeRO1(model.parameters(), torch.optim.AdamW, comm=mesh.dp, lr=3e-4)
    opt = ACCO(model.parameters(), torch.optim.AdamW, comm=mesh.dp, lr=3e-4)
    loss = opt.step(closure)      # ACCO: closure() runs one micro-batch forward + backward
    opt = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=4e-4), comm=mesh.dp, sync_every=500)
    opt = AMSP(model, torch.optim.AdamW, shard=amsp.plan(...).shard, comm=mesh.dp, lr=3e-4)
"""

from ..errors import CheckpointError, RankFailedError  # also here, beside the optimizers that raise them
from . import amsp
from .acco import ACCO
from .amsp import AMSP
from .diloco import DiLoCo
from .zero1 import ZeRO1

__all__ = ["ZeRO1", "ACCO", "DiLoCo", "AMSP", "amsp", "CheckpointError", "RankFailedError"]
