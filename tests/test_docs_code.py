"""Every code block of the README and docs/ runs as pasted, after `make all` or `make demo`:

- ``python``: a complete program. A copy of a file of examples/ (its first line names the
  file) must equal it, and the file is run by the tests of examples; every other block runs,
  under ``mpiexec -n 2``, as a program of its own (tests/docs/run_blocks.py).
- ``bash``: command lines. Each names only files that exist and the programs of the venv,
  with no placeholder (``...``, ``[options]``) and no ``sudo``; the blocks in RUN also run,
  in a scratch directory that sees the repository's .venv, examples and bench.
- ``text``: output or a layout, shown, not run. A block without a language is refused, so
  that none escapes these rules.
"""
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from _launch import mpiexec

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
# Command blocks run here as pasted (the first line of each, as found in its page); the rest
# are too long for a test (sweeps, training runs) or need a cluster (SLURM, site modules).
RUN = (".venv/bin/mpicc examples/allreduce.c -o allreduce -lm",
       ".venv/bin/mpiexec -n 4 env MPICOMP_VERBOSE=1 MPICOMP_RANKS_PER_NODE=2")


def _blocks():
    for page in PAGES:
        text = page.read_text()
        for m in BLOCK.finditer(text):
            where = f"{page.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}"
            yield where, m.group(1), m.group(2)


BLOCKS = list(_blocks())


def test_every_block_says_what_it_is():
    assert [w for w, lang, _ in BLOCKS if lang not in ("python", "bash", "text", "c")] == []


def _example(code):
    first = code.splitlines()[0]
    named = re.search(r"examples/\w+\.py", first) if first.startswith("#") else None
    return ROOT / named.group(0) if named else None


def test_copies_of_examples_are_verbatim():
    copies = [(w, _example(c), c) for w, lang, c in BLOCKS if lang == "python" and _example(c)]
    assert copies, "the README shows examples/quickstart.py"
    for where, path, code in copies:
        assert code.strip() == path.read_text().strip(), f"{where} differs from {path.relative_to(ROOT)}"


def test_python_blocks_run(tmp_path):
    programs = [(w, c) for w, lang, c in BLOCKS if lang == "python" and not _example(c)]
    (tmp_path / "blocks.json").write_text(json.dumps(programs))
    r = mpiexec(2, sys.executable, ROOT / "tests/docs/run_blocks.py", tmp_path / "blocks.json", cwd=tmp_path, timeout=600,
                env={**os.environ, "MPICOMP_TIMEOUT": "60", "PYTHONWARNINGS": "error::UserWarning"})
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert r.stdout.count("\nok ") + r.stdout.startswith("ok ") == len(programs), r.stdout


def _commands(code):
    """The command lines of a bash block, continuation lines joined, comments dropped."""
    lines = code.replace("\\\n", " ").splitlines()
    return [line.split(" #")[0].strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _paths(command):
    """The words of a command that name a file of the repository or the venv."""
    try:
        words = shlex.split(command.replace("$(", " ").replace(")", " "))
    except ValueError:
        words = command.split()
    return [w for w in words if re.match(r"(\.venv|bench|examples|tests|docs|python|cpp)/[\w./-]*$", w)]


@pytest.mark.parametrize("where,code", [(w, c) for w, lang, c in BLOCKS if lang == "bash"], ids=lambda v: v[:40])
def test_bash_blocks_name_real_things(where, code):
    for command in _commands(code):
        assert not re.search(r"(^|\s)(sudo|\.\.\.|\[-)", command), f"{where}: a placeholder in {command!r}"
        made = {w for w in re.findall(r"-o (\S+)", command)}  # what a command of the block builds
        missing = [p for p in _paths(command) if p not in made and not (ROOT / p).exists()]
        assert not missing, f"{where}: {missing} do not exist"


@pytest.mark.parametrize("first", RUN)
def test_command_blocks_run(first, tmp_path):
    (code,) = [c for _, lang, c in BLOCKS if lang == "bash" and c.startswith(first)]
    for name in (".venv", "examples", "bench"):
        (tmp_path / name).symlink_to(ROOT / name)
    r = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "MPICOMP_TIMEOUT": "60"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def test_the_checks_see_placeholders_and_paths():
    assert _commands("a \\\n  b  # note\n# comment\nc") == ["a    b", "c"]
    assert _paths("bench/netem --rate 1gbit -- .venv/bin/mpiexec -n 2 x $(.venv/bin/mpicomp-config --preload)") == \
        ["bench/netem", ".venv/bin/mpiexec", ".venv/bin/mpicomp-config"]
