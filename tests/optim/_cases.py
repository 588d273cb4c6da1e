"""Each optimizer set up over a communicator, and one training step of it on the toy problem:
what the stall tests (tests/optim/mpi/test_stalls.py) and the fault tests (tests/faults) run."""
import torch
from _toy import loss_of, toy_batch

from mpicomp.optim import ACCO, AMSP, DiLoCo, ZeRO1


def closure_for(model, rank, step):
    def closure():
        loss = loss_of(model, toy_batch(rank, step))
        loss.backward()
        return loss
    return closure


def backward_then_step(opt, model, rank, step):
    opt.zero_grad()
    closure_for(model, rank, step)()
    opt.step()


def acco_step(opt, model, rank, step):
    opt.step(closure_for(model, rank, step))


def _diloco(overlap):
    return lambda m, c, **kw: DiLoCo(m, torch.optim.SGD(m.parameters(), lr=0.1), comm=c, sync_every=1, codec="int8",
                                     overlap=overlap, **kw)


# name: (make(model, comm, **more arguments) -> optimizer, step(optimizer, model, rank, step index))
CASES = {
    "zero1": (lambda m, c, **kw: ZeRO1(m.parameters(), torch.optim.AdamW, comm=c, grad_codec="int8", **kw),
              backward_then_step),
    "acco": (lambda m, c, **kw: ACCO(m.parameters(), torch.optim.AdamW, comm=c, grad_codec="int8", **kw), acco_step),
    "amsp": (lambda m, c, **kw: AMSP(m, torch.optim.AdamW, shard=(1, c.Get_size(), c.Get_size()), comm=c,
                                     codec="int8", **kw),
             backward_then_step),
    "diloco": (_diloco(False), backward_then_step),
    "diloco-overlap": (_diloco(True), backward_then_step),
}
