"""setuptools hooks of the gpumem package (metadata lives in pyproject.toml).

Two build steps beyond the pure-Python package:

- ``gpumem.h`` of the source tree is copied to ``gpumem/include/`` so that
  the PyTorch shim can be built later, from an installed package;
- when PyTorch is importable in the build environment (``pip install
  --no-build-isolation``) and a libgpumem to link is found (``GPUMEM_LIBRARY``
  or ``gpumem/libgpumem.so*``), the shim ``gpumem._gpumem_torch`` is compiled
  against that PyTorch. Otherwise it is built on the first
  ``gpumem.torch.enable()``; a failed build here never fails the install.
"""

import glob
import hashlib
import os
import shutil
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "gpumem")
REPO_HEADER = os.path.join(HERE, os.pardir, os.pardir, "include", "gpumem.h")
SHIM = os.path.join("gpumem", "csrc", "torch_shim.cpp")


def copy_header():
    if os.path.isfile(REPO_HEADER):
        os.makedirs(os.path.join(PKG, "include"), exist_ok=True)
        shutil.copyfile(REPO_HEADER, os.path.join(PKG, "include", "gpumem.h"))


def library_to_link():
    env = os.environ.get("GPUMEM_LIBRARY")
    if env and os.path.isfile(env):
        return os.path.abspath(env)
    found = sorted(glob.glob(os.path.join(PKG, "libgpumem.so*")), key=len)
    return found[0] if found else None


def shim_extension():
    """The shim as a torch CppExtension, or None (with the reason on stderr) when it cannot be built here."""
    if os.environ.get("GPUMEM_NO_TORCH_SHIM"):
        return None, None
    try:
        import torch  # noqa: F401
        from torch.utils import cpp_extension
    except ImportError:
        return None, None
    lib = library_to_link()
    header_dir = os.path.join(PKG, "include")
    if lib is None or not os.path.isfile(os.path.join(header_dir, "gpumem.h")):
        sys.stderr.write("gpumem: PyTorch shim not prebuilt (no libgpumem or gpumem.h); built on first enable()\n")
        return None, None
    h = hashlib.sha256()
    for f in (os.path.join(HERE, SHIM), os.path.join(header_dir, "gpumem.h")):
        with open(f, "rb") as fh:
            h.update(fh.read())
    incs = [header_dir]
    ldflags = [os.path.join("-L" + os.path.dirname(lib)), "-l:" + os.path.basename(lib), "-Wl,-rpath,$ORIGIN", "-lc10_cuda", "-ltorch_cuda"]
    home = cpp_extension.CUDA_HOME
    if home and os.path.isdir(os.path.join(home, "include")):
        incs.append(os.path.join(home, "include"))
    ext = cpp_extension.CppExtension(
        "gpumem._gpumem_torch",
        [SHIM],
        include_dirs=incs,
        extra_compile_args=["-O2", "-std=c++17", '-DGPUMEM_TORCH_SHIM_HASH=h%s' % h.hexdigest()],
        extra_link_args=ldflags,
    )
    return ext, cpp_extension.BuildExtension


def optional(build_ext_cls):
    """A build_ext that builds the shim if it can; on failure the package installs without it."""

    class OptionalBuildExt(build_ext_cls):
        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as e:  # noqa: BLE001 - an optional extension
                sys.stderr.write("gpumem: PyTorch shim not prebuilt (%s); built on first enable()\n" % e)

    return OptionalBuildExt


copy_header()
ext, torch_build_ext = shim_extension()
setup(**({"ext_modules": [ext], "cmdclass": {"build_ext": optional(torch_build_ext)}} if ext is not None else {}))
