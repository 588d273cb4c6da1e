"""Printing results as OSU does (a '#' header, then fixed columns), and as JSON records."""
import json
import os
import sys

from mpi4py import MPI

from .. import _core, __version__


def link():
    """The network the ranks talk over: what bench/netem set up, else this node's own."""
    return os.environ.get("MPICOMP_NETEM", "local")


def header(title, args, comm, extra=()):
    """The '#' lines that say how a table was measured."""
    lib = MPI.Get_library_version().splitlines()[0].strip()
    lines = [f"# mpicomp-bench {title} (mpicomp {__version__})",
             f"# ranks: {comm.Get_size()}, device: {args.device}, CPU codec target: {_core.cpu_target()}, "
             f"link: {link()}",
             f"# MPI: {lib}"]
    return "\n".join(lines + [f"# {e}" for e in extra])


class Table:
    """One OSU-style table; columns are (title, width, format)."""

    def __init__(self, columns, out=sys.stdout):
        self.columns, self.out = columns, out
        print("# " + "".join(f"{t:>{w}}" if i else f"{t:<{w - 2}}" for i, (t, w, _) in enumerate(columns)), file=out)

    def row(self, *values):
        cells = []
        for i, ((_, w, fmt), v) in enumerate(zip(self.columns, values)):
            text = "-" if v is None else format(v, fmt)
            cells.append(f"{text:<{w}}" if i == 0 else f"{text:>{w}}")
        print("".join(cells), file=self.out, flush=True)


class Progress:
    """A progress bar on stderr (rank 0, a terminal, not -q)."""

    def __init__(self, total, enabled):
        self.total, self.done = total, 0
        self.enabled = enabled and sys.stderr.isatty()

    def step(self, label=""):
        self.done += 1
        if self.enabled:
            filled = int(30 * self.done / self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (30 - filled)}] {self.done}/{self.total} {label:<30}")
            if self.done == self.total:
                sys.stderr.write("\r" + " " * 72 + "\r")
            sys.stderr.flush()


def write_json(path, records):
    with open(path, "w") as f:
        json.dump(records, f, indent=1)
        f.write("\n")


def finish(args, comm, title, notes, records, failures, labels, extra=()):
    """Speed-ups over the MPI library, then on rank 0 the tables (one per implementation and
    codec, OSU's columns plus `extra` (title, width, format, record key)) and the JSON file;
    returns the exit status (1 if -c found elements outside the codec's bound)."""
    for r in records:
        mpi = next((p for p in records if p["impl"] == "mpi" and p["size"] == r["size"]), None)
        r["speedup_vs_mpi"] = mpi["avg_latency_us"] / r["avg_latency_us"] if mpi else None
    if comm.rank == 0:
        print(header(title, args, comm, notes))
        groups = {}
        for r in records:
            groups.setdefault((r["impl"], r["codec"]), []).append(r)
        for (impl, codec_name), rows in groups.items():
            print(f"\n# {impl}" + (f" codec {codec_name}" if impl == "mpicomp" else f" ({labels[impl]})"))
            cols = [("Size", 12, "d", "size"), ("Avg Latency(us)", 18, ".2f", "avg_latency_us")]
            if args.full:
                cols += [("Min Latency(us)", 18, ".2f", "min_latency_us"), ("Max Latency(us)", 18, ".2f", "max_latency_us"),
                         ("Iterations", 12, "d", "iterations")]
            cols += list(extra) + [("Ratio", 8, ".2f", "ratio")]
            if args.validation:
                cols += [("MaxRelErr", 11, ".2e", "max_rel_error")]
            cols += [("Speedup(mpi)", 14, ".3f", "speedup_vs_mpi")]
            t = Table([c[:3] for c in cols])
            for r in rows:
                t.row(*(r[c[3]] for c in cols))
        if args.json:
            write_json(args.json, records)
    if failures:
        if comm.rank == 0:
            print(f"# VALIDATION FAILED: {failures} elements outside the codec's error bound")
        return 1
    return 0
