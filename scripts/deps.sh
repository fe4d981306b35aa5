#!/usr/bin/env bash
# Installs (with apt-get) the Debian packages libgpumem's build and tests need,
# only those that are missing. Safe to run again. Run as root or with sudo.
set -euo pipefail
pkgs=(cmake ninja-build gcc g++ make pkg-config libcmocka-dev zlib1g-dev
      python3 python3-pytest python3-pip python3-venv valgrind gfortran
      openmpi-bin libopenmpi-dev doxygen libamdhip64-dev clang)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# The python3 on PATH may not be Debian's (pyenv, venv): give it pytest too.
if ! python3 -c "import pytest" >/dev/null 2>&1; then
  echo "deps: pip install pytest for $(command -v python3)"
  python3 -m pip install -q pytest || python3 -m pip install -q --break-system-packages pytest
fi
if ! python3 -c "import numpy" >/dev/null 2>&1; then
  python3 -m pip install -q numpy || python3 -m pip install -q --break-system-packages numpy || true
fi
# matplotlib: gpumem.plot's pictures (test_plot.py draws PNG and SVG with it; skipped without).
if ! python3 -c "import matplotlib" >/dev/null 2>&1; then
  python3 -m pip install -q matplotlib || python3 -m pip install -q --break-system-packages matplotlib || true
fi
# The Python package's build backend (scikit-build-core) comes from PyPI into pip's isolated
# build environment (ctest python_package, in fresh venvs: python3-venv above).
# The CUDA toolkit is not a Debian package here: it is used when found
# (nvcc on PATH or /usr/local/cuda); without it the CUDA backend is skipped.
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "deps: CUDA toolkit found in /usr/local/cuda"
fi
