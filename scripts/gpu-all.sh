#!/usr/bin/env bash
# Everything GPU-related in one command for the device machine (one lease):
#   suite   scripts/gpu-suite.sh   (build, tests/gpu, CUDA_VISIBLE_DEVICES variants, probe, hw suite)
#   nvtx    scripts/gpu-nvtx.sh: compute-sanitizer memcheck with NVTX annotations on a planted out-of-bounds write
#   replay  scripts/gpu-bench.sh build info replay   (the traces through the cuda backend)
#   bench   scripts/gpu-bench.sh bench               (libgpumem vs cudaMalloc vs cudaMallocAsync vs PyTorch)
#   soak    tests/test_soak on the cuda backend, 16 threads, SOAK_SECONDS (60)
#   soakbg  the same soak started in a new session (setsid) so it outlives this command (it runs
#           until the machine goes back): for a soak longer than one command's 10-minute limit.
#           Log and exit status in /tmp/gpumem-soak/ on the device machine.
#   soakwait  wait (up to SOAK_WAIT seconds, default 590) for the soakbg run, then report it
#   python  scripts/gpu-python.sh                    (pytest on cuda, ResNet-18 loss match, trim, CuPy)
# Usage: bash scripts/gpu-all.sh [part...]   (default: suite nvtx replay bench python)
# Parts run in this order: suite nvtx soak replay bench soakbg python soakwait.
# Each part gets a time limit; parts are skipped once DEADLINE seconds (default 560) are used.
# All logs are packed into $OUT/gpu-logs.tgz; $OUT/summary.txt has each part's status.
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
FINAL=${OUT:-$ROOT/gpu-all-out}
W=$(mktemp -d /tmp/gpu-all.XXXX)
DEADLINE=${DEADLINE:-560}
PARTS=" ${*:-suite nvtx replay bench python} "
export PATH="$PATH:/usr/local/cuda/bin" PYTHONUNBUFFERED=1
mkdir -p "$FINAL"
S=$FINAL/summary.txt
: >"$S"
want() { [[ "$PARTS" == *" $1 "* ]]; }
part() { # part NAME LIMIT CMD...
  local name=$1 limit=$2; shift 2
  local left=$((DEADLINE - SECONDS))
  if [ "$left" -lt 20 ]; then echo "part $name: SKIPPED (deadline)" | tee -a "$S"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$SECONDS
  timeout "$limit" "$@" >"$W/$name.out" 2>&1
  local rc=$?
  echo "part $name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$S"
}
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,memory.used,driver_version --format=csv >"$W/nvidia-smi.txt" 2>&1
cat "$W/nvidia-smi.txt" >>"$S"
want suite && part suite 300 env OUT="$W/suite" bash scripts/gpu-suite.sh
nvtx() { OUT="$W/nvtx" bash "$ROOT/scripts/gpu-nvtx.sh"; }
export -f nvtx; export ROOT W
want nvtx && part nvtx 120 bash -c nvtx
# The soak binary links libcmocka: where gpu-suite.sh unpacked it (again here when a later command's
# carried .gpu replaced the unpacked copy, as in GPU-TESTING.md run 13).
cmocka_path() {
  [ -e /usr/include/cmocka.h ] && return 0
  local P=$ROOT/.gpu/cmocka/root
  if ! find "$P" -name 'libcmocka.so.0' 2>/dev/null | grep -q .; then
    for deb in "$ROOT"/.gpu/cmocka/*.deb; do dpkg -x "$deb" "$P"; done
  fi
  local d
  d=$(dirname "$(find "$P" -name 'libcmocka.so.0' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
if want soak || want soakbg; then cmocka_path; fi
# soak without suite on a fresh machine: the suite's build stage builds the tests first
if { want soak || want soakbg; } && ! want suite && [ ! -x "${GPUMEM_GPU_BUILD:-$ROOT/build-gpu}/tests/test_soak" ]; then
  part soak-build 300 env OUT="$W/suite" GPU_SUITE_STAGES=build bash scripts/gpu-suite.sh
  cmocka_path
fi
want soak && part soak "$((${SOAK_SECONDS:-60} + 30))" env GPUMEM_TEST_BACKEND=cuda GPUMEM_LOG=off \
  GPUMEM_SOAK_SECONDS="${SOAK_SECONDS:-60}" GPUMEM_SOAK_THREADS=16 GPUMEM_SOAK_MAX_MIB=2048 "${GPUMEM_GPU_BUILD:-$ROOT/build-gpu}/tests/test_soak"
want replay && part replay 200 env OUT="$W/bench" BUILD=build-gpu-bench bash scripts/gpu-bench.sh build info replay
want bench && part bench 330 env OUT="$W/bench2" BUILD=build-gpu-bench REPEAT=${REPEAT:-5} bash scripts/gpu-bench.sh build bench
soakbg() {
  rm -rf /tmp/gpumem-soak && mkdir -p /tmp/gpumem-soak
  date -u +%Y-%m-%dT%H:%M:%SZ >/tmp/gpumem-soak/start
  setsid env GPUMEM_TEST_BACKEND=cuda GPUMEM_LOG=off GPUMEM_SOAK_SECONDS="${SOAK_SECONDS:-60}" \
    GPUMEM_SOAK_THREADS=16 GPUMEM_SOAK_MAX_MIB=2048 \
    bash -c '"$0"/tests/test_soak >/tmp/gpumem-soak/log 2>&1; echo $? >/tmp/gpumem-soak/rc; date -u +%Y-%m-%dT%H:%M:%SZ >/tmp/gpumem-soak/end' \
    "${GPUMEM_GPU_BUILD:-$ROOT/build-gpu}" </dev/null >/dev/null 2>&1 &
  sleep 5
  echo "soak started at $(cat /tmp/gpumem-soak/start) for ${SOAK_SECONDS:-60} s"; tail -3 /tmp/gpumem-soak/log
}
soakwait() {
  local waited=0
  while [ ! -e /tmp/gpumem-soak/rc ] && [ "$waited" -lt "${SOAK_WAIT:-590}" ]; do sleep 5; waited=$((waited + 5)); done
  [ -e /tmp/gpumem-soak/start ] || { echo "no soak was started on this machine"; return 1; }
  echo "start $(cat /tmp/gpumem-soak/start) end $(cat /tmp/gpumem-soak/end 2>/dev/null) rc $(cat /tmp/gpumem-soak/rc 2>/dev/null)"
  cat /tmp/gpumem-soak/log
  [ "$(cat /tmp/gpumem-soak/rc 2>/dev/null)" = 0 ]
}
export -f soakbg soakwait
want soakbg && DEADLINE=$((SECONDS + 60)) part soakbg 30 bash -c soakbg # not skipped for the deadline: it only starts the soak
want python && part python 200 env OUT="$W/python" bash scripts/gpu-python.sh
want soakwait && part soakwait "${SOAK_WAIT:-590}" bash -c soakwait
tar czf "$FINAL/gpu-logs.tgz" -C "$W" . 2>/dev/null
for f in "$W"/*/summary.txt; do echo "=== $f"; cat "$f"; done >>"$S"
cat "$S"
