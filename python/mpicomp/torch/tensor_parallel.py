"""Tensor-parallel linear layers whose collectives are compressed (Megatron-LM, Shoeybi et
al. 2019, arXiv 1909.08053, section 3).

A column-parallel layer splits the output features over the tensor-parallel group, a
row-parallel layer the input features; in a transformer MLP or attention block the pair
needs one allreduce in the forward pass (after the row-parallel layer) and one in the
backward pass (of the column-parallel layer's input gradient). Both go through
``mpicomp.allreduce`` with the codecs of ``policy.codec("tp", "forward" | "backward")``:
mild ones, as activations feed straight into the next layer (Xu et al., arXiv 2409.02423).
"""

import torch

import mpicomp

from .. import _comm
from ..errors import ArgumentError
from .policy import Policy
from .traffic import traffic

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "copy_to_tensor_parallel", "reduce_from_tensor_parallel"]


def _allreduce(t, comm, codec, kind):
    if comm.Get_size() == 1:
        return t
    t = t.contiguous()
    with traffic.counting(("tp", kind)):
        return mpicomp.allreduce(t, comm=comm, codec=codec, op="sum")


class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron's f: identity forward, allreduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, comm, codec):
        ctx.comm, ctx.codec = comm, codec
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _allreduce(grad, ctx.comm, ctx.codec, "backward"), None, None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's g: allreduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, comm, codec):
        return _allreduce(x, comm, codec, "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def copy_to_tensor_parallel(x, comm, codec="none"):
    """x unchanged; in the backward pass its gradient is summed over comm with codec (the
    input of column-parallel layers, whose partial input gradients add up)."""
    return _CopyToTensorParallel.apply(x, comm, mpicomp.codec(codec))


def reduce_from_tensor_parallel(x, comm, codec="none"):
    """Sum of x over comm with codec (partial outputs of row-parallel layers); the gradient
    passes through unchanged."""
    return _ReduceFromTensorParallel.apply(x, comm, mpicomp.codec(codec))


def _setup(layer, comm, policy, features, what):
    _comm.checked(comm, type(layer).__name__, intra=True, hint="mesh.tp")
    if policy is None:
        policy = Policy()
    elif not isinstance(policy, Policy):
        raise ArgumentError(f"{type(layer).__name__}: policy must be an mpicomp.torch.Policy or None, got "
                            f"{type(policy).__name__}")
    size = comm.Get_size()
    if features % size:
        raise ArgumentError(f"{type(layer).__name__}: {what}={features} is not divisible by the tensor-parallel "
                            f"size {size}")
    layer.comm, layer.policy = comm, policy
    return features // size, comm.Get_rank()


class ColumnParallelLinear(torch.nn.Module):
    """y_local = x A_local^T + b_local: this rank's ``out_features / tp`` output features.

    The full layer is initialised like ``torch.nn.Linear(in_features, out_features)`` from
    the current torch RNG state (which must be the same on all ranks of comm) and this rank
    keeps rows ``[rank * k, (rank + 1) * k)``: the same seed gives the same model at any
    tensor-parallel size.

    Args:
        in_features: input features (the input is replicated on every rank of comm).
        out_features: total output features, divisible by comm's size.
        comm: the tensor-parallel communicator (``mesh.tp``).
        bias: learn a bias (split like the output).
        policy: an mpicomp.torch.Policy; its ``("tp", "backward")`` codec compresses the
            allreduce of the input gradient. None: no compression.
    """

    def __init__(self, in_features, out_features, comm, bias=True, policy=None):
        super().__init__()
        k, rank = _setup(self, comm, policy, out_features, "out_features")
        full = torch.nn.Linear(in_features, out_features, bias=bias)
        self.weight = torch.nn.Parameter(full.weight.detach()[rank * k:(rank + 1) * k].clone())
        self.bias = torch.nn.Parameter(full.bias.detach()[rank * k:(rank + 1) * k].clone()) if bias else None

    def forward(self, x):
        x = copy_to_tensor_parallel(x, self.comm, self.policy.codec("tp", "backward"))
        return torch.nn.functional.linear(x, self.weight, self.bias)


class RowParallelLinear(torch.nn.Module):
    """y = sum over ranks of x_local A_local^T, plus b: the input is this rank's
    ``in_features / tp`` features (a column-parallel layer's output), the output is
    replicated on every rank of comm.

    Initialised like ``torch.nn.Linear(in_features, out_features)`` from the current torch
    RNG state (the same on all ranks of comm); this rank keeps columns
    ``[rank * k, (rank + 1) * k)`` of the weight and the whole bias.

    Args:
        in_features: total input features, divisible by comm's size.
        out_features: output features.
        comm: the tensor-parallel communicator (``mesh.tp``).
        bias: learn a bias (added once, after the sum).
        policy: an mpicomp.torch.Policy; its ``("tp", "forward")`` codec compresses the
            allreduce of the partial outputs. None: no compression.
    """

    def __init__(self, in_features, out_features, comm, bias=True, policy=None):
        super().__init__()
        k, rank = _setup(self, comm, policy, in_features, "in_features")
        full = torch.nn.Linear(in_features, out_features, bias=bias)
        self.weight = torch.nn.Parameter(full.weight.detach()[:, rank * k:(rank + 1) * k].clone())
        self.bias = torch.nn.Parameter(full.bias.detach().clone()) if bias else None

    def forward(self, x):
        y = reduce_from_tensor_parallel(torch.nn.functional.linear(x, self.weight), self.comm,
                                        self.policy.codec("tp", "forward"))
        return y if self.bias is None else y + self.bias
