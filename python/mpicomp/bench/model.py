"""mpicomp-bench model: the predicted time of one float32 allreduce on N nodes of R ranks.

    mpicomp-bench model --nodes 8,64,512 --ranks-per-node 8 --gbit 100,200,400 --latency-us 2 \\
        --size 256M --codec int8,int4 [--speeds bench/results/gpu-codecs-h100.json] [--json PATH]

Three algorithms, each rank holding n = S / 4 float32 elements, p = N R ranks, every node
with ONE full-duplex link of L bytes/s each way (--gbit) and a latency alpha per message
round between nodes (--latency-us); inside a node a rank moves B bytes/s to the others
(--intra-gbyte) with a latency alpha_i per round (--intra-latency-us) and sums float32 at
sigma seconds per element. A codec of ratio rho puts w = 4 n / rho bytes on the wire for
n elements; e, d, a are its encode, decode and decode-accumulate seconds per element.

The cost form is Thakur, Rabenseifner & Gropp, "Optimization of collective communication
operations in MPICH", IJHPCA 19(1), 2005: over q ranks, a ring reduce-scatter of m bytes
costs (q-1) alpha + (q-1)/q m beta + (q-1)/q m gamma, an allgather (q-1) alpha + (q-1)/q
m beta, and their sequence, an allreduce, 2 (q-1) alpha + 2 (q-1)/q m beta + (q-1)/q m gamma
(beta: seconds per byte on the wire, gamma: per byte reduced). Three departures:
- beta is a node's link, which all R ranks of the node cross at once: the link term is the
  bytes the node's ranks together send to other nodes, over L.
- A stage that crosses the link is pipelined (mpicomp sends a segment as soon as it is
  encoded and decodes received ones while others travel, docs/internals.md), so it takes
  max(link, codec), not their sum. MPI's own reduction is given the same credit
  (max(link, its sums)), which favours MPI. The exact stages inside a node are added: they
  neither overlap the link stage (they come before and after it) nor is their copy and sum
  overlapped (Thakur's beta + gamma), as one core does both on a CPU node.
- alpha is paid once per round of a ring: q - 1 per reduce-scatter or allgather over q
  ranks. mpicomp's flat stages are a direct exchange (p-1 messages posted together, in
  segments of a part each), whose latencies overlap but whose per-message costs do not;
  counting them as a ring's rounds keeps one rule for all three algorithms.

MPI (node-aware, uncompressed: MPICH's MPIR_Allreduce_intra_smp, Open MPI's coll/han, NCCL's
trees and rings all reduce inside the node first): an exact reduce-scatter inside the node,
an allreduce of its n/R elements per rank among the N ranks of equal local index, an
exact allgather inside the node.
    intra   = 2 (R-1)/R 4n / B + (R-1)/R n sigma    reduce-scatter moves and sums, allgather moves
    link    = 2 (N-1)/N 4n / L                     R ranks, each 2 (N-1)/N 4 (n/R) bytes out
    codec   = (N-1)/N (n/R) sigma                   its sums between nodes
    latency = 2 (N-1) alpha + 2 (R-1) alpha_i
    T = intra + max(link, codec) + latency
two_level (mpicomp, compressed between nodes only): MPI's stages with the allreduce between
nodes compressed, so the link carries 1/rho of MPI's bytes and the codec term is the flat
one with p -> N and n -> n/R:
    intra, latency as MPI's
    link    = 2 (N-1)/N w / L
    codec   = (n/R) (e + d) + (N-1)/N (n/R) a
    T = intra + max(link, codec) + latency
flat (mpicomp, compressed, every rank with all p): a rank sends 2 (p-1)/p w, of which its
2 (p-R)/p w to the p-R ranks of other nodes crosses the link; R ranks to a node:
    link    = R 2 (p-R)/p w / L = 2 R (N-1)/N w / L    (R times two_level's)
    codec   = n (e + d) + (p-1)/p n a
    intra   = 0: the (R-1)/(p-1) of its bytes that stay in the node move while the link's do,
              at the faster intra-node rate
    latency = 2 (p-1) alpha
    T = max(link, codec) + latency
speed-up = T(MPI) / T. Flat sends R / rho times MPI's bytes across: on the link it beats
MPI's node-aware allreduce only where rho > R (it may still win where MPI's exact stages
inside the node take longer than the link).

Speeds: per codec, encode, decode and decode-accumulate GB/s of float32 input and its
nominal ratio (mpicomp.codec(spec).ratio("float32")); measured here on one core (as
`mpicomp-bench codecs`, on a 64 MiB sample of normal noise, decodes streamed from
_core.STREAM_BYTES of output as the collectives stream them), or read with --speeds from
`mpicomp-bench codecs --json` (CPU; several SIMD targets: each kernel's fastest) or
`bench/gpu_codecs.py --json` (GPU). sigma: a sum reads 8 bytes and writes 4 per element
where a copy reads and writes 4 each, so it runs at 2/3 of the copy's GB/s (memcpy measured
here or the file's, or the GPU's device-to-device copy). B: by default that copy's GB/s
(a shared-memory transfer of one copy per byte; MPICH's two-copy cells halve it), or
NVLINK_GBYTE for a GPU file.
"""
import argparse
import json
import sys
from dataclasses import dataclass

