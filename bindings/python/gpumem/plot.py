"""Memory over time: live, reserved and cached bytes per device, as a picture or for PyTorch's viewer.

From an allocation trace (``GPUMEM_TRACE``, or the PyTorch traces of
``shared/traces``; format in docs/MONITORING.md), replayed through libgpumem
(the sim backend unless told otherwise), one sample after every event::

    python -m gpumem.plot TRACE -o mem.png                 # or mem.svg; matplotlib needed
    python -m gpumem.plot TRACE --snapshot mem.pickle      # for PyTorch's memory viewer
    python -m gpumem.plot TRACE -o mem.png --release-threshold 1GiB --limit 3GiB

From a live context, sampled every ``interval`` seconds while a block runs::

    with gpumem.plot.record(ctx, interval=0.01) as rec:
        train()
    gpumem.plot.plot(rec.timeline, "mem.png", x="time")

Each curve is one device's: ``live`` (bytes asked for by live allocations),
``reserved`` (bytes libgpumem holds from the device) and ``cached`` (reserved
bytes not in live blocks). Trims (memory given back), out-of-memory events and
the peaks of live and reserved bytes are marked.

The snapshot (:func:`to_torch_snapshot`, ``--snapshot``) is the pickle that
``torch.cuda.memory._snapshot()`` produces: ``segments`` (libgpumem's segments
at the end of the replay, with their blocks) and ``device_traces`` (every
allocation, free, segment allocation or mapping, and out-of-memory event), so
that PyTorch's memory viewer (https://pytorch.org/memory_viz, or
``python -m torch.cuda._memory_viz trace_plot mem.pickle -o mem.html``) shows
libgpumem's memory. Addresses are those of the replay (sim addresses on sim).

matplotlib is needed only for :func:`plot` (``pip install gpumem[plot]``).
"""

from __future__ import annotations

import argparse
import bisect
import ctypes
import gzip
import os
import pickle
import re
import sys
import threading
import time
from ctypes import byref, c_int, c_size_t, c_uint64, c_void_p
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from . import capi
from ._core import ALL_DEVICES, Context
from .errors import GpumemError, make_error

__all__ = [
    "Sample", "Mark", "Timeline", "read_trace", "replay", "record", "Recorder", "plot",
    "to_torch_snapshot", "save_torch_snapshot", "main",
]

#: default sim devices for a replay when GPUMEM_SIM_DEVICES is unset (as gpumem-replay: an H200's memory)
SIM_DEVICE_SIZE = "141GiB"


@dataclass
class Sample:
    """One reading of one device: after a trace event (``x`` = event number) or at a time (seconds)."""

    x: float
    device: int
    live: int
    reserved: int
    cached: int
    allocated: int


@dataclass
class Mark:
    """A trim (``bytes`` given back), an out-of-memory event (``bytes`` asked for) or a peak."""

    kind: str  # "trim", "oom", "peak-live", "peak-reserved"
    x: float
    device: int
    bytes: int


@dataclass
class Timeline:
    """Samples and marks of a replay or a recording; ``x_label`` says what ``Sample.x`` counts."""

    samples: List[Sample] = field(default_factory=list)
    marks: List[Mark] = field(default_factory=list)
    x_label: str = "event"
    title: str = ""
    #: PyTorch snapshot parts gathered during a replay (None for a live recording)
    torch_trace: Optional[Dict[int, List[Dict[str, Any]]]] = None
    torch_segments: Optional[List[Dict[str, Any]]] = None
    #: PyTorch's own max_memory_reserved of the traced run, where the trace's header says it
    torch_reserved: Optional[int] = None

    def devices(self) -> List[int]:
        return sorted({s.device for s in self.samples})

    def series(self, device: int) -> Dict[str, List[float]]:
        """The curves of one device: x, live, reserved, cached, allocated."""
        out: Dict[str, List[float]] = {k: [] for k in ("x", "live", "reserved", "cached", "allocated")}
        for s in self.samples:
            if s.device == device:
                for k in out:
                    out[k].append(getattr(s, k))
        return out

    def peaks(self) -> Dict[int, Dict[str, int]]:
        """Per device: the largest live and reserved bytes seen."""
        out: Dict[int, Dict[str, int]] = {}
        for s in self.samples:
            p = out.setdefault(s.device, {"live": 0, "reserved": 0})
            p["live"] = max(p["live"], s.live)
            p["reserved"] = max(p["reserved"], s.reserved)
        return out


