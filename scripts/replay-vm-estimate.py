#!/usr/bin/env python3
"""Placement variants on sim, judged by what their backend calls would cost on an H200.

    scripts/replay-vm-estimate.py REPLAY [TRACE...]

Runs REPLAY (a gpumem-replay binary, sim backend) on each trace cold and after 1, 2, 3, 4, 6, 8, 12
and 16 warm passes, and prints per trace: the cold held/live ratio, the mean and largest warm ratio,
and the mean warm pass's virtual-memory calls with the host time they would take on an idle H200
(us: 8 per create, 36 per map with its set-access, 22 per unmap, 13 per destroy; tools/vm_cost.cu,
bench/results/2026-12-h200-runs.md runs 32 and 55). Without traces: bert_dyn and gpt2_gen from
../shared/traces and three of examples/traces. A variant is a second build of the library (a
-D override of a constant in src/expandable.c or src/vmseg.c) compared with the first in one run.
"""
import concurrent.futures as cf
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WARM = [0, 1, 2, 3, 4, 6, 8, 12, 16]
COST = {"vm_create_calls": 8, "vm_map_calls": 36, "vm_unmap_calls": 22, "vm_destroy_calls": 13}


def default_traces():
    shared = os.path.join(ROOT, "..", "shared", "traces")
    ex = os.path.join(ROOT, "examples", "traces")
    names = [os.path.join(shared, "bert_dyn.txt.gz"), os.path.join(shared, "gpt2_gen.txt.gz"),
             os.path.join(ex, "transformer_dyn_train_live.txt.gz"), os.path.join(ex, "resnet50_train_live.txt.gz"),
             os.path.join(ex, "multistream_two_models.txt.gz")]
    return [t for t in names if os.path.exists(t)]


def one(replay, trace, warm):
    out = subprocess.run([replay, "--json", "--warm", str(warm), trace], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)["traces"][0]
    return warm, r["ratio"], sum(COST[k] * r[k] for k in COST), r["vm_map_calls"], r["vm_create_calls"], r["vm_destroy_calls"]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    replay, traces = sys.argv[1], sys.argv[2:] or default_traces()
    total = 0.0
    with cf.ThreadPoolExecutor(os.cpu_count() or 2) as ex:
        for t in traces:
            rs = sorted(ex.map(lambda w: one(replay, t, w), WARM))
            cold, warm = rs[0], rs[1:]
            us = statistics.mean(x[2] for x in warm)
            total += us
            print(f"{os.path.basename(t):36s} cold {cold[1]:.3f} | warm ratio mean {statistics.mean(x[1] for x in warm):.4f}"
                  f" max {max(x[1] for x in warm):.3f} | a warm pass: {us:7.0f} us, maps {statistics.mean(x[3] for x in warm):6.1f}"
                  f" creates {statistics.mean(x[4] for x in warm):5.1f} destroys {statistics.mean(x[5] for x in warm):5.1f}")
    print(f"all traces: {total:.0f} us of backend calls in a warm pass")


if __name__ == "__main__":
    main()
