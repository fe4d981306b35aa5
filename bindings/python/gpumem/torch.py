"""PyTorch plug-in: route PyTorch's CUDA allocations through libgpumem.

Usage (before any CUDA tensor is created)::

    import gpumem.torch
    gpumem.torch.enable()
    x = torch.empty(1 << 20, device="cuda")        # allocated by libgpumem
    print(gpumem.torch.context().stats())
    del x; gpumem.torch.context().trim()            # give cached memory back to the driver

It installs ``torch.cuda.memory.CUDAPluggableAllocator`` with the library's
``gpumem_torch_alloc``/``gpumem_torch_free`` entry points, which use the
process-wide context (configured by the ``GPUMEM_*`` environment variables).
PyTorch allows this only before its own caching allocator was initialised,
i.e. before the first CUDA allocation; later calls raise
:class:`gpumem.AllocatorInUseError`.
"""

from __future__ import annotations

import threading
from typing import Any, Optional

from . import capi
from ._core import Context
from ._global import global_context
from .errors import AllocatorInUseError, NoBackendError

__all__ = ["enable", "is_enabled", "context"]

_lock = threading.Lock()
_allocator: Any = None

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


def enable(device: Optional[int] = None) -> None:
    """Make libgpumem PyTorch's CUDA allocator. Idempotent.

    Args:
        device: if given, also check that the process-wide context sees this
            CUDA device (raises :class:`gpumem.InvalidDeviceError` otherwise).

    Raises:
        ImportError: PyTorch is not installed.
        gpumem.NoBackendError: PyTorch has no CUDA device.
        gpumem.AllocatorInUseError: too late, PyTorch already allocated CUDA memory.
    """
    global _allocator
    torch = _import_torch()
    with _lock:
        if _allocator is None:
            if not torch.cuda.is_available():
                code = capi.STATUS["ERR_NO_BACKEND"]
                raise NoBackendError(code, capi.status_name(code), "PyTorch sees no CUDA device")
            if torch.cuda.is_initialized():
                reserved = sum(torch.cuda.memory_reserved(i) for i in range(torch.cuda.device_count()))
                if reserved:
                    raise _busy(": %d bytes reserved" % reserved)
            alloc = torch.cuda.memory.CUDAPluggableAllocator(
                capi.library_path, "gpumem_torch_alloc", "gpumem_torch_free"
            )
            try:
                torch.cuda.memory.change_current_allocator(alloc)
            except RuntimeError as e:
                raise _busy(": %s" % e) from e
            _allocator = alloc
    if device is not None:
        context().device_info(int(device))


def is_enabled() -> bool:
    """True once :func:`enable` succeeded in this process."""
    return _allocator is not None


def context() -> Context:
    """The process-wide libgpumem context PyTorch allocates from (after :func:`enable`).

    Use it for ``stats()``, ``trim()`` and ``device_info()``. It is never
    destroyed by Python: ``close()`` on it does nothing.
    """
    return global_context()
