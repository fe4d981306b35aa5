"""PyTorch's allocator promises, checked with PyTorch's own allocator and with gpumem.torch.

Runs every check twice, each in a fresh interpreter (the allocator can be
chosen only before CUDA is first used): once with PyTorch's CUDA caching
allocator, once after ``gpumem.torch.enable()``, and prints a table::

    python3 examples/python/torch_parity.py            # all checks, table on stdout
    python3 examples/python/torch_parity.py --json     # the raw results
    python3 examples/python/torch_parity.py oom graph  # some checks only

It needs PyTorch, an NVIDIA GPU and a libgpumem with the CUDA backend (found
as ``import gpumem`` finds it: ``GPUMEM_LIBRARY``, beside the package, or the
system's search path). bindings/python/tests/test_torch_parity.py runs the
same checks under pytest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
BINDINGS = os.path.abspath(os.path.join(HERE, os.pardir, os.pardir, "bindings", "python"))
GiB = 1 << 30
MiB = 1 << 20


# ---------------------------------------------------------------- the checks (run inside the child)


def check_installed(torch: Any) -> Tuple[bool, str, Dict[str, Any]]:
    import gpumem.torch

    shim = gpumem.torch.build_shim()
    name = shim.allocator_name()
    enabled = gpumem.torch.is_enabled()
    return name == "gpumem" and enabled, "allocator %r, enabled %s" % (name, enabled), {"name": name, "enabled": enabled}


def check_oom(torch: Any) -> Tuple[bool, str, Dict[str, Any]]:
    total = torch.cuda.get_device_properties(0).total_memory
    requested = int(total * 1.5)
    try:
        t = torch.empty(requested, dtype=torch.uint8, device="cuda")
        return False, "no exception (data_ptr 0x%x)" % t.data_ptr(), {"data_ptr": t.data_ptr()}
    except torch.OutOfMemoryError as e:
        msg = str(e)
    after = torch.ones(10, device="cuda")
    ok_after = float(after.sum()) == 10.0
    return True, "torch.OutOfMemoryError: " + msg.splitlines()[0][:110], {
        "message": msg,
        "requested": requested,
        "tensor_after": ok_after,
    }


def check_record_stream(torch: Any, iterations: int = 20) -> Tuple[bool, str, Dict[str, Any]]:
    n = 1 << 23  # 64 MiB of int64
    a = torch.cuda.current_stream()
    b = torch.cuda.Stream()
    wrong = 0
    for i in range(iterations):
        x = torch.full((n,), i, dtype=torch.int64, device="cuda")  # on A
        b.wait_stream(a)
        with torch.cuda.stream(b):
            torch.cuda._sleep(100_000_000)  # B still has x's read queued when x is freed
            s = x.sum()
        x.record_stream(b)
        del x
        y = [torch.full((n,), -1, dtype=torch.int64, device="cuda") for _ in range(2)]  # on A, at once
        b.synchronize()
        if int(s.item()) != i * n:
            wrong += 1
        del y, s
    torch.cuda.synchronize()
    return wrong == 0, "%d wrong of %d" % (wrong, iterations), {"wrong": wrong, "iterations": iterations}


def check_record_stream_stress(torch: Any, iterations: int = 3000) -> Tuple[bool, str, Dict[str, Any]]:
    """record_stream under load: 4 streams, sizes from 512 B to 64 MiB, one or two readers per tensor.

    Each iteration makes a tensor on a random producer stream, has one or two
    other streams read it behind a short random sleep, notes them with
    record_stream, drops it, and at once makes tensors of the same size on the
    producer, filled with -1: if the freed block served them before the
    readers finished, a reader sums -1s and its result is wrong.
    """
    import random

    rng = random.Random(7)
    streams = [torch.cuda.current_stream()] + [torch.cuda.Stream() for _ in range(3)]
    sizes = [64, 512, 4096, 1 << 15, 1 << 17, 1 << 20, 1 << 23]  # int64 elements: 512 B .. 64 MiB
    pending = []  # (sum tensor, expected)
    wrong = 0
    t0 = time.time()
    for i in range(iterations):
        n = rng.choice(sizes)
        prod = rng.randrange(4)
        readers = rng.sample([k for k in range(4) if k != prod], rng.choice((1, 1, 2)))
        with torch.cuda.stream(streams[prod]):
            x = torch.full((n,), i, dtype=torch.int64, device="cuda")
        for r in readers:
            streams[r].wait_stream(streams[prod])
            with torch.cuda.stream(streams[r]):
                torch.cuda._sleep(rng.randrange(0, 200_000))
                pending.append((x.sum(), i * n))
            x.record_stream(streams[r])
        del x
        with torch.cuda.stream(streams[prod]):
            y = [torch.full((n,), -1, dtype=torch.int64, device="cuda") for _ in range(2)]
        del y
        if len(pending) >= 512:
            torch.cuda.synchronize()
            wrong += sum(int(t.item()) != e for t, e in pending)
            pending.clear()
    torch.cuda.synchronize()
    wrong += sum(int(t.item()) != e for t, e in pending)
    reads = iterations  # at least one read per iteration
    return wrong == 0, "%d iterations, 4 streams, 512 B-64 MiB: %d wrong reads (%.1f s)" % (
        iterations, wrong, time.time() - t0), {"wrong": wrong, "iterations": iterations, "min_reads": reads}


def check_compile(torch: Any, steps: int = 6) -> Tuple[bool, str, Dict[str, Any]]:
    """torch.compile(mode="reduce-overhead"): CUDA graphs through PyTorch's cudagraph trees.

    Inference calls, then training steps (forward and backward graphs: the backward is
    recorded after the forward replayed, which restores the pool from a checkpoint),
    each compared with an eager copy of the model, while other tensors are made and checked.
    """
    import copy

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, mode="reduce-overhead")
    worst = worst_grad = 0.0
    others_wrong = 0
    n = 1 << 22
    with torch.no_grad():
        for k in range(steps):
            x = torch.randn(128, 1024, device="cuda")
            out = compiled(x).clone()
            others = [torch.full((n,), k + j, dtype=torch.int64, device="cuda") for j in range(3)]
            ref = eager(x)
            worst = max(worst, float((out - ref).abs().max() / (ref.abs().max() + 1e-12)))
            others_wrong += sum(int(o.sum()) != (k + j) * n for j, o in enumerate(others))
    train = torch.compile(model, mode="reduce-overhead")
    for k in range(steps):
        x = torch.randn(128, 1024, device="cuda")
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        train(x).square().mean().backward()
        eager(x).square().mean().backward()
        others = [torch.full((n,), k + j, dtype=torch.int64, device="cuda") for j in range(3)]
        for p, q in zip(model.parameters(), eager.parameters()):
            worst_grad = max(worst_grad, float((p.grad - q.grad).abs().max() / (q.grad.abs().max() + 1e-12)))
        others_wrong += sum(int(o.sum()) != (k + j) * n for j, o in enumerate(others))
    torch.cuda.synchronize()
    ok = worst < 1e-2 and worst_grad < 1e-2 and others_wrong == 0
    return ok, "%d calls + %d training steps; max relative difference to eager %.1e (outputs), %.1e (gradients); %d wrong other tensors" % (
        steps, steps, worst, worst_grad, others_wrong), {"worst": worst, "worst_grad": worst_grad, "others_wrong": others_wrong}


def check_graph(torch: Any, replays: int = 10) -> Tuple[bool, str, Dict[str, Any]]:
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(1024, 8192), nn.ReLU(), nn.Linear(8192, 8192), nn.ReLU(),
                          nn.Linear(8192, 1024)).cuda()
    static_in = torch.randn(256, 1024, device="cuda")
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                model(static_in)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = model(static_in)
        inputs = [torch.randn(256, 1024, device="cuda") for _ in range(replays)]
        out_wrong = outside_wrong = 0
        n = 1 << 22
        for k in range(replays):
            static_in.copy_(inputs[k])
            g.replay()
            # tensors made while the replay runs must not share the graph's memory
            others = [torch.full((n,), k + j, dtype=torch.int64, device="cuda") for j in range(4)]
            ref = model(inputs[k])
            if not torch.allclose(static_out, ref, rtol=1e-3, atol=1e-3):
                out_wrong += 1
            for j, o in enumerate(others):
                if int(o.sum()) != (k + j) * n:
                    outside_wrong += 1
        torch.cuda.synchronize()
    del g, static_out
    torch.cuda.synchronize()
    ok = out_wrong == 0 and outside_wrong == 0
    return ok, "captured; %d replays, %d wrong outputs, %d wrong other tensors" % (replays, out_wrong, outside_wrong), {
        "replays": replays,
        "out_wrong": out_wrong,
        "outside_wrong": outside_wrong,
    }


def check_graph_then_empty_cache(torch: Any) -> Tuple[bool, str, Dict[str, Any]]:
    """After a capture and its replays, the allocator is out of capture mode: empty_cache gives back
    what was freed since (libgpumem learns the capture ended at PyTorch's endAllocateToPool)."""
    ok_g, text_g, data_g = check_graph(torch, replays=3)
    ok_e, text_e, data_e = check_empty_cache(torch)
    data = dict(data_g)
    data.update(data_e)
    return ok_g and ok_e, "%s; then %s" % (text_g, text_e), data


def check_graphed_callables(torch: Any) -> Tuple[bool, str, Dict[str, Any]]:
    import copy

    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 10)).cuda()
    eager = copy.deepcopy(model)
    x = torch.randn(64, 512, device="cuda")
    graphed = torch.cuda.make_graphed_callables(model, (x,))
    worst = 0.0
    for step in range(5):
        inp = torch.randn(64, 512, device="cuda") + step
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
        graphed(inp).square().sum().backward()
        eager(inp).square().sum().backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            worst = max(worst, float((p.grad - q.grad).abs().max() / (q.grad.abs().max() + 1e-12)))
    torch.cuda.synchronize()
    return worst < 1e-3, "5 steps, max relative gradient difference %.1e" % worst, {"worst": worst}


