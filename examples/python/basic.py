#!/usr/bin/env python3
"""libgpumem from Python: contexts, buffers, scopes, stats, trimming.

Runs anywhere on the sim backend (no GPU needed):

    GPUMEM_LIBRARY=build/src/libgpumem.so PYTHONPATH=bindings/python python3 examples/python/basic.py

With GPUMEM_BACKEND=cuda it uses the real device instead.
"""

import ctypes

import gpumem

MiB = 1 << 20


def main() -> None:
    with gpumem.Context(backend="sim", release_threshold=None, trim_free_fraction=0.10, limit_bytes=0) as ctx:
        print("backend:", ctx.backend, "devices:", ctx.device_count)
        info = ctx.device_info(0)
        print("device 0: %s %s, %.1f GiB" % (info["name"], info["uuid"], info["total_bytes"] / (1 << 30)))

        # A buffer freed at the end of the with block.
        with ctx.alloc(4 * MiB, device=0) as buf:
            print("buffer: ptr=0x%x size=%d device=%d" % (buf.ptr, buf.size, buf.device))
            print("  CUDA array interface:", buf.__cuda_array_interface__)
            if ctx.backend == "sim":  # sim memory is host memory: touch it
                ctypes.memset(buf.ptr, 0x2A, buf.size)
                assert ctypes.string_at(buf.ptr, 4) == b"****"

        # A scope: everything allocated in it is freed at its end.
        with ctx.scope(device=0) as sc:
            ptrs = [sc.alloc(n) for n in (1024, 64 * 1024, MiB)]
            print("scope pointers:", [hex(p) for p in ptrs], "live:", ctx.stats()["num_live"])

        st = ctx.stats()
        print("after: live=%d reserved=%d cached=%d" % (st["num_live"], st["reserved_bytes"], st["cached_bytes"]))
        released = ctx.trim(device=gpumem.ALL_DEVICES, keep_bytes=0)
        print("trim released %d bytes; reserved now %d" % (released, ctx.stats()["reserved_bytes"]))

        # Errors are exceptions, one class per status.
        try:
            ctx.alloc(64, device=ctx.device_count)
        except gpumem.InvalidDeviceError as e:
            print("as expected:", e.name)

    with gpumem.Context(backend="sim", limit_bytes=16 * MiB) as small:
        try:
            small.alloc(32 * MiB)
        except gpumem.LimitExceededError as e:
            print("as expected:", e.name, "-", e.message)


if __name__ == "__main__":
    main()
