#!/usr/bin/env bash
# gpu-torch.sh: the PyTorch (and CuPy) integration on the GPU machine, side by side with
# PyTorch's own allocator. One command, logs under $OUT (default ./gpu-torch-out):
#
#   OUT=/tmp/o bash scripts/gpu-torch.sh [part...]
#
# Parts (default: all, in this order; each logs to $OUT/<part>.log, $OUT/summary.txt has
# each part's exit status; parts are skipped once DEADLINE seconds (default 570) are used):
#   build    scripts/gpu-suite.sh's build stage (CUDA backend, tests/gpu) into build-gpu
#   record   tests/gpu/gpu_record_stream: gpumem_record_stream while a kernel still reads
#   parity   examples/python/torch_parity.py: every promise, PyTorch's allocator vs gpumem
#   train    examples/python/torch_train.py --all resnet50 transformer transformer_dyn: losses, step time and
#            peaks with PyTorch's allocator, expandable_segments:True and gpumem
#   cupy     examples/python/cupy_check.py
# PARITY_CHECKS / TRAIN_MODELS narrow the parity checks / the models trained.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/gpu-torch-out}
BUILD=${GPUMEM_GPU_BUILD:-$ROOT/build-gpu}
DEADLINE=${DEADLINE:-570}
PARTS=" ${*:-build record parity train cupy} "
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
S=$OUT/summary.txt
: >"$S"
want() { [[ "$PARTS" == *" $1 "* ]]; }
part() { # part NAME LIMIT CMD...
  local name=$1 limit=$2
  shift 2
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 20 ]; then echo "part $name: SKIPPED (deadline)" | tee -a "$S"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "part $name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$S"
}
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ) git: $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv,noheader 2>&1
  python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1
  python3 -c 'import cupy; print("cupy", cupy.__version__)' 2>&1 | tail -1
} | tee -a "$S"

want build && part build 300 env OUT="$OUT/build" GPU_SUITE_STAGES=build bash scripts/gpu-suite.sh
export GPUMEM_LIBRARY=$BUILD/src/libgpumem.so PYTHONPATH=$ROOT/bindings/python${PYTHONPATH:+:$PYTHONPATH}
export GPUMEM_TORCH_BUILD_DIR=${GPUMEM_TORCH_BUILD_DIR:-/tmp/gpumem-torch-shim}
unset GPUMEM_BACKEND GPUMEM_LOG
want record && part record 120 "$BUILD/tests/gpu/gpu_record_stream"
# shellcheck disable=SC2086
want parity && part parity 400 python3 examples/python/torch_parity.py ${PARITY_CHECKS:-}
# shellcheck disable=SC2086
want train && part train 400 python3 examples/python/torch_train.py --all ${TRAIN_MODELS:-resnet50 transformer transformer_dyn} \
  --out-dir "$OUT/train"
[ -d "$OUT/train" ] && tar -C "$OUT" -czf "$OUT/train.tgz" train && rm -rf "$OUT/train"
want cupy && part cupy 120 python3 examples/python/cupy_check.py
for f in record parity train cupy; do
  [ -f "$OUT/$f.log" ] && { echo "---- $f"; tail -40 "$OUT/$f.log"; }
done
