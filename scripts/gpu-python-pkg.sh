#!/usr/bin/env bash
# The Python package on the GPU machine, as a user gets it: a wheel built there, installed in
# a fresh venv, then CuPy, Numba and the plot against that installed package. From the repo root:
#
#   OUT=/tmp/pypkg-out bash scripts/gpu-python-pkg.sh [STAGE...]   # logs into $OUT (default ./gpu-python-pkg-out)
#
# STAGEs (default all, in this order): wheel check bench gpu-tests plot all-tests. The wheel and
# the venv stay in build-gpu-wheel/ between runs, so the stages can be split over several calls
# on one machine (e.g. "wheel check bench", then "gpu-tests plot all-tests").
#
# No network is needed: the wheel is built with --no-build-isolation (scikit-build-core and
# ninja of python3), and the venv sees the machine's packages (--system-site-packages: CuPy,
# numba-cuda, PyTorch, pytest). Steps (each logged to $OUT/<step>.log; every step runs even if
# an earlier one failed; $OUT/summary.txt lists the exit codes):
#  1. wheel:   pip wheel ./bindings/python (CUDA backend required: -DGPUMEM_WITH_CUDA=ON);
#  2. install: a fresh venv, pip install of that wheel (--no-index --no-deps);
#  3. check:   outside the tree, without GPUMEM_LIBRARY: the library comes from the installed
#              package, Context(backend="cuda") allocates on the device;
#  4. cupy-bench: examples/python/cupy_bench.py, CuPy's MemoryPool vs gpumem (medians, 4 KiB,
#              1 MiB, 64 MiB), figures also in $OUT/cupy_bench.json;
#  5. pytest-gpu: test_cupy.py, test_numba.py, test_plot.py, test_torch_cupy.py on the installed
#              package (GPUMEM_TEST_INSTALLED=1), verbose with skip reasons;
#  6. plot:    python -m gpumem.plot on the resnet50 trace: PNG, SVG and the PyTorch snapshot,
#              which torch.cuda._memory_viz then reads (stats, trace_plot);
#  7. pytest-all: the rest of the Python suite on the installed package (as in CI; the files of
#              step 5 and test_torch_parity.py, which scripts/gpu-python.sh runs, left out).
# Exit status: 0 only if every step passed.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-python-pkg-out}
WB=$ROOT/build-gpu-wheel
VENV=${VENV:-$WB/venv}
STAGES=${*:-wheel check bench gpu-tests plot all-tests}
want() { [[ " $STAGES " == *" $1 "* ]]; }
mkdir -p "$OUT" "$WB"
summary="$OUT/summary.txt"
: >"$summary"
failed=0
step() { # step NAME TIMEOUT CMD... : run, log to $OUT/NAME.log, record the status
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*" | tee -a "$summary"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc, $((SECONDS - t0)) s" | tee -a "$summary"
  [ $rc -eq 0 ] || failed=1
  return $rc
}
export PATH="$PATH:/usr/local/cuda/bin"
unset GPUMEM_LIBRARY GPUMEM_BACKEND GPUMEM_LOG PYTHONPATH

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "git: $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv 2>&1
  for m in sys scikit_build_core ninja cupy numba numba.cuda torch matplotlib pytest; do
    python3 -c "import $m as x, sys; print('$m', getattr(x, '__version__', sys.version.split()[0]))" 2>&1 | tail -1
  done
  command -v nvcc && nvcc --version | tail -1
} >"$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt" | tee -a "$summary"

if want wheel; then
  rm -rf "$WB/dist"
  step wheel 400 python3 -m pip wheel --no-build-isolation --no-deps -w "$WB/dist" \
    -C cmake.define.GPUMEM_WITH_CUDA=ON -C build-dir="$WB/build" ./bindings/python
  whl=$(ls "$WB"/dist/gpumem-*.whl 2>/dev/null | head -n1)
  if [ -z "$whl" ]; then
    tail -40 "$OUT/wheel.log" | tee -a "$summary"
    echo "no wheel: stopping" | tee -a "$summary"
    exit 1
  fi
  echo "wheel: $(basename "$whl")" | tee -a "$summary"
  cp "$whl" "$OUT/"
  python3 -m zipfile -l "$whl" >"$OUT/wheel-contents.txt" 2>&1
  rm -rf "$VENV"
  step install 120 bash -c "python3 -m venv --system-site-packages '$VENV' && '$VENV/bin/pip' install --no-index --no-deps --force-reinstall '$whl'"
  # The machine's packages may sit outside the system site (user site, PYTHONPATH): the venv sees
  # every site directory python3 sees, after its own (the installed gpumem comes first).
  "$VENV/bin/python" - "$(python3 -c 'import sys; print(":".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))')" <<'PYEOF'
