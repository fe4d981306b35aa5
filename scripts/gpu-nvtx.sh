#!/usr/bin/env bash
# gpu-nvtx.sh: does compute-sanitizer's memcheck see libgpumem's blocks?
#
# Builds libgpumem with the NVTX annotations (GPUMEM_WITH_NVTX=ON, CUDA
# backend, no tests/tools/examples, so no cmocka is needed) and
# tests/gpu/gpu_nvtx_oob.cu with nvcc, then runs gpu_nvtx_oob under
# `compute-sanitizer --tool memcheck` in every mode that decides the question:
#   - references without libgpumem: a plain cudaMalloc overrun (the sanitizer
#     works at all), the NVTX memory API used directly on a cudaMalloc pool
#     (raw: must be reported; raw-clean: must not), and the variants that
#     show what the sanitizer requires (raw-early: NVTX before the first
#     context; raw-thread: heap registered from a thread with no context;
#     vmm-*: heaps on driver virtual memory)
#   - the library: the planted write one byte past a 1000-byte block (oob)
#     and the in-bounds control (clean), with plain cudaMalloc segments
#     (GPUMEM_EXPANDABLE=0) and with GPUMEM_EXPANDABLE=1 (which the backend
#     overrides under compute-sanitizer: it can only check plain segments),
#     with the sanitizer's default NVTX setting (on since CUDA 12), with
#     --nvtx yes, and (oob) with --nvtx no, where the write goes unseen.
# Prints one line per run: errors reported, the exit status, and whether that
# is what was expected; then the summary. With $OUT set: $OUT/nvtx-summary.txt
# and every log packed in $OUT/nvtx-logs.tgz (two files); else the logs stay
# in a temporary folder. Exit status 0 when every expectation held, 1 otherwise,
# 2 when it could not build, 0 with "SKIPPED" when there is no GPU.
#
# Usage: bash scripts/gpu-nvtx.sh            (builds in /tmp/gpumem-nvtx-build)
#        BUILD=dir bash scripts/gpu-nvtx.sh  (an existing CMake build dir configured with
#                                             GPUMEM_WITH_NVTX=ON: only `ninja gpumem_static` runs there)
# Took 25 s on an H200 (build 6 s, 17 sanitizer runs of about 1 s); every run has a
# 60 s limit and the script starts no run after DEADLINE (200) s.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 2
export PATH="$PATH:/usr/local/cuda/bin"
LOG=$(mktemp -d /tmp/gpu-nvtx.XXXX)
SUMMARY=$LOG/nvtx-summary.txt
: >"$SUMMARY"
# shellcheck disable=SC2317  # called by the EXIT trap
pack() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT" && cp "$SUMMARY" "$OUT/nvtx-summary.txt" && tar czf "$OUT/nvtx-logs.tgz" -C "$LOG" .
}
trap pack EXIT
DEADLINE=${DEADLINE:-200}
say() { echo "$*" | tee -a "$SUMMARY"; }

say "gpu-nvtx.sh: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)$(git -C "$ROOT" diff --quiet 2>/dev/null || echo '+uncommitted') on $(hostname); logs in $LOG${OUT:+ (packed into \$OUT/nvtx-logs.tgz at the end)}"

# ---- build ------------------------------------------------------------------
NVCC=$(command -v nvcc || true)
if [ -z "$NVCC" ]; then say "FAIL: nvcc not found (PATH, /usr/local/cuda/bin)"; exit 2; fi
say "nvcc: $($NVCC --version | tail -1)"
B=${BUILD:-/tmp/gpumem-nvtx-build}
if [ ! -f "$B/build.ninja" ]; then
  cmake -S "$ROOT" -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUMEM_WITH_CUDA=ON -DGPUMEM_WITH_HIP=OFF \
    -DGPUMEM_WITH_NVTX=ON -DGPUMEM_BUILD_TESTS=OFF -DGPUMEM_BUILD_TOOLS=OFF -DGPUMEM_BUILD_EXAMPLES=OFF \
    -DGPUMEM_BUILD_FORTRAN=OFF >"$LOG/nvtx-cmake.log" 2>&1 || { say "FAIL: cmake (see $LOG/nvtx-cmake.log)"; tail -20 "$LOG/nvtx-cmake.log"; exit 2; }
