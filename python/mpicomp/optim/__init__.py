"""Communication-efficient optimizers over mpicomp's compressed collectives (layer 5):

    from mpicomp.optim import DiLoCo
    opt = DiLoCo(model, torch.optim.AdamW(model.parameters(), lr=4e-4), comm=mesh.dp, sync_every=500)
"""

from .diloco import DiLoCo

__all__ = ["DiLoCo"]