import os, sys, sysconfig
own = sysconfig.get_paths()["purelib"]
dirs = [d for d in sys.argv[1].split(":") if d and os.path.isdir(d) and os.path.realpath(d) != os.path.realpath(own)]
with open(os.path.join(own, "_machine_site.pth"), "w") as f:
    f.write("\n".join(dirs) + "\n")
print("venv also sees:", dirs)
PYEOF
fi
PY=$VENV/bin/python
if [ ! -x "$PY" ]; then
  echo "no venv at $VENV: run the wheel stage first" | tee -a "$summary"
  exit 1
fi

if want check && ! step check 120 bash -c "cd /tmp && '$PY' - <<'PYEOF'
import os, gpumem
from gpumem import _build_info
pkg = os.path.dirname(gpumem.__file__)
print('gpumem', gpumem.__version__, 'from', pkg, '; library', gpumem.capi.library_path)
print('built with backends', _build_info.backends, 'CUDA', _build_info.cuda_version)
assert os.path.dirname(os.path.realpath(gpumem.capi.library_path)) == os.path.realpath(pkg)
assert 'cuda' in _build_info.backends
with gpumem.Context(backend='cuda') as ctx:
    print('cuda:', ctx.device_count, 'device(s):', ctx.device_info(0)['name'])
    with ctx.alloc(64 << 20) as b:
        print('64 MiB at 0x%x on device %d' % (b.ptr, b.device))
    print(ctx.stats(0))
with gpumem.Context(backend='sim') as ctx:
    ctx.alloc(4096).free()
print('ok')
PYEOF"; then
  cat "$OUT/check.log" | tee -a "$summary"
  echo "the installed wheel has no working cuda backend: stopping" | tee -a "$summary"
  exit 1
fi
want check && tail -3 "$OUT/check.log" | tee -a "$summary"

if want bench; then
  step cupy-bench 300 "$PY" examples/python/cupy_bench.py --json "$OUT/cupy_bench.json"
  tail -6 "$OUT/cupy-bench.log" | tee -a "$summary"
fi

T=bindings/python/tests
GPU_FILES="$T/test_cupy.py $T/test_numba.py $T/test_plot.py $T/test_torch_cupy.py"
if want gpu-tests; then
  # shellcheck disable=SC2086
  GPUMEM_TEST_INSTALLED=1 step pytest-gpu 480 "$PY" -m pytest -v -rs -p no:cacheprovider $GPU_FILES
  tail -14 "$OUT/pytest-gpu.log" | tee -a "$summary"
fi

want plot && step plot 240 bash -o pipefail -c "'$PY' -m gpumem.plot examples/traces/resnet50.txt.gz -o '$OUT/memory-resnet50.png' \
  -o '$OUT/memory-resnet50.svg' --snapshot '$OUT/memory-resnet50.pickle' && \
  '$PY' -m torch.cuda._memory_viz stats '$OUT/memory-resnet50.pickle' | tail -6 && \
  '$PY' -m torch.cuda._memory_viz trace_plot '$OUT/memory-resnet50.pickle' -o '$OUT/memory-resnet50.html'"
want plot && tail -8 "$OUT/plot.log" | tee -a "$summary"

if want all-tests; then
  ign=()
  for f in $GPU_FILES $T/test_torch_parity.py; do ign+=(--ignore="$f"); done
  GPUMEM_TEST_INSTALLED=1 step pytest-all 300 "$PY" -m pytest -q -rs -p no:cacheprovider "${ign[@]}" $T
  tail -3 "$OUT/pytest-all.log" | tee -a "$summary"
fi

echo "overall: $([ $failed -eq 0 ] && echo PASS || echo FAIL)" | tee -a "$summary"
exit $failed
