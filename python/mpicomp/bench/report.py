"""Printing results as OSU does (a '#' header, then fixed columns), and as JSON records."""
import json
import os
import sys
import time

from mpi4py import MPI

from .. import _core, __version__
from .options import fmt_size


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
        print("# " + "".join(f"{t:>{w}}" if i else f"{t:<{w - 2}}" for i, (t, w, _) in enumerate(columns)), file=out,
              flush=True)

    def row(self, *values):
        cells = []
        for i, ((_, w, fmt), v) in enumerate(zip(self.columns, values)):
            text = "-" if v is None else format(v, fmt)
            # A cell wider than its column still gets a space before it: rows split on whitespace.
            cells.append(f"{text:<{w}}" if i == 0 else f"{text:>{w}}" if len(text) < w else " " + text)
        print("".join(cells), file=self.out, flush=True)


def write_json(path, records):
    with open(path, "w") as f:
        json.dump(records, f, indent=1)
        f.write("\n")


class Report:
    """What rank 0 prints while a benchmark runs: the '#' header at once, the rows of each size
    as soon as it is measured (flushed, so a pipe sees them), and on stderr a line per size once
    the run has taken a while; at the end the JSON file and the validation verdict.

    --table long: OSU's columns (`extra` (title, width, format, record key) before Ratio), then
    the implementation and codec, one row per size and implementation. --table wide: one row
    per size, a column per codec with its speed-up over the MPI library and, with -c, its error.
    """

    PROGRESS_AFTER_S = 1.0  # short runs (tests, small sizes) print no progress lines

    def __init__(self, args, comm, title, notes, peers, extra=()):
        """peers: name -> description of the implementations compared with."""
        self.args, self.records = args, []
        self.rank0 = comm.rank == 0
        self.start = time.perf_counter()
        if args.table == "wide":
            self.cols = [("Size", 10, "s"), ("MPI(ms)", 12, ".3f")] + [(c.spec, 22, "s") for c in args.codecs]
            notes = notes + [f"cells: speed-up over {peers['mpi']} (its latency / mpicomp's, same run; above 1: "
                             f"mpicomp is faster), on a known link its %Bound" + (
                                 ", then the largest error relative to the largest exact value"
                                 if args.validation else "")]
        else:
            self.cols = [("Size", 12, "d", "size"), ("Avg Latency(us)", 18, ".2f", "avg_latency_us")]
            if args.full:
                self.cols += [("Min Latency(us)", 18, ".2f", "min_latency_us"),
                              ("Max Latency(us)", 18, ".2f", "max_latency_us"), ("Iterations", 12, "d", "iterations")]
            self.cols += list(extra) + [("Ratio", 8, ".2f", "ratio")]
            if args.validation:
                self.cols += [("MaxRelErr", 11, ".2e", "max_rel_error")]
            self.cols += [("Speedup(mpi)", 14, ".3f", "speedup_vs_mpi"), ("Impl", 13, "s", "impl"),
                          ("Codec", 8, "s", "codec")]
            notes = notes + [f"{name}: {label}" for name, label in peers.items()]
        if self.rank0:
            if args.sizes.note:
                notes = notes + [args.sizes.note]
            print(header(title, args, comm, notes), flush=True)
            self.table = Table([c[:3] for c in self.cols])

    def measuring(self, nbytes, index, what):
        """Says on stderr which size comes next, once the run is long enough to wonder."""
        elapsed = time.perf_counter() - self.start
        if self.rank0 and not self.args.quiet and elapsed >= self.PROGRESS_AFTER_S:
            print(f"# {fmt_size(nbytes)} ({index + 1}/{len(self.args.sizes)}): {what}; {elapsed:.0f} s so far",
                  file=sys.stderr, flush=True)

    def rows(self, records):
        """Adds the records of one size (all measured in the same pass) and prints them."""
        self.records += records
        for r in records:
            mpi = next((p for p in self.records if p["impl"] == "mpi" and p["size"] == r["size"]), None)
            r["speedup_vs_mpi"] = mpi["avg_latency_us"] / r["avg_latency_us"] if mpi else None
        if not self.rank0:
            return
        if self.args.table == "long":
            for r in records:
                self.table.row(*(r[c[3]] for c in self.cols))
            return
        cells = {r["codec"]: r for r in records if r["impl"] == "mpicomp"}
        mpi = next(r for r in records if r["impl"] == "mpi")
        self.table.row(fmt_size(mpi["size"]), mpi["avg_latency_us"] / 1e3,
                       *(self._cell(cells[c.spec]) for c in self.args.codecs))

    def _cell(self, r):
        cell = f"{r['speedup_vs_mpi']:.2f}x"
        if r.get("link_bound_us"):  # a known link: how close to the bound (bound.py)
            cell += f" {r['pct_of_bound']:.0f}%"
        if self.args.validation:
            cell += " exact" if r["max_rel_error"] == 0 else f" {r['max_rel_error']:.1e}"
        return cell

    def note(self, text):
        """A comment line after the table (rank 0)."""
        if self.rank0:
            print(f"# {text}", flush=True)

    def finish(self, failures):
        """Writes --json on rank 0; the exit status: 1 if -c found elements outside a codec's bound."""
        if self.rank0 and self.args.json:
            write_json(self.args.json, self.records)
        if failures:
            if self.rank0:
                print(f"# VALIDATION FAILED: {failures} elements outside the codec's error bound")
            return 1
        return 0
