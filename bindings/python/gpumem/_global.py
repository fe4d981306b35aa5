"""The Python wrapper around the process-wide C context (gpumem_global_context)."""

from __future__ import annotations

import threading
from ctypes import byref, c_void_p
from typing import Optional

from . import capi
from ._core import Context
from .errors import make_error

_lock = threading.Lock()
_ctx: Optional[Context] = None


def global_context() -> Context:
    """Return the one :class:`Context` wrapping ``gpumem_global_context()`` (never destroyed by Python)."""
    global _ctx
    with _lock:
        if _ctx is None:
            out = c_void_p()
            status = capi.lib.gpumem_global_context(byref(out))
            if status:
                raise make_error(status, detail="creating the process-wide context")
            _ctx = Context._wrap(int(out.value), owned=False)
        return _ctx
