#!/usr/bin/env bash
# The whole test suite of libgpumem, from a fresh clone on a fresh Debian machine.
#   1. installs missing build/test packages (scripts/deps.sh)
#   2. warnings-as-errors build with every backend that is found (CUDA, HIP, sim),
#      then every ctest test: C (cmocka), C++, Fortran, Python (pytest), examples
#      (incl. mpirun -np 2), install + external consumers, the Python package installed by pip
#      in fresh venvs (scikit-build-core from PyPI), backend no-GPU probes
#   3. the suite again under ASan+UBSan, and the threaded tests (and a 3 s soak) under TSan;
#      with clang: the suite under ASan+UBSan+unsigned-integer-overflow, and fuzz_ops
#      (libFuzzer) for GPUMEM_FUZZ_SECONDS (60) on fuzz/corpus
#   valgrind memcheck over every sim test (scripts/valgrind.sh; heavy loops scaled down under valgrind)
#   4. the Doxygen docs with warnings as errors
# Environment: JOBS (default nproc), GPUMEM_TEST_SKIP_SANITIZERS=1 to skip step 3 and valgrind,
#   GPUMEM_TEST_VALGRIND=0 to skip valgrind, =1 to run it even with GPUMEM_TEST_SKIP_SANITIZERS=1,
#   =full to run it at full scale (GPUMEM_TEST_SCALE=1: about 10.5 minutes on 2 cores, test_fault_sweep alone).
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
    ctest --test-dir build/asan -j "$JOBS" -L sim -LE "python|tools" --output-on-failure

  step "TSan (threaded tests)"
  cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGPUMEM_WERROR=ON \
    -DGPUMEM_SANITIZE=thread -DGPUMEM_WITH_CUDA=OFF -DGPUMEM_WITH_HIP=OFF \
    -DGPUMEM_BUILD_EXAMPLES=OFF -DGPUMEM_BUILD_TOOLS=OFF >/dev/null
  ninja -C build/tsan -j "$JOBS"
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    ctest --test-dir build/tsan -j "$JOBS" -L threads --output-on-failure
  # the soak (3 s) under TSan too: threads, devices, resets, cross-thread frees
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 GPUMEM_SOAK_SECONDS=3 build/tsan/tests/test_soak

  if command -v clang >/dev/null; then
    step "clang ASan + UBSan + unsigned-integer-overflow (library size arithmetic; fuzz/ubsan-ignore.txt)"
    CC=clang CXX=clang++ cmake -S . -B build/clang-ubsan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DGPUMEM_WERROR=ON \
      -DGPUMEM_SANITIZE=address,undefined -DGPUMEM_DEBUG_CHECKS=ON -DGPUMEM_WITH_CUDA=OFF -DGPUMEM_WITH_HIP=OFF \
      -DGPUMEM_BUILD_EXAMPLES=OFF \
      -DCMAKE_C_FLAGS="-fsanitize=unsigned-integer-overflow -fsanitize-ignorelist=$PWD/fuzz/ubsan-ignore.txt" >/dev/null
    ninja -C build/clang-ubsan -j "$JOBS"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      ctest --test-dir build/clang-ubsan -j "$JOBS" -L sim -LE "python|tools" --output-on-failure

    step "libFuzzer: fuzz_ops on the seed corpus, ${GPUMEM_FUZZ_SECONDS:-60} s"
    CC=clang cmake -S fuzz -B build/fuzz -G Ninja >/dev/null
    ninja -C build/fuzz fuzz_ops
    rm -rf build/fuzz/corpus && cp -r fuzz/corpus build/fuzz/corpus
    if ! build/fuzz/fuzz_ops -max_total_time="${GPUMEM_FUZZ_SECONDS:-60}" -len_control=0 -max_len=2048 \
         -artifact_prefix=build/fuzz/ build/fuzz/corpus >build/fuzz/fuzz.log 2>&1; then
      tail -n 60 build/fuzz/fuzz.log
      echo "fuzz_ops found a failure; the input is build/fuzz/crash-*; replay: FUZZ_OPS_TRACE=1 build/fuzz/fuzz_ops build/fuzz/crash-*"
      exit 1
    fi
    grep -E '^(Done|fuzz_ops:)' build/fuzz/fuzz.log
  fi
fi
# valgrind memcheck over every sim test (ctest -L sim, less python and tools), JOBS at a time,
# with the sim's blocks announced to memcheck. Under valgrind the tests scale their heavy
# loops down (tests/testutil.h, tu_scale: fault sweeps every 17th index plus the first and
# last 2, fewer operations in the threaded and random tests): 2.5 to 3.5 minutes on 2 cores
# (docs/RELIABILITY.md). GPUMEM_TEST_VALGRIND=full runs the full-scale version.
vg_mode=${GPUMEM_TEST_VALGRIND:-}
if [ -z "$vg_mode" ]; then
  if [ "${GPUMEM_TEST_SKIP_SANITIZERS:-0}" = 1 ]; then vg_mode=0; else vg_mode=1; fi
fi
case "$vg_mode" in
  0) ;;
  full)
    step "valgrind memcheck (every sim test, full scale; slow)"
    GPUMEM_TEST_SCALE=1 BUILD=build/valgrind JOBS="$JOBS" ./scripts/valgrind.sh ;;
  *)
    step "valgrind memcheck (every sim test; heavy loops scaled down, GPUMEM_TEST_VALGRIND=full for full scale)"
    BUILD=build/valgrind JOBS="$JOBS" ./scripts/valgrind.sh ;;
esac

if grep -q 'docs target ON' build/ci.configure.log; then
  step "Doxygen (warnings are errors)"
  ninja -C build/ci docs
fi
step "all tests passed"