def check_mempool(torch: Any) -> Tuple[bool, str, Dict[str, Any]]:
    pool = torch.cuda.MemPool()
    counts = [pool.use_count()]
    with torch.cuda.use_mem_pool(pool):
        counts.append(pool.use_count())
        t = torch.full((1 << 20,), 3.0, device="cuda")
    counts.append(pool.use_count())
    u = torch.full((1 << 20,), 4.0, device="cuda")
    ok = float(t.sum()) == 3.0 * (1 << 20) and float(u.sum()) == 4.0 * (1 << 20)
    del t, u
    torch.cuda.synchronize()
    del pool
    return ok and counts == [1, 2, 1], "use_count %s, values right: %s" % (counts, ok), {"use_counts": counts}


def check_empty_cache(torch: Any) -> Tuple[bool, str, Dict[str, Any]]:
    ts = [torch.empty(GiB, dtype=torch.uint8, device="cuda") for _ in range(8)]
    for t in ts:
        t.fill_(1)
    del ts, t
    torch.cuda.synchronize()
    before = torch.cuda.mem_get_info()[0]
    torch.cuda.empty_cache()
    after = torch.cuda.mem_get_info()[0]
    returned = (after - before) / GiB
    return returned >= 0.9 * 8, "%.2f GiB back to the device" % returned, {"returned_gib": returned, "freed_gib": 8.0}


