"""OSU-style latency of mpicomp's collectives, side by side with the MPI library's own
(mpi4py) and torch.distributed's gloo on the same ranks, sizes and data.

Latency is measured as the OSU micro-benchmarks do: a barrier, ITER back-to-back calls, the
time per call on each rank, then its average, minimum and maximum over ranks. Sizes are bytes
of input per rank, float32 unless --dtype says otherwise (for reduce_scatter: the whole input;
for allgather: each rank's part). Speed-ups are the MPI library's latency divided by mpicomp's, measured in the same run.

With -c, every mpicomp result is checked against a float64 reduction of all ranks' inputs and
must lie within the codec's error bound (both compression stages), else the exit status is 1.
MPICOMP_BENCH_CORRUPT=1 adds 1 to one element of each checked result: a self-test showing
that -c catches a wrong answer (tests/test_bench.py).
"""
import os
import time

import numpy as np
from mpi4py import MPI

from .. import _core, allgather, allreduce, auto, config, node_layout, reduce_scatter, stats
from .._dtypes import ITEMSIZE
from . import bound, inputs, report
from .options import COLLECTIVE_PEERS, fmt_size, iterations, iterations_note


class Op:
    """What a benchmark needs to know of one collective."""

    def __init__(self, name, run, run_mpi, out_len, exact, stages, gloo=None):
        self.name, self.run, self.run_mpi, self.out_len = name, run, run_mpi, out_len
        self.exact, self.stages, self.gloo = exact, stages, gloo


def _parts(xs, rank, size):
    k = xs[0].size // size
    return [x[rank * k:(rank + 1) * k] for x in xs]


OPS = {
    "allreduce": Op("allreduce", lambda x, y, c, comm: allreduce(x, comm=comm, codec=c, out=y),
                    lambda x, y, comm: comm.Allreduce(x, y), lambda n, p: n,
                    lambda xs, rank, size: np.sum(xs, axis=0), stages=2, gloo="all_reduce"),
    "reduce_scatter": Op("reduce_scatter", lambda x, y, c, comm: reduce_scatter(x, comm=comm, codec=c, out=y),
                         lambda x, y, comm: comm.Reduce_scatter_block(x, y), lambda n, p: n // p,
                         lambda xs, rank, size: np.sum(_parts(xs, rank, size), axis=0), stages=1),
    "allgather": Op("allgather", lambda x, y, c, comm: allgather(x, comm=comm, codec=c, out=y),
                    lambda x, y, comm: comm.Allgather(x, y), lambda n, p: n * p,
                    lambda xs, rank, size: np.concatenate(xs), stages=1, gloo="all_gather"),
}


def _time(fn, iters, warmup, comm):
    for _ in range(warmup):
        fn()
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = (time.perf_counter() - t0) / iters * 1e6
    return comm.allreduce(t, MPI.SUM) / comm.size, comm.allreduce(t, MPI.MIN), comm.allreduce(t, MPI.MAX)


# Relative rounding of a float32 sum stored in the result's dtype (a few roundings' worth).
_ROUNDING = {"float32": 1e-5, "float16": 2.0**-10, "bfloat16": 2.0**-7, "float64": 2.0**-48}


def _bound(op, xs, exact, c, comm, dtype):
    """Per-element error bound of the result: each compression stage's bound, summed."""
    if op.name == "allgather":
        bound = np.concatenate([c.tolerance(x) for x in xs])
    else:
        bound = sum(c.tolerance(x) for x in (xs if op.name == "allreduce" else _parts(xs, comm.rank, comm.size)))
    if op.stages == 2:
        bound = bound + c.tolerance(exact)
    if op.name == "allgather" and dtype == "float32":  # decoded straight into the output: no rounding
        return bound
    return bound + _ROUNDING[dtype] * np.abs(exact) + 1e-6


def _gloo(comm):
    import torch.distributed as dist

    if not dist.is_initialized():
        from ..torch import init_process_group

        init_process_group(comm, "gloo")
    return dist


def _peer(name, op, x, y, comm, cache):
    """The call of a peer implementation: x and y are numpy arrays of the data's bytes, for
    MPI; x as mpicomp gets it (a torch tensor for bfloat16) for gloo."""
    if name == "mpi":
        return lambda: op.run_mpi(x[1], y, comm)
    import torch

    dist = cache.get("gloo") or cache.setdefault("gloo", _gloo(comm))
    tx = x[0].clone() if isinstance(x[0], torch.Tensor) else torch.from_numpy(x[0].copy())
    if op.gloo == "all_reduce":
        return lambda: dist.all_reduce(tx)
    outs = [torch.empty_like(tx) for _ in range(comm.size)]
    return lambda: dist.all_gather(outs, tx)


