"""ACCO: accumulate while you communicate (Nabli et al., "ACCO: Accumulate While You
Communicate for Communication-Overlapped Sharded LLM Training", arXiv 2406.02613)."""

import time
from concurrent.futures import ThreadPoolExecutor

import torch
from mpi4py import MPI

import mpicomp

from .. import _waits
from ..errors import ArgumentError, BackendError, CommTimeoutError, MpicompError
from ._sharded import RankFailedError, ShardedOptimizer, owned_dup

__all__ = ["ACCO"]

_BARRIER_GRACE_S = 0.002
_ROUND = "ACCO.step: the round's barrier"


class ACCO(ShardedOptimizer):
    """ZeRO-1 whose communication runs while the next gradients are computed, with the
    paper's "estimate, then correct" rounds so the one-step delay does not change the
    training dynamics, and with each rank contributing as many micro-batches as it finishes.

    Two streams run side by side (paper, section 3 and Algorithm 1). The communication
    stream, on a background thread with its own duplicate of ``comm``, runs one round at a
    time: reduce-scatter of gradient sums, the wrapped optimizer on this rank's shard
    (ZeRO-1: its state is 1/N), allgather of the parameters. The computation stream, the
    caller's thread, keeps calling ``closure`` (one micro-batch forward + backward) and
    summing its gradients until the round is done (at least ``min_micro_batches``, at most
    ``max_micro_batches``). Rounds alternate; one ``step`` runs two:

    1. estimate round: communicates g~_t, the gradients of the first half of mini-batch t
       (computed at theta~_t), and computes theta~_{t+1} = Opt(theta_t, g~_t), the state
       change of that step discarded; meanwhile the second half g_t is computed at theta_t;
    2. correct round: communicates g_t and applies theta_{t+1} = Opt(theta_t, g~_t + g_t)
       to the kept state; meanwhile the first half g~_{t+1} of the next mini-batch is
       computed at the estimate theta~_{t+1}.

    So each update uses gradients at theta_t and at a one-step look-ahead estimate of
    theta_{t+1}, which compensates the delay (the paper's answer to delayed parameter
    updates, whose staleness hurts transformers). A gradient is the sum over ranks and
    micro-batches divided by the total micro-batch count: every micro-batch weighs the
    same, and a slow rank adds fewer of them instead of stalling the others (heterogeneous
    hardware, paper section 3.3). First step, as in the paper: g~_0 is computed at theta_0
    with nothing to communicate (``min_micro_batches`` micro-batches), then both rounds run.
    The half mini-batch computed after the last step is never applied.

    Args:
        params: an iterable of parameters or of param-group dicts, as for torch.optim;
            identical on every rank of ``comm``. ACCO owns their gradients: it sums each
            micro-batch's ``.grad`` into its own buffer and sets ``.grad`` to None.
        optimizer_class: the torch.optim.Optimizer subclass run on the shard (AdamW, ...).
        comm: the data-parallel mpi4py communicator (``mesh.dp``, or COMM_WORLD).
        min_micro_batches: micro-batches each rank computes per round at least (the
            paper's minimum accumulation; also the count of the first step's g~_0).
        max_micro_batches: at most (None: as many as fit in the round). Equal bounds make a
            run deterministic, whatever the timing.
        grad_codec: codec of the gradient reduce-scatter.
        param_codec: codec of the parameter allgather.
        error_feedback: keep what a lossy ``grad_codec`` drops, one residual per half
            (estimate and correct rounds send different streams).
        timeout: seconds (or a ``datetime.timedelta``) its calls wait for the other ranks
            before raising CommTimeoutError, as torch's ``timeout=``; 0: no limit. None:
            ``comm``'s own (``mpicomp.set_timeout``), else ``config.timeout_s`` (30 minutes).
        **opt_kwargs: passed to ``optimizer_class``.

    Attributes:
        stats: {"micro_batches": this rank's closure calls in the last step,
            "comm_wait_s": seconds the caller waited for communication in it,
            "total_micro_batches": micro-batches of all ranks in the update it applied}.

    Raises:
        ArgumentError / ShapeMismatchError: as ZeRO1.
        BackendError: MPI initialised below MPI_THREAD_MULTIPLE (the communication thread
            needs it).
        RankFailedError: on every other rank when one rank's closure raised (that rank
            raises its own exception); the parameters are then theta_t or theta_{t+1},
            equal on all ranks, and the next step starts afresh as the first one does.
    """

    def __init__(self, params, optimizer_class, comm=MPI.COMM_WORLD, min_micro_batches=1, max_micro_batches=None,
                 grad_codec="none", param_codec="none", error_feedback=False, timeout=None, **opt_kwargs):
        if MPI.Query_thread() < MPI.THREAD_MULTIPLE:  # the same on every rank: all raise here
            raise BackendError("ACCO: its communication thread needs MPI_THREAD_MULTIPLE, but MPI was initialised "
                               "below it: leave mpi4py.rc.thread_level at 'multiple' (its default)")
        bad = None
        if isinstance(min_micro_batches, bool) or not isinstance(min_micro_batches, int) or min_micro_batches < 1:
            bad = f"min_micro_batches must be a positive int, got {min_micro_batches!r}"
        elif max_micro_batches is not None and (isinstance(max_micro_batches, bool)
                                                or not isinstance(max_micro_batches, int)
                                                or max_micro_batches < min_micro_batches):
            bad = f"max_micro_batches must be None or an int >= min_micro_batches, got {max_micro_batches!r}"
        super().__init__(params, optimizer_class, comm, grad_codec, param_codec, error_feedback, opt_kwargs,
                         extra=(min_micro_batches, max_micro_batches), problem=bad, timeout=timeout)
        self.min_micro_batches, self.max_micro_batches = min_micro_batches, max_micro_batches
        dev = self.master.device
        self._bufs = [torch.zeros(self._layout.padded, dtype=torch.float32, device=dev) for _ in range(2)]
        self._views = [self._layout.views(b) for b in self._bufs]
        self._acc = 0  # index of the buffer the closure's gradients are summed into
        lossy = error_feedback and not self.grad_codec.exact
        self.feedback = [mpicomp.ErrorFeedback() if lossy else None for _ in range(2)]
        self._worker_comm = owned_dup(self, self.comm)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mpicomp-acco")
        self._started = False
        self._first_half = None  # (reduced shard sum of g~_t, its micro-batch count)
        self._count = 0  # total micro-batches in the buffer that the next round sends
        self._update_count = 0

    # -- the communication stream (background thread) ------------------------------------

    def _reduce(self, buf, which):
        return mpicomp.reduce_scatter(buf, comm=self._worker_comm, codec=self.grad_codec, op="sum",
                                      error_feedback=self.feedback[which])

    @torch.no_grad()
    def _estimate_round(self, buf, count):
        """theta~_{t+1} = Opt(theta_t, g~_t / count), the optimizer's state left as it was."""
        shard_sum = self._reduce(buf, 0)
        self._first_half = (shard_sum, count)
        saved = self._snapshot()
        self._inner_step(shard_sum / count)
        estimate = self._allgather_params(self._worker_comm)
        self._restore(saved)
        return estimate

    @torch.no_grad()
    def _correct_round(self, buf, count):
        """theta_{t+1} = Opt(theta_t, (g~_t + g_t) / total count), state kept."""
        first_sum, first_count = self._first_half
        shard_sum = self._reduce(buf, 1)
        self._inner_step((first_sum + shard_sum) / (first_count + count))
        self._first_half = None
        self._update_count = first_count + count
        return self._allgather_params(self._worker_comm)

    # -- the computation stream (the caller) --------------------------------------------

    def _micro_batch(self, closure):
        with torch.enable_grad():
            loss = closure()
        loss = loss.item() if torch.is_tensor(loss) else float(loss)
        views = self._views[self._acc]
        with torch.no_grad():
            for v, p in zip(views, self._layout.params):
                if p.grad is not None:
                    v.add_(p.grad)
                    p.grad = None
        return loss

    def _round(self, closure, job, stats, commit=False):
        """Runs job (a round of the communication stream, on the buffer summed so far) while
        calling closure into the other buffer; returns the job's result (parameters).
        commit: write them into the model as soon as they arrive, even if a closure failed
        meanwhile (the correct round's update is then in every rank's state already)."""
        send = self._acc
        self._acc = 1 - send
        self._bufs[self._acc].zero_()
        future = self._worker.submit(job, self._bufs[send], self._count) if job else None
        n, error, ready = 0, None, None
        limit = self.max_micro_batches
        # The round ends when every rank has its minimum and its communication is done: a
        # rank that gets there first keeps computing micro-batches while the others catch
        # up (a non-blocking barrier tells it when), so a slow rank adds fewer micro-batches
        # instead of making the others idle.
        # A rank that never arrives ends the round after the timeout (config.timeout_s),
        # counted from this rank's barrier: CommTimeoutError below, not micro-batches forever.
        timeout, since = self._meta.seconds, None
        while limit is None or n < limit:
            if future is not None and future.done() and future.exception() is not None:
                break
            if ready is None and n >= self.min_micro_batches and (future is None or future.done()):
                ready, since = _waits.call(_ROUND, self._meta.comm.Ibarrier), time.perf_counter()
                # The last rank to get here would otherwise start one more micro-batch
                # before the barrier's messages arrive: give them a moment.
                deadline = time.perf_counter() + _BARRIER_GRACE_S
                while not _waits.call(_ROUND, ready.Test) and time.perf_counter() < deadline:
                    pass
            if ready is not None and (_waits.call(_ROUND, ready.Test) or
                                      (timeout and time.perf_counter() - since > timeout)):
                break
            try:
                stats["loss_sum"] += self._micro_batch(closure)
            except Exception as e:  # noqa: BLE001 - told to every rank below, then re-raised
                error = e
                break
            n += 1
        start = time.perf_counter()
        result, comm_error = None, None
        if future is not None:
            try:
                result = future.result()
            except CommTimeoutError:
                self._started = False
                raise  # a rank is lost: nobody to agree with
            except MpicompError as e:
                comm_error = e
        if commit and result is not None:
            self._layout.write_params(result)
        if ready is None:
            ready, since = _waits.call(_ROUND, self._meta.comm.Ibarrier), time.perf_counter()
        left = max(timeout - (time.perf_counter() - since), 1e-3) if timeout else 0
        _waits.wait(ready, left, _ROUND)
        stats["comm_wait_s"] += time.perf_counter() - start
        stats["micro_batches"] += n
        # One small exchange per round: micro-batch counts, and whether any rank failed.
        everyone = self._meta.allgather((n, error is not None or comm_error is not None))
        failed = [r for r, (_, f) in enumerate(everyone) if f]
        if failed:
            self._started = False
            self._first_half = None
            for p in self._layout.params:
                p.grad = None  # a half-finished backward's gradients must not leak into the next step
            if error is not None:
                raise error
            if comm_error is not None:
                raise comm_error
            raise RankFailedError(f"ACCO.step: rank(s) {failed} raised inside the step (see their output)")
        self._count = sum(c for c, _ in everyone)
        return result

    def step(self, closure=None):
        """Runs an estimate round and a correct round (one parameter update), calling
        ``closure`` for micro-batches meanwhile; returns the mean of their losses (float).
        On return the model holds theta_{t+1}, identical on every rank."""
        if closure is None or not callable(closure):
            raise ArgumentError("ACCO.step needs a closure: closure() runs one micro-batch forward and backward "
                                "and returns its loss")
        stats = {"micro_batches": 0, "comm_wait_s": 0.0, "loss_sum": 0.0}
        if not self._started:
            self._bufs[self._acc].zero_()
            self._round(closure, None, stats)  # g~_0 at theta_0: nothing to communicate yet
            self._started = True
        estimate = self._round(closure, self._estimate_round, stats)
        self._layout.write_params(estimate)
        self._round(closure, self._correct_round, stats, commit=True)
        mean = stats.pop("loss_sum") / stats["micro_batches"]
        stats["total_micro_batches"] = self._update_count
        self.stats = stats
        return mean

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        self._started = False
        self._first_half = None
