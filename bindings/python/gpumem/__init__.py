"""libgpumem for Python: a caching, stream-ordered GPU memory manager (ctypes binding).

Quick start::

    import gpumem
    with gpumem.Context(backend="sim") as ctx:
        with ctx.alloc(1 << 20) as buf:
            print(hex(buf.ptr), buf.size, buf.device)
        print(ctx.stats())

Framework plug-ins: :func:`gpumem.torch.enable` and :func:`gpumem.cupy.enable`
(imported on demand: ``import gpumem.torch``). The shared library is found
through ``GPUMEM_LIBRARY``, then beside this package, then the system's
search path (see :mod:`gpumem.capi`).
"""

from __future__ import annotations

from . import capi
from ._core import ALL_DEVICES, UNLIMITED, Buffer, Context, Scope, stream_handle
from .capi import LibraryNotFoundError
from .errors import (
    AllocatorInUseError,
    BackendError,
    BusyError,
    GpumemError,
    InternalError,
    InvalidArgumentError,
    InvalidDeviceError,
    InvalidPointerError,
    LimitExceededError,
    NoBackendError,
    NotSupportedError,
    OutOfMemoryError,
)

from . import sim  # noqa: E402  (sim controls, for tests)


def _read_version() -> str:
    # An installed package has _version.py, written by CMake from the repository's
    # VERSION file; run from the source tree, the package reads that file itself.
    try:
        from ._version import __version__ as v  # type: ignore[import-not-found]

        return str(v)
    except ImportError:
        pass
    import os

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir, "VERSION")
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return "0+unknown"


__version__ = _read_version()

#: gpumem_log_level values
LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF = (
    capi.LOG_DEBUG,
    capi.LOG_INFO,
    capi.LOG_WARN,
    capi.LOG_ERROR,
    capi.LOG_OFF,
)
#: Context(flags=...) bit: ignore GPUMEM_* environment variables
CONFIG_NO_ENV = capi.CONFIG_NO_ENV


def global_context() -> Context:
    """The process-wide context that the PyTorch and CuPy plug-ins allocate from.

    Created on first use from the environment (``GPUMEM_*``); Python never
    destroys it (closing the returned object does nothing).
    """
    from ._global import global_context as _g

    return _g()


__all__ = [
    "__version__",
    "Context",
    "Buffer",
    "Scope",
    "ALL_DEVICES",
    "UNLIMITED",
    "CONFIG_NO_ENV",
    "LOG_DEBUG",
    "LOG_INFO",
    "LOG_WARN",
    "LOG_ERROR",
    "LOG_OFF",
    "global_context",
    "stream_handle",
    "GpumemError",
    "InvalidArgumentError",
    "InvalidDeviceError",
    "InvalidPointerError",
    "OutOfMemoryError",
    "LimitExceededError",
    "BusyError",
    "NoBackendError",
    "BackendError",
    "NotSupportedError",
    "InternalError",
    "AllocatorInUseError",
    "LibraryNotFoundError",
    "capi",
    "sim",
]
