#!/bin/bash
# Everything issue 4 measures, in one call on a GPU machine without internet (the device
# tool's machines): a venv over the image's torch/cupy, the carried wheels (`make gpu-wheels`
# here puts them in .whl/), an mpicomp build, the GPU tests, then the GPU benchmarks.
# Logs and JSON go to $OUT (default /tmp/mpicomp-gpu); copy the JSON into bench/results.
#   bench/gpu_session.sh [tests|codecs|allreduce|nodes|all]
# With the device tool, one call per part (each within its 10-minute limit; a part finds the
# venv of the one before if the machine stayed warm, else makes it again):
#   run(command="bench/gpu_session.sh tests", carry=[".whl"]), then "... codecs", "... allreduce",
# "... nodes" (4 ranks as 2 nodes of 2, two levels and flat; where codec none's time goes).
set -uo pipefail
OUT=${OUT:-/tmp/mpicomp-gpu}
WHAT=${1:-all}
mkdir -p "$OUT"
V=/tmp/mpicomp-venv
export PYTHONUNBUFFERED=1
if [ ! -x $V/bin/python ]; then
  # The image's python3 may itself be a venv (torch, cupy, scikit-build-core in
  # /opt/torch/.venv): --system-site-packages would see only the base interpreter's
  # packages, so the new venv also reads python3's own site-packages through a .pth file.
  site=$(python3 -c "import site; print(site.getsitepackages()[0])")
  python3 -m venv --system-site-packages $V
  echo "$site" >"$($V/bin/python -c "import site; print(site.getsitepackages()[0])")/image-python3.pth"
  $V/bin/python -m pip install -q --no-index --no-deps --no-compile .whl/*.whl
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
$V/bin/python -m pip install -q --no-build-isolation --no-deps . 2>&1 | tail -20 >"$OUT/build.log" || exit 1
PY=$V/bin/python
MPIEXEC=$V/bin/mpiexec
dev=$($PY -c "import torch; print(torch.cuda.get_device_name().replace(' ', '-'))")
if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  $PY -c "import mpicomp; print(mpicomp.available_codecs(), mpicomp._core.mpi_cuda_aware())" | tee "$OUT/codecs.txt"
  timeout 420 $PY -m pytest -q --timeout 120 tests/gpu 2>&1 | tee "$OUT/tests-gpu.log" | tail -60
fi
if [ "$WHAT" = codecs ] || [ "$WHAT" = all ]; then
  $PY bench/gpu_codecs.py --json "$OUT/gpu-codecs-$dev.json" 2>&1 | tee "$OUT/gpu-codecs.log"
  $PY bench/lossless_ratios.py --device cuda --json "$OUT/gpu-lossless-ratios-$dev.json" 2>&1 | tee "$OUT/lossless.log"
fi
if [ "$WHAT" = allreduce ] || [ "$WHAT" = nodes ] || [ "$WHAT" = all ]; then
  # Ranks sharing one GPU without MPS take turns on it: every stream synchronisation then
  # waits for the other ranks' time slices (about 1 ms a call on an H100), which is not what
  # a GPU per rank costs. With MPS their kernels share the GPU (docs/gpu.md).
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mpicomp-mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpicomp-mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  mps=-mps
  nvidia-cuda-mps-control -d || { mps=; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; }
  if [ "$WHAT" != nodes ]; then
    for np in 2 4; do
      timeout 280 $MPIEXEC -n $np $PY bench/gpu_allreduce.py -m 1M:256M --json "$OUT/gpu-allreduce-np$np$mps-$dev.json" \
        2>&1 | tee "$OUT/gpu-allreduce-np$np$mps.log"
    done
  fi
  if [ "$WHAT" != allreduce ]; then
    for h in auto flat; do
      MPICOMP_RANKS_PER_NODE=2 MPICOMP_HIERARCHY=$h timeout 150 $MPIEXEC -n 4 $PY bench/gpu_allreduce.py -m 1M:256M \
        --codec none,int8,sign --json "$OUT/gpu-allreduce-np4-2x2-$h$mps-$dev.json" 2>&1 | tee "$OUT/gpu-2x2-$h.log"
    done
    timeout 120 $MPIEXEC -n 4 $PY bench/gpu_none_parts.py 2>&1 | tee "$OUT/gpu-none-parts.log"
  fi
  [ -n "$mps" ] && echo quit | nvidia-cuda-mps-control
fi
