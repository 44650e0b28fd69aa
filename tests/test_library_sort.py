"""tn.sort / tn.topk: the stable order of R-15, O(n)-sized tiles, and k <= extent.

The oracle is numpy's stable argsort of the row in FP64 (negated for a
descending order; NaN sorts last either way, ``-0.0`` ties ``+0.0``), which is
exactly the order R-15 states. Values must be the source elements' bits.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32, i32, i64
from tilenest.errors import CaptureError, RuntimeSemanticError, TypeCheckError
from tilenest.semantics.types import TileType


def stable(x: np.ndarray, descending: bool, axis: int = -1) -> np.ndarray:
    key = x.astype(np.float64)
    return np.argsort(-key if descending else key, axis=axis, kind="stable")


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint32) if a.dtype == np.float32 else a


def sort_rows(dt, descending):  # type: ignore[no-untyped-def]
    @tn.kernel
    def srt(x: tn.Tensor[dt, "R C"], v: tn.Tensor[dt, "R C"], ix: tn.Tensor[i64, "R C"]):
        rows, cols = x.shape
        c = x.dim(1)
        for p in tn.parallel(tn.shape(tn.cdiv(rows, 2))):
            t = x[tn.coord(p.index() * 2, 0), tn.shape(2, cols)]       # two rows per program
            vs, si = tn.sort(t, c, descending=descending)
            v(tn.coord(p.index() * 2, 0), tn.shape(2, cols)).store(vs)
            ix(tn.coord(p.index() * 2, 0), tn.shape(2, cols)).store(si)

    return srt


@tn.kernel
def sort_columns(x: tn.Tensor[f32, "R C"], v: tn.Tensor[f32, "R C"], ix: tn.Tensor[i64, "R C"]):
    rows, cols = x.shape
    t = x[tn.coord(0, 0), tn.shape(rows, cols)]
    vs, si = tn.sort(t, t.dim(0))                                       # along the first axis
    v(tn.coord(0, 0), tn.shape(rows, cols)).store(vs)
    ix(tn.coord(0, 0), tn.shape(rows, cols)).store(si)


@tn.kernel
def topk_rows(x: tn.Tensor[f32, "R C"], v: tn.Tensor[f32, "R K"], ix: tn.Tensor[i64, "R K"], *,
              k=3):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        t = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        vs, si = tn.topk(t, t.dim(1), k)
        v(tn.coord(p.index(), 0), tn.shape(1, k)).store(vs)
        ix(tn.coord(p.index(), 0), tn.shape(1, k)).store(si)


def ranking(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Few distinct values (ties everywhere), zeros of both signs, NaN and +-inf."""
    x = rng.integers(-6, 7, shape).astype(np.float64) / 2
    x = np.where((x == 0) & (rng.random(shape) < 0.5), -0.0, x)
    x = np.where(rng.random(shape) < 0.1, np.nan, x)
    x = np.where(rng.random(shape) < 0.05, np.inf, x)
    x = np.where(rng.random(shape) < 0.05, -np.inf, x)
    return x.astype(np.float32)


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("cols", [0, 1, 2, 3, 5, 8, 17, 64, 100])
def test_sort_is_numpy_stable_argsort(cols, descending):
    rng = np.random.default_rng(cols)
    x = ranking(rng, (4, cols))
    if cols:
        x[1] = np.where(np.arange(cols) % 2, 0.0, -0.0)  # an all-zero row of mixed sign
        x[2] = np.nan                                      # an all-NaN row
    v = np.full_like(x, 7.0)
    ix = np.full(x.shape, -1, np.int64)
    sort_rows(f32, descending)(x, v, ix)
    want = stable(x, descending)
    assert ix.tolist() == want.tolist()
    assert _bits(v).tolist() == _bits(np.take_along_axis(x, want, 1)).tolist()


@pytest.mark.parametrize("descending", [False, True])
def test_sort_integers(descending):
    rng = np.random.default_rng(3)
    x = rng.integers(-3, 4, (2, 37)).astype(np.int32)
    x[0, :3] = np.iinfo(np.int32).min
    x[1, -2:] = np.iinfo(np.int32).max
    v = np.zeros_like(x)
    ix = np.zeros(x.shape, np.int64)
    sort_rows(i32, descending)(x, v, ix)
    want = stable(x, descending)
    assert ix.tolist() == want.tolist()
    assert v.tolist() == np.take_along_axis(x, want, 1).tolist()


def test_sort_along_the_first_axis():
    x = ranking(np.random.default_rng(5), (23, 3))
    v = np.zeros_like(x)
    ix = np.zeros(x.shape, np.int64)
    sort_columns(x, v, ix)
    want = stable(x, False, axis=0)
    assert ix.tolist() == want.tolist()
    assert _bits(v).tolist() == _bits(np.take_along_axis(x, want, 0)).tolist()


@pytest.mark.parametrize("k", [0, 1, 3, 31])
def test_topk_is_the_prefix_of_the_descending_stable_sort(k):
    x = ranking(np.random.default_rng(k), (3, 31))
    v = np.zeros((3, k), np.float32)
    ix = np.zeros((3, k), np.int64)
    topk_rows.specialize(k=k)(x, v, ix)
    want = stable(x, True)[:, :k]
    assert ix.tolist() == want.tolist()
    assert _bits(v).tolist() == _bits(np.take_along_axis(x, want, 1)).tolist()


