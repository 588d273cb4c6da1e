"""What the tests that compile the core themselves (tests/test_fake_cuda.py, tests/fuzz) need
besides its sources: C-Blosc2's headers and static library from the blosc2 wheel, as
CMakeLists.txt links it (codec blosc)."""
import importlib.util
from pathlib import Path


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
