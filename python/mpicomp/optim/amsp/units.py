"""AMSP's per-module bookkeeping: every module that owns parameters is one unit whose
parameters live in one flat buffer, padded to a multiple of s_os so that every group size
divides it (s_p | s_g | s_os). With s_p > 1 the buffer's memory is released between uses:
gathered over the parameter group before the module's forward and again before its
backward, released after each (the storage is resized to zero, as PyTorch FSDP does, so the
parameters and the tensors autograd saved stay valid objects and see the data again when it
comes back). When all of a unit's parameters have their gradient for a backward pass, the
optimizer's callback reduce-scatters it and the gradients are dropped.
"""

import torch

__all__ = ["Unit", "Hooks", "check_model", "make_units"]


class Unit:
    """One module's parameters as a flat buffer ``full`` of ``padded`` elements; ``params``
    are views of it. ``sharded``: whether ``full`` is released between uses."""

    def __init__(self, module, params, s_os, dtype, device, sharded):
        self.module, self.params, self.sharded = module, params, sharded
        self.numel = sum(p.numel() for p in params)
        self.padded = -(-self.numel // s_os) * s_os
        self.offsets, n = [], 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        self.full = torch.zeros(self.padded, dtype=dtype, device=device)
        self.gathered = True
        self.ready = 0  # parameters whose gradient arrived in this backward pass

    def flat_values(self):
        """The parameters' current values as one padded flat tensor (a new one)."""
        out = torch.zeros(self.padded, dtype=self.full.dtype, device=self.full.device)
        with torch.no_grad():
            for o, p in zip(self.offsets, self.params):
                out[o:o + p.numel()].copy_(p.reshape(-1))
        return out

    def adopt(self, storage=None):
        """Makes the parameters views of ``storage`` (default: ``full``)."""
        if storage is not None:
            self.full = storage
        for o, p in zip(self.offsets, self.params):
            p.data = self.full[o:o + p.numel()].view_as(p)

    def flat_grads(self):
        """The parameters' gradients as one padded flat tensor (zeros where None)."""
        out = torch.zeros(self.padded, dtype=self.full.dtype, device=self.full.device)
        for o, p in zip(self.offsets, self.params):
            if p.grad is not None:
                out[o:o + p.numel()].copy_(p.grad.reshape(-1))
        return out

    def release(self):
        if self.sharded and self.gathered:
            self.full.untyped_storage().resize_(0)
            self.gathered = False

    def reserve(self):
        """Gives ``full`` its memory back (contents undefined until gathered)."""
        if self.sharded and not self.gathered:
            self.full.untyped_storage().resize_(self.padded * self.full.element_size())
            self.gathered = True

    def held_bytes(self):
        return self.full.untyped_storage().nbytes() if self.sharded else 0


def check_model(model):
    """What makes ``model`` unfit for units (None if nothing): a parameter owned by two
    modules (weight tying: one module would release what the other computes with), or
    one that takes no gradient (its module's gradients would never be complete)."""
    owner = {}
    for name, m in model.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            here = f"{name}.{pname}" if name else pname
            if id(p) in owner:
                return f"parameter {here} is also {owner[id(p)]} (tied weights are not supported)"
            owner[id(p)] = here
            if not p.requires_grad:
                return f"parameter {here} does not require grad (frozen parameters are not supported)"
    return None


def make_units(model, s_os, sharded):
    """The units of ``model``: its modules that own parameters directly, in
    ``model.modules()`` order, so concatenating their parameters gives
    ``model.parameters()`` order."""
    first = next(model.parameters())
    units = []
    for m in model.modules():
        own = list(m.parameters(recurse=False))
        if own:
            units.append(Unit(m, own, s_os, first.dtype, first.device, sharded))
    return units


class Hooks:
    """The module and tensor hooks of sharded parameters (s_p > 1) and of gradient arrival.

    gather(unit, phase): fills ``unit.full`` from the shards before its "forward" or its
    "backward"; forwarded(unit): its forward is done and its memory released (with grad
    enabled: a backward may follow); grad_done(unit): the unit's gradients of this backward
    pass are all in ``.grad``."""

    def __init__(self, units, gather, forwarded, grad_done):
        self.handles = []
        self._gather, self._forwarded, self._grad_done = gather, forwarded, grad_done
        for u in units:
            if u.sharded:
                pre = u.module.register_forward_pre_hook(lambda m, a, u=u: self._gather(u, "forward"))
                self.handles.append(pre)
                self.handles.append(u.module.register_forward_hook(lambda m, a, out, u=u: self._after_forward(u, out)))
            for p in u.params:
                self.handles.append(p.register_post_accumulate_grad_hook(lambda p, u=u: self._arrived(u)))

    def _after_forward(self, unit, out):
        unit.release()
        if torch.is_grad_enabled():
            # The backward of this module starts when the gradient of its output arrives:
            # gather the parameters again then.
            for t in _tensors(out):
                if t.requires_grad:
                    t.register_hook(lambda g, u=unit: self._gather(u, "backward"))
            self._forwarded(unit)

    def _arrived(self, unit):
        unit.ready += 1
        if unit.ready == len(unit.params):
            unit.ready = 0
            self._grad_done(unit)

    def remove(self):
        for h in self.handles:
            h.remove()
        self.handles = []


def _tensors(out):
    """The tensors in a module's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, (tuple, list)):
        for x in out:
            yield from _tensors(x)
    elif isinstance(out, dict):
        for x in out.values():
            yield from _tensors(x)
