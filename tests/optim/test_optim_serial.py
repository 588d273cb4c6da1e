"""mpicomp.optim on one process (COMM_SELF / a singleton COMM_WORLD): argument checks, the
shard layout, and equality with torch's own optimizer when there is nothing to share."""
import subprocess
import sys

import pytest
import torch
from _toy import steps_like_torch_adamw, toy_model
from mpi4py import MPI

import mpicomp
from mpicomp.optim import ACCO, ZeRO1
from mpicomp.optim._sharded import Layout


def test_import_mpicomp_stays_torch_free():
    code = "import sys, mpicomp; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7])
def test_layout_covers_every_element_once(size):
    sizes = [[35, 7], [21, 3, 1]]  # 67 elements in two groups
    groups = [[torch.zeros(n) for n in g] for g in sizes]
    covered = []
    for rank in range(size):
        lay = Layout(groups, size, rank)
        assert lay.padded % size == 0 and lay.padded - lay.numel < size and lay.hi - lay.lo == lay.shard
        for (a, b), (sa, sb) in zip(lay.group_ranges, lay.segments):
            covered += range(lay.lo + sa, lay.lo + sb)
            assert sa <= sb and (sa == sb or a <= lay.lo + sa < lay.lo + sb <= b)
    assert sorted(covered) == list(range(67))


def test_one_rank_is_torch_exactly():
    model, ref = toy_model(), toy_model()
    opt = ZeRO1(model.parameters(), torch.optim.AdamW, comm=MPI.COMM_SELF, lr=1e-2, weight_decay=0.1)
    steps_like_torch_adamw(model, opt, ref, lr=1e-2, weight_decay=0.1)


@pytest.mark.parametrize("make,match", [
    (lambda: ZeRO1(toy_model().parameters(), torch.optim.AdamW, comm="world"), "intra-communicator"),
    (lambda: ZeRO1([], torch.optim.AdamW), "empty"),
    (lambda: ZeRO1(toy_model().parameters(), dict), "torch.optim.Optimizer subclass"),
    (lambda: ZeRO1(torch.zeros(3), torch.optim.AdamW), "one tensor"),
    (lambda: ZeRO1([torch.zeros(3, dtype=torch.int64)], torch.optim.SGD, lr=0.1), "floating-point"),
    (lambda: ZeRO1(toy_model().parameters(), torch.optim.AdamW, lr=-1.0), "rejected its arguments"),
    (lambda: ZeRO1(toy_model().parameters(), torch.optim.AdamW, error_feedback=1), "error_feedback"),
    (lambda: ACCO(toy_model().parameters(), torch.optim.AdamW, min_micro_batches=0), "min_micro_batches"),
    (lambda: ACCO(toy_model().parameters(), torch.optim.AdamW, min_micro_batches=3, max_micro_batches=2),
     "max_micro_batches"),
])
def test_bad_arguments(make, match):
    with pytest.raises(mpicomp.ArgumentError, match=match):
        make()


def test_unknown_codec():
    with pytest.raises(mpicomp.CodecError):
        ZeRO1(toy_model().parameters(), torch.optim.AdamW, grad_codec="int3")


def test_acco_step_needs_a_closure():
    opt = ACCO(toy_model().parameters(), torch.optim.AdamW)
    with pytest.raises(mpicomp.ArgumentError, match="closure"):
        opt.step()
