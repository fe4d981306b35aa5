"""The shared-GPU scenario on PyTorch's own caching allocator (scripts/gpu-share.sh).

    python3 scripts/gpu_share_torch.py hold GIB   # allocate GIB x 1 GiB tensors, del them (PyTorch keeps
                                                  # its cache), print "ready", idle until stdin closes
    python3 scripts/gpu_share_torch.py ask GIB    # GIB x 1 GiB tensors, kept: how many, how many OOM errors
"""
import sys
import time

import torch


def main() -> int:
    mode, gib = sys.argv[1], int(sys.argv[2])
    n = 1 << 28  # float32 elements in 1 GiB
    if mode == "hold":
        xs = []
        for _ in range(gib):
            try:
                xs.append(torch.empty(n, dtype=torch.float32, device="cuda"))
            except torch.OutOfMemoryError:
                break
        got = len(xs)
        del xs
        print("hold: pid %d allocated %d x 1 GiB, deleted; reserved %.2f GiB (PyTorch's cache)"
              % (__import__("os").getpid(), got, torch.cuda.memory_reserved() / 2**30), flush=True)
        print("ready", flush=True)
        sys.stdin.read()
        return 0
    xs, fails, slowest = [], 0, 0.0
    t0 = time.perf_counter()
    for _ in range(gib):
        a = time.perf_counter()
        try:
            xs.append(torch.empty(n, dtype=torch.float32, device="cuda"))
        except torch.OutOfMemoryError:
            fails += 1
        slowest = max(slowest, time.perf_counter() - a)
    total = time.perf_counter() - t0
    print("ask: got %d GiB of %d, %d OutOfMemoryError; %.3f s in all, slowest call %.1f ms"
          % (len(xs), gib, fails, total, slowest * 1e3))
    print("RESULT got_gib=%d failures=%d total_s=%.3f slowest_ms=%.1f asks=-" % (len(xs), fails, total, slowest * 1e3))
    return 0


if __name__ == "__main__":
    sys.exit(main())
