"""A GPU buffer on a machine (or one rank) where no GPU is usable: that rank raises
BackendError, the others ShapeMismatchError naming it, nobody hangs and the communicator
works afterwards. With a GPU, tests/gpu runs the device collectives themselves."""
import numpy as np
import pytest

import mpicomp

from _fake_device import FakeDeviceArray
from _mpiutil import comm_of

pytestmark = pytest.mark.skipif(mpicomp._core.cuda_available(), reason="a GPU is usable: see tests/gpu")


@pytest.mark.parametrize("who", ["all", "last"])
def test_device_buffer_without_gpu(who):
    comm = comm_of("world")
    mine = who == "all" or comm.Get_rank() == comm.Get_size() - 1
    x = FakeDeviceArray(1000) if mine else np.ones(1000, np.float32)
    with pytest.raises(mpicomp.BackendError if mine else mpicomp.ShapeMismatchError):
        mpicomp.allreduce(x, comm=comm, codec="int8")
    y = mpicomp.allreduce(np.full(8, comm.Get_rank(), np.float32), comm=comm, codec="none")
    assert np.array_equal(y, np.full(8, sum(range(comm.Get_size())), np.float32))
