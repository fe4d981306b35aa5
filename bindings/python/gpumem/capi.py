"""Low-level ctypes view of ``libgpumem``: library loading, structs, prototypes.

This module mirrors ``include/gpumem.h`` and ``include/gpumem/sim.h`` one to
one. Most users want the high-level :class:`gpumem.Context` instead; this
module is public for interoperability (for example passing a context handle
to other code) and for tests that need to call the C API directly.

The shared library is located, in order, through:

1. the environment variable ``GPUMEM_LIBRARY`` (a path to the ``.so``);
2. a ``libgpumem.so*`` file beside this package (``gpumem/libgpumem.so*``);
3. the system search path: ``ctypes.util.find_library("gpumem")``, then
   ``libgpumem.so.0`` and ``libgpumem.so``.

If none loads, :class:`LibraryNotFoundError` (an :class:`ImportError`) is
raised when the package is imported, listing every path tried and why it
failed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import warnings
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_int,
    c_size_t,
    c_uint,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import List, Optional, Tuple

__all__ = [
    "LibraryNotFoundError",
    "lib",
    "library_path",
    "tried_paths",
    "Config",
    "DeviceInfo",
    "Stats",
    "ShareMember",
    "Buffer",
    "Backend",
    "CupyAllocator",
    "builtin_backend",
    "OOM_FN",
    "LOG_FN",
    "ALL_DEVICES",
    "UNLIMITED",
    "DESTROY_FORCE",
    "RESET_DEVICE",
    "CONFIG_NO_ENV",
    "LOG_DEBUG",
    "LOG_INFO",
    "LOG_WARN",
    "LOG_ERROR",
    "LOG_OFF",
    "STATUS",
]

# --------------------------------------------------------------------------
# Constants of gpumem.h

#: Pass as a device number to mean every visible device.
ALL_DEVICES: int = -1
#: "No limit" value for byte thresholds (UINT64_MAX).
UNLIMITED: int = (1 << 64) - 1
#: gpumem_destroy() flag: free every live allocation.
DESTROY_FORCE: int = 0x1
#: gpumem_reset() flag: also reset the device (dangerous).
RESET_DEVICE: int = 0x1
#: gpumem_config.flags bit: ignore GPUMEM_* environment variables.
CONFIG_NO_ENV: int = 0x1

LOG_DEBUG: int = 0
LOG_INFO: int = 1
LOG_WARN: int = 2
LOG_ERROR: int = 3
LOG_OFF: int = 4

#: Status codes of gpumem.h, by their name without the ``GPUMEM_`` prefix.
STATUS = {
    "OK": 0,
    "ERR_INVALID_ARGUMENT": 1,
    "ERR_INVALID_DEVICE": 2,
    "ERR_INVALID_POINTER": 3,
    "ERR_OUT_OF_MEMORY": 4,
    "ERR_LIMIT_EXCEEDED": 5,
    "ERR_BUSY": 6,
    "ERR_NO_BACKEND": 7,
    "ERR_BACKEND": 8,
    "ERR_NOT_SUPPORTED": 9,
    "ERR_INTERNAL": 10,
}

# --------------------------------------------------------------------------
# Structs (must match include/gpumem.h exactly)

#: int (*gpumem_oom_fn)(void *user, int device, size_t requested)
OOM_FN = CFUNCTYPE(c_int, c_void_p, c_int, c_size_t)
#: void (*gpumem_log_fn)(void *user, gpumem_log_level level, const char *msg)
LOG_FN = CFUNCTYPE(None, c_void_p, c_int, c_char_p)


class Config(Structure):
    """``gpumem_config``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("backend", c_char_p),
        ("custom_backend", c_void_p),
        ("release_threshold", c_uint64),
        ("trim_free_fraction", c_double),
        ("limit_bytes", c_uint64),
        ("limit_fraction", c_double),
        ("initial_bytes", c_uint64),
        ("oom_callback", OOM_FN),
        ("oom_user", c_void_p),
        ("log_callback", LOG_FN),
        ("log_user", c_void_p),
        ("log_level", c_int),
        ("expandable", c_int),
        ("share", c_char_p),
        ("share_wait_ms", c_uint32),
        ("watch_interval_ms", c_uint32),
        ("stream_deps", c_int),
        ("peak_headroom", c_double),
        ("capture_probe", c_int),
    ]


