"""Pipeline parallelism with compressed activations and activation gradients, on the GPipe
schedule (Huang et al. 2019, "GPipe: Efficient Training of Giant Neural Networks using
Pipeline Parallelism", arXiv 1811.06965): every stage runs the forward pass of all
micro-batches, then their backward passes in reverse order; the gradients of all
micro-batches accumulate before one optimizer step.

Between stages only activations (forward) and their gradients (backward) travel, through
``mpicomp.send`` / ``mpicomp.recv`` with the codecs of ``policy.codec("pp", ...)``: mild
ones, as they feed straight into the next stage (Xu et al., arXiv 2409.02423).
"""

import torch

import mpicomp

from .. import _comm
from ..errors import ArgumentError, BackendError, CodecError, MpicompError, ShapeMismatchError
from .policy import Policy
from .traffic import traffic

__all__ = ["GPipe"]

_FORWARD_TAG, _BACKWARD_TAG = 7001, 7002
_SAME_KIND = {c.__name__: c for c in (ArgumentError, BackendError, CodecError, ShapeMismatchError)}


class GPipe:
    """One pipeline stage's part of the GPipe schedule.

    Stage ``s`` is rank ``s`` of ``comm`` (``mesh.pp``); it runs ``module`` on what stage
    ``s - 1`` sent (the first stage: on the micro-batch inputs) and sends the result to
    stage ``s + 1`` (the last stage: applies the loss function instead).

    Args:
        module: this stage's layers (a torch.nn.Module or callable).
        comm: the pipeline communicator (``mesh.pp``); its rank is the stage number.
        activation_shape: shape of one micro-batch's activation between stages (e.g.
            ``(micro_batch, context, width)``); every stage boundary carries this shape.
        dtype: the activations' dtype.
        policy: an mpicomp.torch.Policy; ``("pp", "forward")`` compresses activations,
            ``("pp", "backward")`` their gradients. None: no compression.
    """

    def __init__(self, module, comm, activation_shape, dtype=torch.float32, policy=None):
        _comm.checked(comm, "GPipe", intra=True, hint="mesh.pp")
        if policy is None:
            policy = Policy()
        elif not isinstance(policy, Policy):
            raise ArgumentError(f"GPipe: policy must be an mpicomp.torch.Policy or None, got {type(policy).__name__}")
        self.module, self.comm, self.policy, self.dtype = module, comm, policy, dtype
        self.activation_shape = torch.Size(activation_shape)
        self.stage, self.stages = comm.Get_rank(), comm.Get_size()
        self.first, self.last = self.stage == 0, self.stage == self.stages - 1

    def _send(self, t, dest, kind, tag):
        t = t.detach().contiguous()
        codec = self.policy.codec("pp", kind)
        with traffic.counting(("pp", kind)):
            mpicomp.send(t, dest, comm=self.comm, codec=codec, tag=tag)

    def _recv(self, source, kind, tag):
        out = torch.empty(self.activation_shape, dtype=self.dtype)
        return mpicomp.recv(out, source, comm=self.comm, codec=self.policy.codec("pp", kind), tag=tag)

    def _forward(self, x, target, loss_fn, count):
        y = self.module(x)
        if self.last:
            return loss_fn(y, target) / count
        if y.shape != self.activation_shape:
            raise ArgumentError(f"GPipe: stage {self.stage} output has shape {tuple(y.shape)}, but "
                                f"activation_shape is {tuple(self.activation_shape)}")
        return y

    def step(self, inputs, targets, loss_fn):
        """Forward and backward passes of all micro-batches; gradients accumulate in the
        module's parameters (call ``optimizer.step()`` after). Every stage makes this call.

        Args:
            inputs: list of micro-batch inputs (used by the first stage; other stages only
                take its length, the number of micro-batches).
            targets: list of micro-batch targets (used by the last stage).
            loss_fn: ``loss_fn(output, target) -> scalar`` (used by the last stage).

        Returns:
            The mean loss over the micro-batches, on every stage.

        Raises:
            ArgumentError: a stage's output is not ``activation_shape``.
            ShapeMismatchError: stages disagree on ``activation_shape`` or ``dtype``.
            A failure in any stage's forward pass (these, or the module's own errors) stops
            every stage: the failing one raises its error, the others the same mpicomp error
            class (MpicompError for other exceptions) naming the stage. Until then the
            failing stage keeps sending zeros, so that no stage is left waiting.
        """
        count = len(inputs)
        if len(targets) != count:
            raise ArgumentError(f"GPipe.step: {count} inputs but {len(targets)} targets")
        stage_inputs, outputs, error = [], [], None
        for m in range(count):
            x = y = None
            try:
                x = inputs[m] if self.first else self._recv(self.stage - 1, "forward", _FORWARD_TAG).requires_grad_()
                if error is None:
                    y = self._forward(x, targets[m], loss_fn, count)
            except Exception as e:  # noqa: BLE001 - re-raised below, after the others know
                error, y = error or e, None
            if not self.last:
                self._send(y if y is not None else torch.zeros(self.activation_shape, dtype=self.dtype),
                           self.stage + 1, "forward", _FORWARD_TAG)
            stage_inputs.append(x)
            outputs.append(y)
        # One small collective so that a failure anywhere stops every stage before the
        # backward pass, where the stages before it would wait for gradients forever.
        failures = self.comm.allgather(None if error is None else (type(error).__name__, str(error)))
        if error is not None:
            raise error
        failed = [(s, f) for s, f in enumerate(failures) if f is not None]
        if failed:
            s, (name, message) = failed[0]
            raise _SAME_KIND.get(name, MpicompError)(f"GPipe: stage {s} failed in its forward pass "
                                                     f"({name}: {message})")

        for m in reversed(range(count)):
            if self.last:
                outputs[m].backward()
            else:
                outputs[m].backward(self._recv(self.stage + 1, "backward", _BACKWARD_TAG))
            if not self.first:
                self._send(stage_inputs[m].grad, self.stage - 1, "backward", _BACKWARD_TAG)
        loss = sum(float(o.detach()) for o in outputs) if self.last else None
        return self.comm.bcast(loss, root=self.stages - 1)
