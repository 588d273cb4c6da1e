"""Mesh under mpiexec: coordinates, sub-communicators and torch process groups against the
documented layout rank = (pp_rank * dp + dp_rank) * tp + tp_rank, at any world size."""
import pytest
import torch
from mpi4py import MPI

import mpicomp
from mpicomp.torch import Mesh

WORLD = MPI.COMM_WORLD
N = WORLD.Get_size()


def shapes():
    """Every (dp, tp, pp) whose product is the world size."""
    return [(d, t, N // (d * t)) for d in range(1, N + 1) for t in range(1, N + 1) if N % (d * t) == 0]


@pytest.mark.parametrize("dp,tp,pp", shapes())
def test_layout_and_groups(dp, tp, pp):
    mesh = Mesh(dp=dp, tp=tp, pp=pp)
    r = WORLD.Get_rank()
    assert r == (mesh.pp_rank * dp + mesh.dp_rank) * tp + mesh.tp_rank
    assert (mesh.dp_size, mesh.tp_size, mesh.pp_size) == (dp, tp, pp)
    everyone = WORLD.allgather((mesh.dp_rank, mesh.tp_rank, mesh.pp_rank))
    for dim, idx in (("dp", 0), ("tp", 1), ("pp", 2)):
        comm = getattr(mesh, dim)
        assert comm.Get_rank() == everyone[r][idx]
        # the group's members as world ranks, in the group's order, exchanged over the group
        members = comm.allgather(r)
        others = [i for i in range(3) if i != idx]
        expected = sorted((q for q in range(N) if all(everyone[q][i] == everyone[r][i] for i in others)),
                          key=lambda q: everyone[q][idx])
        assert members == expected == mesh.group_ranks(dim)


def test_none_takes_the_rest():
    mesh = Mesh(tp=N)
    assert (mesh.dp_size, mesh.tp_size, mesh.pp_size) == (1, N, 1)


def test_bad_sizes_raise_on_every_rank():
    with pytest.raises(mpicomp.ArgumentError, match=rf"dp \* tp \* pp = dp={N + 1} x tp=1 x pp=1 = {N + 1}"):
        Mesh(dp=N + 1)
    WORLD.Barrier()  # still usable: nothing was left half-split


def test_torch_groups_match(gloo):
    mesh = Mesh(dp=1, tp=N, pp=1)
    for dim in ("dp", "tp", "pp"):
        g = mesh.torch_group(dim)
        assert gloo.get_process_group_ranks(g) == mesh.group_ranks(dim)
        t = torch.tensor([float(WORLD.Get_rank())])
        gloo.all_reduce(t, group=g)
        assert t.item() == sum(mesh.group_ranks(dim))
