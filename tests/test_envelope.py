"""The oracle's admitted sets against the numerics they are derived from.

Two families: functions with a declared ulp bound (spec V-14: every op and
float dtype, binary functions and f64 included), and tree reductions (spec
R-8), whose envelope is checked against *every* value any tree can produce,
found by exhaustive enumeration of all bracketings (``ordered_tree``) and all
bracketings of all permutations (``unordered_tree``) of small inputs with
subnormals, zeros of both signs, infinities and NaN.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

import tilenest as tn
from tilenest.interpreter import shadow as S
from tilenest.interpreter.oracle import Admitted
from tilenest.semantics import dtypes as D
from tilenest.semantics import numerics as N

FLOATS = (D.f32, D.f16, D.bf16, D.f64)
NARROW = (D.f32, D.f16, D.bf16)
UNARY_FNS = ("exp", "exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tanh", "erf",
             "sigmoid", "rsqrt")


def _f64(a):
    a = np.asarray(a)
    return (a.astype(np.float32) if a.dtype.itemsize == 2 else a).astype(np.float64)


def _step(a, k):
    """``a`` moved ``k`` representable values up (k > 0) or down, in its dtype."""
    a = np.asarray(a)
    for _ in range(abs(k)):
        a = S._next(a, k > 0)
    return a


def _kernel1(dt, fn):
    @tn.kernel
    def k1(a: tn.Tensor[dt, 1], y: tn.Tensor[dt, 1]):
        (n,) = a.shape
        y = y.with_dims(a.dim(0))
        y(tn.coord(0), tn.shape(n)).store(fn(a[tn.coord(0), tn.shape(n)]))
    return k1


def _kernel2(dt, fn):
    @tn.kernel
    def k2(a: tn.Tensor[dt, 1], b: tn.Tensor[dt, 1], y: tn.Tensor[dt, 1]):
        (n,) = a.shape
        b, y = b.with_dims(a.dim(0)), y.with_dims(a.dim(0))
        y(tn.coord(0), tn.shape(n)).store(fn(a[tn.coord(0), tn.shape(n)],
                                             b[tn.coord(0), tn.shape(n)]))
    return k2


# ---------------------------------------------------------------------------
# declared ulp bounds

def _generic_operands(fn, dt, rng, n=64):
    """Operands whose results are finite, nonzero and not within 6 ulp of a binade
    edge (there ``k`` steps down are only ``k/2`` ulp of the result's binade)."""
    a = rng.uniform(0.2, 3.0, n)
    b = rng.uniform(-3.0, 3.0, n)
    with np.errstate(all="ignore"):
        a, b = a.astype(dt.np), b.astype(dt.np)
    if fn in ("pow", "atan2"):
        y = N.unrounded(fn, dt, a, b)
    else:
        y = N.unrounded(fn, dt, a)
    m, _ = np.frexp(np.abs(y))
    keep = np.isfinite(y) & (y != 0) & (m > 0.5 + 8 * 2.0 ** -S.FORMAT[dt.name][0]) \
        & (m < 1.0 - 8 * 2.0 ** -S.FORMAT[dt.name][0])
    return a[keep], b[keep]


@pytest.mark.parametrize("fn", ("pow", "atan2"))
def test_f64_binary_transcendental_admits_its_declared_ulp_and_no_more(fn):
    # glibc's pow is 1 ulp from numpy's on some inputs; the contract is 4 ulp_f64
    k = _kernel2(D.f64, getattr(tn, fn))
    a, b = _generic_operands(fn, D.f64, np.random.default_rng(1))
    assert a.size > 20
    adm = tn.reference(k, a, b, np.zeros(a.size))
    bound = int(N.ulp_bound(fn, D.f64))
    assert bound == 4
    for j in range(1, bound + 1):
        assert adm.admits(_step(adm.value, j)), j
        assert adm.admits(_step(adm.value, -j)), -j
    for j in (bound + 1, bound + 3):
        assert not adm.admits(_step(adm.value, j))
        assert not adm.admits(_step(adm.value, -j))


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("fn", UNARY_FNS + ("pow", "atan2"))
def test_admitted_set_is_the_ulp_ball_around_the_unrounded_value(fn, dt):
    """For every transcendental and float dtype: a value of the dtype is admitted
    iff it lies within ``k ulp_dt(y)`` of the unrounded f64 value ``y``."""
    rng = np.random.default_rng(len(fn) * 7 + dt.bits)
    a, b = _generic_operands(fn, dt, rng)
    two = fn in ("pow", "atan2")
    k = (_kernel2 if two else _kernel1)(dt, getattr(tn, fn))
    args = (a, b) if two else (a,)
    adm = tn.reference(k, *args, np.zeros(a.size, dt.np))
    y = N.unrounded(fn, dt, *args)
    bound = N.ulp_bound(fn, dt)
    assert bound > 0 and adm.lo is not None
    ulp = S.ulp(y, dt)
    seen_in = seen_out = 0
    for j in range(-(int(bound) + 2), int(bound) + 3):
        cand = _step(adm.value, j)
        inside = np.abs(_f64(cand) - y) <= bound * ulp
        for i in range(a.size):
            one = adm.value.copy()
            one[i] = cand[i]
            assert bool(adm.admits(one)) == bool(inside[i]), (fn, dt, i, j)
        seen_in += int(inside.sum())
        seen_out += int((~inside).sum())
    assert seen_in and seen_out


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_special_results_of_a_transcendental_are_bitwise(dt):
    """NaN, infinities and zeros must match exactly (spec V-14)."""
    k = _kernel2(dt, tn.pow)
    a = np.array([-1.0, 0.0, 0.0, 2.0, 1.5], np.float64).astype(dt.np)
    b = np.array([0.5, 3.0, -1.0, 1.0e6, 2.0], np.float64).astype(dt.np)
    adm = tn.reference(k, a, b, np.zeros(5, dt.np))
    assert np.isnan(_f64(adm.value[0])) and adm.value[1] == 0 and np.isinf(_f64(adm.value[2]))
    assert adm.exact_mask[1:4].all()
    neg_zero = adm.value.copy()
    neg_zero[1] = -neg_zero[1]
    assert not adm.admits(neg_zero)
    big = adm.value.copy()
    big[3] = _step(big[3], -1)  # the greatest finite instead of infinity
    assert not adm.admits(big)
    assert adm.admits(_step(adm.value, 0))


def test_inexact_operands_of_pow_and_atan2_are_bounded_not_free():
    """An enveloped operand (a tree sum) makes pow/atan2 an interval, not 'anything'."""
    f32 = tn.f32

    @tn.kernel
    def k(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
        rows, cols = x.shape
        y, z = y.with_dims(x.dim(0)), z.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(rows)):
            row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
            s = tn.reduce(row, row.dim(1), tn.add)
            y(tn.coord(p.index()), tn.shape(1)).store(tn.pow(s, s * 0.0 + 1.5))
            z(tn.coord(p.index()), tn.shape(1)).store(tn.atan2(s - 40.0, s * 0.0 - 1.0))

    rng = np.random.default_rng(3)
    x = rng.uniform(0.1, 1.0, (6, 97)).astype(np.float32)
    ay, az = tn.reference(k, x, np.zeros(6, np.float32), np.zeros(6, np.float32))
    assert not ay.exact_mask.any() and not np.isnan(ay.lo).any()
    rev = np.array([np.float32(sum(np.float32(v) for v in r[::-1])) for r in x], np.float32)
    r64 = rev.astype(np.float64)
    assert ay.admits(np.power(r64, 1.5).astype(np.float32))
    assert az.admits(np.arctan2(r64 - 40.0, -1.0).astype(np.float32))
    assert not ay.admits((ay.value * np.float32(1.001)).astype(np.float32))
    assert not az.admits(-az.value)
    # the box crosses the branch cut of atan2: every angle, but still bounded
    assert (az.hi <= np.float32(np.pi) * (1 + 2**-20)).all()


def _perturbed(k, max_steps, rng):
    """The compiled kernel, its results then moved by up to ``max_steps`` ulp (as a
    libm with that accuracy could return): finite nonzero results only."""
    ck = k.compile(target="llvm")

    def run(*args, params=None):
        ck(*args, params=params)
        y = args[-1]
        j = rng.integers(-max_steps, max_steps + 1, y.shape)
        if max_steps > 4:
            j = np.where(j >= 0, max_steps, -max_steps)
        fin = np.isfinite(y) & (y != 0)
        out = y.copy()
        for s in range(1, max_steps + 1):
            out = np.where(fin & (j >= s), np.nextafter(out, np.inf), out)
            out = np.where(fin & (j <= -s), np.nextafter(out, -np.inf), out)
        m, _ = np.frexp(np.abs(y))
        edge = np.abs(m - 0.5) < 2.0 ** -40  # stepping down a binade edge halves the ulp
        y[...] = np.where(edge, y, out)
    return run


@pytest.mark.parametrize("fn", ("pow", "atan2"))
@pytest.mark.parametrize("seed", (0, 1, 2))
def test_validate_f64_pow_atan2_on_llvm(fn, seed):
    k = _kernel2(D.f64, getattr(tn, fn))
    rep = tn.validate(k, seed=seed)
    assert rep.ok, rep.summary()
    rng = np.random.default_rng(seed)
    a = np.concatenate([rng.uniform(0, 4, 200), [0.0, -0.0, np.inf, -np.inf, np.nan, -2.0]])
    b = np.concatenate([rng.standard_normal(200) * 9, [2.0, -3.0, 0.5, -1.0, 1.0, 0.5]])
    case = [a, b, np.zeros(a.size)]
    assert tn.validate(k, inputs=case).ok
    # an implementation within the contract is admitted; one 5 ulp off is not
    assert tn.validate(k, inputs=case, compiled=_perturbed(k, 4, rng)).ok
    assert not tn.validate(k, inputs=case, compiled=_perturbed(k, 5, rng)).ok


# ---------------------------------------------------------------------------
# tree reductions: the envelope against every tree

OPS = {"add": "add", "mul": "mul", "max": "maximum", "min": "minimum"}


def _unique(a):
    a = np.asarray(a)
    bits = a.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])
    _, i = np.unique(bits, return_index=True)
    return a[i]