def check_fraction(torch: Any) -> Tuple[bool, str, Dict[str, Any]]:
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.1)
    back = torch.cuda.get_per_process_memory_fraction()
    try:
        t = torch.empty(int(0.3 * total), dtype=torch.uint8, device="cuda")
        msg = None
        del t
    except torch.OutOfMemoryError as e:
        msg = str(e)
    small = torch.ones(1 << 20, device="cuda")  # below the limit: still served
    ok_small = float(small.sum()) == float(1 << 20)
    del small
    torch.cuda.set_per_process_memory_fraction(1.0)
    if msg is None:
        return False, "30%% tensor allocated: the limit is ignored", {"fraction_read_back": back}
    return ok_small, "OutOfMemoryError: " + msg.splitlines()[0][:100], {"message": msg, "fraction_read_back": back}


def check_stats(torch: Any) -> Tuple[bool, str, Dict[str, Any]]:
    c = torch.cuda
    torch.ones(1, device="cuda")
    c.synchronize()
    c.reset_peak_memory_stats()
    a0 = c.memory_allocated()
    x = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    a1 = c.memory_allocated()
    checks = {
        "allocated grows": a1 - a0 >= 256 * MiB,
        "max_allocated >= allocated": c.max_memory_allocated() >= a1,
        "reserved >= allocated": c.memory_reserved() >= a1,
        "max_reserved >= reserved": c.max_memory_reserved() >= c.memory_reserved(),
    }
    del x
    c.synchronize()
    checks["allocated back"] = c.memory_allocated() == a0
    checks["peak kept"] = c.max_memory_allocated() >= a1
    c.reset_peak_memory_stats()
    checks["peak reset"] = c.max_memory_allocated() == c.memory_allocated()
    stats = c.memory_stats()
    checks["memory_stats agrees"] = stats.get("allocated_bytes.all.current") == c.memory_allocated()
    summary = c.memory_summary()
    checks["summary"] = "Allocated memory" in summary
    c.reset_accumulated_memory_stats()
    failed = [k for k, v in checks.items() if not v]
    return not failed, ("all %d checks" % len(checks)) if not failed else "failed: " + ", ".join(failed), {
        "keys": sorted(stats.keys()),
        "checks": checks,
        "allocated_mib": (a1 - a0) / MiB,
    }