def test_sort_compiled_matches_the_interpreter():
    x = ranking(np.random.default_rng(9), (5, 45))
    outs = []
    for run in (sort_rows(f32, True), sort_rows(f32, True).compile(target="llvm")):
        v, ix = np.zeros_like(x), np.zeros(x.shape, np.int64)
        run(x, v, ix)
        outs.append((_bits(v).tolist(), ix.tolist()))
    assert outs[0] == outs[1]
    assert outs[0][1] == stable(x, True).tolist()


# ----------------------------------------------------------------- cost
def test_no_tile_is_quadratic_in_the_sorted_extent():
    """The old formulation compared all pairs: a tile of C x C elements. Every
    tile of the sort now has at most the sorted tile's elements."""
    prog = sort_rows(f32, False).program
    for op in prog.walk():
        for r in op.results:
            if isinstance(r.type, TileType):
                assert sum(1 for e in r.type.extents if "C" in str(e)) <= 1, (op.name, r.type)


def test_sort_4096_is_fast_and_small():
    import time
    import tracemalloc

    @tn.kernel
    def one_row(x: tn.Tensor[f32, "R C"], v: tn.Tensor[f32, "R C"], ix: tn.Tensor[i64, "R C"]):
        rows, cols = x.shape
        t = x[tn.coord(0, 0), tn.shape(1, cols)]
        vs, si = tn.sort(t, t.dim(1))
        v(tn.coord(0, 0), tn.shape(1, cols)).store(vs)
        ix(tn.coord(0, 0), tn.shape(1, cols)).store(si)

    x = ranking(np.random.default_rng(1), (1, 4096))
    v, ix = np.zeros_like(x), np.zeros(x.shape, np.int64)
    one_row.program
    tracemalloc.start()
    t0 = time.perf_counter()
    one_row(x, v, ix)
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert ix.tolist() == stable(x, False).tolist()
    # the pairwise formulation needed about 1 GiB and 8 s here
    assert peak < 64 * 2 ** 20, peak
    assert seconds < 5.0, seconds


# ----------------------------------------------------------------- k <= extent
def test_topk_k_larger_than_a_constant_extent_is_a_capture_error():
    @tn.kernel
    def k9(x: tn.Tensor[f32, "C"], v: tn.Tensor[f32, "K"], ix: tn.Tensor[i64, "K"]):
        t = x[tn.coord(0), tn.shape(5)]
        vs, si = tn.topk(t, t.dim(0), 9)
        v(tn.coord(0), tn.shape(9)).store(vs)

    with pytest.raises(TypeCheckError, match="k=9 > extent 5"):
        k9.program


@pytest.mark.parametrize("compiled", [False, True])
def test_topk_k_larger_than_a_symbolic_extent_is_refused_at_the_call(compiled):
    kern = topk_rows.specialize(k=4)
    assert any("4 <= C" in str(a) or "C >= 4" in str(a) for a in
               (tn.semantics.expr.pred_to_str(p) for p in kern.program.assumptions))
    x = np.arange(6, dtype=np.float32).reshape(2, 3)      # C = 3 < k = 4
    v, ix = np.zeros((2, 4), np.float32), np.zeros((2, 4), np.int64)
    run = kern.compile(target="llvm") if compiled else kern
    with pytest.raises(RuntimeSemanticError, match="assumption"):
        run(x, v, ix)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)      # C = 4 = k is fine
    run(x, v, ix)
    assert ix.tolist() == [[3, 2, 1, 0]] * 2


@pytest.mark.parametrize("bad", [-1, 2.0, "3"])
def test_topk_k_must_be_a_non_negative_integer(bad):
    from tilenest.frontend.kernel import capture

    @tn.kernel
    def kb(x: tn.Tensor[f32, "C"], v: tn.Tensor[f32, "C"], *, k=1):
        t = x[tn.coord(0), tn.shape(5)]
        vs, si = tn.topk(t, t.dim(0), k)

    # capture directly: specialize would refuse a float or str for an int default
    with pytest.raises(CaptureError, match="non-negative integer k"):
        capture(kb.fn, {"k": bad})


@tn.kernel
def topk_growing(x: tn.Tensor[f32, "C"], v: tn.Tensor[f32, "C"], *, k=3):
    for i in tn.serial(tn.shape(x.shape[0])):
        t = x[tn.coord(0), tn.shape(i.index() + 1)]          # extent i + 1 varies per step
        vs, si = tn.topk(t, t.dim(0), k)
        v(tn.coord(0), tn.shape(k)).store(vs)


def test_topk_k_larger_than_a_runtime_extent_is_a_bounds_error():
    # (the llvm target refuses tiles whose extent varies inside a program)
    from tilenest.errors import BoundsError

    x = np.array([5, 1, 4, 2, 3], np.float32)
    v = np.zeros(5, np.float32)
    with pytest.raises(BoundsError, match="reindex"):
        topk_growing(x, v)                           # steps 0 and 1 have fewer than 3
    topk_growing.specialize(k=1)(x, v)
    assert v[0] == 5
