# Two commands from a fresh clone: `make demo` (the main job) and `make test`. Both create
# .venv/, install MPICH, mpi4py and torch from PyPI, and build and install mpicomp into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
DEPS := $(VENV)/.deps-installed
BUILT := $(VENV)/.mpicomp-built
SOURCES := $(shell find cpp python -type f -not -path '*/__pycache__/*') CMakeLists.txt pyproject.toml

.PHONY: all demo test bench clean gpu-wheels
all: $(BUILT)

$(DEPS): requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

# --no-build-isolation: build against the venv's MPICH and mpi4py, the ones used at run time.
$(BUILT): $(DEPS) $(SOURCES)
	$(PY) -m pip install -q --no-build-isolation --no-deps .
	touch $@

# One table: each codec's speed-up over MPI's allreduce and its error, on an emulated 1 Gbit/s
# link where bench/netem can create one (root), else on shared memory, saying why.
demo: $(BUILT)
	$(PY) bench/demo

test: $(BUILT)
	$(PY) -m pytest -q tests

# The wheels bench/gpu_session.sh installs on a GPU machine without internet (Python 3.12).
gpu-wheels: $(DEPS)
	$(PY) -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux1_x86_64 -d .whl \
	  mpich==5.0.2 mpi4py==4.1.2 lz4==4.4.5 nvidia-libnvcomp-cu13==6.0.0.12

clean:
	rm -rf build $(VENV)
