"""PyTorch and CuPy plug-ins.

Without PyTorch/CuPy only the clear ImportError is checked. With them and a
CUDA device (and a libgpumem built with the CUDA backend) the plug-ins run
for real, each in a fresh process: PyTorch's allocator can be swapped only
before its first CUDA allocation.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

import gpumem
from conftest import GPU_ENV, need_gpu, run_python

HAVE_TORCH = importlib.util.find_spec("torch") is not None
HAVE_CUPY = importlib.util.find_spec("cupy") is not None




# ---------------------------------------------------------------- missing frameworks


@pytest.mark.skipif(HAVE_TORCH, reason="PyTorch is installed")
def test_torch_missing_gives_clear_import_error():
    import gpumem.torch

    with pytest.raises(ImportError, match="needs PyTorch"):
        gpumem.torch.enable()


@pytest.mark.skipif(HAVE_CUPY, reason="CuPy is installed")
def test_cupy_missing_gives_clear_import_error():
    import gpumem.cupy

    with pytest.raises(ImportError, match="needs CuPy"):
        gpumem.cupy.enable()


def test_plugin_modules_import_without_frameworks():
    r = run_python("import sys, gpumem.torch, gpumem.cupy; print('torch' in sys.modules, 'cupy' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False False"  # imported lazily


# ---------------------------------------------------------------- PyTorch on a GPU


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed")
def test_torch_enable_routes_allocations():
    need_gpu()
    r = run_python(
        """
        import torch, gpumem, gpumem.torch
        gpumem.torch.enable(device=0)
        ctx = gpumem.torch.context()
        assert ctx.backend == "cuda", ctx.backend
        w = torch.randn(64, 64, device="cuda"); (w @ w).sum().item()  # warm up: cuBLAS workspace stays live
        del w
        torch.cuda.synchronize()
        base = ctx.stats(0)["num_live"]
        x = torch.randn(1024, 1024, device="cuda")
        y = x @ x
        torch.cuda.synchronize()
        st = ctx.stats(0)
        assert st["num_live"] >= base + 2 and st["allocated_bytes"] >= 2 * 4 * 1024 * 1024, st
        ref = (x.cpu().double() @ x.cpu().double()).float()
        assert torch.allclose(y.cpu(), ref, rtol=1e-3, atol=1e-2)
        del x, y, ref
        torch.cuda.synchronize()
        assert ctx.stats(0)["num_live"] == base, (base, ctx.stats(0))
        cached = ctx.stats(0)["cached_bytes"]
        released = ctx.trim()
        assert cached > 0 and released > 0, (cached, released)
        ctx.close()  # does nothing for the process-wide context
        z = torch.ones(10, device="cuda")
        assert float(z.sum()) == 10.0
        gpumem.torch.enable()  # idempotent
        print("ok", gpumem.torch.is_enabled())
        """,
        env=GPU_ENV,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("ok True")


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed")
def test_torch_enable_too_late():
    need_gpu()
    r = run_python(
        """
        import torch, gpumem, gpumem.torch
        x = torch.zeros(16, device="cuda")
        try:
            gpumem.torch.enable()
        except gpumem.AllocatorInUseError as e:
            print("refused", isinstance(e, gpumem.BusyError), "before" in str(e))
        """,
        env=GPU_ENV,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "refused True True"


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed")
def test_torch_reads_buffer_through_cai():
    need_gpu()
    r = run_python(
        """
        import torch, gpumem
        with gpumem.Context(backend="cuda") as ctx:
            with ctx.alloc(4096) as buf:
                t = torch.as_tensor(buf, device="cuda")
                assert t.dtype == torch.uint8 and t.shape == (4096,) and t.data_ptr() == buf.ptr
                t.fill_(7)
                assert int(t.sum()) == 7 * 4096
                torch.cuda.synchronize()
                del t
        print("ok")
        """,
        env=GPU_ENV,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok"


# ---------------------------------------------------------------- CuPy on a GPU


@pytest.mark.skipif(not HAVE_CUPY, reason="CuPy is not installed")
def test_cupy_enable_routes_allocations():
    need_gpu()
    r = run_python(
        """
        import numpy as np, cupy as cp, gpumem, gpumem.cupy
        gpumem.cupy.enable()
        ctx = gpumem.cupy.context()
        w = cp.ones((64, 64)); float((w @ w).sum()); del w  # warm up handles and workspaces
        cp.cuda.Device().synchronize()
        base = ctx.stats()["num_live"]
        rng = np.random.default_rng(0)
        a = rng.standard_normal((512, 256)); b = rng.standard_normal((256, 128))
        da, db = cp.asarray(a), cp.asarray(b)
        dc = da @ db
        assert np.allclose(cp.asnumpy(dc), a @ b, rtol=1e-10, atol=1e-10)
        assert np.isclose(float(da.sum()), a.sum()) and np.isclose(float(da.max()), a.max())
        st = ctx.stats()
        assert st["num_live"] >= base + 3, (base, st)
        s = cp.cuda.Stream(non_blocking=True)
        with s:
            e = cp.arange(1000, dtype=cp.float32) * 2
            total = float(e.sum())
        s.synchronize()
        assert total == 999000.0
        del da, db, dc, e
        cp.cuda.Device().synchronize()
        assert ctx.stats()["num_live"] == base, (base, ctx.stats())
        assert ctx.trim() > 0
        n = ctx.stats()["num_allocs"]
        gpumem.cupy.disable()
        x = cp.ones(10)
        assert ctx.stats()["num_allocs"] == n  # back on CuPy's own pool
        print("ok")
        """,
        env=GPU_ENV,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok"


@pytest.mark.skipif(not HAVE_CUPY, reason="CuPy is not installed")
def test_cupy_reads_buffer_through_cai():
    need_gpu()
    r = run_python(
        """
        import cupy as cp, gpumem
        with gpumem.Context(backend="cuda") as ctx:
            with ctx.alloc(1 << 16) as buf:
                v = cp.asarray(buf)
                assert v.dtype == cp.uint8 and v.shape == (1 << 16,) and v.data.ptr == buf.ptr
                v[:] = 3
                assert int(v.sum()) == 3 << 16
                cp.cuda.Device().synchronize()
                del v
        print("ok")
        """,
        env=GPU_ENV,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "ok"
