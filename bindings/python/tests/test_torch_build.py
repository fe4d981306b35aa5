"""How the PyTorch shim picks its C++ compiler (gpumem._torch_build.choose_compiler): the one whose
libstdc++ is the process's, since a shim built against another one crashed at its first throw.
Needs no PyTorch."""

from __future__ import annotations

import ctypes
import os
import shutil
import stat

import pytest

from gpumem import _torch_build as tb


@pytest.fixture
def loaded_libstdcxx():
    try:
        ctypes.CDLL("libstdc++.so.6")
    except OSError:
        pytest.skip("no libstdc++ on this machine")
    path = tb._loaded_libstdcxx()
    if path is None:
        pytest.skip("/proc/self/maps shows no libstdc++")
    return path


def _fake_compiler(tmp_path, libstdcxx: str) -> str:
    """A 'compiler' that answers -print-file-name=libstdc++.so with libstdcxx."""
    exe = tmp_path / "fake-g++"
    exe.write_text("#!/bin/sh\necho %s\n" % libstdcxx)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_a_compiler_with_another_libstdcxx_is_passed_over(tmp_path, monkeypatch, loaded_libstdcxx):
    if all(tb._compiler_libstdcxx(c) != loaded_libstdcxx for c in ("c++", "g++", "/usr/bin/g++") if shutil.which(c)):
        pytest.skip("no compiler on PATH uses the process's libstdc++")
    other = tmp_path / "libstdc++.so.6.0.99"
    other.write_text("")
    monkeypatch.setenv("CXX", _fake_compiler(tmp_path, str(other)))
    chosen = tb.choose_compiler()
    assert chosen != os.environ["CXX"]
    assert tb._compiler_libstdcxx(chosen) == loaded_libstdcxx


def test_cxx_is_kept_when_its_libstdcxx_is_the_process_s(tmp_path, monkeypatch, loaded_libstdcxx):
    fake = _fake_compiler(tmp_path, loaded_libstdcxx)
    monkeypatch.setenv("CXX", fake)
    assert tb.choose_compiler() == fake


def test_cxx_is_kept_when_nothing_matches(tmp_path, monkeypatch):
    other = tmp_path / "libstdc++.so.6.0.99"
    other.write_text("")
    fake = _fake_compiler(tmp_path, str(other))
    monkeypatch.setenv("CXX", fake)
    monkeypatch.setenv("PATH", str(tmp_path))  # no other compiler to be found
    monkeypatch.setattr(tb.shutil, "which", lambda c: c if c == fake else None)
    assert tb.choose_compiler() == fake
