#!/usr/bin/env bash
# Instructions per operation of gpumem-bench's random live set through libgpumem on
# the sim backend, counted by callgrind: runs tools/bench-random for P and 2P passes of
# its 50,000 operations and prints (Ir(2P) - Ir(P)) / (P * 50000): start-up, the first
# pass (the pool's growth) and teardown cancel out; what is left is the steady state.
#
#   scripts/callgrind-random.sh [P]      (P default 2)
#
# Needs valgrind and a build with the tools: BUILD (default build-tools) is configured if new,
# and bench-random is built there first (a no-op when up to date).
set -euo pipefail
cd "$(dirname "$0")/.."
P=${1:-2}
. scripts/callgrind-lib.sh
cg_prepare callgrind-random bench-random
ir1=$(cg_ir "$P")
ir2=$(cg_ir "$((2 * P))")
cg_build_line
echo "Ir(P=$P) = $ir1"
echo "Ir(2P=$((2 * P))) = $ir2"
awk -v a="$ir1" -v b="$ir2" -v p="$P" \
  'BEGIN { printf "instructions per random-live-set operation: %.1f\n", (b - a) / (p * 50000) }'
