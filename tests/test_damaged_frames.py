"""A lossless frame damaged on the wire fails the collective on every rank, with CodecError
naming who received it, and the communicator stays usable: a damaged message never comes
back as zeros or someone else's numbers, and no rank waits forever (issue 23 item 5). The
damage comes from damage/shim.c, preloaded, which overwrites one rank's first stage message."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import allow_open_mpi_here, mpiexec

HERE = Path(__file__).resolve().parent / "damage"
BIN = Path(sys.executable).parent
allow_open_mpi_here()


@pytest.fixture(scope="module")
def shim(tmp_path_factory):
    lib = tmp_path_factory.mktemp("damage") / "libdamage.so"
    subprocess.run([str(BIN / "mpicc"), "-O1", "-shared", "-fPIC", "-o", str(lib), str(HERE / "shim.c"), "-ldl"],
                   check=True, timeout=120)
    return lib


@pytest.mark.parametrize("codec", ["lz4", "lossless"])
@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("coll", ["allreduce", "reduce_scatter", "allgather"])
def test_damaged_frame_fails_the_call_on_every_rank(shim, coll, n, codec):
    env = dict(os.environ, LD_PRELOAD=str(shim), DAMAGE_RANK="1", DAMAGE_MESSAGES="1")
    r = mpiexec(n, sys.executable, HERE / "check.py", coll, codec, timeout=120, env=env)
    lines = sorted(line for line in r.stdout.splitlines() if line.startswith("rank "))
    assert r.returncode == 0 and len(lines) == n, r.stdout + r.stderr
    for line in lines:
        assert "CodecError" in line and "corrupt" in line and "failed on every rank" in line, line
        assert line.endswith("next call right: True"), line
    # the rank that received the damaged frame names its sender
    assert any("received a corrupt frame from rank 1" in line for line in lines), lines
