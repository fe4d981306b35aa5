"""Exceptions: one class per ``gpumem_status``, all derived from :class:`GpumemError`."""

from __future__ import annotations

from typing import Dict, Optional, Type

__all__ = [
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
    "error_class",
    "make_error",
]


class GpumemError(Exception):
    """A libgpumem call failed.

    Attributes:
        status: the numeric ``gpumem_status``.
        name: its name, e.g. ``"GPUMEM_ERR_OUT_OF_MEMORY"``.
        message: a sentence describing the failure.
        backend_code: for :class:`BackendError`, the raw backend code (e.g. a
            ``cudaError_t``) when the library reported one, else 0.
        backend_message: the raw backend message, or None.
    """

    #: status code this class stands for (None for the base class)
    STATUS: Optional[int] = None

    def __init__(
        self,
        status: int,
        name: str,
        message: str,
        backend_code: int = 0,
        backend_message: Optional[str] = None,
    ) -> None:
        self.status = int(status)
        self.name = name
        self.message = message
        self.backend_code = backend_code
        self.backend_message = backend_message
        text = "%s: %s" % (name, message)
        if backend_code or backend_message:
            text += " (backend error %d: %s)" % (backend_code, backend_message or "")
        super().__init__(text)

    def __reduce__(self):  # keep picklable despite the custom __init__
        return (
            type(self),
            (self.status, self.name, self.message, self.backend_code, self.backend_message),
        )


class InvalidArgumentError(GpumemError, ValueError):
    """GPUMEM_ERR_INVALID_ARGUMENT: an argument is invalid."""

    STATUS = 1


class InvalidDeviceError(GpumemError):
    """GPUMEM_ERR_INVALID_DEVICE: the device is not a visible device of the context."""

    STATUS = 2


class InvalidPointerError(GpumemError):
    """GPUMEM_ERR_INVALID_POINTER: not from this context, already freed, or interior."""

    STATUS = 3


class OutOfMemoryError(GpumemError, MemoryError):
    """GPUMEM_ERR_OUT_OF_MEMORY: the device is out of memory even after trimming and retrying."""

    STATUS = 4


class LimitExceededError(GpumemError):
    """GPUMEM_ERR_LIMIT_EXCEEDED: the request would pass the configured limit."""

    STATUS = 5


class BusyError(GpumemError):
    """GPUMEM_ERR_BUSY: the object still has live allocations."""

    STATUS = 6


class NoBackendError(GpumemError):
    """GPUMEM_ERR_NO_BACKEND: the backend is not built or has no device or driver, or the driver is unloading (a call at process exit)."""

    STATUS = 7


class BackendError(GpumemError):
    """GPUMEM_ERR_BACKEND: the backend reported an error (see ``backend_code``)."""

    STATUS = 8


class NotSupportedError(GpumemError):
    """GPUMEM_ERR_NOT_SUPPORTED: not supported by this backend or build."""

    STATUS = 9


class InternalError(GpumemError):
    """GPUMEM_ERR_INTERNAL: an invariant of the library was violated."""

    STATUS = 10


class AllocatorInUseError(BusyError, RuntimeError):
    """A framework plug-in was enabled too late: the framework's own allocator is already in use."""


_BY_STATUS: Dict[int, Type[GpumemError]] = {
    cls.STATUS: cls  # type: ignore[misc]
    for cls in (
        InvalidArgumentError,
        InvalidDeviceError,
        InvalidPointerError,
        OutOfMemoryError,
        LimitExceededError,
        BusyError,
        NoBackendError,
        BackendError,
        NotSupportedError,
        InternalError,
    )
}


def error_class(status: int) -> Type[GpumemError]:
    """The exception class for a status (:class:`GpumemError` for unknown ones)."""
    return _BY_STATUS.get(int(status), GpumemError)


def make_error(status: int, ctx: Optional[int] = None, detail: Optional[str] = None) -> GpumemError:
    """Build the exception for a failing status, asking the library for name and message.

    For GPUMEM_ERR_BACKEND the raw backend code and message of the calling
    thread are attached when ``ctx`` is given.
    """
    from . import capi

    name = capi.status_name(status)
    message = capi.strerror(status)
    if detail:
        message = "%s: %s" % (detail, message)
    code, bmsg = 0, None
    if status == BackendError.STATUS and ctx:
        code, bmsg = capi.last_backend_error(ctx)
    return error_class(status)(status, name, message, code, bmsg)
