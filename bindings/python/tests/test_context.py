"""Context: creation, configuration fields, devices, lifetime, callbacks."""

from __future__ import annotations

import os
import re
import threading

import pytest

import gpumem
from conftest import MiB, run_python, sim_env


REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, os.pardir)


def test_version_and_constants():
    # one version, written in VERSION: the package, gpumem.h and CMake's project() read it
    with open(os.path.join(REPO, "VERSION")) as f:
        want = f.read().strip()
    assert re.fullmatch(r"\d+\.\d+\.\d+", want)
    assert gpumem.__version__ == want
    with open(os.path.join(REPO, "include", "gpumem.h")) as f:
        header = f.read()
    got = ".".join(re.search(r"#define GPUMEM_VERSION_%s (\d+)" % k, header).group(1) for k in ("MAJOR", "MINOR", "PATCH"))
    assert got == want
    assert gpumem.ALL_DEVICES == -1
    assert gpumem.UNLIMITED == 2**64 - 1


def test_context_manager_closes():
    with gpumem.Context(backend="sim") as c:
        assert not c.closed
        assert isinstance(c.handle, int) and c.handle != 0
    assert c.closed
    with pytest.raises(gpumem.InvalidArgumentError, match="closed"):
        c.stats()
    with pytest.raises(gpumem.InvalidArgumentError):
        c.alloc(16)
    c.close()  # twice is harmless


def test_no_backend_error_says_why():
    # the library's reason (unknown backend, no driver, no device) is in the exception, not only in a log line
    # (CONFIG_NO_ENV: GPUMEM_BACKEND would replace the name asked for)
    with pytest.raises(gpumem.NoBackendError) as ei:
        gpumem.Context(backend="no-such-backend", flags=gpumem.CONFIG_NO_ENV)
    assert "'no-such-backend'" in str(ei.value)
    assert "unknown or not built" in ei.value.message


def test_backend_name(ctx):
    expected = os.environ.get("GPUMEM_BACKEND", "sim")
    assert ctx.backend == expected
    assert "backend=%r" % expected in repr(ctx)


def test_device_count_and_info(ctx):
    n = ctx.device_count
    assert isinstance(n, int) and n >= 1
    info = ctx.device_info(0)
    assert set(info) == {"ordinal", "name", "uuid", "pci_bus_id", "total_bytes", "free_bytes", "physical_index"}
    assert info["ordinal"] == 0
    assert isinstance(info["name"], str) and info["name"]
    assert re.fullmatch(r"GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", info["uuid"]), info["uuid"]
    assert info["total_bytes"] > 0
    assert 0 <= info["free_bytes"] <= info["total_bytes"]
    with pytest.raises(gpumem.InvalidDeviceError):
        ctx.device_info(n)


