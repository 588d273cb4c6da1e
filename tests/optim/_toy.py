"""The toy problem of the optimizer tests: a small MLP whose parameter count (73) divides by
none of 2, 3, 4 ranks, and batches that are a pure function of (rank, index), so every rank
can compute every other rank's gradients for a single-process reference."""
import torch
import torch.nn.functional as F


def toy_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))


def toy_batch(rank, index, rows=8):
    g = torch.Generator().manual_seed(7919 * rank + index)
    x = torch.randn(rows, 6, generator=g)
    return x, torch.sin(2 * x[:, :3]) + 0.05 * torch.randn(rows, 3, generator=g)


def loss_of(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def mean_gradient(model, batches):
    """Sets model's .grad to the mean of the gradients of the given batches."""
    grads = None
    for b in batches:
        model.zero_grad(set_to_none=True)
        loss_of(model, b).backward()
        g = [p.grad.clone() for p in model.parameters()]
        grads = g if grads is None else [a + c for a, c in zip(grads, g)]
    for p, g in zip(model.parameters(), grads):
        p.grad = g / len(batches)


def steps_like_torch_adamw(model, opt, ref, steps=3, **adamw):
    """Steps opt (over model, on one rank) and torch's AdamW (over ref, a copy of model) on
    the same batches: the parameters must stay bit-identical."""
    ref_opt = torch.optim.AdamW(ref.parameters(), **adamw)
    for step in range(steps):
        for m, o in ((model, opt), (ref, ref_opt)):
            o.zero_grad()
            loss_of(m, toy_batch(0, step)).backward()
            o.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


def eval_loss(model):
    with torch.no_grad():
        return sum(loss_of(model, toy_batch(999, i, 64)).item() for i in range(4)) / 4
