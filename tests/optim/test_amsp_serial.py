"""AMSP on one process: torch's AdamW exactly, and every argument check."""
import pytest
import torch
from _toy import steps_like_torch_adamw, toy_model
from mpi4py import MPI

import mpicomp
from mpicomp.optim import AMSP


def test_one_rank_is_torch_exactly():
    model, ref = toy_model(), toy_model()
    opt = AMSP(model, torch.optim.AdamW, shard=(1, 1, 1), comm=MPI.COMM_SELF, lr=1e-2, weight_decay=0.1)
    steps_like_torch_adamw(model, opt, ref, lr=1e-2, weight_decay=0.1)
    assert torch.equal(opt.full_parameters(), torch.cat([p.detach().reshape(-1) for p in ref.parameters()]))


def tied():
    model = torch.nn.Sequential(torch.nn.Embedding(5, 4), torch.nn.Linear(4, 5, bias=False))
    model[1].weight = model[0].weight
    return model


def frozen():
    model = toy_model()
    model[0].bias.requires_grad_(False)
    return model


@pytest.mark.parametrize("make,match", [
    (lambda: AMSP(toy_model(), torch.optim.AdamW, (1, 1, 1), comm="world"), "intra-communicator"),
    (lambda: AMSP(toy_model().parameters(), torch.optim.AdamW, (1, 1, 1)), "torch.nn.Module"),
    (lambda: AMSP(toy_model(), dict, (1, 1, 1)), "torch.optim.Optimizer subclass"),
    (lambda: AMSP(toy_model(), torch.optim.AdamW, (1, 1, 2)), "larger than the world"),
    (lambda: AMSP(toy_model(), torch.optim.AdamW, (1, 1, 1), ranks_per_node=0), "ranks_per_node"),
    (lambda: AMSP(toy_model(), torch.optim.AdamW, (1, 1, 1), codec={"intra": "none"}), "'intra' and 'inter'"),
    (lambda: AMSP(toy_model(), torch.optim.AdamW, (1, 1, 1), lr=-1.0), "rejected its arguments"),
    (lambda: AMSP(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2).double()), torch.optim.AdamW,
                  (1, 1, 1)), "one dtype"),
    (lambda: AMSP(tied(), torch.optim.AdamW, (1, 1, 1)), "tied weights"),
    (lambda: AMSP(toy_model(), torch.optim.AdamW, (1, 1, 1), prefetch="yes"), "prefetch must be a bool"),
    (lambda: AMSP(frozen(), torch.optim.AdamW, (1, 1, 1)), "does not require grad"),
])
def test_bad_arguments(make, match):
    with pytest.raises(mpicomp.ArgumentError, match=match):
        make()


def test_unknown_or_not_wire_codec():
    with pytest.raises(mpicomp.CodecError):
        AMSP(toy_model(), torch.optim.AdamW, (1, 1, 1), codec="int3")
    with pytest.raises(mpicomp.CodecError, match=r"codec\['inter'\].*allreduce algorithm.*int8"):
        AMSP(toy_model(), torch.optim.AdamW, (1, 1, 1), codec={"intra": "int8", "inter": "powersgd"})

