#!/usr/bin/env python3
"""CuPy on libgpumem: array work checked against NumPy.

gpumem.cupy.enable() makes every CuPy allocation come from libgpumem's
process-wide context, on CuPy's current device and stream. Exits non-zero
on any mismatch.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import gpumem.cupy


def main() -> int:
    import cupy as cp

    gpumem.cupy.enable()
    ctx = gpumem.cupy.context()
    w = cp.ones((64, 64))
    float((w @ w).sum())  # warm up handles and workspaces
    del w
    cp.cuda.Device().synchronize()
    base_live = ctx.stats(0)["num_live"]
    rng = np.random.default_rng(42)
    failures = []

    def check(name, got, want, rtol=1e-9, atol=1e-9):
        ok = np.allclose(got, want, rtol=rtol, atol=atol)
        print("%-28s %s" % (name, "ok" if ok else "MISMATCH"))
        if not ok:
            failures.append(name)

    a = rng.standard_normal((2048, 1024))
    b = rng.standard_normal((1024, 512))
    da, db = cp.asarray(a), cp.asarray(b)
    t0 = time.perf_counter()
    dc = da @ db
    cp.cuda.Device().synchronize()
    print("matmul 2048x1024x512 fp64: %.2f ms (first call)" % ((time.perf_counter() - t0) * 1e3))
    check("matmul fp64", cp.asnumpy(dc), a @ b)
    af, bf = a.astype(np.float32), b.astype(np.float32)
    check("matmul fp32", cp.asnumpy(cp.asarray(af) @ cp.asarray(bf)), af @ bf, rtol=1e-3, atol=1e-3)
    check("sum", float(da.sum()), a.sum())
    check("mean axis 0", cp.asnumpy(da.mean(axis=0)), a.mean(axis=0))
    check("std axis 1", cp.asnumpy(da.std(axis=1)), a.std(axis=1))
    check("max/argmin", (float(da.max()), int(da.argmin())), (a.max(), int(a.argmin())))
    check("elementwise", cp.asnumpy(cp.exp(da[:16]) * cp.sin(da[:16]) + 1), np.exp(a[:16]) * np.sin(a[:16]) + 1)
    check("cumsum", cp.asnumpy(cp.cumsum(da[0])), np.cumsum(a[0]))
    check("sort", cp.asnumpy(cp.sort(da[:, 0])), np.sort(a[:, 0]))

    # on a non-default stream: the blocks are allocated (and freed) on it
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.arange(1 << 20, dtype=cp.float64)
        y = (x * 2).sum()
    s.synchronize()
    check("stream arange sum", float(y), float(2 * np.arange(1 << 20, dtype=np.float64).sum()))

    # many short-lived temporaries: served from the cache
    before = ctx.stats(0)
    for i in range(200):
        z = cp.full((1000 + i,), float(i)) * 3
        assert float(z[0]) == 3.0 * i
    cp.cuda.Device().synchronize()
    after = ctx.stats(0)
    print("200 temporaries: %d allocations, %d backend allocations"
          % (after["num_allocs"] - before["num_allocs"], after["num_backend_allocs"] - before["num_backend_allocs"]))

    st = ctx.stats(0)
    print("gpumem stats: live %d, allocated %.1f MiB, reserved %.1f MiB, peak reserved %.1f MiB"
          % (st["num_live"], st["allocated_bytes"] / 2**20, st["reserved_bytes"] / 2**20, st["reserved_peak"] / 2**20))
    if st["num_allocs"] == 0:
        failures.append("no allocation went through libgpumem")
    del da, db, dc, x, y, z
    cp.cuda.Device().synchronize()
    live = ctx.stats(0)["num_live"]
    released = ctx.trim()
    print("after del: live %d (baseline %d); trim released %.1f MiB" % (live, base_live, released / 2**20))
    if live != base_live:
        failures.append("%d blocks still live after del" % (live - base_live))
    print("RESULT", "FAIL " + ", ".join(failures) if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
