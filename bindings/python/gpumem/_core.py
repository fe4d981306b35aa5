"""High-level Python API: :class:`Context`, :class:`Buffer`, :class:`Scope`."""

from __future__ import annotations

import ctypes
import numbers
import operator
import sys
import threading
import warnings
import weakref
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from . import capi
from .errors import GpumemError, InvalidArgumentError, InvalidDeviceError, InvalidPointerError, NoBackendError, make_error

__all__ = ["Context", "Buffer", "Scope", "stream_handle", "ALL_DEVICES", "UNLIMITED"]

ALL_DEVICES: int = capi.ALL_DEVICES
UNLIMITED: int = capi.UNLIMITED

StreamLike = Union[None, int, Any]
OomCallback = Callable[[int, int], Any]
LogCallback = Callable[[int, str], Any]

_LOG_LEVELS = {
    "debug": capi.LOG_DEBUG,
    "info": capi.LOG_INFO,
    "warn": capi.LOG_WARN,
    "warning": capi.LOG_WARN,
    "error": capi.LOG_ERROR,
    "off": capi.LOG_OFF,
}


def _check(status: int, handle: Optional[int] = None, detail: Optional[str] = None) -> None:
    if status != 0:
        raise make_error(status, handle, detail)


def _closed_error() -> GpumemError:
    return InvalidArgumentError(
        capi.STATUS["ERR_INVALID_ARGUMENT"],
        capi.status_name(capi.STATUS["ERR_INVALID_ARGUMENT"]),
        "the context is closed",
    )


def _stream_object(stream: StreamLike, handle: Optional[int]) -> Any:
    """The object a stream handle came from (a CuPy or PyTorch stream), which a block keeps alive until
    it is freed on that stream; None for a raw handle or the default streams (never destroyed)."""
    if handle is None or handle <= 2 or isinstance(stream, (int, c_void_p)):
        return None
    return stream


def stream_handle(stream: StreamLike) -> Optional[int]:
    """Turn a stream-like object into a raw handle (None = default stream).

    Accepts None, an int (a ``cudaStream_t``/``hipStream_t`` value; 0 is the
    default stream), a ``ctypes.c_void_p``, or an object with a ``ptr``
    (CuPy ``Stream``), ``cuda_stream`` (``torch.cuda.Stream``) or ``handle``
    attribute holding such an int.
    """
    if stream is None:
        return None
    if isinstance(stream, bool):
        raise TypeError("a stream cannot be a bool")
    if isinstance(stream, int):
        if stream < 0 or stream >= (1 << 64):
            raise InvalidArgumentError(
                capi.STATUS["ERR_INVALID_ARGUMENT"],
                capi.status_name(capi.STATUS["ERR_INVALID_ARGUMENT"]),
                "stream handle %d is out of range" % stream,
            )
        return stream or None
    if isinstance(stream, c_void_p):
        return stream.value or None
    for attr in ("ptr", "cuda_stream", "handle"):
        value = getattr(stream, attr, None)
        if value is not None and not callable(value):
            return stream_handle(int(value))
    raise TypeError(
        "expected None, an int or an object with .ptr, .cuda_stream or .handle as a stream, got %r"
        % type(stream).__name__
    )


class _State:
    """What a context shares with its buffers, scopes and finalizers.

    Kept apart from :class:`Context` so that finalizers never hold the
    Context itself. ``cond`` guards ``closed``, ``active`` (C calls in
    flight) and the registries of live buffers and open scopes.
    """

    def __init__(self, handle: int, owned: bool, keep: Tuple[Any, ...] = ()) -> None:
        self.handle = handle
        self.owned = owned
        self.keep = keep  # ctypes callback objects: must outlive the C context
        self.cond = threading.Condition(threading.RLock())
        self.active = 0
        self.closed = False
        # ptr -> (finalizer, device, token): the token tells a buffer's own entry from that of a later
        # buffer at the same address (see _free_block)
        self.live: Dict[int, Tuple[weakref.finalize, int, object]] = {}
        self.scopes: Dict[int, weakref.finalize] = {}  # id -> finalizer
        # successful resets so far: a Buffer whose allocation overlapped one may hold an invalidated
        # pointer, so it is born dead (its free could hit another owner's block at that address)
        self.resets = 0

    def enter(self) -> int:
        with self.cond:
            if self.closed:
                raise _closed_error()
            self.active += 1
            return self.handle

    def leave(self) -> None:
        with self.cond:
            self.active -= 1
            if self.active == 0:
                self.cond.notify_all()


