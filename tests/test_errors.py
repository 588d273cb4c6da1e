"""Every documented error, with its class and a message naming the argument and the value
(one process: the rejection handshake with other ranks is tested in tests/mpi)."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from mpi4py import MPI

import mpicomp

from _fake_device import FakeDeviceArray


def test_hierarchy():
    for cls in (mpicomp.CodecError, mpicomp.ShapeMismatchError, mpicomp.BackendError, mpicomp.ArgumentError):
        assert issubclass(cls, mpicomp.MpicompError)


@pytest.mark.parametrize("call,cls,needle", [
    (lambda: mpicomp.allreduce(np.ones(4, np.float32), codec="zip"), mpicomp.CodecError, "'zip'"),
    (lambda: mpicomp.allreduce(np.ones(4, np.float32), op="prod"), mpicomp.ArgumentError, "'prod'"),
    (lambda: mpicomp.allreduce(np.ones((4, 4), np.float32)[:, 1]), mpicomp.ArgumentError, "C-contiguous"),
    (lambda: mpicomp.allreduce(torch.ones(4, 4).t()), mpicomp.ArgumentError, "contiguous"),
    (lambda: mpicomp.allreduce([1.0, 2.0]), mpicomp.ArgumentError, "list"),
    (lambda: mpicomp.allreduce(np.ones(4, np.complex128)), mpicomp.CodecError, "complex128"),
    (lambda: mpicomp.allreduce(torch.ones(4, dtype=torch.complex64)), mpicomp.CodecError, "complex64"),
    (lambda: mpicomp.allreduce(np.ones(4, np.int32), codec="int8"), mpicomp.CodecError, "int32"),
    (lambda: mpicomp.allreduce(np.ones(4, np.int32), codec="none", op="avg"), mpicomp.ArgumentError, "avg"),
    (lambda: mpicomp.allreduce(np.ones(4, np.float32), out=np.ones(5, np.float32)), mpicomp.ArgumentError, "5"),
    (lambda: mpicomp.allreduce(np.ones(4, np.float32), out=np.ones(4, np.float64)), mpicomp.ArgumentError, "float64"),
    (lambda: mpicomp.allreduce(torch.ones(4), out=np.ones(4, np.float32)), mpicomp.ArgumentError, "torch tensor"),
    (lambda: mpicomp.allreduce(np.ones(4, np.float32), comm="world"), mpicomp.ArgumentError, "'world'"),
    (lambda: mpicomp.allreduce(np.ones(4, np.float32), error_feedback=[]), mpicomp.ArgumentError, "list"),
    (lambda: mpicomp.allreduce(torch.ones(4, device="meta")), mpicomp.BackendError, "meta"),
    (lambda: mpicomp.send(np.ones(4, np.float32), dest=5), mpicomp.ArgumentError, "dest"),
    (lambda: mpicomp.recv(np.ones(4, np.float32), source=-7), mpicomp.ArgumentError, "source"),
])
def test_bad_input(call, cls, needle):
    with pytest.raises(cls, match=needle):
        call()


def test_config_checks_values():
    with pytest.raises(mpicomp.ArgumentError, match="eager_bytes"):
        mpicomp.config.eager_bytes = 1 << 31
    with pytest.raises(AttributeError, match="no setting"):
        mpicomp.config.threshold = 5
    before = mpicomp.config.min_bytes
    mpicomp.config.min_bytes = 123
    try:
        assert mpicomp.config.min_bytes == 123
    finally:
        mpicomp.config.min_bytes = before


def test_node_settings_check_values():
    with pytest.raises(mpicomp.ArgumentError, match="hierarchy must be one of 'auto', 'flat', got 'tree'"):
        mpicomp.config.hierarchy = "tree"
    with pytest.raises(mpicomp.ArgumentError, match=r"ranks_per_node must be an integer in \[0"):
        mpicomp.config.ranks_per_node = -2
    assert mpicomp.config.hierarchy == "auto" and mpicomp.config.ranks_per_node == 0
    mpicomp.config.hierarchy = "flat"
    try:
        assert mpicomp.config.hierarchy == "flat"
    finally:
        mpicomp.config.hierarchy = "auto"


@pytest.mark.parametrize("var,value,needle", [("MPICOMP_HIERARCHY", "tree", "invalid setting MPICOMP_HIERARCHY=tree: expected auto or flat"),
                                              ("MPICOMP_RANKS_PER_NODE", "two", "invalid setting MPICOMP_RANKS_PER_NODE=two: expected an integer")])
def test_node_settings_from_the_environment_are_checked(var, value, needle):
    r = subprocess.run([sys.executable, "-c", "import mpicomp"], capture_output=True, text=True,
                       env={**os.environ, var: value})
    assert r.returncode != 0 and needle in r.stderr, r.stderr[-2000:]


def test_one_rank_is_one_node():
    lay = mpicomp.node_layout(MPI.COMM_SELF)
    assert lay.node_of == (0,) and lay.nodes == 1 and lay.sizes == (1,) and lay.lanes == 1


def test_comm_still_usable_after_errors():
    with pytest.raises(mpicomp.CodecError):
        mpicomp.allreduce(np.ones(4, np.float32), codec="zip")
    np.testing.assert_array_equal(mpicomp.allreduce(np.ones(4, np.float32), codec="none"), np.full(4, MPI.COMM_WORLD.size))



@pytest.mark.skipif(mpicomp._core.cuda_available(), reason="a GPU is usable here: tests/gpu covers device buffers")
@pytest.mark.parametrize("call", [
    lambda x: mpicomp.allreduce(x, comm=MPI.COMM_SELF, codec="int8"),
    lambda x: mpicomp.reduce_scatter(x, comm=MPI.COMM_SELF, codec="none"),
    lambda x: mpicomp.allgather(x, comm=MPI.COMM_SELF, codec="int4", out=FakeDeviceArray(1024)),
    lambda x: mpicomp.iallreduce(x, comm=MPI.COMM_SELF).wait(),
    lambda x: mpicomp.send(x, 0, comm=MPI.COMM_SELF),
])
def test_device_buffer_without_a_gpu_is_a_backend_error(call):
    with pytest.raises(mpicomp.BackendError, match="GPU memory"):
        call(FakeDeviceArray())


def test_iallreduce_below_thread_multiple_is_a_backend_error():
    """iallreduce runs MPI on a worker thread, which needs MPI_THREAD_MULTIPLE: a program that
    asked mpi4py for less is told so before anything starts (a new process: the level is
    fixed at MPI_Init)."""
    program = ("import mpi4py\nmpi4py.rc.thread_level = 'serialized'\nimport numpy as np\nimport mpicomp\n"
               "try:\n    mpicomp.iallreduce(np.ones(4, np.float32)).wait()\n"
               "except mpicomp.BackendError as e:\n    print('BackendError:', e)\n")
    r = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert "BackendError:" in r.stdout and "MPI_THREAD_MULTIPLE" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "MPI_THREAD_SERIALIZED" in r.stdout
