"""ZeRO-1: optimizer state sharded over the data-parallel ranks (Rajbhandari et al. 2020,
"ZeRO: Memory Optimizations Toward Training Trillion Parameter Models", arXiv 1910.02054,
stage P_os), on mpicomp's compressed reduce-scatter and allgather."""

import time

import torch
from mpi4py import MPI

import mpicomp

from ._sharded import ShardedOptimizer

__all__ = ["ZeRO1"]


class ZeRO1(ShardedOptimizer):
    """Any torch optimizer, with its state split over the ranks of ``comm``.

    Each step (ZeRO paper, section 5.1, P_os):

    1. every rank flattens its gradients into one float32 vector (zeros for parameters
       without a gradient), padded to a multiple of the rank count;
    2. reduce-scatter with op "avg" (codec ``grad_codec``): rank r receives the mean
       gradient of the r-th shard;
    3. the wrapped optimizer steps rank r's float32 master shard with it, so its state
       (e.g. AdamW's two moments) exists only for that shard: 1/N of the unsharded state;
    4. allgather of the updated shards (codec ``param_codec``) into every rank's model.

    Every rank, the owner of a shard included, writes the values decoded from the same
    bytes, so the model replicas are bit-identical after every step, also with lossy
    codecs; each owner keeps its exact float32 master shard, so a lossy ``param_codec``
    does not compound from step to step.

    Args:
        params: an iterable of parameters or of param-group dicts, as for torch.optim;
            identical (shapes, dtypes, order) on every rank of ``comm``.
        optimizer_class: the torch.optim.Optimizer subclass to run on the shard (AdamW, SGD,
            Adam, ...). Elementwise optimizers give the same result as unsharded; ones that
            look across a whole tensor (e.g. LAMB's trust ratio) would see a shard.
        comm: the data-parallel mpi4py communicator (``mesh.dp``, or COMM_WORLD).
        grad_codec: codec of the gradient reduce-scatter ("none", "bf16", "int8", ...).
        param_codec: codec of the parameter allgather.
        error_feedback: keep what a lossy ``grad_codec`` drops and add it to the next
            step's gradients (mpicomp.ErrorFeedback).
        timeout: seconds (or a ``datetime.timedelta``) its calls wait for the other ranks
            before raising CommTimeoutError, as torch's ``timeout=``; 0: no limit. None:
            ``comm``'s own (``mpicomp.set_timeout``), else ``config.timeout_s`` (30 minutes).
        **opt_kwargs: passed to ``optimizer_class`` (lr, betas, weight_decay, ...).

    Attributes:
        inner: the wrapped optimizer over this rank's shard.
        master: this rank's float32 master shard.
        stats: {"micro_batches": closure calls in the last step, "comm_wait_s": seconds
            spent in the last step's collectives}.

    Raises:
        ArgumentError: on a bad argument (empty params, not an optimizer class, a codec that
            is not a wire codec, kwargs the class rejects), on the rank that has it;
        ShapeMismatchError: on the other ranks, and on every rank when the ranks' models or
            arguments differ. No rank is left waiting.
    """

    def __init__(self, params, optimizer_class, comm=MPI.COMM_WORLD, grad_codec="none", param_codec="none",
                 error_feedback=False, timeout=None, **opt_kwargs):
        super().__init__(params, optimizer_class, comm, grad_codec, param_codec, error_feedback, opt_kwargs,
                         timeout=timeout)
        self._grads = torch.zeros(self._layout.padded, dtype=torch.float32, device=self.master.device)
        lossy = error_feedback and not self.grad_codec.exact
        self.feedback = mpicomp.ErrorFeedback() if lossy else None

    @torch.no_grad()
    def step(self, closure=None):
        """One optimizer step with the gradients in the parameters' ``.grad``; with a
        closure, calls it first (with grad enabled) and returns its loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.stats = {"micro_batches": int(closure is not None), "comm_wait_s": 0.0}
        start = time.perf_counter()
        flat = self._layout.gather_grads(self._grads)
        grad_shard = mpicomp.reduce_scatter(flat, comm=self.comm, codec=self.grad_codec, op="avg",
                                            error_feedback=self.feedback)
        wait = time.perf_counter() - start
        self._inner_step(grad_shard)
        start = time.perf_counter()
        full = self._allgather_params(self.comm)
        self.stats["comm_wait_s"] = wait + time.perf_counter() - start
        self._layout.write_params(full)
        return loss