class DeviceInfo(Structure):
    """``gpumem_device_info``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("ordinal", c_int),
        ("name", c_char * 256),
        ("uuid", c_char * 64),
        ("pci_bus_id", c_char * 32),
        ("total_bytes", c_uint64),
        ("free_bytes", c_uint64),
        ("physical_index", c_int),
    ]


class Stats(Structure):
    """``gpumem_stats``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("reserved_", c_uint32),
        ("allocated_bytes", c_uint64),
        ("allocated_peak", c_uint64),
        ("reserved_bytes", c_uint64),
        ("reserved_peak", c_uint64),
        ("cached_bytes", c_uint64),
        ("num_allocs", c_uint64),
        ("num_frees", c_uint64),
        ("num_live", c_uint64),
        ("num_segments", c_uint64),
        ("num_backend_allocs", c_uint64),
        ("num_backend_frees", c_uint64),
        ("num_trims", c_uint64),
        ("trimmed_bytes", c_uint64),
        ("num_oom_retries", c_uint64),
        ("num_ooms", c_uint64),
        ("requested_bytes", c_uint64),
        ("num_limit_exceeded", c_uint64),
        ("num_share_asks", c_uint64),
        ("num_share_asked", c_uint64),
        ("share_given_bytes", c_uint64),
    ]


class ShareMember(Structure):
    """``gpumem_share_member``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("pid", c_int),
        ("command", c_char * 32),
        ("group", c_char * 64),
        ("reserved_bytes", c_uint64),
        ("cached_bytes", c_uint64),
        ("live_bytes", c_uint64),
        ("asked", c_uint64),
        ("was_asked", c_uint64),
        ("given_bytes", c_uint64),
        ("listening", c_int),
        ("self", c_int),
    ]


class Buffer(Structure):
    """``gpumem_buffer``."""

    _fields_ = [
        ("ctx", c_void_p),
        ("ptr", c_void_p),
        ("size", c_size_t),
        ("device", c_int),
        ("stream", c_void_p),
    ]


class CupyAllocator(Structure):
    """``gpumem_cupy_allocator``: the parameter block of ``gpumem_cupy_malloc``/``gpumem_cupy_free``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("ctx", c_void_p),
        ("stream_of", c_void_p),
        ("py_call", c_void_p),
        ("py_decref", c_void_p),
        ("on_error", c_void_p),
        ("on_stream", c_void_p),
    ]


_BACKEND_METHODS = (
    "init", "shutdown", "device_count", "device_info", "mem_get_info", "malloc", "free",
    "event_create", "event_destroy", "event_record", "event_query", "event_synchronize",
    "stream_synchronize", "device_synchronize", "device_reset", "error_status", "error_string",
    "vm_granularity", "vm_reserve", "vm_release", "vm_create", "vm_destroy", "vm_map", "vm_unmap",
    "annotate_alloc", "annotate_free",  # version 2
    "stream_capture",  # version 3
    "stream_wait_event",  # version 4
)


class Backend(Structure):
    """``gpumem_backend`` (include/gpumem/backend.h), methods as raw function pointers.

    Enough to copy a built-in vtable (:func:`builtin_backend`), change some
    members and pass it as ``Context(custom_backend=...)``; the core copies it
    at create time.
    """

    _fields_ = [
        ("version", c_uint32),
        ("struct_size", c_uint32),
        ("name", c_char_p),
        ("user_data", c_void_p),
    ] + [(m, c_void_p) for m in _BACKEND_METHODS]


#: Field names of gpumem_stats reported by :meth:`gpumem.Context.stats`.
STATS_FIELDS: Tuple[str, ...] = tuple(
    name for name, _ in Stats._fields_ if name not in ("struct_size", "reserved_")
)

# --------------------------------------------------------------------------
# Library loading


