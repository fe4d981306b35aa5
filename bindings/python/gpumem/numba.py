"""Numba plug-in: libgpumem as Numba's CUDA memory manager (an EMM plug-in, NBEP 7).

Usage, either before Numba creates its first CUDA context::

    NUMBA_CUDA_MEMORY_MANAGER=gpumem.numba python app.py

or in code::

    import gpumem.numba
    gpumem.numba.enable()          # numba.cuda.set_memory_manager(gpumem.numba.GpumemNumbaManager)
    from numba import cuda
    d = cuda.device_array(1 << 20)  # allocated by libgpumem

Device memory (``cuda.device_array``, ``to_device``, the arrays of kernels'
arguments) comes from libgpumem's process-wide context, the one the PyTorch
and CuPy plug-ins use, on the context's device, for the default stream (the
EMM interface names no stream: Numba's own allocator works the same way).
Host memory (``pinned_array``, ``mapped_array``) stays Numba's own
(``HostOnlyCUDAMemoryManager``).

What each part of the EMM interface does here:

- ``memalloc``: ``gpumem_alloc``; the finalizer frees the block into
  libgpumem's cache at once (no device synchronisation). Out of memory raises
  :class:`gpumem.OutOfMemoryError` (a ``MemoryError``), past a limit
  :class:`gpumem.LimitExceededError`.
- ``get_memory_info``: ``MemoryInfo(free, total)`` of the device, where
  ``free`` is the driver's free memory plus what libgpumem holds cached on the
  device (memory an allocation gets without asking the driver).
- ``get_ipc_handle``: a CUDA IPC handle of the segment holding the block, with
  the block's offset in it. CUDA gives IPC handles only for ``cudaMalloc``
  memory: a block in one of libgpumem's expandable segments (virtual memory
  mapped on demand, the default) raises :class:`gpumem.NotSupportedError`
  saying so; run with ``GPUMEM_EXPANDABLE=0`` to share memory between processes.
- ``reset``: gives the cached memory of the device back to the driver
  (``gpumem_trim``); live blocks stay valid (other frameworks may share the
  context) and Numba's host allocations are released as Numba's own manager
  does.
- ``defer_cleanup``: frees always go to libgpumem's cache at once, which costs
  no synchronisation; while a ``defer_cleanup`` block is active, ``reset`` does
  not trim (the trim happens when the outermost block ends), and host-side
  cleanup is deferred as in Numba's manager. libgpumem's own policy
  (``release_threshold``, ``trim_free_fraction``, trimming on out of memory)
  applies throughout.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from ctypes import byref, c_void_p
from typing import Any

from . import capi, errors
from ._global import global_context

__all__ = ["enable", "GpumemNumbaManager", "context"]


def _import_numba_cuda() -> Any:
    try:
        from numba import cuda  # noqa: PLC0415 - lazy on purpose
    except ImportError as e:
        raise ImportError("gpumem.numba needs Numba's CUDA target: pip install numba-cuda") from e
    return cuda


def context():
    """The process-wide context Numba allocates from (``stats()``, ``trim()``)."""
    return global_context()


def _device_pointer(driver: Any, addr: int) -> Any:
    # Numba with NVIDIA's binding (numba-cuda's only one now) takes a CUdeviceptr; with its
    # older ctypes binding, a c_void_p.
    binding = getattr(driver, "binding", None)
    if getattr(driver, "USE_NV_BINDING", True) and binding is not None:
        return binding.CUdeviceptr(addr)
    try:  # the ctypes binding's own device pointer type (c_size_t): its driver calls take no c_void_p
        from numba.cuda.cudadrv import drvapi  # noqa: PLC0415

        return drvapi.cu_device_ptr(addr)
    except (ImportError, AttributeError):
        return c_void_p(addr)


def _pointer_value(ptr: Any) -> int:
    """The address held by a device pointer of either binding."""
    value = getattr(ptr, "value", ptr)
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return int(ptr)


def _make_manager_class() -> type:
    cuda = _import_numba_cuda()
    from numba.cuda.cudadrv import driver  # noqa: PLC0415

    class GpumemNumbaManager(cuda.GetIpcHandleMixin, cuda.HostOnlyCUDAMemoryManager):
        """Numba EMM plug-in over libgpumem's process-wide context (see :mod:`gpumem.numba`)."""

        #: where the memory comes from, and the backends Numba can use it with (a subclass may
        #: change them, e.g. the tests run the plug-in's logic on a sim context)
        context_factory = staticmethod(global_context)
        backends = ("cuda",)

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._ctx = None
            self._defer_depth = 0
            self._trim_pending = False
            self._lock = threading.Lock()

        @property
        def _device(self) -> int:
            return int(self.context.device.id)

        def initialize(self) -> None:
            """Get the process-wide context and check that it drives CUDA devices (may be called again)."""
            if self._ctx is not None:
                return
            ctx = type(self).context_factory()
            if ctx.backend not in self.backends:
                raise errors.NoBackendError(
                    errors.NoBackendError.STATUS, "GPUMEM_ERR_NO_BACKEND",
                    "gpumem.numba: libgpumem's process-wide context uses the %r backend, Numba needs 'cuda' "
                    "(set GPUMEM_BACKEND=cuda, or unset it)" % ctx.backend)
            if self._device >= ctx.device_count:
                raise errors.InvalidDeviceError(
                    errors.InvalidDeviceError.STATUS, "GPUMEM_ERR_INVALID_DEVICE",
                    "gpumem.numba: Numba's device %d is not among libgpumem's %d" % (self._device, ctx.device_count))
            self._ctx = ctx

        def memalloc(self, size: int) -> Any:
            """``size`` bytes on this context's device, for the default stream."""
            self.initialize()
            size = int(size)
            ctx_ref = weakref_proxy(self.context)
            if size == 0:
                return cuda.MemoryPointer(ctx_ref, _device_pointer(driver, 0), 0)
            handle = self._ctx.handle
            out = c_void_p()
            status = capi.lib.gpumem_alloc(handle, self._device, size, None, byref(out))
            if status:
                raise errors.make_error(status, handle, "gpumem.numba: allocating %d bytes on device %d"
                                        % (size, self._device))
            addr = int(out.value)
            free = capi.lib.gpumem_free

            def finalizer() -> None:
                free(handle, c_void_p(addr), None)

            return cuda.MemoryPointer(ctx_ref, _device_pointer(driver, addr), size, finalizer=finalizer)

        def get_memory_info(self) -> Any:
            """``MemoryInfo(free, total)``: the driver's free memory plus libgpumem's cache on the device."""
            self.initialize()
            info = self._ctx.device_info(self._device)
            cached = self._ctx.stats(self._device)["cached_bytes"]
            return cuda.MemoryInfo(free=int(info["free_bytes"]) + int(cached), total=int(info["total_bytes"]))

        def get_ipc_handle(self, memory: Any) -> Any:
            """A CUDA IPC handle of the block's segment; NotSupportedError for expandable segments."""
            try:
                return super().get_ipc_handle(memory)
            except Exception as e:  # noqa: BLE001 - the driver's refusal, turned into a clear error
                raise errors.NotSupportedError(
                    errors.NotSupportedError.STATUS, "GPUMEM_ERR_NOT_SUPPORTED",
                    "gpumem.numba: no CUDA IPC handle for the block at 0x%x (%s): CUDA gives IPC handles only "
                    "for cudaMalloc memory, and libgpumem's expandable segments (the default) are virtual "
                    "memory; run with GPUMEM_EXPANDABLE=0 to share libgpumem memory between processes"
                    % (_pointer_value(memory.handle), e)) from e

        def reset(self) -> None:
            """Give the device's cached memory back (deferred inside ``defer_cleanup``); host memory as Numba's."""
            super().reset()
            if self._ctx is None:  # reset may come before initialize
                return
            with self._lock:
                if self._defer_depth > 0:
                    self._trim_pending = True
                    return
            self._ctx.trim(self._device)

        @contextlib.contextmanager
        def defer_cleanup(self) -> Any:
            """Hold back the trims of ``reset`` (and Numba's host-side cleanup) until the outermost block ends."""
            with super().defer_cleanup():
                with self._lock:
                    self._defer_depth += 1
                try:
                    yield
                finally:
                    with self._lock:
                        self._defer_depth -= 1
                        trim = self._defer_depth == 0 and self._trim_pending
                        if trim:
                            self._trim_pending = False
                    if trim and self._ctx is not None:
                        self._ctx.trim(self._device)

        @property
        def interface_version(self) -> int:
            return 1

    GpumemNumbaManager.__module__ = __name__
    return GpumemNumbaManager


def weakref_proxy(obj: Any) -> Any:
    import weakref  # noqa: PLC0415

    try:
        return weakref.proxy(obj)
    except TypeError:  # already a proxy
        return obj


_class_lock = threading.Lock()
_manager_class: Any = None


def _manager() -> type:
    global _manager_class
    with _class_lock:
        if _manager_class is None:
            _manager_class = _make_manager_class()
    return _manager_class


def __getattr__(name: str) -> Any:
    # Numba reads _numba_memory_manager from the module NUMBA_CUDA_MEMORY_MANAGER names; the
    # class exists once Numba is importable, so that 'import gpumem.numba' works without it.
    if name in ("_numba_memory_manager", "GpumemNumbaManager"):
        return _manager()
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def enable() -> None:
    """``numba.cuda.set_memory_manager(GpumemNumbaManager)``: before Numba creates its first context.

    Contexts made earlier keep Numba's own manager (``numba.cuda.close()`` drops them).
    Raises ImportError when Numba's CUDA target is not installed.
    """
    cuda = _import_numba_cuda()
    cuda.set_memory_manager(_manager())
