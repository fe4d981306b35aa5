"""gpumem.cupy's C allocator (gpumem_cupy_malloc/free under CuPy's CFunctionAllocator).

The first test needs no CuPy: it calls the entry points as CuPy does (holding the
GIL, then looking for a raised exception), through ctypes, with a Python stand-in
for CuPy's current-stream function. The others need CuPy and a CUDA device and
run in a fresh process each; they are skipped cleanly elsewhere.
"""

from __future__ import annotations

import ctypes
import importlib.util
import types
import weakref

import pytest

import gpumem
import gpumem.cupy as gcupy
from conftest import GPU_ENV, MiB, need_gpu, run_python

HAVE_CUPY = importlib.util.find_spec("cupy") is not None

# CuPy's calls: with the GIL held, and a pending Python exception raised after the call
# (Cython's "except *" on _call_malloc); PYFUNCTYPE does the same.
MALLOC = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
FREE = ctypes.PYFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
STREAM_OF = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int)


def _entry_points():
    if getattr(gpumem.capi.lib.gpumem_cupy_malloc, "argtypes", None) is None:
        pytest.skip("library without gpumem_cupy_malloc")
    return (MALLOC(ctypes.cast(gpumem.capi.lib.gpumem_cupy_malloc, ctypes.c_void_p).value),
            FREE(ctypes.cast(gpumem.capi.lib.gpumem_cupy_free, ctypes.c_void_p).value))


def test_c_entry_points_allocate_on_the_stream_and_raise_python_errors(monkeypatch):
    malloc, free = _entry_points()
    current = {"stream": 0xA0, "devices": []}

    def stream_of(device):
        current["devices"].append(device)
        return current["stream"]

    stream_cb = STREAM_OF(stream_of)
    raised = []

    class StandIn(gpumem.OutOfMemoryError):  # what out_of_memory_error() gives when CuPy is there
        def __init__(self, size, total, status, name, message):
            super().__init__(status, name, message)
            self.size, self.total = size, total
            raised.append(self)

    monkeypatch.setattr(gcupy, "out_of_memory_error", lambda: StandIn)

    class StreamObject:  # what CuPy's Stream is to the library: an object it holds
        pass

    held = []  # weak references to what on_stream handed out

    def stream_owner(device, ptr):
        o = StreamObject()
        held.append((device, ptr, weakref.ref(o)))
        return o

    monkeypatch.setattr(gcupy, "_stream_owner", stream_owner)
    # the sim whatever GPUMEM_BACKEND says: the stand-in streams (0xA0) are no real device's streams,
    # and a CUDA call naming one reads memory that is not a stream
    with gpumem.Context(backend="sim", limit_bytes=64 * MiB, flags=gpumem.CONFIG_NO_ENV) as ctx:
        owner = gcupy._CAllocator(ctx, ctypes.cast(stream_cb, ctypes.c_void_p).value)
        param = ctypes.addressof(owner.param)
        p = malloc(param, 4096, 0)
        assert p and current["devices"] == [0]
        assert ctx.stats()["num_live"] == 1
        # the stream's object is held while memory allocated on it lives; after the last free it is
        # parked (the next allocation on that stream asks for nothing) until release_streams()
        p2 = malloc(param, 8192, 0)
        assert [(d, s) for d, s, _ in held] == [(0, 0xA0)] and held[0][2]() is not None
        free(param, p, 0)
        assert held[0][2]() is not None
        free(param, p2, 0)
        assert held[0][2]() is not None
        free(param, malloc(param, 4096, 0), 0)
        assert len(held) == 1
        assert gcupy.release_streams() == 1
        assert held[0][2]() is None
        assert gcupy.release_streams() == 0
        assert ctx.stats()["num_live"] == 0
        current["stream"] = 0  # the default stream: nothing held
        free(param, malloc(param, 4096, 0), 0)
        assert len(held) == 1
        current["stream"] = 0xA0
        with gpumem.Context(backend="sim", flags=gpumem.CONFIG_NO_ENV) as other:  # another context's pointer: ignored
            q = other.alloc(256)
            free(param, q.ptr, 0)
            assert ctx.stats()["num_frees"] == 4
            q.free()

        with pytest.raises(StandIn) as ei:
            malloc(param, 128 * MiB, 0)
        assert isinstance(ei.value, gpumem.OutOfMemoryError)
        assert ei.value.size == 128 * MiB and ei.value.status == gpumem.LimitExceededError.STATUS
        assert len(raised) == 1
        with pytest.raises(gpumem.InvalidDeviceError):
            malloc(param, 4096, 77)

        def failing_stream_of(device):  # -1: CuPy's function raised; here a ctypes callback cannot
            return -1

        cb2 = STREAM_OF(failing_stream_of)
        owner2 = gcupy._CAllocator(ctx, ctypes.cast(cb2, ctypes.c_void_p).value)
        assert malloc(ctypes.addressof(owner2.param), 4096, 0) is None
        assert ctx.stats()["num_live"] == 0
        # the failed allocations on 0xA0 left its hold parked (process-wide): let go of it here
        assert gcupy.release_streams() == 1
        assert all(ref() is None for _, _, ref in held)


