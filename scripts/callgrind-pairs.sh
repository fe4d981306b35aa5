#!/usr/bin/env bash
# Instructions per 64 KiB alloc+free pair through libgpumem on the sim backend,
# counted by callgrind: runs tools/bench-pairs for N and 2N pairs and prints
# (Ir(2N) - Ir(N)) / N, so start-up, the first pool growth and teardown cancel out.
#
#   scripts/callgrind-pairs.sh [N] [SIZE]      (N default 200000, SIZE default 65536)
#
# N is large because start-up (the dynamic loader, the backends' libraries) varies
# by a few hundred thousand instructions from run to run: with N = 20000 that moved
# the figure by up to +-7; with 200000, by about +-1.
#
# Needs valgrind and a build with the tools: BUILD (default build-tools) is
# configured and built here if bench-pairs is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
SIZE=${2:-65536}
BUILD=${BUILD:-build-tools}
command -v valgrind >/dev/null || { echo "callgrind-pairs: valgrind not found (Debian: apt-get install valgrind)" >&2; exit 1; }
bin=$BUILD/tools/bench-pairs
if [ ! -x "$bin" ]; then
  cmake -S . -B "$BUILD" -DGPUMEM_BUILD_TESTS=OFF >/dev/null
  cmake --build "$BUILD" --target bench-pairs -j "$(nproc)" >/dev/null
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GPUMEM_SIM_DEVICES=${GPUMEM_SIM_DEVICES:-1x141GiB}
ir() { # total Ir of one run
  valgrind --tool=callgrind --callgrind-out-file="$tmp/cg.$1" "$bin" "$1" "$SIZE" >"$tmp/log.$1" 2>&1 ||
    { cat "$tmp/log.$1" >&2; exit 1; }
  awk '/^(summary|totals):/ { print $2; exit }' "$tmp/cg.$1"
}
ir1=$(ir "$N")
ir2=$(ir "$((2 * N))")
echo "build: $BUILD ($(grep -m1 '^CMAKE_BUILD_TYPE' "$BUILD/CMakeCache.txt" 2>/dev/null | cut -d= -f2))"
echo "Ir(N=$N) = $ir1"
echo "Ir(2N=$((2 * N))) = $ir2"
awk -v a="$ir1" -v b="$ir2" -v n="$N" -v s="$SIZE" \
  'BEGIN { printf "instructions per %d-byte alloc+free pair: %.1f\n", s, (b - a) / n }'