def _free_block(
    state: _State, ptr: int, stream: Optional[int], tag: Optional[bytes], token: object, stream_obj: Any = None
) -> int:
    """Finalizer body of a Buffer: free once, unless the context is closed or the buffer is dead.
    Returns the status.

    The C free runs under ``state.cond``, which :meth:`Context.reset` holds across its C reset and
    the marking of the buffers it invalidated: a free either comes before the reset (the block was
    live) or finds the buffer dead, never frees an address the reset ended (another thread's block
    by then, perhaps). The finalizer is claimed before this lock is taken (weakref.finalize), so a
    reset may mark the buffer dead in between, and another buffer may have the address by then:
    only the entry with this buffer's token is its own."""
    del tag  # kept alive until now only
    with state.cond:
        entry = state.live.get(ptr)
        # (stream_obj, the stream object the buffer was allocated with, is held by the finalizer
        # until the free below has returned: a framework destroys its stream with that object, and
        # CUDA crashes on a free naming a destroyed stream)
        if entry is None or entry[2] is not token:
            return 0  # marked dead by a reset (or born dead): its block is not its own any more
        del state.live[ptr]
        if state.closed:
            return 0
        state.active += 1
        try:
            return int(capi.lib.gpumem_free(state.handle, ptr, stream))
        finally:
            state.leave()


def _end_scope(state: _State, key: int, scope_handle: int, stream_obj: Any = None) -> int:
    """Finalizer body of a Scope: end it once, unless the context is closed (under ``state.cond``,
    as a Buffer's free, so that it never races a reset)."""
    with state.cond:
        state.scopes.pop(key, None)
        if state.closed:
            return 0
        state.active += 1
        try:
            return int(capi.lib.gpumem_scope_end(scope_handle))
        finally:
            state.leave()


def _close_state(state: _State, force: bool) -> int:
    """Destroy the C context of an owned state (at most once). Returns the status."""
    with state.cond:
        if state.closed:
            return 0
        state.closed = True  # refuse new calls; frees from finalizers become no-ops
        while state.active:
            state.cond.wait()
        if not state.owned:
            return 0
        if not force:
            status = int(capi.lib.gpumem_destroy(state.handle, 0))
            if status != 0:
                state.closed = False
                state.cond.notify_all()
            return status
        for fin in list(state.scopes.values()):
            info = fin.detach()
            if info is not None:
                capi.lib.gpumem_scope_end(info[2][2])  # (args: state, key, scope handle)
        state.scopes.clear()
        for fin, _dev, _token in list(state.live.values()):
            fin.detach()
        state.live.clear()
        return int(capi.lib.gpumem_destroy(state.handle, capi.DESTROY_FORCE))


def _finalize_context(state: _State) -> None:
    try:
        _close_state(state, True)
    except Exception:  # pragma: no cover - never raise from a finalizer
        pass


def _wrap_oom(fn: OomCallback):
    def oom(_user: Optional[int], device: int, requested: int) -> int:
        try:
            return 1 if fn(device, requested) else 0
        except BaseException:  # noqa: BLE001 - must not propagate into C
            sys.unraisablehook(_Unraisable(sys.exc_info(), "gpumem oom_callback", fn))
            return 0

    return capi.OOM_FN(oom)


def _wrap_log(fn: LogCallback):
    def log(_user: Optional[int], level: int, msg: Optional[bytes]) -> None:
        try:
            fn(level, (msg or b"").decode("utf-8", "replace"))
        except BaseException:  # noqa: BLE001 - must not propagate into C
            sys.unraisablehook(_Unraisable(sys.exc_info(), "gpumem log_callback", fn))

    return capi.LOG_FN(log)


def _no_backend_reason(cfg: "capi.Config", backend: Optional[str]) -> str:
    """Why gpumem_create found no backend: the library's log lines of a second try, and what it was built with.

    The library says why (no driver, driver too old, no device) only in its log; the
    second try, with the same configuration, collects those lines instead of printing them.
    """
    lines: List[str] = []

    def collect(_user: Optional[int], level: int, msg: Optional[bytes]) -> None:
        if level >= capi.LOG_WARN and msg:
            lines.append(msg.decode("utf-8", "replace"))

    log_c = capi.LOG_FN(collect)
    saved = (cfg.log_callback, cfg.log_level)
    cfg.log_callback, cfg.log_level = log_c, capi.LOG_WARN
    out = c_void_p()
    try:
        if capi.lib.gpumem_create(byref(cfg), byref(out)) == 0:  # usable now: not for this error
            capi.lib.gpumem_destroy(out, capi.DESTROY_FORCE)
    finally:
        cfg.log_callback, cfg.log_level = saved
    try:
        from . import _build_info  # type: ignore[attr-defined]  # written by the package build

        built = "libgpumem built with backends: %s" % ", ".join(_build_info.backends)
    except ImportError:
        built = None
    parts = ["backend %r" % (backend if backend is not None else "auto")] + lines + ([built] if built else [])
    return "; ".join(parts)


class _Unraisable:
    def __init__(self, exc_info, msg: str, obj: Any) -> None:
        self.exc_type, self.exc_value, self.exc_traceback = exc_info
        self.err_msg = "Exception ignored in " + msg
        self.object = obj


