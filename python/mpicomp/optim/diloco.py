"""DiLoCo: distributed low-communication training (Douillard et al., "DiLoCo: Distributed
Low-Communication Training of Language Models", arXiv 2311.08105), with the fragments of
Streaming DiLoCo (Douillard et al., arXiv 2501.18512) and mpicomp's compressed allreduce for
the outer gradients."""

import torch
from mpi4py import MPI

import mpicomp

from .. import _comm
from ..codecs import wire_codec
from ..errors import ArgumentError
from ..stats import thread_bytes
from ..torch import allreduce_gradients, traffic
from .._agree import agree
from .._waits import Timed
from . import _diloco_checkpoint
from ._sharded import timed_dup

__all__ = ["DiLoCo"]

_KEY = ("diloco", "outer")  # traffic key of the outer gradients


def _intracomm(comm, name):
    return _comm.checked(comm, "DiLoCo", name, intra=True)


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ArgumentError(f"DiLoCo: {name} must be a positive int, got {value!r}")
    return value


def _number(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ArgumentError(f"DiLoCo: {name} must be a number >= 0, got {value!r}")
    return float(value)


def split_fragments(sizes, fragments):
    """Element offsets [e0=0, e1, ..., eF=sum(sizes)] cutting the parameters, laid end to end
    in order (tensors of the given element counts), into ``fragments`` contiguous ranges of
    equal size (within one element). A cut may fall inside a tensor: the outer optimizer is
    element-wise, and equal fragments are what make one sync's traffic exactly 1/F."""
    total = sum(sizes)
    if fragments > total:
        raise ArgumentError(f"DiLoCo: fragments={fragments} but the model has only {total} parameter elements")
    return [total * f // fragments for f in range(fragments + 1)]


class DiLoCo:
    """DiLoCo's inner and outer optimisation around a model and its (inner) optimizer.

    Each worker (a rank of ``comm``, or an island: the ranks of an ``inner_comm``) trains
    alone for H = ``sync_every`` inner steps, then the workers average how far they moved
    and take one outer step together. Algorithm 1 of the paper, as run here:

    1. theta^(0): rank 0's parameters, broadcast at construction (every replica starts equal);
       an fp32 copy (the global parameters) is kept on the host.
    2. For each outer step t, on each worker i: theta_i <- theta^(t-1) (the local parameters).
    3. H inner steps: ``step()`` calls ``inner_optimizer.step()`` on the worker's own data
       (with ``inner_comm``, gradients are first averaged over the island, exactly).
    4. Outer gradient delta_i = theta^(t-1) - theta_i, in fp32 on the host.
    5. Delta = (1/k) sum_i delta_i: mpicomp.allreduce over ``comm`` with ``codec``
       (op="avg", optional error feedback); every rank gets the same decoded average.
    6. theta^(t) = OuterOpt(theta^(t-1), Delta): SGD with Nesterov momentum by default.
    7. The local parameters are set to theta^(t): replicas are bit-identical after every
       outer step, also with lossy codecs.

    Streaming DiLoCo (``fragments`` = F > 1): the parameters, laid end to end, are cut into F
    contiguous fragments of equal size (a cut may fall inside a tensor); fragment f runs steps 4-7 at the
    inner steps s with (s - f*H//F) % H == 0, so the outer traffic is spread over the H steps
    instead of one burst, each fragment still synced every H steps.

    Overlap (``overlap=True``, Streaming DiLoCo section 2.3): a fragment's outer gradient is
    averaged by a non-blocking allreduce while the next inner step runs; the outer step is
    applied one inner step later (tau = 1), and the fragment's local parameters, which moved
    meanwhile, are merged with the new global ones: theta_local <- alpha * theta_local +
    (1 - alpha) * theta^(t), alpha = ``overlap_mix`` (the paper's mixing factor; 0 takes the
    global parameters and drops the local step, which keeps replicas bit-identical).

    If any rank raises between two outer steps (in ``step()``, or in the training loop run
    inside ``with opt:``), every rank raises at the next outer step (a ShapeMismatchError
    naming the failed rank on the others) instead of waiting forever.

    Args:
        model: the torch.nn.Module being trained; all its parameters are synced. Buffers
            (e.g. BatchNorm statistics) are not.
        inner_optimizer: the torch.optim.Optimizer over the model's parameters that runs
            the inner steps (the paper: AdamW, lr 4e-4, weight decay 0.1).
        comm: the communicator of the workers the outer gradient is averaged over (with
            islands: the slow cross-island group, one rank per island).
        sync_every: H, inner steps between two outer steps of a fragment (paper: 500).
        outer_lr: the outer learning rate (paper: 0.7).
        outer_momentum: the outer Nesterov momentum (paper: 0.9); 0 makes the outer step
            plain SGD (outer_lr 1, momentum 0: theta^(t) is the average of the workers).
        nesterov: Nesterov (True) or heavy-ball momentum for the default outer SGD.
        codec: mpicomp codec of the outer-gradient allreduce ("none", "bf16", "int8",
            "int4", ...). Messages below ``mpicomp.config.min_bytes`` go uncompressed.
        error_feedback: keep, per fragment and rank, what the codec dropped and add it to
            the next outer gradient (lossy codecs).
        fragments: F, the number of fragments of Streaming DiLoCo (1: plain DiLoCo).
        outer_optimizer: None (SGD as above), a torch.optim.Optimizer class (built with
            lr=outer_lr), an instance (its class and hyperparameters are reused on the
            global parameters) or a function params -> optimizer.
        inner_comm: the fast in-island communicator: gradients are averaged over it (codec
            "none") before every inner step. None: each rank of comm is a worker.
        overlap: average each fragment's outer gradient while the next inner step runs
            (tau = 1, above). Needs MPI_THREAD_MULTIPLE (mpi4py's default).
        overlap_mix: alpha of the merge after an overlapped sync, in [0, 1] (default 0.5).
        timeout: seconds (or a ``datetime.timedelta``) its calls wait for the other ranks
            before raising CommTimeoutError, as torch's ``timeout=``; 0: no limit. None:
            ``comm``'s own (``mpicomp.set_timeout``), else ``config.timeout_s`` (30 minutes).

    Attributes:
        inner_step: inner steps taken so far (the outer schedule counts from it).
        outer_steps: fragment syncs taken so far (F per H inner steps).
        bytes_sent: payload bytes this rank sent for outer gradients (what crosses the
            slow link; ``traffic`` counts them too, under ("diloco", "outer")).
        fragment_bounds: element offsets [e0, ..., eF] into the parameters laid end to end
            (``model.parameters()`` order, each flattened): fragment f is [e_f, e_f+1).

    Raises:
        ArgumentError, CodecError: a bad argument (on every rank of comm and inner_comm).
        ShapeMismatchError: ranks disagree on the configuration or the model's shapes.
    """

    def __init__(self, model, inner_optimizer, comm=MPI.COMM_WORLD, sync_every=500, outer_lr=0.7,
                 outer_momentum=0.9, nesterov=True, codec="none", error_feedback=False, fragments=1,
                 outer_optimizer=None, inner_comm=None, overlap=False, overlap_mix=0.5, timeout=None):
        # Duplicates (the timeout= is theirs, not the caller's communicators'), on every rank.
        self.comm, bad_timeout = timed_dup(self, _intracomm(comm, "comm"), timeout)
        self.inner_comm = None if inner_comm is None else timed_dup(self, _intracomm(inner_comm, "inner_comm"),
                                                                    timeout)[0]
        # Agreements and the optimizer's own messages wait at most the timeout.
        self._workers = Timed(self.comm)
        self._island = None if inner_comm is None else Timed(self.inner_comm)
        self._comms = [self._workers] if inner_comm is None else [self._workers, self._island, self._workers]
        self._failed = None
        # The next agreement the other ranks will meet: "inner" (the island's, at the next
        # inner step), "outer" (the next outer step's) or None (this rank is in it already).
        self._pending = "inner" if inner_comm is not None else "outer"
        self.inner_step = self.outer_steps = self.bytes_sent = 0
        self._inflight = []  # overlapped syncs under way: (fragment, outer gradient, Request)
        error = None
        try:
            if bad_timeout is not None:
                raise bad_timeout
            if not isinstance(overlap, bool):
                raise ArgumentError(f"DiLoCo: overlap must be a bool, got {overlap!r}")
            self.overlap, self.overlap_mix = overlap, _number(overlap_mix, "overlap_mix")
            if self.overlap_mix > 1:
                raise ArgumentError(f"DiLoCo: overlap_mix must be in [0, 1], got {overlap_mix!r}")
            self._configure(model, inner_optimizer, sync_every, outer_lr, outer_momentum, nesterov, codec,
                            error_feedback, fragments, outer_optimizer)
        except Exception as e:  # any rank's failure must reach the others' agreement
            error = e
        agree(self._comms, "DiLoCo", error, None if error else self._signature())
        self._broadcast_initial()

    def _configure(self, model, inner_optimizer, sync_every, outer_lr, outer_momentum, nesterov, codec,
                   error_feedback, fragments, outer_optimizer):
        if not isinstance(model, torch.nn.Module):
            raise ArgumentError(f"DiLoCo: model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(inner_optimizer, torch.optim.Optimizer):
            raise ArgumentError(f"DiLoCo: inner_optimizer must be a torch.optim.Optimizer, got "
                                f"{type(inner_optimizer).__name__}")
        self.model, self.inner_optimizer = model, inner_optimizer
        self.params = list(model.parameters())
        if not self.params:
            raise ArgumentError("DiLoCo: the model has no parameters")
        for i, p in enumerate(self.params):
            if not p.is_contiguous():  # fragments write into flat views of the parameters
                raise ArgumentError(f"DiLoCo: parameter {i} {tuple(p.shape)} is not contiguous")
        self.sync_every = _positive_int(sync_every, "sync_every")
        self.fragments = _positive_int(fragments, "fragments")
        self.outer_lr = _number(outer_lr, "outer_lr")
        self.outer_momentum = _number(outer_momentum, "outer_momentum")
        if not isinstance(nesterov, bool) or not isinstance(error_feedback, bool):
            raise ArgumentError(f"DiLoCo: nesterov and error_feedback must be bools, got {nesterov!r}, "
                                f"{error_feedback!r}")
        self.nesterov, self.error_feedback = nesterov, error_feedback
        # The outer gradient is one flat vector per fragment: no matrices for PowerSGD.
        self.codec = wire_codec(codec, "DiLoCo")
        self.fragment_bounds = split_fragments([p.numel() for p in self.params], self.fragments)
        self._pieces = self._cut(self.fragment_bounds)
        # One fp32 host tensor per fragment: the outer optimizer keeps per-fragment state,
        # which for element-wise optimizers (SGD, Adam) equals per-tensor state.
        self.global_params = [torch.nn.Parameter(self._flat_local(f), requires_grad=False)
                              for f in range(self.fragments)]
        self.outer_optimizer = self._outer(outer_optimizer)
        lossy = error_feedback and not self.codec.exact
        self.feedback = [mpicomp.ErrorFeedback() if lossy else None for _ in range(self.fragments)]

    def _outer(self, outer_optimizer):
        params = self.global_params
        if outer_optimizer is None:
            # torch refuses Nesterov without momentum; with momentum 0 both are the same step
            return torch.optim.SGD(params, lr=self.outer_lr, momentum=self.outer_momentum,
                                   nesterov=self.nesterov and self.outer_momentum > 0)
        if isinstance(outer_optimizer, torch.optim.Optimizer):
            return type(outer_optimizer)(params, **outer_optimizer.defaults)
        if isinstance(outer_optimizer, type) and issubclass(outer_optimizer, torch.optim.Optimizer):
            return outer_optimizer(params, lr=self.outer_lr)
        if callable(outer_optimizer):
            opt = outer_optimizer(params)
            if isinstance(opt, torch.optim.Optimizer):
                return opt
        raise ArgumentError(f"DiLoCo: outer_optimizer must be None, a torch.optim.Optimizer class or instance, "
                            f"or a function params -> optimizer, got {outer_optimizer!r}")

    def _signature(self):
        """What every rank must agree on: the checkpoint's configuration plus the step."""
        return dict(self._config(), inner_step=self.inner_step)

    def _config(self):
        return {"sync_every": self.sync_every, "fragments": self.fragments, "codec": self.codec.spec,
                "error_feedback": self.error_feedback, "overlap": [self.overlap, self.overlap_mix],
                "shapes": [tuple(p.shape) for p in self.params],
                "dtypes": [str(p.dtype) for p in self.params]}

    def _cut(self, bounds):
        """For each fragment, its (parameter, start, stop) pieces: flat element ranges."""
        pieces, offset = [[] for _ in range(self.fragments)], 0
        for p in self.params:
            for f in range(self.fragments):
                start, stop = max(bounds[f], offset), min(bounds[f + 1], offset + p.numel())
                if start < stop:
                    pieces[f].append((p, start - offset, stop - offset))
            offset += p.numel()
        return pieces

    def _flat_local(self, f):
        return torch.cat([p.detach().reshape(-1)[a:b].to("cpu", torch.float32) for p, a, b in self._pieces[f]])

    def _set_local(self, f, mix=0.0):
        """Step 7 (and 2): the local parameters of fragment f := the global ones, or
        mix * local + (1 - mix) * global after an overlapped sync."""
        flat, offset = self.global_params[f].detach(), 0
        with torch.no_grad():
            for p, a, b in self._pieces[f]:
                local, g = p.view(-1)[a:b], flat[offset:offset + b - a]
                if mix:
                    local.lerp_(g.to(p.device, p.dtype), 1.0 - mix)
                else:
                    local.copy_(g)
                offset += b - a

    def _broadcast_initial(self):
        for comm in filter(None, (self._workers, self._island)):
            for g in self.global_params:
                comm.Bcast(g.detach().numpy(), root=0)
        for f in range(self.fragments):
            self._set_local(f)

    # --- torch.optim-like surface -------------------------------------------------------
    @property
    def param_groups(self):
        """The inner optimizer's parameter groups (learning-rate schedulers act on these)."""
        return self.inner_optimizer.param_groups

    def zero_grad(self, set_to_none=True):
        self.inner_optimizer.zero_grad(set_to_none=set_to_none)

    def due(self, step=None):
        """The fragments whose outer step runs at inner step ``step`` (default: the next one)."""
        s = self.inner_step + 1 if step is None else step
        H, F = self.sync_every, self.fragments
        return [f for f in range(F) if s > 0 and (s - f * H // F) % H == 0]

    def step(self, closure=None):
        """One inner step; at the inner steps where a fragment is due, its outer step too.
        Returns closure's loss (as torch optimizers do)."""
        if self._failed is not None:
            raise ArgumentError(f"DiLoCo: an earlier step failed ({self._failed}); build a new DiLoCo and load the "
                                f"last checkpoint")
        due = self.due()
        try:
            if self.inner_comm is not None:
                self._pending = "outer"  # should the island's agreement raise, the island knows
                agree([self._island], "DiLoCo.step")
                self._pending = "outer" if due else "inner"
                allreduce_gradients(self.model, comm=self.inner_comm, codec="none")
            loss = self.inner_optimizer.step(closure)
            self.inner_step += 1
            self._land()  # the syncs started one inner step ago (tau = 1)
            if due:
                self._pending = None  # whatever this agreement raises, every rank raises it
                agree(self._comms, "DiLoCo.step", None, self._signature())
                self._pending = "inner" if self.inner_comm is not None else "outer"
                for f in due:
                    if self.overlap:
                        self._launch(f)
                    else:
                        self._outer_step(f)
        except BaseException as e:
            self.abort(e)
        return loss

    def _outer_gradient(self, f):
        return self.global_params[f].detach() - self._flat_local(f)  # step 4

    def _sent(self, n):
        traffic.add(_KEY, n)
        self.bytes_sent += n

    def _outer_step(self, f):
        delta = self._outer_gradient(f)
        before = thread_bytes()[0]
        mpicomp.allreduce(delta, comm=self.comm, codec=self.codec, op="avg", out=delta,  # step 5
                          error_feedback=self.feedback[f])
        self._sent(thread_bytes()[0] - before)
        self._apply(f, delta)

    def _launch(self, f):
        delta = self._outer_gradient(f)
        request = mpicomp.iallreduce(delta, comm=self.comm, codec=self.codec, op="avg", out=delta,
                                     error_feedback=self.feedback[f])
        self._inflight.append((f, delta, request))

    def _land(self):
        inflight, self._inflight = self._inflight, []
        for f, delta, request in inflight:
            request.wait()
            self._sent(request.bytes_sent)
            self._apply(f, delta, self.overlap_mix)

    def _apply(self, f, delta, mix=0.0):
        # step 6 for this fragment only: torch optimizers skip parameters without a gradient
        for g in self.global_params:
            g.grad = None
        self.global_params[f].grad = delta
        self.outer_optimizer.step()
        self.global_params[f].grad = None
        self._set_local(f, mix)  # step 7
        self.outer_steps += 1

    def abort(self, error):
        """Tells every other rank that this one failed (collective with their next outer
        step), then raises ``error``. ``step()`` and ``with opt:`` call it; call it yourself
        when the training loop fails outside them."""
        if self._failed is not None:
            raise error
        self._failed = f"{type(error).__name__}: {error}"
        for _, _, request in self._inflight:  # every rank started it: it completes
            try:
                request.wait()
            except Exception:  # noqa: BLE001 - the error being raised is the one to report
                pass
        self._inflight = []
        pending, self._pending = self._pending, None
        # Take part, with the error, in the agreements the others meet next: the island's
        # at the next inner step (if that is still ahead), then the one of the next outer step.
        rounds = {"inner": [[self._island], self._comms], "outer": [self._comms]}.get(pending, [])
        if isinstance(error, Exception):  # KeyboardInterrupt, SystemExit: just leave
            for comms in rounds:
                try:
                    agree(comms, "DiLoCo.step", error)
                except BaseException:
                    pass  # agree raises this rank's own error once the others have it
        raise error

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc is not None and self._failed is None and isinstance(exc, Exception):
            try:
                self.abort(exc)
            except BaseException:
                pass
        return False

    # --- state and checkpoints ----------------------------------------------------------
    def state_dict(self):
        """This rank's whole state (torch.optim style). Called on every rank, as every
        optimizer's state_dict is (ZeRO1's, ACCO's and AMSP's gather their shards); it sends
        nothing but the completion of an overlapped sync under way, which is applied first."""
        self._land()
        return _diloco_checkpoint.state_dict(self)

    def load_state_dict(self, state):
        """Restores what state_dict() returned, each rank its own. Collective: a state that
        one rank cannot load (CheckpointError), or states of different steps
        (ShapeMismatchError), raise on every rank before any rank changes."""
        _diloco_checkpoint.load_state_dict(self, state)

    def save(self, path, data_position=None):
        """Collective: writes a checkpoint of every worker to ``path`` (rank 0 writes,
        atomically). Call it right after an outer step (see docs/diloco.md); an overlapped
        sync under way is applied first."""
        self._land()
        _diloco_checkpoint.save(self, path, data_position)

    def load(self, path):
        """Collective: restores a checkpoint written by save(), possibly by a different
        number of workers (new workers start their inner state fresh); returns its
        data_position."""
        return _diloco_checkpoint.load(self, path)
