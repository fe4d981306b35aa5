"""Buffer: allocation, attributes, free semantics, streams, host access on sim."""

from __future__ import annotations

import ctypes
import gc

import pytest

import gpumem
from conftest import MiB


def test_alloc_attributes_and_free(ctx):
    buf = ctx.alloc(1000)
    assert isinstance(buf, gpumem.Buffer)
    assert buf.ptr != 0 and buf.ptr % 256 == 0
    assert (buf.size, buf.device, buf.stream) == (1000, 0, None)
    assert buf.context is ctx and buf.alive
    assert int(buf) == buf.ptr and len(buf) == 1000
    assert ctx.ptr_info(buf.ptr) == (1000, 0)
    st = ctx.stats()
    assert (st["num_allocs"], st["num_live"], st["requested_bytes"]) == (1, 1, 1000)
    buf.free()
    assert not buf.alive and "freed" in repr(buf)
    buf.free()  # twice is harmless
    st = ctx.stats()
    assert (st["num_frees"], st["num_live"]) == (1, 0)
    with pytest.raises(gpumem.InvalidPointerError):
        ctx.ptr_info(buf.ptr)


def test_with_block_frees(ctx):
    with ctx.alloc(4096) as buf:
        assert ctx.stats()["num_live"] == 1
    assert not buf.alive
    assert ctx.stats()["num_live"] == 0


def test_with_block_frees_on_exception(ctx):
    with pytest.raises(KeyError):
        with ctx.alloc(4096):
            raise KeyError("x")
    assert ctx.stats()["num_live"] == 0


def test_zero_size(ctx):
    buf = ctx.alloc(0)
    assert buf.ptr == 0 and buf.size == 0 and not buf.alive
    buf.free()
    assert ctx.stats()["num_allocs"] == 0


def test_bad_sizes(ctx):
    with pytest.raises(gpumem.InvalidArgumentError):
        ctx.alloc(-1)
    with pytest.raises(ValueError):  # InvalidArgumentError is a ValueError
        ctx.alloc(1 << 64)
    with pytest.raises(TypeError):
        ctx.alloc(1.5)
    with pytest.raises(TypeError):
        ctx.alloc(True)


def test_distinct_non_overlapping(ctx):
    bufs = [ctx.alloc(s) for s in (1, 255, 256, 257, 4096, MiB, 3 * MiB + 7)]
    spans = sorted((b.ptr, b.ptr + b.size) for b in bufs)
    for (a0, a1), (b0, _) in zip(spans, spans[1:]):
        assert a1 <= b0
    for b in bufs:
        b.free()


def test_host_access_on_sim(sim_ctx):
    a = sim_ctx.alloc(MiB)
    b = sim_ctx.alloc(MiB)
    ctypes.memset(a.ptr, 0xAB, a.size)
    ctypes.memset(b.ptr, 0x5C, b.size)
    assert ctypes.string_at(a.ptr, a.size) == b"\xab" * MiB
    assert ctypes.string_at(b.ptr, b.size) == b"\x5c" * MiB
    a.free()
    b.free()


class _CupyLike:
    def __init__(self, ptr):
        self.ptr = ptr


class _TorchLike:
    def __init__(self, s):
        self.cuda_stream = s


class _HandleLike:
    def __init__(self, h):
        self.handle = h


@pytest.mark.parametrize(
    "stream, expected",
    [
        (None, None),
        (0, None),
        (0x1000, 0x1000),
        (ctypes.c_void_p(0x2000), 0x2000),
        (_CupyLike(0x3000), 0x3000),
        (_TorchLike(0x4000), 0x4000),
        (_HandleLike(0x5000), 0x5000),
        (_CupyLike(0), None),
    ],
)
def test_stream_forms(sim_ctx, stream, expected):
    # any pointer value is a stream on sim
    with sim_ctx.alloc(512, stream=stream) as buf:
        assert buf.stream == expected
    assert sim_ctx.stats()["num_live"] == 0


