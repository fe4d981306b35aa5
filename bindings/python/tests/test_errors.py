"""Every status maps to its exception class, and each class is reachable from the library."""

from __future__ import annotations

import ctypes
import os
import pickle

import pytest

import gpumem
from gpumem import capi
from gpumem.errors import error_class, make_error
from conftest import MiB, run_python, sim_env

CLASSES = {
    "ERR_INVALID_ARGUMENT": gpumem.InvalidArgumentError,
    "ERR_INVALID_DEVICE": gpumem.InvalidDeviceError,
    "ERR_INVALID_POINTER": gpumem.InvalidPointerError,
    "ERR_OUT_OF_MEMORY": gpumem.OutOfMemoryError,
    "ERR_LIMIT_EXCEEDED": gpumem.LimitExceededError,
    "ERR_BUSY": gpumem.BusyError,
    "ERR_NO_BACKEND": gpumem.NoBackendError,
    "ERR_BACKEND": gpumem.BackendError,
    "ERR_NOT_SUPPORTED": gpumem.NotSupportedError,
    "ERR_INTERNAL": gpumem.InternalError,
}


@pytest.mark.parametrize("key", sorted(CLASSES))
def test_status_mapping(key):
    code = capi.STATUS[key]
    err = make_error(code)
    assert type(err) is CLASSES[key] and error_class(code) is CLASSES[key]
    assert isinstance(err, gpumem.GpumemError)
    assert err.status == code
    assert err.name == "GPUMEM_" + key == capi.status_name(code)
    assert err.message == capi.strerror(code) and err.message
    assert err.name in str(err)
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is type(err) and (again.status, again.name, again.message) == (code, err.name, err.message)


def test_status_names_cover_the_header():
    assert capi.status_name(0) == "GPUMEM_OK"
    assert capi.status_name(len(capi.STATUS)) == "GPUMEM_UNKNOWN_STATUS"
    assert type(make_error(12345)) is gpumem.GpumemError


def test_builtin_exception_bases():
    assert issubclass(gpumem.OutOfMemoryError, MemoryError)
    assert issubclass(gpumem.InvalidArgumentError, ValueError)
    assert issubclass(gpumem.AllocatorInUseError, gpumem.BusyError)
    assert issubclass(gpumem.LibraryNotFoundError, ImportError)


def test_invalid_pointer(ctx):
    with pytest.raises(gpumem.InvalidPointerError) as ei:
        ctx.free(0x12345600)
    assert ei.value.status == capi.STATUS["ERR_INVALID_POINTER"]
    with ctx.alloc(4096) as buf:
        with pytest.raises(gpumem.InvalidPointerError):
            ctx.free(buf.ptr + 256)  # interior pointer
    assert capi.lib.gpumem_free(ctx.handle, 0xDEAD00, None) == capi.STATUS["ERR_INVALID_POINTER"]


def test_invalid_pointer_from_another_context(ctx):
    with gpumem.Context(backend="sim") as other:
        with other.alloc(64) as buf:
            with pytest.raises(gpumem.InvalidPointerError):
                ctx.free(buf.ptr)


def test_limit_exceeded():
    with gpumem.Context(backend="sim", limit_bytes=8 * MiB) as c:
        with pytest.raises(gpumem.LimitExceededError) as ei:
            c.alloc(16 * MiB)
        assert ei.value.name == "GPUMEM_ERR_LIMIT_EXCEEDED"
        st = c.stats()
        assert st["num_limit_exceeded"] == 1 and st["reserved_bytes"] <= 8 * MiB