fi
grep -h "annotates blocks through NVTX" "$LOG/nvtx-cmake.log" 2>/dev/null | tee -a "$SUMMARY"
ninja -C "$B" gpumem_static >"$LOG/nvtx-build.log" 2>&1 || { say "FAIL: ninja gpumem_static (see $LOG/nvtx-build.log)"; tail -20 "$LOG/nvtx-build.log"; exit 2; }
if ninja -C "$B" -t commands gpumem_static | grep 'backends/cuda.c' | grep -q 'GPUMEM_HAVE_NVTX=1'; then
  say "build: backends/cuda.c compiled with GPUMEM_HAVE_NVTX=1"
else
  say "FAIL: backends/cuda.c is not compiled with GPUMEM_HAVE_NVTX=1 in $B (configure with -DGPUMEM_WITH_NVTX=ON)"; exit 2
fi
LIB=$(find "$B/src" -maxdepth 1 -name 'libgpumem.a' | head -1)
EXE=$B/gpu_nvtx_oob
# sm_90 code for Hopper plus PTX for anything newer
"$NVCC" -std=c++17 -O2 -g -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
  -I"$ROOT/include" -I"$ROOT/tests/gpu" "$ROOT/tests/gpu/gpu_nvtx_oob.cu" "$LIB" -lpthread -ldl -o "$EXE" \
  >"$LOG/nvtx-nvcc.log" 2>&1 || { say "FAIL: nvcc gpu_nvtx_oob (see $LOG/nvtx-nvcc.log)"; tail -20 "$LOG/nvtx-nvcc.log"; exit 2; }
say "build: $EXE ($((SECONDS)) s so far)"

# ---- device and tool ------------------------------------------------------------
"$EXE" cudamalloc >"$LOG/nvtx-probe.log" 2>&1
rc=$?
if [ "$rc" = 77 ]; then
  say "SKIPPED: $(grep -o 'no usable GPU.*' "$LOG/nvtx-probe.log" | head -1); the build above is all this script can do without one"
  exit 0
fi
if [ "$rc" != 0 ]; then say "FAIL: gpu_nvtx_oob cudamalloc without the sanitizer exited $rc:"; cat "$LOG/nvtx-probe.log"; exit 2; fi
CS=$(command -v compute-sanitizer || true)
if [ -z "$CS" ]; then say "FAIL: compute-sanitizer not found (PATH, /usr/local/cuda/bin)"; exit 2; fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$SUMMARY"
say "compute-sanitizer: $CS, $("$CS" --version 2>&1 | grep -i version | head -1)"
"$CS" --help 2>&1 | grep -A2 -- '--nvtx' | sed 's/^/  help: /' | head -3 | tee -a "$SUMMARY"

