"""An allreduce goes a tile (one segment per rank) at a time, tile k+1's reduce-scatter in
flight while tile k's allgather is: segment sizes, and results equal to tiles reduced one by
one. Runs in every rank (see tests/test_mpi_launch.py); must pass at any size, 1 included."""
import numpy as np
import pytest
import torch
from mpi4py import MPI

import mpicomp
from mpicomp import _core
from mpicomp._dtypes import DTYPE_IDS

from _mpiutil import config

WORLD = MPI.COMM_WORLD


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("segment_bytes", [1 << 19, 4096])
@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "int4", "sign", "int4:block=64"])
def test_segments_carry_an_eighth_of_segment_bytes_on_the_wire(name, segment_bytes, dtype):
    """A message costs a latency whatever its size: segments are segment_bytes of input, or
    the fewest whole blocks more that put segment_bytes / 8 on the wire (sign, 28x)."""
    c = mpicomp.codec(name)
    itemsize, block = np.dtype(dtype).itemsize, c.block or 1
    n = _core.segment_elements(c.id, c.block, DTYPE_IDS[dtype], segment_bytes)
    plain = segment_bytes // itemsize // block * block
    assert n % block == 0 and n >= plain
    assert c.encoded_bytes(n, dtype) >= segment_bytes // 8 or n == plain
    assert n == plain or c.encoded_bytes(n - block, dtype) < segment_bytes // 8
    if c.ratio(dtype) <= 8:
        assert n == plain


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize("name", ["fp16", "bf16", "int8", "int4", "sign", "lz4", "lossless"])
def test_tiles_in_flight_give_the_bits_of_tiles_one_by_one(name, op, dtype):
    """Tile k+1's reduce-scatter starts while tile k's allgather is on the wire, over other
    wire buffers and another accumulator: each tile's result has the bits of that tile
    reduced in a call of its own (one tile, nothing in flight beside it), last tile short."""
    if WORLD.size == 1:
        pytest.skip("nothing is compressed on one rank")
    c = mpicomp.codec(name)
    seg = _core.segment_elements(c.id, c.block, DTYPE_IDS[dtype], 4096)
    tile = WORLD.size * seg
    n = 5 * tile + tile // 3 + 7
    rng = np.random.default_rng(WORLD.rank)
    x = torch.from_numpy(np.maximum(rng.standard_normal(n), 0).astype(np.float32)).to(getattr(torch, dtype))
    with config(min_bytes=0, segment_bytes=4096):
        y = mpicomp.allreduce(x, codec=name, op=op)
        parts = [mpicomp.allreduce(x[i:i + tile].clone(), codec=name, op=op) for i in range(0, n, tile)]
    bits = torch.int32 if dtype == "float32" else torch.int16
    assert torch.equal(y.view(bits), torch.cat(parts).view(bits))
