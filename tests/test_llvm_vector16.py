"""f16, bf16 and FP8 values in explicit vector loops (``backends/llvm/vector``):
16-bit floats are loaded and stored as ``<W x half>`` / ``<W x i16>``,
widened exactly to f32 lanes for arithmetic and comparisons, rounded once
per result (the scalar rule), and cast to and from FP8 and each other
through f32 -- bit for bit what the interpreter computes (a NaN's sign and
payload are free, V-14)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tilenest as tn
from tilenest import bf16, f16, f32
from tilenest.backends.llvm import compile_program
from tilenest.backends.llvm import vector as V
from tilenest.lowering import default_schedule


@tn.kernel
def mix16(a: tn.Tensor[bf16, "R C"], b: tn.Tensor[f16, "R C"], s: tn.Tensor[f32, "R C"],
          y: tn.Tensor[bf16, "R C"], z: tn.Tensor[f16, "R C"],
          q: tn.Tensor[tn.f8e4m3fn, "R C"], w: tn.Tensor[tn.f64, "R C"], *, bc=40):
    rows, cols = a.shape
    b, s, y, z, q, w = (t.with_dims(*a.dims()) for t in (b, s, y, z, q, w))
    for p in tn.parallel(tn.shape(rows, tn.cdiv(cols, bc))):
        o = tn.coord(p.index(0), p.index(1) * bc)
        av = a[o, tn.shape(1, bc), tn.bounds.zero]
        bv = b[o, tn.shape(1, bc), tn.bounds.zero]
        sv = s[o, tn.shape(1, bc), tn.bounds.zero]
        t = av * tn.cast(sv, bf16) + tn.cast(bv, bf16)
        u = tn.maximum(bv / tn.cast(av, f16), bv - 1.5)
        y(o, tn.shape(1, bc)).store(tn.ite(t > av, t, av - t))
        z(o, tn.shape(1, bc)).store(u)
        q(o, tn.shape(1, bc)).store(tn.cast(t, tn.f8e4m3fn, "saturate"))
        back = tn.cast(q[o, tn.shape(1, bc), tn.bounds.zero], bf16)
        w(o, tn.shape(1, bc)).store(tn.cast(u, tn.f64) + tn.cast(back, tn.f64))


SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 65504.0, 65520.0, 3e38,
                     -1e-8, 448.0, 464.0, 1e5, 2.0 ** -24, 2.0 ** -25, 1.00390625], np.float32)


def _inputs(rng, R, C):
    a = (rng.standard_normal((R, C)) * 4).astype(ml_dtypes.bfloat16)
    b = (rng.standard_normal((R, C)) * 4).astype(np.float16)
    s = (rng.standard_normal((R, C)) * 100).astype(np.float32)
    k = min(C, len(SPECIALS))
    with np.errstate(over="ignore"):
        a[0, :k] = SPECIALS[:k].astype(ml_dtypes.bfloat16)
        b[0, :k] = SPECIALS[:k].astype(np.float16)
    s[0, :k] = SPECIALS[:k]
    s[-1, :k] = SPECIALS[::-1][:k]
    return a, b, s


def _same(got, want):
    """Bit for bit, except that NaN's sign and payload are free."""
    with np.errstate(invalid="ignore"):  # NaN codes widen with a warning
        g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan)
    u = {1: np.uint8, 2: np.uint16, 8: np.uint64}[got.itemsize]
    assert np.array_equal(got.view(u)[~nan], want.view(u)[~nan])


@pytest.mark.parametrize("bits", [256, 512])
def test_16_bit_floats_are_vector_code_and_the_interpreters_bits(bits):
    prog = mix16.program
    ck = compile_program(prog, default_schedule(prog, "llvm", vector_bits=bits), cache=False)
    w = bits // 32
    for form in (f"<{w} x i16>", f"fpext <{w} x half>", f"<{w} x half>", f"<{w} x i8>"):
        assert form in ck.llvm_ir, f"{form} not generated: the loops were not vector code"
    rng = np.random.default_rng(bits)
    for R, C in ((3, 50), (1, 7), (2, 40), (4, 0), (2, 81)):
        a, b, s = _inputs(rng, R, C)
        outs = [np.full((R, C), 7, ml_dtypes.bfloat16), np.full((R, C), 7, np.float16),
                np.zeros((R, C), ml_dtypes.float8_e4m3fn), np.zeros((R, C))]
        want = [o.copy() for o in outs]
        ck(a, b, s, *outs)
        tn.interpret(mix16, a, b, s, *want)
        for got, ref in zip(outs, want):
            _same(got, ref)


def test_without_16_bit_lanes_the_loops_are_not_vector_code(monkeypatch):
    """The check above fails when 16-bit floats are left to scalar code."""
    monkeypatch.setattr(V, "_lane_dtype", lambda dt: not (dt.is_float and dt.bits == 16))
    prog = mix16.program
    ck = compile_program(prog, default_schedule(prog, "llvm", vector_bits=512), cache=False)
    assert "<16 x i16>" not in ck.llvm_ir


@tn.kernel
def unary16(a: tn.Tensor[bf16, "N"], h: tn.Tensor[f16, "N"],  # noqa: F821
            ya: tn.Tensor[bf16, "K N"], yh: tn.Tensor[f16, "K N"], *, bc=512):  # noqa: F821
    (n,) = a.shape
    h = h.with_dims(*a.dims())
    k, c = ya.dims()
    ya, yh = ya.with_dims(k, a.dim(0)), yh.with_dims(k, a.dim(0))
    for p in tn.parallel(tn.shape(tn.cdiv(n, bc))):
        o = p.index() * bc
        av = a[tn.coord(o), tn.shape(bc), tn.bounds.zero]
        hv = h[tn.coord(o), tn.shape(bc), tn.bounds.zero]
        for row, f in enumerate((tn.neg, tn.abs, tn.sqrt, tn.floor, tn.ceil, tn.trunc,
                                 tn.round, tn.exp)):
            ya(tn.coord(row, o), tn.shape(1, bc)).store(tn.reshape(f(av), (1, bc)))
            yh(tn.coord(row, o), tn.shape(1, bc)).store(tn.reshape(f(hv), (1, bc)))