def _impl(hierarchy, hierarchies):
    return "mpicomp" if hierarchy == "auto" or len(hierarchies) == 1 else f"mpicomp/{hierarchy}"


def _algorithm(op, hierarchy, layout):
    """The algorithm mpicomp's call took, for its bound: two levels on nodes of several ranks
    (reduce_scatter and allgather on nodes of equal size only)."""
    two = layout.hierarchical and (op.name == "allreduce" or len(set(layout.sizes)) == 1)
    return "two_level" if hierarchy == "auto" and two else "flat"


def _label(codec, hierarchy):
    return codec.spec if hierarchy == "auto" else f"{codec.spec} ({hierarchy})"


def run(args, comm=MPI.COMM_WORLD):
    op = OPS[args.command]
    p, rank = comm.size, comm.rank
    if args.device != "cpu":
        raise SystemExit("mpicomp-bench: --device cuda: this build has no CUDA support")
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    skip_local = config.skip_local and node.Get_size() == p
    node.Free()
    notes = [f"sizes: bytes of {args.dtype} input per rank; {iterations_note(args)}, best of "
             f"{args.rounds} rounds; compression below {config.min_bytes} bytes: off (mpicomp.config.min_bytes)"
             + ("; ranks of one node: uncompressed (config.skip_local, MPICOMP_SKIP_LOCAL=1)" if skip_local else "")]
    if p == 1:
        notes.append(f"one rank: nothing travels between ranks; start it under mpiexec "
                     f"(mpiexec -n 2 mpicomp-bench {op.name} ...)")
    compare = list(args.compare)
    if "gloo" in compare and not op.gloo:
        compare.remove("gloo")
        notes.append(f"--compare gloo: left out, torch's gloo has no {op.name} on CPU")
    if "mpi" in compare and args.dtype not in ("float32", "float64") and op.name != "allgather":
        compare.remove("mpi")
        notes.append(f"--compare mpi: left out, MPI has no {args.dtype} reduction")
    # gloo runs in a pass of its own, after the others: its threads keep cores busy for a
    # while after each call, which would slow whatever is timed next.
    hierarchies = args.hierarchy or [config.hierarchy]
    passes = [[("peer", c) for c in compare if c != "gloo"] + [("mpicomp", (c, h)) for h in hierarchies
                                                               for c in args.codecs]]
    if "gloo" in compare:
        passes.append([("peer", "gloo")])
    link = bound.Link(args.link_gbit)
    layout = node_layout(comm)
    notes.append(f"Bound(us): max(link time, codec time) of one call ({link.describe()}; codec speeds measured "
                 f"here at each size in each round, the fastest kept, one core per rank, all ranks at once); "
                 f"%Bound = bound / measured (mpicomp.bench.bound)")
    out = report.Report(args, comm, op.name, notes, {c: COLLECTIVE_PEERS[c] for c in compare},
                        extra=[("Bound(us)", 12, ".1f", "bound_us"), ("%Bound", 8, ".0f", "pct_of_bound")])
    failures, cache = 0, {}
    itemsize = ITEMSIZE[args.dtype]
    for impls in passes:
        names = ", ".join(what if kind == "peer" else _label(*what) for kind, what in impls)
        for index, nbytes in enumerate(args.sizes):
            n = max(p, nbytes // itemsize // p * p) if op.name == "reduce_scatter" else max(1, nbytes // itemsize)
            x = inputs.typed(inputs.make(args.data, n, 1234 + rank), args.dtype)
            y, y_bytes = inputs.typed(np.zeros(op.out_len(n, p), np.float32), args.dtype)
            iters, warmup = iterations(args, nbytes)
            out.measuring(nbytes, index, f"{names}; rounds: {args.rounds}, iterations: {iters}")
            calls = {(kind, what): _peer(what, op, x, y_bytes, comm, cache) if kind == "peer"
                     else (lambda c=what[0]: op.run(x[0], y, c, comm)) for kind, what in impls}
            # Side by side: every implementation once per round, the best round kept; the
            # bound's codec speeds too.
            best, speeds, shares = {}, None, {}
            for _ in range(args.rounds):
                timed = bound.Speeds([what[0] for kind, what in impls if kind == "mpicomp"], x[1], args.dtype,
                                     op.out_len(n, p) * itemsize >= _core.STREAM_BYTES, comm)
                speeds = timed if speeds is None else speeds.keep_faster(timed)
                for key, fn in calls.items():
                    if key[0] == "mpicomp":  # set outside the timed calls; every rank sets the same
                        config.hierarchy = key[1][1]
                    # codec "auto": the share of the kept round's calls sent compressed (every
                    # rank decides alike, so this rank's count is everyone's).
                    adaptive = key[0] == "mpicomp" and key[1][0].adaptive
                    before = stats()[op.name] if adaptive else None
                    t = _time(fn, iters, warmup, comm)
                    if key not in best or t[0] < best[key][0]:
                        best[key] = t
                        if adaptive:
                            after = stats()[op.name]
                            ran = after["calls"] - before["calls"]
                            shares[key] = (after["compressed"] - before["compressed"]) / ran
            xs = exact = None
            if args.validation and any(k == "mpicomp" for k, _ in calls):
                xs = comm.allgather(inputs.as_float64(x[0]))
                exact = op.exact(xs, rank, p)
            records = []
            for (kind, what), (avg, lo, hi) in best.items():
                hierarchy = None if kind == "peer" else what[1]
                rec = dict(op=op.name, impl=what if kind == "peer" else _impl(hierarchy, hierarchies),
                           codec="none" if kind == "peer" else what[0].spec, hierarchy=hierarchy, size=nbytes, np=p,
                           device=args.device, dtype=args.dtype, link=report.link(),
                           avg_latency_us=avg, min_latency_us=lo, max_latency_us=hi, iterations=iters, ratio=1.0,
                           max_rel_error=None)
                if kind == "mpicomp":
                    c = what[0]
                    # One more call, counted: whether this size travels compressed (min_bytes,
                    # skip_local, codec "auto"'s decision), and the result -c checks.
                    config.hierarchy = hierarchy
                    before = stats()[op.name]
                    op.run(x[0], y, c, comm)
                    after = stats()[op.name]
                    compressed = after["compressed"] > before["compressed"]
                    # The Ratio column: this call's; for codec "auto", the codec's where most
                    # of the timed calls went compressed (this one may be of a window that goes
                    # every way in turn).
                    shown = shares[(kind, what)] >= 0.5 if c.adaptive else compressed
                    # Frames (lossless codecs, bound) take what the data needs: the bytes this
                    # call sent, summed over ranks (bound's share of its error bound differs by
                    # stage, so one encoding's ratio would not be the call's).
                    if shown and compressed and c.framed:
                        sent = comm.allreduce(np.array([after["bytes_plain"] - before["bytes_plain"],
                                                        after["bytes_wire"] - before["bytes_wire"]], np.float64))
                        rec["ratio"] = sent[0] / sent[1]
                    else:
                        rec["ratio"] = inputs.ratio(c, x[1], args.dtype) if shown else 1.0
                    if c.adaptive:
                        rec["auto_break_even"] = auto.model(comm, op.name, args.dtype, c)["break_even"]
                        rec["auto_compressed_share"] = shares[(kind, what)]
                    if args.validation:
                        if os.environ.get("MPICOMP_BENCH_CORRUPT") == "1":
                            y.reshape(-1)[0] += 1.0
                        diff = np.abs(inputs.as_float64(y) - exact)
                        rec["max_rel_error"] = float(diff.max() / max(np.abs(exact).max(), 1e-30))
                        rec["max_abs_error"] = float(comm.allreduce(diff.max(), op=MPI.MAX))
                        allowed = (_bound(op, xs, exact, c, comm, args.dtype) if compressed
                                   else _ROUNDING[args.dtype] * np.abs(exact) + 1e-6)
                        failures += comm.allreduce(int(np.count_nonzero(~(diff <= allowed))))
                link_us, codec_us = bound.bound_us(op.name, rec["codec"] if rec["ratio"] != 1.0 else "none", n,
                                                   p, rec["ratio"], speeds, link, itemsize,
                                                   algorithm=_algorithm(op, hierarchy, layout))
                rec.update(link_bound_us=link_us, codec_bound_us=codec_us,
                           bound_us=max(link_us or 0.0, codec_us) or None)
                rec["pct_of_bound"] = 100 * rec["bound_us"] / avg if rec["bound_us"] else None
                records.append(rec)
            out.rows(records)
    for c in args.codecs:
        if c.adaptive and (m := auto.model(comm, op.name, args.dtype, c)):
            spent = stats()[op.name]["probe_seconds"]
            out.note(f"{c.spec}: {m['describe']}, as measured on this communicator ({m['probes']} probe(s), "
                     f"{spent:.2f} s of measuring in all, refined by the calls; the Ratio column: the codec's where "
                     f"most timed calls went compressed)")
            for impl in dict.fromkeys(r["impl"] for r in out.records if r["codec"] == c.spec):
                went = [f"{fmt_size(r['size'])} {100 * r['auto_compressed_share']:.0f}%" for r in out.records
                        if r["codec"] == c.spec and r["impl"] == impl]
                out.note(f"{c.spec} ({impl}): share of the timed calls sent compressed: {', '.join(went)}")
    return out.finish(failures)
