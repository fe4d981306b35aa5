"""gpumem.torch keeps the promises of PyTorch's own CUDA caching allocator.

Each test runs in a fresh interpreter (PyTorch's allocator can be swapped only
before CUDA is first used) and, where the row compares behaviour, runs the same
code with PyTorch's allocator too and requires the same outcome. Skipped
without PyTorch, an NVIDIA GPU or a libgpumem with the CUDA backend. The checks
themselves live in examples/python/torch_parity.py, which also prints them as
a side-by-side table.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys

import pytest

import gpumem
from conftest import GPU_ENV, need_gpu, run_python

HAVE_TORCH = importlib.util.find_spec("torch") is not None
REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, os.pardir))
SCRIPT = os.path.join(REPO, "examples", "python", "torch_parity.py")

pytestmark = pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed")


@pytest.fixture(scope="module", autouse=True)
def gpu_present():
    need_gpu()


def run_check(name: str, allocator: str) -> dict:
    """Run one check of torch_parity.py in a fresh interpreter; returns its JSON result."""
    code = (
        "import sys, json; sys.path.insert(0, %r); import torch_parity as t; "
        "print('RESULT ' + json.dumps(t.run_one(%r, %r)))" % (os.path.dirname(SCRIPT), name, allocator)
    )
    r = run_python(code, env=GPU_ENV, timeout=600)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    assert r.returncode == 0 and lines, "check %s with %s failed:\n%s\n%s" % (name, allocator, r.stdout, r.stderr)
    return json.loads(lines[-1][len("RESULT "):])


def both(name: str) -> "tuple[dict, dict]":
    return run_check(name, "torch"), run_check(name, "gpumem")


def test_enable_installs_the_shim():
    r = run_check("installed", "gpumem")
    assert r["ok"], r
    assert r["detail"]["name"] == "gpumem" and r["detail"]["enabled"] is True, r


def test_out_of_memory_raises_torch_oom_with_the_figures():
    ref, got = both("oom")
    assert ref["ok"], ref
    assert got["ok"], got
    msg = got["detail"]["message"]
    for part in ("Tried to allocate", "total capacity", "is free", "reserved", "allocated", "cached",
                 "largest free cached block"):
        assert part in msg, (part, msg)
    assert str(got["detail"]["requested"]) in msg, msg
    assert got["detail"]["tensor_after"] is True  # the allocator still works afterwards


def test_record_stream_keeps_the_block_until_the_other_stream_is_done():
    ref, got = both("record_stream")
    assert ref["ok"] and ref["detail"]["wrong"] == 0, ref
    assert got["ok"] and got["detail"]["wrong"] == 0, got


def test_cuda_graph_capture_and_replay_of_an_mlp():
    ref, got = both("graph")
    assert ref["ok"], ref
    assert got["ok"], got
    assert got["detail"]["replays"] == ref["detail"]["replays"] and got["detail"]["outside_wrong"] == 0, got


def test_make_graphed_callables():
    ref, got = both("graphed_callables")
    assert ref["ok"], ref
    assert got["ok"], got


def test_mem_pool_use_count_and_routing():
    ref, got = both("mempool")
    assert ref["ok"], ref
    assert got["ok"], got
    assert got["detail"]["use_counts"] == ref["detail"]["use_counts"], (ref, got)


def test_empty_cache_returns_memory_to_the_device():
    ref, got = both("empty_cache")
    assert ref["ok"], ref
    assert got["ok"], got
    assert got["detail"]["returned_gib"] >= 0.9 * got["detail"]["freed_gib"], got


def test_memory_fraction_is_a_limit():
    ref, got = both("fraction")
    assert ref["ok"], ref
    assert got["ok"], got
    assert "limit" in got["detail"]["message"], got
    assert abs(got["detail"]["fraction_read_back"] - 0.1) < 1e-9, got


def test_memory_statistics():
    ref, got = both("stats")
    assert ref["ok"], ref
    assert got["ok"], got
    assert set(ref["detail"]["keys"]) <= set(got["detail"]["keys"]), set(ref["detail"]["keys"]) - set(got["detail"]["keys"])


def test_raw_delete_of_an_unknown_pointer_raises():
    ref, got = both("bad_pointer")
    assert got["ok"], got
    assert "gpumem" in got["detail"]["message"], got


def test_too_late_still_raises_allocator_in_use():
    r = run_python(
        """
        import torch, gpumem, gpumem.torch
        x = torch.zeros(16, device="cuda")
        try:
            gpumem.torch.enable()
        except gpumem.AllocatorInUseError as e:
            print("refused", "before" in str(e))
        """,
        env=GPU_ENV,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip() == "refused True"


def test_no_compiler_gives_a_clear_error(tmp_path):
    r = run_python(
        """
        import gpumem.torch
        try:
            gpumem.torch.build_shim()
            print("prebuilt")
        except gpumem.torch.ShimBuildError as e:
            print("error:", e)
        """,
        env={"CXX": "no-such-compiler", "PATH": str(tmp_path), "GPUMEM_TORCH_BUILD_DIR": str(tmp_path / "b")},
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    if r.stdout.strip() == "prebuilt":
        pytest.skip("the shim was prebuilt at install time: no compiler needed")
    assert "C++17 compiler" in r.stdout and "no-such-compiler" in r.stdout, r.stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def test_record_stream_stress_multi_stream():
    ref, got = both("record_stream_stress")
    assert ref["ok"], ref
    assert got["ok"], got
    assert got["detail"]["wrong"] == 0 and got["detail"]["iterations"] >= 3000, got


def test_torch_compile_reduce_overhead_trains_like_eager():
    ref, got = both("compile")
    assert ref["ok"], ref
    assert got["ok"], got
    assert got["detail"]["others_wrong"] == 0, got