class Context:
    """A libgpumem context: one backend, one lazily created pool per device.

    Keyword names are the fields of ``gpumem_config``; ``GPUMEM_*``
    environment variables override them unless ``flags`` contains
    :data:`gpumem.capi.CONFIG_NO_ENV`.

    Args:
        backend: ``"auto"`` (None), ``"cuda"``, ``"hip"`` or ``"sim"``.
        release_threshold: cached free bytes a device pool may keep; None = unlimited.
        trim_free_fraction: give cached memory back when the device's free
            memory falls below this fraction of its total (0 disables).
        limit_bytes: hard cap on bytes reserved per device (0 = none).
        limit_fraction: hard cap as a fraction of the device's total (0 = none).
        initial_bytes: bytes preallocated on a device's first use.
        log_level: minimum level logged: an int (0 debug .. 4 off) or one of
            ``"debug" "info" "warn" "error" "off"``; None keeps the library default (warn).
        oom_callback: ``f(device, requested_bytes) -> bool`` called when a
            device is out of memory after trimming and retrying; return True
            after freeing memory to ask for one more retry. It may free
            buffers and trim, but should not allocate from this context.
        log_callback: ``f(level, message)``, called from any thread; must not
            call into this context.
        flags: ``gpumem_config.flags`` bits.
        custom_backend: a :class:`gpumem.capi.Backend` vtable (or its address
            as an int) used instead of ``backend``; copied at creation.
        share: shared GPUs: ``"user"`` (None, the default), ``"off"`` or a group name.
        share_wait_ms: how long an allocation waits for the shared group's
            members to give memory back; None keeps the default (300).
        watch_interval_ms: free-memory checks while no pool grows (0 = none);
            None keeps the default (200).
        stream_deps: True lets a stream about to grow the pool (or to move
            idle chunks) take memory other streams freed that the device has
            not reached yet, its later work ordered after theirs on the
            device; None keeps the
            default (False, or ``GPUMEM_STREAM_DEPS``).
        peak_headroom: expandable pools may create new memory up to this
            fraction (0 to 1) past the peak of live bytes before they move
            idle chunks: memory for the driver calls of those moves (0.2
            holds about what PyTorch's ``expandable_segments`` holds when
            shapes change every step); None keeps the default (0, or
            ``GPUMEM_PEAK_HEADROOM``).
        capture_probe: True (the default, or ``GPUMEM_CAPTURE_PROBE``) makes
            every allocation and free on a stream other than the default one
            ask the driver whether the stream is being captured into a CUDA
            graph, so that a capture nobody announced (CuPy's
            ``Stream.begin_capture``) gets a pool of its own; False: only
            announced captures (PyTorch's ``torch.cuda.graph`` announces
            its own) are known, and those calls save the question.

    A context is a context manager: leaving the ``with`` block closes it.
    Closing ends open scopes, marks the remaining :class:`Buffer` objects
    dead (their later :meth:`Buffer.free` does nothing) and destroys the C
    context with ``GPUMEM_DESTROY_FORCE``, which frees their memory. A
    context that is garbage collected is closed the same way.

    All methods may be called from several threads at once, except that
    :meth:`close` must not race with the use of buffers being freed.
    """

    def __init__(
        self,
        backend: Optional[str] = None,
        release_threshold: Optional[int] = None,
        trim_free_fraction: float = 0.10,
        limit_bytes: int = 0,
        limit_fraction: float = 0.0,
        initial_bytes: int = 0,
        log_level: Union[int, str, None] = None,
        oom_callback: Optional[OomCallback] = None,
        log_callback: Optional[LogCallback] = None,
        flags: int = 0,
        custom_backend: Any = None,
        share: Optional[str] = None,
        share_wait_ms: Optional[int] = None,
        watch_interval_ms: Optional[int] = None,
        expandable: Optional[Union[bool, int]] = None,
        stream_deps: Optional[Union[bool, int]] = None,
        peak_headroom: Optional[float] = None,
        capture_probe: Optional[Union[bool, int]] = None,
    ) -> None:
        cfg = capi.Config()
        capi.lib.gpumem_config_init(byref(cfg))
        cfg.flags = _uint(flags, "flags", 32)
        if backend is not None and not isinstance(backend, str):
            raise TypeError("backend must be a str or None, got %r" % type(backend).__name__)
        backend_b = None if backend is None else backend.encode("utf-8")
        cfg.backend = backend_b
        cfg.release_threshold = capi.UNLIMITED if release_threshold is None else _u64(release_threshold, "release_threshold")
        cfg.trim_free_fraction = _real(trim_free_fraction, "trim_free_fraction")
        cfg.limit_bytes = _u64(limit_bytes, "limit_bytes")
        cfg.limit_fraction = _real(limit_fraction, "limit_fraction")
        cfg.initial_bytes = _u64(initial_bytes, "initial_bytes")
        if log_level is not None:
            if isinstance(log_level, str):
                try:
                    log_level = _LOG_LEVELS[log_level.lower()]
                except KeyError:
                    raise _arg_error("unknown log level %r" % log_level) from None
            level = _int(log_level, "log_level")
            if not capi.LOG_DEBUG <= level <= capi.LOG_OFF:
                raise _arg_error("log_level %d is not a log level" % level)
            cfg.log_level = level
        if expandable is not None:
            e = int(expandable) if isinstance(expandable, bool) else _int(expandable, "expandable")
            if e not in (0, 1):
                raise _arg_error("expandable must be 0 or 1 (or a bool), got %d" % e)
            cfg.expandable = e
        if stream_deps is not None:
            d = int(stream_deps) if isinstance(stream_deps, bool) else _int(stream_deps, "stream_deps")
            if d not in (0, 1):
                raise _arg_error("stream_deps must be 0 or 1 (or a bool), got %d" % d)
            cfg.stream_deps = d
        if peak_headroom is not None:
            cfg.peak_headroom = _real(peak_headroom, "peak_headroom")
        if capture_probe is not None:
            c = int(capture_probe) if isinstance(capture_probe, bool) else _int(capture_probe, "capture_probe")
            if c not in (0, 1):
                raise _arg_error("capture_probe must be 0 or 1 (or a bool), got %d" % c)
            cfg.capture_probe = c
        if share is not None and not isinstance(share, str):
            raise TypeError("share must be a str ('user', 'off' or a group name), got %r" % type(share).__name__)
        share_b = None if share is None else share.encode("utf-8")
        cfg.share = share_b
        if share_wait_ms is not None:
            cfg.share_wait_ms = _uint(share_wait_ms, "share_wait_ms", 32)
        if watch_interval_ms is not None:
            cfg.watch_interval_ms = _uint(watch_interval_ms, "watch_interval_ms", 32)
        keep: Tuple[Any, ...] = (backend_b, share_b)
        if custom_backend is not None:
            if isinstance(custom_backend, capi.Backend):
                cfg.custom_backend = ctypes.addressof(custom_backend)
            else:
                addr = _int(custom_backend, "custom_backend")
                if not 0 < addr < (1 << 64):
                    raise _arg_error("custom_backend address %d is out of range" % addr)
                cfg.custom_backend = addr
            keep += (custom_backend,)
        if oom_callback is not None:
            if not callable(oom_callback):
                raise TypeError("oom_callback must be callable")
            oom_c = _wrap_oom(oom_callback)
            cfg.oom_callback = oom_c
            keep += (oom_c, oom_callback)
        if log_callback is not None:
            if not callable(log_callback):
                raise TypeError("log_callback must be callable")
            log_c = _wrap_log(log_callback)
            cfg.log_callback = log_c
            keep += (log_c, log_callback)
        out = c_void_p()
        status = capi.lib.gpumem_create(byref(cfg), byref(out))
        if status == NoBackendError.STATUS:
            raise make_error(status, detail=_no_backend_reason(cfg, backend))
        _check(status)
        self._init_state(_State(int(out.value), True, keep))

    @classmethod
    def _wrap(cls, handle: int, owned: bool) -> "Context":
        """Wrap an existing C context (``owned=False``: never destroyed by Python)."""
        self = cls.__new__(cls)
        self._init_state(_State(int(handle), owned))
        return self

    def _init_state(self, state: _State) -> None:
        self._state = state
        self._finalizer = weakref.finalize(self, _finalize_context, state) if state.owned else None

    # -- lifetime ------------------------------------------------------------

    def close(self, force: bool = True) -> None:
        """Destroy the context (only the first call does anything).

        With ``force`` (the default) remaining buffers and scopes are freed
        with it and a :class:`ResourceWarning` names how many there were.
        With ``force=False`` a context that still has live allocations is
        left open and :class:`gpumem.BusyError` is raised (the library logs
        a leak report). A context that Python did not create (such as
        :func:`gpumem.torch.context`) is never destroyed: closing it does nothing.
        """
        state = self._state
        if not state.owned:
            return
        with state.cond:
            n_live, n_scopes = len(state.live), len(state.scopes)
        status = _close_state(state, force)
        if status != 0:
            raise make_error(status, state.handle if not state.closed else None)
        if self._finalizer is not None:
            self._finalizer.detach()
        if force and (n_live or n_scopes):
            warnings.warn(
                "gpumem.Context closed with %d live buffer(s) and %d open scope(s); freed them" % (n_live, n_scopes),
                ResourceWarning,
                stacklevel=2,
            )

    @property
    def closed(self) -> bool:
        """True once the context was closed."""
        return self._state.closed

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._state.closed:
            return "<gpumem.Context closed>"
        return "<gpumem.Context backend=%r handle=0x%x>" % (self.backend, self._state.handle)

    @property
    def handle(self) -> int:
        """The raw ``gpumem_context *`` as an int, for the C API (:mod:`gpumem.capi`)."""
        if self._state.closed:
            raise _closed_error()
        return self._state.handle

    # -- devices -------------------------------------------------------------

    @property
    def backend(self) -> str:
        """Name of the backend in use: ``"cuda"``, ``"hip"``, ``"sim"`` or a custom one."""
        h = self._state.enter()
        try:
            return (capi.lib.gpumem_backend_name(h) or b"").decode("utf-8", "replace")
        finally:
            self._state.leave()

    @property
    def device_count(self) -> int:
        """Number of devices visible to the backend."""
        n = c_int(0)
        self._call(capi.lib.gpumem_device_count, byref(n))
        return n.value

    def device_info(self, device: int = 0) -> Dict[str, Any]:
        """Information about one visible device.

        Returns a dict with ``ordinal``, ``name``, ``uuid``, ``pci_bus_id``,
        ``total_bytes``, ``free_bytes`` and ``physical_index``.
        """
        info = capi.DeviceInfo()
        info.struct_size = ctypes.sizeof(capi.DeviceInfo)
        self._call(capi.lib.gpumem_device_get_info, _device(device), byref(info))
        return {
            "ordinal": info.ordinal,
            "name": info.name.decode("utf-8", "replace"),
            "uuid": info.uuid.decode("utf-8", "replace"),
            "pci_bus_id": info.pci_bus_id.decode("utf-8", "replace"),
            "total_bytes": info.total_bytes,
            "free_bytes": info.free_bytes,
            "physical_index": info.physical_index,
        }

    # -- allocation ----------------------------------------------------------

    def alloc(self, nbytes: int, device: int = 0, stream: StreamLike = None, tag: Optional[str] = None) -> "Buffer":
        """Allocate ``nbytes`` on ``device``, ready for work queued on ``stream``.

        Returns a :class:`Buffer` that frees the memory on ``stream`` when
        :meth:`Buffer.free` is called, when its ``with`` block ends, or when
        it is garbage collected. ``nbytes == 0`` gives a buffer with ptr 0.
        ``tag`` is shown in the library's leak reports.
        """
        nbytes = _size(nbytes)
        device = _device(device)
        s = stream_handle(stream)
        tag_b = _tag(tag)
        out = c_void_p()
        state = self._state
        h = state.enter()
        try:
            with state.cond:
                resets = state.resets
            if tag_b is None:
                status = capi.lib.gpumem_alloc(h, device, nbytes, s, byref(out))
            else:
                status = capi.lib.gpumem_alloc_tagged(h, device, nbytes, s, tag_b, byref(out))
            _check(status, h)
            ptr = out.value or 0
            return Buffer._make(self, ptr, nbytes, device, s, tag_b, resets, _stream_object(stream, s))
        finally:
            state.leave()

    def free(self, ptr: int, stream: StreamLike = None) -> None:
        """Free a raw pointer from the C API (``gpumem_free``). Buffers use :meth:`Buffer.free`.

        A pointer that a live :class:`Buffer` of this context owns is refused
        (:class:`gpumem.InvalidArgumentError`, nothing freed): the buffer would
        free it again later, possibly someone else's block by then.
        """
        p = _ptr(ptr)
        s = stream_handle(stream)
        state = self._state
        with state.cond:
            owned = p in state.live
        if owned:
            raise _arg_error("0x%x belongs to a live gpumem.Buffer: call its free()" % p)
        self._call(capi.lib.gpumem_free, p or None, s)

    def ptr_info(self, ptr: int) -> Tuple[int, int]:
        """``(requested size, device)`` of a live allocation starting at ``ptr``."""
        size, dev = c_size_t(0), c_int(0)
        self._call(capi.lib.gpumem_ptr_info, _ptr(ptr) or None, byref(size), byref(dev))
        return size.value, dev.value

    def scope(self, device: int = 0, stream: StreamLike = None) -> "Scope":
        """Begin a :class:`Scope`: everything allocated in it is freed when it ends."""
        return Scope(self, device, stream)

    # -- trimming, reset, stats ----------------------------------------------

    def trim(self, device: int = ALL_DEVICES, keep_bytes: int = 0) -> int:
        """Give cached memory back, keeping at most ``keep_bytes`` cached per device. Returns bytes released."""
        released = c_uint64(0)
        self._call(capi.lib.gpumem_trim, _device(device, True), _u64(keep_bytes, "keep_bytes"), byref(released))
        return released.value

    def release_capture_pools(self, device: int = ALL_DEVICES) -> None:
        """Give back the pools made for CUDA graph captures nobody announced (``capture_probe``):
        call it once the graphs captured that way are destroyed.

        Until then such a graph may be launched, and it writes its pool's memory (the
        temporaries freed during the capture too), so the pool stays after the capture
        ends. Its memory goes back as its blocks are freed (what is free now at once).
        A capture the library still knows of (under way, or ended with no call on its stream
        since: see :meth:`capture_ended`) keeps its pool.
        """
        self._call(capi.lib.gpumem_capture_pools_release, _device(device, True))

    def capture_ended(self, stream: StreamLike = None, device: int = 0) -> None:
        """Tell the library that a CUDA graph capture nobody announced has ended
        (``gpumem_capture_ended``), so the context leaves capture mode now instead of at the
        next allocation or free on the capture's stream.

        With a ``stream`` (alive: call it after ``end_capture`` and before the stream is
        destroyed) the library asks about that stream and forgets its capture if it ended; a
        capture still under way is kept. With ``stream=None`` you state that no such capture
        is under way on ``device`` (or :data:`ALL_DEVICES`): every one is forgotten without
        asking (for streams destroyed after their capture). The library never asks about a
        stream outside a call that passes it: a query of a destroyed stream crashes in CUDA.
        """
        s = stream_handle(stream)
        self._call(capi.lib.gpumem_capture_ended, _device(device, s is None), s)

    def reset(self, device: int = 0, reset_device: bool = False) -> None:
        """Synchronise ``device`` (or :data:`ALL_DEVICES`), invalidate its allocations, give its memory back.

        Once the reset succeeded, the :class:`Buffer` objects of this context
        on that device are dead: their later :meth:`Buffer.free` does nothing
        (the address may be another owner's by then). A :class:`Scope` on it
        frees nothing it allocated before the reset. A reset that fails
        changes nothing: the buffers stay alive. Raw pointers become invalid
        (freeing one raises :class:`gpumem.InvalidPointerError`).
        ``reset_device=True`` also resets the device for the whole process
        (cudaDeviceReset): every allocation of every library on it is
        destroyed. Dangerous; opt-in.
        """
        device = _device(device, True)
        if not isinstance(reset_device, (bool, int)):
            raise TypeError("reset_device must be a bool, got %r" % type(reset_device).__name__)
        state = self._state
        h = state.enter()
        try:
            # the buffers' frees (finalizers) take this lock: none runs between the reset and the
            # marking, so none frees an invalidated address another owner may hold by then
            with state.cond:
                status = int(capi.lib.gpumem_reset(h, device, capi.RESET_DEVICE if reset_device else 0))
                if status == 0:
                    state.resets += 1
                    for ptr, (fin, dev, _token) in list(state.live.items()):
                        if device == ALL_DEVICES or dev == device:
                            fin.detach()
                            state.live.pop(ptr, None)
            _check(status, h)
        finally:
            state.leave()

    def stats(self, device: int = ALL_DEVICES) -> Dict[str, int]:
        """Statistics of one device, or summed over all: a dict keyed by the ``gpumem_stats`` field names."""
        st = capi.Stats()
        st.struct_size = ctypes.sizeof(capi.Stats)
        self._call(capi.lib.gpumem_get_stats, _device(device, True), byref(st))
        return {name: getattr(st, name) for name in capi.STATS_FIELDS}

    def reset_peak_stats(self, device: int = ALL_DEVICES) -> None:
        """Reset ``allocated_peak`` and ``reserved_peak`` to the current values."""
        self._call(capi.lib.gpumem_reset_peak_stats, _device(device, True))

    def stats_text(self, format: str = "json", device: int = ALL_DEVICES) -> str:
        """The statistics as text (``gpumem_stats_format``): ``"json"`` (one object keyed by the
        ``gpumem_stats`` field names; for ALL_DEVICES one entry per device and their sum) or
        ``"prometheus"`` (the text exposition format, metrics ``gpumem_<field>`` labelled by backend
        and device; docs/MONITORING.md)."""
        kinds = {"json": 0, "prometheus": 1}
        if not isinstance(format, str):
            raise TypeError("format must be a str, not %s" % type(format).__name__)
        if format not in kinds:
            raise _arg_error("format=%r is not one of %s" % (format, ", ".join(sorted(kinds))))
        dev = _device(device, True)
        need = c_size_t(0)
        self._call(capi.lib.gpumem_stats_format, dev, kinds[format], None, 0, byref(need))
        while True:  # numbers may grow between the size query and the text: retry with the new size
            buf = ctypes.create_string_buffer(need.value + 256)
            try:
                self._call(capi.lib.gpumem_stats_format, dev, kinds[format], buf, len(buf), byref(need))
                return buf.value.decode("utf-8")
            except InvalidArgumentError:
                if need.value <= len(buf):
                    raise

    def set_limit(self, limit_bytes: int, device: int = 0) -> None:
        """Cap the bytes reserved on ``device`` (``gpumem_set_limit``; 0 removes the cap), the
        device's graph pools included. Memory cached above the new cap is given back now; an
        allocation that would pass it raises :class:`LimitExceededError`."""
        self._call(capi.lib.gpumem_set_limit, _device(device), _u64(limit_bytes, "limit_bytes"))

    def get_limit(self, device: int = 0) -> int:
        """The cap on bytes reserved on ``device`` (0: none), from ``limit_bytes`` /
        ``limit_fraction`` or :meth:`set_limit`."""
        out = c_uint64(0)
        self._call(capi.lib.gpumem_get_limit, _device(device), byref(out))
        return out.value

    def largest_free_block(self, device: int = 0) -> int:
        """The largest block one allocation on ``device`` can get from the cache without growing
        (with expandable segments, every cached byte)."""
        out = c_uint64(0)
        self._call(capi.lib.gpumem_largest_free_block, _device(device), byref(out))
        return out.value

    def share_members(self, device: int = 0) -> List[Dict[str, Any]]:
        """The members of the calling user's shared groups on the GPU of ``device``
        (``gpumem_share_members``; docs/SHARED-GPUS.md): one dict each, keyed by the
        ``gpumem_share_member`` field names (``command`` and ``group`` as str, ``listening`` and
        ``self`` as bool). Raises :class:`NotSupportedError` for a device that is this process's
        alone (a simulated device without ``GPUMEM_SIM_SHARED``)."""
        dev = _device(device)
        count = c_size_t(0)
        self._call(capi.lib.gpumem_share_members, dev, None, 0, byref(count))
        while True:  # members may join between the two calls
            n = count.value + 4
            arr = (capi.ShareMember * n)()
            arr[0].struct_size = ctypes.sizeof(capi.ShareMember)
            self._call(capi.lib.gpumem_share_members, dev, arr, n, byref(count))
            if count.value <= n:
                break
        out = []
        for m in arr[: count.value]:
            d: Dict[str, Any] = {}
            for name, _ in capi.ShareMember._fields_:
                if name == "struct_size":
                    continue
                v = getattr(m, name)
                if name in ("command", "group"):
                    v = v.decode("utf-8", "replace")
                elif name in ("listening", "self"):
                    v = bool(v)
                d[name] = v
            out.append(d)
        return out

    def share_reclaim(self, nbytes: int = UNLIMITED, wait_ms: int = 300, device: int = 0) -> Tuple[int, int]:
        """Ask every other member of the calling user's groups on the GPU of ``device`` to give up
        to ``nbytes`` of its cached memory back now (``gpumem_share_reclaim``, what ``gpumem-info
        --trim`` does), waiting at most ``wait_ms`` for the answers. Returns (bytes given back,
        members that answered)."""
        given = c_uint64(0)
        answered = c_size_t(0)
        self._call(capi.lib.gpumem_share_reclaim, _device(device), _u64(nbytes, "nbytes"),
                   _uint(wait_ms, "wait_ms", 32), byref(given), byref(answered))
        return given.value, answered.value

    # -- helpers -------------------------------------------------------------

    def _call(self, fn: Callable[..., int], *args: Any) -> None:
        state = self._state
        h = state.enter()
        try:
            _check(fn(h, *args), h)
        finally:
            state.leave()


