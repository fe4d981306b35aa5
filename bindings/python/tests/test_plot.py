"""gpumem.plot: trace reading, the replay's samples and marks, the live recorder, the picture
(matplotlib, skipped without it) and the PyTorch snapshot (read back by PyTorch's own
_memory_viz where PyTorch is installed, skipped elsewhere)."""

from __future__ import annotations

import gzip
import importlib.util
import os
import pickle

import pytest

import gpumem
import gpumem.plot as gplot
from conftest import MiB, PKG_DIR, run_python

HAVE_MPL = importlib.util.find_spec("matplotlib") is not None
HAVE_TORCH = importlib.util.find_spec("torch") is not None
REPO = os.path.abspath(os.path.join(PKG_DIR, os.pardir, os.pardir))
RESNET = os.path.join(REPO, "examples", "traces", "resnet50.txt.gz")

# live bytes on device 0 after each of its events: 1, 4, 4.5, 3.5, 9.5, (oom), 3.5+... see below
SMALL = """# a small trace
# pytorch max_allocated 1 max_reserved 20000000
a 1 1000000 0
a 2 3000000 0
a 3 500000 77
f 1
a 4 6000000 0
f 2
a 5 50000000 0
f 4
a 6 2000000 0 1
f 3
f 6
a 7 4000000 0
f 99
"""


@pytest.fixture
def small(tmp_path):
    p = tmp_path / "small.txt.gz"
    with gzip.open(p, "wt") as f:
        f.write(SMALL)
    return str(p)


def sim_only():
    with gpumem.Context(backend="sim") as c:
        if c.backend != "sim":
            pytest.skip("needs the sim backend")


def test_read_trace(small, tmp_path):
    ev = list(gplot.read_trace(small))
    assert ev[0] == ("a", 1, 1000000, 0, 0)
    assert ("a", 6, 2000000, 0, 1) in ev and ("f", 99, None) in ev
    assert len(ev) == 13
    bad = tmp_path / "bad.txt"
    for line in ("x 2", "n 1", "n 1 2 3", "f 1 2 3", "f 1 x"):
        bad.write_text("a 1 100 0\n%s\n" % line)
        with pytest.raises(ValueError, match=r"bad.txt:2: not a trace line"):
            list(gplot.read_trace(str(bad)))
    # gpumem_record_stream ('n ID STREAM') and a free on another stream than the allocation's
    noted = tmp_path / "noted.txt"
    noted.write_text("a 1 4194304 5\nn 1 7\nf 1 9\na 2 100 5\nf 2\n")
    assert list(gplot.read_trace(str(noted))) == [("a", 1, 4194304, 5, 0), ("n", 1, 7), ("f", 1, 9),
                                                  ("a", 2, 100, 5, 0), ("f", 2, None)]

    assert gplot.parse_size("3GiB") == 3 << 30 and gplot.parse_size("512M") == 512 << 20
    with pytest.raises(ValueError):
        gplot.parse_size("lots")


def test_replay_samples_peaks_trims_and_oom(small):
    sim_only()
    tl = gplot.replay(small, release_threshold=0, limit_bytes=32 * MiB)
    assert tl.devices() == [0, 1]
    live0 = [s.live for s in tl.samples if s.device == 0]
    assert live0[:5] == [1000000, 4000000, 4500000, 3500000, 9500000]
    assert tl.peaks()[0]["live"] == 9500000 and tl.peaks()[1]["live"] == 2000000
    assert all(s.reserved >= s.live and s.cached == s.reserved - s.allocated for s in tl.samples)
    kinds = [(m.kind, m.device) for m in tl.marks]
    assert ("oom", 0) in kinds  # 50 MB past the 32 MiB limit, at event 7
    assert [m.x for m in tl.marks if m.kind == "oom"] == [7]
    assert any(k == ("trim", 0) for k in kinds) and any(k == ("trim", 1) for k in kinds)  # release_threshold 0
    peak = next(m for m in tl.marks if m.kind == "peak-live" and m.device == 0)
    assert peak.x == 5 and peak.bytes == 9500000
    assert tl.torch_reserved == 20000000
    # without the limit: no out-of-memory event, and with the default threshold no trim
    tl2 = gplot.replay(small)
    assert not [m for m in tl2.marks if m.kind in ("oom", "trim")]


def test_replay_of_the_resnet50_trace_matches_gpumem_replay():
    sim_only()
    tl = gplot.replay(RESNET, snapshot=False, every=50)
    p = tl.peaks()[0]
    assert p["live"] == 3127304348  # shared/traces/README.md's peak_live
    assert p["live"] <= p["reserved"] < 1.05 * p["live"]


