"""The persistent cache stays bounded and can be inspected and cleared
(``TILENEST_CACHE_MAX``, ``tilenest cache info|clear``); campaigns keep no
per-program entry in it; a cuda compile without the NVRTC wheels names the
``cuda`` extra that installs them."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

from tilenest import diskcache as DC
from tilenest.backends import kernelcache as KC


@pytest.fixture
def root(tmp_path, monkeypatch):
    r = tmp_path / "cache"
    monkeypatch.setenv("TILENEST_CACHE_DIR", str(r))
    monkeypatch.delenv("TILENEST_CACHE_SHARED", raising=False)
    monkeypatch.delenv("TILENEST_CACHE_WRITE", raising=False)
    DC._WRITTEN.clear()
    KC.MEMORY.clear()
    yield r
    KC.MEMORY.clear()
    DC._WRITTEN.clear()


def _size(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def test_the_bound_evicts_least_recently_used_entries(root, monkeypatch):
    monkeypatch.setenv("TILENEST_CACHE_MAX", "0")  # unbounded while filling
    st = DC.Store("t")
    blob = b"x" * 8000
    for i in range(20):
        st.put(f"k{i}", {}, {"b": blob})
        old = time.time() - 100 + i  # k0 oldest ... k19 newest
        os.utime(st.path(f"k{i}"), (old, old))
    assert st.get("k0") is not None  # a hit makes k0 the most recently used
    monkeypatch.setenv("TILENEST_CACHE_MAX", "64K")
    DC._WRITTEN.clear()
    st.put("new", {}, {"b": blob})  # a process's first write enforces the bound
    assert _size(root) <= 64 << 10
    assert st.get("k0") is not None and st.get("new") is not None  # recently used: kept
    assert st.get("k1") is None and st.get("k12") is None  # least recently used: evicted
    assert st.get("k19") is not None


def test_the_default_bound_and_malformed_values(monkeypatch):
    monkeypatch.delenv("TILENEST_CACHE_MAX", raising=False)
    assert DC.max_bytes() == DC.DEFAULT_MAX == 4 << 30
    monkeypatch.setenv("TILENEST_CACHE_MAX", "1.5G")
    assert DC.max_bytes() == int(1.5 * (1 << 30))
    monkeypatch.setenv("TILENEST_CACHE_MAX", "0")
    assert DC.max_bytes() == 0
    from tilenest.errors import UsageError

    for bad in ("lots", "-1G", "nan"):
        monkeypatch.setenv("TILENEST_CACHE_MAX", bad)
        with pytest.raises(UsageError, match="TILENEST_CACHE_MAX"):
            DC.max_bytes()


def _filler(root: str, i: int) -> int:
    os.environ["TILENEST_CACHE_DIR"] = root
    os.environ["TILENEST_CACHE_MAX"] = "256K"
    st = DC.Store("t")
    for j in range(60):
        st.put(f"w{i}-{j}", {"w": i}, {"b": bytes([i]) * 6000})
        got = st.get(f"w{i}-{j}")
        assert got is None or got[1]["b"] == bytes([i]) * 6000
    return 0


def test_concurrent_writers_stay_within_the_bound(root):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        assert pool.starmap(_filler, [(str(root), i) for i in range(3)]) == [0, 0, 0]
    os.environ["TILENEST_CACHE_MAX"] = "256K"
    try:
        DC.evict(root, DC.max_bytes(), wait=True)  # the last writer's pass may have been skipped
    finally:
        del os.environ["TILENEST_CACHE_MAX"]
    assert _size(root) <= 256 << 10
    assert not list(root.rglob("*.tmp"))
    for f in root.rglob("*.tnc"):  # every entry left is whole
        assert DC._decode(f.read_bytes()) is not None


def test_cli_cache_info_and_clear(root, capsys):
    from tilenest import cli

    st = DC.Store("kernels")
    st.put("a", {}, {"b": b"1" * 1000})
    DC.Store("nvrtc").put("b", {}, {"b": b"2" * 500})
    assert cli.main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["root"] == str(root) and info["files"] == 2
    assert set(info["folders"]) == {"kernels", "nvrtc"} and info["max_bytes"] == DC.max_bytes()
    assert cli.main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert str(root) in out and "kernels" in out and "TILENEST_CACHE_MAX" in out
    assert cli.main(["cache", "clear"]) == 0
    assert "deleted 2 files" in capsys.readouterr().out
    assert not list(root.rglob("*.tnc")) and st.get("a") is None


def test_no_store_mode_reads_but_keeps_no_program(root):
    st = DC.Store("kernels")
    runtime = DC.Store("llvm-runtime", per_program=False)
    st.put("before", {}, {"b": b"1"})
    with DC.no_store():
        st.put("during", {}, {"b": b"2"})
        runtime.put("loop", {}, {"b": b"3"})
        assert st.get("before") is not None
    assert st.get("during") is None and runtime.get("loop") is not None


def _compiling_checker(seed: int, i: int) -> dict:
    import test_kernel_cache as T

    T._axpb(scale=float(seed * 100 + i) + 0.25).compile(target="llvm")
    return {"status": "ok"}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_campaign_keeps_no_per_program_entry(root, tmp_path, workers):
    from tilenest.validation.campaign import run_campaign

    st = run_campaign("cache-test", _compiling_checker, 3, 7, state=tmp_path / "s.jsonl",
                      workers=workers, chunk=1)
    assert {r["status"] for r in st.records.values()} == {"ok"}, st.records
    per_program = [f for f in root.rglob("*.tnc") if f.parent.name != "llvm-runtime"]
    assert per_program == []


def test_a_cuda_compile_without_nvrtc_names_the_extra(monkeypatch):
    from tilenest.backends.cuda import nvrtc
    from tilenest.errors import NotAvailableError

    with pytest.raises(NotAvailableError) as e:
        nvrtc.find_nvrtc(wheel_roots=[], toolkit_homes=[])
    assert "tilenest[cuda]" in str(e.value)
    pyproject = (Path(__file__).resolve().parent.parent / "pyproject.toml").read_text()
    import tomllib

    meta = tomllib.loads(pyproject)["project"]
    assert not any(d.startswith("nvidia-") for d in meta["dependencies"])
    assert sorted(meta["optional-dependencies"]["cuda"]) == sorted(nvrtc.PINNED_WHEELS)
    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    assert "cuda]'" in makefile.split("$(STAMP): pyproject.toml")[1].split("touch")[0]
