"""tests/gpu/mpi (the collectives on GPU buffers) under mpiexec with 2 ranks sharing the GPU,
with a timeout so that a hang fails. Skipped without a GPU."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mpicomp import _core

HERE = Path(__file__).parent
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not (_core.cuda_available() and torch.cuda.is_available()),
                    reason="needs a CUDA GPU and a CUDA build of mpicomp")
def test_device_collectives_under_mpiexec():
    cmd = [str(Path(sys.executable).parent / "mpiexec"), "-n", "2", sys.executable, "-m", "pytest", "-q",
           "-p", "no:cacheprovider", "--timeout=240", "--timeout-method=thread", str(HERE / "mpi")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=os.environ.copy())
    assert r.returncode == 0, f"{r.stdout[-6000:]}\n{r.stderr[-6000:]}"
