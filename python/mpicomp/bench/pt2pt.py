"""Compressed point-to-point between ranks 0 and 1 (other ranks wait at a barrier), as the
OSU micro-benchmarks' osu_latency and osu_bw measure it, side by side with the MPI library's
own Send/Recv (mpi4py) on the same data.

- Latency: ping-pong; rank 0 sends, rank 1 receives and sends back; half the round trip.
- Bandwidth: rank 0 sends a window of back-to-back messages, rank 1 receives them and answers
  with one small acknowledgement; bytes of float32 input moved per second (MB/s, 1e6 bytes).

Sizes are bytes of float32 input. With -c, what rank 1 received is checked against what rank 0
sent, within the codec's one-way error bound.
"""
import os
import time

import numpy as np
from mpi4py import MPI

from .. import config, recv, send
from . import inputs, report
from .options import PT2PT_PEERS, iterations

WINDOW = 16  # messages in flight per bandwidth iteration (OSU's default window is 64)
_TAG, _ACK = 11, 12


def _pingpong(send_fn, recv_fn, rank, iters, warmup):
    for i in range(warmup + iters):
        if i == warmup:
            t0 = time.perf_counter()
        if rank == 0:
            send_fn(1)
            recv_fn(1)
        elif rank == 1:
            recv_fn(0)
            send_fn(0)
    return (time.perf_counter() - t0) / iters / 2 * 1e6


def _stream(send_fn, recv_fn, comm, rank, iters, warmup):
    ack = np.zeros(1, np.int8)
    for i in range(warmup + iters):
        if i == warmup:
            t0 = time.perf_counter()
        if rank == 0:
            for _ in range(WINDOW):
                send_fn(1)
            comm.Recv(ack, 1, _ACK)
        elif rank == 1:
            for _ in range(WINDOW):
                recv_fn(0)
            comm.Send(ack, 0, _ACK)
    return (time.perf_counter() - t0) / iters / WINDOW * 1e6


def _calls(kind, what, x, y, comm):
    if kind == "peer":
        return (lambda peer: comm.Send(x, peer, _TAG)), (lambda peer: comm.Recv(y, peer, _TAG))
    return (lambda peer: send(x, peer, comm=comm, codec=what, tag=_TAG)), \
           (lambda peer: recv(y, peer, comm=comm, codec=what, tag=_TAG))


def run(args, comm=MPI.COMM_WORLD):
    rank = comm.rank
    if comm.size < 2:
        if rank == 0:
            print("mpicomp-bench pt2pt: needs at least 2 ranks (run it under mpiexec -n 2)")
        return 2
    if args.device != "cpu":
        raise SystemExit("mpicomp-bench: --device cuda: this build has no CUDA support")
    impls = [("peer", c) for c in args.compare] + [("mpicomp", c) for c in args.codecs]
    notes = [f"ranks 0 and 1; latency: ping-pong / 2; bandwidth: windows of {WINDOW} messages (MB/s of float32 "
             f"input); best of {args.rounds} rounds; compression below {config.min_bytes} bytes: off"]
    out = report.Report(args, comm, "pt2pt", notes, {c: PT2PT_PEERS[c] for c in args.compare},
                        extra=[("Bandwidth (MB/s)", 18, ".2f", "bandwidth_mbps")])
    names = ", ".join(what if kind == "peer" else what.spec for kind, what in impls)
    failures = 0
    for index, nbytes in enumerate(args.sizes):
        n = max(1, nbytes // 4)
        x = inputs.make(args.data, n, 99)
        y = np.empty_like(x)
        iters, warmup = iterations(args, nbytes)
        out.measuring(nbytes, index, f"{names}; rounds: {args.rounds}, iterations: {iters}")
        best = {}
        for _ in range(args.rounds):
            for kind, what in impls:
                s, r = _calls(kind, what, x, y, comm)
                comm.Barrier()
                lat = _pingpong(s, r, rank, iters, warmup)
                comm.Barrier()
                per_msg = _stream(s, r, comm, rank, max(1, iters // WINDOW), 1)
                lat, per_msg = comm.bcast((lat, per_msg))  # rank 0's clock, as OSU reports
                key = (kind, what.spec if kind == "mpicomp" else what)
                old = best.get(key)
                best[key] = (min(lat, old[0]), min(per_msg, old[1])) if old else (lat, per_msg)
        records = []
        for kind, what in impls:
            name = what.spec if kind == "mpicomp" else what
            lat, per_msg = best[(kind, name)]
            rec = dict(op="pt2pt", impl="mpicomp" if kind == "mpicomp" else what, codec=name if kind == "mpicomp"
                       else "none", size=nbytes, np=comm.size, device=args.device, link=report.link(), avg_latency_us=lat,
                       min_latency_us=lat, max_latency_us=lat, iterations=iters, bandwidth_mbps=nbytes / per_msg,
                       ratio=1.0, max_rel_error=None)
            if kind == "mpicomp":
                compressed = what.id != 0 and nbytes >= config.min_bytes
                rec["ratio"] = inputs.ratio(what, x) if compressed else 1.0
                if args.validation:
                    failures += _validate(what, x, y, comm, compressed, rec)
            records.append(rec)
        out.rows(records)
    return out.finish(failures)


def _validate(c, x, y, comm, compressed, rec):
    """Rank 1 checks one more transfer; the count of bad elements reaches every rank."""
    bad = 0
    if comm.rank == 0:
        send(x, 1, comm=comm, codec=c, tag=_TAG)
    elif comm.rank == 1:
        recv(y, 0, comm=comm, codec=c, tag=_TAG)
        if os.environ.get("MPICOMP_BENCH_CORRUPT") == "1":
            y[0] += 1.0
        exact = x.astype(np.float64)
        diff = np.abs(y.astype(np.float64) - exact)
        bound = c.tolerance(exact) + 1e-6 * np.abs(exact) if compressed else np.zeros_like(exact)
        rec["max_rel_error"] = float(diff.max() / max(np.abs(exact).max(), 1e-30))
        bad = int(np.count_nonzero(~(diff <= bound)))
    rec["max_rel_error"] = comm.bcast(rec["max_rel_error"], root=1)
    return comm.allreduce(bad)
