"""PyTorch plug-in: libgpumem as PyTorch's CUDA allocator, keeping PyTorch's promises.

Usage (right after ``import torch``, before any CUDA tensor is created)::

    import torch, gpumem.torch
    gpumem.torch.enable()
    x = torch.empty(1 << 20, device="cuda")        # allocated by libgpumem
    torch.cuda.memory_allocated(), torch.cuda.memory_stats()   # libgpumem's figures
    del x; torch.cuda.empty_cache()                 # cached memory back to the driver

:func:`enable` installs a small C++ shim, built against the installed PyTorch
(see :mod:`gpumem._torch_build`), that implements PyTorch's CUDA allocator
interface on libgpumem's C API: out of memory raises ``torch.OutOfMemoryError``,
``Tensor.record_stream`` holds, CUDA graphs allocate from graph-private pools,
``empty_cache`` trims, ``set_per_process_memory_fraction`` sets the device's
limit and the ``torch.cuda`` memory statistics report libgpumem's figures.
It allocates from the process-wide context (``GPUMEM_*`` environment
variables). PyTorch allows this only before its own allocator was
initialised, i.e. before CUDA is first used; later calls raise
:class:`gpumem.AllocatorInUseError`.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Optional

from . import capi
from ._core import Context, _device
from ._global import global_context
from ._torch_build import ShimBuildError, load_shim
from .errors import AllocatorInUseError, NoBackendError

__all__ = ["enable", "is_enabled", "context", "build_shim", "ShimBuildError"]

_lock = threading.Lock()
_shim: Any = None

_TOO_LATE = (
    "gpumem.torch.enable() must be called before PyTorch creates its first CUDA tensor "
    "(PyTorch's own CUDA allocator is already in use%s); call it right after 'import torch'"
)


def _import_torch() -> Any:
    try:
        import torch  # noqa: PLC0415 - lazy on purpose
    except ImportError as e:
        raise ImportError("gpumem.torch needs PyTorch: pip install torch") from e
    return torch


def _busy(detail: str) -> AllocatorInUseError:
    code = capi.STATUS["ERR_BUSY"]
    return AllocatorInUseError(code, capi.status_name(code), _TOO_LATE % detail)


def build_shim(verbose: bool = False) -> Any:
    """Build (or find in the cache) the C++ shim for the installed PyTorch and return its module.

    :func:`enable` calls it; calling it alone, e.g. in a container image's
    build step, compiles the shim ahead of time without installing it.

    Raises:
        ImportError: PyTorch is not installed.
        gpumem.torch.ShimBuildError: no C++ compiler, ninja, CUDA headers or
            ``gpumem.h`` was found, or compiling failed (the message says which).
    """
    torch = _import_torch()
    return load_shim(torch, verbose=verbose or os.environ.get("GPUMEM_TORCH_VERBOSE", "") not in ("", "0"))


def enable(device: Optional[int] = None) -> None:
    """Make libgpumem PyTorch's CUDA allocator. Idempotent.

    Args:
        device: if given, also check that the process-wide context sees this
            CUDA device (raises :class:`gpumem.InvalidDeviceError` otherwise).

    Raises:
        ImportError: PyTorch is not installed.
        gpumem.NoBackendError: PyTorch has no CUDA device.
        gpumem.torch.ShimBuildError: the shim could not be built (see :func:`build_shim`).
        gpumem.AllocatorInUseError: too late, PyTorch already initialised its own CUDA allocator.
        RuntimeError: the process-wide context does not use the CUDA backend.
    """
    global _shim
    if device is not None:
        device = _device(device)  # a wrong type or range fails before anything is installed
    torch = _import_torch()
    with _lock:
        if _shim is None:
            if not torch.cuda.is_available():
                code = capi.STATUS["ERR_NO_BACKEND"]
                raise NoBackendError(code, capi.status_name(code), "PyTorch sees no CUDA device")
            if torch.cuda.is_initialized():
                reserved = sum(torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count()))
                if reserved:
                    raise _busy(": %d bytes reserved" % reserved)
            shim = build_shim()
            try:
                shim.install()
            except RuntimeError as e:
                if "already initialized" in str(e):
                    raise _busy(": %s" % e) from e
                raise
            _shim = shim
    if device is not None:
        context().device_info(device)


def is_enabled() -> bool:
    """True once :func:`enable` succeeded in this process (and the shim is PyTorch's allocator)."""
    return _shim is not None and bool(_shim.installed())


def context() -> Context:
    """The process-wide libgpumem context PyTorch allocates from (after :func:`enable`).

    Use it for ``stats()``, ``trim()`` and ``device_info()``; PyTorch's own
    ``torch.cuda.memory_stats()`` reports the same figures. It is never
    destroyed by Python: ``close()`` on it does nothing.
    """
    return global_context()
