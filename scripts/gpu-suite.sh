#!/usr/bin/env bash
# gpu-suite.sh: build libgpumem with the CUDA backend and run everything
# GPU-related, on a machine with an NVIDIA GPU. One command, logs under $OUT.
#
#   OUT=/tmp/gpu-out scripts/gpu-suite.sh          # all stages
#   GPU_SUITE_STAGES="gpu context" scripts/gpu-suite.sh
#
# Stages (in this order; each logs to $OUT/<stage>.log):
#   build    configure (Ninja, -DGPUMEM_HW_TESTS=ON) and build the tests
#   gpu      ctest -L gpu: tests/gpu/* (fill, streams, oom, trim, reset, context, raw vtable)
#   context  tests/gpu/gpu_context again under CUDA_VISIBLE_DEVICES unset / 0 / 1 / "1,0"
#            (CUDA_DEVICE_ORDER=PCI_BUS_ID; variants naming a missing GPU are skipped)
#   probe    test_backend_probe on the GPU machine (there "cuda" must succeed)
#   hw       ctest -L hw: the cmocka suite again with GPUMEM_TEST_BACKEND=cuda
# $OUT/summary.txt lists each stage's result; exit status 1 if any failed.
#
# cmocka: if the system has none, the .deb files in .gpu/cmocka/ (apt-get
# download libcmocka0 libcmocka-dev) are unpacked into .gpu/cmocka/root.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}
BUILD=${GPUMEM_GPU_BUILD:-$ROOT/build-gpu}
STAGES=${GPU_SUITE_STAGES:-build gpu context probe hw}
HW_BUDGET=${GPU_SUITE_HW_SECONDS:-240}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
FAILED=0

note() { echo "$*" | tee -a "$SUMMARY"; }
want() { case " $STAGES " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
stage_result() { # name rc
  if [ "$2" -eq 0 ]; then note "stage $1: PASS"; else note "stage $1: FAIL (rc $2)"; FAILED=1; fi
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -srm)"
  nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,driver_version --format=csv 2>&1
  nvcc --version 2>&1 | tail -2
  cmake --version | head -1
} | tee "$OUT/env.txt"

CMOCKA_ARGS=()
if [ ! -e /usr/include/cmocka.h ] && ls "$ROOT"/.gpu/cmocka/*.deb >/dev/null 2>&1; then
  P=$ROOT/.gpu/cmocka/root
  for deb in "$ROOT"/.gpu/cmocka/*.deb; do dpkg -x "$deb" "$P"; done
  LIBDIR=$(dirname "$(find "$P" -name 'libcmocka.so*' | head -1)")
  CMOCKA_ARGS=(-DCMOCKA_INCLUDE_DIR="$P/usr/include" -DCMOCKA_LIBRARY="$LIBDIR/libcmocka.so.0")
  export LD_LIBRARY_PATH=$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  note "cmocka: unpacked from .gpu/cmocka into $P"
fi

if want build; then
  t0=$(date +%s)
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPUMEM_WITH_CUDA=ON \
    -DGPUMEM_HW_TESTS=ON -DGPUMEM_BUILD_TOOLS=OFF -DGPUMEM_BUILD_EXAMPLES=OFF \
    -DCMAKE_CUDA_ARCHITECTURES=90 "${CMOCKA_ARGS[@]}" >"$OUT/build.log" 2>&1 &&
    ninja -C "$BUILD" >>"$OUT/build.log" 2>&1
  rc=$?
  tail -5 "$OUT/build.log"
  stage_result "build ($(($(date +%s) - t0)) s)" $rc
  [ $rc -eq 0 ] || { note "build failed: nothing else runs"; exit 1; }
fi

export GPUMEM_GPU_REQUIRED=1 # tests/gpu fail instead of skipping without a GPU

if want gpu; then
  (cd "$BUILD" && ctest -L gpu -V --timeout 600) 2>&1 | tee "$OUT/gpu.log"
  stage_result gpu $?
fi

if want context; then
  NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  : >"$OUT/context.log"
  crc=0
  for cvd in unset 0 1 1,0; do
    need=1
    case $cvd in 1 | 1,0) need=2 ;; esac
    if [ "$NGPU" -lt "$need" ]; then
      echo "== CUDA_VISIBLE_DEVICES=$cvd: skipped ($NGPU GPU(s))" | tee -a "$OUT/context.log"
      continue
    fi
    echo "== CUDA_VISIBLE_DEVICES=$cvd" | tee -a "$OUT/context.log"
    if [ "$cvd" = unset ]; then
      env -u CUDA_VISIBLE_DEVICES CUDA_DEVICE_ORDER=PCI_BUS_ID "$BUILD/tests/gpu/gpu_context" 2>&1 | tee -a "$OUT/context.log"
    else
      CUDA_VISIBLE_DEVICES=$cvd CUDA_DEVICE_ORDER=PCI_BUS_ID "$BUILD/tests/gpu/gpu_context" 2>&1 | tee -a "$OUT/context.log"
    fi
    r=$?
    [ $r -eq 0 ] || crc=$r
  done
  stage_result context $crc
fi

if want probe; then
  (cd "$BUILD" && ctest -R '^test_backend_probe$' --output-on-failure) 2>&1 | tee "$OUT/probe.log"
  stage_result probe $?
fi

if want hw; then
  (cd "$BUILD" && GPUMEM_TEST_BACKEND=cuda timeout "$HW_BUDGET" ctest -L hw -V --timeout 120) \
    >"$OUT/hw.log" 2>&1
  rc=$?
  grep -E "tests passed|tests failed|Test +#[0-9]+:|PASSED|FAILED|SKIPPED" "$OUT/hw.log" | grep -v "^\s*$" | tail -80
  stage_result hw $rc
fi

note "overall: $([ $FAILED -eq 0 ] && echo PASS || echo FAIL)"
exit $FAILED
