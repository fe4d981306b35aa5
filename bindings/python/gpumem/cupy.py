"""CuPy plug-in: route CuPy's device allocations through libgpumem.

Usage::

    import cupy, gpumem.cupy
    gpumem.cupy.enable()
    a = cupy.arange(10**6)                 # allocated by libgpumem on the current device and stream
    print(gpumem.cupy.context().stats())

Each allocation is made on CuPy's current device and current stream through
the process-wide context and wrapped in ``cupy.cuda.UnownedMemory`` whose
owner is a :class:`gpumem.Buffer`: when CuPy drops the memory, the buffer is
freed on the stream it was allocated on. Out of memory (and a request past
the configured limit) raises :class:`OutOfMemoryError` of this module, a
subclass of both ``cupy.cuda.memory.OutOfMemoryError`` and
:class:`gpumem.OutOfMemoryError`, so code written for either keeps working.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Optional

from . import errors
from ._core import Context
from ._global import global_context

__all__ = ["enable", "disable", "is_enabled", "context", "allocator", "out_of_memory_error"]

_lock = threading.Lock()
_previous: Optional[Callable[[int], Any]] = None
_enabled = False


def _import_cupy() -> Any:
    try:
        import cupy  # noqa: PLC0415 - lazy on purpose
    except ImportError as e:
        raise ImportError("gpumem.cupy needs CuPy: pip install cupy-cuda12x (or the package for your CUDA)") from e
    return cupy


_oom_lock = threading.Lock()
_oom_class: Any = None


def out_of_memory_error() -> type:
    """The exception class raised when an allocation fails for lack of memory (created on first use).

    It derives from ``cupy.cuda.memory.OutOfMemoryError`` and from
    :class:`gpumem.OutOfMemoryError`; ``status``, ``name`` and ``message``
    are those of the libgpumem error (``GPUMEM_ERR_OUT_OF_MEMORY`` or
    ``GPUMEM_ERR_LIMIT_EXCEEDED``).
    """
    global _oom_class
    cupy = _import_cupy()
    with _oom_lock:
        if _oom_class is None:
            base = cupy.cuda.memory.OutOfMemoryError

            class OutOfMemoryError(base, errors.OutOfMemoryError):  # type: ignore[misc,valid-type]
                """Out of device memory in gpumem.cupy's allocator (CuPy's and gpumem's exception at once)."""

                def __init__(self, size: int, total: int, status: int, name: str, message: str) -> None:
                    # Neither base __init__ is called: each expects its own arguments of the other.
                    text = "Out of memory allocating {:,} bytes (allocated so far: {:,} bytes). {}: {}".format(
                        size, total, name, message
                    )
                    MemoryError.__init__(self, text)
                    self.size, self.total = size, total
                    self.status, self.name, self.message = int(status), name, message
                    self.backend_code, self.backend_message = 0, None

                def __str__(self) -> str:
                    return str(self.args[0])

                def __reduce__(self):  # type: ignore[override]
                    return (type(self), (self.size, self.total, self.status, self.name, self.message))

            OutOfMemoryError.__module__ = __name__
            OutOfMemoryError.__qualname__ = "OutOfMemoryError"  # gpumem.cupy.OutOfMemoryError (module __getattr__)
            _oom_class = OutOfMemoryError
    return _oom_class


def __getattr__(name: str) -> Any:
    # gpumem.cupy.OutOfMemoryError exists once CuPy is importable; creating it imports CuPy.
    if name == "OutOfMemoryError":
        return out_of_memory_error()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def allocator(ctx: Optional[Context] = None) -> Callable[[int], Any]:
    """Return a CuPy allocator function ``f(nbytes) -> cupy.cuda.MemoryPointer`` on ``ctx``.

    ``ctx`` defaults to the process-wide context.
    """
    cupy = _import_cupy()
    ctx = ctx or global_context()

    def gpumem_cupy_alloc(nbytes: int) -> Any:
        device = cupy.cuda.runtime.getDevice()
        stream = cupy.cuda.get_current_stream().ptr
        try:
            buf = ctx.alloc(nbytes, device=device, stream=stream)
        except (errors.OutOfMemoryError, errors.LimitExceededError) as e:
            try:
                total = ctx.stats(device)["allocated_bytes"]
            except errors.GpumemError:
                total = 0
            raise out_of_memory_error()(nbytes, total, e.status, e.name, e.message) from e
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
