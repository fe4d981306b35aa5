#!/usr/bin/env bash
# valgrind memcheck over the sim test binaries: every tests/test_* executable
# runs under `valgrind --error-exitcode=1 --leak-check=full`; any memcheck
# error or definite/indirect leak fails it. The sim backend marks blocks for
# memcheck with client requests when it runs under valgrind, so reads of
# freed or never-allocated parts of a segment are reported too.
# Environment: BUILD (default build-rel-valgrind), TESTS (space-separated
# names, default: every test_* binary), VALGRIND_ARGS (extra options).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-rel-valgrind}
command -v valgrind >/dev/null || { echo "valgrind not found (apt-get install valgrind)"; exit 1; }
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUMEM_WITH_CUDA=OFF -DGPUMEM_WITH_HIP=OFF \
  -DGPUMEM_BUILD_EXAMPLES=OFF -DGPUMEM_BUILD_TOOLS=OFF >/dev/null
ninja -C "$BUILD" >/dev/null
if [ -z "${TESTS:-}" ]; then
  TESTS=$(cd "$BUILD/tests" && ls test_* 2>/dev/null | grep -v '\.' || true)
fi
export GPUMEM_LOG=off GPUMEM_SOAK_SECONDS=${GPUMEM_SOAK_SECONDS:-1}
fail=0
for t in $TESTS; do
  [ -x "$BUILD/tests/$t" ] || continue
  log="$BUILD/valgrind-$t.log"
  start=$(date +%s)
  if valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite,indirect \
       --show-leak-kinds=definite,indirect --track-origins=yes --trace-children=no --child-silent-after-fork=yes \
       ${VALGRIND_ARGS:-} "$BUILD/tests/$t" >"$log" 2>&1; then
    echo "valgrind $t: ok ($(( $(date +%s) - start )) s)"
  else
    rc=$?
    if [ $rc = 99 ]; then echo "valgrind $t: MEMCHECK ERRORS (see $log)"; else echo "valgrind $t: test failed, exit $rc (see $log)"; fi
    grep -E "ERROR SUMMARY|definitely lost|FAILED|Invalid" "$log" | head -5 || true
    fail=1
  fi
done
exit $fail
