"""The admitted set of an element tells "NaN alone", "a range (with or without
NaN)" and "every value" apart: an element whose only admitted value is NaN (or
one infinity, or one exact value) admits nothing else, also inside a tile whose
other elements carry envelopes (tree reductions, ulp-bounded functions, mma)."""

from __future__ import annotations

import numpy as np
import pytest

import gemm as gemm_example
import tilenest as tn
from tilenest import f32, f64
from tilenest.interpreter import shadow as S

F32_MAX = np.finfo(np.float32).max
QNAN_NEG = np.array([0xFFC00001], np.uint32).view(np.float32)[0]  # a NaN of another sign/payload


@tn.kernel
def row_sum(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R"]):
    rows, cols = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        y(tn.coord(p.index()), tn.shape(1)).store(tn.reduce(row, row.dim(1), tn.add))


@tn.kernel
def row_sum_then(x: tn.Tensor[f32, "R C"], a: tn.Tensor[f32, "R"], b: tn.Tensor[f32, "R"],
                 c: tn.Tensor[f32, "R"]):
    rows, cols = x.shape
    a, b, c = (t.with_dims(x.dim(0)) for t in (a, b, c))
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        s = tn.reduce(row, row.dim(1), tn.add)
        a(tn.coord(p.index()), tn.shape(1)).store(s + 1.0)
        b(tn.coord(p.index()), tn.shape(1)).store(tn.maximum(s, 0.0))
        c(tn.coord(p.index()), tn.shape(1)).store(tn.cast(s > 0.0, f32))


@tn.kernel
def log32(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    y = y.with_dims(x.dim(0))
    y(tn.coord(0), tn.shape(n)).store(tn.log(x[tn.coord(0), tn.shape(n)]))


@tn.kernel
def log_plus_one(x: tn.Tensor[f64, 1], y: tn.Tensor[f64, 1]):
    (n,) = x.shape
    y = y.with_dims(x.dim(0))
    y(tn.coord(0), tn.shape(n)).store(tn.log(x[tn.coord(0), tn.shape(n)]) + 1.0)


def _rows():
    """Row 0 holds a NaN, row 1 both infinities, row 2 +inf, row 3 -inf, rows 4-5
    ill-conditioned finite values (their sums depend on the order)."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((6, 33)) * 10.0 ** rng.integers(-3, 4, (6, 33))).astype(np.float32)
    x[0, 5] = np.nan
    x[1, 2], x[1, 30] = np.inf, -np.inf
    x[2, 9] = np.inf
    x[3, 17] = -np.inf
    return x


def _with(value, k, v):
    c = value.copy()
    c[k] = v
    return c


def test_nan_alone_after_a_tree_reduction_admits_no_number():
    x = _rows()
    adm = tn.reference(row_sum, x, np.zeros(6, np.float32))
    assert not adm.exact_mask[4:].any()  # the finite rows are enveloped
    with np.errstate(invalid="ignore"):
        assert adm.admits(np.add.reduce(x, axis=1))
    for k in (0, 1):  # a NaN leaf; +inf and -inf leaves: NaN in every tree
        for cand in (3.0, 0.0, np.inf, -np.inf, F32_MAX):
            v = adm.admits(_with(adm.value, k, cand))
            assert not v and v.index == (k,), (k, cand)
        assert adm.admits(_with(adm.value, k, QNAN_NEG))  # any NaN: NaNs compare as a class
        assert np.isnan(adm.value[k]) and adm.exact_mask[k]


def test_one_infinity_after_a_tree_reduction_admits_nothing_else():
    x = _rows()
    adm = tn.reference(row_sum, x, np.zeros(6, np.float32))
    for k, inf in ((2, np.inf), (3, -np.inf)):
        assert adm.value[k] == inf and adm.exact_mask[k]
        for cand in (np.sign(inf) * F32_MAX, 0.0, -inf, np.nan):
            assert not adm.admits(_with(adm.value, k, cand)), (k, cand)


def test_nan_alone_propagates_through_lifted_ops():
    """NaN in: NaN out for arithmetic and maximum (NaN absorbs); a comparison with
    NaN is false, exactly."""
    x = _rows()
    outs = [np.zeros(6, np.float32) for _ in range(3)]
    a, b, c = tn.reference(row_sum_then, x, *outs)
    for adm in (a, b):
        for k in (0, 1):
            assert not adm.admits(_with(adm.value, k, 3.0)), (adm.name, k)
            assert adm.exact_mask[k] and np.isnan(adm.value[k])
        assert adm.value[2] == np.inf and not adm.admits(_with(adm.value, 2, F32_MAX))
    assert not a.admits(_with(a.value, 3, -F32_MAX))
    assert b.exact_mask[3] and b.value[3] == 0.0  # maximum(-inf, 0) = 0 bitwise
    assert not b.admits(_with(b.value, 3, -0.0))
    # s > 0 is false for NaN, true for +inf
    for k, want in ((0, 0.0), (1, 0.0), (2, 1.0), (3, 0.0)):
        assert c.value[k] == want and c.exact_mask[k], k
        assert not c.admits(_with(c.value, k, 1.0 - want))


def test_ulp_bounded_function_keeps_its_special_results_alone():
    """log of an exact input: NaN for a negative operand, -inf at 0, +0 at 1 are
    the contract bit for bit (V-14) next to elements admitted within 1 ulp."""
    x = np.array([-1.0, 2.0, 3.0, 0.0, 1.0, -0.0], np.float32)
    adm = tn.reference(log32, x, np.zeros(6, np.float32))
    assert not adm.exact_mask[1] and not adm.exact_mask[2]
    assert adm.lo[1] < adm.value[1] and adm.admits(_with(adm.value, 1, adm.lo[1]))
    for k, cand in ((0, 3.0), (0, 0.0), (0, -np.inf), (3, -F32_MAX), (3, np.nan),
                    (4, -0.0), (4, 1e-45), (5, -F32_MAX)):
        assert not adm.admits(_with(adm.value, k, cand)), (k, cand)
    assert adm.admits(_with(adm.value, 0, QNAN_NEG))


def test_exact_elements_stay_bitwise_downstream_of_an_inexact_tile():
    """log(x) + 1 in f64: where log is exact (1 -> 0, 0 -> -inf, -1 -> NaN) the
    sum is exact too, bit for bit, although the tile carries bounds."""
    x = np.array([1.0, 2.0, 0.0, -1.0, 10.0])
    adm = tn.reference(log_plus_one, x, np.zeros(5))
    assert not adm.admits(_with(adm.value, 0, np.nextafter(1.0, 2.0)))
    assert not adm.admits(_with(adm.value, 2, -np.finfo(np.float64).max))
    assert not adm.admits(_with(adm.value, 3, 3.0))
    assert not adm.exact_mask[1] and not adm.exact_mask[4]
    assert adm.exact_mask[0] and adm.value[0] == 1.0
    assert adm.lo[1] < adm.value[1] < adm.hi[1]
    assert adm.admits(_with(adm.value, 1, adm.hi[1]))


def _gemm_args():
    a = np.random.default_rng(3).standard_normal((40, 20)).astype(np.float32)
    b = np.random.default_rng(4).standard_normal((20, 33)).astype(np.float32)
    a[5, 3] = np.nan  # row 5 of the result is NaN in every order
    return a, b, np.zeros((40, 33), np.float32)


def test_mma_nan_alone_inside_an_enveloped_tile():
    a, b, _ = _gemm_args()
    adm = tn.reference(gemm_example.gemm, a, b, np.zeros((40, 33), np.float32))
    assert not adm.admits(_with(adm.value, (5, 7), 1.0))
    assert adm.admits(a @ b)  # BLAS order: another admitted one (NaN row included)
    assert not adm.exact_mask[0].any() and adm.exact_mask[5].all()


def test_shadow_sets_and_ops_on_nan():
    """The shadow rules on their own: NaN alone in gives what the op gives on NaN."""
    nan_alone = S.point_of(np.array([np.nan]))
    rng = (np.array([1.0]), np.array([2.0]), np.array([False]))
    for name in ("add", "mul", "maximum", "minimum", "div", "atan2"):
        lo, hi, nan = S.binary(name, nan_alone, rng, tn.f64)
        assert lo[0] > hi[0] and nan[0], name
    for name, val in (("lt", 0.0), ("eq", 0.0), ("ne", 1.0)):
        lo, hi, nan = S.binary(name, nan_alone, rng, tn.f64)
        assert lo[0] == hi[0] == val and not nan[0], name
    lo, hi, nan = S.binary("pow", nan_alone, (np.array([0.0]), np.array([1.0]),
                                              np.array([False])), tn.f64)
    assert lo[0] == hi[0] == 1.0 and nan[0]  # pow(NaN, 0) = 1, else NaN
    # inf - inf and 0 * inf reachable from NaN-free ranges admit NaN
    inf_rng = (np.array([1.0]), np.array([np.inf]), np.array([False]))
    assert S.binary("sub", inf_rng, inf_rng, tn.f64)[2][0]
    zero_rng = (np.array([-1.0]), np.array([1.0]), np.array([False]))
    assert S.binary("mul", zero_rng, inf_rng, tn.f64)[2][0]
    assert not S.binary("add", inf_rng, inf_rng, tn.f64)[2][0]
    lo, hi, nan = S.cast(nan_alone, tn.f64, tn.i32)
    assert lo[0] == hi[0] == 0.0 and not nan[0]  # NaN converts to 0
    lo, hi, nan = S.unary("isnan", nan_alone, tn.f64, 0.0)
    assert lo[0] == hi[0] == 1.0 and not nan[0]
    lo, hi, nan = S.unary("exp", nan_alone, tn.f64, 4.0)
    assert lo[0] > hi[0] and nan[0]
    lo, hi, nan = S.unary("signbit", nan_alone, tn.f64, 0.0)
    assert lo[0] == 0.0 and hi[0] == 1.0  # a NaN's sign is free


@pytest.mark.parametrize("kernel, args", [
    (row_sum, lambda: (_rows(), np.zeros(6, np.float32))),
    (row_sum_then, lambda: (_rows(),) + tuple(np.zeros(6, np.float32) for _ in range(3))),
    (log32, lambda: (np.array([-1.0, 2.0, 3.0, 0.0, 1.0, -0.0], np.float32),
                     np.zeros(6, np.float32))),
    (log_plus_one, lambda: (np.array([1.0, 2.0, 0.0, -1.0, 10.0]), np.zeros(5))),
    (gemm_example.gemm, lambda: _gemm_args()),
])
def test_compiled_results_validate(kernel, args):
    rep = tn.validate(kernel, "llvm", inputs=[list(args())])
    assert rep.ok, str(rep)


_POOL = np.array([-np.inf, -3.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 3.0, np.inf])


def _random_set(rng):
    """A random admitted set over the pool (a range, NaN or not; or NaN alone) and
    sample members of it: the endpoints, interior points and NaN when admitted."""
    if rng.random() < 0.15:
        return S.point_of(np.array([np.nan])), [np.nan]
    a, b = sorted(rng.choice(_POOL, 2))
    nan = bool(rng.random() < 0.3)
    inner = rng.uniform(max(a, -1e3), min(b, 1e3), 3) if a < b else []
    members = [a, b] + [x for x in _POOL if a <= x <= b] + list(inner)
    members = [x for x in members if a <= x <= b] + ([np.nan] if nan else [])
    return (np.array([a]), np.array([b]), np.array([nan])), members


def _member(p, v):
    lo, hi, nan = (float(x[0]) if i < 2 else bool(x[0]) for i, x in enumerate(p))
    return nan if np.isnan(v) else lo <= v <= hi


def test_shadow_rules_contain_every_result_on_sampled_members():
    """Soundness: for random sets (NaN, infinities and zeros included), every
    result of the op on members of the operand sets is in the result set."""
    from tilenest.semantics import numerics as N

    rng = np.random.default_rng(11)
    checked = 0
    for _ in range(300):
        a, am = _random_set(rng)
        b, bm = _random_set(rng)
        for name in ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "atan2",
                     "lt", "le", "eq", "ne"):
            r = S.binary(name, a, b, tn.f64)
            for x in am:
                for y in bm:
                    v = float(N.binary(name, np.float64(x), np.float64(y), tn.f64))
                    assert _member(r, v), (name, a, b, x, y, v, r)
                    checked += 1
        for name in ("exp", "log", "sqrt", "neg", "abs", "isnan", "isinf", "isfinite", "sin",
                     "tanh", "rsqrt", "floor"):
            r = S.unary(name, a, tn.f64, N.ulp_bound(name, tn.f64))
            for x in am:
                v = float(N.unary(name, np.float64(x), tn.f64))
                assert _member(r, v), (name, a, x, v, r)
        for dst in (tn.i32, tn.f32, tn.bool_):
            r = S.cast(a, tn.f64, dst)
            for x in am:
                v = float(N.cast(np.float64(x), tn.f64, dst))
                assert _member(r, v), (str(dst), a, x, v, r)
    assert checked > 10000


@pytest.mark.parametrize("contract", ["add", "mul", "max", "min"])
def test_tree_leaf_that_admits_nan_besides_a_range(contract):
    """A leaf in [1, 2] or NaN with an exact leaf 3: the result admits NaN and the
    combinations of the ranges; a NaN-alone leaf makes the result NaN alone."""
    lo = np.array([[1.0], [3.0]])
    hi = np.array([[2.0], [3.0]])
    nan = np.array([[True], [False]])
    point = np.array([[False], [True]])
    rlo, rhi, rnan, pt = S.tree_envelope(contract, tn.f32, lo, hi, nan, point, lo)
    want = {"add": (4.0, 5.0), "mul": (3.0, 6.0), "max": (3.0, 3.0), "min": (1.0, 2.0)}
    assert rnan[0] and not pt[0]
    assert rlo[0] <= want[contract][0] and want[contract][1] <= rhi[0] < 7.0
    nan_alone = np.array([[np.inf], [3.0]]), np.array([[-np.inf], [3.0]])
    rlo, rhi, rnan, pt = S.tree_envelope(contract, tn.f32, *nan_alone, nan, point, lo)
    assert rnan[0] and pt[0] and rlo[0] > rhi[0]


@tn.kernel
def zero_then_reciprocal(x: tn.Tensor[f32, "R C"], z: tn.Tensor[f32, "R"],
                         w: tn.Tensor[f32, "R"]):
    rows, cols = x.shape
    z, w = z.with_dims(x.dim(0)), w.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        s = tn.reduce(row, row.dim(1), tn.add) * 0.0
        z(tn.coord(p.index()), tn.shape(1)).store(s)
        w(tn.coord(p.index()), tn.shape(1)).store(1.0 / s)


def test_a_zero_of_unknown_sign_is_not_one_value():
    """s * 0 for an enveloped s of unknown sign is +0.0 or -0.0; 1 / (s * 0) is then
    +inf or -inf: neither may be pinned to the reference's sign."""
    x = np.array([[1e8, -1e8, 1.0, -1.0, 0.5]], np.float32)  # the sum is near 0: either sign
    adm_z, adm_w = tn.reference(zero_then_reciprocal, x, np.zeros(1, np.float32),
                                np.zeros(1, np.float32))
    assert adm_z.admits(np.array([0.0], np.float32)) and adm_z.admits(np.array([-0.0], np.float32))
    assert not adm_z.admits(np.array([1e-45], np.float32))
    assert adm_w.admits(np.array([np.inf], np.float32))
    assert adm_w.admits(np.array([-np.inf], np.float32))


def test_undetermined_admitted_set_never_admits():
    """A branch on an inexact value (here a tree sum) makes the admitted set
    undetermined: admits() must say so, never pass."""
    @tn.kernel
    def branchy(x: tn.Tensor[tn.f32, "N"], y: tn.Tensor[tn.f32, "N"]):
        (n,) = x.shape
        for p in tn.parallel(tn.shape(1)):
            t = x[tn.coord(0), tn.shape(8), tn.bounds.zero]
            s = tn.reduce(t, t.dim(0), tn.add)
            if tn.if_(s > 1.0):
                t = t * 2.0
            y(tn.coord(0), tn.shape(8)).store(t)

    x = np.full(8, 1.0 / 8, np.float32) + np.float32(1e-9)
    adm = tn.reference(branchy, x, np.zeros(8, np.float32))
    assert not adm.determined
    v = adm.admits(adm.value)
    assert not v and v.undetermined and "cannot judge" in v.reason
    assert "if" in v.reason


def test_index_read_from_an_inexact_value_is_undetermined():
    """An address computed from a value whose admitted set is a range (here a
    tree sum, cast to an index) may differ in admitted executions: the oracle
    must not judge the stored tile as if that address were exact."""
    @tn.kernel
    def pick(x: tn.Tensor[tn.f32, "N"], y: tn.Tensor[tn.f32, "N"]):
        (n,) = x.shape
        for p in tn.parallel(tn.shape(1)):
            t = x[tn.coord(0), tn.shape(8), tn.bounds.zero]
            s = tn.reduce(t, t.dim(0), tn.add)
            k = tn.cast(s, tn.i64)
            y(tn.coord(0), tn.shape(1)).store(x[tn.coord(k), tn.shape(1), tn.bounds.zero])

    x = np.full(8, 1.0 / 8, np.float32)
    x[0] += np.float32(3e-8)
    adm = tn.reference(pick, x, np.zeros(8, np.float32))
    v = adm.admits(adm.value)
    assert not adm.determined and v.undetermined and "%k" in v.reason or "reading" in v.reason

    # an exact index stays determined
    adm = tn.reference(pick, np.zeros(8, np.float32), np.zeros(8, np.float32))
    assert adm.determined and adm.admits(adm.value)
