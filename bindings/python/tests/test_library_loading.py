"""Finding libgpumem: GPUMEM_LIBRARY, beside the package, the system search path."""

from __future__ import annotations

import os
import shutil

import gpumem
from conftest import PKG_DIR, run_python

PROBE = """
import gpumem.capi as capi
print("LOADED", capi.library_path)
"""

PROBE_ERR = """
try:
    import gpumem
except ImportError as e:
    print("ERROR", type(e).__name__)
    print(e)
else:
    print("LOADED", gpumem.capi.library_path)
"""


def _copy_package(tmp_path):
    dst = tmp_path / "pkg"
    shutil.copytree(os.path.join(PKG_DIR, "gpumem"), dst / "gpumem",
                    ignore=shutil.ignore_patterns("libgpumem.so*", "__pycache__"))
    return dst


def test_library_path_is_absolute_and_loaded():
    assert os.path.isabs(gpumem.capi.library_path)
    assert os.path.exists(gpumem.capi.library_path)
    assert any(why.startswith("loaded") for _, why in gpumem.capi.tried_paths)


def test_env_path_pointing_nowhere_lists_tried_paths(tmp_path):
    pkg = _copy_package(tmp_path)
    missing = str(tmp_path / "nowhere" / "libgpumem.so")
    r = run_python(PROBE_ERR, env={"GPUMEM_LIBRARY": missing, "LD_LIBRARY_PATH": None}, pythonpath=str(pkg))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    if out.startswith("LOADED"):
        # a libgpumem is installed on this system: it is used, with a warning about GPUMEM_LIBRARY
        assert "GPUMEM_LIBRARY" in r.stderr and missing in r.stderr
        return
    assert out.startswith("ERROR LibraryNotFoundError")
    assert missing + ": no such file (GPUMEM_LIBRARY)" in out
    assert os.path.join(str(pkg), "gpumem", "libgpumem.so*") in out
    assert "libgpumem.so.0" in out and "libgpumem.so:" in out
    assert "Set GPUMEM_LIBRARY" in out


def test_env_path_not_a_library(tmp_path):
    pkg = _copy_package(tmp_path)
    bogus = tmp_path / "libgpumem.so"
    bogus.write_text("not an ELF file\n")
    r = run_python(PROBE_ERR, env={"GPUMEM_LIBRARY": str(bogus), "LD_LIBRARY_PATH": None}, pythonpath=str(pkg))
    assert r.returncode == 0, r.stderr
    if r.stdout.startswith("LOADED"):
        assert str(bogus) in r.stderr
        return
    assert str(bogus) + ": " in r.stdout
    assert "(GPUMEM_LIBRARY)" in r.stdout


def test_env_path_wins(tmp_path):
    lib_copy = tmp_path / "libgpumem-copy.so"
    shutil.copy(gpumem.capi.library_path, lib_copy)
    r = run_python(PROBE, env={"GPUMEM_LIBRARY": str(lib_copy)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "LOADED " + os.path.realpath(str(lib_copy))


def test_library_beside_the_package(tmp_path):
    pkg = _copy_package(tmp_path)
    shutil.copy(gpumem.capi.library_path, pkg / "gpumem" / "libgpumem.so.0")
    r = run_python(PROBE + "import gpumem\nwith gpumem.Context(backend='sim') as c: print(c.backend)\n",
                   env={"GPUMEM_LIBRARY": None, "GPUMEM_BACKEND": "sim"}, pythonpath=str(pkg))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    assert lines[:2] == ["LOADED", str(pkg / "gpumem" / "libgpumem.so.0")] and lines[2] == "sim"


def test_env_fallback_warns(tmp_path):
    pkg = _copy_package(tmp_path)
    shutil.copy(gpumem.capi.library_path, pkg / "gpumem" / "libgpumem.so")
    r = run_python("import warnings\nwarnings.simplefilter('always')\n" + PROBE,
                   env={"GPUMEM_LIBRARY": str(tmp_path / "missing.so")}, pythonpath=str(pkg))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "LOADED " + str(pkg / "gpumem" / "libgpumem.so")
    assert "RuntimeWarning" in r.stderr and "missing.so" in r.stderr


def test_every_public_function_has_a_prototype():
    """gpumem.capi sets argtypes and restype for every function of gpumem.h, gpumem/sim.h and
    gpumem/backend.h (docs/PYTHON.md): without them ctypes passes pointers and 64-bit sizes as C ints."""
    import re

    import pytest

    include = os.path.join(PKG_DIR, os.pardir, os.pardir, "include")
    headers = [os.path.join(include, "gpumem.h"), os.path.join(include, "gpumem", "sim.h"),
               os.path.join(include, "gpumem", "backend.h")]
    if not all(os.path.exists(h) for h in headers):
        pytest.skip("the headers are not beside this package (an installed wheel)")
    names = set()
    for h in headers:
        with open(h) as f:
            names.update(re.findall(r"GPUMEM_API[^;{(]*?\b(gpumem_\w+)\s*\(", f.read()))
    assert len(names) > 60
    lib = gpumem.capi.lib
    missing = sorted(n for n in names if hasattr(lib, n) and getattr(lib, n).argtypes is None)
    assert missing == []
    absent = sorted(n for n in names if not hasattr(lib, n))
    assert absent == []  # the library exports every declared function
