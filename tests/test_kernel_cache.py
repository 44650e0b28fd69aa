"""Whole compiled kernels cached on disk and in memory (``tilenest.backends.kernelcache``).

A second process compiling a kernel must load it (machine code, call facts,
verdicts) without lowering or proving it; a damaged or stale entry must be
rebuilt, never loaded; another schedule or program must miss; processes
writing one entry at once must be safe; the in-memory cache must be bounded
(LRU) without invalidating a kernel the caller holds.
"""


import dataclasses
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tilenest as tn
from tilenest import diskcache as DC
from tilenest import f32
from tilenest.backends import kernelcache as KC

ROOT = Path(__file__).resolve().parent.parent


def _axpb(block: int = 64, scale: float = 3.0) -> tn.Kernel:
    @tn.kernel
    def axpb(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, b=64, c=3.0):
        (n,) = x.shape
        y = y.with_dims(*x.dims())
        for p in tn.parallel(tn.shape(tn.cdiv(n, b))):
            o = tn.coord(p.index() * b)
            t = x[o, tn.shape(b), tn.bounds.zero]
            y(o, tn.shape(b)).store(t * c + 1.0)

    return axpb.specialize(b=block, c=scale)


def _check(ck, scale: float = 3.0) -> None:
    x = np.arange(100, dtype=np.float32)
    y = np.zeros(100, np.float32)
    ck(x, y)
    assert (y == x * np.float32(scale) + 1).all()


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """A kernel store of its own, and an empty in-memory cache before and after."""
    store = DC.Store("kernels", tmp_path)
    monkeypatch.setattr(KC, "DISK", store)
    KC.MEMORY.clear()
    yield store
    KC.MEMORY.clear()


@pytest.fixture
def bound():
    """Restores the in-memory cache's bound after a test changes it."""
    old = (KC.MEMORY.max_entries, KC.MEMORY.max_bytes)
    yield KC.MEMORY
    KC.configure(*old)
    KC.MEMORY.clear()


