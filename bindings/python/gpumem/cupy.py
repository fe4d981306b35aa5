"""CuPy plug-in: route CuPy's device allocations through libgpumem.

Usage::

    import cupy, gpumem.cupy
    gpumem.cupy.enable()
    a = cupy.arange(10**6)                 # allocated by libgpumem on the current device and stream
    print(gpumem.cupy.context().stats())

CuPy calls libgpumem from C (``cupy.cuda.memory.CFunctionAllocator`` over
``gpumem_cupy_malloc``/``gpumem_cupy_free``): each allocation is made on CuPy's
current device and current stream through the process-wide context, at the
cost of an allocation from CuPy's own ``MemoryPool``, and when CuPy drops the
memory it is freed on the stream it was allocated on. Out of memory (and a request past
the configured limit) raises :class:`OutOfMemoryError` of this module, a
subclass of both ``cupy.cuda.memory.OutOfMemoryError`` and
:class:`gpumem.OutOfMemoryError`, so code written for either keeps working.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Callable, Optional

from . import capi, errors
from ._core import Context
from ._global import global_context

__all__ = [
    "enable", "disable", "is_enabled", "context", "allocator", "c_allocator_available", "release_streams",
    "out_of_memory_error",
]

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


def _raise_for(ctx: Context) -> Callable[[int, int, int], None]:
    """The on_error of the C allocator: raises what a failed allocation of ``size`` on ``device`` means."""

    def on_error(size: int, device: int, status: int) -> None:
        err = errors.make_error(status, None if ctx.closed else ctx.handle)
        if isinstance(err, (errors.OutOfMemoryError, errors.LimitExceededError)):
            try:
                total = ctx.stats(device)["allocated_bytes"]
            except errors.GpumemError:
                total = 0
            raise out_of_memory_error()(size, total, err.status, err.name, err.message)
        raise err

    return on_error


def _stream_function() -> Optional[int]:
    """Address of CuPy's C function ``intptr_t get_stream_ptr(int device)`` (its current stream of a device).

    It is ``cupy_backends.cuda.stream.get_stream_ptr``, exported to other Cython modules through
    the module's ``__pyx_capi__``; None where this CuPy does not export it.
    """
    try:
        from cupy_backends.cuda import stream as backends_stream  # noqa: PLC0415
    except ImportError:
        return None
    capsule = getattr(backends_stream, "__pyx_capi__", {}).get("get_stream_ptr")
    if capsule is None:
        return None
    # prototypes of our own: ctypes.pythonapi's function objects are shared by the whole process
    get_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
    get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
        ("PyCapsule_GetPointer", ctypes.pythonapi))
    name = get_name(capsule)
    # the signature Cython wrote into the capsule: the library passes one int and reads an intptr_t
    if name is None or not name.replace(b" ", b"").startswith(b"intptr_t(int)"):
        return None
    return get_pointer(capsule, name) or None


def _has(name: str) -> bool:
    """The library exports ``name`` (capi gave it its prototype; an older library may lack it)."""
    return getattr(getattr(capi.lib, name, None), "argtypes", None) is not None


def _stream_owner(device: int, ptr: int) -> Any:
    """The CuPy Stream object of ``ptr``, CuPy's current stream of ``device`` (the library holds it
    while memory allocated on that stream lives: CuPy destroys a Stream with its object, and a free
    naming a destroyed stream may crash in CUDA); None where it is not that stream."""
    cupy = _import_cupy()
    if cupy.cuda.runtime.getDevice() == device:  # (CuPy allocates on its current device)
        stream = cupy.cuda.get_current_stream()
    else:
        with cupy.cuda.Device(device):
            stream = cupy.cuda.get_current_stream()
    return stream if stream.ptr == ptr else None


def _param_block() -> Any:
    """A ``gpumem_cupy_allocator`` with this interpreter's call and decref, holding streams through
    :func:`_stream_owner` (the module's function: it outlives every block)."""
    p = capi.CupyAllocator()
    p.struct_size = ctypes.sizeof(capi.CupyAllocator)
    p.py_call = ctypes.cast(ctypes.pythonapi.PyObject_CallFunction, ctypes.c_void_p).value
    p.py_decref = ctypes.cast(ctypes.pythonapi.Py_DecRef, ctypes.c_void_p).value
    p.on_stream = id(_stream_owner)
    return p


class _CAllocator:
    """Keeps alive what CuPy's CFunctionAllocator points to: the parameter block, the context, on_error,
    on_stream."""

    def __init__(self, ctx: Context, stream_fn: int) -> None:
        self.ctx = ctx
        self.on_error = _raise_for(ctx)
        self.on_stream = _stream_owner
        p = _param_block()
        p.ctx = ctx.handle
        p.stream_of = stream_fn
        p.on_error = id(self.on_error)  # a borrowed reference: self keeps the function alive
        p.on_stream = id(self.on_stream)
        self.param = p


def c_allocator_available() -> bool:
    """True when :func:`allocator` gives CuPy the C entry points (the fast path) rather than Python code.

    That needs a libgpumem with ``gpumem_cupy_malloc`` and a CuPy exporting
    ``cupy_backends.cuda.stream.get_stream_ptr`` (CuPy's current stream, read from C).
    """
    _import_cupy()
    return _has("gpumem_cupy_malloc") and _stream_function() is not None


def allocator(ctx: Optional[Context] = None) -> Callable[[int], Any]:
    """Return a CuPy allocator function ``f(nbytes) -> cupy.cuda.MemoryPointer`` on ``ctx``.

    ``ctx`` defaults to the process-wide context. For it, the function is the ``malloc`` of a
    ``cupy.cuda.memory.CFunctionAllocator`` over ``gpumem_cupy_malloc``/``gpumem_cupy_free``:
    CuPy calls libgpumem from C, with its current device, and libgpumem reads CuPy's
    current stream of that device from C, so an allocation costs what one through
    CuPy's own ``MemoryPool`` costs. The memory is freed on the stream it was allocated
    for. For a context of your own, and where the C path is not available
    (:func:`c_allocator_available`), the function is Python code doing the same,
    slower: each block is a :class:`gpumem.Buffer`, so closing that context
    while CuPy holds its memory stays safe. The C path's function has the attribute
    ``c_allocator`` (the ``CFunctionAllocator``); the Python one has none.
    """
    cupy = _import_cupy()
    ctx = ctx or global_context()
    stream_fn = _stream_function()
    # Only a context Python never destroys (the process-wide one) is handed to C: a context of
    # your own may be closed while CuPy still holds memory, and its Buffers are what keeps that safe.
    if (stream_fn is not None and not ctx._state.owned
            and _has("gpumem_cupy_malloc")):
        owner = _CAllocator(ctx, stream_fn)
        c_alloc = cupy.cuda.memory.CFunctionAllocator(
            ctypes.addressof(owner.param),
            ctypes.cast(capi.lib.gpumem_cupy_malloc, ctypes.c_void_p).value,
            ctypes.cast(capi.lib.gpumem_cupy_free, ctypes.c_void_p).value,
            owner,
        )
        return _raising_malloc(c_alloc.malloc)
    return _python_allocator(cupy, ctx)


def _raising_malloc(c_malloc: Callable[[int], Any]) -> Callable[[int], Any]:
    """CuPy's CFunctionAllocator does not look for an exception raised inside the C function:
    it surfaces as a SystemError whose cause is ours. Re-raised as itself (a subclass of CuPy's
    OutOfMemoryError and of gpumem's), it is what CuPy code catches; one Python call per
    allocation is the cost."""

    def gpumem_cupy_malloc(nbytes: int) -> Any:
        try:
            return c_malloc(nbytes)
        except SystemError as e:
            if isinstance(e.__cause__, errors.GpumemError):
                raise e.__cause__ from None
            raise

    gpumem_cupy_malloc.c_allocator = c_malloc.__self__  # the CFunctionAllocator: which path serves CuPy
    return gpumem_cupy_malloc


def _python_allocator(cupy: Any, ctx: Context) -> Callable[[int], Any]:
    """The allocator in Python: a :class:`gpumem.Buffer` wrapped in ``cupy.cuda.UnownedMemory``."""

    def gpumem_cupy_alloc(nbytes: int) -> Any:
        device = cupy.cuda.runtime.getDevice()
        try:
            # given the Stream object, the Buffer keeps it until its free on that stream (CuPy destroys
            # the stream with the object; the default streams, never destroyed, are not kept)
            buf = ctx.alloc(nbytes, device=device, stream=cupy.cuda.get_current_stream())
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
    release_streams()


_release = None  # (the function called holding the GIL, its parameter block)


def release_streams() -> int:
    """Let go of the CuPy ``Stream`` objects the C path holds with no memory allocated on them left,
    so that the CUDA streams of Streams you dropped are destroyed now; returns how many.

    The library holds a Stream while memory allocated on it lives (CuPy destroys the CUDA stream
    with the object, and a free naming a destroyed stream may crash). After the last free on it the
    hold is kept (parked) so that the next allocation on that stream calls no Python code: up to 8
    such streams in the process, the oldest let go first. :func:`disable` calls this.
    """
    global _release
    if _release is None:
        if not _has("gpumem_cupy_release_streams"):
            return 0  # a library without it holds no streams past their memory
        # through PyDLL: it lets go of Python objects, so the GIL stays held during the call
        fn = ctypes.PyDLL(capi.library_path).gpumem_cupy_release_streams
        fn.restype, fn.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        _release = (fn, _param_block())  # (its on_stream is not called: only its decref)
    fn, p = _release
    n = ctypes.c_size_t(0)
    st = fn(ctypes.addressof(p), ctypes.byref(n))
    if st != 0:
        raise errors.make_error(st)
    return n.value


def is_enabled() -> bool:
    """True while libgpumem is CuPy's allocator (through :func:`enable`)."""
    return _enabled


def context() -> Context:
    """The process-wide context CuPy allocates from (``stats()``, ``trim()``)."""
    return global_context()
