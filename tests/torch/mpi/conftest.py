"""Runs in every rank of `mpiexec -n N python -m pytest tests/torch/mpi` (see
tests/test_torch_launch.py). A rank whose test fails aborts the whole job, so the others do
not wait in the next collective until the outer timeout. torch.distributed (gloo) is set up
once per session for the tests that compare against torch's own DDP."""
import socket
import sys

import pytest
from mpi4py import MPI

WORLD = MPI.COMM_WORLD


def pytest_runtest_logreport(report):
    if report.failed and WORLD.Get_size() > 1:
        sys.stderr.write(f"\n[rank {WORLD.Get_rank()}] FAILED {report.nodeid} ({report.when})\n"
                         f"{report.longreprtext}\n")
        sys.stderr.flush()
        WORLD.Abort(1)


@pytest.fixture(scope="session")
def gloo():
    """torch.distributed over gloo with COMM_WORLD's ranks; rank 0 picks a free port."""
    import torch.distributed as dist

    port = None
    if WORLD.Get_rank() == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = WORLD.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=WORLD.Get_rank(),
                            world_size=WORLD.Get_size())
    yield dist
    dist.destroy_process_group()


@pytest.fixture(autouse=True)
def _same_config():
    """Tests that change mpicomp.config get it back as it was. All ranks of these tests
    share one machine, where collectives skip compression unless config.compress_local is
    set: the tests set it, to exercise the codecs (test_collectives.py checks the default)."""
    import mpicomp

    fields = ("min_bytes", "eager_bytes", "segment_bytes", "compress_local")
    saved = [getattr(mpicomp.config, f) for f in fields]
    mpicomp.config.compress_local = 1
    yield
    for f, v in zip(fields, saved):
        setattr(mpicomp.config, f, v)
