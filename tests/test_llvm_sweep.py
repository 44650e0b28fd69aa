"""Compiled code depends on nothing the process happens to have loaded.

* The op x dtype sweep (``llvm_sweep.py``: every elementwise op on every
  dtype its type rule accepts, casts between every pair, bitcasts, every
  built-in reducer under every policy, every ``mma`` input x accumulator
  pair) compiles and runs in a fresh interpreter that loads nothing but
  tilenest and its dependencies (``python -I``, an empty environment but for
  the persistent cache switched off, as in the rest of the suite), each
  result judged by ``tn.reference``. The default run leaves to ``-m slow``
  the ``mma`` pairs of eight accumulator dtypes (``llvm_sweep.MMA_SLOW``)
  and the other groups of five dtypes (``ELEMENTWISE_SLOW``: i16, i64, u8,
  u32, f8e5m2); by default every kind of op runs on one dtype of each
  kind of lowering, every dtype is a cast's target, and every dtype but
  i64 and f64 is an ``mma`` input (into the f32, i32, u64 and f16
  accumulators).
* The JIT refuses a module importing a symbol tilenest has not bound
  (``UnresolvedSymbolError``, before anything is loaded or called).
* The soft-float helpers LLVM calls for f16 conversions the host has no
  instruction for are tilenest's own IR, exact: checked bit for bit against
  numpy on every f16 and on the f32/f64 rounding boundaries, with and without
  F16C.
* ``tn.cast`` from bool to an 8-bit integer (bool is ``i1`` in registers,
  one byte in memory) extends instead of passing the ``i1`` on.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
import pytest

import llvm_sweep as S
import tilenest as tn
from tilenest.backends.llvm import jit
from tilenest.backends.llvm.symbols import UnresolvedSymbolError, undefined_symbols
from tilenest.semantics import dtypes as D
from tilenest.semantics.ops import REGISTRY
from tilenest.semantics.reducers import BUILTINS

ROOT = Path(__file__).resolve().parent.parent
#: heavy libraries a fresh tilenest process must not load (they could bring
#: definitions of runtime helpers with them)
FOREIGN = {"torch", "scipy", "jax", "jaxlib", "tensorflow", "numba", "cupy", "sympy"}

COMBOS = S.combos()
#: the combinations of the sweep's ``default`` and ``slow`` parts
PART_KEYS = {part: {cb.key for g in S.groups() if S.in_part(g, part) for cb, _, _ in g.members}
             for part in ("default", "slow")}


# ---------------------------------------------------------------------------
# the guard: the sweep is derived from the semantics and misses nothing


def test_sweep_covers_every_op_and_dtype():
    kinds_ops = {c.op for c in COMBOS}
    values_ops = {n for n, d in REGISTRY.items() if d.family == "values"}
    missing = values_ops - kinds_ops - set(S.STRUCTURAL) - {"mma"}
    assert not missing, f"ops of the semantics the sweep does not run: {sorted(missing)}"
    assert "mma" in {c.kind for c in COMBOS}
    names = [d.name for d in D.ALL]
    arithmetic = [n for n in names if not D.parse(n).is_fp8]  # FP8 has none (V-24)
    for kind in ("unary", "binary", "ite", "map", "cast", "bitcast", "reduce"):
        got = {c.dtype for c in COMBOS if c.kind == kind}
        want = arithmetic if kind in ("map", "reduce") else names
        assert got == set(want), (kind, set(want) - got)
    fp8_casts = {(c.dtype, c.result, c.op) for c in COMBOS
                 if c.kind == "cast" and D.parse(c.result).is_fp8 and c.dtype != c.result}
    assert {p for _, _, p in fp8_casts} == {"cast/saturate", "cast/nonfinite"}
    assert len(fp8_casts) == 2 * 2 * (len(names) - 1)
    casts = {(c.dtype, c.result) for c in COMBOS if c.kind == "cast"}
    assert casts == {(a, b) for a in names for b in names}
    bitcasts = {(c.dtype, c.result) for c in COMBOS if c.kind == "bitcast"}
    assert bitcasts == {(a, b) for a in names for b in names
                        if D.parse(a).bits == D.parse(b).bits}
    reducers = {c.op.split("/")[0] for c in COMBOS if c.kind == "reduce"}
    assert reducers == set(BUILTINS)
    policies = {c.op.split("/")[1] for c in COMBOS if c.kind == "reduce"}
    assert policies == set(S.POLICIES)
    # every mma pair the type rule admits (src widens exactly into acc) whose
    # accumulator has add and mul; bool and the FP8 formats have neither
    mma = {(c.dtype, c.result) for c in COMBOS if c.kind == "mma"}
    widening = {(a, b) for a in names for b in names if S.V.widens(D.parse(a), D.parse(b))}
    assert mma <= widening and widening - mma == {
        (a, b) for a, b in widening if b == "bool" or D.parse(b).is_fp8}
    assert {a for a, _ in mma} == set(names)
    # every combination lands in exactly one kernel group
    keys = [cb.key for g in S.groups() for cb, _, _ in g.members]
    assert sorted(keys) == sorted(c.key for c in COMBOS)
    assert len(set(keys)) == len(keys)
    # ... and in exactly one part; the default part keeps every kind, every
    # dtype as a cast's target and every dtype but i64 and f64 as an mma
    # input, with integer and float accumulators
    assert PART_KEYS["default"] | PART_KEYS["slow"] == set(keys)
    assert not PART_KEYS["default"] & PART_KEYS["slow"]
    default = [c for c in COMBOS if c.key in PART_KEYS["default"]]
    assert {c.kind for c in default} == {c.kind for c in COMBOS}
    assert {c.result for c in default if c.kind == "cast"} == set(names)
    assert {c.dtype for c in default if c.kind == "mma"} == set(names) - {"i64", "f64"}
    assert {c.result for c in default if c.kind == "mma"} == {"f32", "i32", "u64", "f16"}
    for kind in ("unary", "binary", "reduce", "cast"):
        got = {c.dtype for c in default if c.kind == kind}
        assert got == {c.dtype for c in COMBOS if c.kind == kind} - set(S.ELEMENTWISE_SLOW)
        assert {"bool", "i8", "u16", "i32", "u64", "f16", "bf16", "f32", "f64"} <= got


# ---------------------------------------------------------------------------
# the sweep, in a fresh process


#: fresh processes the sweep is split over (each compiles its share of groups)
SHARDS = max(1, min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                    else (os.cpu_count() or 1)))


def _run_sweep(tmp_path_factory, part: str) -> dict:  # type: ignore[no-untyped-def]
    """Run the groups of the sweep's ``part`` in ``SHARDS`` fresh interpreters
    (``-I``: no user site, no ``PYTHON*`` variables; an environment with
    nothing but ``PATH``, the locale and the persistent cache switched off,
    so that every kernel is compiled in the fresh process, as the rest of the
    suite does: tests/conftest.py) and merge their records."""
    d = tmp_path_factory.mktemp(f"sweep-{part}")
    env = {"PATH": os.defpath, "LANG": "C.UTF-8", "TILENEST_CACHE_DIR": "off"}
    if "SYSTEMROOT" in os.environ:
        env["SYSTEMROOT"] = os.environ["SYSTEMROOT"]
    procs = []
    for i in range(SHARDS):
        out = d / f"sweep{i}.json"
        cmd = [sys.executable, "-I", str(ROOT / "tests" / "llvm_sweep.py"), str(out), str(i),
               str(SHARDS), part]
        procs.append((out, subprocess.Popen(cmd, env=env, cwd=str(d), stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)))
    merged: dict = {"results": {}, "modules": set(), "imported": set(), "cpu_seconds": 0.0}
    try:
        for out, p in procs:
            _, err = p.communicate(timeout=900)
            assert p.returncode == 0, (f"a sweep process exited with {p.returncode}:\n"
                                       f"{err[-4000:]}")
            got = json.loads(out.read_text())
            merged["results"].update(got["results"])
            merged["modules"] |= set(got["modules"])
            merged["imported"] |= set(got["imported"])
            merged["cpu_seconds"] += got["cpu_seconds"]
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return merged


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The records of the sweep's default part (``llvm_sweep.in_part``)."""
    return _run_sweep(tmp_path_factory, "default")