from .. import _core
from . import bound, inputs, report
from .codec_speed import memcpy_gbps, seconds
from .options import codec_list, fmt_size, size

__all__ = ["ALGORITHMS", "Machine", "Kernels", "Parts", "predict", "uncompressed", "Figures", "measure", "load"]

ALGORITHMS = ("mpi", "flat", "two_level")
NVLINK_GBYTE = 450.0  # H100 SXM: NVLink 4, 18 links of 25 GB/s each way per GPU
_SAMPLE = 1 << 24  # elements timed, as `mpicomp-bench codecs`: 64 MiB of float32, past the caches
_REPEATS = 10
_KERNELS = ("encode", "decode", "decode_accumulate")
_MS_KEYS = ("link_ms", "codec_ms", "intra_ms", "latency_ms", "predicted_ms")


@dataclass(frozen=True)
class Machine:
    gbit: float  # each node's link, Gbit/s each way
    latency_us: float  # alpha: one message round between nodes
    intra_gbyte: float  # B: GB/s a rank moves to the other ranks of its node
    intra_latency_us: float  # alpha_i: one message round inside a node
    sum_gbyte: float  # GB/s of float32 input a rank sums (1 / sigma)


@dataclass(frozen=True)
class Kernels:
    ratio: float  # rho
    encode: float  # e, d, a: seconds per element
    decode: float
    accumulate: float


@dataclass(frozen=True)
class Parts:
    """Seconds of one call: the busiest node link, one rank's codec work (or sums) beside it,
    the exact stages inside the node, and the latency rounds."""
    link: float
    codec: float
    intra: float
    latency: float

    @property
    def total(self):
        return self.intra + max(self.link, self.codec) + self.latency


def uncompressed(sum_gbyte):
    """The kernels of an uncompressed reduction: ratio 1, no encode or decode, a plain sum."""
    return Kernels(1.0, 0.0, 0.0, 4 / (sum_gbyte * 1e9))


