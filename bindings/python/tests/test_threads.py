"""Several threads using one context (the C library is thread-safe; so is the binding)."""

from __future__ import annotations

import ctypes
import random
import threading
import time

import gpumem
from conftest import is_sim

THREADS = 8
ROUNDS = 300


def _run(threads):
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_concurrent_alloc_free(ctx):
    errors = []
    sim = is_sim(ctx)

    def worker(seed):
        rng = random.Random(seed)
        live = []
        try:
            for i in range(ROUNDS):
                size = rng.choice([64, 1000, 4096, 65536, 1 << 20])
                buf = ctx.alloc(size)
                if sim:  # stamp and check: no two live buffers overlap
                    ctypes.memset(buf.ptr, seed & 0xFF, min(size, 256))
                live.append(buf)
                if len(live) > 8 or rng.random() < 0.3:
                    victim = live.pop(rng.randrange(len(live)))
                    if sim:
                        assert ctypes.string_at(victim.ptr, min(victim.size, 256)) == bytes([seed & 0xFF]) * min(victim.size, 256)
                    victim.free()
                if i % 50 == 0:
                    ctx.stats()
            for b in live:
                b.free()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    _run([threading.Thread(target=worker, args=(s,)) for s in range(THREADS)])
    assert errors == []
    st = ctx.stats()
    assert st["num_allocs"] == THREADS * ROUNDS == st["num_frees"]
    assert st["num_live"] == 0 and st["allocated_bytes"] == 0


def test_concurrent_scopes_trim_and_gc(ctx):
    errors = []

    def scopes():
        try:
            for _ in range(100):
                with ctx.scope() as sc:
                    for _ in range(5):
                        sc.alloc(4096)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def forgetful():
        try:
            for _ in range(300):
                ctx.alloc(2048)  # dropped at once: freed by its finalizer
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def trimmer():
        try:
            for _ in range(50):
                ctx.trim()
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    _run([threading.Thread(target=f) for f in (scopes, scopes, forgetful, forgetful, trimmer)])
    assert errors == []
    st = ctx.stats()
    assert st["num_live"] == 0
    assert st["num_allocs"] == st["num_frees"] == 2 * 100 * 5 + 2 * 300


def test_buffers_freed_from_other_threads(ctx):
    """Buffers handed between threads and freed there are counted once."""
    bufs = [ctx.alloc(1024) for _ in range(200)]
    chunks = [bufs[i::4] for i in range(4)]

    def free_all(chunk):
        for b in chunk:
            b.free()
            b.free()

    _run([threading.Thread(target=free_all, args=(c,)) for c in chunks + chunks])
    st = ctx.stats()
    assert st["num_frees"] == 200 and st["num_live"] == 0


def test_reset_while_threads_allocate(ctx):
    """ctx.reset on one thread while others allocate and free Buffers: every Buffer still alive
    afterwards owns a live block of its own (none was invalidated behind its back, no two share an
    address), and frees never raise. Before, reset marked Buffers dead before the C reset and out of
    step with allocations in flight, so a Buffer could stay alive on an invalidated block."""
    errors = []
    keep = []
    ops = [0]
    stop = threading.Event()

    def worker(seed):
        rng = random.Random(seed)
        live = []
        try:
            while not stop.is_set():
                ops[0] += 1
                if live and rng.random() < 0.45:
                    live.pop(rng.randrange(len(live))).free()
                else:
                    live.append(ctx.alloc(rng.choice((256, 4096, 65536, 3 << 20))))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))
        keep.extend(live)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    resets = 0
    while (resets < 200 or ops[0] < 20000) and all(t.is_alive() for t in threads):  # counted, not timed
        ctx.reset(device=0)
        resets += 1
        if resets % 8 == 0:
            time.sleep(0)  # let the workers run
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    alive = [b for b in keep if b.alive]
    assert len({b.ptr for b in alive}) == len(alive)
    for b in alive:
        assert ctx.ptr_info(b.ptr)[0] == b.size
    assert ctx.stats()["num_live"] >= len(alive)
    for b in keep:
        b.free()
    ctx.reset(device=0)
    assert ctx.stats()["num_live"] == 0