def test_release_streams_with_nothing_parked_and_with_an_older_library(monkeypatch):
    """release_streams() with nothing parked lets go of nothing; with a library that lacks
    gpumem_cupy_release_streams (one from before parking, which holds no stream past its memory)
    it returns 0 instead of raising, so disable() works with it."""
    assert gcupy.release_streams() == 0
    real = gpumem.capi.lib

    class Older:
        def __getattr__(self, name):
            if name == "gpumem_cupy_release_streams":
                raise AttributeError(name)
            return getattr(real, name)

    monkeypatch.setattr(gcupy, "_release", None)
    monkeypatch.setattr(gpumem.capi, "lib", Older())
    assert gcupy.release_streams() == 0
    assert not gcupy._has("gpumem_cupy_release_streams") and gcupy._has("gpumem_cupy_malloc")


def _run(code: str) -> None:
    need_gpu()
    r = run_python(code, env=GPU_ENV, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("ok"), r.stdout


@pytest.mark.skipif(not HAVE_CUPY, reason="CuPy is not installed")
def test_cupy_takes_the_c_path():
    _run(
        """
        import cupy, gpumem, gpumem.cupy
        assert gpumem.cupy.c_allocator_available(), "CuPy's get_stream_ptr or gpumem_cupy_malloc missing"
        f = gpumem.cupy.allocator()
        assert isinstance(f.c_allocator, cupy.cuda.memory.CFunctionAllocator), f
        # a context of your own gets the Python allocator: closing it stays safe
        with gpumem.Context(backend="cuda") as own:
            g = gpumem.cupy.allocator(own)
            assert not hasattr(g, "c_allocator"), g
            with cupy.cuda.using_allocator(g):
                a = cupy.arange(1000)
                assert int(a.sum()) == 499500
            assert own.stats()["num_live"] == 1
        del a  # its Buffer died with the context: nothing is freed twice
        print("ok")
        """
    )


@pytest.mark.skipif(not HAVE_CUPY, reason="CuPy is not installed")
def test_cupy_arrays_outlive_their_stream():
    """Arrays allocated on a Stream that is dropped before them (CuPy destroys a stream with its
    object) are freed on it later without a crash, on the C path and on the Python path: the
    library holds the Stream while memory allocated on it lives (a free naming a destroyed
    stream crashes in CUDA)."""
    _run(
        """
        import gc, weakref, cupy, gpumem, gpumem.cupy
        def on_a_stream_of_its_own(n):
            s = cupy.cuda.Stream(non_blocking=True)
            with s:
                a = [cupy.full(n, 3, dtype=cupy.float32) for _ in range(3)]
            return a, weakref.ref(s)
        for path in ("c", "python"):
            own = None
            if path == "c":
                gpumem.cupy.enable()
            else:
                gpumem.cupy.disable()
                own = gpumem.Context(backend="cuda")
                cupy.cuda.set_allocator(gpumem.cupy.allocator(own))
            arrays, sref = on_a_stream_of_its_own(1 << 22)  # 16 MiB each: past the thread caches
            gc.collect()
            assert sref() is not None, "the stream went while its memory lives"
            assert all(int((x != 3).sum()) == 0 for x in arrays)
            del arrays
            gc.collect()
            if path == "c":  # (the C path parks the hold after the last free, until released)
                assert sref() is not None
                assert gpumem.cupy.release_streams() == 1
            assert sref() is None, "the stream outlived its memory"
            b = cupy.ones(1 << 22, dtype=cupy.float32)  # later calls, on another stream
            assert float(b.sum()) == float(1 << 22)
            del b
            cupy.cuda.set_allocator(None)
            if own is not None:
                own.close()
        print("ok")
        """
    )


@pytest.mark.skipif(not HAVE_CUPY, reason="CuPy is not installed")
def test_cupy_current_device_and_stream_are_honoured(tmp_path):
    trace = tmp_path / "cupy.trace"
    _run(
        """
        import cupy as cp, gpumem, gpumem.cupy
        gpumem.cupy.enable()
        ctx = gpumem.cupy.context()
        assert gpumem.capi.lib.gpumem_trace_start(ctx.handle, %r.encode()) == 0
        a = cp.empty(1000, dtype=cp.uint8)
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            b = cp.empty(3000, dtype=cp.uint8)
            b[:] = 7
        c = cp.empty(5000, dtype=cp.uint8)
        size, dev = 0, None
        assert ctx.stats()["num_live"] >= 3
        s.synchronize()
        assert int(b.sum()) == 7 * 3000
        del a, b, c
        cp.cuda.Device().synchronize()
        assert gpumem.capi.lib.gpumem_trace_stop(ctx.handle) == 0
        ev = [l.split() for l in open(%r) if l.startswith("a ")]
        by_size = {int(e[2]): e for e in ev}
        assert int(by_size[1000][3]) == cp.cuda.get_current_stream().ptr, by_size[1000]
        assert int(by_size[3000][3]) == s.ptr != 0, (by_size[3000], s.ptr)
        assert int(by_size[5000][3]) == cp.cuda.get_current_stream().ptr
        assert all(len(e) == 4 or e[4] == str(cp.cuda.Device().id) for e in ev)
        print("ok")
        """ % (str(trace), str(trace))
    )


@pytest.mark.skipif(not HAVE_CUPY, reason="CuPy is not installed")
def test_cupy_out_of_memory_is_cupys_and_gpumems():
    _run(
        """
        import cupy as cp, gpumem, gpumem.cupy
        gpumem.cupy.enable()
        try:
            cp.empty(1 << 50, dtype=cp.uint8)
        except cp.cuda.memory.OutOfMemoryError as e:
            assert isinstance(e, gpumem.OutOfMemoryError), type(e).__mro__
            assert type(e) is gpumem.cupy.OutOfMemoryError
            assert e.status in (gpumem.OutOfMemoryError.STATUS, gpumem.LimitExceededError.STATUS)
            assert "Out of memory allocating" in str(e)
        else:
            raise AssertionError("no OutOfMemoryError")
        x = cp.ones(10)  # the allocator still works
        assert float(x.sum()) == 10.0
        gpumem.cupy.disable()
        print("ok")
        """
    )


def test_cupys_stream_function_is_found_through_its_capsule(monkeypatch):
    # what CuPy exports: cupy_backends.cuda.stream.__pyx_capi__["get_stream_ptr"], a capsule named
    # after the C signature; here a stand-in module whose function returns stream 0xB0
    import sys

    new_capsule = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
        ("PyCapsule_New", ctypes.pythonapi))
    seen = []

    def get_stream_ptr(device):
        seen.append(device)
        return 0xB0

    fn = STREAM_OF(get_stream_ptr)
    names = {}

    def install(sig):
        names[sig] = ctypes.create_string_buffer(sig)  # the capsule keeps a pointer to its name
        mod = types.ModuleType("cupy_backends.cuda.stream")
        mod.__pyx_capi__ = {"get_stream_ptr": new_capsule(ctypes.cast(fn, ctypes.c_void_p), names[sig], None)}
        for name in ("cupy_backends", "cupy_backends.cuda"):
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setitem(sys.modules, "cupy_backends.cuda.stream", mod)
        sys.modules["cupy_backends.cuda"].stream = mod

    install(b"intptr_t (int)")
    addr = gcupy._stream_function()
    assert addr == ctypes.cast(fn, ctypes.c_void_p).value
    malloc, free = _entry_points()
    monkeypatch.setattr(gcupy, "_stream_owner", lambda device, ptr: None)  # (no CuPy: nothing to hold)
    with gpumem.Context(backend="sim", flags=gpumem.CONFIG_NO_ENV) as ctx:  # stand-in streams: the sim only
        owner = gcupy._CAllocator(ctx, addr)
        p = malloc(ctypes.addressof(owner.param), 4096, 0)
        assert p and seen == [0]
        free(ctypes.addressof(owner.param), p, 0)
        assert ctx.stats()["num_live"] == 0
    install(b"intptr_t (void)")  # another signature: not called with an int
    assert gcupy._stream_function() is None
