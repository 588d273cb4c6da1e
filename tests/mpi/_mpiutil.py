"""Shared helpers of the multi-rank tests: communicators, data, float64 references (via plain
mpi4py on float64 copies, never mpicomp), error bounds."""

import contextlib
import hashlib
import zlib

import numpy as np
from mpi4py import MPI

import mpicomp

import _reference as ref

WORLD = MPI.COMM_WORLD
CODECS = ref.CODECS
COMM_KINDS = ["world", "split", "dup", "cart"]

_comms = {}


def comm_of(kind):
    """COMM_WORLD, a Split by rank parity, a Dup, a Create_cart, a Dup laid out as a node per
    rank; created once, collectively (every rank runs the same tests in the same order, so the
    first use is on all ranks)."""
    if kind not in _comms:
        if kind == "world":
            c = WORLD
        elif kind == "split":
            c = WORLD.Split(WORLD.Get_rank() % 2, WORLD.Get_size() - WORLD.Get_rank())  # reversed order too
        elif kind == "dup":
            c = WORLD.Dup()
        elif kind == "cart":
            c = WORLD.Create_cart([WORLD.Get_size()], periods=[True], reorder=False)
        elif kind == "a node per rank":
            c = node_per_rank()
        else:
            raise ValueError(kind)
        _comms[kind] = c
    return _comms[kind]


def node_per_rank():
    """A new Dup of COMM_WORLD laid out as a node per rank: every message crosses between nodes
    (cpp/coll/exchange.h: rest)."""
    with config(ranks_per_node=1):
        c = WORLD.Dup()
        assert mpicomp.node_layout(c).nodes == c.Get_size()
    return c


def rng(comm, *key):
    """A generator different on every rank of comm, the same from run to run."""
    return np.random.default_rng(zlib.crc32(repr((key, comm.Get_rank(), comm.Get_size())).encode()))


def data(comm, n, *key, shape=None):
    """float64 data of mixed magnitudes, different on every rank."""
    g = rng(comm, n, *key)
    x = g.standard_normal(n) * np.exp(g.uniform(-2, 2, n))
    return x if shape is None else x.reshape(shape)


KINDS = ["np-float32", "np-float16", "np-float64", "torch-float32", "torch-bfloat16"]


def as_kind(x64, kind):
    """The float64 data as an array of `kind`, and the float64 values that array holds."""
    lib, dt = kind.split("-")
    if lib == "np":
        a = x64.astype(dt)
        return a, a.astype(np.float64)
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x64)).to(getattr(torch, dt))
    return t, t.double().numpy()


def to64(y):
    if isinstance(y, np.ndarray):
        return y.astype(np.float64)
    return y.double().numpy()


def dtype_name(y):
    if isinstance(y, np.ndarray):
        return y.dtype.name
    return str(y.dtype).replace("torch.", "")


def digest(y):
    """Bytes of a result, hashed (to compare results across ranks bit for bit)."""
    if not isinstance(y, np.ndarray):
        import torch

        y = y.contiguous().view(torch.uint8).numpy() if y.numel() else np.empty(0, np.uint8)
    return hashlib.sha1(np.ascontiguousarray(y).view(np.uint8).tobytes()).hexdigest()


def assert_identical_on_all_ranks(comm, y):
    d = comm.allgather(digest(y))
    assert len(set(d)) == 1, f"ranks got different results: {d}"


@contextlib.contextmanager
def config(**kw):
    """Sets mpicomp.config fields (the same on every rank) and restores them."""
    before = {k: getattr(mpicomp.config, k) for k in kw}
    for k, v in kw.items():
        setattr(mpicomp.config, k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            setattr(mpicomp.config, k, v)


def compressed():
    """Compress every message, however small (no threshold, no eager path)."""
    return config(min_bytes=0, eager_bytes=0)


def sum64(comm, a):
    """Sum over ranks in float64 (mpi4py, not mpicomp)."""
    a = np.ascontiguousarray(a, np.float64)
    out = np.empty_like(a)
    comm.Allreduce(a, out, op=MPI.SUM)
    return out


def parts_tolerance(c, x64, bounds):
    """The codec's per-element bound when x64 is encoded as separate parts [bounds[j], bounds[j+1])."""
    t = np.zeros(x64.size)
    flat = x64.ravel()
    for a, b in zip(bounds[:-1], bounds[1:]):
        if b > a:
            t[a:b] = c.tolerance(flat[a:b])
    return t


def check_close(y64, exact, bound, what=""):
    err = np.abs(y64 - exact)
    bad = np.flatnonzero(~(err <= bound))
    assert bad.size == 0, (f"{what}: {bad.size} of {exact.size} elements over the bound; first at {bad[0]}: "
                           f"exact={exact.flat[bad[0]]!r} got={y64.flat[bad[0]]!r} err={err.flat[bad[0]]!r} "
                           f"bound={bound.flat[bad[0]]!r}")


def allreduce_bound(comm, c, x64, compressed_path, avg, out_dtype):
    """Error bound of a compressed allreduce of the float64 values x64 (this rank's input),
    element-wise, and the float64 exact result. Stage 1: each rank's x encoded once (parts
    start on block boundaries, so global blocks); float32 accumulation of `size` terms;
    stage 2: the float32 sum encoded once; then the division (avg) and the output dtype's
    rounding. All slack terms are explicit below."""
    size = comm.Get_size()
    flat = x64.ravel()
    tol = c.tolerance(flat) if compressed_path else np.zeros_like(flat)
    exact, absum, t1 = sum64(comm, np.stack([flat, np.abs(flat), tol]))  # one Allreduce for all three
    # float32 accumulation: each of the size - 1 additions rounds by at most 2^-24 of the
    # running magnitude (<= absum + t1); loading the input to float32 rounds once more.
    acc = (size + 1) * 2.0**-24 * (absum + t1) + 2.0**-149
    t2 = c.tolerance(np.abs(exact) + t1 + acc) if compressed_path else 0
    total = t1 + acc + t2
    div = size if avg else 1
    mag = (np.abs(exact) + total) / div
    # the 1/size scale (float32) and the final store: float32 rounding, then the output dtype's
    out = 2 * ref.f32_rounding(mag) + ref.output_rounding(out_dtype, mag)
    return exact / div, total / div + out
