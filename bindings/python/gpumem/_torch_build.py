"""Build and load the C++ shim that makes libgpumem PyTorch's CUDA allocator.

The shim (``gpumem/csrc/torch_shim.cpp``) is compiled against the PyTorch that
is installed, so it is built on the user's machine:

1. at ``pip install`` when PyTorch is importable in the build environment
   (``pip install --no-build-isolation``): the module ``gpumem._gpumem_torch``
   is installed with the package and used when it matches the running PyTorch
   and the shim's source;
2. otherwise on the first :func:`gpumem.torch.enable` through
   ``torch.utils.cpp_extension.load``, cached in a directory keyed by the
   PyTorch version and a hash of the shim's source and ``gpumem.h``:
   ``$GPUMEM_TORCH_BUILD_DIR``, else ``$XDG_CACHE_HOME/gpumem``, else
   ``~/.cache/gpumem``.

The shim links the libgpumem this package loaded (``gpumem.capi.library_path``)
with an rpath to its directory, so that PyTorch and the Python binding share
one library and one process-wide context. ``gpumem.h`` is looked up, in
order, in ``$GPUMEM_INCLUDE_DIR``, ``gpumem/include/`` (shipped with the
package) and ``include/`` of the source tree the package sits in.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from typing import Any, List, Optional

from . import capi

PKG_DIR = os.path.dirname(os.path.abspath(__file__))
SHIM_SOURCE = os.path.join(PKG_DIR, "csrc", "torch_shim.cpp")
MODULE_NAME = "_gpumem_torch"


class ShimBuildError(ImportError):
    """The PyTorch shim could not be built or loaded; the message names what is missing."""


def header_dirs_tried() -> List[str]:
    """Directories searched for ``gpumem.h``, in order."""
    dirs = []
    env = os.environ.get("GPUMEM_INCLUDE_DIR")
    if env:
        dirs.append(os.path.abspath(env))
    dirs.append(os.path.join(PKG_DIR, "include"))
    dirs.append(os.path.abspath(os.path.join(PKG_DIR, os.pardir, os.pardir, os.pardir, "include")))
    return dirs


def find_include_dir() -> str:
    """The directory holding ``gpumem.h``; raises :class:`ShimBuildError` listing every place tried."""
    tried = header_dirs_tried()
    for d in tried:
        if os.path.isfile(os.path.join(d, "gpumem.h")):
            return d
    raise ShimBuildError(
        "gpumem.torch: gpumem.h not found (needed to build the PyTorch shim); looked in: %s. "
        "Set GPUMEM_INCLUDE_DIR to the directory holding gpumem.h" % ", ".join(tried)
    )


def source_hash(include_dir: Optional[str] = None) -> str:
    """SHA-256 (hex) of the shim's source and the gpumem.h it is built with."""
    h = hashlib.sha256()
    with open(SHIM_SOURCE, "rb") as f:
        h.update(f.read())
    inc = include_dir or find_include_dir()
    with open(os.path.join(inc, "gpumem.h"), "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def build_root() -> str:
    """Where JIT builds are cached (see the module docstring)."""
    env = os.environ.get("GPUMEM_TORCH_BUILD_DIR")
    if env:
        return os.path.abspath(env)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "gpumem")


def _torch_base_version(torch: Any) -> str:
    return str(torch.__version__).split("+")[0]


def _prebuilt(torch: Any, digest: str) -> Optional[Any]:
    """The shim installed with the package, if it matches this PyTorch and this source."""
    try:
        from . import _gpumem_torch as mod  # type: ignore[attr-defined]  # noqa: PLC0415
    except ImportError:
        return None
    if getattr(mod, "SHIM_HASH", None) != digest:
        return None
    if str(getattr(mod, "TORCH_VERSION", "")).split("+")[0] != _torch_base_version(torch):
        return None
    return mod


def _cuda_include_and_lib(torch: Any) -> "tuple[List[str], List[str]]":
    """CUDA runtime headers and the cudart to link: the toolkit PyTorch finds, else the nvidia pip packages."""
    from torch.utils import cpp_extension  # noqa: PLC0415

    incs: List[str] = []
    ldflags: List[str] = []
    home = cpp_extension.CUDA_HOME
    if home and os.path.isfile(os.path.join(home, "include", "cuda_runtime_api.h")):
        incs.append(os.path.join(home, "include"))
        for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
            d = os.path.join(home, sub)
            if glob.glob(os.path.join(d, "libcudart.so*")):
                ldflags += ["-L" + d, "-lcudart"]
                break
        return incs, ldflags
    for site in sys.path:
        for hdr in glob.glob(os.path.join(site, "nvidia", "*", "include", "cuda_runtime_api.h")) + glob.glob(
            os.path.join(site, "nvidia", "*", "*", "include", "cuda_runtime_api.h")
        ):
            incs.append(os.path.dirname(hdr))
            # cudart itself is already loaded (with global symbols) by PyTorch; nothing to link.
            return incs, ldflags
    raise ShimBuildError(
        "gpumem.torch: CUDA runtime headers (cuda_runtime_api.h) not found, needed to build the PyTorch shim: "
        "install the CUDA toolkit (and set CUDA_HOME) or the nvidia-cuda-runtime pip package of PyTorch's CUDA"
    )


