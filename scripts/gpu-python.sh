#!/usr/bin/env bash
# The Python binding on the GPU machine (CUDA, PyTorch, CuPy). From the repo root:
#
#   bash scripts/gpu-python.sh [path/to/libgpumem.so]     # logs into $OUT (default ./gpu-python-out)
#
# Without an argument it builds the library with the CUDA backend in $BUILD
# (build-gpu-py). Steps (each logged to $OUT/<step>.log; every step runs even
# if an earlier one failed; $OUT/summary.txt lists the exit codes):
#  1. check: the library loads and its "cuda" backend sees the device;
#  2. pytest-sim:  the pytest suite as in CI (sim), plus the PyTorch/CuPy tests for real;
#  3. pytest-cuda: the suite with GPUMEM_BACKEND=cuda (sim-only tests skip themselves; the
#     PyTorch/CuPy tests, which always use cuda, ran in step 2 already);
#  4. train: ResNet-50 and a GPT-style transformer, 30 steps, fixed seed, deterministic settings
#     (examples/python/torch_train.py --all): PyTorch's allocator, expandable_segments:True,
#     gpumem.torch.enable() and PyTorch's allocator again (the determinism control), each in
#     its own process; losses must match to 1e-6; step time and peaks side by side;
#  5. trim: ~10 GiB of tensors through gpumem, del, ctx.trim(), torch.cuda.mem_get_info() before/after;
#  6. cupy: gpumem.cupy.enable(), matmul/reductions checked against NumPy.
# Exit status: 0 only if every step passed.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-python-out}
BUILD=${BUILD:-build-gpu-py}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
failed=0
step() { # step NAME TIMEOUT CMD... : run, log to $OUT/NAME.log, record the status
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee -a "$summary"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc, $((SECONDS - t0)) s" | tee -a "$summary"
  [ $rc -eq 0 ] || failed=1
  return $rc
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,driver_version --format=csv 2>&1
  python3 -c 'import sys; print("python", sys.version.split()[0])'
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())' 2>&1 | tail -1
  python3 -c 'import torchvision; print("torchvision", torchvision.__version__)' 2>&1 | tail -1
  python3 -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -1
  python3 -c 'import numpy; print("numpy", numpy.__version__)' 2>&1 | tail -1
  python3 -c 'import pytest; print("pytest", pytest.__version__)' 2>&1 | tail -1
  echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" | tee -a "$summary"

LIB=${1:-}
if [ -z "$LIB" ]; then
  export PATH="$PATH:/usr/local/cuda/bin"
  step configure 300 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGPUMEM_WITH_CUDA=ON \
    -DGPUMEM_BUILD_TESTS=OFF -DGPUMEM_BUILD_TOOLS=OFF -DGPUMEM_BUILD_EXAMPLES=OFF
  step build 600 cmake --build "$BUILD" -j "$(nproc 2>/dev/null || echo 4)" --target gpumem
  LIB=$BUILD/src/libgpumem.so
fi
if [ ! -e "$LIB" ]; then
  echo "no library at $LIB" | tee -a "$summary"
  exit 1
fi
export GPUMEM_LIBRARY
GPUMEM_LIBRARY=$(realpath "$LIB")
export PYTHONPATH="$ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}"
unset GPUMEM_BACKEND GPUMEM_LOG
echo "GPUMEM_LIBRARY=$GPUMEM_LIBRARY" | tee -a "$summary"

if ! step check 120 python3 -c '
import gpumem
print("library:", gpumem.capi.library_path)
with gpumem.Context(backend="cuda", flags=gpumem.CONFIG_NO_ENV) as c:
    print("backend:", c.backend, "devices:", c.device_count)
    for i in range(c.device_count):
        print(c.device_info(i))
    with c.alloc(1 << 20) as b:
        print("1 MiB at 0x%x" % b.ptr)
'; then
  cat "$OUT/check.log" | tee -a "$summary"
  echo "the library has no working cuda backend: stopping" | tee -a "$summary"
  exit 1
fi

step pytest-sim 900 python3 -m pytest -v -rs -p no:cacheprovider bindings/python/tests
tail -3 "$OUT/pytest-sim.log" | tee -a "$summary"
GPUMEM_BACKEND=cuda step pytest-cuda 900 python3 -m pytest -v -rs -p no:cacheprovider bindings/python/tests \
  --ignore=bindings/python/tests/test_torch_cupy.py   # those ran in pytest-sim, on cuda already
tail -3 "$OUT/pytest-cuda.log" | tee -a "$summary"

step train 900 python3 examples/python/torch_train.py --all resnet50 transformer --out-dir "$OUT/train"
cat "$OUT/train.log" | tee -a "$summary"

step trim 600 python3 examples/python/torch_trim.py --gib 10 --out "$OUT/trim.json"
cat "$OUT/trim.log" | tee -a "$summary"

step cupy 600 python3 examples/python/cupy_check.py
tail -4 "$OUT/cupy.log" | tee -a "$summary"

echo "overall: $([ $failed -eq 0 ] && echo PASS || echo FAIL)" | tee -a "$summary"
exit $failed