@pytest.fixture(scope="module")
def sweep_slow(tmp_path_factory):
    """The records of the sweep's slow part (``llvm_sweep.in_part``)."""
    return _run_sweep(tmp_path_factory, "slow")


def test_fresh_process_loaded_only_tilenest_and_its_dependencies(sweep):
    mods = set(sweep["modules"])
    assert "tilenest" in mods
    assert not mods & FOREIGN, sorted(mods & FOREIGN)


def test_sweep_judged_every_combination(sweep):
    assert set(sweep["results"]) == PART_KEYS["default"]
    # the compiled code did call out (libm, helpers), and only to bound symbols
    # (the JIT refused anything else; see the tests below)
    assert {"pow", "fmod"} <= sweep["imported"], sorted(sweep["imported"])


@pytest.mark.slow
def test_slow_sweep_judged_every_combination_in_a_fresh_process(sweep_slow):
    assert set(sweep_slow["results"]) == PART_KEYS["slow"]
    mods = set(sweep_slow["modules"])
    assert "tilenest" in mods and not mods & FOREIGN, sorted(mods & FOREIGN)


@pytest.mark.parametrize("key", [c.key for c in COMBOS if c.key in PART_KEYS["default"]])
def test_combination_compiles_runs_and_is_admitted(sweep, key):
    r = sweep["results"][key]
    assert r["ok"], r["detail"]


