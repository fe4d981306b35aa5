#!/usr/bin/env python3
"""CuPy allocation cost: CuPy's own MemoryPool against libgpumem (gpumem.cupy), in one run.

The loop is what a CuPy program does: ``a = cupy.empty(n, dtype=uint8); del a``
(allocate, then drop: the memory goes back to the allocator). Each timed round
runs ``--iters`` iterations of one allocator at one size and gives microseconds
per iteration; rounds of the allocators alternate, and the median of
``--rounds`` rounds is printed per size and allocator:

  cupy-pool      cupy.cuda.set_allocator(cupy.get_default_memory_pool().malloc), CuPy's default
  gpumem         gpumem.cupy.allocator(): CFunctionAllocator over gpumem_cupy_malloc/free
  gpumem-python  the Python allocator gpumem.cupy falls back to (a Buffer per allocation), for reference

With ``--stream`` every round runs on a non-blocking ``cupy.cuda.Stream`` made for
the run (``with stream:``), the path where gpumem.cupy keeps the Stream object while
its memory lives; without it, on CuPy's default (NULL) stream.

    python3 examples/python/cupy_bench.py [--iters 20000] [--rounds 7] [--stream] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


SIZES = [("4 KiB", 4 << 10), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--stream", action="store_true", help="allocate on a non-default CuPy stream")
    ap.add_argument("--json", help="write the figures here too")
    args = ap.parse_args()

    import cupy as cp

    import gpumem
    import gpumem.cupy as gcupy

    ctx = gcupy.context()
    allocators = {
        "cupy-pool": cp.get_default_memory_pool().malloc,
        "gpumem": gcupy.allocator(ctx),
        "gpumem-python": gcupy._python_allocator(cp, ctx),
    }
    c_path = gcupy.c_allocator_available()
    stream = cp.cuda.Stream(non_blocking=True) if args.stream else cp.cuda.Stream.null

    def one_round(alloc, n: int, iters: int) -> float:
        cp.cuda.set_allocator(alloc)
        empty, u8 = cp.empty, cp.uint8
        with stream:
            a = empty(n, dtype=u8)  # warm: the first block of this size is made outside the timing
            del a
            t0 = time.perf_counter()
            for _ in range(iters):
                a = empty(n, dtype=u8)
                del a
            return (time.perf_counter() - t0) / iters * 1e6

    results = {}
    for label, n in SIZES:
        runs = {name: [] for name in allocators}
        for name, alloc in allocators.items():  # warm-up round, untimed
            one_round(alloc, n, max(100, args.iters // 20))
        for _ in range(args.rounds):
            for name, alloc in allocators.items():
                runs[name].append(one_round(alloc, n, args.iters))
        results[label] = {name: statistics.median(v) for name, v in runs.items()}
        results[label]["runs"] = runs
    cp.cuda.set_allocator(cp.get_default_memory_pool().malloc)
    cp.cuda.Device().synchronize()
    where = "a non-default stream" if args.stream else "the default stream"

    dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    print("device %s, CuPy %s, gpumem %s (%s), C allocator path: %s" % (
        dev["name"].decode() if isinstance(dev["name"], bytes) else dev["name"], cp.__version__,
        gpumem.__version__, gpumem.capi.library_path, "yes" if c_path else "NO (Python fallback)"))
    print("cupy.empty(n, uint8) + del on %s, us per iteration: median of %d rounds of %d" % (
        where, args.rounds, args.iters))
    print("%-8s %12s %12s %14s %12s" % ("size", "cupy-pool", "gpumem", "gpumem-python", "gpumem/pool"))
    for label, _ in SIZES:
        r = results[label]
        print("%-8s %12.3f %12.3f %14.3f %12.2f" % (label, r["cupy-pool"], r["gpumem"], r["gpumem-python"],
                                                    r["gpumem"] / r["cupy-pool"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"iters": args.iters, "rounds": args.rounds, "stream": bool(args.stream), "c_path": c_path,
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