class Buffer:
    """An allocation owned by Python.

    Attributes:
        ptr: device address (int; 0 for an empty buffer).
        size: requested size in bytes.
        device: device ordinal.
        stream: raw stream handle (None = default stream); it is freed on it.
        context: the owning :class:`Context` (kept alive by the buffer).

    :meth:`free` frees it; calling it again, or after the context was
    closed or reset, does nothing. A buffer that is never freed is freed
    exactly once when it is garbage collected (unless its context was
    closed first, which already freed it). It is a context manager and
    exposes ``__cuda_array_interface__`` as a 1-D ``uint8`` array.
    """

    __slots__ = ("ptr", "size", "device", "stream", "context", "_fin", "__weakref__")

    ptr: int
    size: int
    device: int
    stream: Optional[int]
    context: Context

    @classmethod
    def _make(
        cls,
        ctx: Context,
        ptr: int,
        size: int,
        device: int,
        stream: Optional[int],
        tag: Optional[bytes],
        resets: int,
        stream_obj: Any = None,
    ) -> "Buffer":
        self = cls.__new__(cls)
        self.ptr, self.size, self.device, self.stream, self.context = ptr, size, device, stream, ctx
        self._fin: Optional[weakref.finalize] = None
        if ptr:
            state = ctx._state
            token = object()
            fin = weakref.finalize(self, _free_block, state, ptr, stream, tag, token, stream_obj)
            fin.atexit = False  # the context's own finalizer frees everything at exit
            with state.cond:
                if state.resets != resets:
                    # a reset ran during the allocation (another thread): the pointer may be
                    # invalidated already, so the buffer never frees it (a live block stays cached
                    # until the next reset or close at worst)
                    fin.detach()
                else:
                    state.live[ptr] = (fin, device, token)
            self._fin = fin
        return self

    @property
    def alive(self) -> bool:
        """True while the memory is allocated and owned by this buffer."""
        return self._fin is not None and self._fin.alive

    def free(self) -> None:
        """Free the memory on the buffer's stream. Harmless if already freed or the context is closed."""
        fin = self._fin
        if fin is None:
            return
        status = fin()
        if status:
            raise make_error(status, self.context._state.handle if not self.context._state.closed else None)

    release = free

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _exit_closing(self.free, exc_type)

    def __int__(self) -> int:
        return self.ptr

    def __len__(self) -> int:
        return self.size

    def __repr__(self) -> str:
        return "<gpumem.Buffer ptr=0x%x size=%d device=%d%s>" % (
            self.ptr,
            self.size,
            self.device,
            "" if self.alive or not self.ptr else " freed",
        )

    @property
    def __cuda_array_interface__(self) -> Dict[str, Any]:
        """CUDA Array Interface (version 3): a 1-D ``uint8`` array of ``size`` bytes.

        ``stream`` is the allocation stream, so a consumer on another stream
        waits for the work queued on it (1, the legacy default stream, when
        the buffer was allocated on the default stream).
        """
        return {
            "version": 3,
            "shape": (self.size,),
            "typestr": "|u1",
            "data": (self.ptr, False),
            "strides": None,
            "descr": [("", "|u1")],
            "stream": self.stream if self.stream else 1,
        }