def predict(algorithm, size_bytes, nodes, ranks_per_node, machine, kernels=None):
    """Parts of one allreduce of size_bytes of float32 per rank (module docstring); algorithm
    "mpi" (node-aware, uncompressed: kernels ignored), "flat" or "two_level"."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"predict: algorithm must be one of {', '.join(ALGORITHMS)}, got {algorithm!r}")
    if algorithm == "mpi":
        algorithm, kernels = "two_level", uncompressed(machine.sum_gbyte)
    n, r, p = size_bytes / 4, ranks_per_node, nodes * ranks_per_node
    inside, across = bound.traffic("allreduce", algorithm, n, p, r, 4 / kernels.ratio)
    link = r * across * 8 / (machine.gbit * 1e9)
    enc, dec, acc = bound.work("allreduce", algorithm, n, p, r)
    codec = enc * kernels.encode + dec * kernels.decode + acc * kernels.accumulate
    alpha, alpha_i = machine.latency_us * 1e-6, machine.intra_latency_us * 1e-6
    if algorithm == "flat":
        return Parts(link, codec, 0.0, 2 * (p - 1) * alpha)
    sums = (r - 1) / r * n * 4 / (machine.sum_gbyte * 1e9)
    return Parts(link, codec, inside / (machine.intra_gbyte * 1e9) + sums,
                 2 * (nodes - 1) * alpha + 2 * (r - 1) * alpha_i)


class Figures:
    """Per codec spec (encode, decode, decode-accumulate) GB/s of float32 input; the copy's
    GB/s; the device they are for and where they come from; the intra-node GB/s to assume."""

    def __init__(self, gbps, copy_gbps, device, source, intra_gbyte):
        self.gbps, self.copy_gbps, self.device, self.source = gbps, copy_gbps, device, source
        self.intra_gbyte = intra_gbyte
        self.sum_gbyte = copy_gbps * 2 / 3  # sigma's GB/s (module docstring)

    def kernels(self, c):
        if c.id == 0:
            return uncompressed(self.sum_gbyte)
        return Kernels(c.ratio("float32"), *(4 / (g * 1e9) for g in self.gbps[c.spec]))


def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "cpu")
    except OSError:
        return "cpu"


def measure(codecs, stream):
    """Figures timed here, on one core: each codec on a _SAMPLE of normal noise, best of
    _REPEATS, the kernel's own speed where a shared machine's timings vary from run to run
    (int8's encode from 7 to 21 GB/s between runs on a 2-core VM)."""
    x = inputs.make("normal", _SAMPLE, 0)
    gbps = {c.spec: tuple(x.nbytes / t / 1e9 for t in seconds(c, x, _REPEATS, stream=stream)) for c in codecs if c.id}
    copy = memcpy_gbps(x, _REPEATS)
    where = f"measured here: {_SAMPLE >> 18} MiB sample, one core, target {_core.cpu_target()}"
    return Figures(gbps, copy, _cpu_name(), where + (", decodes streamed" if stream else ""), copy)


def load(path):
    """Figures from `mpicomp-bench codecs --json` (float32 records) or bench/gpu_codecs.py --json."""
    with open(path) as f:
        records = json.load(f)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ValueError("not a list of records (mpicomp-bench codecs --json, bench/gpu_codecs.py --json)")
    cpu = [r for r in records if r.get("op") == "codec" and r.get("dtype", "float32") == "float32"]
    if cpu:
        gbps = {}
        for r in cpu:  # several SIMD targets: each kernel's fastest
            g = tuple(r[f"{k}_gbps"] for k in _KERNELS)
            gbps[r["codec"]] = tuple(map(max, gbps.get(r["codec"], g), g))
        copy = max(r["memcpy_gbps"] for r in cpu)
        return Figures(gbps, copy, cpu[0].get("device", "cpu"), f"{path} (mpicomp-bench codecs)", copy)
    gpu = {(r["op"], r["codec"]): r for r in records if "gbps_in" in r}
    copies = [r for (op, _), r in gpu.items() if op == "d2d_copy"]
    if not copies:
        raise ValueError("neither `mpicomp-bench codecs --json` records (op codec, float32) nor "
                         "bench/gpu_codecs.py records (ops encode, decode, decode_accumulate, d2d_copy)")
    specs = {spec for op, spec in gpu if op in _KERNELS}
    gbps = {s: tuple(gpu[k, s]["gbps_in"] for k in _KERNELS) for s in specs if all((k, s) in gpu for k in _KERNELS)}
    return Figures(gbps, copies[0]["gbps_in"], copies[0]["device"], f"{path} (bench/gpu_codecs.py)", NVLINK_GBYTE)


def _list(kind):
    """A comma-separated list of positive numbers of type kind."""

    def parse(text):
        values = [kind(v) for v in text.split(",") if v]
        if not values or min(values) <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a list of positive numbers")
        return values

    return parse


def add_arguments(p):
    p.add_argument("--nodes", type=_list(int), default=[8, 64, 512], metavar="N[,N...]",
                   help="nodes (default 8,64,512)")
    p.add_argument("--ranks-per-node", type=_list(int), default=[8], metavar="R[,R...]",
                   help="ranks (GPUs, cores) per node (default 8)")
    p.add_argument("--gbit", type=_list(float), default=[100.0, 200.0, 400.0], metavar="G[,G...]",
                   help="each node's link, Gbit/s each way (default 100,200,400)")
    p.add_argument("--latency-us", type=float, default=2.0, help="one message round between nodes, us (default 2)")
    p.add_argument("--size", type=_list(size), default=[256 << 20], metavar="S[,S...]",
                   help="bytes of float32 per rank (K/M/G suffixes; default 256M)")
    p.add_argument("--codec", dest="codecs", type=codec_list, default=codec_list("int8,int4"),
                   metavar="SPEC[,SPEC...]", help="codecs of fixed ratio (default int8,int4)")
    p.add_argument("--speeds", metavar="FILE.json",
                   help="codec speeds from mpicomp-bench codecs --json or bench/gpu_codecs.py --json "
                        "(default: measured here, one core)")
    p.add_argument("--intra-gbyte", type=float, default=None,
                   help=f"GB/s a rank moves inside its node (default: the copy's GB/s; {NVLINK_GBYTE:g} "
                        f"(NVLink) with a GPU --speeds file)")
    p.add_argument("--intra-latency-us", type=float, default=1.0,
                   help="one message round inside a node, us (default 1)")
    p.add_argument("--json", metavar="PATH", help="also write the parameters and rows as JSON")


def run(args):
    bad = [c.spec for c in args.codecs if not c.wire or (c.exact and c.id)]
    if bad:
        print(f"mpicomp-bench model: {bad[0]} has no fixed ratio (lossless, or an allreduce algorithm)",
              file=sys.stderr)
        return 2
    try:
        figures = (load(args.speeds) if args.speeds
                   else measure(args.codecs, max(args.size) >= _core.STREAM_BYTES))
    except (OSError, ValueError) as e:
        print(f"mpicomp-bench model: --speeds {args.speeds}: {e}", file=sys.stderr)
        return 2
    except KeyError as e:
        print(f"mpicomp-bench model: --speeds {args.speeds}: a record has no {e}", file=sys.stderr)
        return 2
    missing = [c.spec for c in args.codecs if c.id and c.spec not in figures.gbps]
    if missing:
        print(f"mpicomp-bench model: {args.speeds} has no speeds for {missing[0]} "
              f"(it has {', '.join(sorted(figures.gbps))})", file=sys.stderr)
        return 2
    intra = args.intra_gbyte or figures.intra_gbyte
    kernels = {c.spec: figures.kernels(c) for c in args.codecs}
    command = "mpicomp-bench " + " ".join(sys.argv[1:])
    print("# mpicomp-bench model: predicted float32 allreduce (mpicomp.bench.model; docs/model.md)")
    print(f"# command: {command}")
    print(f"# sizes: {','.join(fmt_size(s) for s in args.size)} per rank; nodes: {','.join(map(str, args.nodes))}; "
          f"ranks per node: {','.join(map(str, args.ranks_per_node))}; "
          f"node link: {','.join(f'{g:g}' for g in args.gbit)} Gbit/s each way, {args.latency_us:g} us per round")
    print(f"# inside a node: {intra:.1f} GB/s and {args.intra_latency_us:g} us per round per rank; "
          f"sums at {figures.sum_gbyte:.1f} GB/s (2/3 of a {figures.copy_gbps:.1f} GB/s copy)")
    print(f"# speeds: {figures.device}, {figures.source}")
    for c in args.codecs:
        if c.id:
            e, d, a = figures.gbps[c.spec]
            print(f"# {c.spec}: ratio {kernels[c.spec].ratio:.2f}, encode {e:.1f}, decode {d:.1f}, "
                  f"decode-accumulate {a:.1f} GB/s")
    print("# mpi: node-aware, uncompressed; T = intra + max(link, codec) + latency (flat: no intra); "
          "Speedup = T(mpi) / T")
    t = report.Table([("Size", 8, "s"), ("Nodes", 7, "d"), ("R", 4, "d"), ("Gbit/s", 8, "g"), ("Algorithm", 11, "s"),
                      ("Codec", 8, "s"), ("Ratio", 7, ".2f"), ("Link(ms)", 11, ".3f"), ("Codec(ms)", 11, ".3f"),
                      ("Intra(ms)", 11, ".3f"), ("Latency(ms)", 13, ".3f"), ("Time(ms)", 11, ".3f"),
                      ("Speedup(mpi)", 14, ".2f")])
    records = []
    for s in args.size:
        for nodes in args.nodes:
            for r in args.ranks_per_node:
                for gbit in args.gbit:
                    machine = Machine(gbit, args.latency_us, intra, args.intra_latency_us, figures.sum_gbyte)
                    mpi = predict("mpi", s, nodes, r, machine)
                    rows = [("mpi", "none", 1.0, mpi)] + [
                        (alg, c.spec, kernels[c.spec].ratio, predict(alg, s, nodes, r, machine, kernels[c.spec]))
                        for alg in ("flat", "two_level") for c in args.codecs]
                    for alg, spec, ratio, parts in rows:
                        ms = [v * 1e3 for v in (parts.link, parts.codec, parts.intra, parts.latency, parts.total)]
                        t.row(fmt_size(s), nodes, r, gbit, alg, spec, ratio, *ms, mpi.total / parts.total)
                        records.append(dict(size=s, nodes=nodes, ranks_per_node=r, gbit=gbit, algorithm=alg,
                                            codec=spec, ratio=ratio, **dict(zip(_MS_KEYS, ms)),
                                            speedup_vs_mpi=mpi.total / parts.total))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "device": figures.device, "speeds": figures.source,
                       "codec_gbps": {spec: dict(zip(_KERNELS, g)) for spec, g in figures.gbps.items()
                                      if spec in kernels},
                       "copy_gbps": figures.copy_gbps, "sum_gbps": figures.sum_gbyte, "intra_gbyte": intra,
                       "intra_latency_us": args.intra_latency_us, "latency_us": args.latency_us, "records": records},
                      f, indent=1)
            f.write("\n")
    return 0
