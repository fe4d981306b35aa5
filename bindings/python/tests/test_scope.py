"""Scope: a region whose allocations are all freed at its end."""

from __future__ import annotations

import gc

import pytest

import gpumem
from conftest import MiB


def test_scope_frees_everything(ctx):
    with ctx.scope(device=0) as sc:
        assert sc.active
        ptrs = [sc.alloc(n) for n in (1, 1024, MiB)]
        assert all(p and p % 256 == 0 for p in ptrs)
        assert len(set(ptrs)) == 3
        st = ctx.stats()
        assert st["num_live"] == 3 and st["requested_bytes"] == 1 + 1024 + MiB
    assert not sc.active
    st = ctx.stats()
    assert st["num_live"] == 0 and st["num_frees"] == 3


def test_scope_zero_and_end_twice(ctx):
    sc = ctx.scope()
    assert sc.alloc(0) == 0
    sc.alloc(64)
    sc.end()
    sc.end()  # harmless
    with pytest.raises(gpumem.InvalidArgumentError, match="ended"):
        sc.alloc(16)
    assert ctx.stats()["num_live"] == 0


def test_scope_frees_on_exception(ctx):
    with pytest.raises(RuntimeError):
        with ctx.scope() as sc:
            sc.alloc(4096)
            raise RuntimeError
    assert ctx.stats()["num_live"] == 0


def test_scope_and_buffers_are_independent(ctx):
    keep = ctx.alloc(512)
    with ctx.scope() as sc:
        sc.alloc(512)
    assert keep.alive and ctx.stats()["num_live"] == 1
    keep.free()


def test_forgotten_scope_is_ended_by_gc(ctx):
    sc = ctx.scope()
    sc.alloc(4096)
    sc.alloc(4096)
    del sc
    gc.collect()
    st = ctx.stats()
    assert st["num_live"] == 0 and st["num_frees"] == 2


def test_close_ends_open_scopes():
    c = gpumem.Context(backend="sim")
    sc = c.scope()
    sc.alloc(4096)
    with pytest.warns(ResourceWarning, match="1 open scope"):
        c.close()
    assert not sc.active
    sc.end()  # harmless after close


def test_scope_tag_and_stream(sim_ctx):
    with sim_ctx.scope(stream=0x1234) as sc:
        sc.set_tag("step-1")
        assert sc.stream == 0x1234
        p = sc.alloc(100)
        assert sim_ctx.ptr_info(p) == (100, 0)
        sc.set_tag(None)


def test_scope_invalid_device(ctx):
    with pytest.raises(gpumem.InvalidDeviceError):
        ctx.scope(device=ctx.device_count)


def test_scope_respects_limit():
    with gpumem.Context(backend="sim", limit_bytes=8 * MiB) as c:
        with c.scope() as sc:
            with pytest.raises(gpumem.LimitExceededError):
                sc.alloc(16 * MiB)
            sc.alloc(1024)


def test_scope_surviving_reset_frees_no_other_buffer(ctx):
    """A Scope that survives ctx.reset frees nothing it allocated before the reset: the addresses
    may be another Buffer's by then. Before, its end freed that Buffer's memory."""
    sc = ctx.scope(device=0)
    a = sc.alloc(4096)
    big = sc.alloc(3 << 20)
    ctx.reset(device=0)
    x = ctx.alloc(4096)  # the same sizes again: the same addresses, most likely
    y = ctx.alloc(3 << 20)
    c = sc.alloc(8192)  # after the reset: the scope's own, freed at its end
    sc.end()
    assert x.alive and y.alive
    assert ctx.ptr_info(x.ptr) == (4096, 0) and ctx.ptr_info(y.ptr) == (3 << 20, 0)
    with pytest.raises(gpumem.InvalidPointerError):
        ctx.ptr_info(c)
    assert ctx.stats()["num_live"] == 2
    x.free()
    y.free()
    assert ctx.stats()["num_live"] == 0


def test_scope_exception_is_not_replaced(ctx):
    """The with-block's own exception reaches the caller, even when the block reset the device
    under the scope. Before, InvalidPointerError from the scope's end replaced it."""

    class Mine(Exception):
        pass

    with pytest.raises(Mine):
        with ctx.scope() as sc:
            sc.alloc(4096)
            ctx.reset(device=0)
            raise Mine()
    with pytest.raises(Mine):
        with ctx.alloc(4096) as b:
            ctx.reset(device=0)
            raise Mine()
    assert not b.alive
    assert ctx.stats()["num_live"] == 0