class Scope:
    """A region on one device and stream: everything allocated in it is freed when it ends.

    Use as a context manager (``with ctx.scope(device=0) as sc``) or call
    :meth:`end`. A scope that is never ended is ended when garbage
    collected, or when its context closes. One thread at a time may use a
    scope (a lock enforces it).
    """

    def __init__(self, ctx: Context, device: int = 0, stream: StreamLike = None) -> None:
        self.context = ctx
        self.device = _device(device)
        self.stream = stream_handle(stream)
        self._lock = threading.Lock()
        self._tag: Optional[bytes] = None
        out = c_void_p()
        state = ctx._state
        h = state.enter()
        try:
            _check(capi.lib.gpumem_scope_begin(h, self.device, self.stream, byref(out)), h)
            self._handle = int(out.value)
            key = id(self)
            # (the stream object is held until the scope's frees on it are done, as a Buffer's)
            keep = _stream_object(stream, self.stream)
            self._fin = weakref.finalize(self, _end_scope, state, key, self._handle, keep)
            self._fin.atexit = False
            with state.cond:
                state.scopes[key] = self._fin
        finally:
            state.leave()

    @property
    def active(self) -> bool:
        """True until the scope ended."""
        return self._fin.alive

    def alloc(self, nbytes: int) -> int:
        """Allocate ``nbytes`` in the scope; returns the device address (0 for 0 bytes)."""
        nbytes = _size(nbytes)
        out = c_void_p()
        state = self.context._state
        with self._lock:
            if not self._fin.alive:
                raise _arg_error("the scope has ended")
            h = state.enter()
            try:
                _check(capi.lib.gpumem_scope_alloc(self._handle, nbytes, byref(out)), h)
            finally:
                state.leave()
        return out.value or 0

    def set_tag(self, tag: Optional[str]) -> None:
        """Tag later allocations of the scope (shown in leak reports); None clears it."""
        tag_b = _tag(tag)
        state = self.context._state
        with self._lock:
            if not self._fin.alive:
                raise _arg_error("the scope has ended")
            h = state.enter()
            try:
                _check(capi.lib.gpumem_scope_set_tag(self._handle, tag_b), h)
                self._tag = tag_b  # must stay valid until the scope ends
            finally:
                state.leave()

    def end(self) -> None:
        """Free everything allocated in the scope. Harmless if already ended or the context is closed."""
        with self._lock:
            status = self._fin()
        if status:
            st = self.context._state
            raise make_error(status, st.handle if not st.closed else None)

    def __enter__(self) -> "Scope":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        _exit_closing(self.end, exc_type)