def test_snapshot_is_pytorchs_format(small, tmp_path):
    sim_only()
    tl = gplot.replay(small, release_threshold=0)
    out = tmp_path / "snap.pickle"
    gplot.save_torch_snapshot(tl, str(out))
    with open(out, "rb") as f:
        snap = pickle.load(f)
    assert set(snap) >= {"segments", "device_traces"} and len(snap["device_traces"]) == 2
    tr0 = snap["device_traces"][0]
    actions = [e["action"] for e in tr0]
    assert actions.count("alloc") == 6 and actions.count("free_completed") == 4
    assert actions.count("free_requested") == 4
    assert any(a in ("segment_alloc", "segment_map") for a in actions)
    assert all({"action", "addr", "size", "stream", "time_us", "frames"} <= set(e) for e in tr0)
    # each allocation lies in memory a segment event brought in before it
    ranges = []
    for e in tr0:
        if e["action"] in ("segment_alloc", "segment_map"):
            ranges.append((e["addr"], e["addr"] + e["size"]))
        if e["action"] == "alloc":
            assert any(lo <= e["addr"] and e["addr"] + e["size"] <= hi + 64 * MiB for lo, hi in ranges)
    # the end state: device 0 holds blocks 5 and 7 (never freed); each segment's blocks tile it
    for seg in snap["segments"]:
        assert sum(b["size"] for b in seg["blocks"]) == seg["total_size"]
        assert seg["allocated_size"] == sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
    assert sum(s["allocated_size"] for s in snap["segments"] if s["device"] == 0) == 54000000
    no_snap = gplot.replay(small, snapshot=False)
    with pytest.raises(ValueError, match="no snapshot data"):
        gplot.to_torch_snapshot(no_snap)


@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed")
def test_snapshot_reads_back_in_pytorchs_memory_viz(small, tmp_path):
    sim_only()
    from torch.cuda import _memory_viz as mv

    tl = gplot.replay(small, release_threshold=0)
    path = tmp_path / "snap.pickle"
    gplot.save_torch_snapshot(tl, str(path))
    with open(path, "rb") as f:
        snap = pickle.load(f)
    text = mv.segsum(snap)  # asserts that blocks tile segments and sizes add up
    assert "total_reserved" in text
    tr = mv.trace(snap)
    assert "Device 0" in tr and "Device 1" in tr and "raise OutOfMemoryError" not in tr
    html = mv.trace_plot(snap)
    assert "snapshot.pickle" in html
    # the viewer's command line, as a user runs it
    r = run_python("import runpy, sys; sys.argv = ['_memory_viz', 'trace_plot', %r, '-o', %r]; "
                   "runpy.run_module('torch.cuda._memory_viz', run_name='__main__')"
                   % (str(path), str(tmp_path / "viz.html")))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "viz.html").stat().st_size > 1000
    # the limit's out-of-memory event is one the viewer knows
    tl2 = gplot.replay(small, limit_bytes=32 * MiB)
    assert "raise OutOfMemoryError" in mv.trace(gplot.to_torch_snapshot(tl2))


def test_recorder_on_a_live_context():
    with gpumem.Context(backend="sim", release_threshold=None) as ctx:
        with pytest.raises(TypeError):
            gplot.record(object())
        with pytest.raises(ValueError):
            gplot.record(ctx, interval=0)
        with gplot.record(ctx, interval=0.001) as rec:
            bufs = [ctx.alloc(4 * MiB) for _ in range(8)]
            rec.sample()
            for b in bufs:
                b.free()
            rec.sample()
            ctx.trim()
            rec.sample()
        tl = rec.timeline
    assert tl.x_label == "seconds" and len(tl.samples) >= 4
    assert tl.peaks()[0]["live"] == 32 * MiB
    assert [m for m in tl.marks if m.kind == "trim"]
    xs = [s.x for s in tl.samples]
    assert xs == sorted(xs)


@pytest.mark.skipif(not HAVE_MPL, reason="matplotlib is not installed")
def test_plot_png_and_svg(small, tmp_path):
    sim_only()
    tl = gplot.replay(small, release_threshold=0, limit_bytes=32 * MiB)
    png = gplot.plot(tl, str(tmp_path / "m.png"))
    svg = gplot.plot(tl, str(tmp_path / "m.svg"), title="small")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with open(svg) as f:
        text = f.read()
    assert "<svg" in text and "out of memory (1)" in text and "trim (" in text and "peak live" in text
    with pytest.raises(ValueError, match=".png or .svg"):
        gplot.plot(tl, str(tmp_path / "m.jpg"))


def test_command_line(small, tmp_path):
    sim_only()
    snap = tmp_path / "s.pickle"
    args = [small, "--snapshot", str(snap), "--limit", "32MiB"]
    if HAVE_MPL:
        args += ["-o", str(tmp_path / "m.png")]
    assert gplot.main(args) == 0
    assert snap.stat().st_size > 0
    if HAVE_MPL:
        assert (tmp_path / "m.png").stat().st_size > 0
    with pytest.raises(SystemExit) as ei:
        gplot.main([small])  # nothing to write
    assert ei.value.code == 2
    with pytest.raises(SystemExit):
        gplot.main([small, "-o", str(tmp_path / "m.gif")])
    with pytest.raises(SystemExit):
        gplot.main([small, "--snapshot", str(snap), "--limit", "lots"])
    assert gplot.main([str(tmp_path / "missing.txt"), "--snapshot", str(snap)]) == 1


def test_replay_of_record_stream_lines(tmp_path):
    sim_only()
    noted = tmp_path / "noted.txt"
    noted.write_text("a 1 4194304 5\nn 1 7\nf 1 9\na 2 100 5\nf 2\n")
    tl = gplot.replay(str(noted), snapshot=False)
    assert tl.peaks()[0]["live"] == 4194304 and tl.samples[-1].live == 0
    # events given as a list, frees in the older two-field form
    tl = gplot.replay([("a", 1, 4096, 0, 0), ("f", 1)], snapshot=False)
    assert tl.peaks()[0]["live"] == 4096 and tl.samples[-1].live == 0
