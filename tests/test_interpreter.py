"""The reference interpreter: hand-computed values for every region kind,
policy, bounds policy and dtype; races; schedules; ancestor updates."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import kernels_constructs as K
import tilenest as tn
from tilenest import f32, i32, i64
from tilenest.errors import (BoundsError, RaceError, TilenestError, UninitializedReadError)
from tilenest.interpreter import CANONICAL, REVERSED, random

SCHEDULES = [None, CANONICAL, REVERSED, random(7)]


def bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


# -- reductions --------------------------------------------------------------

@tn.kernel
def folds(x: tn.Tensor[f32, "N"], out: tn.Tensor[f32, "2"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(1)):
        v = x[tn.coord(0), tn.shape(n)]
        left = tn.scalar(0.0, f32)
        for r in p.reduce(v.domain(v.dim(0)), policy=tn.fold_left):
            left = left - v.at(r)
        right = tn.scalar(0.0, f32)
        for r in p.reduce(v.domain(v.dim(0)), policy=tn.fold_right):
            right = v.at(r) - right
        o = tn.iota(tn.shape(tn.axis(out.dim(0), 2)), 0)
        out(tn.coord(0), tn.shape(2)).store(tn.ite(o == 0, left, right))


@pytest.mark.parametrize("sched", SCHEDULES, ids=str)
def test_fold_left_right_orientation(sched):
    out = np.zeros(2, np.float32)
    tn.interpret(folds, np.array([1, 2, 3], np.float32), out, schedule=sched)
    assert out.tolist() == [-6.0, 2.0]


def test_empty_reduce_domain_gives_seed():
    out = np.zeros(2, np.float32)
    tn.interpret(folds, np.zeros(0, np.float32), out)
    assert out.tolist() == [0.0, 0.0]

    @tn.kernel
    def rmax(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "1"]):
        (n,) = x.shape
        for p in tn.parallel(tn.shape(1)):
            v = x[tn.coord(0), tn.shape(n)]
            y(tn.coord(0), tn.shape(1)).store(
                tn.broadcast(tn.reduce(v, v.dim(0), tn.maximum), tn.shape(tn.axis(y.dim(0), 1))))

    y = np.zeros(1, np.float32)
    tn.interpret(rmax, np.zeros(0, np.float32), y)
    assert y[0] == -np.inf  # the identity of max (the seed of the expression form)


@tn.kernel
def maxmin(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "4"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(1)):
        v = x[tn.coord(0), tn.shape(n)]
        mx = tn.reduce(v, v.dim(0), tn.maximum)
        mn = tn.reduce(v, v.dim(0), tn.minimum)
        a = x[tn.coord(0), tn.shape(1)]
        b = x[tn.coord(1), tn.shape(1)]
        b = tn.reindex(b, a, lambda i: (i,))
        o = tn.iota(tn.shape(tn.axis(y.dim(0), 4)), 0)
        e1 = tn.reduce(tn.maximum(a, b), a.dim(0), tn.add)
        e2 = tn.reduce(tn.minimum(a, b), a.dim(0), tn.add)
        y(tn.coord(0), tn.shape(4)).store(tn.ite(o == 0, mx, tn.ite(o == 1, mn,
                                                                     tn.ite(o == 2, e1, e2))))


@pytest.mark.parametrize("fast", [False, True])
def test_signed_zero_and_nan_through_max_min(fast):
    y = np.zeros(4, np.float32)
    tn.interpret(maxmin, np.array([-0.0, 0.0], np.float32), y, fast=fast)
    assert [math.copysign(1, v) for v in y] == [1.0, -1.0, 1.0, -1.0]
    tn.interpret(maxmin, np.array([0.0, -0.0], np.float32), y, fast=fast)
    assert [math.copysign(1, v) for v in y] == [1.0, -1.0, 1.0, -1.0]
    tn.interpret(maxmin, np.array([1.0, np.nan, 3.0], np.float32), y, fast=fast)
    assert np.isnan(y).all()


def test_integer_overflow_wraps():
    @tn.kernel
    def wrap(x: tn.Tensor[tn.i8, "N"], y: tn.Tensor[tn.i8, "N"], z: tn.Tensor[i32, "N"]):
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(1)):
            v = x[tn.coord(0), tn.shape(n)]
            y(tn.coord(0), tn.shape(n)).store(v + 1)
            w = tn.cast(v, i32) * 0x7FFFFFFF
            z(tn.coord(0), tn.shape(n)).store(w * 3)

    x = np.array([127, -128, 0], np.int8)
    y = np.zeros(3, np.int8)
    z = np.zeros(3, np.int32)
    tn.interpret(wrap, x, y, z)
    assert y.tolist() == [-128, -127, 1]
    exp = [np.int32(np.int64(v) * 0x7FFFFFFF * 3 & 0xFFFFFFFF).item() for v in (127, -128, 0)]
    exp = [e - (1 << 32) if e >= (1 << 31) else e for e in
           [(int(v) * 0x7FFFFFFF * 3) & 0xFFFFFFFF for v in (127, -128, 0)]]
    assert z.tolist() == exp


def test_bf16_chain_bit_exact():
    bf = tn.bf16

    @tn.kernel
    def chain(a: tn.Tensor[bf, "N"], b: tn.Tensor[bf, "N"], c: tn.Tensor[bf, "N"],
              y: tn.Tensor[bf, "N"]):
        (n,) = a.shape
        d = a.dim(0)
        b, c, y = b.with_dims(d), c.with_dims(d), y.with_dims(d)
        for p in tn.parallel(tn.shape(tn.cdiv(n, 8))):
            o = tn.coord(p.index() * 8)
            x = a[o, tn.shape(8)] * b[o, tn.shape(8)] + c[o, tn.shape(8)]
            y(o, tn.shape(8)).store(tn.sqrt(tn.abs(x / (c[o, tn.shape(8)] - 0.5))))

    rng = np.random.default_rng(3)
    A, B, C = (rng.standard_normal(29).astype(ml_dtypes.bfloat16) for _ in range(3))
    y = np.zeros(29, ml_dtypes.bfloat16)
    tn.interpret(chain, A, B, C, y)
    r = lambda v: np.asarray(v, np.float32).astype(ml_dtypes.bfloat16)  # noqa: E731
    f = lambda v: np.asarray(v, np.float32)  # noqa: E731
    x = r(f(r(f(A) * f(B))) + f(C))
    ref = r(np.sqrt(f(r(np.abs(f(r(f(x) / f(r(f(C) - np.float32(0.5))))))))))
    assert bits(y) == bits(ref)


# -- views and bounds ------------------------------------------------------------

def _copy_kernel(dt, policy):
    @tn.kernel
    def copy(x: tn.Tensor[dt, "N"], y: tn.Tensor[dt, "N"], *, b=4):
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(tn.cdiv(n, b))):
            o = tn.coord(p.index() * b)
            y(o, tn.shape(b)).store(x[o, tn.shape(b), policy])

    return copy


ALL_DTYPES = [tn.bool_, tn.i8, tn.i16, tn.i32, tn.i64, tn.u8, tn.u16, tn.u32, tn.u64, tn.f16,
              tn.bf16, tn.f32, tn.f64]


@pytest.mark.parametrize("dt", ALL_DTYPES, ids=str)
def test_every_dtype_round_trips_through_views(dt):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(10) * 50).astype(dt.np) if not dt.is_bool else rng.random(10) > 0.5
    x = x.astype(dt.np)
    y = np.zeros(10, dt.np)
    tn.interpret(_copy_kernel(dt, tn.bounds.zero), x, y)
    assert bits(y) == bits(x)


def test_bounds_policies():
    x = np.arange(6, dtype=np.float32) + 1
    y = np.full(6, -1, np.float32)
    tn.interpret(_copy_kernel(f32, tn.bounds.zero), x, y)  # tail masked, no error
    assert y.tolist() == x.tolist()

    @tn.kernel
    def shifted(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(1)):
            y(tn.coord(0), tn.shape(n)).store(x[tn.coord(2), tn.shape(n), tn.bounds.fill(9.0)])

    tn.interpret(shifted, x, y)
    assert y.tolist() == [3, 4, 5, 6, 9, 9]
    with pytest.raises(BoundsError, match=r"x\[6\]") as ei:
        tn.interpret(_copy_kernel(f32, tn.bounds.checked), x, y)
    assert ei.value.sites and ei.value.hint
    with pytest.raises(BoundsError, match="promise"):
        tn.interpret(_copy_kernel(f32, tn.bounds.assume), x, y)
    tn.interpret(_copy_kernel(f32, tn.bounds.checked), np.arange(8, dtype=np.float32),
                 np.zeros(8, np.float32))  # in range: fine


# -- races, schedules, ancestor updates --------------------------------------------

@tn.kernel
def racy(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(0), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])  # RACE


@tn.kernel
def racy_rw(x: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n - 1)):
        v = x[tn.coord(p.index() + 1), tn.shape(1)]
        x(tn.coord(p.index()), tn.shape(1)).store(v)


@pytest.mark.parametrize("sched", SCHEDULES, ids=str)
def test_race_write_write_names_sites_and_instances(sched):
    with pytest.raises(RaceError) as ei:
        tn.interpret(racy, np.ones(4, np.float32), np.zeros(4, np.float32), schedule=sched)
    e = ei.value
    assert "y[0]" in e.message and "instance (0,)" in e.message
    assert len([s for s in e.sites if "test_interpreter.py" in str(s)]) >= 2


def test_race_read_write():
    with pytest.raises(RaceError, match="reads"):
        tn.interpret(racy_rw, np.arange(5, dtype=np.float32))


def test_race_free_results_do_not_depend_on_schedule():
    rng = np.random.default_rng(0)
    A = rng.random((20, 17)).astype(np.float32)
    B = rng.random((17, 19)).astype(np.float32)
    outs = []
    for s in SCHEDULES:
        C = np.zeros((20, 19), np.float32)
        tn.interpret(K.gemm_reduce_fold, A, B, C, schedule=s)
        outs.append(bits(C))
    assert len(set(outs)) == 1


def test_exhaustive_schedule():
    x = np.arange(16, dtype=np.float32)
    y = np.zeros(16, np.float32)
    tn.interpret(K.per_child_patches, x, y, schedule="exhaustive")
    assert y.tolist() == (2 * x).tolist()


def test_overlapping_ancestor_updates_are_an_error():
    @tn.kernel
    def overlap(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        for p in tn.parallel(tn.shape(1)):
            acc = tn.zeros(f32, tn.shape(4), dims=(x.dim(0),))
            for c in p.parallel(tn.shape(2)):
                acc = acc + x[tn.coord(c.index()), tn.shape(4)]
            y(tn.coord(0), tn.shape(4)).store(acc)

    for s in (None, CANONICAL):
        with pytest.raises(TilenestError, match="both update element"):
            tn.interpret(overlap, np.ones(8, np.float32), np.zeros(8, np.float32), schedule=s)


def test_uninitialized_read_is_reported():
    @tn.kernel
    def two_phase(x: tn.Tensor[f32, "N"], tmp: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        tmp = tmp.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(n - 1)):  # misses the last element
            tmp(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])
        for p in tn.parallel(tn.shape(n)):
            y(tn.coord(p.index()), tn.shape(1)).store(tmp[tn.coord(p.index()), tn.shape(1)])

    x = np.ones(4, np.float32)
    with pytest.raises(UninitializedReadError, match=r"tmp\[3\]"):
        tn.interpret(two_phase, x, np.zeros(4, np.float32), np.zeros(4, np.float32),
                     outputs=("tmp", "y"), poison=True)
    y = np.zeros(4, np.float32)
    tn.interpret(two_phase, x, np.zeros(4, np.float32), y, poison=False)
    assert y[:3].tolist() == [1, 1, 1]


def test_inputs_not_modified_and_outputs_returned():
    x = np.arange(6, dtype=np.float32)
    keep = x.copy()
    y = np.zeros(6, np.float32)
    out = tn.interpret(_copy_kernel(f32, tn.bounds.zero), x, y)
    assert out is y and bits(x) == bits(keep)


def test_calling_a_kernel_runs_the_interpreter():
    out = np.zeros(2, np.float32)
    folds(np.array([1, 2, 3], np.float32), out)
    assert out.tolist() == [-6.0, 2.0]


def test_argument_errors_are_diagnosed():
    with pytest.raises(TilenestError, match="dtype"):
        folds(np.array([1, 2, 3], np.float64), np.zeros(2, np.float32))
    with pytest.raises(TilenestError, match="extent"):
        folds(np.array([1, 2, 3], np.float32), np.zeros(3, np.float32))


# -- memory, control flow, constructs --------------------------------------------------

def test_memory_snapshot_and_layouts():
    rng = np.random.default_rng(1)
    x = rng.random((16, 8)).astype(np.float32)
    y = np.zeros_like(x)
    tn.interpret(K.memory_and_layouts, x, y)
    # padded <- blk; snap = blk; padded <- 2*blk; swz <- 2*blk + s (s = 0, 1); colmaj <- swz
    assert np.array_equal(y, (x * 2 + 1) + x)


@pytest.mark.parametrize("sched", SCHEDULES, ids=str)
def test_control_flow(sched):
    x = np.array([1.5, -2.0, 0.0, 3.0], np.float32)
    y = np.zeros(4, np.float32)
    tn.interpret(K.control_flow, x, y, schedule=sched)
    assert y.tolist() == (np.where(x > 0, x * 2, -x) + 3).tolist()


def test_mma_orders_and_embedding():
    rng = np.random.default_rng(2)
    A = rng.random((20, 17)).astype(np.float32)
    B = rng.random((17, 19)).astype(np.float32)
    C = np.zeros((20, 19), np.float32)
    tn.interpret(K.nest_subnest_update, A, B, C)
    assert np.allclose(C, A.astype(np.float64) @ B, rtol=1e-5)
    ids = np.array([3, 0, 2], np.int64)
    table = rng.random((5, 4)).astype(np.float32)
    out = np.zeros((3, 4), np.float32)
    tn.interpret(K.embedding, ids, table, out)
    assert bits(out) == bits(table[ids])
    ids[1] = 7
    with pytest.raises(BoundsError, match=r"table\[7, 0\]"):
        tn.interpret(K.embedding, ids, table, out)


# -- ordered trees, mma precision, pipelines ---------------------------------------------

@tn.kernel
def first_set(x: tn.Tensor[i32, "N"], out: tn.Tensor[i32, "1"]):
    (n,) = x.shape
    first = tn.reducer("first", identity=-1, merge=lambda a, b: tn.ite(a != -1, a, b),
                       dtype=i32, associative=True, commutative=False)
    s = tn.full(i32, tn.shape(1), -1, dims=out.dims())
    for r in tn.reduce(tn.shape(n), contract=first, policy=tn.ordered_tree):
        v = x[tn.coord(r.index()), tn.shape(1)]
        s = tn.ite(s != -1, s, tn.reindex(v, s, lambda i: (i,)))
    out(tn.coord(0), tn.shape(1)).store(s)


@pytest.mark.parametrize("seed", range(5))
def test_ordered_tree_keeps_contribution_order_under_random_trees(seed):
    x = np.array([-1, -1, 7, -1, 5, 3], np.int32)
    out = np.zeros(1, np.int32)
    tn.interpret(first_set, x, out, schedule=random(seed))
    assert out[0] == 7


def test_mma_converts_inputs_and_rejects_precision_loss():
    h = tn.f16

    @tn.kernel
    def mixed(A: tn.Tensor[h, "M K"], B: tn.Tensor[h, "K N"], C: tn.Tensor[f32, "M N"]):
        m, k = A.dims()
        B = B.with_dims(k, C.dim(1))
        C = C.with_dims(m, C.dim(1))
        for p in tn.parallel(tn.shape(1)):
            a = A[tn.coord(0, 0), tn.shape(4, 8)]
            b = B[tn.coord(0, 0), tn.shape(8, 3)]
            acc = tn.zeros(f32, tn.shape(4, 3), dims=(m, C.dim(1)))
            C(tn.coord(0, 0), tn.shape(4, 3)).store(tn.mma(a, b, acc, allow_reassociation=False))

    rng = np.random.default_rng(4)
    A = rng.standard_normal((4, 8)).astype(np.float16)
    B = rng.standard_normal((8, 3)).astype(np.float16)
    C = np.zeros((4, 3), np.float32)
    tn.interpret(mixed, A, B, C)
    ref = np.zeros((4, 3), np.float32)
    for kk in range(8):  # ordered K in the accumulator dtype, inputs converted exactly
        ref = (ref + A[:, kk:kk + 1].astype(np.float32) * B[kk:kk + 1, :].astype(np.float32)
               ).astype(np.float32)
    assert bits(C) == bits(ref)

    @tn.kernel
    def narrowing(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], C: tn.Tensor[h, "M N"]):
        m, k = A.dims()
        B = B.with_dims(k, C.dim(1))
        for p in tn.parallel(tn.shape(1)):
            acc = tn.zeros(h, tn.shape(4, 3), dims=(m, C.dim(1)))
            acc = tn.mma(A[tn.coord(0, 0), tn.shape(4, 8)], B[tn.coord(0, 0), tn.shape(8, 3)], acc)

    with pytest.raises(tn.errors.TypeCheckError, match="lose precision"):
        narrowing.program


def test_pipeline_relying_on_undeclared_order_is_caught():
    @tn.kernel
    def chain(x: tn.Tensor[f32, "N"], *, b=4):
        (n,) = x.shape
        for p in tn.parallel(tn.shape(1)):
            for k in p.pipeline(tn.shape(tn.cdiv(n, b) - 1), tn.pipeline_policy(window=2)):
                k.stage("load")
                prev = x[tn.coord(k.index() * b), tn.shape(b)]
                k.stage("store")
                x(tn.coord(k.index() * b + b), tn.shape(b)).store(prev + 1.0)

    with pytest.raises(RaceError, match="iteration 1") as ei:
        tn.interpret(chain, np.zeros(12, np.float32))
    assert len([s for s in ei.value.sites if "test_interpreter.py" in str(s)]) >= 2
    x = np.zeros(12, np.float32)
    tn.interpret(chain, x, check_pipelines=False)  # the serial reference meaning
    assert x.tolist() == [0] * 4 + [1] * 4 + [2] * 4

    @tn.kernel
    def declared(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, b=4):
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(1)):
            for k in p.pipeline(tn.shape(tn.cdiv(n, b)), tn.pipeline_policy(window=2)):
                k.stage("load")
                v = x[tn.coord(k.index() * b), tn.shape(b)]
                k.stage("store")
                y(tn.coord(k.index() * b), tn.shape(b)).store(v * 2.0)

    y = np.zeros(12, np.float32)
    tn.interpret(declared, np.arange(12, dtype=np.float32), y)
    assert y.tolist() == (np.arange(12) * 2).tolist()


def test_misc_constructs_match_numpy():
    rng = np.random.default_rng(9)
    A = rng.standard_normal((4, 4)).astype(np.float32)
    B = rng.standard_normal((4, 4)).astype(np.float32)
    y = np.zeros((4, 4), np.float32)
    b = np.zeros((4, 4), np.int32)
    tn.interpret(K.misc_constructs, A, B, y, b)
    c = A.astype(np.float64) @ B
    rev = 0.0
    for s in (3, 2, 1, 0):
        rev = rev * 2 + s
    ref = np.cumsum(c, axis=1) + c.max(axis=1, keepdims=True) + rev
    assert np.allclose(y, ref, rtol=1e-5, atol=1e-5)
    assert b.tobytes() == y.view(np.int32).tobytes()
