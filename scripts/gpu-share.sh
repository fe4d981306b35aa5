#!/usr/bin/env bash
# The shared-GPU scenario of issue 17 on one GPU, live (docs/SHARED-GPUS.md). From the repo root:
#
#   bash scripts/gpu-share.sh                 # logs and $OUT/share-summary.md into $OUT (default ./gpu-share-out)
#
# Process A allocates GIB_A x 1 GiB (default 83) through libgpumem's cuda backend, frees it all (its pool
# keeps it cached) and idles; process B then asks for GIB_B x 1 GiB (default 83) and keeps them.
# Rows of the table:
#   1. libgpumem, sharing on (the defaults: GPUMEM_SHARE=user, watcher on)
#   2. libgpumem, sharing off, watcher on (GPUMEM_SHARE=off): only trim_free_fraction acts
#   3. libgpumem, sharing off, no watcher (GPUMEM_SHARE=off GPUMEM_WATCH_MS=0): the library before this change
#   4. PyTorch's caching allocator in both (when torch imports)
# Then: `gpumem-info` while A idles (A listed as a member), `gpumem-info --trim` (A's cache back without
# stopping A), and an outside program (the backend's own cudaMalloc through gpumem-share-demo fill)
# filling the device while A idles with sharing off: A's watcher gives its cache back within the watch
# interval. Each step's output is in $OUT/<step>.log.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-share-out}
BUILD=${BUILD:-build-gpu-share} # its own folder: it configures without tests, which would leave gpu-suite.sh's build-gpu with none
GIB_A=${GIB_A:-83}
GIB_B=${GIB_B:-83}
BACKEND=${BACKEND:-cuda} # (sim with GPUMEM_SIM_SHARED=NAME GPUMEM_SIM_DEVICES=1x143GiB: the same run without a GPU)
mkdir -p "$OUT"
S=$OUT/share-summary.md
export PATH="$PATH:/usr/local/cuda/bin"
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)  git: $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used,driver_version --format=csv 2>&1
} >"$OUT/env.log"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUMEM_WITH_CUDA=ON -DGPUMEM_BUILD_TESTS=OFF -DGPUMEM_BUILD_EXAMPLES=OFF >"$OUT/configure.log" 2>&1 &&
  cmake --build "$BUILD" --target gpumem-share-demo gpumem-info >"$OUT/build.log" 2>&1 ||
  { echo "build failed: see $OUT/build.log"; exit 1; }
DEMO=$BUILD/tools/gpumem-share-demo
INFO=$BUILD/tools/gpumem-info

# start_a LOG CMD...: A in the background, its stdin a fifo (closing it ends A); waits for "ready"
start_a() {
  local log=$1
  shift
  rm -f "$OUT/a.fifo"
  mkfifo "$OUT/a.fifo"
  "$@" <"$OUT/a.fifo" >"$log" 2>&1 &
  A_PID=$!
  exec 9>"$OUT/a.fifo"
  for _ in $(seq 1 600); do
    grep -q '^ready' "$log" 2>/dev/null && return 0
    kill -0 $A_PID 2>/dev/null || break
    sleep 0.1
  done
  echo "A did not get ready: see $log"
  return 1
}
stop_a() {
  exec 9>&-
  wait "$A_PID" 2>/dev/null
  rm -f "$OUT/a.fifo"
}
result() { grep '^RESULT' "$1" | tail -1 | sed 's/^RESULT //'; }

row() { # row NAME ENV... : A then B with the same environment
  local name=$1
  shift
  echo "== $name"
  if start_a "$OUT/$name-a.log" env "$@" "$DEMO" hold --backend "$BACKEND" --gib "$GIB_A"; then
    sleep 1
    env "$@" "$DEMO" ask --backend "$BACKEND" --gib "$GIB_B" >"$OUT/$name-b.log" 2>&1
    stop_a
    echo "| $name | $(result "$OUT/$name-b.log") |" >>"$S"
  fi
  cat "$OUT/$name-a.log" "$OUT/$name-b.log" 2>/dev/null
}

{
  echo "# Shared GPU: A caches $GIB_A GiB and idles, B asks for $GIB_B x 1 GiB"
  echo
  echo "$(head -1 "$OUT/env.log")"
  echo
  echo "| run | B's result |"
  echo "|---|---|"
} >"$S"
row share-on GPUMEM_LOG=info
row share-off GPUMEM_SHARE=off
row share-off-nowatch GPUMEM_SHARE=off GPUMEM_WATCH_MS=0
if python3 -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  echo "== torch"
  if start_a "$OUT/torch-a.log" python3 scripts/gpu_share_torch.py hold "$GIB_A"; then
    sleep 1
    python3 scripts/gpu_share_torch.py ask "$GIB_B" >"$OUT/torch-b.log" 2>&1
    stop_a
    echo "| pytorch (both on PyTorch's caching allocator) | $(result "$OUT/torch-b.log") |" >>"$S"
  fi
  cat "$OUT/torch-a.log" "$OUT/torch-b.log" 2>/dev/null
else
  echo "| pytorch | torch not importable with CUDA: skipped |" >>"$S"
fi

echo "== gpumem-info and --trim while A idles"
if start_a "$OUT/trim-a.log" env GPUMEM_WATCH_MS=0 "$DEMO" hold --backend "$BACKEND" --gib "$GIB_A"; then
  "$INFO" --backend "$BACKEND" >"$OUT/info.log" 2>&1
  "$INFO" --backend "$BACKEND" --trim --device 0 >"$OUT/info-trim.log" 2>&1
  stop_a
  {
    echo
    echo "## gpumem-info while A idles, then gpumem-info --trim"
    echo
    echo '```'
    grep -E 'uuid|total|members|PID|answers|no cache|trim:' "$OUT/info.log" "$OUT/info-trim.log"
    echo '```'
  } >>"$S"
fi
cat "$OUT/info.log" "$OUT/info-trim.log" "$OUT/trim-a.log" 2>/dev/null

echo "== outside cudaMalloc fills the device while A idles (sharing off: A's watcher alone)"
if start_a "$OUT/fill-a.log" env GPUMEM_SHARE=off "$DEMO" hold --backend "$BACKEND" --gib 40; then
  "$DEMO" fill --backend "$BACKEND" --below 0.05 >"$OUT/fill.log" 2>&1
  stop_a
  {
    echo
    echo "## an outside cudaMalloc fills the device while A (40 GiB cached, GPUMEM_SHARE=off, watch 200 ms) idles"
    echo
    echo "| $(result "$OUT/fill.log") |"
  } >>"$S"
fi
cat "$OUT/fill.log" "$OUT/fill-a.log" 2>/dev/null
echo
cat "$S"
