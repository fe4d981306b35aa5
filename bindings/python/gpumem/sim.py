"""Controls of the host simulator backend (``include/gpumem/sim.h``), for tests.

The sim state is process-wide: every context using ``"sim"`` sees the same
devices. ``GPUMEM_SIM_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` are read when
the first sim context is created after none was alive, or at :func:`reinit`.
"""

from __future__ import annotations

from ctypes import byref, c_uint64
from typing import Optional

from . import capi
from ._core import StreamLike, _cint, _device, _u64, stream_handle
from .errors import make_error

__all__ = [
    "CALL_MALLOC", "CALL_FREE", "CALL_EVENT", "CALL_INFO", "CALL_SYNC", "CALL_MAP",
    "ERR_INVALID_VALUE", "ERR_OUT_OF_MEMORY", "ERR_BAD_ENV", "ERR_NO_DEVICE",
    "ERR_INVALID_DEVICE", "ERR_INJECTED",
    "available", "fail_nth", "fail_every", "fail_clear", "call_count", "set_delayed",
    "stream_complete", "complete_all", "set_clock", "complete_before", "used_bytes",
    "set_external_usage", "reinit",
]

CALL_MALLOC, CALL_FREE, CALL_EVENT, CALL_INFO, CALL_SYNC, CALL_MAP = range(6)

ERR_INVALID_VALUE = 1
ERR_OUT_OF_MEMORY = 2
ERR_BAD_ENV = 3
ERR_NO_DEVICE = 100
ERR_INVALID_DEVICE = 101
ERR_INJECTED = 999


def available() -> bool:
    """True if the loaded library exports the sim controls."""
    return hasattr(capi.lib, "gpumem_sim_fail_nth") and capi.lib.gpumem_sim_fail_nth.argtypes is not None


def _check(status: int) -> None:
    if status:
        raise make_error(status)


def fail_nth(kind: int, nth: int = 1, error: int = ERR_INJECTED, repeat: bool = False) -> None:
    """Fail the ``nth`` next call (1 = the very next) of ``kind`` with the sim ``error`` code.

    With ``repeat`` that call and every later one of the kind fail until :func:`fail_clear`.
    """
    _check(capi.lib.gpumem_sim_fail_nth(_cint(kind, "kind"), _u64(nth, "nth"), _cint(error, "error"), 1 if repeat else 0))


def fail_every(kind: int, nth: int = 1, every: int = 2, error: int = ERR_INJECTED) -> None:
    """Fail the ``nth`` next call of ``kind`` and from there every ``every``-th one, until :func:`fail_clear`.

    The calls between succeed: a driver failing now and then.
    """
    _check(capi.lib.gpumem_sim_fail_every(_cint(kind, "kind"), _u64(nth, "nth"), _u64(every, "every"), _cint(error, "error")))


def fail_clear() -> None:
    """Clear every injected fault."""
    capi.lib.gpumem_sim_fail_clear()


def call_count(kind: int) -> int:
    """Calls of ``kind`` made since the sim state was created (failed calls too)."""
    return int(capi.lib.gpumem_sim_call_count(_cint(kind, "kind")))


def set_delayed(on: bool) -> None:
    """Delayed completion: events stay pending until the stream's work is completed."""
    capi.lib.gpumem_sim_set_delayed(1 if on else 0)


def stream_complete(device: int = -1, stream: StreamLike = None) -> None:
    """Complete the work queued so far on one stream of one device (-1 = every device)."""
    capi.lib.gpumem_sim_stream_complete(_device(device, True), stream_handle(stream))


def complete_all() -> None:
    """Complete all work on every stream of every device."""
    capi.lib.gpumem_sim_complete_all()


def set_clock(now: int) -> None:
    """Clocked delayed mode: events recorded from now on carry the clock ``now`` (a count the caller
    keeps increasing); :func:`complete_before` completes what was recorded before a clock, as a
    device a constant distance behind the host. ``set_delayed(False)`` ends it."""
    capi.lib.gpumem_sim_set_clock(_u64(now, "now"))


def complete_before(clock: int) -> None:
    """Clocked delayed mode: complete the work recorded while the clock was less than ``clock``."""
    capi.lib.gpumem_sim_complete_before(_u64(clock, "clock"))


def used_bytes(device: int = 0) -> int:
    """Bytes the sim backend has handed out on a visible device."""
    out = c_uint64(0)
    _check(capi.lib.gpumem_sim_used_bytes(_device(device), byref(out)))
    return out.value


def set_external_usage(device: int, nbytes: int) -> None:
    """Simulate ``nbytes`` taken on ``device`` by someone else (reduces its free memory)."""
    _check(capi.lib.gpumem_sim_set_external_usage(_device(device), _u64(nbytes, "nbytes")))


def reinit() -> None:
    """Re-read ``GPUMEM_SIM_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` (BusyError while a sim context lives)."""
    _check(capi.lib.gpumem_sim_reinit())