def test_sim_devices_and_visible_devices_in_subprocess():
    r = run_python(
        """
        import gpumem
        with gpumem.Context(backend="sim") as c:
            infos = [c.device_info(i) for i in range(c.device_count)]
            print(c.device_count, [i["total_bytes"] >> 20 for i in infos], [i["physical_index"] for i in infos])
        """,
        env=sim_env(GPUMEM_SIM_DEVICES="512MiB,256MiB,128MiB", CUDA_VISIBLE_DEVICES="2,0"),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "2 [128, 512] [2, 0]"


def test_release_threshold_default_keeps_cache(ctx):
    buf = ctx.alloc(MiB)
    buf.free()
    st = ctx.stats()
    assert st["num_live"] == 0
    assert st["cached_bytes"] > 0, "with an unlimited release threshold freed memory stays cached"
    assert st["reserved_bytes"] == st["cached_bytes"]


def test_release_threshold_zero_gives_memory_back():
    with gpumem.Context(backend="sim", release_threshold=0) as c:
        buf = c.alloc(MiB)
        assert c.stats()["reserved_bytes"] >= MiB
        buf.free()
        st = c.stats()
        assert st["cached_bytes"] == 0
        assert st["reserved_bytes"] == 0


def test_initial_bytes_preallocates():
    with gpumem.Context(backend="sim", initial_bytes=8 * MiB) as c:
        with c.alloc(256):
            assert c.stats(0)["reserved_bytes"] >= 8 * MiB


def test_limit_fraction():
    with gpumem.Context(backend="sim") as probe:
        total = probe.device_info(0)["total_bytes"]
    with gpumem.Context(backend="sim", limit_fraction=0.001) as c:
        with pytest.raises(gpumem.LimitExceededError):
            c.alloc(int(total * 0.002))
        assert c.stats()["num_limit_exceeded"] == 1


def test_set_limit_caps_and_get_limit(ctx):
    assert ctx.get_limit() == 0  # no cap
    ctx.set_limit(64 * MiB)
    assert ctx.get_limit(0) == 64 * MiB
    with pytest.raises(gpumem.LimitExceededError):
        ctx.alloc(128 * MiB)
    with ctx.alloc(8 * MiB):  # under the cap
        pass
    assert ctx.stats(0)["num_limit_exceeded"] == 1
    ctx.set_limit(0)
    with ctx.alloc(128 * MiB):
        pass
    with pytest.raises(gpumem.InvalidDeviceError):
        ctx.set_limit(MiB, device=ctx.device_count + 5)
    with pytest.raises(gpumem.InvalidDeviceError):
        ctx.get_limit(device=gpumem.ALL_DEVICES)
    with pytest.raises(gpumem.InvalidArgumentError):
        ctx.set_limit(-1)
    with pytest.raises(TypeError):
        ctx.set_limit(1.5)
    assert ctx.get_limit() == 0  # the refused calls changed nothing


def test_limit_fraction_reads_back():
    with gpumem.Context(backend="sim", limit_fraction=0.25, flags=gpumem.CONFIG_NO_ENV) as c:
        total = c.device_info(0)["total_bytes"]
        assert abs(c.get_limit() - total // 4) <= 2 * MiB


def test_largest_free_block(ctx):
    assert ctx.largest_free_block() == 0  # nothing cached yet
    b = ctx.alloc(8 * MiB)
    b.free()
    assert ctx.largest_free_block(0) >= 8 * MiB
    ctx.trim()
    assert ctx.largest_free_block(0) == 0
    with pytest.raises(gpumem.InvalidDeviceError):
        ctx.largest_free_block(device=ctx.device_count + 5)


def test_bad_config_values():
    with pytest.raises(TypeError):
        gpumem.Context(backend="sim", limit_bytes="lots")
    with pytest.raises(gpumem.InvalidArgumentError):
        gpumem.Context(backend="sim", limit_bytes=-1)
    with pytest.raises(ValueError):
        gpumem.Context(backend="sim", log_level="chatty")


def test_log_callback_receives_messages():
    got = []
    lock = threading.Lock()

    def log(level, msg):
        with lock:
            got.append((level, msg))

    with gpumem.Context(backend="sim", log_level="debug", log_callback=log, flags=gpumem.CONFIG_NO_ENV) as c:
        c.alloc(MiB).free()
        c.trim()
    assert got, "debug logging must report pool growth or trimming"
    for level, msg in got:
        assert gpumem.LOG_DEBUG <= level <= gpumem.LOG_ERROR
        assert isinstance(msg, str) and msg


def test_log_level_off_is_silent():
    got = []
    with gpumem.Context(backend="sim", log_level=gpumem.LOG_OFF, log_callback=lambda l, m: got.append(m),
                        flags=gpumem.CONFIG_NO_ENV) as c:
        c.alloc(MiB).free()
        c.trim()
    assert got == []


def test_oom_callback_may_free_and_retry(ctx):
    total = ctx.device_info(0)["total_bytes"]
    held = []
    calls = []

    def on_oom(device, requested):
        calls.append((device, requested))
        if held:
            held.pop().free()
            return True
        return False

    with gpumem.Context(backend="sim", oom_callback=on_oom) as c:
        size = int(total * 0.6) // MiB * MiB
        held.append(c.alloc(size))
        second = c.alloc(size)  # does not fit beside the first: the callback frees it, one retry
        assert calls == [(0, calls[0][1])] and calls[0][1] >= size
        assert second.ptr != 0 and not held
        with pytest.raises(gpumem.OutOfMemoryError):  # nothing left to free: the callback says no
            c.alloc(size)
        assert len(calls) == 2 and calls[1][0] == 0
        assert c.stats()["num_ooms"] == 1
        second.free()


def test_oom_callback_exception_is_reported_not_raised(ctx, monkeypatch):
    total = ctx.device_info(0)["total_bytes"]
    seen = []
    monkeypatch.setattr("sys.unraisablehook", lambda u: seen.append(u.exc_value))

    def bad(device, requested):
        raise RuntimeError("boom")

    with gpumem.Context(backend="sim", oom_callback=bad) as c:
        size = int(total * 0.6) // MiB * MiB
        with c.alloc(size):
            with pytest.raises(gpumem.OutOfMemoryError):
                c.alloc(size)
    assert any(isinstance(e, RuntimeError) and str(e) == "boom" for e in seen)


def test_gc_of_context_destroys_it(monkeypatch):
    import gc

    calls = []
    real = gpumem.capi.lib.gpumem_destroy

    def counting(h, flags):
        calls.append((h, flags))
        return real(h, flags)

    monkeypatch.setattr(gpumem.capi.lib, "gpumem_destroy", counting)
    c = gpumem.Context(backend="sim")
    h = c.handle
    c.alloc(4096)  # dropped at once
    del c
    gc.collect()
    assert calls == [(h, gpumem.capi.DESTROY_FORCE)]


def test_close_with_live_buffers_warns_and_frees():
    c = gpumem.Context(backend="sim")
    b = c.alloc(4096)
    with pytest.warns(ResourceWarning, match="1 live buffer"):
        c.close()
    assert not b.alive
    b.free()  # harmless after close


def test_close_without_force_refuses_when_busy():
    c = gpumem.Context(backend="sim", log_level="off", flags=gpumem.CONFIG_NO_ENV)
    b = c.alloc(4096)
    with pytest.raises(gpumem.BusyError):
        c.close(force=False)
    assert not c.closed
    with c.alloc(64):  # still usable
        pass
    b.free()
    c.close(force=False)
    assert c.closed


def test_env_overrides_config_unless_no_env():
    code = """
        import gpumem
        with gpumem.Context(backend="sim") as c:
            try:
                c.alloc(2 << 20)
                print("allocated")
            except gpumem.LimitExceededError:
                print("limited")
        with gpumem.Context(backend="sim", flags=gpumem.CONFIG_NO_ENV) as c:
            c.alloc(2 << 20).free()
            print("no-env allocated")
    """
    r = run_python(code, env=sim_env(GPUMEM_LIMIT_BYTES=str(1 << 20)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["limited", "no-env", "allocated"]
