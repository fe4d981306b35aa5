"""gpumem.numba, Numba's EMM plug-in.

- Without Numba: the module imports, and using it says what to install.
- With numba-cuda (no GPU needed): the plug-in's logic on a sim context (memalloc and its
  finalizer, out of memory, get_memory_info, reset, defer_cleanup, the backend check).
- With numba-cuda and a CUDA device: NUMBA_CUDA_MEMORY_MANAGER=gpumem.numba and
  numba.cuda.set_memory_manager, kernels on libgpumem memory, IPC handles, each in a
  fresh process (a manager is bound to a Numba context when the context is made).
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import types
from typing import Tuple

import pytest

import gpumem
import gpumem.numba as gnumba
from conftest import GPU_ENV, MiB, need_gpu, run_python

HAVE_NUMBA_CUDA = importlib.util.find_spec("numba") is not None and importlib.util.find_spec("numba.cuda") is not None


@pytest.mark.skipif(HAVE_NUMBA_CUDA, reason="numba-cuda is installed")
def test_numba_missing_gives_clear_import_error():
    with pytest.raises(ImportError, match="numba-cuda"):
        gnumba.enable()
    with pytest.raises(ImportError, match="numba-cuda"):
        gnumba._numba_memory_manager  # noqa: B018 - what NUMBA_CUDA_MEMORY_MANAGER reads
    with pytest.raises(AttributeError):
        gnumba.no_such_name  # noqa: B018


@pytest.fixture
def sim_manager():
    """A manager on a sim context of its own, bound to a stand-in for Numba's context of device 0."""
    if not HAVE_NUMBA_CUDA:
        pytest.skip("numba-cuda is not installed")
    ctx = gpumem.Context(backend="sim", limit_bytes=256 * MiB, release_threshold=None, flags=gpumem.CONFIG_NO_ENV)

    class SimManager(gnumba.GpumemNumbaManager):
        context_factory = staticmethod(lambda: ctx)
        backends = ("sim",)

    numba_ctx = types.SimpleNamespace(device=types.SimpleNamespace(id=0))
    mgr = SimManager(context=numba_ctx)
    mgr.numba_ctx = numba_ctx  # (the manager holds it weakly)
    yield mgr, ctx
    gc.collect()
    ctx.close()


def test_memalloc_and_finalizer(sim_manager):
    mgr, ctx = sim_manager
    assert mgr.interface_version == 1
    mgr.initialize()
    mgr.initialize()  # again: keeps its state
    mp = mgr.memalloc(3 * MiB)
    assert mp.size == 3 * MiB
    addr = gnumba._pointer_value(mp.device_pointer)  # either binding's pointer type
    assert addr % 256 == 0
    st = ctx.stats(0)
    assert st["num_live"] == 1 and st["requested_bytes"] == 3 * MiB
    del mp
    gc.collect()
    assert ctx.stats(0)["num_live"] == 0  # the finalizer freed it
    z = mgr.memalloc(0)
    assert z.size == 0 and ctx.stats(0)["num_allocs"] == 1


def test_memalloc_past_the_limit_raises(sim_manager):
    mgr, ctx = sim_manager
    with pytest.raises((gpumem.OutOfMemoryError, gpumem.LimitExceededError)) as ei:
        mgr.memalloc(1 << 30)
    assert "gpumem.numba" in str(ei.value) and "device 0" in str(ei.value)
    assert ctx.stats(0)["num_live"] == 0


def test_memory_info_counts_the_cache_as_free(sim_manager):
    mgr, ctx = sim_manager
    mp = mgr.memalloc(8 * MiB)
    del mp
    gc.collect()
    info = mgr.get_memory_info()
    dev = ctx.device_info(0)
    cached = ctx.stats(0)["cached_bytes"]
    assert cached >= 8 * MiB
    assert info.total == dev["total_bytes"]
    assert info.free == dev["free_bytes"] + cached


def test_reset_trims_and_defer_cleanup_holds_it_back(sim_manager):
    mgr, ctx = sim_manager
    mgr.reset()  # before initialize: allowed, does nothing
    mp = mgr.memalloc(8 * MiB)
    keep = mgr.memalloc(1 * MiB)
    del mp
    gc.collect()
    cached = ctx.stats(0)["cached_bytes"]
    assert cached >= 8 * MiB
    with mgr.defer_cleanup():
        with mgr.defer_cleanup():
            mgr.reset()
        assert ctx.stats(0)["cached_bytes"] == cached  # held back while a block is active
    # trimmed when the outermost block ended (what shares a granule with the live block stays)
    assert ctx.stats(0)["cached_bytes"] < cached - 6 * MiB
    assert ctx.stats(0)["num_live"] == 1  # live blocks stay valid
    del keep
    gc.collect()
    mgr.reset()
    assert ctx.stats(0)["reserved_bytes"] == 0


def test_wrong_backend_or_device_is_refused():
    if not HAVE_NUMBA_CUDA:
        pytest.skip("numba-cuda is not installed")
    # (CONFIG_NO_ENV: a sim context whatever GPUMEM_BACKEND says, as the check needs)
    with gpumem.Context(backend="sim", flags=gpumem.CONFIG_NO_ENV) as ctx:

        class OnSim(gnumba.GpumemNumbaManager):
            context_factory = staticmethod(lambda: ctx)

        dev0 = types.SimpleNamespace(device=types.SimpleNamespace(id=0))
        with pytest.raises(gpumem.NoBackendError, match="'sim' backend, Numba needs 'cuda'"):
            OnSim(context=dev0).memalloc(1024)

        class FarDevice(OnSim):
            backends = ("sim",)

        dev99 = types.SimpleNamespace(device=types.SimpleNamespace(id=99))
        with pytest.raises(gpumem.InvalidDeviceError, match="device 99"):
            FarDevice(context=dev99).initialize()


