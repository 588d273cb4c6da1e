"""AMSP's checkpoints, in the format of ZeRO1's (_sharded.py): the whole, unpadded fp32
master vector and the wrapped optimizer's elementwise state in ``model.parameters()``
order, scalars as they are, and a checksum. So a checkpoint loads under any partition, any
number of ranks, and into ZeRO1 (one param group) and back.

Every rank holds one optimizer-state shard; the ranks of the first optimizer-state group
(0 .. s_os - 1) hold them all. Each unit's part of the whole vector is the unit's slice of
shards 0, 1, ..., s_os - 1 in turn, minus the padding.
"""

import numpy as np
import torch

from ...errors import MpicompError
from ..._agree import agree
from .._checkpoint import FORMAT, check_checkpoint, checksum
from .groups import Groups

__all__ = ["state_dict", "load_state_dict"]


def _owners(opt):
    """owners[o]: a rank holding optimizer-state shard o."""
    s_os, world = opt.shard[2], opt.comm.Get_size()
    owners = [0] * s_os
    for r in range(s_os):
        owners[Groups(opt.shard, world, r).index["os"]] = r
    return owners


def _whole(opt, shard_vector):
    """The unpadded whole vector (fp32, CPU) from every rank's shard-sized piece, exactly."""
    local = shard_vector.detach().to("cpu", torch.float32).contiguous().numpy()
    rows = np.empty((opt.comm.Get_size(), local.size), np.float32)
    opt._meta.Allgather(local, rows)
    owners = _owners(opt)
    pieces = [np.concatenate([rows[r, opt._os_at[i]:opt._os_at[i + 1]] for r in owners])[:u.numel]
              for i, u in enumerate(opt.units)]
    return torch.from_numpy(np.concatenate(pieces))


def _slices(opt, whole, parts, index):
    """This rank's shard (of ``parts``, number ``index``) of the unpadded whole vector."""
    out, at = [], 0
    for u in opt.units:
        padded = torch.zeros(u.padded, dtype=torch.float32)
        padded[:u.numel] = whole[at:at + u.numel]
        at += u.numel
        k = u.padded // parts
        out.append(padded[index * k:(index + 1) * k])
    return torch.cat(out)


def state_dict(opt):
    """Collective over comm: the same dict on every rank."""
    state = opt.inner.state.get(opt.master, {})
    group_state = {}
    for key in sorted(state):
        value = state[key]
        if torch.is_tensor(value) and value.dim() and tuple(value.shape) == tuple(opt.master.shape):
            group_state[key] = _whole(opt, value)
        else:  # equal on every rank (every shard takes the same steps)
            group_state[key] = value.clone() if torch.is_tensor(value) else value
    params = [p for u in opt.units for p in u.params]
    sd = {"format": FORMAT, "kind": "AMSP",
          "optimizer": f"{opt.optimizer_class.__module__}.{opt.optimizer_class.__qualname__}",
          "shapes": [[list(p.shape) for p in params]],
          "param_groups": [{k: v for k, v in opt.param_groups[0].items() if k != "params"}],
          "master": _whole(opt, opt.master), "state": [group_state]}
    sd["checksum"] = checksum(sd)
    return sd


def load_state_dict(opt, sd):
    """Collective over comm; raises on every rank when any rank's checkpoint is bad."""
    params = [p for u in opt.units for p in u.params]
    error = None
    try:
        check_checkpoint(sd, opt.optimizer_class, [[list(p.shape) for p in params]], sum(u.numel for u in opt.units))
    except MpicompError as e:
        error = e
    agree([opt._meta], "AMSP.load_state_dict", error, None if error else sd["checksum"],
          lambda c: f"a checkpoint with checksum {c}")
    s_p, _, s_os = opt.shard
    dev = opt.master.device
    opt._drain()  # no prefetch may read the parameter shard while it changes
    with torch.no_grad():
        opt.master.copy_(_slices(opt, sd["master"], s_os, opt.groups.index["os"]))
        opt.p_shard.copy_(_slices(opt, sd["master"], s_p, opt.groups.index["param"]))
    restored = {}
    for key, value in sd["state"][0].items():
        if torch.is_tensor(value) and value.dim() == 1 and value.numel() == sd["master"].numel():
            restored[key] = _slices(opt, value, s_os, opt.groups.index["os"]).to(dev).clone()
        else:
            restored[key] = value.clone() if torch.is_tensor(value) else value
    if restored:
        opt.inner.state[opt.master] = restored
    else:
        opt.inner.state.pop(opt.master, None)
    opt.param_groups[0].update(sd["param_groups"][0])
    opt.inner.param_groups[0].update(sd["param_groups"][0])
