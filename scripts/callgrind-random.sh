#!/usr/bin/env bash
# Instructions per operation of gpumem-bench's random live set through libgpumem on
# the sim backend, counted by callgrind: runs tools/bench-random for P and 2P passes of
# its 50,000 operations and prints (Ir(2P) - Ir(P)) / (P * 50000): start-up, the first
# pass (the pool's growth) and teardown cancel out; what is left is the steady state.
#
#   scripts/callgrind-random.sh [P]      (P default 2)
#
# Needs valgrind and a build with the tools: BUILD (default build-tools) is configured
# and built here if bench-random is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${1:-2}
BUILD=${BUILD:-build-tools}
command -v valgrind >/dev/null || { echo "callgrind-random: valgrind not found (Debian: apt-get install valgrind)" >&2; exit 1; }
bin=$BUILD/tools/bench-random
if [ ! -x "$bin" ]; then
  cmake -S . -B "$BUILD" -DGPUMEM_BUILD_TESTS=OFF >/dev/null
  cmake --build "$BUILD" --target bench-random -j "$(nproc)" >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GPUMEM_SIM_DEVICES=${GPUMEM_SIM_DEVICES:-1x141GiB}
ir() { # total Ir of one run
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$1" "$bin" "$1" >"$tmp/log.$1" 2>&1 ||
    { cat "$tmp/log.$1" >&2; exit 1; }
  awk '/^(summary|totals):/ { print $2; exit }' "$tmp/cg.$1"
}
ir1=$(ir "$P")
ir2=$(ir "$((2 * P))")
echo "build: $BUILD ($(grep -m1 '^CMAKE_BUILD_TYPE' "$BUILD/CMakeCache.txt" 2>/dev/null | cut -d= -f2))"
echo "Ir(P=$P) = $ir1"
echo "Ir(2P=$((2 * P))) = $ir2"
awk -v a="$ir1" -v b="$ir2" -v p="$P" \
  'BEGIN { printf "instructions per random-live-set operation: %.1f\n", (b - a) / (p * 50000) }'