class LibraryNotFoundError(ImportError):
    """``libgpumem`` could not be loaded; ``tried`` lists ``(path, reason)`` pairs."""

    def __init__(self, tried: List[Tuple[str, str]]) -> None:
        self.tried = list(tried)
        lines = ["libgpumem shared library not found; tried:"]
        lines += ["  %s: %s" % (p, why) for p, why in self.tried]
        lines.append(
            "Set GPUMEM_LIBRARY to the path of libgpumem.so (built by "
            "'cmake -S . -B build && cmake --build build --target gpumem'), "
            "copy it beside the gpumem package, or install it on the system search path."
        )
        super().__init__("\n".join(lines))


def _candidates() -> List[Tuple[str, str]]:
    """Return (origin, path) pairs in search order."""
    out: List[Tuple[str, str]] = []
    env = os.environ.get("GPUMEM_LIBRARY")
    if env:
        out.append(("GPUMEM_LIBRARY", env))
    here = os.path.dirname(os.path.abspath(__file__))
    pattern = os.path.join(here, "libgpumem.so*")
    beside = sorted(glob.glob(pattern))
    if beside:
        out += [("beside the package", p) for p in beside]
    else:
        out.append(("beside the package", pattern))
    found = ctypes.util.find_library("gpumem")
    if found:
        out.append(("find_library", found))
    out.append(("system", "libgpumem.so.0"))
    out.append(("system", "libgpumem.so"))
    return out


def _resolve_path(name: str) -> str:
    """Absolute path of a loaded library given the name it was loaded with."""
    if os.path.sep in name:
        return os.path.realpath(name)
    try:
        with open("/proc/self/maps", "r") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and os.path.basename(parts[5]).startswith("libgpumem.so"):
                    return parts[5]
    except OSError:
        pass
    return name


def _load() -> Tuple[ctypes.CDLL, str, List[Tuple[str, str]]]:
    tried: List[Tuple[str, str]] = []
    env_failed = False
    for origin, path in _candidates():
        if origin == "beside the package" and not os.path.exists(path):
            tried.append((path, "no such file (%s)" % origin))
            continue
        if os.path.sep in path and not os.path.exists(path):
            tried.append((path, "no such file (%s)" % origin))
            env_failed = env_failed or origin == "GPUMEM_LIBRARY"
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError as e:
            tried.append((path, "%s (%s)" % (e, origin)))
            env_failed = env_failed or origin == "GPUMEM_LIBRARY"
            continue
        try:
            handle.gpumem_create  # noqa: B018 - probe that it really is libgpumem
        except AttributeError:
            tried.append((path, "loaded but has no symbol gpumem_create (%s)" % origin))
            env_failed = env_failed or origin == "GPUMEM_LIBRARY"
            continue
        if env_failed:
            warnings.warn(
                "GPUMEM_LIBRARY=%r could not be loaded (%s); using %s instead"
                % (os.environ.get("GPUMEM_LIBRARY"), tried[0][1], path),
                RuntimeWarning,
                stacklevel=3,
            )
        tried.append((path, "loaded (%s)" % origin))
        return handle, _resolve_path(path), tried
    raise LibraryNotFoundError(tried)


lib, library_path, tried_paths = _load()
"""The loaded ``CDLL``, its absolute path, and the (path, result) list of the search."""

# --------------------------------------------------------------------------
# Prototypes


def _proto(name: str, restype, argtypes, required: bool = True) -> None:
    try:
        fn = getattr(lib, name)
    except AttributeError:
        if required:
            raise LibraryNotFoundError(
                tried_paths + [(library_path, "missing symbol %s: library too old or not libgpumem" % name)]
            ) from None
        return
    fn.restype = restype
    fn.argtypes = argtypes


_ctx = c_void_p
_status = c_int