def reachable(contract, dt, xs, ordered):
    """Every value of every binary tree over ``xs``: over contiguous ranges (all
    bracketings of the given order) or over subsets (all bracketings of all
    permutations), each operation the IEEE one of ``numerics``."""
    op, n = OPS[contract], len(xs)

    def join(a, b):
        return _unique(N.binary(op, a[:, None], b[None, :], dt).reshape(-1))

    if ordered:
        v = {(i, i + 1): xs[i:i + 1] for i in range(n)}
        for width in range(2, n + 1):
            for i in range(n - width + 1):
                j = i + width
                v[(i, j)] = _unique(np.concatenate(
                    [join(v[(i, m)], v[(m, j)]) for m in range(i + 1, j)]))
        return v[(0, n)]
    v = {1 << i: xs[i:i + 1] for i in range(n)}
    for mask in range(1, 1 << n):
        if mask & (mask - 1) == 0:
            continue
        parts, sub = [], (mask - 1) & mask
        while sub:
            if sub < mask ^ sub:  # each split once: the operations commute bitwise
                parts.append(join(v[sub], v[mask ^ sub]))
            sub = (sub - 1) & mask
        v[mask] = _unique(np.concatenate(parts))
    return v[(1 << n) - 1]


def envelope(contract, dt, xs):
    """The oracle's admitted set for a tree reduction over the exact leaves ``xs``
    (first leaf the seed), canonical value the left fold."""
    f = _f64(xs)[:, None]
    lo, hi, nan, pt = S.tree_envelope(contract, dt, f, f, np.isnan(f), np.ones(f.shape, bool), f)
    canon = xs[:1]
    for x in xs[1:]:
        canon = N.binary(OPS[contract], canon, x.reshape(1), dt)
    shadow = [np.where(pt, c, b) for c, b in zip(S.point_of(canon), (lo, hi, nan))]
    return Admitted("s", dt, canon, *shadow[:2], True, shadow[2]), bool(pt[0])


