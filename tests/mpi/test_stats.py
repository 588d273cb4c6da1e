"""mpicomp.stats(): every call counted, compressed or with the reason it was not, and the
bytes on the wire against what the same calls send uncompressed. Runs in every rank."""
import numpy as np
import pytest
from mpi4py import MPI

import mpicomp

WORLD = MPI.COMM_WORLD


@pytest.fixture(autouse=True)
def _fresh():
    mpicomp.reset_stats()


def test_each_reason_is_counted():
    big = np.ones(1 << 15, np.float32)  # 128 KiB: above min_bytes
    mpicomp.allreduce(big, codec="int8")
    mpicomp.allreduce(big[:10], codec="int8")
    mpicomp.allreduce(big, codec="none")
    mpicomp.allreduce(big, comm=MPI.COMM_SELF, codec="int8")
    s = mpicomp.stats()["allreduce"]
    one = WORLD.size == 1
    assert s["calls"] == 4 and s["compressed"] == (0 if one else 1)
    expect = {"none": 1, "one_rank": 3} if one else {"small": 1, "none": 1, "one_rank": 1}
    assert s["skipped"] == expect, s
    assert s["bytes_in"] == 3 * big.nbytes + 40


@pytest.mark.parametrize("coll,codec,ratio", [("allreduce", "int8", 3.9), ("reduce_scatter", "int4", 7.7),
                                              ("allgather", "bf16", 1.99)])
def test_bytes_on_the_wire_shrink_by_the_codec_ratio(coll, codec, ratio):
    if WORLD.size == 1:
        pytest.skip("nothing is sent on one rank")
    x = np.random.default_rng(WORLD.rank).standard_normal(WORLD.size * (1 << 16)).astype(np.float32)
    getattr(mpicomp, coll)(x, codec=codec)
    s = mpicomp.stats()[coll]
    p = WORLD.size
    plain = {"allreduce": 2 * (p - 1) * x.nbytes // p, "reduce_scatter": (p - 1) * x.nbytes // p,
             "allgather": (p - 1) * x.nbytes}[coll]
    assert s["bytes_plain"] == plain
    assert ratio * 0.98 < plain / s["bytes_wire"] < ratio * 1.02, s


def test_send_recv_are_counted_on_the_sender():
    if WORLD.size == 1:
        pytest.skip("needs 2 ranks")
    x = np.ones(1 << 16, np.float32)
    if WORLD.rank == 0:
        mpicomp.send(x, 1, codec="int8")
    elif WORLD.rank == 1:
        mpicomp.recv(np.empty_like(x), 0, codec="int8")
    s = mpicomp.stats()["send/recv"]
    assert s["calls"] == (1 if WORLD.rank == 0 else 0)
    if WORLD.rank == 0:
        assert s["compressed"] == 1 and 3.9 < s["bytes_plain"] / s["bytes_wire"] < 4


@pytest.mark.parametrize("k", [1, 700])
def test_small_reduce_scatter_goes_by_recursive_halving(k):
    """An uncompressed reduce-scatter that rides the agreement moves what MPI's recursive
    halving moves, counted by mpicomp.stats() (all of it inside this one node): of p ranks, the
    p - pof2 beyond a power of two hand their vector (V bytes) to a partner and get their part
    back; each round the others send the half of what they hold that their partner keeps
    (pof2 / 2 V in the first round over all of them, then half as much): (p - 1) V + (p - pof2) V / p
    over the ranks, where recursive doubling sends the whole vector every round."""
    p = WORLD.size
    x = np.ones(k * p, np.float32)
    y = mpicomp.reduce_scatter(x, codec="none")
    assert np.array_equal(y, np.full(k, p, np.float32))
    s = mpicomp.stats()["reduce_scatter"]
    assert s["algorithms"] == {"eager": 1}
    pof2 = 1 << (p.bit_length() - 1)
    assert WORLD.allreduce(s["bytes_inter"] + s["bytes_intra"]) == (p - 1) * x.nbytes + (p - pof2) * x.nbytes // p