@pytest.mark.slow
@pytest.mark.parametrize("key", [c.key for c in COMBOS if c.key in PART_KEYS["slow"]])
def test_combination_compiles_runs_and_is_admitted_slow(sweep_slow, key):
    r = sweep_slow["results"][key]
    assert r["ok"], r["detail"]


# ---------------------------------------------------------------------------
# unresolved symbols are refused


def _module(text: str) -> llvm.ModuleRef:
    h = jit.host()
    m = jit.parse(text, h)
    return m


def test_module_with_an_unbound_external_is_refused_naming_it():
    m = _module("declare double @tn_no_such_function(double)\n"
                "define double @f(double %x) {\n"
                "  %y = call double @tn_no_such_function(double %x)\n  ret double %y\n}\n")
    with pytest.raises(UnresolvedSymbolError, match="tn_no_such_function") as e:
        jit.Engine.of_module(m, jit.target_machine(jit.host()))
    assert e.value.hint and "report" in e.value.hint


def test_unbound_global_variable_is_refused_too():
    m = _module("@tn_no_such_global = external global i32\n"
                "define i32 @f() {\n  %v = load i32, ptr @tn_no_such_global\n  ret i32 %v\n}\n")
    with pytest.raises(UnresolvedSymbolError, match="tn_no_such_global"):
        jit.Engine.of_module(m, jit.target_machine(jit.host()))


