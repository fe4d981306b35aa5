#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_ops (fuzz/corpus/seed-*), one file per scenario.
The encoding mirrors run_input() in fuzz_ops.c: 2 config bytes, then per
operation one code byte (code % 20 picks it) and its argument bytes."""
import os, struct, sys

def size(kind, v): return bytes([kind]) + struct.pack('<I', v)
def alloc(dev, stream, kind, v): return bytes([0, dev, stream]) + size(kind, v)
def free(k, stream): return bytes([5, k, stream])
def bad_free(k, *extra): return bytes([9, k] + list(extra))
def trim(k, keep_kib=None): return bytes([10, k]) + (struct.pack('<H', keep_kib) if keep_kib is not None else b'')
def reset(k): return bytes([11, k])
def scope_begin(j, dev, stream): return bytes([12, j, dev, stream])
def scope_alloc(j, kind, v, tag=1): return bytes([13, j]) + size(kind, v) + bytes([tag])
def scope_end(j): return bytes([14, j])
def buffer_alloc(j, dev, stream, kind, v): return bytes([15, j, dev, stream]) + size(kind, v)
def buffer_release(j): return bytes([15, j])
def fault(k, nth): return bytes([16, k, nth])
def fault_clear(): return bytes([17])
def sim(k, extra=None): return bytes([18, k]) + (bytes([extra]) if extra is not None else b'')
def queries(k): return bytes([19, k])

seeds = {
    # every size class on both devices, frees on the same and other streams
    'classes': bytes([0, 0]) + alloc(0, 0, 0, 100) + alloc(1, 1, 5, 500000) + alloc(0, 2, 8, 3000000)
               + alloc(1, 3, 10, 5000000) + alloc(0, 0, 12, 1) + alloc(0, 0, 13, 3) + free(0, 0) + free(0, 2)
               + free(1, 1) + free(0, 3) + trim(0x10) + free(0, 0),
    # delayed events: cross-stream frees, reuse only after completion
    'delayed': bytes([4, 0]) + sim(0) + alloc(0, 1, 5, 300000) + alloc(0, 1, 5, 300000) + free(0, 2) + free(0, 3)
               + alloc(0, 1, 5, 300000) + sim(2, 2) + alloc(0, 2, 5, 300000) + sim(3) + trim(0x11) + sim(1),
    # scopes and buffers, one scope outliving a reset of its device
    'scope': bytes([0, 0]) + scope_begin(0, 0, 1) + scope_alloc(0, 0, 1000) + scope_alloc(0, 8, 2000000, 0)
             + scope_begin(1, 1, 2) + scope_alloc(1, 5, 70000) + buffer_alloc(0, 1, 0, 0, 64) + scope_end(0)
             + reset(2) + buffer_release(0) + scope_end(1),
    # reset of one device and of all, stale pointers freed
    'reset': bytes([0, 0]) + alloc(0, 0, 0, 10) + alloc(1, 0, 0, 20) + alloc(0, 1, 9, 4000000) + reset(0)
             + bad_free(0) + alloc(0, 0, 0, 30) + reset(1) + free(0, 0),
    # faults of every kind, once and repeating, then cleared
    'faults': bytes([1, 0]) + fault(0, 1) + alloc(0, 0, 0, 100) + fault(0x40, 1) + alloc(0, 0, 10, 3000000)
              + fault(1, 1) + alloc(0, 0, 0, 100) + free(0, 0) + trim(0x11) + fault(0x82, 1) + alloc(1, 1, 0, 5)
              + free(0, 2) + alloc(1, 3, 0, 5) + fault(3, 1) + queries(0) + fault(4, 1) + reset(0) + fault(5, 1)
              + fault_clear() + alloc(0, 0, 0, 100),
    # out of memory with the callback (frees blocks, retries), external usage, limit
    'oom': bytes([0x50, 0x06]) + alloc(0, 0, 11, 20000000) + alloc(0, 0, 11, 1000000) + alloc(0, 0, 10, 20000000)
           + sim(4, 30) + alloc(0, 0, 10, 25000000) + sim(4, 0) + alloc(0, 0, 10, 30000000),
    # absurd sizes, bad devices, interior and foreign frees
    'misuse': bytes([0, 0]) + alloc(0, 0, 14, 0) + alloc(1, 0, 14, 2) + alloc(0, 0, 15, 5) + alloc(0, 0, 14, 11)
              + queries(0xfe) + queries(3) + queries(0x83) + alloc(0, 0, 5, 100000) + bad_free(2, 0, 3, 7)
              + bad_free(3) + free(0, 0) + bad_free(0),
    # initial segment, thresholds, low free-memory trimming
    'thresholds': bytes([0x86, 0x30]) + alloc(0, 0, 0, 4000) + alloc(0, 1, 8, 5000000) + free(0, 1) + sim(4, 50)
                  + alloc(0, 2, 10, 9000000) + free(0, 0) + free(0, 0) + trim(0, 2048),
}

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), 'corpus')
os.makedirs(out, exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(out, 'seed-' + name), 'wb') as f:
        f.write(data)
print(f'{len(seeds)} seeds written to {out}')