# ---------------------------------------------------------------- on a CUDA device

# numba-cuda releases that name np.row_stack (deprecated in NumPy 2.0, since removed) compile no kernel on
# such a NumPy, with or without gpumem (the GPU machine of 2026-12-07: "module 'numpy' has no
# attribute 'row_stack'"). The alias lets the tests' kernels compile there; where NumPy still has
# row_stack it does nothing. The child processes of the IPC tests import numba.cuda too.
NUMPY_ALIAS = """
import numpy as np
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack
"""

# (NUMPY_ALIAS_SRC: the same lines, for the scripts' own child processes)
KERNEL = NUMPY_ALIAS + f"NUMPY_ALIAS_SRC = {NUMPY_ALIAS!r}\n" + """
from numba import cuda

@cuda.jit
def fill(a, v):
    i = cuda.grid(1)
    if i < a.size:
        a[i] = v + i
"""


# The control: the same kernel with Numba's own allocator (no gpumem imported). If numba-cuda
# cannot run it, the tests below could only report that, so they skip with its error.
CONTROL = KERNEL + """
a = cuda.device_array(1 << 16, dtype=np.float32)
fill[(a.size + 255) // 256, 256](a, 2.0)
h = a.copy_to_host()
assert h[0] == 2.0 and h[-1] == 2.0 + (a.size - 1)
print("ok")
"""

@functools.lru_cache(maxsize=None)
def _control_result() -> Tuple[bool, str]:
    """The control's outcome (run once): whether it printed ok, and its last line on stderr."""
    r = run_python(CONTROL, env={"NUMBA_CUDA_MEMORY_MANAGER": None}, timeout=300)
    ok = r.returncode == 0 and r.stdout.strip().endswith("ok")
    return ok, (r.stderr.strip().splitlines() or ["(no output)"])[-1]


def _numba_runs_kernels() -> None:
    """Skip unless numba-cuda runs the control kernel without gpumem."""
    ok, last = _control_result()
    if not ok:
        pytest.skip(f"numba-cuda runs no kernel here even without gpumem: {last}")


def _run(code: str, **env) -> str:
    if not HAVE_NUMBA_CUDA:
        pytest.skip("numba-cuda is not installed")
    need_gpu()
    _numba_runs_kernels()
    e = dict(GPU_ENV)
    e.update(env)
    r = run_python(code, env=e, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("ok"), r.stdout
    return r.stdout


def test_numba_env_variable_routes_allocations():
    _run(KERNEL + """
import gc, gpumem, gpumem.numba
ctx = gpumem.global_context()
n0 = ctx.stats()["num_allocs"]
a = cuda.device_array(1 << 20, dtype=np.float32)
assert type(cuda.current_context().memory_manager).__name__ == "GpumemNumbaManager"
assert ctx.stats()["num_allocs"] == n0 + 1 and ctx.stats()["num_live"] >= 1
fill[(a.size + 255) // 256, 256](a, 3.0)
h = a.copy_to_host()
assert h[0] == 3.0 and h[-1] == 3.0 + (a.size - 1)
info = cuda.current_context().get_memory_info()
assert 0 < info.free <= info.total
live = ctx.stats()["num_live"]
del a
gc.collect()
assert ctx.stats()["num_live"] == live - 1
print("ok")
""", NUMBA_CUDA_MEMORY_MANAGER="gpumem.numba")


def test_numba_set_memory_manager_and_ipc():
    _run(KERNEL + """
import gc, pickle, subprocess, sys, gpumem, gpumem.numba
gpumem.numba.enable()
a = cuda.device_array(4096, dtype=np.float32)
fill[16, 256](a, 1.0)
cuda.synchronize()
try:
    a.get_ipc_handle()
except gpumem.NotSupportedError as e:
    assert "GPUMEM_EXPANDABLE=0" in str(e), e
    print("expandable segment: NotSupportedError as documented")
else:
    # plain segments (GPUMEM_EXPANDABLE=0 in this run): a handle another process opens
    h = a.get_ipc_handle()
    child = NUMPY_ALIAS_SRC + '''
import pickle, sys, numpy as np
from numba import cuda
h = pickle.loads(sys.stdin.buffer.read())
with h as d:
    x = d.copy_to_host()
assert x[5] == 6.0, x[:8]
print("child ok")
'''
    r = subprocess.run([sys.executable, "-c", child], input=pickle.dumps(h), capture_output=True, timeout=120)
    assert r.returncode == 0 and b"child ok" in r.stdout, (r.stdout, r.stderr)
    print("ipc handle opened in another process")
print("ok")
""")


def test_numba_ipc_with_plain_segments():
    out = _run(KERNEL + """
import gpumem.numba
gpumem.numba.enable()
a = cuda.device_array(4096, dtype=np.float32)
fill[16, 256](a, 1.0)
cuda.synchronize()
h = a.get_ipc_handle()
import pickle, subprocess, sys
child = NUMPY_ALIAS_SRC + '''
import pickle, sys
from numba import cuda
h = pickle.loads(sys.stdin.buffer.read())
with h as d:
    x = d.copy_to_host()
assert x[5] == 6.0, x[:8]
print("child ok")
'''
r = subprocess.run([sys.executable, "-c", child], input=pickle.dumps(h), capture_output=True, timeout=120)
assert r.returncode == 0 and b"child ok" in r.stdout, (r.stdout, r.stderr)
print("ok")
""", GPUMEM_EXPANDABLE="0")
    assert "ok" in out
