"""The LLVM backend's vectorizable transcendentals against their ulp bounds.

Narrow-dtype (f16/bf16/f32) ``exp exp2 expm1 log log2 log1p tanh erf sigmoid``
are evaluated by IR code of ``backends/llvm/mathlib.py`` (no C library call).
The interpreter's contract admits any result within 1 ulp of the exact value
(``numerics.TRANSCENDENTAL_ULP``); each function documents a tighter bound
(:data:`BOUND`, spec/lowering.md). Here the compiled results are measured in
ulps of the result dtype against the float64 value of the function:

* on a dense grid over the whole f32 range plus special values (default suite),
* bitwise at special values (NaN, +-inf, +-0, overflow and underflow
  thresholds, subnormal results),
* exhaustively over all 65536 f16 and bf16 inputs (default suite),
* exhaustively over all 2^32 f32 inputs (``-m slow``; the reference is the
  C library's float64 function, reached through the f64 kernel),
* and through the oracle (``tn.validate``), which must admit every result.
"""

from __future__ import annotations

import linecache
import math
import re
import time

import numpy as np
import pytest

from tilenest.semantics import numerics as N
from tilenest.semantics.dtypes import parse
from tilenest.validation import validate

OPS = ["exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "erf", "sigmoid"]
NARROW = ["f32", "f16", "bf16"]
#: the bound (ulp of the result dtype) each narrow function is documented with
BOUND = {op: 0.51 for op in OPS} | {"exp": 0.9}

_erf = np.vectorize(math.erf, otypes=[np.float64])
REF = {"exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
       "log1p": np.log1p, "tanh": np.tanh, "erf": _erf,
       "sigmoid": lambda v: 1.0 / (1.0 + np.exp(-v))}
#: (smallest normal exponent, mantissa bits) per dtype
_FMT = {"f32": (-126, 23), "f16": (-14, 10), "bf16": (-126, 7)}
COLS = 1024
_KERNELS: dict[tuple[str, str], object] = {}


def compiled(op: str, dt: str):
    """The kernel ``y = op(x)`` over ``R x C`` tensors of ``dt`` (made once)."""
    key = (op, dt)
    if key not in _KERNELS:
        src = (f"import tilenest as tn\n\n\n@tn.kernel\n"
               f"def k(x: tn.Tensor[tn.{dt}, 'R C'], y: tn.Tensor[tn.{dt}, 'R C']):\n"
               f"    rows, cols = x.shape\n"
               f"    for p in tn.parallel(tn.shape(rows)):\n"
               f"        o = tn.coord(p.index(), 0)\n"
               f"        y(o, tn.shape(1, cols)).store(tn.{op}(x[o, tn.shape(1, cols)]))\n")
        name = f"<math-{op}-{dt}>"
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        ns: dict = {}
        exec(compile(src, name, "exec"), ns)
        _KERNELS[key] = ns["k"]
    return _KERNELS[key]


def run(op: str, dt: str, x: np.ndarray) -> np.ndarray:
    """``op`` compiled for ``dt`` on the flat array ``x`` (padded to whole rows)."""
    n = x.size
    pad = (-n) % COLS
    xs = np.concatenate([x, np.zeros(pad, x.dtype)]).reshape(-1, COLS)
    y = np.empty_like(xs)
    compiled(op, dt).compile()(xs, y)
    return y.reshape(-1)[:n]


def ulp_error(y: np.ndarray, ref: np.ndarray, dt: str) -> np.ndarray:
    """``|y - ref|`` in ulps of ``dt`` at ``ref`` (the ulp of the binade of
    ``|ref|``, the subnormal spacing below the normal range). Where ``ref``
    rounds to an infinity or is NaN: 0 for that same value, inf otherwise."""
    emin, mant = _FMT[dt]
    y = y.astype(np.float64)
    with np.errstate(all="ignore"):
        rounded = ref.astype(np.dtype(parse(dt).np)).astype(np.float64)
        e = (np.abs(ref).view(np.int64) >> 52) - 1023  # binade of |ref| (ref is normal f64)
        u = ((np.maximum(e, emin) - mant + 1023) << 52).view(np.float64)  # 2^(e - mant)
        d = np.abs(y - ref) / u
    special = np.isinf(rounded) | np.isnan(ref) | np.isnan(y) | np.isinf(y)
    same = (y == rounded) | (np.isnan(y) & np.isnan(ref))
    return np.where(special, np.where(same, 0.0, np.inf), d)


def reference(op: str, x: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return REF[op](x.astype(np.float32).astype(np.float64))


def grid(dt: str) -> np.ndarray:
    """Every 4099th f32 bit pattern (both signs, all binades), a dense linear
    sweep of the central range, and the special values, as ``dt``."""
    bits = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32)
    x = np.concatenate([bits.view(np.float32), np.linspace(-12, 12, 200_001, dtype=np.float32),
                        specials()])
    with np.errstate(all="ignore"):
        return x.astype(parse(dt).np)


def specials() -> np.ndarray:
    f = np.float32
    edges = [88.72283, 88.72284, -103.27893, -103.97208, -103.972084, -87.33654, -87.33655,
             127.99999, 128.0, -149.0, -150.0, -149.99998, 2.0 ** -29, -(2.0 ** -29),
             -1.0, -0.99999994, 3.9999998, 4.0, 9.01, 0.5, 0.49999997]
    sp = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, 2.0, 0.25, 1e-45, -1e-45, 1.17549435e-38,
          -1.17549435e-38, 3.4028235e38, -3.4028235e38, 1e-30, -1e-30] + edges
    near = [np.nextafter(f(v), f(np.inf)) for v in edges] + [np.nextafter(f(v), f(-np.inf))
                                                             for v in edges]
    return np.array(sp + near, dtype=np.float32)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_grid_within_bound(op, dt):
    x = grid(dt)
    y = run(op, dt, x)
    err = ulp_error(y, reference(op, x), dt)
    worst = int(np.argmax(err))
    assert err[worst] <= BOUND[op] <= N.ulp_bound(op, parse(dt)), (
        op, dt, float(x[worst]), float(y[worst]), err[worst])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_sixteen_bit_exhaustive(op, dt):
    x = np.arange(1 << 16, dtype=np.uint16).view(parse(dt).np)
    y = run(op, dt, x)
    err = ulp_error(y, reference(op, x), dt)
    worst = int(np.argmax(err))
    assert err[worst] <= BOUND[op], (op, dt, float(x[worst]), float(y[worst]), err[worst])


