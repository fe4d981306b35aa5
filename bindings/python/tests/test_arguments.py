"""Wrong use of every method's arguments: each bad value raises (TypeError for a wrong type, the
matching GpumemError for a value out of range) and changes nothing. Before, Python ints were
wrapped by ctypes into the C types: device=2**32 landed on device 0, reset(device=2**32) reset
device 0 with its Buffers still counted alive, ctx.free(b.ptr + 2**64) freed b, flags=1<<32 became 0,
and device=1.7 or device="0" were taken (docs/PYTHON.md promises TypeError)."""

from __future__ import annotations

import ctypes

import pytest

import gpumem
from conftest import MiB, is_sim

BAD_TYPES = [1.7, "0", b"0", None, [0], True, 2.0]
WRAPPING_DEVICES = [2**32, 2**32 + 1, -(2**32), 2**31, -2, 2**64]


def _live(ctx):
    return ctx.stats()["num_live"]


@pytest.mark.parametrize("device", BAD_TYPES)
def test_device_wrong_type(ctx, device):
    if device is None:
        pytest.skip("None is no device for alloc (checked below for the device=None methods)")
    with pytest.raises(TypeError):
        ctx.alloc(4096, device=device)
    with pytest.raises(TypeError):
        ctx.reset(device=device)
    with pytest.raises(TypeError):
        ctx.trim(device=device)
    with pytest.raises(TypeError):
        ctx.stats(device=device)
    with pytest.raises(TypeError):
        ctx.reset_peak_stats(device=device)
    with pytest.raises(TypeError):
        ctx.device_info(device)
    with pytest.raises(TypeError):
        ctx.scope(device=device)
    assert _live(ctx) == 0


def test_device_none_is_a_type_error(ctx):
    for call in (lambda: ctx.alloc(64, device=None), lambda: ctx.reset(device=None), lambda: ctx.stats(device=None)):
        with pytest.raises(TypeError):
            call()


@pytest.mark.parametrize("device", WRAPPING_DEVICES)
def test_device_out_of_range_never_wraps(ctx, device):
    with ctx.alloc(4096, device=0) as keep:
        with pytest.raises(gpumem.InvalidDeviceError):
            ctx.alloc(4096, device=device)
        with pytest.raises(gpumem.InvalidDeviceError):
            ctx.reset(device=device)  # before: reset device 0, keep still counted alive
        with pytest.raises(gpumem.InvalidDeviceError):
            ctx.trim(device=device)
        with pytest.raises(gpumem.InvalidDeviceError):
            ctx.stats(device=device)
        with pytest.raises(gpumem.InvalidDeviceError):
            ctx.reset_peak_stats(device=device)
        with pytest.raises(gpumem.InvalidDeviceError):
            ctx.device_info(device)
        with pytest.raises(gpumem.InvalidDeviceError):
            ctx.scope(device=device)
        assert keep.alive
        assert ctx.ptr_info(keep.ptr) == (4096, 0)  # still live: device 0 was not reset
        assert _live(ctx) == 1
    assert _live(ctx) == 0


def test_numpy_style_ints_are_taken(ctx):
    class Index:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    with ctx.alloc(Index(4096), device=Index(0)) as b:
        assert b.device == 0 and b.size == 4096
    assert ctx.trim(device=Index(gpumem.ALL_DEVICES)) >= 0


def test_free_pointer_out_of_range(ctx):
    b = ctx.alloc(4096)
    for p in (b.ptr + 2**64, b.ptr - 2**64, -1, 2**64):
        with pytest.raises(gpumem.InvalidPointerError):
            ctx.free(p)
        with pytest.raises(gpumem.InvalidPointerError):
            ctx.ptr_info(p)
    assert b.alive and _live(ctx) == 1
    for p in (float(b.ptr), str(b.ptr), b):  # a Buffer is freed with its own free()
        with pytest.raises(TypeError):
            ctx.free(p)
    assert b.alive and _live(ctx) == 1
    b.free()
    assert _live(ctx) == 0


