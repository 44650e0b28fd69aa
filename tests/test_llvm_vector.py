"""The structural facts the CPU's speed depends on, read from the assembly.

``for.vector`` loops whose bodies the code generator can vectorize are
emitted as explicit vector IR (``backends/llvm/vector.py``), so these facts
are properties of the lowering, whatever LLVM's vectorizers decide. Each test
compiles for a named x86-64 level (``x86-64-v3``: AVX2 + FMA, 16 ymm
registers; ``x86-64-v4``: AVX-512, 32 zmm registers) on this host, whatever
its own CPU, and checks the hottest loop of the assembly:

* the ``mma`` micro-kernel: packed FMAs only (no scalar FMA) and no store in
  the loop over the contraction (the accumulators stay in registers);
* row kernels: packed arithmetic in their vector loops.

A last test removes the vectorization and checks that the GEMM assertion
then fails, so the guard cannot pass vacuously.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends.llvm import compile_program, jit
from tilenest.backends.llvm import vector as V
from tilenest.bench.kernels import kernels
from tilenest.lowering import default_schedule
from tilenest.lowering import loopir as L
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E

LEVELS = {"x86-64-v3": (256, "ymm"), "x86-64-v4": (512, "zmm")}


def _host(level: str) -> jit.Host:
    h = jit.host()
    return jit.Host(h.triple, level, "")


def assembly(kernel, level: str, **sched) -> str:
    bits, _ = LEVELS[level]
    prog = kernel.program
    s = default_schedule(prog, "llvm", vector_bits=bits, **sched)
    return compile_program(prog, s, cache=False, host=_host(level)).asm()


def loops(asm: str) -> list[list[str]]:
    """The instructions of every basic block that branches back to itself
    (an innermost loop), in order of appearance. A block starts at a label
    or after a jump (LLVM prints fall-through blocks as comments)."""
    blocks: list[tuple[str, list[str]]] = []
    for line in asm.splitlines():
        line = line.split("#", 1)[0].rstrip()
        m = re.match(r"^(\.?[\w.$]+):", line)
        if m:
            blocks.append((m.group(1), []))
        elif blocks and line.startswith("\t") and not line.lstrip().startswith("."):
            blocks[-1][1].append(line.strip())
            if line.lstrip().startswith("j"):
                blocks.append(("", []))
    out = []
    for label, ins in blocks:
        if label and ins and re.match(rf"^j\w+\s+{re.escape(label)}$", ins[-1]):
            out.append(ins)
    return out


def cycles(asm: str) -> list[list[str]]:
    """The innermost loops whose body may branch (a common path with a rare
    one beside it): the instructions from a label to a later jump back to
    it, for each such span that holds no other span, in order of the
    jumps."""
    seen: dict[str, int] = {}
    flat: list[str] = []
    spans: list[tuple[int, int]] = []
    for line in asm.splitlines():
        line = line.split("#", 1)[0].rstrip()
        m = re.match(r"^(\.?[\w.$]+):", line)
        if m:
            seen[m.group(1)] = len(flat)
        elif line.startswith("\t") and not line.lstrip().startswith("."):
            flat.append(line.strip())
            j = re.match(r"^j\w+\s+(\S+)$", flat[-1])
            if j and j.group(1) in seen:
                spans.append((seen[j.group(1)], len(flat)))
    inner = [(a, b) for a, b in spans
             if not any((c, d) != (a, b) and a <= c and d <= b for c, d in spans)]
    return [flat[a:b] for a, b in inner]


def hottest(asm: str, pattern: str) -> list[str]:
    """The self-looping block with the most instructions matching ``pattern``."""
    found = loops(asm)
    assert found, "no loop in the assembly"
    return max(found, key=lambda ins: sum(bool(re.match(pattern, i)) for i in ins))


def micro_kernel_is_packed(asm: str, reg: str) -> tuple[bool, str]:
    """Whether the GEMM's hottest FMA loop is the register-blocked
    micro-kernel: packed FMAs on ``reg`` registers, no scalar FMA, no store."""
    inner = hottest(asm, r"vfmadd")
    packed = [i for i in inner if re.match(rf"vfmadd\d+ps\s.*%{reg}", i)]
    scalar = [i for i in inner if re.match(r"vfmadd\d+s[sd]\s", i)]
    stores = [i for i in inner if re.match(r"vmov\w*\s+%[xyz]mm\d+,\s*-?\d*\(", i)]
    ok = len(packed) >= 8 and not scalar and not stores
    return ok, f"{len(packed)} packed, {len(scalar)} scalar FMAs, {len(stores)} stores"


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_gemm_micro_kernel_is_packed_fma_in_registers(level):
    g = kernels()["gemm"].specialize(bm=64, bn=64, bk=64)
    ok, what = micro_kernel_is_packed(assembly(g, level), LEVELS[level][1])
    assert ok, f"{level}: the mma micro-kernel's inner loop has {what}"


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_strict_gemm_micro_kernel_is_packed_mul_add(level):
    """Without reassociation no FMA may appear (products and sums rounded
    separately), but the micro-kernel is still packed."""
    g = kernels()["gemm_strict"].specialize(bm=64, bn=64, bk=64)
    asm = assembly(g, level)
    reg = LEVELS[level][1]
    inner = hottest(asm, r"vmulps")
    assert not any(i.startswith("vfmadd") for i in asm.splitlines())
    assert sum(bool(re.match(rf"vmulps\s.*%{reg}", i)) for i in inner) >= 8
    assert sum(bool(re.match(rf"vaddps\s.*%{reg}", i)) for i in inner) >= 8
    assert not any(re.match(r"v(mul|add)ss\s", i) for i in inner)


@pytest.mark.parametrize("level", sorted(LEVELS))
@pytest.mark.parametrize("name,op", [("add", "vaddps"), ("row_sum", "vaddps"),
                                     ("rmsnorm", "vmulps"), ("softmax", "vmulps"),
                                     ("layernorm", "vmulps")])
def test_row_kernel_vector_loops_are_packed(level, name, op):
    reg = LEVELS[level][1]
    asm = assembly(kernels()[name], level)
    packed = [ins for ins in loops(asm)
              if any(re.match(rf"{op}\s.*%{reg}", i) for i in ins)]
    assert packed, f"{name} on {level}: no loop with packed {op} on {reg} registers"


def blocks(asm: str) -> list[list[str]]:
    """The instructions of each basic block in layout order (a block starts
    at a label or after a jump)."""
    out: list[list[str]] = [[]]
    for line in asm.splitlines():
        line = line.split("#", 1)[0].rstrip()
        if re.match(r"^(\.?[\w.$]+):", line):
            out.append([])
        elif line.startswith("\t") and not line.lstrip().startswith("."):
            out[-1].append(line.strip())
            if line.lstrip().startswith("j"):
                out.append([])
    return [b for b in out if b]


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_softmax_exp_common_path_is_packed_and_lean(level):
    """The softmax's ``exp`` loop tests once per vector step whether every
    lane is in the common range and then runs the short path: packed FMAs,
    none of the range handling (``k`` converted to an integer, clamped
    exponents, variable shifts for subnormal scales) of the whole formula."""
    reg = LEVELS[level][1]
    bl = blocks(assembly(kernels()["softmax"], level))
    test = re.compile(r"(kortest\w|vptest|vtestps|vmovmskps)\s")
    for i, ins in enumerate(bl[:-1]):
        if any(test.match(x) for x in ins) and re.match(r"j(ne|e)\s", ins[-1]):
            common = bl[i + 1]
            fmas = [x for x in common if re.match(rf"vf\w*madd\w*ps\s.*%{reg}", x)]
            if len(fmas) >= 6:
                break
    else:
        raise AssertionError(f"{level}: no vector step test followed by a packed exp path")
    slow = [x for x in common if re.match(r"(vcvttps2dq|vpm(in|ax)sd|vpsllvd)\s", x)]
    assert not slow, f"{level}: the common exp path does range handling: {slow}"


def test_guard_fails_without_vectorization(monkeypatch):
    """With the explicit vector loops removed the micro-kernel check fails:
    the guard above would catch the regression."""
    monkeypatch.setattr(V, "plan", lambda var, body, bits: None)
    g = kernels()["gemm"].specialize(bm=64, bn=64, bk=64)
    ok, what = micro_kernel_is_packed(assembly(g, "x86-64-v4"), "zmm")
    assert not ok, what


# ---------------------------------------------------------------------------
# which bodies are vector code, and that vector code means the same


def _loop(body: tuple) -> tuple[L.LVar, tuple]:
    return L.LVar("i", L.INDEX), body


def test_plan_admits_stores_of_lane_wise_expressions():
    i, x = L.LVar("i", L.INDEX), E.Var("i")
    src = L.Buffer("a", D.f32, "global", E.Sym("N"), 0)
    dst = L.Buffer("b", D.f32, "global", E.Sym("N"), 1)
    val = L.Bin("mul", L.Load(src, L.IExpr(x + 3)), L.Load(src, L.IExpr(E.Const(0))), D.f32)
    assert V.plan(i, (L.Store(dst, L.IExpr(x), val),), 512) == 16
    assert V.plan(i, (L.Store(dst, L.IExpr(x), val),), 256) == 8
    f64 = L.Buffer("c", D.f64, "global", E.Sym("N"), 2)
    assert V.plan(i, (L.Store(f64, L.IExpr(x), L.Cast(val, D.f64)),), 512) == 8
    # exp on f32 has a lane-wise form (MathLib.exp_f32_vec); on f64 it has not
    assert V.plan(i, (L.Store(dst, L.IExpr(x), L.Un("exp", val, D.f32)),), 512) == 16
    e64 = L.Un("exp", L.Cast(val, D.f64), D.f64)
    assert V.plan(i, (L.Store(f64, L.IExpr(x), e64),), 512) is None


@pytest.mark.parametrize("why,stmt", [
    ("non-affine read", lambda x, s, d: L.Store(d, L.IExpr(x), L.Load(s, L.IExpr(x * x)))),
    ("scatter", lambda x, s, d: L.Store(d, L.IExpr(x * 3), L.Load(s, L.IExpr(x)))),
    ("uniform store", lambda x, s, d: L.Store(d, L.IExpr(E.Const(0)), L.Load(s, L.IExpr(x)))),
    ("transcendental", lambda x, s, d: L.Store(d, L.IExpr(x), L.Un("log", L.Load(s, L.IExpr(x)),
                                                                      D.f32))),
    ("reduction", lambda x, s, d: L.Assign(L.LVar("acc", D.f32), L.Load(s, L.IExpr(x)))),
])
def test_plan_leaves_other_bodies_scalar(why, stmt):
    src = L.Buffer("a", D.f32, "global", E.Sym("N"), 0)
    dst = L.Buffer("b", D.f32, "global", E.Sym("N"), 1)
    assert V.plan(L.LVar("i", L.INDEX), (stmt(E.Var("i"), src, dst),), 512) is None, why


@tn.kernel
def ragged_mix(x: tn.Tensor[tn.f32, "R C"], m: tn.Tensor[tn.i32, "R C"],
               y: tn.Tensor[tn.f64, "R C"], z: tn.Tensor[tn.bool_, "R C"], *, bc=24):
    rows, cols = x.shape
    m, y, z = m.with_dims(*x.dims()), y.with_dims(*x.dims()), z.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(rows, tn.cdiv(cols, bc))):
        r, c = p.index(0), p.index(1) * bc
        xs = x[tn.coord(r, c), tn.shape(1, bc), tn.bounds.zero]
        ms = m[tn.coord(r, c), tn.shape(1, bc), tn.bounds.zero]
        v = tn.maximum(xs * 2.0 - tn.cast(ms, tn.f32), xs)
        y(tn.coord(r, c), tn.shape(1, bc)).store(tn.cast(v, tn.f64) / 3.0)
        z(tn.coord(r, c), tn.shape(1, bc)).store(v > 0.5)


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_vector_loops_match_the_interpreter(level):
    """Guarded (ragged) loads and stores as masks, f32/f64/int casts, bool
    stores, and lane counts that leave a scalar rest: compiled for each level
    and compared with the oracle bitwise."""
    bits, _ = LEVELS[level]
    prog = ragged_mix.program
    k = compile_program(prog, default_schedule(prog, "llvm", vector_bits=bits), cache=False,
                        host=_host(level))
    w = bits // 32
    for form in ("llvm.masked.load", f"<{w} x float>", f"<{w // 2} x double>",
                 f"<{w} x i8>"):
        assert form in k.llvm_ir, f"{form} not generated: the loops were not vector code"
    rng = np.random.default_rng(1)
    for R, C in ((3, 50), (1, 7), (2, 24), (4, 0)):
        x = rng.standard_normal((R, C)).astype(np.float32)
        x[0, :3] = [np.nan, -0.0, np.inf] if C >= 3 else x[0, :3]
        m = rng.integers(-5, 5, (R, C)).astype(np.int32)
        got = (np.full((R, C), 7.0), np.ones((R, C), bool))
        k(x, m, *got)
        want = ragged_mix(x, m, np.zeros((R, C)), np.zeros((R, C), bool))
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


def _run_hand_kernel(body_of, n: int, syms: dict, bits: int = 512):
    """Generate, JIT and run a one-phase loop-IR kernel ``out[i] = ...`` over
    ``for.vector i in [0, N)`` (one program), returning ``out`` (poisoned
    with 7) and whether the loop was vector code."""
    import ctypes

    from tilenest.backends.llvm.codegen import Codegen

    N = E.Sym("N")
    a = L.Buffer("a", D.f32, "global", N, 0)
    out = L.Buffer("out", D.f32, "global", N, 1)
    i = L.LVar("i", L.INDEX)
    loop = L.For(i, E.Const(0), N, (body_of(E.Var("i"), a, out),), "vector")
    names = ("N", *syms)
    ph = L.Phase("ph", (E.Const(1),), L.LVar("pid", D.i64), (loop,))
    params = (L.Param("a", "tensor", D.f32, (N,)), L.Param("out", "tensor", D.f32, (N,)))
    k = L.Kernel("hand", params, names, (), (ph,), (), (a, out))
    h = jit.host()
    mod = jit.optimize(jit.parse(Codegen(k, bits, h.cpu, h.features).text(), h),
                       jit.target_machine(h))
    vector = f"<{bits // 32} x float>" in str(mod)
    eng = jit.Engine.of_module(mod, jit.target_machine(h))
    x = np.arange(n, dtype=np.float32) - 3.5
    y = np.full(n, 7.0, np.float32)
    args = (ctypes.c_void_p * 2)(x.ctypes.data, y.ctypes.data)
    sv = (ctypes.c_int64 * len(names))(n, *syms.values())
    status = ctypes.c_int32(0)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                          ctypes.c_int64, ctypes.c_void_p)(eng.address("ph"))
    fn(args, sv, None, 0, 1, ctypes.byref(status))
    assert status.value == 0
    return x, y, vector


@pytest.mark.parametrize("n", [0, 5, 16, 37])
def test_guarded_store_is_a_masked_store(n):
    """``out[i] = 2 a[i]`` only where ``lo <= i < hi``: lanes off the guard
    keep the poison, in the vector steps and the scalar rest alike."""
    lo, hi = 3, 29

    def body(x, a, out):
        g = L.IPred(E.pand(x.ge(E.Sym("lo")), x.lt(E.Sym("hi"))))
        return L.Store(out, L.IExpr(x), L.Bin("mul", L.Load(a, L.IExpr(x)),
                                              L.Const(2.0, D.f32), D.f32), g)

    x, y, vector = _run_hand_kernel(body, n, {"lo": lo, "hi": hi})
    assert vector
    want = np.where((np.arange(n) >= lo) & (np.arange(n) < hi), 2 * x, np.float32(7.0))
    np.testing.assert_array_equal(y, want)


def test_uniform_and_iota_operands():
    """A load at an index that does not move (a broadcast) and the loop
    variable used as data (``float(i)``)."""
    def body(x, a, out):
        first = L.Load(a, L.IExpr(E.Const(1)))
        return L.Store(out, L.IExpr(x), L.Bin("add", L.Cast(L.IExpr(x * 3 + 1), D.f32), first,
                                              D.f32))

    x, y, vector = _run_hand_kernel(body, 21, {})
    assert vector
    np.testing.assert_array_equal(y, (np.arange(21) * 3 + 1).astype(np.float32) + x[1])
