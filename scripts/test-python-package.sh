#!/usr/bin/env bash
# The Python package as a new user gets it: from a copy of the source tree (no
# build directory, no library beside the package), in fresh virtual environments,
#   1. pip install ./bindings/python   (scikit-build-core builds libgpumem with CMake)
#   2. pip wheel ./bindings/python, then pip install of that wheel elsewhere
# and in each: import gpumem without GPUMEM_LIBRARY, the library loaded from inside
# the package, a sim allocation, versions equal to VERSION and gpumem.h, the files
# the PyTorch shim needs (gpumem/include/gpumem.h, gpumem/csrc/torch_shim.cpp),
# Context(backend="cuda") either working or raising NoBackendError with its reason.
#
# Usage: scripts/test-python-package.sh [--work-dir DIR] [--keep] [--no-build-isolation]
#   --no-build-isolation  build with the scikit-build-core of python3 (no download; the
#                         venvs are made with --system-site-packages)
# Environment: PYTHON (default python3). Needs pip to reach PyPI for scikit-build-core,
# unless --no-build-isolation.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work="" keep=0 isolation=1
while [ $# -gt 0 ]; do
  case $1 in
    --work-dir) work=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --no-build-isolation) isolation=0; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "test-python-package: unknown argument $1" >&2; exit 2 ;;
  esac
done
PY=${PYTHON:-python3}
if [ -z "$work" ]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/gpumem-pypkg.XXXXXX")
  [ "$keep" = 1 ] || trap 'rm -rf "$work"' EXIT
else
  rm -rf "$work"
  mkdir -p "$work"
fi
work=$(cd "$work" && pwd)
fail() { echo "test-python-package: FAILED: $*" >&2; exit 1; }
step() { printf '\n---- %s\n' "$*"; }

step "copy of the source tree (tracked and unignored files) to $work/src"
mkdir -p "$work/src"
if git -C "$src" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$src" && git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
     [ -e "$f" ] && printf '%s\0' "$f"; done | xargs -0 cp --parents -t "$work/src")
else
  (cd "$src" && tar --exclude='./build*' --exclude='./.git' --exclude='__pycache__' \
     --exclude='./bindings/python/gpumem/libgpumem.so*' -cf - .) | tar -C "$work/src" -xf -
fi
ls "$work/src/bindings/python/gpumem/" | grep -q '^libgpumem' && fail "the copy holds a prebuilt library"

venv_args=()
pip_args=(-q --disable-pip-version-check)
if [ "$isolation" = 0 ]; then
  venv_args=(--system-site-packages)
  pip_args+=(--no-build-isolation)
fi

# Everything a new user relies on, in a fresh interpreter outside the source tree.
check() { # check VENV
  local py=$1/bin/python
  (cd "$work" && env -u GPUMEM_LIBRARY -u GPUMEM_BACKEND -u PYTHONPATH -u LD_LIBRARY_PATH \
     GPUMEM_SIM_DEVICES=1x4GiB GPUMEM_SRC="$work/src" "$py" - <<'PYEOF'
import os, re, sys
import gpumem
pkg = os.path.dirname(gpumem.__file__)
lib = gpumem.capi.library_path
print("gpumem", gpumem.__version__, "from", pkg)
print("library", lib)
assert os.path.dirname(os.path.realpath(lib)) == os.path.realpath(pkg), "library not from inside the package: %s" % lib
src = os.environ["GPUMEM_SRC"]
with open(os.path.join(src, "VERSION")) as f:
    want = f.read().strip()
assert gpumem.__version__ == want, (gpumem.__version__, want)
with open(os.path.join(pkg, "include", "gpumem.h")) as f:
    h = f.read()
hv = ".".join(re.search(r"#define GPUMEM_VERSION_%s (\d+)" % k, h).group(1) for k in ("MAJOR", "MINOR", "PATCH"))
assert hv == want, (hv, want)
assert os.path.isfile(os.path.join(pkg, "csrc", "torch_shim.cpp")), "torch shim source not installed"
from importlib import metadata
assert metadata.version("gpumem") == want, metadata.version("gpumem")
with gpumem.Context(backend="sim") as ctx:
    with ctx.alloc(1 << 20) as buf:
        assert buf.ptr and buf.size == 1 << 20
    print("sim: 1 MiB allocated and freed;", ctx.stats()["num_allocs"], "allocation(s)")
try:
    with gpumem.Context(backend="cuda") as ctx:
        print("cuda:", ctx.device_count, "device(s)")
except gpumem.NoBackendError as e:
    assert e.message, "NoBackendError without a reason"
    print("cuda unavailable here, as NoBackendError says:", e)
print("ok")
PYEOF
  )
}

step "venv 1: pip install ./bindings/python"
"$PY" -m venv "${venv_args[@]}" "$work/v1"
(cd "$work/src" && "$work/v1/bin/pip" install "${pip_args[@]}" ./bindings/python) || fail "pip install ./bindings/python"
check "$work/v1" || fail "the installed package (venv 1)"

step "pip wheel ./bindings/python, installed into venv 2"
(cd "$work/src" && "$work/v1/bin/pip" wheel "${pip_args[@]}" --no-deps -w "$work/dist" ./bindings/python) || fail "pip wheel"
whl=$(ls "$work"/dist/gpumem-*.whl)
echo "wheel: $(basename "$whl")"
"$PY" -m zipfile -l "$whl" | awk 'NR>1 {print "  " $1}' | grep -E 'libgpumem|gpumem\.h|torch_shim|_version' || fail "wheel contents"
"$PY" -m venv "${venv_args[@]}" "$work/v2"
"$work/v2/bin/pip" install "${pip_args[@]}" "$whl" || fail "pip install of the wheel"
check "$work/v2" || fail "the installed wheel (venv 2)"

printf '\ntest-python-package: pip install and pip wheel both give a working gpumem\n'
