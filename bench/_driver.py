"""What the benchmark drivers in bench/ share. Each runs several programs under mpiexec, one
after the other in one invocation (inside bench/netem when a link is emulated), reads what
each wrote, and keeps a summary in bench/results/NAME.json with a Markdown table beside it.
No MPI here: a driver only launches jobs."""
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")
NETEM = str(ROOT / "bench" / "netem")


def parse(parser, argv=None):
    """``parser``'s arguments, the ones before a ``--``, and the list after it (the flags the
    driver passes on to the program it runs)."""
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    return parser.parse_args(argv[:cut]), argv[cut + 1:]


# The byte-level GPT's flags (examples/train_gpt.py's Stage and batch) that the DiLoCo
# benchmarks take, with their defaults: a model small enough for many runs on 2 cores.
GPT_FLAGS = (("layers", int, 2, "transformer blocks"), ("width", int, 64, "model width"),
             ("heads", int, 4, "attention heads"), ("context", int, 64, "bytes per sequence"),
             ("batch", int, 8, "sequences per step per worker"),
             ("lr", float, 3e-3, "AdamW learning rate (DDP's, and DiLoCo's inner one)"),
             ("seed", int, 0, "seed of the initial weights and of the data order"))


def add_gpt_flags(parser):
    """Adds GPT_FLAGS to an argparse parser."""
    for name, kind, default, text in GPT_FLAGS:
        parser.add_argument(f"--{name}", type=kind, default=default, help=text)


def gpt_flags(args):
    """GPT_FLAGS as parsed into args, as command-line arguments again (for a job's program)."""
    return [x for name, *_ in GPT_FLAGS for x in (f"--{name}", getattr(args, name))]


def netem(rate, ranks_per_node=None, burst=None):
    """bench/netem's options for a link of ``rate`` (None: no emulated link), shaping only the
    links between nodes of ``ranks_per_node`` ranks when given, with a token bucket of
    ``burst`` bytes when given (else bench/netem's default)."""
    if not rate:
        return []
    return ["--rate", rate, *(["--ranks-per-node", str(ranks_per_node)] if ranks_per_node else []),
            *(["--burst", str(burst)] if burst else [])]


def launch(np, program, what, link=(), expect=lambda code: code == 0, echo=True, last_line=False, timeout=None):
    """``mpiexec -n np *program``, inside ``bench/netem *link`` when link is given; prints the
    command (``echo``) and the job's last line of output (``last_line``). A job whose exit
    code ``expect`` refuses ends the driver with ``what`` and the tail of the job's output.
    Returns the CompletedProcess."""
    cmd = [MPIEXEC, "-n", str(np), *map(str, program)]
    if link:
        cmd = [sys.executable, NETEM, *link, "--", *cmd]
    if echo:
        print("#", " ".join(cmd), flush=True)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if not expect(r.returncode):
        sys.exit(f"{what} failed (exit code {r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    if last_line:
        print(r.stdout.strip().splitlines()[-1], flush=True)
    return r


def run_json(np, program, log, what, **kw):
    """launch(np, program, what, **kw), then the JSON the program wrote to ``log``."""
    launch(np, program, what, **kw)
    return json.loads(Path(log).read_text())


def median_ms(step_seconds, skip=5):
    """The median of a run's step times after the first ``skip`` (warm-up), in ms."""
    return statistics.median(step_seconds[skip:] or step_seconds) * 1e3


def write(name, summary, lines=None):
    """bench/results/NAME.json from ``summary``, and NAME.md from ``lines`` (printed too) when
    given. Returns the path without its suffix, for plots beside them."""
    out = RESULTS / name
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    if lines is not None:
        out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    return out