@pytest.mark.parametrize("op", OPS)
def test_special_values_exact(op):
    """NaN, infinities, signed zeros, the smallest subnormals and the largest
    finite values give the correctly rounded results, bit for bit."""
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 3e-45, 3.4028235e38,
                  -3.4028235e38, 1.0, -1.0], np.float32)
    y = run(op, "f32", x)
    with np.errstate(all="ignore"):
        want = reference(op, x).astype(np.float32)
    same = (y.view(np.uint32) == want.view(np.uint32)) | (np.isnan(y) & np.isnan(want))
    assert same.all(), [(float(a), float(b), float(c)) for a, b, c in
                        zip(x[~same], y[~same], want[~same], strict=True)]


def test_exp_thresholds():
    """exp overflows exactly above 88.72283 (the largest input with a finite
    result) and underflows to 0 exactly below ln(2^-150); the results on both
    sides of each threshold are the correctly rounded ones."""
    x = np.array([88.72283, 88.72284, -103.97208, -103.972084], np.float32)
    y = run("exp", "f32", x)
    with np.errstate(over="ignore"):
        assert np.array_equal(y, reference("exp", x).astype(np.float32))
    assert np.isfinite(y[0]) and np.isinf(y[1]) and y[2] == np.float32(2.0 ** -149)
    assert y[3] == 0.0 and not np.signbit(y[3])


@pytest.mark.parametrize("dt", NARROW)
def test_oracle_admits(dt):
    """The interpreter's oracle admits every compiled result (values over the
    whole range, so results are checked against its 1-ulp envelope)."""
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(4 * COLS) * 8, rng.standard_normal(2 * COLS) * 60,
                        specials().astype(np.float64)])
    x = x[: x.size - x.size % COLS]
    with np.errstate(all="ignore"):
        x = x.astype(parse(dt).np).reshape(-1, COLS)
    for op in OPS:
        rep = validate(compiled(op, dt), inputs=[x, np.zeros_like(x)])
        assert rep.ok and rep.count("ok") == 1, (op, rep.summary())


