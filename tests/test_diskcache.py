"""The persistent compile cache (``tilenest.diskcache``) and its users.

A second process must load what a first one compiled without compiling
(whole kernels, LLVM object code, NVRTC cubins), a corrupted entry must be
rebuilt and never loaded, and processes writing one entry at the same time
must never leave a partial one. The whole-kernel cache has its own tests in
tests/test_kernel_cache.py.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tilenest import diskcache as DC


def test_entries_round_trip(tmp_path):
    st = DC.Store("t", tmp_path)
    key = DC.key_of(["x", b"\x00\x01", 3])
    assert st.get(key) is None and st.stats.misses == 1
    st.put(key, {"log": "ok"}, {"a": b"12345", "b": b""})
    meta, parts = st.get(key)
    assert meta == {"log": "ok"} and parts == {"a": b"12345", "b": b""}
    assert st.stats.hits == 1 and st.stats.writes == 1


def test_keys_differ_in_every_part():
    base = ["src", "opt", [1, 2]]
    keys = {DC.key_of(base), DC.key_of(["src ", "opt", [1, 2]]), DC.key_of(["src", "opt", [1, 3]]),
            DC.key_of(["src", b"opt", [1, 2]])}
    assert len(keys) == 4


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "empty", "extend"])
def test_a_damaged_entry_is_a_miss_and_is_removed(tmp_path, damage):
    st = DC.Store("t", tmp_path)
    st.put("k", {"m": 1}, {"obj": bytes(range(256)) * 4})
    p = st.path("k")
    data = bytearray(p.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[:-7]
    elif damage == "magic":
        data[:8] = b"NOTCACHE"
    elif damage == "empty":
        data = bytearray()
    else:
        data += b"x"
    p.write_bytes(bytes(data))
    assert st.get("k") is None
    assert st.stats.corrupt == 1 and not p.exists()


def test_the_cache_can_be_turned_off(monkeypatch, tmp_path):
    monkeypatch.setenv("TILENEST_CACHE_DIR", "off")
    assert DC.cache_root() is None
    st = DC.Store("t")
    st.put("k", {}, {"a": b"1"})
    assert st.get("k") is None and st.stats.writes == 0
    monkeypatch.setenv("TILENEST_CACHE_DIR", str(tmp_path))
    assert DC.cache_root() == tmp_path


def test_an_unwritable_cache_does_not_fail_the_compile(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")  # the cache root is a file: nothing can be created under it
    st = DC.Store("t", blocker)
    st.put("k", {}, {"a": b"1"})  # no exception: the compile's result stands without the cache
    assert st.get("k") is None and st.stats.writes == 0


def _writer(root: str, i: int, n: int) -> list[str]:
    st = DC.Store("t", Path(root))
    seen = []
    for j in range(n):
        st.put("same", {"writer": i}, {"blob": bytes([i]) * (5000 + 37 * i)})
        got = st.get("same")
        seen.append("none" if got is None else f"w{got[0]['writer']}")
        if got is not None:
            w = got[0]["writer"]
            assert got[1]["blob"] == bytes([w]) * (5000 + 37 * w), (i, j)
    return seen


def test_concurrent_writers_never_leave_a_partial_entry(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        res = pool.starmap(_writer, [(str(tmp_path), i, 40) for i in range(3)])
    # every read found a whole entry of some writer (a read right after one's
    # own write can only miss when a concurrent writer's rename is in flight)
    flat = [s for r in res for s in r]
    assert flat.count("none") == 0 and {s for s in flat} <= {"w0", "w1", "w2"}
    assert not list(tmp_path.glob("t/*.tmp"))


# A kernel compiled for llvm (and run) and for cuda (compiled to a cubin), in a
# fresh process; prints how much compiling happened.
_SCRIPT = textwrap.dedent('''
    import json, time
    import numpy as np
    import tilenest as tn
    from tilenest import f32
    from tilenest.backends.llvm import jit
    from tilenest.backends.cuda import nvrtc
    from tilenest.backends import cuda
    from tilenest.backends import kernelcache as KC

    # both processes must agree on the compiler's identity even if a file of
    # the package is edited in between (tests/test_kernel_cache.py tests it)
    KC.source_digest = lambda: "the-same-compiler"

    calls = {"optimize": 0, "nvrtc": 0}
    real_opt, real_nv = jit.optimize, nvrtc.compile_program
    def opt(*a, **k):
        calls["optimize"] += 1
        return real_opt(*a, **k)
    def nv(*a, **k):
        calls["nvrtc"] += 1
        return real_nv(*a, **k)
    jit.optimize, nvrtc.compile_program = opt, nv

    @tn.kernel
    def axpb(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        y = y.with_dims(*x.dims())
        for p in tn.parallel(tn.shape(tn.cdiv(n, 64))):
            o = tn.coord(p.index() * 64)
            t = x[o, tn.shape(64), tn.bounds.zero]
            y(o, tn.shape(64)).store(t * 3.0 + 1.0)

    t0 = time.perf_counter()
    k = axpb.compile(target="llvm")
    t_llvm = time.perf_counter() - t0
    x = np.arange(100, dtype=np.float32)
    y = np.zeros(100, np.float32)
    k(x, y)
    t0 = time.perf_counter()
    ck = cuda.compile_program(axpb.program, device="emulated")
    t_cuda = time.perf_counter() - t0
    print(json.dumps({"calls": calls, "ok": bool((y == x * 3 + 1).all()),
                      "cubin": len(ck.cubin), "llvm_s": t_llvm, "cuda_s": t_cuda,
                      "llvm": vars(jit.DISK.stats), "nvrtc_disk": vars(nvrtc.DISK.stats),
                      "kernels": vars(KC.DISK.stats), "from": [k.cached, ck.cached],
                      "index": [ck.source.index_bits, ck.index_fits({"N": 100}),
                                ck.index_fits({"N": 2**31})]}))
''')


def _run(tmp_path: Path) -> dict:
    env = dict(os.environ, TILENEST_CACHE_DIR=str(tmp_path / "cache"),
               TILENEST_EMU_CACHE=str(tmp_path / "emu"))
    script = tmp_path / "compile_twice.py"
    script.write_text(_SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_compiled_code_from_disk(tmp_path):
    first = _run(tmp_path)
    assert first["ok"] and first["cubin"] > 0
    assert first["calls"]["optimize"] >= 1 and first["calls"]["nvrtc"] >= 1
    assert first["llvm"]["writes"] >= 1 and first["nvrtc_disk"]["writes"] >= 1
    assert first["kernels"]["writes"] == 2 and first["from"] == [None, None]
    second = _run(tmp_path)
    assert second["ok"] and second["cubin"] == first["cubin"]
    assert second["calls"] == {"optimize": 0, "nvrtc": 0}, second  # nothing compiled
    # whole kernels from disk: the object-code and cubin stores are not even asked
    assert second["kernels"]["hits"] == 2 and second["from"] == ["disk", "disk"]
    assert second["llvm"]["hits"] == 0 and second["nvrtc_disk"]["hits"] == 0
    # the 32-bit index precondition comes back with the kernel
    assert first["index"] == second["index"] == [32, True, False]
    # every entry corrupted: the third process rebuilds (and stores) them
    for p in (tmp_path / "cache").rglob("*.tnc"):
        b = bytearray(p.read_bytes())
        b[len(b) // 2] ^= 0xFF
        p.write_bytes(bytes(b))
    third = _run(tmp_path)
    assert third["ok"] and third["cubin"] == first["cubin"]
    assert third["calls"]["optimize"] >= 1 and third["calls"]["nvrtc"] >= 1
    assert third["llvm"]["corrupt"] >= 1 and third["nvrtc_disk"]["corrupt"] >= 1
    assert third["kernels"]["corrupt"] == 2 and third["from"] == [None, None]
    assert third["llvm"]["writes"] >= 1 and third["nvrtc_disk"]["writes"] >= 1
    assert third["kernels"]["writes"] == 2


def test_proof_answers_are_kept_and_counterexamples_rechecked(tmp_path, monkeypatch):
    """A refuted and a proved obligation decided twice: the second time both
    answers come from the disk (no engine call), with the same verdict, and
    the counterexample read back is re-checked against the claim."""
    from tilenest.proofs import obligation as O
    from tilenest.proofs import z3_engine
    from tilenest.proofs.taskmap import repeat, spatial
    from tilenest.semantics import expr as E

    monkeypatch.setattr(O, "PROOFS", DC.Store("proofs", tmp_path))
    n = E.Sym("n")

    def obligations():  # type: ignore[no-untyped-def]
        return [(repeat(n // 32) * spatial(32)).coverage([n]),            # refuted
                (repeat(E.cdiv(n, 32)) * spatial(32)).coverage([n])]      # proved

    first = obligations()
    O.discharge(first)
    assert [o.status for o in first] == [O.REFUTED, O.PROVED]
    assert O.PROOFS.stats.writes >= 2
    calls = []
    real = z3_engine.decide
    monkeypatch.setattr(z3_engine, "decide", lambda *a, **k: calls.append(1) or real(*a, **k))
    import tilenest.proofs.isl_engine as isl_engine
    real_isl = isl_engine.decide
    monkeypatch.setattr(isl_engine, "decide", lambda *a, **k: calls.append(1) or real_isl(*a, **k))
    second = obligations()
    O._RECENT.clear()  # as in a new process: only the disk remembers
    O.discharge(second)
    assert calls == [] and O.PROOFS.stats.hits >= 2
    assert [o.status for o in second] == [O.REFUTED, O.PROVED]
    assert second[0].checked and second[0].counterexample == first[0].counterexample


def test_a_reader_can_discard_a_whole_entry_it_cannot_use(tmp_path):
    st = DC.Store("t", tmp_path)
    st.put("k", {"format": "old"}, {"a": b"1"})
    assert st.get("k") is not None and st.stats.hits == 1
    st.discard("k")
    assert not st.path("k").exists()
    assert (st.stats.hits, st.stats.misses, st.stats.corrupt) == (0, 1, 1)
    assert st.get("k") is None


def test_tn_clear_cache_forgets_memory_and_optionally_the_disk(tmp_path, monkeypatch):
    import numpy as np

    import tilenest as tn
    from tilenest import f32
    from tilenest.backends import kernelcache as KC

    monkeypatch.setenv("TILENEST_CACHE_DIR", str(tmp_path / "c"))

    @tn.kernel
    def plus1(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        y = y.with_dims(*x.dims())
        for p in tn.parallel(tn.shape(tn.cdiv(n, 16))):
            o = tn.coord(p.index() * 16)
            y(o, tn.shape(16)).store(x[o, tn.shape(16), tn.bounds.zero] + 1.0)

    k = plus1.compile(target="llvm")
    assert len(list((tmp_path / "c").rglob("*.tnc"))) >= 1
    assert tn.clear_cache() == 0 and len(KC.MEMORY) == 0
    again = plus1.compile(target="llvm")
    assert again is not k and again.cached == "disk"  # memory forgotten, disk kept
    n = tn.clear_cache(disk=True)
    assert n >= 1 and not list((tmp_path / "c").rglob("*.tnc"))
    x = np.arange(5, dtype=np.float32)
    y = np.zeros(5, np.float32)
    k(x, y)  # a kernel still held keeps working
    assert np.array_equal(y, x + 1)
