#!/usr/bin/env python3
"""Multi-stream PyTorch workloads: what each allocator holds, live, and traces to replay.

Three workloads that use several CUDA streams the way real training code does:

``two_models``
    ResNet-18 (batch 32) and a GPT-style decoder (6 layers, d=768, sequence 256,
    batch 8) trained at once, each on a stream of its own, launched from one thread.
``loader``
    ResNet-18 training on the default stream fed by a data-loading stream: the next
    batch is copied from pinned memory and normalised on the loader stream while the
    current step runs; the step waits for it and notes it with ``record_stream``.
``comm``
    The decoder trained with DDP-style gradient buckets: as backward produces
    gradients, buckets of about 25 MiB are flattened, "reduced" (scaled) and copied
    back on a side stream (as NCCL's stream would), overlapping the rest of backward;
    the gradients are noted on that stream with ``record_stream``.

Each workload runs in its own process per allocator (the allocator is chosen before
CUDA starts): ``torch`` (PyTorch's caching allocator), ``expandable``
(``expandable_segments:True``) and ``gpumem`` (``gpumem.torch.enable()``). Printed
per run: peak allocated and peak reserved (``torch.cuda.max_memory_*``; with gpumem
these are libgpumem's figures through the shim), their ratio and the median step.

With ``--gpu-behind-ms MS`` every step starts with a kernel of MS milliseconds on each of the
workload's streams: the host queues the whole step while the GPU is still behind it (a fast host,
a busy GPU), so the step's frees come before the device has run the work that used the memory,
the live counterpart of ``gpumem-replay --sim-behind``.

With ``--trace-dir DIR`` the ``torch`` run also records its allocations with
``torch.cuda.memory._record_memory_history`` and writes them as a libgpumem trace
(``DIR/<workload>.txt.gz``, the format of ``examples/traces``: ``a ID SIZE STREAM``
at each allocation, ``f ID`` when PyTorch's allocator completed the free, i.e. after
the streams a block was noted on had passed it), which ``gpumem-replay`` replays on sim.

    python3 examples/python/torch_multistream.py --all two_models loader comm --trace-dir traces
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BINDINGS = os.path.abspath(os.path.join(HERE, os.pardir, os.pardir, "bindings", "python"))
sys.path.insert(0, HERE)
WORKLOADS = ("two_models", "loader", "comm")
ALLOCATORS = ("torch", "expandable", "gpumem")
MiB = 1 << 20


def _write_trace(torch, path: str, workload: str) -> dict:
    """The recorded history of device 0 as a libgpumem trace; returns its counts."""
    snap = torch.cuda.memory._snapshot()
    events = snap["device_traces"][0] if snap.get("device_traces") else []
    ids, next_id, live, peak, nalloc, nfree = {}, 1, 0, 0, 0, 0
    sizes = {}
    lines = []
    for e in events:
        act = e.get("action")
        if act == "alloc":
            addr = e["addr"]
            if addr in ids:  # a missed free (ring buffer): the old one ends here
                lines.append("f %d" % ids[addr])
                live -= sizes.pop(ids[addr])
            i = next_id
            next_id += 1
            ids[addr] = i
            sizes[i] = e["size"]
            lines.append("a %d %d %d" % (i, e["size"], e.get("stream", 0)))
            live += e["size"]
            peak = max(peak, live)
            nalloc += 1
        elif act == "free_completed":
            i = ids.pop(e["addr"], None)
            if i is None:
                continue
            lines.append("f %d" % i)
            live -= sizes.pop(i)
            nfree += 1
    with gzip.open(path, "wt") as f:
        f.write("# workload %s\n" % workload)
        f.write("# recorded by examples/python/torch_multistream.py (torch %s, %s): alloc and free_completed "
                "events of device 0\n" % (torch.__version__, torch.cuda.get_device_name(0)))
        f.write("# pytorch max_allocated %d max_reserved %d\n" % (torch.cuda.max_memory_allocated(0),
                                                                 torch.cuda.max_memory_reserved(0)))
        f.write("# format: 'a ID SIZE STREAM', 'f ID'\n")
        f.write("\n".join(lines) + "\n")
    return {"trace": path, "trace_allocs": nalloc, "trace_frees": nfree, "trace_peak_live": peak}


def run(args) -> dict:
    if args.allocator == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if args.allocator == "gpumem":
        import gpumem.torch  # before any CUDA tensor exists

        gpumem.torch.enable(device=0)
    import torch
    from torch_train import _resnet, _transformer

    dev = torch.device("cuda", 0)
    torch.manual_seed(args.seed)
    record = args.allocator == "torch" and args.trace
    if record:
        torch.cuda.memory._record_memory_history(max_entries=10_000_000, context=None, stacks="python")
    gen = torch.Generator().manual_seed(args.seed + 1)
    vocab, seq = 32768, 256
    steps, times, losses = args.steps, [], []

    def decoder():
        m, _ = _transformer(torch, vocab, 768, 6, 12, seq)
        m = m.to(dev)
        return m, torch.optim.AdamW(m.parameters(), lr=3e-4, weight_decay=0.01)

    def resnet():
        m, _ = _resnet(torch, 18, 100)
        m = m.to(dev, memory_format=torch.channels_last)
        return m, torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)

    cycles = 0
    if args.gpu_behind_ms > 0:
        # torch.cuda._sleep spins for a number of GPU clock cycles: cycles per ms measured once
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        a.record()
        torch.cuda._sleep(10_000_000)
        b.record()
        b.synchronize()
        cycles = int(args.gpu_behind_ms * 10_000_000 / a.elapsed_time(b))

    def behind(*streams):
        if cycles > 0:
            for st in streams:
                with torch.cuda.stream(st):
                    torch.cuda._sleep(cycles)

    def lm_loss(m, x, y):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = m(x)
        return torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))

    if args.workload == "two_models":
        rn, rn_opt = resnet()
        lm, lm_opt = decoder()
        s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(0)
        for step in range(steps):
            t0 = time.perf_counter()
            behind(s1, s2)
            with torch.cuda.stream(s1):
                x = torch.randn(32, 3, 224, 224, generator=gen).to(dev, non_blocking=True)
                y = torch.randint(0, 100, (32,), generator=gen).to(dev)
                rn_opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    l1 = torch.nn.functional.cross_entropy(rn(x.contiguous(memory_format=torch.channels_last)), y)
                l1.backward()
                rn_opt.step()
            with torch.cuda.stream(s2):
                tok = torch.randint(0, vocab, (8, seq + 1), generator=gen).to(dev)
                lm_opt.zero_grad(set_to_none=True)
                l2 = lm_loss(lm, tok[:, :-1], tok[:, 1:])
                l2.backward()
                lm_opt.step()
            losses.append((l1.item(), l2.item()))
            times.append(time.perf_counter() - t0)
            del x, y, tok, l1, l2
    elif args.workload == "loader":
        rn, rn_opt = resnet()
        load = torch.cuda.Stream()
        main = torch.cuda.current_stream()
        mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
        std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
        host = [torch.randint(0, 256, (64, 3, 224, 224), dtype=torch.uint8, generator=gen).pin_memory()
                for _ in range(4)]
        labels = [torch.randint(0, 100, (64,), generator=gen).pin_memory() for _ in range(4)]

        def fetch(i):
            with torch.cuda.stream(load):
                raw = host[i % 4].to(dev, non_blocking=True)
                x = ((raw.float() - mean) / std).contiguous(memory_format=torch.channels_last)
                if i % 2:
                    x = torch.flip(x, dims=(3,))  # augmentation: a temporary of the loader stream
                y = labels[i % 4].to(dev, non_blocking=True)
                del raw
            return x, y

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(0)
        nxt = fetch(0)
        for step in range(steps):
            t0 = time.perf_counter()
            behind(main, load)
            main.wait_stream(load)
            x, y = nxt
            x.record_stream(main)
            y.record_stream(main)
            nxt = fetch(step + 1) if step + 1 < steps else None
            rn_opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(rn(x), y)
            loss.backward()
            rn_opt.step()
            del x, y
            losses.append(loss.item())
            times.append(time.perf_counter() - t0)
    else:  # comm
        lm, lm_opt = decoder()
        comm = torch.cuda.Stream()
        main = torch.cuda.current_stream()
        params = [p for p in lm.parameters() if p.requires_grad]
        bucket_bytes = 25 * MiB
        pending = []

        def flush(bucket):
            # DDP's pattern: the side stream waits for the gradients, reduces a flat copy of them
            # and writes them back; the gradients are noted on it so that their memory waits.
            comm.wait_stream(main)
            with torch.cuda.stream(comm):
                for g in bucket:
                    g.record_stream(comm)
                flat = torch.cat([g.reshape(-1) for g in bucket])
                flat.mul_(0.5)
                flat.add_(flat.roll(1)).mul_(1.0)  # the other rank's half (a stand-in for the all-reduce)
                off = 0
                for g in bucket:
                    n = g.numel()
                    g.copy_(flat[off:off + n].view_as(g))
                    off += n
                del flat

        bucket, size = [], 0

        def hook(p):
            nonlocal bucket, size
            bucket.append(p.grad)
            size += p.grad.numel() * p.grad.element_size()
            if size >= bucket_bytes:
                flush(bucket)
                bucket, size = [], 0

        for p in params:
            p.register_post_accumulate_grad_hook(hook)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(0)
        for step in range(steps):
            t0 = time.perf_counter()
            behind(main, comm)
            tok = torch.randint(0, vocab, (8, seq + 1), generator=gen).to(dev)
            lm_opt.zero_grad(set_to_none=True)
            loss = lm_loss(lm, tok[:, :-1], tok[:, 1:])
            loss.backward()
            if bucket:
                flush(bucket)
                bucket, size = [], 0
            main.wait_stream(comm)
            lm_opt.step()
            losses.append(loss.item())
            times.append(time.perf_counter() - t0)
            del tok, loss
    torch.cuda.synchronize()
    warm = sorted(times[3:]) if len(times) > 3 else sorted(times)
    out = {
        "workload": args.workload,
        "allocator": args.allocator,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "steps": steps,
        "gpu_behind_ms": args.gpu_behind_ms,
        "last_loss": losses[-1] if losses else None,
        "median_step_ms": warm[len(warm) // 2] * 1e3,
        "max_memory_allocated": torch.cuda.max_memory_allocated(0),
        "max_memory_reserved": torch.cuda.max_memory_reserved(0),
    }
    if args.allocator == "gpumem":
        import gpumem.torch

        st = gpumem.torch.context().stats(0)
        out["gpumem_stats"] = {k: st[k] for k in ("num_backend_allocs", "num_backend_frees", "num_trims",
                                                  "num_segments", "num_allocs") if k in st}
    if record:
        os.makedirs(args.trace, exist_ok=True)
        out.update(_write_trace(torch, os.path.join(args.trace, "%s.txt.gz" % args.workload), args.workload))
        torch.cuda.memory._record_memory_history(enabled=None)
    return out


def table(results) -> None:
    print("| workload | allocator | median step | peak allocated | peak reserved | reserved / allocated |")
    print("|---|---|---|---|---|---|")
    for r in results:
        print("| %s | %s | %.1f ms | %.0f MiB | %.0f MiB | %.3f |" % (
            r["workload"], r["allocator"], r["median_step_ms"], r["max_memory_allocated"] / MiB,
            r["max_memory_reserved"] / MiB, r["max_memory_reserved"] / max(r["max_memory_allocated"], 1)))


def run_all(args) -> int:
    env = dict(os.environ)
    if os.path.isdir(os.path.join(BINDINGS, "gpumem")):
        env["PYTHONPATH"] = BINDINGS + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    outdir = args.out_dir or tempfile.mkdtemp(prefix="torch_multistream_")
    os.makedirs(outdir, exist_ok=True)
    status, results = 0, []
    for w in args.all:
        for alloc in args.allocators:
            path = os.path.join(outdir, "%s-%s.json" % (w, alloc))
            cmd = [sys.executable, os.path.abspath(__file__), "--workload", w, "--allocator", alloc, "--out", path,
                   "--steps", str(args.steps)]
            if args.trace:
                cmd += ["--trace-dir", args.trace]
            with open(path[:-5] + ".log", "w") as log:
                rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
            if rc != 0:
                print("%s with %s: exit %d (log: %s)" % (w, alloc, rc, log.name), flush=True)
                status = 1
                continue
            results.append(json.load(open(path)))
            print("%s %s: %.3f" % (w, alloc, results[-1]["max_memory_reserved"] /
                                   max(results[-1]["max_memory_allocated"], 1)), flush=True)
    table(results)
    with open(os.path.join(outdir, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return status


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=WORKLOADS, default="two_models")
    p.add_argument("--allocator", choices=ALLOCATORS, default="torch")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--gpu-behind-ms", type=float, default=0.0,
                   help="start every step with a kernel of this many ms on each of the workload's streams, so "
                        "that the host queues the whole step while the GPU is still behind it (a fast host, "
                        "a busy GPU): the frees of the step come before the device has run their work")
    p.add_argument("--trace-dir", dest="trace", help="the torch run writes its trace here")
    p.add_argument("--out", help="write the result as JSON here")
    p.add_argument("--out-dir", help="with --all: where the JSON files and logs go")
    p.add_argument("--all", nargs="+", metavar="WORKLOAD", choices=WORKLOADS,
                   help="run every allocator (--allocators) for each workload and print the table")
    p.add_argument("--allocators", nargs="+", choices=ALLOCATORS, default=list(ALLOCATORS))
    args = p.parse_args()
    if args.all:
        return run_all(args)
    r = run(args)
    print(json.dumps(r))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