_proto("gpumem_status_name", c_char_p, [c_int])
_proto("gpumem_strerror", c_char_p, [c_int])
_proto("gpumem_last_backend_error", _status, [_ctx, POINTER(c_int), POINTER(c_char_p)])
_proto("gpumem_config_init", None, [POINTER(Config)])
_proto("gpumem_create", _status, [POINTER(Config), POINTER(c_void_p)])
_proto("gpumem_destroy", _status, [_ctx, c_uint])
_proto("gpumem_device_count", _status, [_ctx, POINTER(c_int)])
_proto("gpumem_device_get_info", _status, [_ctx, c_int, POINTER(DeviceInfo)])
_proto("gpumem_backend_name", c_char_p, [_ctx])
_proto("gpumem_alloc", _status, [_ctx, c_int, c_size_t, c_void_p, POINTER(c_void_p)])
_proto("gpumem_free", _status, [_ctx, c_void_p, c_void_p])
_proto("gpumem_record_stream", _status, [_ctx, c_void_p, c_void_p])
_proto("gpumem_ptr_info", _status, [_ctx, c_void_p, POINTER(c_size_t), POINTER(c_int)])
_proto("gpumem_alloc_tagged", _status, [_ctx, c_int, c_size_t, c_void_p, c_char_p, POINTER(c_void_p)])
_proto("gpumem_buffer_alloc", _status, [_ctx, c_int, c_size_t, c_void_p, POINTER(Buffer)])
_proto("gpumem_buffer_release", None, [POINTER(Buffer)])
_proto("gpumem_scope_begin", _status, [_ctx, c_int, c_void_p, POINTER(c_void_p)])
_proto("gpumem_scope_alloc", _status, [c_void_p, c_size_t, POINTER(c_void_p)])
_proto("gpumem_scope_set_tag", _status, [c_void_p, c_char_p])
_proto("gpumem_scope_end", _status, [c_void_p])
_proto("gpumem_trim", _status, [_ctx, c_int, c_uint64, POINTER(c_uint64)])
_proto("gpumem_reset", _status, [_ctx, c_int, c_uint])
_proto("gpumem_capture_pools_release", _status, [_ctx, c_int])
_proto("gpumem_capture_ended", _status, [_ctx, c_int, c_void_p])
_proto("gpumem_get_stats", _status, [_ctx, c_int, POINTER(Stats)])
_proto("gpumem_reset_peak_stats", _status, [_ctx, c_int])
_proto("gpumem_stats_format", _status, [_ctx, c_int, c_int, c_char_p, c_size_t, POINTER(c_size_t)])
_proto("gpumem_set_limit", _status, [_ctx, c_int, c_uint64])
_proto("gpumem_get_limit", _status, [_ctx, c_int, POINTER(c_uint64)])
_proto("gpumem_largest_free_block", _status, [_ctx, c_int, POINTER(c_uint64)])
_proto("gpumem_share_members", _status, [_ctx, c_int, POINTER(ShareMember), c_size_t, POINTER(c_size_t)])
_proto("gpumem_share_reclaim", _status, [_ctx, c_int, c_uint64, c_uint32, POINTER(c_uint64), POINTER(c_size_t)])
_proto("gpumem_graph_pool_create", _status, [_ctx, c_int, POINTER(c_void_p)])
_proto("gpumem_graph_pool_begin", _status, [c_void_p, c_void_p])
_proto("gpumem_graph_pool_end", _status, [c_void_p, c_void_p])
_proto("gpumem_graph_pool_alloc", _status, [c_void_p, c_size_t, c_void_p, POINTER(c_void_p)])
_proto("gpumem_graph_pool_alloc_at", _status, [c_void_p, c_void_p, c_size_t])
_proto("gpumem_graph_pool_release", _status, [c_void_p])
_proto("gpumem_graph_pool_get_stats", _status, [c_void_p, POINTER(Stats)])
_proto("gpumem_torch_alloc", c_void_p, [c_size_t, c_int, c_void_p])
_proto("gpumem_torch_free", None, [c_void_p, c_size_t, c_int, c_void_p])
_proto("gpumem_global_context", _status, [POINTER(c_void_p)])
_proto("gpumem_trace_start", _status, [_ctx, c_char_p], required=False)
_proto("gpumem_trace_stop", _status, [_ctx], required=False)
_proto("gpumem_cupy_malloc", c_void_p, [c_void_p, c_size_t, c_int], required=False)
_proto("gpumem_cupy_free", None, [c_void_p, c_void_p, c_int], required=False)
_proto("gpumem_cupy_release_streams", _status, [c_void_p, POINTER(c_size_t)], required=False)
_proto("gpumem_builtin_backend", POINTER(Backend), [c_char_p], required=False)

