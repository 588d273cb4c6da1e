"""Command-line options shared by the benchmarks, with OSU's names and conventions."""
import argparse

from .. import _core
from . import inputs

# --compare's choices: what mpicomp is timed beside.
COLLECTIVE_PEERS = {"mpi": "the MPI library's own collective, through mpi4py", "gloo": "torch.distributed's gloo"}
PT2PT_PEERS = {"mpi": "the MPI library's own Send/Recv, through mpi4py"}


def size(text):
    """'4096', '64K', '16M', '1G' -> bytes: the syntax of every layer (MPICOMP_MIN_BYTES...)."""
    n = _core.parse_size(text.strip())
    if not n:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 1024, 64K, 16M, 1G)")
    return n


def fmt_size(n):
    """65536 -> '64K': a size as -m takes it."""
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return str(n)


class Sizes(list):
    """The sizes of -m, and `note`: what was made of bounds that are not powers of two."""

    note = None


def size_range(text):
    """'-m MIN:MAX' (or just MAX) -> the powers of two from MIN to MAX, in bytes."""
    lo, _, hi = text.partition(":") if ":" in text else ("4", "", text)
    lo, hi = size(lo), size(hi)
    if lo > hi:
        raise argparse.ArgumentTypeError(f"bad size range {text!r}: MIN is larger than MAX")
    sizes, s = Sizes(), 1
    while s < lo:
        s *= 2
    while s <= hi:
        sizes.append(s)
        s *= 2
    if not sizes:
        raise argparse.ArgumentTypeError(f"no power of two in {text!r}")
    if (sizes[0], sizes[-1]) != (lo, hi):
        sizes.note = (f"-m {text}: sizes are powers of two, so the sizes used are "
                      f"{fmt_size(sizes[0])} to {fmt_size(sizes[-1])}")
    return sizes


def choice_list(allowed, what="peer"):
    """A comma-separated list of `what`s among `allowed` (--compare, --hierarchy)."""

    def parse(text):
        chosen = [c for c in text.split(",") if c]
        unknown = [c for c in chosen if c not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {what} {unknown[0]!r} (choose from {', '.join(allowed)})")
        return chosen

    return parse


def codec_list(text):
    """Codecs from "SPEC,SPEC,...": a piece that is key=value only ("int8:block=64,lz4" or
    "blosc:cname=lz4,filter=none") belongs to the spec before it."""
    from ..codecs import codec
    from ..errors import CodecError

    specs = []
    for piece in (s for s in text.split(",") if s):
        if specs and "=" in piece and ":" not in piece:  # another option of the spec before
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    try:
        return [codec(s) for s in specs]
    except CodecError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_common(p, peers, sizes="1K:16M"):
    p.add_argument("-m", "--message-size", dest="sizes", type=size_range, default=size_range(sizes),
                   metavar="MIN:MAX", help=f"bytes of float32 input, powers of two (K/M/G suffixes; default {sizes})")
    it = p.add_mutually_exclusive_group()
    it.add_argument("-i", "--iterations", type=int, default=None, metavar="ITER",
                    help="timed iterations per size (default: 1000 below 1 MiB, fewer above)")
    it.add_argument("--volume", type=size, default=None, metavar="BYTES",
                    help="instead of -i: per size, as many timed iterations as move BYTES of input (5 to 1000); "
                         "on a shaped link, enough to drain its token bucket")
    p.add_argument("-x", "--warmup", type=int, default=None, metavar="WARMUP", help="untimed iterations (default: ITER/10)")
    p.add_argument("--rounds", type=int, default=3,
                   help="time every implementation this many times, interleaved, and keep the best (default 3)")
    p.add_argument("-f", "--full", action="store_true", help="also print min / max latency and iterations")
    p.add_argument("-c", "--validation", action="store_true",
                   help="check results against an exact float64 reduction; exit 1 if one exceeds the codec's bound")
    p.add_argument("--codec", dest="codecs", type=codec_list, default=codec_list("none,int8"),
                   metavar="SPEC[,SPEC...]", help="codecs to measure (default none,int8)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the data lives (cuda needs a build with CUDA support)")
    add_data(p)
    p.add_argument("--compare", type=choice_list(peers), default=[], metavar=",".join(peers),
                   help=f"also time {' and/or '.join(peers.values())}, same ranks, sizes and data")
    p.add_argument("--table", choices=("long", "wide"), default="long",
                   help="long: OSU's columns, a row per size and implementation; wide: a row per size, "
                        "a column per codec with its speed-up over the MPI library (and error with -c; no -f "
                        "columns); needs --compare mpi")
    p.add_argument("--json", metavar="PATH", help="also write the records as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")


def add_hierarchy(p):
    p.add_argument("--hierarchy", type=choice_list(("auto", "flat"), "hierarchy"), default=None, metavar="auto,flat",
                   help="time mpicomp under each of these config.hierarchy values, side by side (rows "
                        "'mpicomp/flat' for flat); default: the configured one (MPICOMP_HIERARCHY)")


def iterations_note(args):
    """How iteration counts were chosen, for the header."""
    if args.volume:
        return f"iterations: as many as move {fmt_size(args.volume)} per size (5 to 1000)"
    return f"iterations: {args.iterations or 'OSU defaults'}"


def add_data(p):
    p.add_argument("--data", choices=inputs.KINDS, default="normal",
                   help="normal noise, sparse (80%% zero rows of 256, as an embedding's gradient), relu "
                        "(noise through a ReLU, as activations), smooth (a smooth 3-D field, as simulations "
                        "have), random (random bytes: incompressible), osu "
                        "(OSU's memset(buf, 1): every float 2.37e-38) or subnormal (noise * 1e-42)")


def add_dtype(p, more=""):
    p.add_argument("--dtype", choices=inputs.DTYPES, default="float32",
                   help=f"element type of the data (float16 as numpy arrays, bfloat16 as torch tensors){more}")


def iterations(args, nbytes):
    """OSU's defaults: many iterations for small messages, fewer for large ones."""
    if args.iterations:
        it = args.iterations
    elif args.volume:
        it = min(1000, max(5, args.volume // nbytes))
    else:
        it = 1000 if nbytes < (1 << 20) else max(5, (100 << 20) // nbytes)
    return it, args.warmup if args.warmup is not None else max(1, it // 10)