def check_bad_pointer(torch: Any) -> Tuple[bool, str, Dict[str, Any]]:
    torch.ones(1, device="cuda")
    try:
        torch.cuda.caching_allocator_delete(0x7F0000000100)
        return False, "no exception", {}
    except RuntimeError as e:
        msg = str(e)
    ok_after = float(torch.ones(10, device="cuda").sum()) == 10.0
    return ok_after, "RuntimeError: " + msg.splitlines()[0][:100], {"message": msg}


CHECKS: Dict[str, Tuple[str, Callable[[Any], Tuple[bool, str, Dict[str, Any]]]]] = {
    "installed": ("allocator in use (gpumem only)", check_installed),
    "oom": ("torch.empty larger than the device", check_oom),
    "record_stream": ("record_stream(B), del, new tensors on A (20 iterations)", check_record_stream),
    "record_stream_stress": ("record_stream stress: 3000 iterations, 4 streams, 512 B-64 MiB", check_record_stream_stress),
    "graph": ("torch.cuda.graph of an MLP 1024-8192-8192-1024, batch 256, replayed", check_graph),
    "graph_empty_cache": ("torch.cuda.graph, 3 replays, then empty_cache after 8 GiB freed", check_graph_then_empty_cache),
    "graphed_callables": ("torch.cuda.make_graphed_callables, 5 training steps vs eager", check_graphed_callables),
    "mempool": ("torch.cuda.MemPool + use_mem_pool", check_mempool),
    "compile": ('torch.compile(mode="reduce-overhead") of an MLP: 6 calls and 6 training steps vs eager', check_compile),
    "empty_cache": ("empty_cache after 8 GiB freed", check_empty_cache),
    "fraction": ("set_per_process_memory_fraction(0.1), then a 30% tensor", check_fraction),
    "stats": ("memory_allocated/max/reserved/memory_stats/memory_summary/reset_peak", check_stats),
    "bad_pointer": ("caching_allocator_delete(unknown pointer)", check_bad_pointer),
}


def run_one(name: str, allocator: str) -> Dict[str, Any]:
    """Run one check in this (fresh) interpreter with 'torch' or 'gpumem' as the allocator."""
    import torch

    if allocator == "gpumem":
        import gpumem.torch

        gpumem.torch.enable()
    elif name == "installed":
        return {"ok": None, "summary": "native", "detail": {}}
    t0 = time.time()
    try:
        ok, summary, detail = CHECKS[name][1](torch)
    except Exception as e:  # noqa: BLE001 - reported in the table
        return {"ok": False, "summary": "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:120] if str(e) else ""),
                "detail": {"traceback": traceback.format_exc()}}
    return {"ok": bool(ok), "summary": summary, "detail": detail, "seconds": round(time.time() - t0, 2)}


# ---------------------------------------------------------------- the parent: two children per check


def run_child(name: str, allocator: str) -> Dict[str, Any]:
    env = dict(os.environ)
    if os.path.isdir(os.path.join(BINDINGS, "gpumem")):
        env["PYTHONPATH"] = BINDINGS + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("GPUMEM_BACKEND", "cuda")
    code = "import sys, json; sys.path.insert(0, %r); import torch_parity as t; print('RESULT ' + json.dumps(t.run_one(%r, %r)))" % (
        HERE, name, allocator)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"ok": False, "summary": "crashed (exit %d): %s" % (r.returncode, tail[0][:120]), "detail": {}}
    return json.loads(lines[-1][len("RESULT "):])


def mark(res: Dict[str, Any]) -> str:
    return {True: "PASS", False: "FAIL", None: "-"}[res["ok"]] + " " + res["summary"]


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checks", nargs="*", help="checks to run (default: all): " + ", ".join(CHECKS))
    ap.add_argument("--json", action="store_true", help="print the raw results as JSON")
    args = ap.parse_args(argv)
    names = args.checks or list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        ap.error("unknown checks: " + ", ".join(unknown))
    results = {n: {"torch": run_child(n, "torch"), "gpumem": run_child(n, "gpumem")} for n in names}
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print("| what the user does | PyTorch's allocator | with gpumem.torch |")
        print("|---|---|---|")
        for n in names:
            print("| %s | %s | %s |" % (CHECKS[n][0], mark(results[n]["torch"]), mark(results[n]["gpumem"])))
    failed = [n for n in names if results[n]["gpumem"]["ok"] is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