def leaves(dt, rng, n):
    """Seeded leaves mixing every hard case: subnormals, values near the least normal
    and near overflow, zeros of both signs, infinities, NaN, ordinary values."""
    p, emin, emax = S.FORMAT[dt.name]
    tiny = 2.0 ** (emin - p + 1)
    out = []
    for kind in rng.integers(0, 10, n):
        sign = -1.0 if rng.random() < 0.4 else 1.0
        if kind == 0:
            v = float(rng.integers(1, 8)) * tiny
        elif kind == 1:
            v = S.max_finite(dt) * rng.uniform(0.3, 1.0)
        elif kind == 2:
            v = np.inf if rng.random() < 0.85 else np.nan
        elif kind == 3:
            v = 0.0
        elif kind == 4:
            v = 2.0 ** float(rng.integers(emin - p, emin + 3)) * rng.uniform(1, 2)
        elif kind == 5:
            v = 2.0 ** float(rng.integers(emax - 3, emax + 1)) * rng.uniform(1, 2)
        else:
            v = rng.uniform(0.5, 8.0)
        out.append(sign * v)
    with np.errstate(all="ignore"):
        return np.asarray(out, np.float64).astype(np.float32).astype(dt.np)


def _check_against_every_tree(contract, dt, xs, stats):
    adm, point = envelope(contract, dt, xs)
    unbounded = bool(adm.unbounded_mask[0])
    # R-6 admits identity leaves inserted anywhere: they change no value
    ident = N.constant({"add": -0.0, "mul": 1, "max": -np.inf, "min": np.inf}[contract], dt)
    padded = np.concatenate([xs, np.asarray(ident).reshape(1)])
    for v in reachable(contract, dt, padded, False):
        assert adm.admits(np.asarray([v], dt.np)), (contract, str(dt), padded.tolist(), v)
    for ordered in (False, True):
        vals = reachable(contract, dt, xs, ordered)
        for v in vals:
            got = adm.admits(np.asarray([v], dt.np))
            assert got, (contract, str(dt), xs.tolist(), ordered, v, got.reason)
        if point:  # claimed the same in every tree: must be, bit for bit (NaN as a class)
            vb = _f64(vals)
            c = _f64(adm.value)[0]
            assert (np.isnan(vb).all() if np.isnan(c) else
                    (vals.size == 1 and vals[0].tobytes() == adm.value[0].tobytes())), \
                (contract, str(dt), xs.tolist(), vals)
    if not unbounded and not point:
        lo, hi = float(adm.lo[0]), float(adm.hi[0])
        # not vacuous: the first values beyond each bound are rejected
        for beyond, ok in ((hi, np.isfinite(hi)), (lo, np.isfinite(lo))):
            if ok:
                b = np.asarray([beyond], np.float64).astype(np.float32).astype(dt.np)
                b = S._next(b, beyond == hi)
                assert not adm.admits(b), (xs.tolist(), beyond)
    stats["cases"] += 1
    stats["unbounded"] += unbounded
    fin = np.isfinite(_f64(xs))
    if fin.all() and (np.abs(_f64(xs)) <= S.max_finite(dt) / 2.0 ** (len(xs) + 1)).all() \
            and contract == "add":
        assert not unbounded and np.isfinite(adm.lo[0]) and np.isfinite(adm.hi[0])