def test_free_of_a_buffers_pointer_is_refused(ctx):
    b = ctx.alloc(4096)
    with pytest.raises(gpumem.InvalidArgumentError, match="Buffer"):
        ctx.free(b.ptr)  # the Buffer would free it again later
    assert b.alive and _live(ctx) == 1
    b.free()
    with pytest.raises(gpumem.InvalidPointerError):
        ctx.free(b.ptr)  # no longer the Buffer's: now the library says it is not live
    assert _live(ctx) == 0


def test_flags_out_of_range():
    for flags in (1 << 32, (1 << 32) | gpumem.CONFIG_NO_ENV, -1, 2**64):
        with pytest.raises(gpumem.InvalidArgumentError):
            gpumem.Context(backend="sim", flags=flags)
    for flags in (1.0, "1"):
        with pytest.raises(TypeError):
            gpumem.Context(backend="sim", flags=flags)
    with pytest.raises(gpumem.InvalidArgumentError):
        gpumem.Context(backend="sim", flags=1 << 5)  # an unknown bit: the library refuses it


@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"limit_bytes": 2**64}, gpumem.InvalidArgumentError),
        ({"limit_bytes": -1}, gpumem.InvalidArgumentError),
        ({"limit_bytes": 1.5}, TypeError),
        ({"limit_bytes": "1"}, TypeError),
        ({"initial_bytes": 2**64}, gpumem.InvalidArgumentError),
        ({"release_threshold": -5}, gpumem.InvalidArgumentError),
        ({"release_threshold": "big"}, TypeError),
        ({"trim_free_fraction": "0.1"}, TypeError),
        ({"trim_free_fraction": True}, TypeError),
        ({"trim_free_fraction": 1.5}, gpumem.InvalidArgumentError),
        ({"limit_fraction": "0.5"}, TypeError),
        ({"limit_fraction": float("nan")}, gpumem.InvalidArgumentError),
        ({"log_level": 2**32 + 2}, gpumem.InvalidArgumentError),
        ({"log_level": 5}, gpumem.InvalidArgumentError),
        ({"log_level": 1.0}, TypeError),
        ({"log_level": "loud"}, gpumem.InvalidArgumentError),
        ({"backend": 5}, TypeError),
        ({"backend": b"sim"}, TypeError),
        ({"expandable": 2}, gpumem.InvalidArgumentError),
        ({"expandable": 2**32}, gpumem.InvalidArgumentError),
        ({"expandable": "0"}, TypeError),
        ({"stream_deps": 2}, gpumem.InvalidArgumentError),
        ({"stream_deps": "1"}, TypeError),
        ({"peak_headroom": "0.2"}, TypeError),
        ({"peak_headroom": True}, TypeError),
        ({"peak_headroom": 1.5}, gpumem.InvalidArgumentError),
        ({"peak_headroom": -0.1}, gpumem.InvalidArgumentError),
        ({"peak_headroom": float("nan")}, gpumem.InvalidArgumentError),
        ({"capture_probe": 2}, gpumem.InvalidArgumentError),
        ({"capture_probe": "1"}, TypeError),
        ({"custom_backend": 2**64}, gpumem.InvalidArgumentError),
        ({"custom_backend": 1.0}, TypeError),
        ({"oom_callback": 5}, TypeError),
        ({"log_callback": "print"}, TypeError),
    ],
)
def test_config_values(kwargs, exc):
    args = {"backend": "sim"}
    args.update(kwargs)
    with pytest.raises(exc):
        gpumem.Context(**args)


def test_expandable_keyword():
    """The config field names are the keywords: expandable too (0 = plain segments)."""
    for value in (0, 1, False, True):
        with gpumem.Context(backend="sim", expandable=value, flags=gpumem.CONFIG_NO_ENV) as c:
            with c.alloc(3 * MiB) as b:
                assert b.alive
            st = c.stats()
            assert st["num_allocs"] == 1


