#!/usr/bin/env bash
# The whole test suite of libgpumem, from a fresh clone on a fresh Debian machine.
#   1. installs missing build/test packages (scripts/deps.sh)
#   2. warnings-as-errors build with every backend that is found (CUDA, HIP, sim),
#      then every ctest test: C (cmocka), C++, Fortran, Python (pytest), examples
#      (incl. mpirun -np 2), install + external consumers, backend no-GPU probes
#   3. the suite again under ASan+UBSan, and the threaded tests under TSan
#   4. the Doxygen docs with warnings as errors
# Environment: JOBS (default nproc), GPUMEM_TEST_SKIP_SANITIZERS=1 to skip step 3.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
./scripts/deps.sh

step() { printf '\n==== %s ====\n' "$*"; }

step "build (Werror) and test"
mkdir -p build
cmake -S . -B build/ci -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUMEM_WERROR=ON >build/ci.configure.log 2>&1 \
  || { cat build/ci.configure.log; exit 1; }
grep -E '^-- gpumem' build/ci.configure.log || true
ninja -C build/ci -j "$JOBS"
ctest --test-dir build/ci -j "$JOBS" --output-on-failure

if [ "${GPUMEM_TEST_SKIP_SANITIZERS:-0}" != 1 ]; then
  step "ASan + UBSan"
  cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGPUMEM_WERROR=ON \
    -DGPUMEM_SANITIZE=address,undefined -DGPUMEM_DEBUG_CHECKS=ON \
    -DGPUMEM_WITH_CUDA=OFF -DGPUMEM_WITH_HIP=OFF -DGPUMEM_BUILD_EXAMPLES=OFF >/dev/null
  ninja -C build/asan -j "$JOBS"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build/asan -j "$JOBS" -L sim --output-on-failure

  step "TSan (threaded tests)"
  cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGPUMEM_WERROR=ON \
    -DGPUMEM_SANITIZE=thread -DGPUMEM_WITH_CUDA=OFF -DGPUMEM_WITH_HIP=OFF \
    -DGPUMEM_BUILD_EXAMPLES=OFF -DGPUMEM_BUILD_TOOLS=OFF >/dev/null
  ninja -C build/tsan -j "$JOBS"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build/tsan -j "$JOBS" -L threads --output-on-failure
fi

if grep -q 'docs target ON' build/ci.configure.log; then
  step "Doxygen (warnings are errors)"
  ninja -C build/ci docs
fi
step "all tests passed"
