"""mpicomp.torch.init_process_group under mpiexec: torch's ranks are the communicator's, a
gloo collective agrees with MPI's, and a second initialisation fails on every rank."""
import pytest
import torch
from mpi4py import MPI

import mpicomp
import mpicomp.torch as mt

WORLD = MPI.COMM_WORLD


def test_ranks_follow_the_communicator_and_gloo_sums_like_mpi(gloo):
    assert (gloo.get_rank(), gloo.get_world_size()) == (WORLD.Get_rank(), WORLD.Get_size())
    x = torch.arange(5, dtype=torch.float64) * (WORLD.Get_rank() + 1)
    expected = WORLD.allreduce(x.numpy(), op=MPI.SUM)
    gloo.all_reduce(x)
    assert torch.equal(x, torch.from_numpy(expected))


def test_second_initialisation_raises_on_every_rank(gloo):
    with pytest.raises(mpicomp.ArgumentError, match="already initialised"):
        mt.init_process_group(WORLD)
