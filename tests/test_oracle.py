"""tn.reference: admitted sets -- bitwise where the contract is bitwise, an FP64
reference with a rigorous envelope downstream of permitted reassociation."""

from __future__ import annotations

import numpy as np
import pytest

import gemm as gemm_example
import softmax as softmax_example
import tilenest as tn
from tilenest import f32


@tn.kernel
def row_sum(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R"]):
    rows, cols = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        y(tn.coord(p.index()), tn.shape(1)).store(tn.reduce(row, row.dim(1), tn.add))


@tn.kernel
def row_sum_fold(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R"]):
    rows, cols = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        s = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
        for r in p.reduce(row.domain(row.dim(1)), policy=tn.fold_left):
            s = s + row.at(r)
        y(tn.coord(p.index()), tn.shape(1)).store(s)


def _data(seed=0):
    rng = np.random.default_rng(seed)
    # ill-conditioned rows: large cancelling terms make the order visible
    x = (rng.standard_normal((8, 257)) * 10.0 ** rng.integers(-3, 4, (8, 257))).astype(np.float32)
    return x


def test_reordered_float_sum_is_admitted_and_off_by_more_is_not():
    x = _data()
    adm = tn.reference(row_sum, x, np.zeros(8, np.float32))
    assert not adm.exact_mask.any()
    rev = np.zeros(8, np.float32)
    for i in range(8):  # a different order: reversed strict fold in f32
        s = np.float32(-0.0)
        for v in x[i, ::-1]:
            s = np.float32(s + v)
        rev[i] = s
    assert rev.tobytes() != adm.value.tobytes()  # the order really matters here
    assert adm.admits(rev)
    pairwise = np.add.reduce(x, axis=1)
    assert adm.admits(pairwise)
    env = adm.envelope
    off = adm.value.astype(np.float64) + 2 * env
    v = adm.admits(off.astype(np.float32))
    assert not v and "outside the admitted" in v.reason and v.index is not None
    nan = adm.value.copy()
    nan[3] = np.nan
    v = adm.admits(nan)
    assert not v and v.index == (3,) and "NaN" in v.reason


def test_fold_left_is_bitwise():
    x = _data(1)
    adm = tn.reference(row_sum_fold, x, np.zeros(8, np.float32))
    assert adm.exact_mask.all()
    ref = np.zeros(8, np.float32)
    for i in range(8):
        s = np.float32(0.0)
        for v in x[i]:
            s = np.float32(s + v)
        ref[i] = s
    assert adm.admits(ref)
    assert not adm.admits(np.add.reduce(x, axis=1)) or np.array_equal(
        np.add.reduce(x, axis=1), ref)


def test_softmax_and_gemm_admit_independent_implementations():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((5, 70)).astype(np.float32)
    adm = tn.reference(softmax_example.row_softmax, x, np.zeros_like(x))
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    assert adm.admits((e / e.sum(1, keepdims=True)).astype(np.float32))
    assert adm.admits(tn.interpret(softmax_example.row_softmax, x, np.zeros_like(x), fast=True))
    wrong = adm.value.copy()
    wrong[0, 0] = np.nextafter(wrong[0, 0], np.float32(1)) * np.float32(1.001)
    assert not adm.admits(wrong)
    A = rng.standard_normal((40, 33)).astype(np.float32)
    B = rng.standard_normal((33, 20)).astype(np.float32)
    adm = tn.reference(gemm_example.gemm, A, B, np.zeros((40, 20), np.float32))
    assert adm.admits(A @ B)
    assert adm.admits((A.astype(np.float64) @ B).astype(np.float32))
    assert not adm.admits(A @ B + 1e-2)


def test_elementwise_is_bitwise_and_nan_must_agree():
    @tn.kernel
    def k(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(1)):
            v = x[tn.coord(0), tn.shape(n)]
            y(tn.coord(0), tn.shape(n)).store(tn.sqrt(v) * 3.0)

    x = np.array([4.0, -1.0, 2.0], np.float32)
    adm = tn.reference(k, x, np.zeros(3, np.float32))
    assert adm.exact_mask.all()
    good = (np.sqrt(x) * np.float32(3)).astype(np.float32)
    assert adm.admits(good)
    one_ulp = good.copy()
    one_ulp[2] = np.nextafter(one_ulp[2], np.float32(10))
    v = adm.admits(one_ulp)
    assert not v and "bitwise" in v.reason and v.index == (2,)
    no_nan = good.copy()
    no_nan[1] = 0.0
    assert not adm.admits(no_nan)
    assert not adm.admits(good.astype(np.float64))


def test_reference_does_not_modify_arguments():
    x = _data(3)
    y = np.full(8, 7.0, np.float32)
    tn.reference(row_sum, x, y)
    assert (y == 7.0).all()


@pytest.mark.parametrize("seed", range(3))
def test_random_tree_schedules_are_admitted(seed):
    x = _data(seed)
    adm = tn.reference(row_sum, x, np.zeros(8, np.float32))
    y = np.zeros(8, np.float32)
    tn.interpret(row_sum, x, y, schedule=tn.interpreter.random(seed))
    assert adm.admits(y)