# ---- the runs -----------------------------------------------------------------------
FAILS=0
N=0
# as ctest runs it: no sanitizer, the planted byte lands in the block's padding
"$EXE" oob >"$LOG/nvtx-0-no-sanitizer.log" 2>&1
rc=$?
if [ "$rc" = 0 ]; then say "no sanitizer: gpu_nvtx_oob oob exit 0 (ok)"
else say "no sanitizer: gpu_nvtx_oob oob exit $rc: UNEXPECTED (see nvtx-0-no-sanitizer.log)"; FAILS=$((FAILS + 1)); fi
# run NAME EXPECT(0|1|info) ENV-ASSIGNMENTS("-" for none) SANITIZER-OPTIONS -- MODE
run() {
  local name=$1 expect=$2 envs=$3 opts=$4 mode=$5
  N=$((N + 1))
  local log=$LOG/nvtx-$N-$name.log
  if [ "$SECONDS" -ge "$DEADLINE" ]; then say "$(printf '%-34s SKIPPED (deadline %s s)' "$name" "$DEADLINE")"; return; fi
  local e=()
  [ "$envs" != "-" ] && read -r -a e <<<"$envs"
  # shellcheck disable=SC2086
  echo "+ env ${e[*]:-} $CS --tool memcheck --error-exitcode 9 --destroy-on-device-error kernel $opts $EXE $mode" >"$log"
  # shellcheck disable=SC2086
  timeout 60 env "${e[@]}" "$CS" --tool memcheck --error-exitcode 9 --destroy-on-device-error kernel $opts "$EXE" "$mode" >>"$log" 2>&1
  local rc=$?
  local errs
  errs=$(grep -o 'ERROR SUMMARY: [0-9]* error' "$log" | tail -1 | grep -o '[0-9]*')
  [ -z "$errs" ] && errs="?"
  local verdict=""
  case "$expect" in
    info) verdict="(information)" ;;
    0) if [ "$errs" = 0 ] && [ "$rc" = 0 ]; then verdict="ok: nothing reported, as expected"; else verdict="UNEXPECTED: expected 0 errors and exit 0"; FAILS=$((FAILS + 1)); fi ;;
    1) if [ "$errs" != "?" ] && [ "$errs" -ge 1 ] && grep -q 'Invalid __global__ write of size 1' "$log"; then verdict="ok: the planted write was reported"; else verdict="UNEXPECTED: the planted write was NOT reported"; FAILS=$((FAILS + 1)); fi ;;
  esac
  say "$(printf '%-34s errors=%-3s rc=%-3s %s' "$name" "$errs" "$rc" "$verdict")"
  # what the program and the sanitizer said that matters
  grep -E '^nvtx |NVTX domain|^heap |Warning: Call to nvtx|Invalid __global__|is out of bounds|bytes (before|after) the nearest|NVTX|Nvtx|nvtx.*(error|warn)|FAIL|PASSED|Device not supported|rror:' "$log" \
    | grep -v '^+ ' | head -12 | sed 's/^/      /' | tee -a "$SUMMARY"
}

say ""
say "--- references without libgpumem"
run cudamalloc 1 - "" cudamalloc
run raw 1 - "" raw
run raw-clean 0 - "" raw-clean
run raw-nvtx-yes 1 - "--nvtx yes" raw
run raw-early info - "" raw-early
run raw-thread info - "" raw-thread
run vmm-reserve info - "" vmm-reserve
run vmm-after info - "" vmm-after
run vmm-chunk info - "" vmm-chunk
say ""
say "--- libgpumem, plain cudaMalloc segments"
run plain-oob 1 "GPUMEM_EXPANDABLE=0" "" oob
run plain-clean 0 "GPUMEM_EXPANDABLE=0" "" clean
run plain-oob-nvtx-yes 1 "GPUMEM_EXPANDABLE=0" "--nvtx yes" oob
run plain-clean-nvtx-yes 0 "GPUMEM_EXPANDABLE=0" "--nvtx yes" clean
run plain-oob-nvtx-no info "GPUMEM_EXPANDABLE=0" "--nvtx no" oob
say ""
say "--- libgpumem, GPUMEM_EXPANDABLE=1 (under compute-sanitizer the backend uses plain segments anyway)"
run vm-oob 1 "GPUMEM_EXPANDABLE=1" "" oob
run vm-clean 0 "GPUMEM_EXPANDABLE=1" "" clean
run vm-oob-nvtx-yes 1 "GPUMEM_EXPANDABLE=1" "--nvtx yes" oob
say ""
if [ "$FAILS" = 0 ]; then
  say "RESULT: every expectation held ($N runs, $SECONDS s): the planted write is reported, the in-bounds control is not"
  exit 0
fi
say "RESULT: $FAILS run(s) not as expected ($N runs, $SECONDS s); logs in $LOG"
exit 1
