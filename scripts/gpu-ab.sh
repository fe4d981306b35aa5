#!/usr/bin/env bash
# A/B on one host: gpumem-bench (libgpumem only) built from two trees, run alternately, so that
# a change is compared on the same machine at the same time (H200 hosts differ by 1.5-1.8x).
#   A=DIR (the other tree, default .gpu/ab-old) ROUNDS=4 REPEAT=5 PATTERNS=pair,random,threads
#   BACKEND=cuda bash scripts/gpu-ab.sh
# Builds both (Release, tools only) in build-ab-a and build-ab-b, then ROUNDS x (A, B).
# Logs and JSON go to $OUT (default ./gpu-ab-out); $OUT/ab-summary.txt has the medians' lines.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
A=${A:-.gpu/ab-old}
ROUNDS=${ROUNDS:-4}
REPEAT=${REPEAT:-5}
PATTERNS=${PATTERNS:-pair,random,threads}
BACKEND=${BACKEND:-cuda}
O=${OUT:-$ROOT/gpu-ab-out}
mkdir -p "$O"
S=$O/ab-summary.txt
export PATH="$PATH:/usr/local/cuda/bin"
cuda=OFF
[ "$BACKEND" = cuda ] && cuda=ON
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)  host: $(hostname)  cpus: $(nproc)"
  lscpu 2>/dev/null | grep -E '^(Model name|CPU max MHz|CPU MHz|Thread|Core|Socket|NUMA node\(s\))' | sed 's/  */ /g'
  echo "A: $A ($(cat "$A/.ab-rev" 2>/dev/null || echo '?'))  B: $(git rev-parse --short HEAD 2>/dev/null) +$(git status --porcelain 2>/dev/null | wc -l) uncommitted"
} | tee "$S"
for side in a b; do
  src=$ROOT
  [ $side = a ] && src=$(cd "$A" && pwd)
  cmake -S "$src" -B "$ROOT/build-ab-$side" -DCMAKE_BUILD_TYPE=Release -DGPUMEM_WITH_CUDA=$cuda \
    -DGPUMEM_BUILD_TESTS=OFF -DGPUMEM_BUILD_EXAMPLES=OFF >"$O/configure-$side.log" 2>&1 &&
    cmake --build "$ROOT/build-ab-$side" -j "$(nproc)" --target gpumem-bench >"$O/build-$side.log" 2>&1 ||
    { echo "build $side failed (see $O/build-$side.log)" | tee -a "$S"; exit 1; }
done
for r in $(seq 1 "$ROUNDS"); do
  for side in a b; do
    "$ROOT/build-ab-$side/tools/gpumem-bench" --backend "$BACKEND" --repeat "$REPEAT" --only libgpumem \
      --patterns "$PATTERNS" --json-out "$O/ab-$side-$r.json" >"$O/ab-$side-$r.txt" 2>&1
    echo "round $r $side: $(grep -E '^(pair 64 KiB|pair 2 MiB|pair 64 MiB|pair 1 GiB|random|threads 16)' "$O/ab-$side-$r.txt" | awk '{printf "%s=%s ", $1 $2 $3, $NF}')" | tee -a "$S"
  done
done