def _exit_closing(close: Any, exc_type: Any) -> None:
    """End a with-block: close; if the block raised, its own exception goes on (a failing close
    must not replace it)."""
    if exc_type is None:
        close()
        return
    try:
        close()
    except GpumemError:
        pass


def _arg_error(detail: str) -> InvalidArgumentError:
    code = capi.STATUS["ERR_INVALID_ARGUMENT"]
    return InvalidArgumentError(code, capi.status_name(code), detail)


def _size(n: Any) -> int:
    return _uint(n, "size", 64)


def _u64(n: Any, what: str) -> int:
    return _uint(n, what, 64)


def _int(v: Any, what: str) -> int:
    """An int argument: an int or an object with ``__index__`` (numpy integers), never a bool,
    float or str (TypeError)."""
    if isinstance(v, bool):
        raise TypeError("%s must be an int, not a bool" % what)
    if isinstance(v, int):
        return v
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError("%s must be an int, got %r" % (what, type(v).__name__)) from None


_C_INT_MAX = (1 << 31) - 1


def _device(v: Any, allow_all: bool = False) -> int:
    """A device ordinal that fits the C ``int`` (or ALL_DEVICES where allowed); never wrapped."""
    d = _int(v, "device")
    if allow_all and d == ALL_DEVICES:
        return d
    if not 0 <= d <= _C_INT_MAX:
        code = capi.STATUS["ERR_INVALID_DEVICE"]
        raise InvalidDeviceError(code, capi.status_name(code), "device %d is not a visible device" % d)
    return d