def test_no_libm_calls_for_narrow_dtypes():
    """The narrow functions are inline IR, so the row loop is vectorized."""
    for op in OPS:
        ck = compiled(op, "f32").compile()
        assert not re.search(r"call\s+\S*\b(exp|exp2|expm1|log|log2|log1p|tanh|erf)\b",
                             ck.asm()), op
        assert re.search(r"<\d+ x (float|double)>", ck.optimized_ir), op


_MAX_ULP_IR = """
declare double @llvm.fabs.f64(double)
define void @max_ulp(ptr %y, ptr %r, i64 %n, ptr %res) {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%i1, %loop]
  %mx = phi double [0.0, %entry], [%mx1, %loop]
  %at = phi i64 [-1, %entry], [%at1, %loop]
  %nb = phi i64 [0, %entry], [%nb1, %loop]
  %yp = getelementptr float, ptr %y, i64 %i
  %yl = load float, ptr %yp
  %yv = fpext float %yl to double
  %rp = getelementptr double, ptr %r, i64 %i
  %rv = load double, ptr %rp
  %ra = call double @llvm.fabs.f64(double %rv)
  %rb = bitcast double %ra to i64
  %e0 = lshr i64 %rb, 52
  %e1 = sub i64 %e0, 1023
  %lo = icmp slt i64 %e1, -126
  %e2 = select i1 %lo, i64 -126, i64 %e1
  %ub = add i64 %e2, 1000
  %ub2 = shl i64 %ub, 52
  %u = bitcast i64 %ub2 to double
  %df = fsub double %yv, %rv
  %da = call double @llvm.fabs.f64(double %df)
  %q = fdiv double %da, %u
  %fin = fcmp olt double %q, 0x7FF0000000000000
  %rr = fptrunc double %rv to float
  %rrd = fpext float %rr to double
  %same = fcmp oeq double %rrd, %yv
  %ynan = fcmp uno double %yv, %yv
  %rnan = fcmp uno double %rv, %rv
  %bothnan = and i1 %ynan, %rnan
  %okspecial = or i1 %same, %bothnan
  %yabs = call double @llvm.fabs.f64(double %yv)
  %rrabs = call double @llvm.fabs.f64(double %rrd)
  %yinf = fcmp oeq double %yabs, 0x7FF0000000000000
  %rinf = fcmp oeq double %rrabs, 0x7FF0000000000000
  %infdiff = xor i1 %yinf, %rinf
  %yb = bitcast double %yv to i64
  %ys = icmp slt i64 %yb, 0
  %rbits = bitcast double %rv to i64
  %rsg = icmp slt i64 %rbits, 0
  %sgn = xor i1 %ys, %rsg
  %anynan = or i1 %ynan, %rnan
  %notnan = xor i1 %anynan, true
  %sgnbad = and i1 %sgn, %notnan
  %notfin = xor i1 %fin, true
  %notok = xor i1 %okspecial, true
  %b1 = and i1 %notfin, %notok
  %b2 = or i1 %b1, %infdiff
  %bad = or i1 %b2, %sgnbad
  %badi = zext i1 %bad to i64
  %nb1 = add i64 %nb, %badi
  %qf = select i1 %fin, double %q, double 0.0
  %gt = fcmp ogt double %qf, %mx
  %mx1 = select i1 %gt, double %qf, double %mx
  %at1 = select i1 %gt, i64 %i, i64 %at
  %i1 = add i64 %i, 1
  %done = icmp eq i64 %i1, %n
  br i1 %done, label %exit, label %loop
exit:
  store double %mx1, ptr %res
  %p1 = getelementptr double, ptr %res, i64 1
  %atf = sitofp i64 %at1 to double
  store double %atf, ptr %p1
  %p2 = getelementptr double, ptr %res, i64 2
  %nbf = sitofp i64 %nb1 to double
  store double %nbf, ptr %p2
  ret void
}
"""


