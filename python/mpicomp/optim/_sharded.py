"""What the sharded optimizers (ZeRO-1, ACCO) share: one flat float32 vector of all
parameters, padded to a multiple of the rank count and cut into equal contiguous shards
(Rajbhandari et al. 2020, "ZeRO", arXiv 1910.02054, stage 1); the wrapped torch optimizer
owns and steps only this rank's shard; checkpoints hold the whole, unpadded state, so they
load on any number of ranks.

Every rank checks its own arguments, then all ranks compare what they found (one small
allgather) before anything else moves: a bad argument or a model that differs between
ranks raises on every rank, never a hang.
"""

import time
import weakref

import numpy as np
import torch
from mpi4py import MPI

import mpicomp

from .. import _comm
from ..codecs import wire_codec
from .._agree import agree
from .._waits import Timed
from ..errors import ArgumentError, CheckpointError, MpicompError, RankFailedError
from ._checkpoint import FORMAT, check_checkpoint, checksum

__all__ = ["ShardedOptimizer", "CheckpointError", "RankFailedError", "build_optimizer", "owned_dup", "state_bytes",
           "timed_dup"]


def owned_dup(owner, comm):
    """A duplicate of comm, freed when ``owner`` is garbage-collected (or at exit)."""
    dup = comm.Dup()
    weakref.finalize(owner, _free, dup)
    return dup


def timed_dup(owner, comm, timeout):
    """(owned_dup(owner, comm), None), its calls waiting at most ``timeout`` (an optimizer's
    ``timeout=``: seconds or a timedelta; None: comm's own timeout, else config.timeout_s),
    comm itself left as it is. A bad timeout comes back as the ArgumentError second, for the
    optimizer's agreement to raise on every rank (the duplicate is made on every rank)."""
    dup = owned_dup(owner, comm)
    if timeout is None:
        return dup, None
    try:
        mpicomp.set_timeout(dup, timeout)
    except ArgumentError:
        return dup, ArgumentError(f"{type(owner).__name__}: timeout must be None, seconds in [0, 1e9] (0: no "
                                  f"limit) or a datetime.timedelta, got {timeout!r}")
    return dup, None


def state_bytes(optimizer):
    """Bytes of a torch optimizer's state tensors (ZeRO1's, ACCO's and AMSP's wrapped one)."""
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
               if torch.is_tensor(v))


def _free(comm):
    if not MPI.Is_finalized() and comm != MPI.COMM_NULL:
        comm.Free()


