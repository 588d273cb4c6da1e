"""mpicomp-bench: OSU-style microbenchmarks of mpicomp (run the collective ones under mpiexec).

    mpicomp-bench codecs                       # codec GB/s on one core vs memcpy
    mpiexec -n 2 mpicomp-bench allreduce -m 1K:64M --codec none,int8,int4 --compare mpi,gloo -c
    mpiexec -n 2 mpicomp-bench allgather ... / reduce_scatter ...
    mpiexec -n 2 mpicomp-bench pt2pt -m 1K:16M --codec none,int8 --compare mpi
    mpiexec -n 2 mpicomp-bench allreduce -m 64K:16M --codec none,int8 --compare mpi -c --table wide
    mpicomp-bench plot results.json [more.json ...] -o fig.png
    mpicomp-bench summary results.json [...] [--sizes 1M,64M | --crossover]
    mpicomp-bench plan --params 7G --world 1024 --ranks-per-node 8 --memory 80G --activations 20G
    mpicomp-bench model --nodes 8,64,512 --ranks-per-node 8 --gbit 100,200,400 --codec int8,int4
"""
import argparse
import sys

from mpi4py import MPI

from . import model, plan
from .options import COLLECTIVE_PEERS, PT2PT_PEERS, add_common, add_data, add_dtype, add_hierarchy, codec_list


class _Parser(argparse.ArgumentParser):
    """argparse that prints its error on rank 0 only, and exits 2 on every rank."""

    def error(self, message):
        if MPI.COMM_WORLD.rank == 0:
            self.print_usage(sys.stderr)
            print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def parser():
    p = _Parser(prog="mpicomp-bench", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name in ("allreduce", "reduce_scatter", "allgather"):
        s = sub.add_parser(name, help=f"latency of {name} per codec (under mpiexec)")
        add_common(s, COLLECTIVE_PEERS)
        s.add_argument("--link-gbit", type=float, default=None, metavar="GBIT",
                       help="the link's rate per rank, for the Bound column (default: what bench/netem set up; "
                            "none on other links)")
        add_dtype(s, "; MPI has no 16-bit float reductions, so --compare mpi times allgather only for them")
        add_hierarchy(s)
    s = sub.add_parser("pt2pt", help="compressed send/recv latency and bandwidth, ranks 0 and 1 (under mpiexec)")
    add_common(s, PT2PT_PEERS)
    g = sub.add_parser("plot", help="latency and speed-up plots from --json results (matplotlib)")
    g.add_argument("results", nargs="+", metavar="RESULTS.json", help="files written by --json")
    g.add_argument("-o", "--output", required=True, metavar="FIG.png", help="the figure to write")
    t = sub.add_parser("summary", help="Markdown tables of speed-ups (or crossover sizes) from --json results")
    t.add_argument("results", nargs="+", metavar="RESULTS.json", help="files written by --json")
    t.add_argument("--sizes", default="1M,16M,64M", help="sizes to tabulate (default 1M,16M,64M)")
    t.add_argument("--crossover", action="store_true",
                   help="instead: per codec, the size from which it beats codec none at every larger size")
    a = sub.add_parser("plan", help="AMSP's planner: the (s_p, s_g, s_os) with the least communication that fits")
    plan.add_arguments(a)
    m = sub.add_parser("model", help="predicted allreduce time on N nodes of R ranks: MPI's, flat and two-level "
                                     "compressed (one process)")
    model.add_arguments(m)
    c = sub.add_parser("codecs", help="codec throughput on one core (or --threads) vs memcpy (one process)")
    c.add_argument("--codec", dest="codecs", type=codec_list, default=None, metavar="SPEC[,SPEC...]",
                   help="codecs to measure (default: every codec of this build)")
    c.add_argument("-n", "--elements", type=int, default=16 << 20, help="float32 elements (default 16 Mi)")
    c.add_argument("-r", "--repeats", type=int, default=5, help="best of this many runs")
    c.add_argument("--all-targets", action="store_true", help="every SIMD target this CPU supports")
    c.add_argument("--threads", type=int, default=1, metavar="T",
                   help="threads per codec call (config.codec_threads; default 1: one core)")
    add_data(c)
    add_dtype(c)
    c.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    return p


def main(argv=None):
    p = parser()
    args = p.parse_args(argv)
    if getattr(args, "table", None) == "wide":
        # A wide row is printed when its size is measured: gloo's pass comes after all sizes.
        if "mpi" not in args.compare or "gloo" in args.compare:
            p.error("--table wide shows speed-ups over the MPI library: it needs --compare mpi (and takes no gloo)")
        if len(args.hierarchy or ()) > 1:
            p.error("--table wide has a column per codec: give one --hierarchy (or use --table long)")
    if args.command in ("codecs", "pt2pt", "plot", "summary", "plan", "model"):
        import importlib

        module = {"codecs": "codec_speed"}.get(args.command, args.command)  # not a second mpicomp.codecs
        return importlib.import_module(f".{module}", __package__).run(args)
    from . import collectives

    return collectives.run(args)


if __name__ == "__main__":
    sys.exit(main())
