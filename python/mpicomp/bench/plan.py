"""mpicomp-bench plan: AMSP's planner on the command line (mpicomp.optim.amsp.plan).

    mpicomp-bench plan --params 7G --world 1024 --ranks-per-node 8 --memory 80G \\
        --activations 20G --intra 150G --inter 25G [--modules 32] [--json plan.json]

Quantities are decimal: K = 1e3, M = 1e6, G = 1e9, T = 1e12 (bytes, bytes/s, parameters).
--intra and --inter also take a file written by ``mpicomp-bench allgather|reduce_scatter|
allreduce --json`` (amsp.bandwidth_from_bench: its largest codec-none call).
Prints plan.explain(); exits 1 with the planner's message when nothing fits.
"""
import argparse
import json
import re
import sys

_SI = {"": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def quantity(text):
    """'7G', '80e9', '1.5T' -> a number (decimal suffixes)."""
    m = re.fullmatch(r"([0-9.]+(?:e[0-9]+)?)([KMGT]?)(?:B|B/s)?", text.strip(), re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"bad quantity {text!r} (examples: 7G, 80e9, 25G)")
    return float(m.group(1)) * _SI[m.group(2).upper()]


def bandwidth(text):
    """A quantity, or the path of mpicomp-bench --json results (kept as a str, read in run)."""
    return text if text.endswith(".json") else quantity(text)


def add_arguments(p):
    p.add_argument("--params", type=quantity, required=True, help="model parameters F (e.g. 7G)")
    p.add_argument("--world", type=int, required=True, help="data-parallel ranks")
    p.add_argument("--ranks-per-node", type=int, required=True, help="ranks (GPUs) per node")
    p.add_argument("--memory", type=quantity, required=True, help="bytes per rank (e.g. 80G)")
    p.add_argument("--activations", type=quantity, default=0.0, help="activation bytes per rank (default 0)")
    p.add_argument("--intra", type=bandwidth, default=100e9,
                   help="intra-node bytes/s per rank, or an mpicomp-bench --json file (default 100G)")
    p.add_argument("--inter", type=bandwidth, default=12.5e9,
                   help="inter-node bytes/s per rank, or an mpicomp-bench --json file (default 12.5G)")
    p.add_argument("--latency", type=float, default=10e-6, help="seconds per ring step (default 1e-5)")
    p.add_argument("--modules", type=int, default=1, help="modules gathered one by one (default 1)")
    p.add_argument("--micro-batches", type=int, default=1, help="micro-batches per step (default 1)")
    p.add_argument("--bytes", default="2,2,12", help="bytes per parameter of params,grads,optimizer (default 2,2,12)")
    p.add_argument("--top", type=int, default=20, help="candidates to list (default 20)")
    p.add_argument("--json", metavar="PATH", help="also write the ranked candidates as JSON")


def run(args):
    from mpicomp.errors import MpicompError
    from mpicomp.optim import amsp

    try:
        for name in ("intra", "inter"):
            if isinstance(getattr(args, name), str):
                setattr(args, name, amsp.bandwidth_from_bench(getattr(args, name)))
        pb, gb, sb = (float(x) for x in args.bytes.split(","))
        result = amsp.plan(int(args.params), args.world, args.ranks_per_node, args.memory,
                           activation_bytes=args.activations, intra_bandwidth=args.intra, inter_bandwidth=args.inter,
                           latency=args.latency, param_bytes=pb, grad_bytes=gb, state_bytes=sb,
                           modules=args.modules, micro_batches=args.micro_batches)
    except (MpicompError, ValueError) as e:
        print(f"mpicomp-bench plan: {e}", file=sys.stderr)
        return 1
    print(result.explain(top=args.top))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"inputs": result.inputs, "shard": result.shard,
                       "candidates": [{"shard": c.shard, "fits": c.fits, "memory": c.memory, "seconds": c.seconds,
                                       "collectives": [vars(x) for x in c.collectives]} for c in result.candidates]},
                      f, indent=1)
    return 0
