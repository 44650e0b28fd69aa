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
