#!/usr/bin/env python3
"""Give PyTorch's cached GPU memory back to the driver with libgpumem's trim.

Allocates about --gib GiB of tensors through gpumem.torch.enable(), deletes
them (libgpumem keeps the memory cached, as PyTorch's allocator would), then
calls trim() on the process-wide context and shows torch.cuda.mem_get_info()
at each stage. Exits non-zero unless the memory shows up as free again.
"""

from __future__ import annotations

import argparse
import json
import sys

import gpumem.torch

GiB = 1 << 30


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gib", type=float, default=10.0)
    p.add_argument("--chunk-mib", type=int, default=256)
    p.add_argument("--slack-mib", type=int, default=256, help="tolerated difference to the baseline after trim")
    p.add_argument("--out")
    args = p.parse_args()

    gpumem.torch.enable(device=0)
    import torch

    ctx = gpumem.torch.context()
    torch.cuda.init()
    free0, total = torch.cuda.mem_get_info(0)
    n = int(args.gib * GiB) // (args.chunk_mib << 20)
    tensors = [torch.ones(args.chunk_mib << 18, dtype=torch.float32, device="cuda") for _ in range(n)]
    torch.cuda.synchronize()
    assert all(float(t[-1]) == 1.0 for t in tensors[:: max(1, n // 8)])
    free1, _ = torch.cuda.mem_get_info(0)
    st_alloc = ctx.stats(0)
    del tensors
    torch.cuda.synchronize()
    free2, _ = torch.cuda.mem_get_info(0)
    st_cached = ctx.stats(0)
    released = ctx.trim()
    free3, _ = torch.cuda.mem_get_info(0)
    st_trim = ctx.stats(0)

    mib = lambda b: b / 2**20  # noqa: E731
    print("device total              %10.0f MiB" % mib(total))
    print("free at start             %10.0f MiB" % mib(free0))
    print("free with %4d tensors     %10.0f MiB  (gpumem allocated %.0f MiB, reserved %.0f MiB)"
          % (n, mib(free1), mib(st_alloc["allocated_bytes"]), mib(st_alloc["reserved_bytes"])))
    print("free after del            %10.0f MiB  (gpumem cached %.0f MiB)" % (mib(free2), mib(st_cached["cached_bytes"])))
    print("free after ctx.trim()     %10.0f MiB  (released %.0f MiB, gpumem reserved %.0f MiB)"
          % (mib(free3), mib(released), mib(st_trim["reserved_bytes"])))
    ok = (
        free0 - free1 >= n * (args.chunk_mib << 20)  # the tensors really took device memory
        and free0 - free2 >= n * (args.chunk_mib << 20) * 0.9  # and it stayed cached after del
        and free3 >= free0 - (args.slack_mib << 20)  # trim gave it back
    )
    print("RESULT", "PASS" if ok else "FAIL")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"total": total, "free_start": free0, "free_allocated": free1, "free_after_del": free2,
                       "free_after_trim": free3, "released": released, "tensors": n, "chunk_mib": args.chunk_mib,
                       "stats_allocated": st_alloc, "stats_after_trim": st_trim, "pass": ok}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