def _forbid_lowering(monkeypatch) -> None:
    """Any lowering, proof or code generation raises from here on."""
    import tilenest.backends.cuda as CU
    import tilenest.backends.llvm as LB
    import tilenest.lowering as LO
    from tilenest.backends.llvm import jit
    from tilenest.proofs import obligation as O

    def no(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("lowered or proved on a cache hit")

    for mod, name in ((LB, "legality"), (LB, "stage_loopir"), (LB, "build"), (CU, "_compile"),
                      (LO, "lower_verified"), (O, "discharge"), (jit, "optimize")):
        monkeypatch.setattr(mod, name, no)


# -- in one process -----------------------------------------------------------------


def test_a_disk_hit_neither_lowers_nor_proves(disk, monkeypatch):
    k = _axpb()
    first = k.compile(target="llvm")
    assert first.cached is None and disk.stats.writes == 1
    KC.MEMORY.clear()
    _forbid_lowering(monkeypatch)
    again = k.compile(target="llvm")
    assert again.cached == "disk" and again is not first and disk.stats.hits == 1
    _check(again)
    assert again.llvm_ir == first.llvm_ir and again.loopir == first.loopir
    assert again.object_code == first.object_code
    assert [o.to_json() for o in again.obligations] == [o.to_json() for o in first.obligations]
    assert again.facts == first.facts  # the call facts survive the JSON round trip


def test_the_loop_ir_of_a_disk_hit_is_lowered_again_on_demand(disk):
    k = _axpb()
    first = k.compile(target="llvm")
    KC.MEMORY.clear()
    again = k.compile(target="llvm")
    assert again.cached == "disk" and again._kernel is None
    assert KC.CallFacts.of(again.kernel) == first.facts  # lowered now, equal facts


def test_cuda_kernels_round_trip(disk, monkeypatch):
    from tilenest.backends import cuda
    from tilenest.backends.cuda.nvrtc import nvrtc_available

    if not nvrtc_available():
        pytest.skip("no NVRTC")
    prog = _axpb().program
    first = cuda.compile_program(prog, device="emulated")
    KC.MEMORY.clear()
    _forbid_lowering(monkeypatch)
    again = cuda.compile_program(prog, device="emulated")
    assert again.cached == "disk"
    assert again.cubin == first.cubin and again.source == first.source
    assert again.source.index_bits == 32 and again.source.index.kind == "index.width"
    assert again.index_fits({"N": 1000}) and not again.index_fits({"N": 2**31})
    assert again.resources == first.resources and again.built.options == first.built.options
    assert again.precondition == first.precondition  # the conjuncts (parts) included
    assert [o.to_json() for o in again.obligations] == [o.to_json() for o in first.obligations]
    syms = {"N": 1000}
    assert [(i.name, n, s) for i, n, s in again.launches(syms)] == \
        [(i.name, n, s) for i, n, s in first.launches(syms)]


DAMAGES = ["truncate", "flip", "format", "header", "dtype", "missing-part"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_or_stale_entry_is_rebuilt(disk, damage):
    k = _axpb()
    k.compile(target="llvm")
    (path,) = disk.folder().glob("*.tnc")
    key = path.stem
    if damage in ("truncate", "flip"):
        data = bytearray(path.read_bytes())
        if damage == "truncate":
            data = data[: len(data) // 2]
        else:
            data[len(data) - 40] ^= 0x5A
        path.write_bytes(bytes(data))
    else:  # a whole entry (its digest is right) that must not be used
        meta, parts = disk.get(key)
        if damage == "format":
            meta["format"] = "tilenest-kernel-0"
        elif damage == "header":
            meta["facts"]["phases"][0]["extents"] = [{"bogus": 1}]
        elif damage == "dtype":
            meta["facts"]["globals"][0]["dtype"] = "f33"
        else:
            del parts["object"]
        disk.put(key, meta, parts)
    before = disk.stats.corrupt
    KC.MEMORY.clear()
    ck = k.compile(target="llvm")
    assert ck.cached is None  # rebuilt, not loaded
    assert disk.stats.corrupt == before + 1
    _check(ck)
    KC.MEMORY.clear()
    assert k.compile(target="llvm").cached == "disk"  # the rebuilt entry is whole


def test_an_unknown_verdict_is_kept_unknown(disk, monkeypatch):
    """A verdict the solver's budget left undecided is kept as it is: a hit
    reports it unknown (never proved) and decides nothing."""
    from tilenest.backends import llvm
    from tilenest.proofs.obligation import UNKNOWN

    real = llvm.legality

    def starved(program, s):  # type: ignore[no-untyped-def]
        obs = [dataclasses.replace(o) for o in real(program, s)]  # the gate's own stay
        obs[0].set(UNKNOWN, "z3", "z3: timeout")
        return obs

    monkeypatch.setattr(llvm, "legality", starved)
    first = _axpb().compile(target="llvm")
    assert first.obligations[0].status == UNKNOWN and disk.stats.writes == 1
    KC.MEMORY.clear()
    _forbid_lowering(monkeypatch)
    again = _axpb().compile(target="llvm")
    assert again.cached == "disk"
    assert (again.obligations[0].status, again.obligations[0].reason) == (UNKNOWN, "z3: timeout")
    _check(again)


def test_another_schedule_or_program_misses(disk):
    from tilenest.backends import llvm

    k = _axpb()
    base = k.compile(target="llvm")
    KC.MEMORY.clear()
    # the runtime-only fields share the entry...
    assert k.compile(target="llvm", threads=(base.schedule.threads or 1) + 1).cached == "disk"
    KC.MEMORY.clear()
    # ...a code-relevant field does not
    other = k.compile(target="llvm", fma=not base.schedule.fma)
    assert other.cached is None and other.schedule.fma != base.schedule.fma
    KC.MEMORY.clear()
    assert _axpb(scale=5.0).compile(target="llvm").cached is None  # another program
    h = llvm.jit.host()
    keys = {llvm.disk_key(base.program, base.schedule, h),
            llvm.disk_key(base.program, base.schedule.with_(vector_bits=128), h),
            llvm.disk_key(_axpb(block=32).program, base.schedule, h),
            llvm.disk_key(base.program, base.schedule,
                          llvm.jit.Host(h.triple, h.cpu, h.features + ",-avx2"))}
    assert len(keys) == 4
    assert llvm.disk_key(base.program, base.schedule.with_(threads=3, chunk=7), h) == \
        llvm.disk_key(base.program, base.schedule, h)


def test_the_key_covers_the_compiler_source(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.cuh").write_text("// b\n")
    d0 = KC.tree_digest(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert KC.tree_digest(tmp_path) == d0  # byte code does not count
    (tmp_path / "sub" / "b.cuh").write_text("// c\n")
    assert KC.tree_digest(tmp_path) != d0
    assert len(KC.source_digest()) == 64


# -- the bounded in-memory cache -------------------------------------------------------


def test_the_memory_cache_is_lru_within_its_bounds():
    m = KC.MemoryCache(2, 1000)
    gone: list = []
    m.on_evict = gone.append
    m.put("a", "A", 10)
    m.put("b", "B", 10)
    assert m.get("a") == "A"  # a is now the most recent
    m.put("c", "C", 10)
    assert gone == ["B"] and m.get("b") is None and len(m) == 2
    m.put("big", "X", 2000)  # larger than the whole budget: not kept
    assert m.get("big") is None and len(m) == 2
    m.put("d", "D", 995)  # over the byte bound: the oldest go
    assert m.get("a") is None and m.get("c") is None and m.get("d") == "D"
    assert m.nbytes == 995 and m.stats.evictions == 3
    m.configure(max_entries=0)
    assert len(m) == 0 and m.nbytes == 0


def test_limits_from_the_environment(monkeypatch):
    for raw, want in [("8", (8, 256 << 20)), ("8,64M", (8, 64 << 20)), ("3, 2KiB", (3, 2048)),
                      ("off", (0, 0)), ("0", (0, 0)), ("junk", (64, 256 << 20)),
                      ("", (64, 256 << 20))]:
        monkeypatch.setenv("TILENEST_MEMORY_CACHE", raw)
        assert KC.limits_from_env() == want, raw


def test_an_evicted_kernel_the_caller_holds_keeps_working(bound):
    KC.MEMORY.clear()
    KC.configure(max_entries=2)
    k1, k2, k3 = (_axpb(scale=s).compile(target="llvm") for s in (3.0, 4.0, 5.0))
    assert len(KC.MEMORY) == 2 and KC.MEMORY.stats.evictions >= 1
    import gc

    gc.collect()
    _check(k1, 3.0)  # evicted from the cache, still runs
    assert _axpb(scale=3.0).compile(target="llvm") is not k1  # it was evicted
    assert _axpb(scale=5.0).compile(target="llvm") is k3  # k2 is the LRU victim now
    assert _axpb(scale=4.0).compile(target="llvm") is not k2
    KC.configure(max_bytes=k3.nbytes - 1)  # nothing fits
    assert len(KC.MEMORY) == 0
    from tilenest.backends import llvm

    llvm.clear_cache()
    _check(k1, 3.0)
    _check(k3, 5.0)


def test_a_memory_hit_for_other_worker_threads_shares_the_code(bound):
    KC.MEMORY.clear()
    a = _axpb(scale=7.0).compile(target="llvm")
    n = (a.schedule.threads or 1) + 1
    b = _axpb(scale=7.0).compile(target="llvm", threads=n)
    assert b is not a and b.engine is a.engine and b.schedule.threads == n
    assert _axpb(scale=7.0).compile(target="llvm") is a
    _check(b, 7.0)


def test_clear_cache_forgets_compiled_kernels(bound):
    from tilenest.backends import llvm
    from tilenest.lowering import legality as LG

    KC.MEMORY.clear()
    k = _axpb(scale=6.0).compile(target="llvm")
    assert len(KC.MEMORY) == 1 and LG._CACHE
    llvm.clear_cache()
    assert len(KC.MEMORY) == 0 and not LG._CACHE
    _check(k, 6.0)


# -- across processes -------------------------------------------------------------------

_SCRIPT = textwrap.dedent('''
    import json, os, sys
    sys.path.insert(0, os.environ["TEST_DIR"])
    import numpy as np
    from tilenest.backends import kernelcache as KC
    from tilenest.backends import cuda
    from tilenest.backends.cuda import nvrtc
    import test_kernel_cache as T

    KC.source_digest = T._same_compiler

    class _MP:  # the forbidding patches of the tests, in this process
        def setattr(self, mod, name, value):
            setattr(mod, name, value)

    k = T._axpb()
    prog = k.program  # captured before anything is forbidden
    if os.environ.get("FORBID") == "1":
        T._forbid_lowering(_MP())
        real = nvrtc.compile_program
        nvrtc.compile_program = lambda *a, **kw: (_ for _ in ()).throw(AssertionError("nvrtc"))
    ck = k.compile(target="llvm")
    T._check(ck)
    out = {"llvm": ck.cached, "llvm_obs": [o.to_json()["verdict"] for o in ck.obligations]}
    if nvrtc.nvrtc_available():
        cu = cuda.compile_program(prog, device="emulated")
        out.update(cuda=cu.cached, cubin=len(cu.cubin),
                   cuda_obs=[o.to_json()["verdict"] for o in cu.obligations])
    out["disk"] = vars(KC.DISK.stats)
    print(json.dumps(out))
''')


def _run(tmp_path: Path, forbid: bool) -> dict:
    env = dict(os.environ, TILENEST_CACHE_DIR=str(tmp_path / "cache"),
               TEST_DIR=str(ROOT / "tests"), FORBID="1" if forbid else "0")
    script = tmp_path / "compile.py"
    script.write_text(_SCRIPT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, check=False,
                       env=env, timeout=600, cwd=str(ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_whole_kernels_without_lowering_or_proving(tmp_path):
    first = _run(tmp_path, forbid=False)
    assert first["llvm"] is None and first["disk"]["writes"] >= 1
    second = _run(tmp_path, forbid=True)  # lowering, proofs, LLVM and NVRTC all raise
    assert second["llvm"] == "disk" and second["llvm_obs"] == first["llvm_obs"]
    if "cuda" in first:
        assert second["cuda"] == "disk" and second["cubin"] == first["cubin"]
        assert second["cuda_obs"] == first["cuda_obs"]
    assert second["disk"]["writes"] == 0 and second["disk"]["corrupt"] == 0


def _same_compiler() -> str:
    """A fixed compiler digest, so that processes agree on it even if a file of
    the package is edited while the test runs (the digest has its own test)."""
    return "the-same-compiler"


def _compile_in_child(root: str, n: int) -> list:
    os.environ["TILENEST_CACHE_DIR"] = root
    KC.source_digest = _same_compiler
    out = []
    for _ in range(n):
        KC.MEMORY.clear()
        ck = _axpb().compile(target="llvm")
        _check(ck)
        out.append(ck.cached)
    return out


def test_concurrent_processes_share_one_entry_safely(tmp_path, monkeypatch):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(3) as pool:
        res = pool.starmap(_compile_in_child, [(str(tmp_path), 3)] * 3)
    flat = [c for r in res for c in r]
    assert set(flat) <= {None, "disk"} and "disk" in flat
    assert not list(tmp_path.rglob("*.tmp"))
    monkeypatch.setenv("TILENEST_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(KC, "source_digest", _same_compiler)
    KC.MEMORY.clear()
    assert _axpb().compile(target="llvm").cached == "disk"  # the entry left is whole
    KC.MEMORY.clear()


def test_the_legality_verdicts_in_memory_are_bounded(monkeypatch):
    """The gate's verdict cache keeps at most ``CACHE_ENTRIES`` entries,
    least recently used out: a compile needs three (races, schedule,
    layouts), the newest stay."""
    import tilenest as tn
    from tilenest import f32
    from tilenest.lowering import default_schedule, legality as LG

    @tn.kernel
    def twice(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, c=2.0):
        (n,) = x.shape
        for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
            o = tn.coord(p.index() * 4)
            y(o, tn.shape(4)).store(x[o, tn.shape(4), tn.bounds.zero] * c)

    LG.clear_cache()
    monkeypatch.setattr(LG, "CACHE_ENTRIES", 4)
    progs = [twice.specialize(c=float(c)).program for c in (2, 3)]
    for p in progs:
        LG.legality(p, default_schedule(p, "llvm"))
    assert len(LG._CACHE) == 4
    last = LG._keys(progs[1], default_schedule(progs[1], "llvm"))
    assert all(k in LG._CACHE for k in last)
    LG.clear_cache()
