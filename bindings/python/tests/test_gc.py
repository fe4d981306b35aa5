"""Forgotten buffers are freed exactly once by their finalizer, and never after close."""

from __future__ import annotations

import gc

import pytest

import gpumem


@pytest.fixture
def free_calls(monkeypatch):
    """Record every gpumem_free call the binding makes: (ptr, status)."""
    calls = []
    real = gpumem.capi.lib.gpumem_free

    def counting(h, ptr, stream):
        status = real(h, ptr, stream)
        calls.append((ptr, status))
        return status

    monkeypatch.setattr(gpumem.capi.lib, "gpumem_free", counting)
    return calls


def test_dropped_buffers_freed_once(ctx, free_calls):
    ptrs = set()
    for _ in range(50):
        ptrs.add(ctx.alloc(4096).ptr)  # the Buffer dies right here
    gc.collect()
    st = ctx.stats()
    assert st["num_allocs"] == 50 and st["num_frees"] == 50 and st["num_live"] == 0
    assert len(free_calls) == 50 and all(status == 0 for _, status in free_calls)


def test_buffer_in_reference_cycle_freed_once_by_gc(ctx, free_calls):
    class Holder:
        pass

    gc.disable()
    try:
        for _ in range(10):
            h = Holder()
            h.me = h
            h.buf = ctx.alloc(8192)
        del h
        assert ctx.stats()["num_live"] == 10  # cycles wait for the collector
    finally:
        gc.enable()
    gc.collect()
    gc.collect()
    st = ctx.stats()
    assert st["num_live"] == 0 and st["num_frees"] == 10
    assert len(free_calls) == 10 and all(s == 0 for _, s in free_calls)


def test_explicit_free_then_gc_does_not_free_again(ctx, free_calls):
    buf = ctx.alloc(4096)
    buf.free()
    del buf
    gc.collect()
    assert len(free_calls) == 1
    assert ctx.stats()["num_frees"] == 1


def test_no_free_after_context_closed(free_calls):
    c = gpumem.Context(backend="sim")
    bufs = [c.alloc(4096) for _ in range(5)]
    with pytest.warns(ResourceWarning):
        c.close()
    del bufs
    gc.collect()
    assert free_calls == []


def test_no_free_after_reset(ctx, free_calls):
    buf = ctx.alloc(4096)
    ctx.reset(0)
    del buf
    gc.collect()
    assert free_calls == []
