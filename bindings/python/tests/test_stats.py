"""Statistics, trimming, peaks and reset."""

from __future__ import annotations

import pytest

import gpumem
from conftest import MiB, run_python, sim_env

FIELDS = [
    "allocated_bytes", "allocated_peak", "reserved_bytes", "reserved_peak", "cached_bytes",
    "num_allocs", "num_frees", "num_live", "num_segments", "num_backend_allocs", "num_backend_frees",
    "num_trims", "trimmed_bytes", "num_oom_retries", "num_ooms", "requested_bytes", "num_limit_exceeded",
    "num_share_asks", "num_share_asked", "share_given_bytes",
]


def test_stats_keys_match_header(ctx):
    st = ctx.stats()
    assert list(st) == FIELDS
    assert all(isinstance(v, int) and v == 0 for v in st.values())
    assert ctx.stats(0) == st


def test_stats_track_allocations(ctx):
    sizes = [1000, 4096, 3 * MiB]
    bufs = [ctx.alloc(s) for s in sizes]
    st = ctx.stats(0)
    assert st["num_allocs"] == 3 and st["num_live"] == 3 and st["num_frees"] == 0
    assert st["requested_bytes"] == sum(sizes)
    assert st["allocated_bytes"] >= sum(sizes)
    assert st["reserved_bytes"] >= st["allocated_bytes"]
    assert st["cached_bytes"] == st["reserved_bytes"] - st["allocated_bytes"]
    assert st["allocated_peak"] == st["allocated_bytes"]
    assert st["reserved_peak"] >= st["reserved_bytes"]
    assert st["num_segments"] >= 1 and st["num_backend_allocs"] >= st["num_segments"]
    peak = st["allocated_peak"]
    for b in bufs:
        b.free()
    st = ctx.stats(0)
    assert st["num_frees"] == 3 and st["num_live"] == 0
    assert st["allocated_bytes"] == 0 and st["requested_bytes"] == 0
    assert st["allocated_peak"] == peak
    ctx.reset_peak_stats()
    assert ctx.stats()["allocated_peak"] == 0


def test_trim_gives_cached_memory_back(ctx):
    bufs = [ctx.alloc(2 * MiB) for _ in range(4)]
    for b in bufs:
        b.free()
    before = ctx.stats()
    assert before["cached_bytes"] > 0
    released = ctx.trim()
    assert released == before["cached_bytes"]
    st = ctx.stats()
    assert st["cached_bytes"] == 0 and st["reserved_bytes"] == 0
    assert st["num_trims"] == before["num_trims"] + 1
    assert st["trimmed_bytes"] == before["trimmed_bytes"] + released
    assert ctx.trim() == 0


def test_trim_keeps_live_and_keep_bytes(ctx):
    live = ctx.alloc(MiB)
    for b in [ctx.alloc(4 * MiB) for _ in range(4)]:
        b.free()
    cached = ctx.stats()["cached_bytes"]
    released = ctx.trim(device=0, keep_bytes=cached)
    assert released == 0
    ctx.trim(device=0, keep_bytes=0)
    st = ctx.stats()
    assert st["num_live"] == 1 and st["allocated_bytes"] >= MiB
    assert st["cached_bytes"] < cached
    live.free()


def test_trim_shows_in_sim_used_bytes(sim_ctx):
    bufs = [sim_ctx.alloc(8 * MiB) for _ in range(2)]
    for b in bufs:
        b.free()
    used = gpumem.sim.used_bytes(0)
    released = sim_ctx.trim()
    assert released > 0
    assert gpumem.sim.used_bytes(0) == used - released


def test_stats_sum_over_devices_subprocess():
    r = run_python(
        """
        import gpumem
        with gpumem.Context(backend="sim") as c:
            a = c.alloc(1 << 20, device=0)
            b = c.alloc(3 << 20, device=1)
            s0, s1, sa = c.stats(0), c.stats(1), c.stats(gpumem.ALL_DEVICES)
            add = ["allocated_bytes", "reserved_bytes", "cached_bytes", "num_allocs", "num_live",
                   "requested_bytes", "num_segments"]
            print(all(sa[k] == s0[k] + s1[k] for k in add), s0["requested_bytes"], s1["requested_bytes"])
            released = c.trim(device=1)
            print(c.stats(0)["num_live"], c.stats(1)["num_live"])
            c.reset(1)
            print(a.alive, b.alive, c.stats(0)["num_live"], c.stats(1)["reserved_bytes"])
            a.free()
        """,
        env=sim_env(GPUMEM_SIM_DEVICES="2x1GiB"),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:3] == ["True 1048576 3145728", "1 1", "True False 1 0"]


def test_binding_fields_match_the_c_list(ctx):
    """capi.Stats (and so Context.stats) has the fields of the C library's list, in its order.

    gpumem_stats_format's JSON keys come from the one list of the C library (src/stats_fields.h,
    checked against gpumem.h at build time), so a field added on one side only fails here.
    """
    import ctypes
    import json

    from gpumem import capi

    fn = capi.lib.gpumem_stats_format
    needed = ctypes.c_size_t(0)
    handle = ctypes.c_void_p(ctx._state.handle)
    st = fn(handle, ctypes.c_int(0), ctypes.c_int(0), None, ctypes.c_size_t(0), ctypes.byref(needed))
    assert st == 0 and needed.value > 0
    buf = ctypes.create_string_buffer(needed.value + 256)
    st = fn(handle, ctypes.c_int(0), ctypes.c_int(0), buf, ctypes.c_size_t(len(buf)), ctypes.byref(needed))
    assert st == 0
    keys = [k for k in json.loads(buf.value.decode()) if k not in ("backend", "device")]
    assert tuple(keys) == capi.STATS_FIELDS
    assert [n for n, _ in capi.Stats._fields_[:2]] == ["struct_size", "reserved_"]
    assert ctypes.sizeof(capi.Stats) == 8 + 8 * len(keys)


def test_stats_text_json_matches_stats(ctx):
    import json

    b = ctx.alloc(3 * MiB)
    one = json.loads(ctx.stats_text("json", device=0))
    assert one["device"] == 0 and one["backend"] == ctx.backend
    st = ctx.stats(0)
    for name in ("allocated_bytes", "reserved_bytes", "num_live", "num_allocs"):
        assert one[name] == st[name]
    every = json.loads(ctx.stats_text())  # ALL_DEVICES: one entry per device with a pool, and the sum
    assert every["total"]["allocated_bytes"] == ctx.stats()["allocated_bytes"]
    assert [d["device"] for d in every["devices"]] == [0]
    b.free()


def test_stats_text_prometheus(ctx):
    b = ctx.alloc(3 * MiB)
    text = ctx.stats_text("prometheus", device=0)
    n = ctx.stats(0)["allocated_bytes"]
    assert "# TYPE gpumem_allocated_bytes gauge" in text
    assert 'gpumem_allocated_bytes{backend="%s",device="0"} %d' % (ctx.backend, n) in text
    assert "# TYPE gpumem_num_allocs_total counter" in text
    b.free()


def test_stats_text_rejects_bad_arguments(ctx):
    with pytest.raises(gpumem.InvalidArgumentError):
        ctx.stats_text("xml")
    with pytest.raises(TypeError):
        ctx.stats_text(1)
    with pytest.raises(gpumem.InvalidDeviceError):
        ctx.stats_text("json", device=ctx.device_count + 5)
    with pytest.raises(gpumem.InvalidDeviceError):
        ctx.stats_text("json", device=-7)
