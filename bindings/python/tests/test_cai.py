"""__cuda_array_interface__ of a Buffer (CUDA Array Interface, version 3)."""

from __future__ import annotations

import pytest


def test_cai_fields(ctx):
    with ctx.alloc(1000) as buf:
        cai = buf.__cuda_array_interface__
        assert cai["version"] == 3
        assert cai["shape"] == (1000,)
        assert cai["typestr"] == "|u1"
        assert cai["data"] == (buf.ptr, False)
        assert cai["strides"] is None
        # allocated on the default stream: consumers order after the legacy default stream (1)
        assert cai["stream"] == 1
        assert cai["descr"] == [("", "|u1")]


def test_cai_stream_is_allocation_stream(sim_ctx):
    with sim_ctx.alloc(64, stream=0x7000) as buf:
        assert buf.__cuda_array_interface__["stream"] == 0x7000


def test_cai_empty(ctx):
    buf = ctx.alloc(0)
    cai = buf.__cuda_array_interface__
    assert cai["shape"] == (0,) and cai["data"] == (0, False)


def test_cai_is_readable_by_numpy_on_sim(sim_ctx):
    np = pytest.importorskip("numpy")
    with sim_ctx.alloc(256) as buf:
        cai = buf.__cuda_array_interface__
        # on sim the device memory is host memory: view it through the array interface numpy knows
        iface = {k: v for k, v in cai.items() if k != "stream"}
        holder = type("H", (), {"__array_interface__": iface})()
        arr = np.asarray(holder)
        assert arr.shape == (256,) and arr.dtype == np.uint8
        arr[:] = np.arange(256, dtype=np.uint8)
        import ctypes

        assert ctypes.string_at(buf.ptr, 256) == bytes(range(256))