def _campaign(cases, max_n, seed):
    rng = np.random.default_rng(seed)
    stats = {"cases": 0, "unbounded": 0}
    for t in range(cases):
        dt = NARROW[t % 3]
        contract = tuple(OPS)[(t // 3) % 4]
        xs = leaves(dt, rng, int(rng.integers(1, max_n + 1)))
        _check_against_every_tree(contract, dt, xs, stats)
    assert stats["cases"] == cases
    assert stats["unbounded"] < cases / 4, stats  # most envelopes are real intervals
    return stats


def test_envelope_contains_every_tree_on_small_inputs():
    _campaign(cases=600, max_n=6, seed=2026)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_envelope_contains_every_tree_on_small_inputs_slow(seed):
    _campaign(cases=6000, max_n=7, seed=seed)


@pytest.mark.parametrize("dt", NARROW, ids=str)
@pytest.mark.parametrize("contract", ("add", "mul"))
def test_envelope_on_ordinary_inputs_is_a_tight_interval(dt, contract):
    """Without overflow, underflow or specials the envelope is finite and within a
    few times gamma_k of the exact result: rigorous, and not vacuous."""
    rng = np.random.default_rng(11)
    for _ in range(40):
        n = int(rng.integers(2, 7))
        xs = (rng.uniform(0.5, 2.0, n) * rng.choice([-1.0, 1.0], n)).astype(np.float32)
        xs = xs.astype(dt.np)
        adm, point = envelope(contract, dt, xs)
        f = _f64(xs)
        exact = f.sum() if contract == "add" else np.prod(f)
        scale = np.abs(f).sum() if contract == "add" else abs(exact)
        lo, hi = float(adm.lo[0]), float(adm.hi[0])
        assert not point and np.isfinite(lo) and np.isfinite(hi)
        assert lo <= exact <= hi
        # 2 gamma_k of the scale, plus one outward rounding step at each end
        g = float(S.gamma(n - 1, dt))
        assert hi - lo <= 2 * g * scale * (1 + 1e-9) + 2 * S.ulp(max(-lo, hi), dt)
        for ordered in (False, True):
            for v in reachable(contract, dt, xs, ordered):
                assert adm.admits(np.asarray([v], dt.np))


def test_underflowing_product_from_the_issue():
    """2**-149 * 0.75 rounds up to 2**-149 in f32: later factors scale that absolute
    error, so the envelope needs its absolute term (spec R-8)."""
    f32 = tn.f32

    @tn.kernel
    def product(x: tn.Tensor[f32, 1], out: tn.Tensor[f32, 1]):
        (n,) = x.shape
        p = tn.full(f32, tn.shape(1), 1.0, dims=x.dims())
        for r in tn.reduce(tn.shape(n), contract=tn.mul):
            p = p * x[tn.coord(r.index()), tn.shape(1)]
        out(tn.coord(0), tn.shape(1)).store(p)

    x = np.array([1.5, 7.2, 7.2, .75, 2**-149, .75, 1.125, .75], np.float32)
    adm = tn.reference(product, x, np.zeros(1, np.float32))
    pairwise = x.copy()
    while pairwise.size > 1:
        pairwise = pairwise[0::2] * pairwise[1::2]
    assert float(pairwise[0]) == pytest.approx(8.1e-44, rel=0.02)
    assert adm.admits(pairwise)
    everything = reachable("mul", D.f32, np.concatenate([[np.float32(1)], x]), False)
    assert everything.size > 3
    for v in everything:
        assert adm.admits(np.asarray([v], np.float32)), v
    assert not adm.admits(np.array([1e-42], np.float32))
    assert not adm.admits(np.array([-1e-45], np.float32))


def _row_kernel(dt, op):
    @tn.kernel
    def rows(x: tn.Tensor[dt, 2], y: tn.Tensor[dt, 1]):
        r, c = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(r)):
            row = x[tn.coord(p.index(), 0), tn.shape(1, c)]
            y(tn.coord(p.index()), tn.shape(1)).store(tn.reduce(row, row.dim(1), op))
    return rows


@pytest.mark.parametrize("dt", NARROW, ids=str)
@pytest.mark.parametrize("contract", tuple(OPS))
def test_reference_of_a_reduce_admits_every_tree(contract, dt):
    """End to end: tn.reference of a row reduction (seed = the identity, leaves =
    the row) admits every value every tree of each row can produce."""
    rng = np.random.default_rng(zlib.crc32(f"{contract} {dt.name}".encode()))
    n, rows = 5, 40
    x = np.stack([leaves(dt, rng, n) for _ in range(rows)])
    k = _row_kernel(dt, getattr(tn, {"add": "add", "mul": "mul", "max": "maximum",
                                     "min": "minimum"}[contract]))
    adm = tn.reference(k, x, np.zeros(rows, dt.np))
    ident = N.constant({"add": -0.0, "mul": 1, "max": -np.inf, "min": np.inf}[contract], dt)
    for i in range(rows):
        xs = np.concatenate([np.asarray(ident).reshape(1), x[i]])
        for ordered in (False, True):
            for v in reachable(contract, dt, xs, ordered):
                cand = adm.value.copy()
                cand[i] = v
                got = adm.admits(cand)
                assert got, (x[i].tolist(), ordered, v, got.reason)


def _mma_kernel(tin, tacc):
    @tn.kernel
    def mm(a: tn.Tensor[tin, 2], b: tn.Tensor[tin, 2], c: tn.Tensor[tacc, 2]):
        m, k = a.dims()
        rows, depth = a.shape
        b = b.with_dims(k, c.dim(1))
        c = c.with_dims(m, c.dim(1))
        acc = c[tn.coord(0, 0), tn.shape(rows, 1)]
        prod = tn.mma(a[tn.coord(0, 0), tn.shape(rows, depth)],
                      b[tn.coord(0, 0), tn.shape(depth, 1)], acc)
        c(tn.coord(0, 0), tn.shape(rows, 1)).store(prod)
    return mm


@pytest.mark.parametrize("tin,tacc", [(D.f32, D.f32), (D.f16, D.f32), (D.bf16, D.bf16),
                                      (D.f16, D.f16)], ids=str)
def test_reassociating_mma_admits_every_summation_order(tin, tacc):
    """``mma`` with reassociation: every order of summing the seed and the rounded
    products (unfused; the fused forms are covered by the same derivation, R-8)
    is admitted, with subnormal, overflowing, infinite and NaN terms."""
    rng = np.random.default_rng(zlib.crc32(f"mma {tin.name} {tacc.name}".encode()))
    k = _mma_kernel(tin, tacc)
    rows, depth = 24, 4
    checked = 0
    for _ in range(3):
        a = np.stack([leaves(tin, rng, depth) for _ in range(rows)])
        b = leaves(tin, rng, depth).reshape(depth, 1)
        c = leaves(tacc, rng, rows).reshape(rows, 1)
        adm = tn.reference(k, a, b, c)
        ca, cb = N.cast(a, tin, tacc), N.cast(b, tin, tacc)
        for i in range(rows):
            terms = np.concatenate([c[i], N.binary("mul", ca[i], cb[:, 0], tacc)])
            for v in reachable("add", tacc, terms, False):
                cand = adm.value.copy()
                cand[i, 0] = v
                got = adm.admits(cand)
                assert got, (a[i].tolist(), b[:, 0].tolist(), c[i].tolist(), v, got.reason)
                checked += 1
    assert checked > rows
    # partial sums overflowing both ways: some order meets inf + -inf
    big = S.max_finite(tacc) * 0.75
    if S.max_finite(tin) >= big:  # (f16 products cannot overflow f32)
        a = np.array([[big, big, -big, -big]]).astype(np.float32).astype(tin.np)
        terms = np.concatenate([[np.asarray(0.0, tacc.np)],
                                N.binary("mul", N.cast(a[0], tin, tacc),
                                         N.constant(1.0, tacc).reshape(1), tacc)])
        every = reachable("add", tacc, terms, False)
        assert np.isnan(_f64(every)).any() and np.isinf(_f64(every)).any()
        adm = tn.reference(k, a, np.ones((depth, 1), tin.np), np.zeros((1, 1), tacc.np))
        for v in every:
            assert adm.admits(np.asarray(v, tacc.np).reshape(1, 1)), v
    # not vacuous: on ordinary values the result is an interval, and far values fail
    a = rng.uniform(0.5, 2.0, (rows, depth)).astype(tin.np)
    b = rng.uniform(0.5, 2.0, (depth, 1)).astype(tin.np)
    adm = tn.reference(k, a, b, np.zeros((rows, 1), tacc.np))
    assert np.isfinite(adm.lo).all() and np.isfinite(adm.hi).all()
    assert not adm.admits((adm.value.astype(np.float32) * 1.1).astype(tacc.np))