class Layout:
    """Where each parameter lies in the flat vector, and this rank's shard [lo, hi) of it.

    Shards are ceil(numel / size) elements; the last ones take the padding (zeros that the
    optimizer steps and nobody reads). segments[i] is the part of group i's range that
    falls in this rank's shard, in shard coordinates (possibly empty)."""

    def __init__(self, groups, size, rank):
        self.params = [p for g in groups for p in g]
        self.offsets, self.group_ranges, n = [], [], 0
        for g in groups:
            start = n
            for p in g:
                self.offsets.append(n)
                n += p.numel()
            self.group_ranges.append((start, n))
        self.numel = n
        self.shard = -(-n // size)
        self.padded = self.shard * size
        self.lo, self.hi = rank * self.shard, (rank + 1) * self.shard
        self.segments = [(min(max(a, self.lo), self.hi) - self.lo, min(max(b, self.lo), self.hi) - self.lo)
                         for a, b in self.group_ranges]

    def views(self, flat):
        """Views of the flat vector shaped like each parameter."""
        return [flat[o:o + p.numel()].view_as(p) for o, p in zip(self.offsets, self.params)]

    @torch.no_grad()
    def gather_grads(self, out):
        """Copies every parameter's gradient (zeros where None) into the flat vector out."""
        for v, p in zip(self.views(out), self.params):
            if p.grad is None:
                v.zero_()
            else:
                v.copy_(p.grad)
        return out

    @torch.no_grad()
    def write_params(self, flat):
        for v, p in zip(self.views(flat), self.params):
            p.copy_(v)


class ShardedOptimizer(torch.optim.Optimizer):
    """Base of ZeRO1 and ACCO: argument checks, the shard, the wrapped optimizer, checkpoints.
    A torch.optim.Optimizer, so LR schedulers work: they set ``param_groups[i]["lr"]``, which
    is copied to the wrapped optimizer before each of its steps."""

    def __init__(self, params, optimizer_class, comm, grad_codec, param_codec, error_feedback, opt_kwargs,
                 extra=(), problem=None, timeout=None):
        who = type(self).__name__
        _comm.checked(comm, who, intra=True, hint="e.g. mesh.dp")
        self.comm, bad_timeout = timed_dup(self, comm, timeout)
        # Our own small messages (agreement, counts) never match the user's or mpicomp's, and
        # wait at most the timeout.
        self._meta = Timed(owned_dup(self, self.comm))
        error, signature, groups = None, None, None
        try:
            if problem is not None:  # found by the subclass; still agreed on, so every rank raises
                raise ArgumentError(f"{who}: {problem}")
            if bad_timeout is not None:
                raise bad_timeout
            groups = self._check(params, optimizer_class, grad_codec, param_codec, error_feedback, extra)
            signature = (f"{optimizer_class.__module__}.{optimizer_class.__qualname__}",
                         [[(tuple(p.shape), str(p.dtype)) for p in g["params"]] for g in groups],
                         sorted((k, repr(v)) for k, v in opt_kwargs.items()), str(grad_codec), str(param_codec),
                         error_feedback, extra)
            inner_test = self._make_inner(optimizer_class, groups, opt_kwargs, probe=True)
            del inner_test
        except MpicompError as e:
            error = e
        agree([self._meta], who, error, signature, _describe_signature)
        super().__init__(groups, dict(opt_kwargs))
        self.grad_codec, self.param_codec = mpicomp.codec(grad_codec), mpicomp.codec(param_codec)
        self.error_feedback = error_feedback
        self.optimizer_class = optimizer_class
        self._layout = Layout([g["params"] for g in self.param_groups], comm.Get_size(), comm.Get_rank())
        dev = self._layout.params[0].device
        full = torch.zeros(self._layout.padded, dtype=torch.float32, device=dev)
        with torch.no_grad():
            for v, p in zip(self._layout.views(full), self._layout.params):
                v.copy_(p)
        # The fp32 master copy of this rank's shard: what the wrapped optimizer steps.
        self.master = full[self._layout.lo:self._layout.hi].clone()
        self._shard_params = [self.master[a:b] for a, b in self._layout.segments]
        self.inner = self._make_inner(optimizer_class, self.param_groups, opt_kwargs)
        for outer, inner in zip(self.param_groups, self.inner.param_groups):
            outer.update({k: v for k, v in inner.items() if k != "params"})
        self.stats = {"micro_batches": 0, "comm_wait_s": 0.0}

    @staticmethod
    def _check(params, optimizer_class, grad_codec, param_codec, error_feedback, extra):
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise ArgumentError(f"optimizer_class must be a torch.optim.Optimizer subclass (e.g. "
                                f"torch.optim.AdamW), got {optimizer_class!r}")
        if isinstance(params, torch.Tensor):
            raise ArgumentError("params must be an iterable of tensors or of param-group dicts, got one tensor")
        try:
            items = list(params)
        except TypeError:
            raise ArgumentError(f"params must be an iterable of tensors or dicts, got {type(params).__name__}") \
                from None
        if not items:
            raise ArgumentError("params is empty: the optimizer has nothing to optimize")
        groups = [dict(g) if isinstance(g, dict) else None for g in items]
        if all(g is None for g in groups):
            groups = [{"params": items}]
        elif any(g is None for g in groups):
            raise ArgumentError("params must be all tensors or all param-group dicts, not a mix")
        seen, device = set(), None
        for i, g in enumerate(groups):
            g["params"] = [g["params"]] if isinstance(g.get("params"), torch.Tensor) else list(g.get("params", []))
            if not g["params"]:
                raise ArgumentError(f"param group {i} has no parameters")
            for p in g["params"]:
                if not isinstance(p, torch.Tensor) or not p.is_floating_point():
                    raise ArgumentError(f"params must be floating-point tensors, got {type(p).__name__} "
                                        f"{getattr(p, 'dtype', '')}")
                if id(p) in seen:
                    raise ArgumentError("a parameter appears twice in params")
                seen.add(id(p))
                if device is not None and p.device != device:
                    raise ArgumentError(f"all parameters must be on one device, got {device} and {p.device}")
                device = p.device
        for name, spec in (("grad_codec", grad_codec), ("param_codec", param_codec)):
            wire_codec(spec, name)  # reduce-scatter and allgather take no allreduce algorithm
        if not isinstance(error_feedback, bool):
            raise ArgumentError(f"error_feedback must be a bool, got {error_feedback!r}")
        return groups

    def _make_inner(self, optimizer_class, groups, opt_kwargs, probe=False):
        """The wrapped optimizer over this rank's shard (probe: over stand-in tensors, to
        learn at construction whether the class takes these arguments)."""
        shards = [torch.zeros(1) for _ in groups] if probe else self._shard_params
        return build_optimizer(optimizer_class, groups, shards, opt_kwargs)

    # -- the sharded update ------------------------------------------------------------

    def _inner_step(self, grad_shard):
        """One step of the wrapped optimizer on the master shard with this gradient shard.
        Hyperparameters (the LR a scheduler set) are copied in first."""
        for outer, inner in zip(self.param_groups, self.inner.param_groups):
            inner.update({k: v for k, v in outer.items() if k != "params"})
        for p, (a, b) in zip(self._shard_params, self._layout.segments):
            p.grad = grad_shard[a:b]
        self.inner.step()
        for p in self._shard_params:
            p.grad = None

    def _snapshot(self):
        """A copy of the master shard and the wrapped optimizer's state."""
        state = {id(p): {k: v.clone() if torch.is_tensor(v) else v for k, v in self.inner.state[p].items()}
                 for p in self._shard_params if p in self.inner.state}
        return self.master.clone(), state

    def _restore(self, snapshot):
        master, state = snapshot
        self.master.copy_(master)
        for p in self._shard_params:
            saved = state.get(id(p))
            if saved is None:
                self.inner.state.pop(p, None)
                continue
            for k, v in saved.items():
                current = self.inner.state[p].get(k)
                if torch.is_tensor(v) and torch.is_tensor(current) and current.shape == v.shape:
                    current.copy_(v)  # in place: the optimizer may hold other references to it
                else:
                    self.inner.state[p][k] = v

    def _allgather_params(self, comm):
        """Every rank's updated shard, decoded from the same bytes on every rank (the owner
        too), so replicas stay bit-identical with a lossy param_codec."""
        return mpicomp.allgather(self.master, comm=comm, codec=self.param_codec)

    def optimizer_state_bytes(self):
        """Bytes of the wrapped optimizer's state tensors on this rank (measured)."""
        return state_bytes(self.inner)

    # -- checkpoints -----------------------------------------------------------------

    def _gather_full(self, shard):
        """The whole flat vector (unpadded) from every rank's shard-sized piece, exactly."""
        local = shard.detach().to("cpu", torch.float32).contiguous().numpy()
        full = np.empty(self._layout.padded, np.float32)
        self._meta.Allgather(local, full)
        return torch.from_numpy(full[:self._layout.numel])

    def state_dict(self):
        """The whole optimizer state, gathered from all shards (collective: every rank calls
        it and gets the same dict). Independent of the rank count."""
        lay = self._layout
        kinds = [{k: ("elementwise" if torch.is_tensor(v) and tuple(v.shape) == tuple(p.shape) and v.dim() else "scalar")
                  for k, v in self.inner.state.get(p, {}).items()} for p in self._shard_params]
        everyone = self._meta.allgather(kinds)
        state = []
        for i, (a, b) in enumerate(lay.group_ranges):
            keys = {}
            for r_kinds in everyone:
                keys.update(r_kinds[i])
            group_state = {}
            for key, kind in sorted(keys.items()):
                if kind == "elementwise":
                    piece = torch.zeros(lay.shard)
                    mine = self.inner.state.get(self._shard_params[i], {}).get(key)
                    if mine is not None:
                        sa, sb = lay.segments[i]
                        piece[sa:sb] = mine.detach().float().cpu()
                    group_state[key] = self._gather_full(piece)[a:b].clone()
                else:
                    # Equal on every rank (all shards take the same number of steps): the
                    # first rank whose segment of this group is non-empty tells it.
                    owner = next(r for r in range(self.comm.Get_size())
                                 if min(b, (r + 1) * lay.shard) > max(a, r * lay.shard))
                    mine = self.inner.state.get(self._shard_params[i], {}).get(key)
                    value = self._meta.bcast(mine, root=owner)
                    group_state[key] = value.clone() if torch.is_tensor(value) else value
            state.append(group_state)
        sd = {"format": FORMAT, "kind": type(self).__name__,
              "optimizer": f"{self.optimizer_class.__module__}.{self.optimizer_class.__qualname__}",
              "shapes": [[list(p.shape) for p in g["params"]] for g in self.param_groups],
              "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups],
              "master": self._gather_full(self.master), "state": state}
        sd["checksum"] = checksum(sd)
        return sd

    def load_state_dict(self, state_dict):
        """Restores a state_dict() saved on this or any other number of ranks (collective).

        Raises:
            CheckpointError: not a checkpoint of this format, another optimizer class, or
                corrupt (checksum); on every rank.
            ShapeMismatchError: saved for parameters of other shapes, or ranks loaded
                different checkpoints; on every rank.
        """
        who = f"{type(self).__name__}.load_state_dict"
        error = None
        try:
            self._check_checkpoint(state_dict)
        except MpicompError as e:
            error = e
        agree([self._meta], who, error, None if error else state_dict["checksum"],
              lambda c: f"a checkpoint with checksum {c}")
        lay = self._layout
        padded = torch.zeros(lay.padded)
        padded[:lay.numel] = state_dict["master"]
        with torch.no_grad():
            self.master.copy_(padded[lay.lo:lay.hi])
            lay.write_params(padded.to(self.master.device))
        for i, (p, (a, b), (sa, sb)) in enumerate(zip(self._shard_params, lay.group_ranges, lay.segments)):
            restored = {}
            for key, value in state_dict["state"][i].items():
                if torch.is_tensor(value) and value.dim() == 1 and value.numel() == b - a:
                    full = torch.zeros(lay.padded)
                    full[a:b] = value
                    restored[key] = full[lay.lo:lay.hi][sa:sb].to(p.device, p.dtype).clone()
                else:
                    restored[key] = value.clone() if torch.is_tensor(value) else value
            if restored:
                self.inner.state[p] = restored
            else:
                self.inner.state.pop(p, None)
        for outer, inner, saved in zip(self.param_groups, self.inner.param_groups, state_dict["param_groups"]):
            outer.update(saved)
            inner.update(saved)

    def _check_checkpoint(self, sd):
        check_checkpoint(sd, self.optimizer_class, [[list(p.shape) for p in g["params"]] for g in self.param_groups],
                         self._layout.numel)

    # -- torch.optim.Optimizer surface -------------------------------------------------

    def add_param_group(self, param_group):
        if hasattr(self, "_layout"):
            raise ArgumentError(f"{type(self).__name__}: parameter groups are fixed at construction (the shards "
                                f"are cut from them)")
        super().add_param_group(param_group)

    def _timed(self, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        self.stats["comm_wait_s"] += time.perf_counter() - start
        return out


def build_optimizer(optimizer_class, groups, tensors, opt_kwargs):
    """``optimizer_class`` over one tensor per param group (each group's other settings
    kept); ArgumentError when the class rejects the arguments."""
    inner_groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": [t]} for g, t in zip(groups, tensors)]
    try:
        return optimizer_class(inner_groups, **opt_kwargs)
    except (TypeError, ValueError) as e:
        raise ArgumentError(f"{optimizer_class.__name__}({', '.join(f'{k}={v!r}' for k, v in opt_kwargs.items())})"
                            f" rejected its arguments: {e}") from None


def _describe_signature(sig):
    if sig is None:
        return "no signature"
    cls, shapes, kwargs, gc, pc, ef, extra = sig
    n = sum(1 for g in shapes for _ in g)
    numel = sum(int(np.prod(s)) for g in shapes for s, _ in g)
    return (f"{cls} over {n} tensors ({numel} elements, shapes {[s for g in shapes for s, _ in g][:6]}...), "
            f"kwargs {dict(kwargs)}, grad_codec {gc}, param_codec {pc}, error_feedback {ef}, {extra}")