def test_stream_deps_keyword():
    """stream_deps is a keyword too; with either value a multi-stream context allocates and frees."""
    for value in (0, 1, False, True):
        with gpumem.Context(backend="sim", stream_deps=value, flags=gpumem.CONFIG_NO_ENV) as c:
            with c.alloc(3 * MiB, stream=0x10) as b, c.alloc(5 * MiB, stream=0x20) as d:
                assert b.alive and d.alive
            assert c.stats()["num_allocs"] == 2


def test_peak_headroom_keyword():
    """peak_headroom: with headroom a freed block's idle memory stays where it is and a larger block
    that does not fit there gets new memory; without, the pool stays at its peak and moves it."""
    held = {}
    for value in (0, 0.0, 1, 1.0):
        with gpumem.Context(backend="sim", expandable=True, peak_headroom=value, trim_free_fraction=0.0,
                            flags=gpumem.CONFIG_NO_ENV) as c:
            a = c.alloc(16 * MiB)
            x = c.alloc(2 * MiB)
            a.free()
            with c.alloc(18 * MiB) as b:
                assert b.alive
                held[value] = c.stats()["reserved_bytes"]
            x.free()
    assert held[0] == held[0.0] == 20 * MiB
    assert held[1] == held[1.0] == 36 * MiB


def test_capture_probe_keyword():
    """capture_probe: on (the default), an allocation on a stream the sim captures, which nobody routed
    to a graph pool, does not get the block freed before on that stream (it is the device pool's: the
    capture gets a pool of its own); off, it does, as the stream's own cached block."""
    lib = gpumem.capi.lib
    begin, end = lib.gpumem_sim_stream_begin_capture, lib.gpumem_sim_stream_end_capture
    begin.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    end.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    s = 0x5000
    same = {}
    for probe in (None, True, 1, False, 0):
        with gpumem.Context(backend="sim", capture_probe=probe, flags=gpumem.CONFIG_NO_ENV) as c:
            before = c.alloc(4 * MiB, stream=s)
            addr = before.ptr
            before.free()
            assert begin(0, s, 0) == 0
            try:
                with c.alloc(4 * MiB, stream=s) as g:
                    same[probe] = g.ptr == addr
            finally:
                inval = ctypes.c_int(-1)
                assert end(0, s, ctypes.byref(inval)) == 0
            assert inval.value == 0
    assert same == {None: False, True: False, 1: False, False: True, 0: True}


def test_release_capture_pools():
    """A capture's own pool stays after the capture (the graph writes its memory at every launch)
    until release_capture_pools(), once the library knows the capture ended (capture_ended(), or a
    call on its stream: it asks about no other stream); bad devices raise."""
    lib = gpumem.capi.lib
    begin, end = lib.gpumem_sim_stream_begin_capture, lib.gpumem_sim_stream_end_capture
    begin.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
    end.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    s = 0x5100
    with gpumem.Context(backend="sim", flags=gpumem.CONFIG_NO_ENV) as c:
        assert begin(0, s, 0) == 0
        c.alloc(4 * MiB, stream=s).free()  # a temporary of the graph
        assert end(0, s, None) == 0
        c.trim()
        assert c.stats()["reserved_bytes"] >= 4 * MiB
        for bad in (99, -7):
            with pytest.raises(gpumem.InvalidDeviceError):
                c.release_capture_pools(bad)
        with pytest.raises(TypeError):
            c.release_capture_pools("0")
        c.release_capture_pools()  # the capture is not known to have ended: its pool stays
        c.trim()
        assert c.stats()["reserved_bytes"] >= 4 * MiB
        for bad in (99, -7):
            with pytest.raises(gpumem.InvalidDeviceError):
                c.capture_ended(s, bad)
        with pytest.raises(gpumem.InvalidDeviceError):
            c.capture_ended(s, gpumem.ALL_DEVICES)  # a stream is of one device
        c.capture_ended(0x5200)  # a stream with no capture: nothing to do
        c.capture_ended(s)
        c.release_capture_pools()
        c.trim()
        assert c.stats()["reserved_bytes"] == 0
        # a capture whose stream is gone: forgotten without asking, for every device
        assert begin(0, s, 0) == 0
        c.alloc(4 * MiB, stream=s).free()
        assert end(0, s, None) == 0
        c.capture_ended(None, gpumem.ALL_DEVICES)
        c.release_capture_pools()
        c.trim()
        assert c.stats()["reserved_bytes"] == 0


