"""Shared fixtures of the gpumem Python tests.

The tests run on the sim backend by default. With GPUMEM_BACKEND=cuda (or hip)
in the environment the same tests run against the real device; tests that
need the simulator (host-readable memory, fault injection, fake stream
handles) skip themselves then.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Dict, Optional

import pytest

PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# GPUMEM_TEST_INSTALLED=1: test the gpumem installed in this interpreter (a wheel), not the source tree's
INSTALLED = bool(os.environ.get("GPUMEM_TEST_INSTALLED"))
if not INSTALLED and PKG_DIR not in sys.path:
    sys.path.insert(0, PKG_DIR)

import gpumem  # noqa: E402

MiB = 1 << 20
GiB = 1 << 30

# The environment of a subprocess that uses the real GPU (the framework tests).
GPU_ENV = {"GPUMEM_BACKEND": "cuda"}


def _gpumem_has_cuda() -> bool:
    try:
        with gpumem.Context(backend="cuda", flags=gpumem.CONFIG_NO_ENV) as c:
            return c.device_count > 0
    except gpumem.GpumemError:
        return False


def need_gpu() -> None:
    """Skip the calling test unless an NVIDIA GPU is there and libgpumem's cuda backend sees it."""
    if not (os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl")):
        pytest.skip("no NVIDIA GPU on this machine")
    if not _gpumem_has_cuda():
        pytest.skip("libgpumem was built without the CUDA backend or sees no CUDA device")


@pytest.fixture
def ctx():
    """A fresh context (sim unless GPUMEM_BACKEND says otherwise), closed after the test."""
    c = gpumem.Context(backend="sim")
    try:
        yield c
    finally:
        c.close()


def is_sim(c: "gpumem.Context") -> bool:
    return c.backend == "sim"


@pytest.fixture
def sim_ctx(ctx):
    """Like ctx, but the test is skipped unless the backend is sim."""
    if not is_sim(ctx):
        pytest.skip("needs the sim backend (host-readable memory, fake streams, fault injection)")
    return ctx


@pytest.fixture
def sim_faults():
    """Clears injected sim faults after the test."""
    if not gpumem.sim.available():
        pytest.skip("library without sim controls")
    gpumem.sim.fail_clear()
    yield gpumem.sim
    gpumem.sim.fail_clear()


def run_python(code: str, env: Optional[Dict[str, str]] = None, pythonpath: Optional[str] = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter with the package and library of this process."""
    e = dict(os.environ)
    if pythonpath is not None:
        e["PYTHONPATH"] = pythonpath
    elif INSTALLED:
        e.pop("PYTHONPATH", None)
    else:
        e["PYTHONPATH"] = PKG_DIR
    e.setdefault("GPUMEM_LIBRARY", gpumem.capi.library_path)
    if env:
        for k, v in env.items():
            if v is None:
                e.pop(k, None)
            else:
                e[k] = v
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True,
                          text=True, timeout=timeout)


def sim_env(**extra: Optional[str]) -> Dict[str, Optional[str]]:
    """Environment for a subprocess forced onto the sim backend."""
    env: Dict[str, Optional[str]] = {"GPUMEM_BACKEND": "sim", "CUDA_VISIBLE_DEVICES": None}
    env.update(extra)
    return env


import gpumem.sim  # noqa: E402,F401  (fixtures above use it)
