"""DiLoCo in one process (a single worker): fragment splitting, the schedule, argument
errors, and the local state_dict round trip."""
import pytest
import torch

import mpicomp
from mpicomp.optim import DiLoCo
from mpicomp.optim.diloco import split_fragments


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 2))


@pytest.mark.parametrize("sizes,fragments", [([10] * 7, 3), ([100, 1, 1, 100, 1], 2), ([5, 50, 5, 5], 4),
                                             ([3], 1), ([3], 3), ([1000, 7], 4)])
def test_fragments_are_contiguous_cover_everything_and_balance(sizes, fragments):
    b = split_fragments(sizes, fragments)
    assert b[0] == 0 and b[-1] == sum(sizes) and len(b) == fragments + 1
    parts = [y - x for x, y in zip(b, b[1:])]
    assert min(parts) >= 1 and max(parts) - min(parts) <= 1  # equal, whatever the tensor sizes
    if sizes == [5, 50, 5, 5]:
        assert parts == [16, 16, 16, 17]  # cuts inside the 50-element tensor


def test_fragments_cut_inside_tensors_and_write_back_exactly():
    """Fragment f's flat values are elements [e_f, e_f+1) of the parameters laid end to end,
    and setting a fragment writes exactly those elements back."""
    m = model()
    opt = DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), fragments=4)
    whole = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    b = opt.fragment_bounds
    for f in range(4):
        assert torch.equal(opt._flat_local(f), whole[b[f]:b[f + 1]])
    with torch.no_grad():
        opt.global_params[2].fill_(7.0)
    opt._set_local(2)
    after = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    expected = whole.clone()
    expected[b[2]:b[3]] = 7.0
    assert torch.equal(after, expected)


def test_schedule_staggers_fragments_over_h_steps():
    m = model()
    opt = DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), sync_every=8, fragments=3)
    due = {s: opt.due(s) for s in range(1, 17)}
    assert [s for s, f in due.items() if f] == [2, 5, 8, 10, 13, 16]  # offsets 0, 8//3, 16//3
    assert sorted(f for fs in due.values() for f in fs) == [0, 0, 1, 1, 2, 2]


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(sync_every=0), mpicomp.ArgumentError, "sync_every"),
    (dict(fragments=1000), mpicomp.ArgumentError, "fragments=1000"),
    (dict(outer_lr=-1), mpicomp.ArgumentError, "outer_lr"),
    (dict(codec="int3"), mpicomp.CodecError, "int3"),
    (dict(codec="powersgd"), mpicomp.CodecError, "DiLoCo: codec 'powersgd' is an allreduce algorithm"),
    (dict(outer_optimizer=3), mpicomp.ArgumentError, "outer_optimizer"),
    (dict(comm="world"), mpicomp.ArgumentError, "comm"),
])
def test_bad_arguments(kwargs, error, match):
    m = model()
    with pytest.raises(error, match=match):
        DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), **kwargs)


def test_outer_optimizer_class_instance_or_factory():
    m = model()
    sgd = torch.optim.SGD(m.parameters(), lr=0.1)
    a = DiLoCo(m, sgd, outer_optimizer=torch.optim.Adam, outer_lr=0.3).outer_optimizer
    assert type(a) is torch.optim.Adam and a.param_groups[0]["lr"] == 0.3
    b = DiLoCo(m, sgd, outer_optimizer=torch.optim.Adam([torch.zeros(1)], lr=0.05)).outer_optimizer
    assert b.param_groups[0]["lr"] == 0.05
    c = DiLoCo(m, sgd, outer_optimizer=lambda p: torch.optim.SGD(p, lr=0.5)).outer_optimizer
    assert c.param_groups[0]["lr"] == 0.5


def test_state_dict_round_trip_and_mismatch():
    m = model()
    opt = DiLoCo(m, torch.optim.AdamW(m.parameters(), lr=1e-2), sync_every=2, fragments=2)
    for _ in range(3):
        m(torch.ones(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    state = opt.state_dict()
    m2 = model()
    opt2 = DiLoCo(m2, torch.optim.AdamW(m2.parameters(), lr=1e-2), sync_every=2, fragments=2)
    opt2.load_state_dict(state)
    assert opt2.inner_step == 3 and all(torch.equal(a, b) for a, b in zip(opt.global_params, opt2.global_params))
    other = DiLoCo(m2, torch.optim.AdamW(m2.parameters()), sync_every=2, fragments=1)
    with pytest.raises(mpicomp.CheckpointError, match="fragments=2"):
        other.load_state_dict(state)