def test_symbols_are_bound_before_any_engine_exists():
    """In a fresh process, right after ``jit.init()`` and before any engine
    exists (engines used to load the process's own symbols as a side effect),
    the helpers, C math and string functions are bound to the definitions of
    the explicitly opened libraries; then a first module using ``frem`` and
    ``memset`` links and runs."""
    code = (
        "import ctypes, ctypes.util\n"
        "import llvmlite.binding as llvm\n"
        "from tilenest.backends.llvm import jit\n"
        "jit.init()\n"
        "libm = ctypes.CDLL(ctypes.util.find_library('m'))\n"
        "libc = ctypes.CDLL(ctypes.util.find_library('c'))\n"
        "addr = lambda lib, n: ctypes.cast(getattr(lib, n), ctypes.c_void_p).value\n"
        "for n in ('fmod', 'fmodf', 'exp', 'pow', 'atan2', 'floor', 'fma'):\n"
        "    assert llvm.address_of_symbol(n) == addr(libm, n), n\n"
        "for n in ('memset', 'memcpy', 'memmove'):\n"
        "    assert llvm.address_of_symbol(n) == addr(libc, n), n\n"
        "for n in ('__truncdfhf2', '__truncsfhf2', '__extendhfsf2'):\n"
        "    assert llvm.address_of_symbol(n), n\n"
        "h = jit.host()\n"
        "m = jit.parse('''\n"
        "declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)\n"
        "define double @f(double %x, double %y, ptr %p, i64 %n) {\n"
        "  call void @llvm.memset.p0.i64(ptr %p, i8 7, i64 %n, i1 false)\n"
        "  %r = frem double %x, %y\n  ret double %r\n}\n''', h)\n"
        "e = jit.Engine.of_module(m, jit.target_machine(h))\n"
        "f = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double, ctypes.c_double,\n"
        "                     ctypes.c_void_p, ctypes.c_int64)(e.address('f'))\n"
        "buf = (ctypes.c_uint8 * 300)()\n"
        "print(f(7.5, 2.0, ctypes.addressof(buf), 300), sum(buf))\n")
    p = subprocess.run([sys.executable, "-I", "-c", code], env={"PATH": os.defpath},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.split() == ["1.5", str(7 * 300)]


# ---------------------------------------------------------------------------
# object-file inspection


def test_undefined_symbols_of_elf_and_macho_objects():
    jit.init()
    text = ("declare double @fmod(double, double)\ndeclare void @tn_other()\n"
            "define double @f(double %x) {\n  call void @tn_other()\n"
            "  %y = call double @fmod(double %x, double 3.0)\n  ret double %y\n}\n")
    for triple in ("x86_64-unknown-linux-gnu", "x86_64-apple-macosx10.15.0"):
        m = llvm.parse_assembly(text)
        m.triple = triple
        tm = llvm.Target.from_triple(triple).create_target_machine()
        assert undefined_symbols(tm.emit_object(m)) == {"fmod", "tn_other"}, triple
    with pytest.raises(UnresolvedSymbolError, match="object format"):
        undefined_symbols(b"MZ\0\0not an object")


# ---------------------------------------------------------------------------
# the soft-float helpers, through the calls LLVM generates for them

_CONV = """
define void @conv(ptr %src, ptr %dst, i64 %n) {{
entry:
  br label %head
head:
  %i = phi i64 [0, %entry], [%j, %body]
  %more = icmp slt i64 %i, %n
  br i1 %more, label %body, label %done
body:
  %a = getelementptr {st}, ptr %src, i64 %i
  %v = load volatile {st}, ptr %a
  %w = {op} {st} %v to {dt}
  %b = getelementptr {dt}, ptr %dst, i64 %i
  store volatile {dt} %w, ptr %b
  %j = add i64 %i, 1
  br label %head
done:
  ret void
}}
"""
_LL = {np.float16: "half", np.float32: "float", np.float64: "double"}


def _convert(x: np.ndarray, dst: type, features: str) -> tuple[np.ndarray, set[str]]:
    """``x`` converted by LLVM's ``fptrunc``/``fpext`` compiled for the host
    CPU with ``features``; also the helper symbols the object imports."""
    h = jit.host()
    h = jit.Host(h.triple, h.cpu, features)
    st, dt = _LL[x.dtype.type], _LL[dst]
    op = "fptrunc" if np.dtype(dst).itemsize < x.dtype.itemsize else "fpext"
    m = jit.parse(_CONV.format(st=st, dt=dt, op=op), h)
    tm = jit.target_machine(h)
    imports = undefined_symbols(tm.emit_object(m))
    e = jit.Engine.of_module(m, tm)
    f = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(e.address("conv"))
    x = np.ascontiguousarray(x)
    y = np.zeros(x.shape, dst)
    f(x.ctypes.data, y.ctypes.data, x.size)
    return y, imports


def _same(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Bitwise equal, or both NaN with the same sign."""
    u = np.dtype(f"u{y.dtype.itemsize}")
    yn, rn = np.isnan(y), np.isnan(ref)
    sign = (y.view(u) >> (8 * y.dtype.itemsize - 1)) == (ref.view(u) >> (8 * y.dtype.itemsize - 1))
    return np.where(yn | rn, yn & rn & sign, y.view(u) == ref.view(u))


@np.errstate(all="ignore")
def _boundaries_f32() -> np.ndarray:
    """Every f16 value, the midpoints between neighbours and their f32
    neighbours, subnormal and overflow edges, NaN payloads, random bits."""
    h = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    h = h[np.isfinite(h)].astype(np.float32)
    nxt = np.nextafter(h.astype(np.float16), np.float16(np.inf)).astype(np.float32)
    mid = ((h.astype(np.float64) + nxt.astype(np.float64)) / 2).astype(np.float32)
    out = [h, mid, np.nextafter(mid, np.float32(np.inf)), np.nextafter(mid, np.float32(-np.inf)),
           np.array([65504, 65519.996, 65520, 65536, 1e30, 2.0**-24, 2.0**-25, 2.0**-26,
                     2.0**-25 * 1.0000001, 6.1e-5, 2.0**-14, np.inf, -np.inf], np.float32),
           np.array([0x7FC00000, 0x7F800001, 0xFFC12345, 0x7FFFFFFF], np.uint32).view(np.float32),
           np.random.default_rng(0).integers(0, 1 << 32, 200_000, dtype=np.uint64)
           .astype(np.uint32).view(np.float32)]
    x = np.concatenate(out)
    return np.concatenate([x, -x])


@pytest.mark.parametrize("features", ["host", "-f16c"])
@np.errstate(all="ignore")
def test_half_conversions_are_exact(features):
    f = llvm.get_host_cpu_features().flatten() if features == "host" else \
        llvm.get_host_cpu_features().flatten() + ",-f16c,-avx512fp16"
    allh = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    y, imp = _convert(allh, np.float32, f)
    assert _same(y, allh.astype(np.float32)).all()
    y, _ = _convert(allh, np.float64, f)
    assert _same(y, allh.astype(np.float64)).all()
    x32 = _boundaries_f32()
    y, imp32 = _convert(x32, np.float16, f)
    bad = ~_same(y, x32.astype(np.float16))
    assert not bad.any(), (x32[bad][:5], y[bad][:5])
    # f64 -> f16 rounds once: values just off an f16 midpoint by less than an
    # f32 ulp would round to the midpoint in f32, then to even
    x64 = x32.astype(np.float64)
    x64 = np.concatenate([x64, np.nextafter(x64, np.inf), np.nextafter(x64, -np.inf),
                          np.array([65519.99999999999, 2.0**-25 + 2.0**-60, 1e300, 1e-300])])
    y, imp64 = _convert(x64, np.float16, f)
    bad = ~_same(y, x64.astype(np.float16))  # numpy rounds f64 -> f16 directly, once
    assert not bad.any(), (x64[bad][:5], y[bad][:5])
    if features != "host":  # without F16C every conversion is a helper call
        assert {"__extendhfsf2", "__truncsfhf2"} <= imp | imp32, (imp, imp32)
    # F16C has no f64 -> f16 instruction (a helper call); AVX512-FP16 has one
    # (vcvtsd2sh), which the host build then uses
    assert "__truncdfhf2" in imp64 or "f16c" not in f or (
        "+avx512fp16" in f and features == "host")


def test_half_kernels_on_a_host_without_f16c():
    """Every f16 unary, binary and conversion combination of the sweep, compiled
    for this CPU with F16C turned off (each f16 <-> f32 conversion is then a
    call of a soft-float helper), is admitted by the oracle."""
    h = jit.host()
    h = jit.Host(h.triple, h.cpu, h.features + ",-f16c,-avx512fp16")
    imports: set[str] = set()
    for g in S.groups():
        if (g.kind, g.dtype) not in (("unary", "f16"), ("binary", "f16"), ("conv", "f16")):
            continue
        res = S.run_group(g, compile_kw={"host": h})
        bad = {k: r["detail"] for k, r in res.items() if not r["ok"]}
        assert not bad, bad
        ck = S.kernel(g).compile(host=h)
        imports |= undefined_symbols(jit.target_machine(h).emit_object(
            jit.parse(ck.optimized_ir, h)))
    assert {"__extendhfsf2", "__truncsfhf2"} <= imports, imports


# ---------------------------------------------------------------------------
# bool in arithmetic after a cast (the i1 register must be extended)


def test_cast_bool_to_byte_integers_then_arithmetic():
    @tn.kernel
    def k(x: tn.Tensor[tn.f32, "N"], z: tn.Tensor[tn.u8, "N"], y: tn.Tensor[tn.u8, "N"],
          w: tn.Tensor[tn.i8, "N"]):
        (n,) = x.shape
        z, y, w = (t.with_dims(*x.dims()) for t in (z, y, w))
        for p in tn.parallel(tn.shape(1)):
            b = x[tn.coord(0), tn.shape(n)] > 0.5
            zt = z[tn.coord(0), tn.shape(n)]
            y(tn.coord(0), tn.shape(n)).store(tn.cast(b, tn.u8) * 3 + zt)
            w(tn.coord(0), tn.shape(n)).store(-tn.cast(b, tn.i8) - tn.bitcast(b, tn.i8))

    x = np.array([1, 0, 1, 0.25], np.float32)
    z = np.array([5, 6, 255, 0], np.uint8)
    y, w = np.zeros(4, np.uint8), np.zeros(4, np.int8)
    k.compile()(x, z, y, w)
    assert y.tolist() == [8, 6, 2, 0] and w.tolist() == [-2, 0, -2, 0]


def test_mma_of_bool_into_byte_accumulators():
    @tn.kernel
    def k(a: tn.Tensor[tn.bool_, "M K"], b: tn.Tensor[tn.bool_, "K N"],
          c: tn.Tensor[tn.u8, "M N"]):
        M, K = a.shape
        N = b.shape[1]
        m, kk = a.dims()
        b = b.with_dims(kk, c.dim(1))
        c = c.with_dims(m, c.dim(1))
        for p in tn.parallel(tn.shape(1)):
            acc = c[tn.coord(0, 0), tn.shape(M, N)]
            c(tn.coord(0, 0), tn.shape(M, N)).store(
                tn.mma(a[tn.coord(0, 0), tn.shape(M, K)], b[tn.coord(0, 0), tn.shape(K, N)], acc))

    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 2, (3, 5)).astype(bool), rng.integers(0, 2, (5, 4)).astype(bool)
    c = rng.integers(0, 9, (3, 4)).astype(np.uint8)
    want = c + a.astype(np.uint8) @ b.astype(np.uint8)
    k.compile()(a, b, c)
    assert (c == want).all()


def test_mma_into_a_bool_accumulator_is_a_type_error():
    """add and mul are not defined on bool, so neither is a bool accumulator
    (it was admitted by the type rule and crashed the interpreter)."""
    from tilenest.errors import TypeCheckError

    with pytest.raises(TypeCheckError, match="accumulator is bool") as e:
        @tn.kernel
        def k(a: tn.Tensor[tn.bool_, "M K"], b: tn.Tensor[tn.bool_, "K N"],
              c: tn.Tensor[tn.bool_, "M N"]):
            M, K = a.shape
            N = b.shape[1]
            m, kk = a.dims()
            b = b.with_dims(kk, c.dim(1))
            c = c.with_dims(m, c.dim(1))
            for p in tn.parallel(tn.shape(1)):
                acc = c[tn.coord(0, 0), tn.shape(M, N)]
                c(tn.coord(0, 0), tn.shape(M, N)).store(
                    tn.mma(a[tn.coord(0, 0), tn.shape(M, K)], b[tn.coord(0, 0), tn.shape(K, N)],
                           acc))

        k.program  # noqa: B018 - capture happens on first use
    assert "test_llvm_sweep.py" in str(e.value)