# gpumem/sim.h (always built, but tolerate a library without it)
_proto("gpumem_sim_fail_nth", _status, [c_int, c_uint64, c_int, c_int], required=False)
_proto("gpumem_sim_fail_every", _status, [c_int, c_uint64, c_uint64, c_int], required=False)
_proto("gpumem_sim_fail_clear", None, [], required=False)
_proto("gpumem_sim_call_count", c_uint64, [c_int], required=False)
_proto("gpumem_sim_set_delayed", None, [c_int], required=False)
_proto("gpumem_sim_stream_complete", None, [c_int, c_void_p], required=False)
_proto("gpumem_sim_complete_all", None, [], required=False)
_proto("gpumem_sim_set_clock", None, [c_uint64], required=False)
_proto("gpumem_sim_complete_before", None, [c_uint64], required=False)
_proto("gpumem_sim_used_bytes", _status, [c_int, POINTER(c_uint64)], required=False)
_proto("gpumem_sim_set_external_usage", _status, [c_int, c_uint64], required=False)
_proto("gpumem_sim_reinit", _status, [], required=False)
_proto("gpumem_sim_stream_submit", _status, [c_int, c_void_p, POINTER(c_uint64)], required=False)
_proto("gpumem_sim_stream_wait", _status, [c_int, c_void_p, c_void_p], required=False)
_proto("gpumem_sim_stream_done", _status, [c_int, c_void_p, c_uint64, POINTER(c_int)], required=False)
_proto("gpumem_sim_stream_ordered", _status, [c_int, c_void_p, c_void_p, c_uint64, POINTER(c_int)], required=False)
_proto("gpumem_sim_stream_begin_capture", _status, [c_int, c_void_p, c_int], required=False)
_proto("gpumem_sim_stream_end_capture", _status, [c_int, c_void_p, POINTER(c_int)], required=False)
_proto("gpumem_sim_stream_capture_status", _status,
       [c_int, c_void_p, POINTER(c_int), POINTER(c_uint64), POINTER(c_uint64)], required=False)
_proto("gpumem_sim_stream_destroy", _status, [c_int, c_void_p], required=False)
_proto("gpumem_sim_stream_create", _status, [c_int, c_void_p], required=False)
_proto("gpumem_sim_dead_stream_uses", c_uint64, [], required=False)
_proto("gpumem_sim_thread_exchange_capture_mode", _status, [POINTER(c_int)], required=False)
_proto("gpumem_sim_set_capture_relax", None, [c_int], required=False)


def builtin_backend(name: str) -> Optional[Backend]:
    """A copy of the built-in backend vtable ``name`` ("sim", "cuda", "hip"), or None if not built."""
    fn = getattr(lib, "gpumem_builtin_backend", None)
    if fn is None:
        return None
    p = fn(name.encode("utf-8"))
    if not p:
        return None
    copy = Backend()
    ctypes.memmove(ctypes.byref(copy), p, ctypes.sizeof(Backend))
    return copy


def status_name(status: int) -> str:
    """``gpumem_status_name(status)`` as a str."""
    return (lib.gpumem_status_name(status) or b"GPUMEM_UNKNOWN_STATUS").decode("utf-8", "replace")


def strerror(status: int) -> str:
    """``gpumem_strerror(status)`` as a str."""
    return (lib.gpumem_strerror(status) or b"").decode("utf-8", "replace")


def last_backend_error(ctx: Optional[int]) -> Tuple[int, Optional[str]]:
    """The calling thread's last raw backend ``(code, message)`` on ``ctx``."""
    code = c_int(0)
    msg = c_char_p()
    if not ctx or lib.gpumem_last_backend_error(ctx, ctypes.byref(code), ctypes.byref(msg)) != 0:
        return 0, None
    return code.value, (msg.value.decode("utf-8", "replace") if msg.value else None)

