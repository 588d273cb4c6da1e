"""tests/gpu/mpi (the collectives on GPU buffers) under mpiexec with 2 ranks sharing the GPU,
with a timeout so that a hang fails. Skipped without a GPU."""
import sys
from pathlib import Path

import pytest
from _launch import mpiexec

from mpicomp import _core

HERE = Path(__file__).parent
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not (_core.cuda_available() and torch.cuda.is_available()),
                    reason="needs a CUDA GPU and a CUDA build of mpicomp")
def test_device_collectives_under_mpiexec():
    r = mpiexec(2, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=240",
                "--timeout-method=thread", HERE / "mpi", timeout=900)
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