def f32_max_ulp():
    """A JIT-compiled scan ``(y, ref, n) -> (max ulp error, its index, count of
    bad specials)`` over f32 results ``y`` and float64 references ``ref``: the
    error is :func:`ulp_error`'s; a special is bad when an infinity, a NaN or
    a sign differs from the correctly rounded reference's."""
    import ctypes

    from tilenest.backends.llvm import jit

    h = jit.host()
    tm = jit.target_machine(h)
    mod = jit.parse(_MAX_ULP_IR, h)
    mod = jit.optimize(mod, tm, 2)
    eng = jit.Engine.of_module(mod, tm)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                          ctypes.c_void_p)(eng.address("max_ulp"))
    res = np.zeros(3)

    def scan(y: np.ndarray, ref: np.ndarray) -> tuple[float, int, int]:
        fn(y.ctypes.data, ref.ctypes.data, y.size, res.ctypes.data)
        return float(res[0]), int(res[1]), int(res[2])
    scan.engine = eng  # keeps the code alive
    return scan


@pytest.mark.slow
@pytest.mark.parametrize("op", OPS)
def test_f32_exhaustive(op):
    """Every f32 input (2^32 bit patterns) against the C library's float64
    function (the f64 kernel of the same op), within the documented bound, and
    specials (infinities, NaN, signs) equal to the correctly rounded ones."""
    t0 = time.perf_counter()
    ck = compiled(op, "f32").compile()
    ref = compiled(op, "f64").compile()
    scan = f32_max_ulp()
    step = 1 << 20
    worst, at, bad = 0.0, None, 0
    y = np.empty((step // COLS, COLS), np.float32)
    r = np.empty((step // COLS, COLS), np.float64)
    for start in range(0, 1 << 32, step):
        x = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32)
        x = x.view(np.float32).reshape(-1, COLS)
        ck(x, y)
        with np.errstate(invalid="ignore"):  # signaling NaNs widen quietly
            ref(x.astype(np.float64), r)
        w, i, nb = scan(y, r)
        bad += nb
        if w > worst:
            worst, at = w, float(x.reshape(-1)[i])
    print(f"{op}: 2^32 f32 inputs, max error {worst:.4f} ulp at x = {at!r}, "
          f"{bad} bad specials, {time.perf_counter() - t0:.0f} s")
    assert worst <= BOUND[op] and bad == 0, (op, worst, at, bad)


def test_lane_wise_exp_is_the_scalar_exp_bit_for_bit():
    """``exp`` on f32 in a vector loop (``MathLib.exp_f32_vec``: a common path
    for steps whose every lane has ``2^k`` normal, the whole formula otherwise)
    gives the scalar function's bits: the same inputs in rows of 1024 (vector
    steps) and of 15 (scalar iterations only), over a grid of all binades,
    every ``k`` boundary of the reduction (where a step leaves the common
    path) and steps that mix common and rare lanes."""
    f = np.float32
    bits = np.arange(0, 1 << 32, 1021, dtype=np.uint64).astype(np.uint32).view(f)
    ln2 = np.log(2.0)
    ks = np.arange(-152, 131)
    centres = ((ks + 0.5) * ln2).astype(f)  # where the rounded k steps
    near = np.concatenate([(centres.view(np.uint32).astype(np.int64) + d).astype(np.uint32)
                           for d in range(-8, 9)]).view(f)
    mixed = np.tile(np.array([0.5, -87.4, 1.0, 88.5, np.nan, -2.0, np.inf, -np.inf], f), 64)
    x = np.concatenate([bits, near, specials(), mixed])
    x = x[: x.size - x.size % (COLS * 15)]
    vec = np.empty_like(x.reshape(-1, COLS))
    compiled("exp", "f32").compile()(x.reshape(-1, COLS), vec)
    sca = np.empty_like(x.reshape(-1, 15))
    compiled("exp", "f32").compile()(x.reshape(-1, 15), sca)
    a, b = vec.reshape(-1).view(np.uint32), sca.reshape(-1).view(np.uint32)
    differ = np.flatnonzero(a != b)
    assert differ.size == 0, [(float(x[i]), float(vec.reshape(-1)[i]), float(sca.reshape(-1)[i]))
                              for i in differ[:5]]