def test_stream_object_lives_until_the_free(sim_ctx):
    """A Buffer (and a Scope) keeps the stream object it was given (a CuPy or PyTorch stream, which
    destroys its CUDA stream when it goes) until its memory is freed on that stream: a free naming
    a destroyed stream crashes in CUDA. Raw handles and the default stream hold nothing."""
    import weakref

    s = _CupyLike(0x3100)
    ref = weakref.ref(s)
    buf = sim_ctx.alloc(4 * MiB, stream=s)
    del s
    gc.collect()
    assert ref() is not None and buf.stream == 0x3100
    buf.free()
    gc.collect()
    assert ref() is None
    t = _TorchLike(0x3200)
    ref = weakref.ref(t)
    buf = sim_ctx.alloc(4 * MiB, stream=t)
    del t, buf  # collected: freed on its stream, then the stream object goes
    gc.collect()
    assert ref() is None and sim_ctx.stats()["num_live"] == 0
    u = _CupyLike(0x3300)
    ref = weakref.ref(u)
    sc = sim_ctx.scope(stream=u)
    sc.alloc(4 * MiB)
    del u
    gc.collect()
    assert ref() is not None
    sc.end()
    del sc
    gc.collect()
    assert ref() is None and sim_ctx.stats()["num_live"] == 0
    for handle in (0, 2):  # the default streams, never destroyed: not held
        default = _CupyLike(handle)
        ref = weakref.ref(default)
        buf = sim_ctx.alloc(256, stream=default)
        del default
        gc.collect()
        assert ref() is None
        buf.free()


def test_bad_streams(ctx):
    with pytest.raises(TypeError):
        ctx.alloc(16, stream="default")
    with pytest.raises(TypeError):
        ctx.alloc(16, stream=True)
    with pytest.raises(gpumem.InvalidArgumentError):
        ctx.alloc(16, stream=-1)
    assert ctx.stats()["num_allocs"] == 0


def test_stream_ordered_reuse_on_sim(sim_ctx, sim_faults):
    """A block freed on stream S is not handed to stream T while S's work is pending."""
    sim_faults.set_delayed(True)
    try:
        a = sim_ctx.alloc(MiB, stream=0x1000)
        p = a.ptr
        a.free()
        b = sim_ctx.alloc(MiB, stream=0x2000)
        assert b.ptr != p, "a block with pending work on another stream must not be handed out"
        b.free()
    finally:
        sim_faults.complete_all()
        sim_faults.set_delayed(False)


def test_clocked_sim_device_behind(sim_ctx, sim_faults):
    """With the sim a constant distance behind (clocked mode), a block freed on S serves T only once
    the work recorded at its free has completed."""
    sim_faults.set_delayed(True)
    try:
        sim_faults.set_clock(1)
        a = sim_ctx.alloc(MiB, stream=0x1000)
        p = a.ptr
        a.free()
        sim_faults.complete_before(1)  # nothing recorded before clock 1
        b = sim_ctx.alloc(MiB, stream=0x2000)
        assert b.ptr != p
        b.free()
        with pytest.raises(gpumem.InvalidArgumentError):
            sim_faults.set_clock(-1)
    finally:
        sim_faults.complete_all()
        sim_faults.set_delayed(False)


def test_tagged_alloc(ctx):
    with ctx.alloc(128, tag="activations") as buf:
        assert ctx.ptr_info(buf.ptr)[0] == 128


def test_buffer_keeps_context_alive():
    buf = gpumem.Context(backend="sim").alloc(64)
    gc.collect()
    assert not buf.context.closed
    assert buf.alive
    buf.free()
    assert buf.context.stats()["num_live"] == 0
    buf.context.close()


def test_free_after_close_is_harmless():
    c = gpumem.Context(backend="sim")
    buf = c.alloc(64)
    with pytest.warns(ResourceWarning):
        c.close()
    assert not buf.alive
    buf.free()


def test_reset_marks_buffers_dead(ctx):
    buf = ctx.alloc(MiB)
    raw = gpumem.capi.lib.gpumem_alloc
    p = ctypes.c_void_p()
    assert raw(ctx.handle, 0, 4096, None, ctypes.byref(p)) == 0
    ctx.reset(0)
    assert not buf.alive
    buf.free()  # harmless: the reset already took the memory back
    with pytest.raises(gpumem.InvalidPointerError):
        ctx.free(p.value)  # a raw pointer is invalid after reset
    st = ctx.stats(0)
    assert st["num_live"] == 0 and st["reserved_bytes"] == 0
    with ctx.alloc(256):  # still usable
        pass


def test_context_free_of_raw_pointer(ctx):
    p = ctypes.c_void_p()
    assert gpumem.capi.lib.gpumem_alloc(ctx.handle, 0, 4096, None, ctypes.byref(p)) == 0
    ctx.free(p.value)
    with pytest.raises(gpumem.InvalidPointerError):
        ctx.free(p.value)
    ctx.free(0)  # NULL is fine
