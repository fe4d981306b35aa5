#!/usr/bin/env python3
"""A CUDA graph captured with CuPy (Stream.begin_capture), nothing told to the allocator, then
launched while the stream's later arrays live: run with CuPy's own memory pool and with libgpumem.

    python3 cupy_graph.py --allocator cupy      # CuPy's MemoryPool
    python3 cupy_graph.py --allocator gpumem    # gpumem.cupy.enable()

Inside the capture, y = x * 3 and z = y + 1 are allocated, and y is dropped (freed) before the
capture ends: the graph still writes y every time it is launched. After the capture, w = full(7)
and v = full(5) are allocated on the same stream, then the graph is launched LAUNCHES times.
An allocator that hands w or v memory the graph writes (y's block, freed in the capture and
cached) lets the launches overwrite them. libgpumem gives a capture nobody announced a pool of
its own (capture_probe, on by default), so w and v keep their values, and keeps it after the
capture (the graph writes y at every launch) until release_capture_pools(); CuPy's pool reuses
y's block. Prints what each array holds and exits non-zero when z, w or v is wrong.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--allocator", choices=("cupy", "gpumem"), default="gpumem")
    ap.add_argument("--n", type=int, default=1 << 22, help="elements per array (float32)")
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--drop-stream", action="store_true",
                    help="also capture on a stream destroyed right after end_capture, then keep allocating")
    args = ap.parse_args()
    import cupy as cp

    if args.allocator == "gpumem":
        import gpumem.cupy

        gpumem.cupy.enable()
    n = args.n
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x = cp.arange(n, dtype=cp.float32)
        # blocks of the arrays' size cached before the capture (CuPy's pool may not call cudaMalloc
        # during a capture: these serve it)
        warm = [x * 2 for _ in range(4)]
        del warm
        s.synchronize()
        s.begin_capture()
        y = x * 3
        z = y + 1
        del y  # freed during the capture; the graph writes it at every launch
        g = s.end_capture()
        w = cp.full(n, 7, dtype=cp.float32)
        v = cp.full(n, 5, dtype=cp.float32)
        for _ in range(args.launches):
            g.launch(s)
        s.synchronize()
        del g  # the graph is gone: its pool may go back (libgpumem keeps it until told)
        if args.allocator == "gpumem":
            gpumem.cupy.context().release_capture_pools()
    b_ok = True
    if args.drop_stream:
        # A capture on a stream that CuPy destroys right after end_capture: CUDA crashes when asked
        # about a destroyed stream, so the allocator must not ask about it at its later calls.
        t = cp.cuda.Stream(non_blocking=True)
        with t:
            t.begin_capture()
            a = x * 5
            b = a + 2
            del a
            g2 = t.end_capture()
        del t
        more = [cp.full(n, 9, dtype=cp.float32) for _ in range(4)]  # calls after the stream is gone
        with s:
            g2.launch(s)
            extra = cp.full(n, 1, dtype=cp.float32)
        s.synchronize()
        b_ok = bool((cp.asnumpy(b) == cp.asnumpy(x) * 5 + 2).all()) and all(int((m != 9).sum()) == 0 for m in more)
        del g2, more, extra
        if args.allocator == "gpumem":
            ctx = gpumem.cupy.context()
            ctx.capture_ended(None)  # the stream is gone: no capture of ours is under way
            ctx.release_capture_pools()
        print("stream destroyed after its capture: later calls ok, graph output %s" % ("ok" if b_ok else "WRONG"))
    xs = cp.asnumpy(x)
    z_ok = bool((cp.asnumpy(z) == xs * 3 + 1).all())
    w_bad = int((cp.asnumpy(w) != 7).sum())
    v_bad = int((cp.asnumpy(v) != 5).sum())
    print("allocator %s: graph launched %d times; z %s, w: %d of %d elements overwritten, v: %d overwritten"
          % (args.allocator, args.launches, "ok" if z_ok else "WRONG", w_bad, n, v_bad))
    ok = z_ok and w_bad == 0 and v_bad == 0 and b_ok
    print("RESULT", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