# ---------------------------------------------------------------------------- traces

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([KMGT]?)(i?B?)\s*$", re.IGNORECASE)


def parse_size(text: Union[str, int]) -> int:
    """``"3GiB"``, ``"512M"``, ``"4096"`` -> bytes (binary units, as GPUMEM_* variables)."""
    if isinstance(text, int):
        return text
    m = _SIZE_RE.match(str(text))
    if not m:
        raise ValueError("not a size: %r (e.g. 4096, 512MiB, 3GiB)" % (text,))
    return int(m.group(1)) << (10 * " KMGT".index((m.group(2) or " ").upper()))


def read_trace(path: str) -> Iterator[Tuple]:
    """The events of a trace file (plain or gzip): ``("a", id, size, stream, device)``,
    ``("f", id, stream)`` (stream: the free's when the line names one, else None: the
    allocation's), ``("n", id, stream)`` (``gpumem_record_stream``), ``("reset", device)``.
    Comments are skipped; a malformed line raises ValueError naming the file and line."""
    opener = gzip.open if _is_gzip(path) else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:  # type: ignore[operator]
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            if line.startswith("#"):
                m = re.match(r"#\s*reset device (-?\d+)", line)
                if m:
                    yield ("reset", int(m.group(1)))
                continue
            parts = line.split()
            try:
                if parts[0] == "a" and len(parts) in (4, 5):
                    yield ("a", int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4]) if len(parts) == 5 else 0)
                    continue
                if parts[0] == "f" and len(parts) in (2, 3):
                    yield ("f", int(parts[1]), int(parts[2]) if len(parts) == 3 else None)
                    continue
                if parts[0] == "n" and len(parts) == 3:
                    yield ("n", int(parts[1]), int(parts[2]))
                    continue
            except ValueError:
                pass
            raise ValueError("%s:%d: not a trace line: %r ('a ID SIZE STREAM [DEVICE]', 'f ID [STREAM]' or "
                             "'n ID STREAM')" % (path, lineno, line.rstrip()[:80]))


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


# ---------------------------------------------------------------------------- the replay's backend

class _SegmentLog:
    """The wrapped backend's record of device memory: plain segments and mapped ranges per device."""

    def __init__(self) -> None:
        self.plain: Dict[int, Dict[int, int]] = {}   # device -> {address: size}
        self.mapped: Dict[int, Dict[int, int]] = {}  # device -> {address: size} of vm_map'ed chunks
        self.events: List[Tuple[str, int, int, int]] = []  # (action, device, address, size), in order


def _wrapped_backend(name: str, log: _SegmentLog) -> Tuple[capi.Backend, Tuple[Any, ...]]:
    """A copy of the built-in backend ``name`` whose malloc/free and vm_map/vm_unmap also log to ``log``."""
    inner = capi.builtin_backend(name)
    if inner is None:
        raise make_error(capi.STATUS["ERR_NO_BACKEND"], detail="backend %r is not built into this library" % name)
    P = ctypes.POINTER(c_void_p)
    MALLOC = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_size_t, P)
    FREE = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_void_p)
    MAP = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_void_p, c_size_t, c_uint64)
    UNMAP = ctypes.CFUNCTYPE(c_int, c_void_p, c_int, c_void_p, c_size_t)
    i_malloc, i_free = MALLOC(inner.malloc), FREE(inner.free)
    i_map = MAP(inner.vm_map) if inner.vm_map else None
    i_unmap = UNMAP(inner.vm_unmap) if inner.vm_unmap else None

    def w_malloc(be, dev, size, out):
        rc = i_malloc(be, dev, size, out)
        if rc == 0:
            addr = int(out[0] or 0)
            log.plain.setdefault(dev, {})[addr] = int(size)
            log.events.append(("segment_alloc", dev, addr, int(size)))
        return rc

    def w_free(be, dev, ptr):
        rc = i_free(be, dev, ptr)
        if rc == 0:
            addr = int(ptr or 0)
            size = log.plain.get(dev, {}).pop(addr, 0)
            log.events.append(("segment_free", dev, addr, size))
        return rc

    def w_map(be, dev, va, size, h):
        rc = i_map(be, dev, va, size, h)
        if rc == 0:
            log.mapped.setdefault(dev, {})[int(va)] = int(size)
            log.events.append(("segment_map", dev, int(va), int(size)))
        return rc

    def w_unmap(be, dev, va, size):
        rc = i_unmap(be, dev, va, size)
        if rc == 0:
            m = log.mapped.get(dev, {})
            lo, hi = int(va), int(va) + int(size)
            for a in [a for a in m if lo <= a < hi]:
                del m[a]
            log.events.append(("segment_unmap", dev, lo, int(size)))
        return rc

    keep: List[Any] = [inner, i_malloc, i_free]
    vt = inner
    cb = MALLOC(w_malloc)
    vt.malloc = ctypes.cast(cb, c_void_p).value
    keep.append(cb)
    cb = FREE(w_free)
    vt.free = ctypes.cast(cb, c_void_p).value
    keep.append(cb)
    if i_map is not None and i_unmap is not None:
        cb = MAP(w_map)
        vt.vm_map = ctypes.cast(cb, c_void_p).value
        keep.append(cb)
        cb = UNMAP(w_unmap)
        vt.vm_unmap = ctypes.cast(cb, c_void_p).value
        keep += [cb, i_map, i_unmap]
    return vt, tuple(keep)


