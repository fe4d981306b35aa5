"""Shared GPUs from Python: the members of the group and asking them for their cache
(``Context.share_members``, ``Context.share_reclaim``; docs/SHARED-GPUS.md). Two processes share a
simulated GPU through ``GPUMEM_SIM_SHARED``, as two jobs on one GPU share it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import gpumem
from conftest import MiB, PKG_DIR, INSTALLED, run_python, sim_env

HOLDER = textwrap.dedent(
    """
    import sys, gpumem
    c = gpumem.Context(backend="sim")
    b = c.alloc(64 << 20); b.free()  # 64 MiB cached, nothing live: an idle neighbour
    print("ready", c.stats(0)["reserved_bytes"], flush=True)
    sys.stdin.readline()
    print("after", c.stats(0)["reserved_bytes"], flush=True)
    c.close()
    """
)

ASKER = """
    import json, gpumem
    c = gpumem.Context(backend="sim")
    b = c.alloc(1 << 20)
    members = c.share_members()
    given, answered = c.share_reclaim(wait_ms=5000)
    print(json.dumps({"members": members, "given": given, "answered": answered}))
    b.free(); c.close()
"""


def _env(name):
    env = dict(os.environ)
    for k, v in sim_env(GPUMEM_SIM_SHARED=name, GPUMEM_SIM_DEVICES="1x4GiB", GPUMEM_SHARE=None).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    if not INSTALLED:
        env["PYTHONPATH"] = PKG_DIR
    env.setdefault("GPUMEM_LIBRARY", gpumem.capi.library_path)
    return env


def test_members_and_reclaim_between_two_processes():
    name = "pytest-share-%d" % os.getpid()
    env = _env(name)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], env=env, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = holder.stdout.readline().split()
        assert line and line[0] == "ready", holder.stderr.read()
        assert int(line[1]) == 64 * MiB
        r = run_python(ASKER, env={k: env.get(k) for k in ("GPUMEM_BACKEND", "GPUMEM_SIM_SHARED",
                                                           "GPUMEM_SIM_DEVICES", "CUDA_VISIBLE_DEVICES",
                                                           "GPUMEM_SHARE")})
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout)
        assert len(out["members"]) == 2
        other = [m for m in out["members"] if m["pid"] == holder.pid]
        me = [m for m in out["members"] if m["self"]]
        assert len(other) == 1 and len(me) == 1 and me[0]["pid"] != holder.pid
        other = other[0]
        assert not other["self"] and other["group"] == "user" and other["command"].startswith("python")
        assert other["cached_bytes"] == 64 * MiB and other["live_bytes"] == 0 and other["listening"]
        assert me[0]["live_bytes"] == 1 * MiB
        assert out["answered"] == 1 and out["given"] == 64 * MiB
        holder.stdin.write("go\n")
        holder.stdin.flush()
        line = holder.stdout.readline().split()
        assert line == ["after", "0"]  # the idle neighbour's cache went back to the GPU
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait(timeout=30)
        try:
            os.unlink("/dev/shm/gpumem-sim-%d-%s" % (os.getuid(), name))
        except OSError:
            pass


def test_share_calls_on_a_gpu_of_ones_own(sim_ctx):
    """A simulated device without GPUMEM_SIM_SHARED is this process's alone: no group."""
    with pytest.raises(gpumem.NotSupportedError):
        sim_ctx.share_members()
    with pytest.raises(gpumem.NotSupportedError):
        sim_ctx.share_reclaim()
    with pytest.raises(gpumem.InvalidDeviceError):
        sim_ctx.share_members(device=sim_ctx.device_count + 5)
    with pytest.raises(gpumem.InvalidArgumentError):
        sim_ctx.share_reclaim(wait_ms=1 << 33)
