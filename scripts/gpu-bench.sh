#!/usr/bin/env bash
# GPU benchmarks of libgpumem, for the GPU machine (CUDA). From the repo root:
#
#   bash scripts/gpu-bench.sh            # logs and JSON into $OUT (default ./gpu-bench-out)
#
# 1. configures with the CUDA backend (Release, no tests/examples) in $BUILD (build-gpu);
# 2. gpumem-info (devices, who holds the device files);
# 3. gpumem-bench on cuda: libgpumem vs cudaMalloc vs cudaMallocAsync (pool with
#    release threshold UINT64_MAX) and, when PyTorch's C++ parts were found at
#    configure time, PyTorch's caching allocator (also once more with
#    expandable_segments:True); $REPEAT runs per figure, median;
# 4. gpumem-replay of the traces in $TRACES (.gpu/traces, copied there by hand,
#    git-ignored) on cuda with real device memory, --sample-used (peak of
#    total-free after every allocation), and the same traces on sim for comparison.
# Every step runs even if an earlier one failed; summary.txt says which did.
#
# Parts can be chosen, to fit a time limit per command (the build folder is
# reused when it exists):  bash scripts/gpu-bench.sh [build] [info] [bench] [replay] [sim]
# (default: all of them). Environment: OUT, BUILD (build-gpu), TRACES (.gpu/traces), REPEAT (7),
# BENCH_TRACE (the trace gpumem-bench replays; default $TRACES/resnet50.txt.gz), TORCH_EXPANDABLE=0 (skip
# the second PyTorch run with expandable_segments:True).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-bench-out}
BUILD=${BUILD:-build-gpu}
TRACES=${TRACES:-.gpu/traces}
REPEAT=${REPEAT:-7}
JOBS=$(nproc 2>/dev/null || echo 4)
mkdir -p "$OUT"
PARTS=" ${*:-build info bench replay sim} "
want() { [[ "$PARTS" == *" $1 "* ]]; }
summary="$OUT/summary.txt"
: >"$summary"
step() { # step NAME TIMEOUT CMD... : run, log to $OUT/NAME.log, record the status
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee -a "$summary"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc, $((SECONDS - t0)) s" | tee -a "$summary"
  return $rc
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(hostname)  cpus: $(nproc)  $(lscpu 2>/dev/null | grep -m1 'Model name' | sed 's/  */ /g')"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null) $(git status --porcelain 2>/dev/null | wc -l) uncommitted paths"
  nvidia-smi 2>&1 | head -20
  nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,driver_version --format=csv 2>&1
  (command -v nvcc >/dev/null && nvcc --version | tail -2) || echo "nvcc not on PATH"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
  echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" | head -3 | tee -a "$summary"

export PATH="$PATH:/usr/local/cuda/bin"
want build && step configure 300 cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DGPUMEM_WITH_CUDA=ON \
  -DGPUMEM_BUILD_TESTS=OFF -DGPUMEM_BUILD_EXAMPLES=OFF
want build && step build 400 cmake --build "$BUILD" -j "$JOBS" --target gpumem-bench gpumem-replay gpumem-info bench-pairs
want build && grep -E "gpumem|torch|zlib" "$OUT/configure.log" | sed 's/^/   /' | tee -a "$summary"
T=$BUILD/tools
if [ ! -x "$T/gpumem-bench" ]; then
  echo "build failed: see $OUT/build.log" | tee -a "$summary"
  exit 1
fi

if want info; then
  step info 60 "$T/gpumem-info" --backend cuda
  "$T/gpumem-info" --backend cuda --json >"$OUT/info.json" 2>/dev/null
fi

trace_arg=(--no-trace)
BENCH_TRACE=${BENCH_TRACE:-$TRACES/resnet50.txt.gz}
[ -f "$BENCH_TRACE" ] && trace_arg=(--trace "$BENCH_TRACE")
[ "${trace_arg[0]}" = --no-trace ] && [ -f examples/traces/resnet50.txt.gz ] &&
  trace_arg=(--trace examples/traces/resnet50.txt.gz)
want bench && step bench-cuda 540 "$T/gpumem-bench" --backend cuda --repeat "$REPEAT" "${trace_arg[@]}" \
  --json-out "$OUT/bench-cuda.json"
if want bench && [ "${TORCH_EXPANDABLE:-1}" = 1 ] && grep -q '"allocators": .*"torch"' "$OUT/bench-cuda.json" 2>/dev/null; then
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True step bench-torch-expandable 300 "$T/gpumem-bench" \
    --backend cuda --repeat "$REPEAT" --only libgpumem,torch "${trace_arg[@]}" \
    --json-out "$OUT/bench-torch-expandable.json"
fi
want sim && step bench-sim 300 "$T/gpumem-bench" --backend sim --repeat "$REPEAT" "${trace_arg[@]}" \
  --json-out "$OUT/bench-sim.json"

traces=()
for f in "$TRACES"/*.txt.gz; do [ -f "$f" ] && traces+=("$f"); done
if [ ${#traces[@]} -eq 0 ]; then
  echo "no traces in $TRACES: replaying the shipped examples/traces/resnet50.txt.gz only" | tee -a "$summary"
  traces=(examples/traces/resnet50.txt.gz)
fi
# one trace per step (a slow one cannot hide the others); expandable segments (the default),
# plain segments too with REPLAY_PLAIN=1
RREPEAT=${REPLAY_REPEAT:-1}
if want replay; then
  for tr in "${traces[@]}"; do
    n=$(basename "$tr" .txt.gz)
    step "replay-cuda-$n" "${REPLAY_TIMEOUT:-90}" "$T/gpumem-replay" --backend cuda --repeat "$RREPEAT" --sample-used \
      --json-out "$OUT/replay-cuda-$n.json" "$tr"
    [ "${REPLAY_PLAIN:-0}" = 1 ] && GPUMEM_EXPANDABLE=0 step "replay-cuda-plain-$n" "${REPLAY_TIMEOUT:-90}" "$T/gpumem-replay" --backend cuda \
      --repeat "$RREPEAT" --sample-used --json-out "$OUT/replay-cuda-plain-$n.json" "$tr"
  done
fi
want sim && step replay-sim 300 "$T/gpumem-replay" --backend sim --repeat 5 --sample-used --json-out "$OUT/replay-sim.json" \
  "${traces[@]}"

echo | tee -a "$summary"
for f in info bench-cuda bench-torch-expandable bench-sim replay-cuda replay-cuda-* replay-sim; do
  for g in "$OUT"/$f.log; do [ -f "$g" ] && { echo "---- $(basename "$g" .log)"; cat "$g"; }; done
done | tee -a "$summary"
