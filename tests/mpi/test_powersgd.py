"""PowerSGD (mpicomp.powersgd, and codec "powersgd" of mpicomp.allreduce) against float64
references built with plain mpi4py and numpy's SVD."""
import numpy as np
import pytest
import torch

import mpicomp
from mpicomp.powersgd import PowerSGDState

from _mpiutil import assert_identical_on_all_ranks, comm_of


def rank_matrices(comm, n, m, r, seed):
    """This rank's n x m matrix U V_rank^T, sharing the column space U (rank r) with the others,
    and the float64 sum over ranks."""
    u = np.random.default_rng(seed).standard_normal((n, r))
    vs = [np.random.default_rng(seed + 1 + k).standard_normal((m, r)) for k in range(comm.Get_size())]
    return (u @ vs[comm.Get_rank()].T).astype(np.float32), sum(u @ v.T for v in vs)


@pytest.mark.parametrize("kind", ["world", "split"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_exact_when_the_sum_has_low_rank(kind, op):
    """One power iteration recovers a sum whose columns span <= rank directions."""
    comm = comm_of(kind)
    x, exact = rank_matrices(comm, 96, 80, 3, seed=5)
    y = mpicomp.allreduce(x, comm=comm, codec="powersgd:rank=4", op=op)
    if op == "avg":
        exact = exact / comm.Get_size()
    assert y.shape == x.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, exact, rtol=0, atol=2e-5 * np.abs(exact).max())
    assert_identical_on_all_ranks(comm, y)


@pytest.mark.parametrize("via", ["powersgd.allreduce", "mpicomp.allreduce"])
def test_error_feedback_mean_converges_to_the_exact_mean(via):
    comm = comm_of("world")
    x = np.random.default_rng(comm.Get_rank()).standard_normal((64, 48)).astype(np.float32)
    exact = comm.allreduce(x.astype(np.float64)) / comm.Get_size()
    state, acc, steps = PowerSGDState(rank=4), np.zeros(x.shape), 300

    def call():
        if via == "mpicomp.allreduce":
            return mpicomp.allreduce(x, comm=comm, codec="powersgd:rank=4", op="avg", error_feedback=state)
        return mpicomp.powersgd.allreduce(x, state, comm=comm, op="avg")

    first = call()
    acc += first
    for _ in range(steps - 1):
        acc += call()
    one_shot = np.abs(first - exact).max()
    converged = np.abs(acc / steps - exact).max()
    assert converged < 0.05 * one_shot, (one_shot, converged)
    assert state.q.shape == (48, 4) and state.feedback.residual.shape == (64 * 48,)


def test_warm_start_converges_to_the_best_rank_r_approximation():
    """The same matrix every call: with a warm start the calls are steps of a power
    iteration, and the result approaches the sum's best rank-2 approximation (Eckart-Young:
    its SVD truncated); a fresh Q each call (no state, or a plain ErrorFeedback without a
    residual yet) stays as far as the first call."""
    comm = comm_of("world")
    rng = np.random.default_rng(0)
    u, _ = np.linalg.qr(rng.standard_normal((60, 6)))
    v, _ = np.linalg.qr(rng.standard_normal((40, 6)))
    exact = u @ np.diag([8, 4, 1, 0.5, 0.25, 0.1]) @ v.T  # every rank holds exact / size
    x = (exact / comm.Get_size()).astype(np.float32)
    s = np.linalg.svd(exact, compute_uv=False)
    best = np.sqrt((s[2:] ** 2).sum())  # the error of the truncated SVD
    state = PowerSGDState(rank=2, error_feedback=False)
    for _ in range(25):
        warm = mpicomp.powersgd.allreduce(x, state, comm=comm)
    cold = mpicomp.allreduce(x, comm=comm, codec="powersgd:rank=2")
    assert np.linalg.norm(warm - exact) < best * 1.001 + 1e-4, (np.linalg.norm(warm - exact), best)
    assert np.linalg.norm(cold - exact) > best * 1.05, (np.linalg.norm(cold - exact), best)
    assert state.feedback is None and state.q.shape == (40, 2)


def test_plain_error_feedback_keeps_the_residual_only():
    comm = comm_of("world")
    x, _ = rank_matrices(comm, 64, 48, 8, seed=2)
    ef = mpicomp.ErrorFeedback()
    mpicomp.allreduce(x, comm=comm, codec="powersgd:rank=4", error_feedback=ef)
    assert ef.residual.shape == (64 * 48,) and not hasattr(ef, "q")


def test_state_and_codec_must_agree():
    comm = comm_of("world")
    x = np.ones((64, 64), np.float32)
    with pytest.raises(mpicomp.ArgumentError, match="PowerSGDState of codec 'powersgd:rank=2'"):
        mpicomp.allreduce(x, comm=comm, codec="powersgd:rank=4", error_feedback=PowerSGDState(rank=2))
    with pytest.raises(mpicomp.ArgumentError, match="state must be a PowerSGDState or None, got ErrorFeedback"):
        mpicomp.powersgd.allreduce(x, mpicomp.ErrorFeedback(), comm=comm)
    with pytest.raises(mpicomp.ArgumentError, match="warm_start must be a bool"):
        PowerSGDState(warm_start=1)
    with pytest.raises(mpicomp.CodecError, match="rank must be a positive integer"):
        PowerSGDState(rank=0)
    # one rank's state disagrees: it raises its own error, the others name it
    if comm.Get_size() > 1:
        bad = PowerSGDState(rank=2 if comm.Get_rank() == 0 else 4)
        with pytest.raises(mpicomp.ArgumentError if comm.Get_rank() == 0 else mpicomp.ShapeMismatchError):
            mpicomp.allreduce(x, comm=comm, codec="powersgd:rank=4", error_feedback=bad)
    assert np.array_equal(mpicomp.allreduce(x, comm=comm, codec="none"), x * comm.Get_size())


def test_torch_tensors_keep_type_shape_and_match_numpy():
    comm = comm_of("world")
    x, exact = rank_matrices(comm, 16, 8, 2, seed=11)  # n-D: viewed as 16 x (2 * 4)
    t = torch.from_numpy(x).reshape(16, 2, 4)
    y = mpicomp.allreduce(t, comm=comm, codec="powersgd:rank=2")
    assert isinstance(y, torch.Tensor) and y.shape == (16, 2, 4) and y.dtype == torch.float32
    np.testing.assert_allclose(y.reshape(16, 8).numpy(), exact, atol=2e-5 * np.abs(exact).max())
    b = mpicomp.allreduce(t.to(torch.bfloat16), comm=comm, codec="powersgd:rank=2")
    assert b.dtype == torch.bfloat16 and b.shape == (16, 2, 4)


@pytest.mark.parametrize("shape", [(1000,), (3, 2), (4, 400), ()])
def test_vectors_and_small_matrices_go_exactly(shape):
    comm = comm_of("world")
    x = np.random.default_rng(comm.Get_rank()).standard_normal(shape).astype(np.float32)
    state = PowerSGDState(rank=4)
    y = mpicomp.allreduce(x, comm=comm, codec="powersgd:rank=4", error_feedback=state)
    assert np.array_equal(y, mpicomp.allreduce(x, comm=comm, codec="none"))
    assert state.feedback.residual is None and state.q is None


def test_non_finite_input_gives_nan_everywhere_and_keeps_the_state():
    comm = comm_of("world")
    x, _ = rank_matrices(comm, 64, 64, 2, seed=3)
    state = PowerSGDState(rank=2)
    mpicomp.powersgd.allreduce(x, state, comm=comm)
    saved = (state.feedback.residual.copy(), state.q.copy())
    bad = x.copy()
    if comm.Get_rank() == 0:
        bad[5, 7] = np.inf
    y = mpicomp.powersgd.allreduce(bad, state, comm=comm)
    assert np.isnan(y).all()
    assert np.array_equal(state.feedback.residual, saved[0]) and np.array_equal(state.q, saved[1])


def test_iallreduce_matches_allreduce():
    comm = comm_of("world")
    x, _ = rank_matrices(comm, 128, 64, 4, seed=9)
    ea, eb = PowerSGDState(rank=2), PowerSGDState(rank=2)
    for _ in range(3):
        req = mpicomp.iallreduce(x, comm=comm, codec="powersgd:rank=2", error_feedback=ea)
        y = mpicomp.allreduce(x, comm=comm, codec="powersgd:rank=2", error_feedback=eb)
        assert np.array_equal(req.wait(), y)


def test_wire_collectives_refuse_it_on_every_rank():
    comm = comm_of("world")
    x = np.ones(comm.Get_size() * 8, np.float32)
    with pytest.raises(mpicomp.CodecError, match="reduce_scatter: codec 'powersgd' is an allreduce algorithm"):
        mpicomp.reduce_scatter(x, comm=comm, codec="powersgd")
    with pytest.raises(mpicomp.CodecError, match="send: codec 'powersgd' is an allreduce algorithm"):
        mpicomp.send(x, (comm.Get_rank() + 1) % comm.Get_size(), comm=comm, codec="powersgd")
    with pytest.raises(mpicomp.CodecError, match="integer arrays"):
        mpicomp.allreduce(np.ones((64, 64), np.int32), comm=comm, codec="powersgd")
    # rank 0 compresses a 256 x 256 matrix (its factors: 256 x 4 numbers), the others would
    # send 4 x 256 whole: as many numbers, so only the shape agreement tells them apart
    if comm.Get_size() > 1:
        n = 256 if comm.Get_rank() == 0 else 4
        with pytest.raises(mpicomp.ShapeMismatchError, match="shape or dtype"):
            mpicomp.allreduce(np.ones((n, 256), np.float32), comm=comm, codec="powersgd")
        with pytest.raises(mpicomp.ShapeMismatchError):  # powersgd on one rank, int8 on the others
            mpicomp.allreduce(np.ones((256, 256), np.float32), comm=comm,
                              codec="powersgd" if comm.Get_rank() == 0 else "int8")
    y = mpicomp.allreduce(x, comm=comm, codec="none")
    assert np.array_equal(y, x * comm.Get_size())