def test_sizes_and_keep_bytes(ctx):
    for n in (2**64, -1):
        with pytest.raises(gpumem.InvalidArgumentError):
            ctx.alloc(n)
        with pytest.raises(gpumem.InvalidArgumentError):
            ctx.trim(keep_bytes=n)
    for n in (1.0, "4096", None):
        with pytest.raises(TypeError):
            ctx.alloc(n)
    assert _live(ctx) == 0


def test_tags_must_be_strings(ctx):
    for tag in (5, b"x", ["a"]):
        with pytest.raises(TypeError):
            ctx.alloc(64, tag=tag)
    with ctx.scope() as sc:
        with pytest.raises(TypeError):
            sc.set_tag(7)
        sc.set_tag("fine")
        sc.alloc(64)
    assert _live(ctx) == 0


def test_streams(ctx):
    for s in (1.5, "0", b"\0"):
        with pytest.raises(TypeError):
            ctx.alloc(64, stream=s)
    for s in (-1, 2**64):
        with pytest.raises(gpumem.InvalidArgumentError):
            ctx.alloc(64, stream=s)
    with pytest.raises(TypeError):
        ctx.reset(device=0, reset_device="yes")
    assert _live(ctx) == 0


def test_failed_reset_changes_nothing(ctx):
    """A reset that fails (the device cannot be synchronised) leaves the Buffers alive: their blocks
    are still live in the library. Before, they were marked dead first and never freed."""
    if not is_sim(ctx):
        pytest.skip("fault injection needs the sim")
    from gpumem import sim

    b = ctx.alloc(4096)
    sim.fail_nth(sim.CALL_SYNC, 1)
    try:
        with pytest.raises(gpumem.BackendError):
            ctx.reset(device=0)
    finally:
        sim.fail_clear()
    assert b.alive and ctx.ptr_info(b.ptr) == (4096, 0)
    b.free()
    assert _live(ctx) == 0


def test_sim_controls_check_their_arguments(ctx):
    if not is_sim(ctx):
        pytest.skip("sim controls")
    from gpumem import sim

    for bad in (1.5, "0"):
        with pytest.raises(TypeError):
            sim.used_bytes(bad)
        with pytest.raises(TypeError):
            sim.fail_nth(bad)
    with pytest.raises(gpumem.InvalidDeviceError):
        sim.used_bytes(2**32)  # before: device 0's figure
    with pytest.raises(gpumem.InvalidDeviceError):
        sim.set_external_usage(2**32, 1)
    with pytest.raises(gpumem.InvalidArgumentError):
        sim.set_external_usage(0, 2**64)
    with pytest.raises(gpumem.InvalidArgumentError):
        sim.fail_nth(sim.CALL_MALLOC + 2**32)  # before: a fault armed on malloc
    with pytest.raises(gpumem.InvalidArgumentError):
        sim.fail_nth(sim.CALL_MALLOC, nth=-1)
    with pytest.raises(gpumem.InvalidArgumentError):
        sim.fail_every(sim.CALL_MALLOC, nth=1, every=0)
    with pytest.raises(TypeError):
        sim.fail_every(sim.CALL_MALLOC, every=1.5)
    with ctx.alloc(3 << 20) as b:  # no fault was armed by the refused calls
        assert b.alive
    assert sim.used_bytes(0) >= 0


def test_torch_enable_checks_device_first():
    import gpumem.torch as gt

    with pytest.raises(TypeError):
        gt.enable(device=1.5)  # before anything (PyTorch is not even imported)
    with pytest.raises(gpumem.InvalidDeviceError):
        gt.enable(device=2**32)