def _ptr(v: Any) -> int:
    """A device address: an int in [0, 2**64); out of range is no pointer of the context."""
    p = _int(v, "ptr")
    if not 0 <= p < (1 << 64):
        code = capi.STATUS["ERR_INVALID_POINTER"]
        raise InvalidPointerError(code, capi.status_name(code), "pointer %d is out of range" % p)
    return p


def _cint(v: Any, what: str) -> int:
    """An int argument that must fit the C ``int`` (never wrapped)."""
    n = _int(v, what)
    if not -(1 << 31) <= n <= _C_INT_MAX:
        raise _arg_error("%s=%d is out of range" % (what, n))
    return n


def _uint(v: Any, what: str, bits: int) -> int:
    n = _int(v, what)
    if not 0 <= n < (1 << bits):
        raise _arg_error("%s=%d is out of range" % (what, n))
    return n


def _real(v: Any, what: str) -> float:
    """A float argument: an int or float (numpy's too), not a bool or str."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise TypeError("%s must be a number, got %r" % (what, type(v).__name__))
    return float(v)


def _tag(tag: Any) -> Optional[bytes]:
    if tag is None:
        return None
    if not isinstance(tag, str):
        raise TypeError("a tag must be a str or None, got %r" % type(tag).__name__)
    return tag.encode("utf-8")
