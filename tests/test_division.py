"""Division by a divisor shared along a loop (spec/lowering.md L-6 and
*Vector loops*): the CUDA target emits ``tn_fdiv_by(a, tn_fdiv_prep(b))`` and
the LLVM target's vector loops call ``tn.fdiv_by.v<W>f32`` with the divisor
prepared before the loop (the reciprocal of ``b`` computed once, each
quotient corrected by two fmas). Either must be the IEEE quotient for every
pair of operands -- checked bit for bit on the emulated device and on the
host at both vector widths, with divisors at the edges of the fast form's
exponent range and dividends at the edges of the range it admits for each
divisor, and beyond."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.backends import llvm
from tilenest.lowering import default_schedule

#: where the shared-divisor form runs, and the mark of it in the code:
#: the emulated CUDA device, and LLVM's vector loops of 8 and 16 f32 lanes
TARGETS = ("cuda", "llvm-256", "llvm-512")


def _compile(kernel, target: str):  # type: ignore[no-untyped-def]
    """``(compiled kernel, its code)`` for one of :data:`TARGETS`."""
    if target == "cuda":
        ck = cuda.compile_program(kernel.program, device="emulated")
        return ck, ck.source.text
    bits = int(target.split("-")[1])
    ck = llvm.compile_program(kernel.program,
                              default_schedule(kernel.program).with_(vector_bits=bits))
    return ck, ck.llvm_ir


def _uses(code: str, target: str) -> int:
    """How many shared-divisor divisions the code makes."""
    if target == "cuda":
        return code.count("tn_fdiv_by(")
    lanes = int(target.split("-")[1]) // 32
    return code.count(f"call <{lanes} x float> @\"tn.fdiv_by.v{lanes}f32\"")


@tn.kernel
def rowdiv(x: tn.Tensor[tn.f32, "R C"], d: tn.Tensor[tn.f32, "R C"],
           y: tn.Tensor[tn.f32, "R C"]):
    rows, cols = x.shape
    r, c = x.dims()
    d = d.with_dims(r, c)
    y = y.with_dims(r, c)
    for p in tn.parallel(tn.shape(rows)):
        o = tn.coord(p.index(), 0)
        s = tn.reduce(d[o, tn.shape(1, cols)], c, tn.maximum)  # the row's divisor, exactly
        y(o, tn.shape(1, cols)).store(x[o, tn.shape(1, cols)] / s)


@tn.kernel
def elemdiv(x: tn.Tensor[tn.f32, "N"], z: tn.Tensor[tn.f32, "N"], y: tn.Tensor[tn.f32, "N"]):
    (n,) = x.shape
    (i,) = x.dims()
    z = z.with_dims(i)
    y = y.with_dims(i)
    for p in tn.parallel(tn.shape(1)):
        y(tn.coord(0), tn.shape(n)).store(x[tn.coord(0), tn.shape(n)] / z[tn.coord(0), tn.shape(n)])


F = np.float32
TINY = np.finfo(F).tiny


def _p2(e: int) -> np.float32:
    return F(np.ldexp(1.0, e)) if e < 128 else F(np.inf)


def _cases() -> tuple[np.ndarray, np.ndarray]:
    """(dividends, divisor of each row): per divisor, the dividends at the
    bounds of the fast form's range (``tn_fdiv_prep``) and beside them, the
    special values and random ones of every magnitude."""
    rng = np.random.default_rng(11)
    divisors = [1.0, 1.5, 3.0, -7.25, 0.1, 1e30, -1e-30, 2.0**-126, 1.7 * 2.0**125,
                2.0**126, -(2.0**126), 3.4e38, 2.0**-127, 1e-45, 0.0, -0.0, np.inf, -np.inf,
                np.nan, 2.0**-100 * 1.3, 2.0**100 * 1.9]
    cols = 96
    xs, ds = [], []
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, TINY, -TINY, 3.4e38,
               -3.4e38, 1.0, -1.0, 2.0**-79, np.nextafter(F(2.0**-79), F(0))]
    for b in np.array(divisors, F):
        e = int(np.frexp(b)[1]) - 1 if np.isfinite(b) and b != 0 else 0
        lo, hi = max(-79, e - 125), min(128, e + 127)
        edges = []
        for q in (_p2(lo), _p2(hi)):
            if np.isfinite(q):
                edges += [q, np.nextafter(q, F(0)), np.nextafter(q, F(np.inf))]
        edges += [-v for v in edges]
        row = np.array(special + edges, F)
        mags = np.ldexp(rng.uniform(1, 2, cols), rng.integers(-149, 128, cols))
        rand = (mags * rng.choice([-1.0, 1.0], cols)).astype(F)
        row = np.concatenate([row, rand])[:cols]
        xs.append(row)
        ds.append(b)
    # small divisors and normal dividends below 2^-79: the remainder of the
    # fast form would be subnormal and inexact there (wrong quotients when
    # the range's lower bound is ignored), so these take the plain division
    for b in (1.2 * 2.0**-121, 1.5 * 2.0**-110, 1.9 * 2.0**-126, 1.1 * 2.0**-90):
        mags = np.ldexp(rng.uniform(1, 2, cols), rng.integers(-126, -79, cols))
        xs.append((mags * rng.choice([-1.0, 1.0], cols)).astype(F))
        ds.append(b)
    return np.array(xs, F), np.array(ds, F)


@pytest.mark.parametrize("target", TARGETS)
def test_shared_divisor_is_ieee_division_bit_for_bit(target):
    x, b = _cases()
    d = np.repeat(b[:, None], x.shape[1], axis=1)
    y = np.full_like(x, 7.0)
    ck, code = _compile(rowdiv, target)
    assert _uses(code, target)  # the row's divisor is shared by its columns
    ck(x, d, y)
    with np.errstate(all="ignore"):
        want = x / b[:, None]
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(y), nan)
    same = y.view(np.uint32)[~nan] == want.view(np.uint32)[~nan]
    bad = np.argwhere(~nan)[~same][:5]
    assert same.all(), [(x[i, j], b[i], y[i, j], want[i, j]) for i, j in bad]


@tn.kernel
def rowdiv16(x: tn.Tensor[tn.bf16, "R C"], d: tn.Tensor[tn.bf16, "R C"],
             y: tn.Tensor[tn.bf16, "R C"], h: tn.Tensor[tn.f16, "R C"],
             g: tn.Tensor[tn.f16, "R C"]):
    rows, cols = x.shape
    r, c = x.dims()
    d, y, h, g = (a.with_dims(r, c) for a in (d, y, h, g))
    for p in tn.parallel(tn.shape(rows)):
        o = tn.coord(p.index(), 0)
        s = tn.reduce(d[o, tn.shape(1, cols)], c, tn.maximum)
        y(o, tn.shape(1, cols)).store(x[o, tn.shape(1, cols)] / s)
        t = tn.reduce(h[o, tn.shape(1, cols)], c, tn.maximum)
        g(o, tn.shape(1, cols)).store(tn.cast(x[o, tn.shape(1, cols)], tn.f16) / t)


@pytest.mark.parametrize("target", TARGETS)
def test_shared_divisor_of_16_bit_floats(target):
    """bf16 and f16 divide in float and round once (L-6): the quotient of the
    widened operands, rounded to the dtype, bit for bit."""
    x32, b32 = _cases()
    x32 = np.nan_to_num(x32, nan=1.0)[:, :64]
    bf = tn.bf16.np
    x = x32.astype(bf)
    b = b32.astype(bf)
    with np.errstate(over="ignore"):  # the largest divisors are infinite in f16
        hb = b32.astype(np.float16)
    d = np.repeat(b[:, None], x.shape[1], axis=1)
    h = np.repeat(hb[:, None], x.shape[1], axis=1)
    y = np.zeros_like(x)
    g = np.zeros(x.shape, np.float16)
    ck, code = _compile(rowdiv16, target)
    # both quotients use the prepared divisor (LLVM: in its 16-bit vector loops)
    assert _uses(code, target) >= 2
    ck(x, d, y, h, g)
    with np.errstate(all="ignore"):
        want_b = (x.astype(F) / b.astype(F)[:, None]).astype(bf)
        want_h = (x.astype(F).astype(np.float16).astype(F) / hb.astype(F)[:, None]).astype(
            np.float16)
    for got, want in ((y, want_b), (g, want_h)):
        nan = np.isnan(want.astype(F))
        assert np.array_equal(np.isnan(got.astype(F)), nan)
        assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


@pytest.mark.parametrize("target", TARGETS)
def test_divisor_of_each_element_keeps_plain_division(target):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(200).astype(F)
    z = rng.standard_normal(200).astype(F)
    y = np.zeros_like(x)
    ck, code = _compile(elemdiv, target)
    assert not _uses(code, target)  # no reciprocal to share
    ck(x, z, y)
    assert np.array_equal(y, x / z)