def test_out_of_memory_tiny_device_subprocess():
    r = run_python(
        """
        import gpumem
        with gpumem.Context(backend="sim") as c:
            assert c.device_info(0)["total_bytes"] == 64 << 20
            try:
                c.alloc(128 << 20)
            except gpumem.OutOfMemoryError as e:
                print(type(e).__name__, isinstance(e, MemoryError), e.name, c.stats()["num_ooms"])
        """,
        env=sim_env(GPUMEM_SIM_DEVICES="64MiB"),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "OutOfMemoryError True GPUMEM_ERR_OUT_OF_MEMORY 1"


def test_out_of_memory_injected(sim_ctx, sim_faults):
    sim_faults.fail_nth(sim_faults.CALL_MALLOC, 1, sim_faults.ERR_OUT_OF_MEMORY, repeat=True)
    with pytest.raises(gpumem.OutOfMemoryError):
        sim_ctx.alloc(MiB)
    assert sim_ctx.stats()["num_live"] == 0


def test_backend_error_keeps_raw_code(sim_ctx, sim_faults):
    sim_faults.fail_nth(sim_faults.CALL_MALLOC, 1, sim_faults.ERR_INJECTED, repeat=True)
    with pytest.raises(gpumem.BackendError) as ei:
        sim_ctx.alloc(MiB)
    assert ei.value.backend_code == sim_faults.ERR_INJECTED
    assert "999" in str(ei.value)


def test_intermittent_backend_failures(sim_faults):
    """fail_every: every other device allocation fails, the ones between succeed; nothing is lost."""
    c = gpumem.Context(backend="sim", expandable=False, flags=gpumem.CONFIG_NO_ENV)  # one device allocation a segment
    try:
        sim_faults.fail_every(sim_faults.CALL_MALLOC, nth=2, every=2, error=sim_faults.ERR_INJECTED)
        outcomes = []
        kept = []
        for i in range(6):
            try:
                kept.append(c.alloc((64 + i) * MiB))  # each a segment of its own
                outcomes.append("ok")
            except gpumem.BackendError as e:
                assert e.backend_code == sim_faults.ERR_INJECTED
                outcomes.append("failed")
        sim_faults.fail_clear()
        assert outcomes == ["ok", "failed"] * 3
        assert c.stats()["num_live"] == 3
        for b in kept:
            b.free()
        assert c.stats()["num_live"] == 0
    finally:
        c.close()


def test_no_backend_unknown_name():
    with pytest.raises(gpumem.NoBackendError):
        gpumem.Context(backend="no-such-backend", flags=gpumem.CONFIG_NO_ENV)


@pytest.mark.skipif(os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd"), reason="this machine has a GPU")
@pytest.mark.parametrize("name", ["cuda", "hip"])
def test_no_backend_without_gpu(name):
    with pytest.raises(gpumem.NoBackendError):
        gpumem.Context(backend=name, flags=gpumem.CONFIG_NO_ENV)


def test_no_backend_no_visible_device_subprocess():
    r = run_python(
        """
        import gpumem
        try:
            gpumem.Context(backend="sim")
        except gpumem.NoBackendError as e:
            print("NoBackendError", e.status)
        """,
        env=sim_env(CUDA_VISIBLE_DEVICES="-1"),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "NoBackendError 7"


def test_invalid_device(ctx):
    with pytest.raises(gpumem.InvalidDeviceError):
        ctx.alloc(64, device=ctx.device_count)
    with pytest.raises(gpumem.InvalidDeviceError):
        ctx.stats(device=ctx.device_count + 3)
    with pytest.raises(gpumem.InvalidDeviceError):
        ctx.trim(device=ctx.device_count)


def test_invalid_argument_low_level(ctx):
    assert capi.lib.gpumem_alloc(ctx.handle, 0, 64, None, None) == capi.STATUS["ERR_INVALID_ARGUMENT"]
    assert capi.lib.gpumem_create(None, None) == capi.STATUS["ERR_INVALID_ARGUMENT"]
    bad = capi.Config()
    capi.lib.gpumem_config_init(ctypes.byref(bad))
    bad.struct_size = 3
    out = ctypes.c_void_p()
    assert capi.lib.gpumem_create(ctypes.byref(bad), ctypes.byref(out)) == capi.STATUS["ERR_INVALID_ARGUMENT"]


def test_invalid_argument_bad_sim_env_subprocess():
    r = run_python(
        """
        import gpumem
        try:
            gpumem.Context(backend="sim")
        except gpumem.InvalidArgumentError as e:
            print("InvalidArgumentError", isinstance(e, ValueError))
        """,
        env=sim_env(GPUMEM_SIM_DEVICES="lots-of-memory"),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "InvalidArgumentError True"


def test_busy_low_level_destroy(ctx):
    buf = ctx.alloc(4096)
    assert capi.lib.gpumem_destroy(ctx.handle, 0) == capi.STATUS["ERR_BUSY"]
    with pytest.raises(gpumem.BusyError):
        ctx.close(force=False)
    assert not ctx.closed and buf.alive  # the context stays usable
    buf.free()


def test_backend_struct_is_the_whole_vtable():
    # the core copies struct_size bytes of a custom backend: the Python struct must hold them all
    vt = capi.builtin_backend("sim")
    if vt is None:
        pytest.skip("library without gpumem_builtin_backend")
    assert vt.struct_size == ctypes.sizeof(capi.Backend)


def test_not_supported_device_reset_on_backend_without_it():
    vt = capi.builtin_backend("sim")
    if vt is None:
        pytest.skip("library without gpumem_builtin_backend")
    vt.device_reset = None
    vt.name = b"sim-without-reset"
    with gpumem.Context(custom_backend=vt, flags=gpumem.CONFIG_NO_ENV) as c:
        assert c.backend == "sim-without-reset"
        with pytest.raises(gpumem.NotSupportedError):
            c.reset(0, reset_device=True)
        c.reset(0)  # a plain reset needs no device reset


def test_device_reset_on_sim_subprocess():
    r = run_python(
        """
        import gpumem
        with gpumem.Context(backend="sim") as c:
            b = c.alloc(1 << 20)
            c.reset(0, reset_device=True)
            print(b.alive, c.stats(0)["reserved_bytes"], gpumem.sim.used_bytes(0))
        """,
        env=sim_env(),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False 0 0"


def test_closed_context_is_invalid_argument():
    c = gpumem.Context(backend="sim")
    c.close()
    with pytest.raises(gpumem.InvalidArgumentError):
        c.trim()
    with pytest.raises(gpumem.InvalidArgumentError):
        _ = c.device_count