# ---------------------------------------------------------------------------- replay

def replay(
    trace: Union[str, Iterable[Tuple]],
    backend: str = "sim",
    every: int = 1,
    snapshot: bool = True,
    **config: Any,
) -> Timeline:
    """Replay a trace (a path, or the events of :func:`read_trace`) through a fresh context.

    ``backend``: "sim" (default: no GPU needed; the trace's streams stay distinct
    streams) or a built-in GPU backend (every event on the default stream).
    ``config``: :class:`gpumem.Context` keywords (``release_threshold``,
    ``limit_bytes``, ...); ``GPUMEM_*`` variables apply as for any context.
    ``every``: sample after every n-th event (and after each trim or
    out-of-memory event). ``snapshot``: also gather what
    :func:`to_torch_snapshot` needs. On sim, ``GPUMEM_SIM_DEVICES`` defaults to
    enough devices of :data:`SIM_DEVICE_SIZE` for the trace.
    """
    title = os.path.basename(trace) if isinstance(trace, str) else ""
    torch_reserved = _header_torch_reserved(trace) if isinstance(trace, str) else None
    events = list(read_trace(trace)) if isinstance(trace, str) else list(trace)
    ndev = 1 + max([e[4] for e in events if e[0] == "a"] + [0])
    if backend == "sim" and "GPUMEM_SIM_DEVICES" not in os.environ:
        os.environ["GPUMEM_SIM_DEVICES"] = "%dx%s" % (ndev, SIM_DEVICE_SIZE)
    log = _SegmentLog()
    vt, keep = _wrapped_backend(backend, log)
    saved_trace = os.environ.pop("GPUMEM_TRACE", None)  # the replay must not record itself over a trace
    try:
        ctx = Context(custom_backend=vt, **config)
    finally:
        if saved_trace is not None:
            os.environ["GPUMEM_TRACE"] = saved_trace
    on_sim = backend == "sim"
    tl = Timeline(title=title, x_label="event", torch_reserved=torch_reserved)
    trace_out: Dict[int, List[Dict[str, Any]]] = {}
    t0 = time.perf_counter()
    try:
        h = ctx.handle
        lib = capi.lib
        st = capi.Stats()
        st.struct_size = ctypes.sizeof(capi.Stats)
        live_ptr: Dict[int, Tuple[int, int, int, int]] = {}  # id -> (ptr, size, stream, device)
        live_bytes: Dict[int, int] = {}
        last_trims: Dict[int, Tuple[int, int]] = {}
        highs: Dict[int, List[int]] = {}
        out = c_void_p()
        seg_seen = 0

        def now_us() -> int:
            return int((time.perf_counter() - t0) * 1e6)

        def segment_events() -> None:
            nonlocal seg_seen
            if not snapshot:
                return
            for action, dev, addr, size in log.events[seg_seen:]:
                trace_out.setdefault(dev, []).append(
                    {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": now_us(), "frames": []})
            seg_seen = len(log.events)

        def sample(x: int, dev: int, force: bool = False) -> None:
            if lib.gpumem_get_stats(h, dev, byref(st)) != 0:
                return
            prev = last_trims.get(dev, (0, 0))
            if st.num_trims != prev[0]:
                tl.marks.append(Mark("trim", x, dev, int(st.trimmed_bytes - prev[1])))
                last_trims[dev] = (int(st.num_trims), int(st.trimmed_bytes))
                force = True
            lb, rb = live_bytes.get(dev, 0), int(st.reserved_bytes)
            top = highs.setdefault(dev, [0, 0])
            if lb > top[0] or rb > top[1]:  # every new high is sampled: the peaks are exact at any --every
                top[0], top[1] = max(top[0], lb), max(top[1], rb)
                force = True
            if force or x % every == 0:
                tl.samples.append(Sample(x, dev, live_bytes.get(dev, 0), int(st.reserved_bytes),
                                         int(st.cached_bytes), int(st.allocated_bytes)))

        for i, ev in enumerate(events, 1):
            kind = ev[0]
            if kind == "a":
                _, eid, size, stream, dev = ev
                s = c_void_p(stream if (on_sim and stream) else None)
                status = lib.gpumem_alloc(h, dev, size, s, byref(out))
                segment_events()
                if status != 0 or (size and not out.value):
                    tl.marks.append(Mark("oom", i, dev, size))
                    if snapshot:
                        free_b = _device_free(ctx, dev)
                        trace_out.setdefault(dev, []).append(
                            {"action": "oom", "addr": 0, "size": size, "stream": stream, "time_us": now_us(),
                             "device_free": free_b, "frames": []})
                    sample(i, dev, force=True)
                    continue
                if not size:
                    continue
                ptr = int(out.value)
                live_ptr[eid] = (ptr, size, stream, dev)
                live_bytes[dev] = live_bytes.get(dev, 0) + size
                if snapshot:
                    trace_out.setdefault(dev, []).append(
                        {"action": "alloc", "addr": ptr, "size": size, "stream": stream, "time_us": now_us(),
                         "frames": []})
                sample(i, dev)
            elif kind == "f":
                got = live_ptr.pop(ev[1], None)
                if got is None:
                    continue  # allocated before the trace began, or failed
                ptr, size, stream, dev = got
                if len(ev) > 2 and ev[2] is not None:
                    stream = ev[2]  # freed on a stream other than the allocation's
                lib.gpumem_free(h, c_void_p(ptr), c_void_p(stream if (on_sim and stream) else None))
                live_bytes[dev] -= size
                if snapshot:
                    tu = now_us()
                    for action in ("free_requested", "free_completed"):
                        trace_out.setdefault(dev, []).append(
                            {"action": action, "addr": ptr, "size": size, "stream": stream, "time_us": tu,
                             "frames": []})
                segment_events()
                sample(i, dev)
            elif kind == "n":
                got = live_ptr.get(ev[1])
                if got is not None and on_sim:
                    lib.gpumem_record_stream(h, c_void_p(got[0]), c_void_p(ev[2] or None))
            elif kind == "reset":
                # the trace's own record of a gpumem_reset: its blocks were freed by "f" lines after it
                continue
        if snapshot:
            tl.torch_trace = trace_out
            tl.torch_segments = _segments_now(ctx, log, live_ptr)
    finally:
        ctx.close()
        del keep
    for dev, p in tl.peaks().items():
        for what in ("live", "reserved"):
            at = next(s.x for s in tl.samples if s.device == dev and getattr(s, what) == p[what])
            tl.marks.append(Mark("peak-" + what, at, dev, p[what]))
    return tl


def _header_torch_reserved(path: str) -> Optional[int]:
    """``# pytorch max_allocated A max_reserved R`` in the header of the shared PyTorch traces -> R."""
    opener = gzip.open if _is_gzip(path) else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:  # type: ignore[operator]
        for line in f:
            if not line.startswith("#"):
                return None
            m = re.match(r"#\s*pytorch\b.*\bmax_reserved (\d+)", line)
            if m:
                return int(m.group(1))
    return None


def _device_free(ctx: Context, dev: int) -> int:
    try:
        return int(ctx.device_info(dev)["free_bytes"])
    except GpumemError:
        return 0


def _segments_now(ctx: Context, log: _SegmentLog, live: Dict[int, Tuple[int, int, int, int]]) -> List[Dict[str, Any]]:
    """libgpumem's segments as PyTorch's snapshot lists them: plain segments, and each contiguous
    run of mapped chunks of an expandable segment, with their live blocks and the free gaps."""
    by_dev: Dict[int, List[Tuple[int, int, int]]] = {}
    for ptr, size, stream, dev in live.values():
        by_dev.setdefault(dev, []).append((ptr, size, stream))
    for v in by_dev.values():
        v.sort()
    segs: List[Dict[str, Any]] = []
    devices = set(log.plain) | set(log.mapped)
    for dev in sorted(devices):
        ranges = [(a, s, False) for a, s in log.plain.get(dev, {}).items()]
        mapped = sorted(log.mapped.get(dev, {}).items())
        run: Optional[List[int]] = None
        for a, s in mapped:  # merge chunks mapped back to back into one range
            if run is not None and run[0] + run[1] == a:
                run[1] += s
            else:
                if run is not None:
                    ranges.append((run[0], run[1], True))
                run = [a, s]
        if run is not None:
            ranges.append((run[0], run[1], True))
        blocks_all = by_dev.get(dev, [])
        addrs = [b[0] for b in blocks_all]
        for base, total, expandable in sorted(ranges):
            blocks: List[Dict[str, Any]] = []
            at = base
            allocated = 0
            stream = 0
            lo = bisect.bisect_left(addrs, base)
            for ptr, size, bstream in blocks_all[lo:]:
                if ptr >= base + total:
                    break
                end = min(ptr + size, base + total)
                if ptr > at:
                    blocks.append({"address": at, "size": ptr - at, "requested_size": 0, "state": "inactive",
                                   "frames": []})
                blocks.append({"address": ptr, "size": end - ptr, "requested_size": end - ptr,
                               "state": "active_allocated", "frames": []})
                allocated += end - ptr
                stream = bstream
                at = end
            if at < base + total:
                blocks.append({"address": at, "size": base + total - at, "requested_size": 0, "state": "inactive",
                               "frames": []})
            segs.append({
                "device": dev, "address": base, "total_size": total, "allocated_size": allocated,
                "active_size": allocated, "requested_size": allocated, "stream": stream,
                "segment_type": "large" if total > (1 << 20) else "small", "segment_pool_id": (0, 0),
                "is_expandable": expandable, "frames": [], "blocks": blocks,
            })
    return segs


# ---------------------------------------------------------------------------- PyTorch snapshot

def to_torch_snapshot(tl: Timeline) -> Dict[str, Any]:
    """The replay as ``torch.cuda.memory._snapshot()`` gives it: {"segments", "device_traces"}."""
    if tl.torch_trace is None or tl.torch_segments is None:
        raise ValueError("this timeline has no snapshot data: it comes from replay(..., snapshot=True) of a trace")
    ndev = 1 + max(list(tl.torch_trace) + [s["device"] for s in tl.torch_segments] + [0])
    return {
        "segments": list(tl.torch_segments),
        "device_traces": [list(tl.torch_trace.get(d, [])) for d in range(ndev)],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "allocator": "libgpumem"},
    }


def save_torch_snapshot(tl: Timeline, path: str) -> None:
    """Write :func:`to_torch_snapshot` as the pickle PyTorch's memory viewer opens."""
    with open(path, "wb") as f:
        pickle.dump(to_torch_snapshot(tl), f)


# ---------------------------------------------------------------------------- live recording

class Recorder:
    """Samples a live context's devices every ``interval`` seconds on a thread of its own.

    Use :func:`record` (a context manager); :meth:`sample` adds a reading now.
    Trims and out-of-memory events are the context's counters (``num_trims``,
    ``num_ooms``) growing between readings.
    """

    def __init__(self, ctx: Context, interval: float = 0.01, devices: Optional[List[int]] = None) -> None:
        if not isinstance(ctx, Context):
            raise TypeError("record() needs a gpumem.Context, got %s" % type(ctx).__name__)
        interval = float(interval)
        if not interval > 0:
            raise ValueError("interval must be > 0 seconds, got %r" % interval)
        self.ctx = ctx
        self.interval = interval
        self.devices = list(range(ctx.device_count)) if devices is None else [int(d) for d in devices]
        self.timeline = Timeline(x_label="seconds", title="context %s" % ctx.backend)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._t0 = time.perf_counter()
        self._last: Dict[int, Tuple[int, int, int]] = {}
        self._lock = threading.Lock()

    def sample(self) -> None:
        with self._lock:
            x = time.perf_counter() - self._t0
            for d in self.devices:
                s = self.ctx.stats(d)
                trims, trimmed, ooms = self._last.get(d, (s["num_trims"], s["trimmed_bytes"], s["num_ooms"]))
                if s["num_trims"] > trims:
                    self.timeline.marks.append(Mark("trim", x, d, s["trimmed_bytes"] - trimmed))
                if s["num_ooms"] > ooms:
                    self.timeline.marks.append(Mark("oom", x, d, 0))
                self._last[d] = (s["num_trims"], s["trimmed_bytes"], s["num_ooms"])
                self.timeline.samples.append(Sample(x, d, s["requested_bytes"], s["reserved_bytes"],
                                                    s["cached_bytes"], s["allocated_bytes"]))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except GpumemError:
                return  # the context was closed

    def start(self) -> "Recorder":
        self.sample()
        self._thread = threading.Thread(target=self._run, name="gpumem-plot-recorder", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Timeline:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        try:
            self.sample()
        except GpumemError:
            pass
        for dev, p in self.timeline.peaks().items():
            for what in ("live", "reserved"):
                at = next(s.x for s in self.timeline.samples if s.device == dev and getattr(s, what) == p[what])
                self.timeline.marks.append(Mark("peak-" + what, at, dev, p[what]))
        return self.timeline

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def record(ctx: Context, interval: float = 0.01, devices: Optional[List[int]] = None) -> Recorder:
    """A :class:`Recorder` of ``ctx`` (every visible device unless ``devices``); use it in a ``with`` block."""
    return Recorder(ctx, interval, devices)


# ---------------------------------------------------------------------------- the picture

def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%.0f %s" if unit == "B" else "%.2f %s") % (n, unit)
        n /= 1024.0
    return "%.2f TiB" % n


def _import_pyplot() -> Any:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError as e:
        raise ImportError("gpumem.plot needs matplotlib for pictures: pip install matplotlib "
                          "(or gpumem[plot]); --snapshot works without it") from e
    return plt


def plot(tl: Timeline, out: str, title: Optional[str] = None, width: float = 11.0) -> str:
    """Draw the timeline into ``out`` (.png or .svg, by its extension); returns ``out``.

    One panel per device: live, reserved and cached bytes against the timeline's x
    (events or seconds); trims as green ticks at the bottom, out-of-memory events as
    red lines, peaks of live and reserved bytes as labelled points.
    """
    ext = os.path.splitext(out)[1].lower()
    if ext not in (".png", ".svg"):
        raise ValueError("output must end in .png or .svg, got %r" % out)
    if not tl.samples:
        raise ValueError("the timeline has no samples")
    plt = _import_pyplot()
    devices = tl.devices()
    fig, axes = plt.subplots(len(devices), 1, figsize=(width, 3.6 * len(devices)), squeeze=False, sharex=True)
    for ax, dev in zip(axes[:, 0], devices):
        s = tl.series(dev)
        # a step curve shows a value up to the next sample: the last one gets a short run too
        step = (s["x"][-1] - s["x"][0]) / 200.0 or 1.0
        for k in s:
            s[k].append(s[k][-1] + step if k == "x" else s[k][-1])
        top_bytes = max(s["reserved"] + s["live"] + [1])
        unit, div = next((u, float(d)) for u, d in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))
                         if top_bytes >= d or d == 1)
        ax.fill_between(s["x"], [v / div for v in s["live"]], step="post", color="#4C72B0", alpha=0.35, lw=0)
        ax.step(s["x"], [v / div for v in s["live"]], where="post", color="#4C72B0", lw=1.0, label="live")
        ax.step(s["x"], [v / div for v in s["reserved"]], where="post", color="#C44E52", lw=1.4, label="reserved")
        ax.step(s["x"], [v / div for v in s["cached"]], where="post", color="#8C8C8C", lw=0.9, ls="--",
                label="cached")
        if tl.torch_reserved and dev == 0:
            ax.axhline(tl.torch_reserved / div, color="#DD8452", lw=1.0, ls="-.",
                       label="PyTorch's reserved peak, same run (%s)" % _fmt_bytes(tl.torch_reserved))
            top_bytes = max(top_bytes, tl.torch_reserved)
        marks = [m for m in tl.marks if m.device == dev]
        trims = [m for m in marks if m.kind == "trim"]
        for j, m in enumerate(trims):
            ax.axvline(m.x, color="#55A868", lw=1.0, ls=":", alpha=0.9,
                       label=("trim (%d, %s back)" % (len(trims), _fmt_bytes(sum(t.bytes for t in trims))))
                       if j == 0 else None)
        ooms = [m for m in marks if m.kind == "oom"]
        for j, m in enumerate(ooms):
            ax.axvline(m.x, color="red", lw=0.8, alpha=0.7, label=("out of memory (%d)" % len(ooms)) if j == 0 else None)
        for m in marks:
            if m.kind.startswith("peak-"):
                color = "#4C72B0" if m.kind == "peak-live" else "#C44E52"
                ax.plot([m.x], [m.bytes / div], "o", color=color, ms=5)
                live = m.kind == "peak-live"
                ax.annotate("peak %s %s" % (m.kind[5:], _fmt_bytes(m.bytes)), (m.x, m.bytes / div),
                            textcoords="offset points", xytext=(-8, -14) if live else (-8, 7),
                            ha="right", fontsize=8, color=color)
        peaks = tl.peaks().get(dev, {})
        ratio = (peaks.get("reserved", 0) / peaks["live"]) if peaks.get("live") else 0.0
        ax.set_ylabel(unit)
        ax.set_title("device %d: peak live %s, peak reserved %s (%.3f)" % (
            dev, _fmt_bytes(peaks.get("live", 0)), _fmt_bytes(peaks.get("reserved", 0)), ratio), fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(0, top_bytes / div * 1.25)  # headroom for the legend and the peak labels
        ax.legend(loc="upper left", fontsize=8, ncol=5, framealpha=0.9)
    axes[-1, 0].set_xlabel(tl.x_label)
    fig.suptitle(title if title is not None else ("libgpumem memory: %s" % tl.title if tl.title else "libgpumem memory"))
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------- command line

def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gpumem.plot",
        description="Replay an allocation trace through libgpumem and draw live, reserved and cached bytes "
                    "over the events, or export it for PyTorch's memory viewer.")
    ap.add_argument("trace", help="trace file (GPUMEM_TRACE format, plain or gzip)")
    ap.add_argument("-o", "--output", action="append", default=[],
                    help="picture to write, .png or .svg (may be given twice)")
    ap.add_argument("--snapshot", help="write the PyTorch memory snapshot (pickle) here")
    ap.add_argument("--backend", default="sim", help="backend to replay on (default sim)")
    ap.add_argument("--every", type=int, default=1, help="sample after every n-th event (default 1)")
    ap.add_argument("--release-threshold", help="Context(release_threshold=...), e.g. 1GiB")
    ap.add_argument("--limit", help="Context(limit_bytes=...), e.g. 3GiB: out-of-memory events past it")
    ap.add_argument("--title", help="title of the picture")
    args = ap.parse_args(argv)
    if not args.output and not args.snapshot:
        ap.error("nothing to write: give -o PICTURE.png/.svg and/or --snapshot FILE.pickle")
    for o in args.output:
        if os.path.splitext(o)[1].lower() not in (".png", ".svg"):
            ap.error("-o %s: the picture must end in .png or .svg" % o)
    if args.every < 1:
        ap.error("--every must be >= 1")
    if args.output:
        try:
            _import_pyplot()
        except ImportError as e:
            print("gpumem.plot: %s" % e, file=sys.stderr)
            return 2
    config: Dict[str, Any] = {}
    try:
        if args.release_threshold is not None:
            config["release_threshold"] = parse_size(args.release_threshold)
        if args.limit is not None:
            config["limit_bytes"] = parse_size(args.limit)
    except ValueError as e:
        ap.error(str(e))
    try:
        tl = replay(args.trace, backend=args.backend, every=args.every, snapshot=bool(args.snapshot), **config)
    except (OSError, ValueError, GpumemError) as e:
        print("gpumem.plot: %s" % e, file=sys.stderr)
        return 1
    for dev, p in sorted(tl.peaks().items()):
        n_trim = sum(1 for m in tl.marks if m.kind == "trim" and m.device == dev)
        n_oom = sum(1 for m in tl.marks if m.kind == "oom" and m.device == dev)
        print("device %d: peak live %d, peak reserved %d (%.3f), %d trims, %d out-of-memory events" % (
            dev, p["live"], p["reserved"], p["reserved"] / p["live"] if p["live"] else 0.0, n_trim, n_oom))
    for o in args.output:
        plot(tl, o, title=args.title)
        print("wrote", o)
    if args.snapshot:
        save_torch_snapshot(tl, args.snapshot)
        print("wrote", args.snapshot, "(open it at https://pytorch.org/memory_viz)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
