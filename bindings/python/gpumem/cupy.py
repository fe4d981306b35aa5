"""CuPy plug-in: route CuPy's device allocations through libgpumem.

Usage::

    import cupy, gpumem.cupy
    gpumem.cupy.enable()
    a = cupy.arange(10**6)                 # allocated by libgpumem on the current device and stream
    print(gpumem.cupy.context().stats())

Each allocation is made on CuPy's current device and current stream through
the process-wide context and wrapped in ``cupy.cuda.UnownedMemory`` whose
owner is a :class:`gpumem.Buffer`: when CuPy drops the memory, the buffer is
freed on the stream it was allocated on.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from ._core import Context
from ._global import global_context

__all__ = ["enable", "disable", "is_enabled", "context", "allocator"]

_lock = threading.Lock()
_previous: Optional[Callable[[int], Any]] = None
_enabled = False


def _import_cupy() -> Any:
    try:
        import cupy  # noqa: PLC0415 - lazy on purpose
    except ImportError as e:
        raise ImportError("gpumem.cupy needs CuPy: pip install cupy-cuda12x (or the package for your CUDA)") from e
    return cupy


def allocator(ctx: Optional[Context] = None) -> Callable[[int], Any]:
    """Return a CuPy allocator function ``f(nbytes) -> cupy.cuda.MemoryPointer`` on ``ctx``.

    ``ctx`` defaults to the process-wide context.
    """
    cupy = _import_cupy()
    ctx = ctx or global_context()

    def gpumem_cupy_alloc(nbytes: int) -> Any:
        device = cupy.cuda.runtime.getDevice()
        stream = cupy.cuda.get_current_stream().ptr
        buf = ctx.alloc(nbytes, device=device, stream=stream)
        mem = cupy.cuda.UnownedMemory(buf.ptr, nbytes, buf, device)
        return cupy.cuda.MemoryPointer(mem, 0)

    return gpumem_cupy_alloc


def enable() -> None:
    """Install libgpumem as CuPy's allocator (``cupy.cuda.set_allocator``). Idempotent.

    Raises ImportError when CuPy is not installed.
    """
    global _previous, _enabled
    cupy = _import_cupy()
    with _lock:
        if _enabled:
            return
        _previous = cupy.cuda.get_allocator()
        cupy.cuda.set_allocator(allocator())
        _enabled = True


def disable() -> None:
    """Restore the allocator CuPy had before :func:`enable`. Memory already allocated stays valid."""
    global _previous, _enabled
    cupy = _import_cupy()
    with _lock:
        if not _enabled:
            return
        cupy.cuda.set_allocator(_previous)
        _previous, _enabled = None, False


def is_enabled() -> bool:
    """True while libgpumem is CuPy's allocator (through :func:`enable`)."""
    return _enabled


def context() -> Context:
    """The process-wide context CuPy allocates from (``stats()``, ``trim()``)."""
    return global_context()