def _loaded_libstdcxx() -> Optional[str]:
    """The libstdc++ this process runs with (PyTorch's), or None where /proc tells nothing."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if line.strip() else ""
                if "libstdc++.so" in os.path.basename(path):
                    return os.path.realpath(path)
    except OSError:
        pass
    return None


def _compiler_libstdcxx(cxx: str) -> Optional[str]:
    try:
        r = subprocess.run([cxx, "-print-file-name=libstdc++.so"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    path = r.stdout.strip()
    return os.path.realpath(path) if r.returncode == 0 and os.path.isabs(path) else None


def choose_compiler() -> str:
    """The C++ compiler for the shim: $CXX, else c++, unless its libstdc++ is not the one this
    process runs with and another compiler on PATH (c++, g++, /usr/bin/g++) has that one.

    The shim throws C++ exceptions into PyTorch (out of memory, bad pointers): built against another
    libstdc++ than the process's, it compiled and loaded but crashed at the first throw (seen on an
    image whose $CXX was a newer GCC in /opt than the one PyTorch uses)."""
    first = os.environ.get("CXX", "c++")
    loaded = _loaded_libstdcxx()
    if loaded is None:
        return first
    for cxx in (first, "c++", "g++", "/usr/bin/g++"):
        if shutil.which(cxx) is not None and _compiler_libstdcxx(cxx) == loaded:
            return cxx
    return first


def _check_tools(cpp_extension: Any) -> None:
    missing = []
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None and shutil.which("g++") is None:
        missing.append("a C++17 compiler (%s or g++; set CXX)" % cxx)
    if not cpp_extension.is_ninja_available():
        missing.append("ninja (pip install ninja)")
    if missing:
        raise ShimBuildError(
            "gpumem.torch.enable() builds a small C++ shim against the installed PyTorch once, but %s "
            "%s missing. Install %s, or install gpumem with PyTorch present "
            "(pip install --no-build-isolation) so the shim is built at install time"
            % (" and ".join(missing), "is" if len(missing) == 1 else "are", " and ".join(missing))
        )


def build_flags(torch: Any, include_dir: str, digest: str) -> "tuple[List[str], List[str], List[str]]":
    """(include dirs, extra cflags, extra ldflags) for compiling and linking the shim."""
    lib = os.path.realpath(capi.library_path)
    cuda_inc, cuda_ld = _cuda_include_and_lib(torch)
    cflags = ["-O2", "-std=c++17", '-DGPUMEM_TORCH_SHIM_HASH=h%s' % digest]  # an identifier: no quotes through ninja's shell
    # c10_cuda holds the allocator the shim replaces (c10::cuda::CUDACachingAllocator::allocator)
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    ldflags = [lib, "-Wl,-rpath," + os.path.dirname(lib), "-L" + torch_lib, "-lc10_cuda", "-ltorch_cuda"] + cuda_ld
    return [include_dir] + cuda_inc, cflags, ldflags


def load_shim(torch: Any, verbose: bool = False) -> Any:
    """The shim module for the running PyTorch: prebuilt if it matches, else built (once) and cached."""
    include_dir = find_include_dir()
    digest = source_hash(include_dir)
    mod = _prebuilt(torch, digest)
    if mod is not None:
        return mod
    from torch.utils import cpp_extension  # noqa: PLC0415

    _check_tools(cpp_extension)
    incs, cflags, ldflags = build_flags(torch, include_dir, digest)
    cxx = choose_compiler()
    # the library and the compiler are part of the key: a shim built by another compiler is not reused
    lib_key = hashlib.sha256((os.path.realpath(capi.library_path) + "\0" + cxx).encode()).hexdigest()[:8]
    build_dir = os.path.join(
        build_root(), "torch-%s-%s-%s" % (str(torch.__version__).replace("+", "_"), digest[:16], lib_key)
    )
    os.makedirs(build_dir, exist_ok=True)
    saved_cxx = os.environ.get("CXX")
    os.environ["CXX"] = cxx  # cpp_extension compiles with $CXX
    try:
        return cpp_extension.load(
            name=MODULE_NAME,
            sources=[SHIM_SOURCE],
            extra_include_paths=incs,
            extra_cflags=cflags,
            extra_ldflags=ldflags,
            build_directory=build_dir,
            with_cuda=False,
            verbose=verbose,
        )
    except (RuntimeError, OSError, ImportError) as e:
        raise ShimBuildError(
            "gpumem.torch: building the PyTorch shim in %s with %s failed: %s (run with GPUMEM_TORCH_VERBOSE=1 "
            "to see the compiler's output)" % (build_dir, cxx, e)
        ) from e
    finally:
        if saved_cxx is None:
            os.environ.pop("CXX", None)
        else:
            os.environ["CXX"] = saved_cxx