def _within_an_ulp(got, want):
    """``exp``'s contract (``numerics.ulp_bound``: 1 ulp): the same NaNs and
    infinities, and finite results at most one code apart, of the same sign."""
    with np.errstate(invalid="ignore"):
        g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(w))
    fin = np.isfinite(w)
    assert np.array_equal(g[~fin & ~np.isnan(w)], w[~fin & ~np.isnan(w)])
    gi, wi = got.view(np.uint16)[fin].astype(np.int32), want.view(np.uint16)[fin].astype(np.int32)
    assert np.all(np.abs(gi - wi) <= 1) and np.array_equal(gi >> 15, wi >> 15)


@pytest.mark.parametrize("bits", [256, 512])
def test_16_bit_unary_ops_on_every_code(bits, monkeypatch):
    """neg, abs, sqrt, floor, ceil, trunc, round and exp on every bf16 and f16
    bit pattern, as vector code: the exact ops bit for bit the interpreter's,
    ``exp`` (the faithful f32 function rounded once more) within its 1-ulp
    contract; and all of them bit for bit the scalar code's."""
    prog = unary16.program
    ck = compile_program(prog, default_schedule(prog, "llvm", vector_bits=bits), cache=False)
    w = bits // 32
    assert f'call <{w} x float> @"tn.exp.v{w}f32"' in ck.llvm_ir
    assert f"<{w} x half>" in ck.llvm_ir and f"xor <{w} x i16>" in ck.llvm_ir
    codes = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    a, h = codes.view(ml_dtypes.bfloat16), codes.view(np.float16)
    got = (np.zeros((8, a.size), ml_dtypes.bfloat16), np.zeros((8, a.size), np.float16))
    want = tuple(g.copy() for g in got)
    ck(a, h, *got)
    with np.errstate(all="ignore"):
        tn.interpret(unary16, a, h, *want)
    for g, r in zip(got, want):
        for row in range(7):
            _same(g[row], r[row])
        _within_an_ulp(g[7], r[7])
    # the scalar code of the same program (no vector loops) gives the same bits
    with monkeypatch.context() as m:
        m.setattr(V, "plan", lambda *x: None)
        scalar = compile_program(prog, default_schedule(prog, "llvm", vector_bits=bits),
                                 cache=False)
    assert f"<{w} x half>" not in scalar.llvm_ir
    once = tuple(np.zeros_like(g) for g in got)
    scalar(a, h, *once)
    for g, o in zip(got, once):
        with np.errstate(invalid="ignore"):
            nan = np.isnan(o.astype(np.float64))
        assert np.array_equal(g.view(np.uint16)[~nan], o.view(np.uint16)[~nan])


@tn.kernel
def reduce16(a: tn.Tensor[bf16, "R C"], h: tn.Tensor[f16, "R C"],
             sa: tn.Tensor[bf16, "R K"], sh: tn.Tensor[f16, "R K"]):  # noqa: F821
    rows, cols = a.shape
    r, c = a.dims()
    h = h.with_dims(r, c)
    for p in tn.parallel(tn.shape(rows)):
        o = tn.coord(p.index(), 0)
        for t, out in ((a[o, tn.shape(1, cols)], sa), (h[o, tn.shape(1, cols)], sh)):
            for j, f in enumerate((tn.maximum, tn.minimum, tn.add)):
                v = tn.reduce(t, c, f)
                out(tn.coord(p.index(), j), tn.shape(1, 1)).store(tn.reshape(v, (1, 1)))


@pytest.mark.parametrize("bits", [256, 512])
def test_16_bit_accumulators(bits):
    """Row maximum, minimum and sum of bf16 and f16 values in vector
    accumulators of their dtype (LLVM's loop vectorizer runs such rounded
    steps one after another): the extremes bit for bit the interpreter's
    (signed zeros, infinities, NaN), the sums within the regrouping the
    contract admits (``tn.validate``)."""
    prog = reduce16.program
    ck = compile_program(prog, default_schedule(prog, "llvm", vector_bits=bits), cache=False)
    w = bits // 32
    assert f"alloca <{w} x i16>" in ck.llvm_ir and f"alloca <{w} x half>" in ck.llvm_ir
    rng = np.random.default_rng(bits)
    cols = 37
    rows = [np.full(cols, -0.0), np.full(cols, 0.0), np.where(np.arange(cols) == 20, 0.0, -0.0),
            np.where(np.arange(cols) == 3, np.nan, 1.0), np.where(np.arange(cols) % 2, np.inf, 2.0),
            np.where(np.arange(cols) == 36, -np.inf, -3.0), rng.standard_normal(cols) * 100]
    x = np.array(rows, np.float32)
    a, h = x.astype(ml_dtypes.bfloat16), x.astype(np.float16)
    got = (np.zeros((len(rows), 3), ml_dtypes.bfloat16), np.zeros((len(rows), 3), np.float16))
    want = tuple(g.copy() for g in got)
    ck(a, h, *got)
    tn.interpret(reduce16, a, h, *want)
    for g, r in zip(got, want):
        _same(g[:, :2], r[:, :2])
    report = tn.validate(reduce16, "llvm", inputs=[a, h, *got])
    assert report.ok, report
