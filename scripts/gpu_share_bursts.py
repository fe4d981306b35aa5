#!/usr/bin/env python3
"""Several processes with bursty phases sharing one GPU that is nearly full (issue 17, docs/SHARED-GPUS.md).

    python3 scripts/gpu_share_bursts.py [--procs 8] [--rounds 60] [--free-gib 12] [--configs ...]

The parent first takes device memory with PyTorch's allocator until about --free-gib GiB are
left (another job on the GPU), then starts --procs workers. Each worker allocates random bursts
(1-32 blocks of 8-256 MiB, freed at the end of the burst); a block is allocated only after its
size was taken from a budget shared by all workers, so the total live memory of all of them
never passes the budget: the device's free memory once every worker is up, less 1 GiB. With a
cache that flows to whoever needs it no allocation fails; with caches that stay with their
process, a process's cached memory starves the others. Configurations (each a fresh set of workers):

  gpumem-share     libgpumem, GPUMEM_SHARE=user (the default): cooperative reclaim and the watcher
  gpumem-watcher   GPUMEM_SHARE=off: the watcher alone (each process trims when free memory is low)
  gpumem-none      GPUMEM_SHARE=off GPUMEM_WATCH_MS=0 GPUMEM_TRIM_FREE_FRACTION=0: caches stay
  torch            PyTorch's caching allocator
  torch-gpumem     PyTorch through gpumem.torch (sharing on)

Prints one line per configuration: allocations, failures, the slowest allocation, seconds.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MiB = 1 << 20
GiB = 1 << 30
CONFIGS = ("gpumem-share", "gpumem-watcher", "gpumem-none", "torch", "torch-gpumem")
ENV = {
    "gpumem-share": {"GPUMEM_SHARE": "user"},
    "gpumem-watcher": {"GPUMEM_SHARE": "off"},
    "gpumem-none": {"GPUMEM_SHARE": "off", "GPUMEM_WATCH_MS": "0", "GPUMEM_TRIM_FREE_FRACTION": "0"},
    "torch": {},
    "torch-gpumem": {"GPUMEM_SHARE": "user"},
}


def worker(cfg, seed, rounds, budget, live, lock, ready, go, out):
    os.environ.update(ENV[cfg])
    sys.path.insert(0, os.path.join(HERE, os.pardir, "bindings", "python"))
    if cfg.startswith("torch"):
        if cfg == "torch-gpumem":
            import gpumem.torch

            gpumem.torch.enable(device=0)
        import torch

        torch.empty(1, device="cuda")  # the context, before the budget is measured
        oom = torch.OutOfMemoryError

        def alloc(n):
            return torch.empty(n, dtype=torch.uint8, device="cuda")

        def free(x):
            pass  # the caller drops the last reference

        sync = torch.cuda.synchronize
    else:
        import gpumem

        ctx = gpumem.Context(backend="cuda")
        oom = gpumem.OutOfMemoryError
        alloc = ctx.alloc

        def free(x):
            x.free()

        def sync():
            pass

        alloc(MiB).free()
    ready.release()
    go.wait()
    rng = random.Random(seed)
    allocs = fails = 0
    slowest = 0.0
    for _ in range(rounds):
        held = []
        for _ in range(rng.randint(1, 32)):
            n = (8 << rng.randint(0, 5)) * MiB  # 8 .. 256 MiB
            with lock:
                if live.value + n > budget.value:
                    break
                live.value += n
            allocs += 1
            t0 = time.perf_counter()
            try:
                x = alloc(n)
            except oom:
                fails += 1
                with lock:
                    live.value -= n
                break
            slowest = max(slowest, time.perf_counter() - t0)
            held.append((x, n))
        if rng.random() < 0.25:
            time.sleep(0.002)  # a burst that lasts a while
        sync()
        while held:  # each block gone (its last reference dropped) before its size goes back to the budget
            x, n = held.pop()
            free(x)
            del x
            with lock:
                live.value -= n
    out.put((allocs, fails, slowest))


def run(cfg, args):
    mpc = mp.get_context("spawn")
    budget, live = mpc.Value("q", 0, lock=False), mpc.Value("q", 0, lock=False)
    lock, ready, go, out = mpc.Lock(), mpc.Semaphore(0), mpc.Event(), mpc.Queue()
    ps = [mpc.Process(target=worker, args=(cfg, 1000 + i, args.rounds, budget, live, lock, ready, go, out))
          for i in range(args.procs)]
    if cfg == "torch-gpumem":
        sys.path.insert(0, os.path.join(HERE, os.pardir, "bindings", "python"))
        import gpumem.torch

        gpumem.torch.build_shim()  # once, before eight processes would each build it
    for p in ps:
        p.start()
    for _ in ps:
        if not ready.acquire(timeout=300):
            print("%-15s a worker did not start" % cfg, flush=True)
            for q in ps:
                q.terminate()
            return -1
    import torch

    free, _ = torch.cuda.mem_get_info(0)
    budget.value = max(free - GiB, 0)
    t0 = time.perf_counter()
    go.set()
    try:
        res = [out.get(timeout=300) for _ in ps]
    except Exception:  # a worker died (its exit code says how)
        print("%-15s a worker failed: exit codes %s" % (cfg, [q.exitcode for q in ps]), flush=True)
        for q in ps:
            q.terminate()
        return -1
    for p in ps:
        p.join()
    secs = time.perf_counter() - t0
    a, f = sum(r[0] for r in res), sum(r[1] for r in res)
    print("%-15s budget %.1f GiB: %6d allocations, %4d failed, slowest %.1f ms, %.1f s" % (
        cfg, budget.value / GiB, a, f, max(r[2] for r in res) * 1e3, secs), flush=True)
    return f


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, default=8)
    p.add_argument("--rounds", type=int, default=60)
    p.add_argument("--free-gib", type=float, default=12.0)
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=list(CONFIGS))
    args = p.parse_args()
    import torch

    fill, (free, total) = [], torch.cuda.mem_get_info(0)
    while free > (args.free_gib + 1) * GiB:  # another job: it keeps all of this while the workers run
        fill.append(torch.empty(GiB, dtype=torch.uint8, device="cuda"))
        free, total = torch.cuda.mem_get_info(0)
    print("device: %s, %.1f GiB total, %.1f GiB free after the filler (%d GiB)" % (
        torch.cuda.get_device_name(0), total / GiB, free / GiB, len(fill)), flush=True)
    for cfg in args.configs:
        run(cfg, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
