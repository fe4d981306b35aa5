#!/usr/bin/env bash
# Instructions per 64 KiB alloc+free pair through libgpumem on the sim backend,
# counted by callgrind: runs tools/bench-pairs for N and 2N pairs and prints
# (Ir(2N) - Ir(N)) / N, so start-up, the first pool growth and teardown cancel out.
#
#   scripts/callgrind-pairs.sh [N] [SIZE] [STREAM]  (N default 200000, SIZE default 65536, STREAM 0 = NULL)
#
# N is large because start-up (the dynamic loader, the backends' libraries) varies
# by a few hundred thousand instructions from run to run: with N = 20000 that moved
# the figure by up to +-7; with 200000, by about +-1.
#
# Needs valgrind and a build with the tools: BUILD (default build-tools) is
# configured if new, and bench-pairs is built there first (a no-op when up to date).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200000}
SIZE=${2:-65536}
STREAM=${3:-0} # 0: the NULL stream; another number: a made-up sim stream (capture_probe asks about it)
. scripts/callgrind-lib.sh
cg_prepare callgrind-pairs bench-pairs
ir1=$(cg_ir "$N" "$SIZE" "$STREAM")
ir2=$(cg_ir "$((2 * N))" "$SIZE" "$STREAM")
cg_build_line
echo "Ir(N=$N) = $ir1"
echo "Ir(2N=$((2 * N))) = $ir2"
awk -v a="$ir1" -v b="$ir2" -v n="$N" -v s="$SIZE" \
  -v t="$STREAM" 'BEGIN { printf "instructions per %d-byte alloc+free pair%s: %.1f\n", s, t == 0 ? "" : " on stream " t, (b - a) / n }'
