"""Selection and ordering along rows: stable argmax, stable sort, top-k.

The contract is exact (spec R-15): one stable total order -- numeric order,
``-0.0`` tied with ``+0.0``, NaN after every number in both directions, ties
broken by the lower source index. ``argmax`` returns the first index of the
greatest element (NaN counts as greatest) and that element's original bits;
``sort`` and ``topk`` return the values (their original bits, so a ``-0.0``
stays ``-0.0``) and the ``i64`` source indices.

Schedules choose ``rp`` rows per program and the row tile: ``width=0`` is the
exact (symbolic) row length; a constant ``width`` larger than the row pads it
with NaN (``bounds.fill(nan)``), which sorts after every real element and
after every real NaN (higher index), so the logical prefix is unchanged and
only the logical columns are stored.

The FP64 oracle is independent: ``np.argsort(kind="stable")`` of the row
(negated for a descending order; NaN sorts last either way), and a plain
first-maximum scan for argmax. There is no rounding, so the bound is zero:
outputs must match bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

import tilenest as tn
from tilenest import i64

from .base import SizeDependent, Workload, sentinel

#: the row padded to the next power of two (NaN / -inf filled)
POW2 = SizeDependent("pow2(C)", lambda s: 1 << max(s["C"] - 1, 0).bit_length())


def _tile(x, r0, rp, cols, width):  # type: ignore[no-untyped-def]
    if width == 0:
        return x[tn.coord(r0, 0), tn.shape(rp, cols)]
    return x(tn.coord(r0, 0), tn.shape(rp, width)).load(np.nan)


@functools.cache
def argmax_kernel(dt):  # type: ignore[no-untyped-def]
    @tn.kernel
    def argmax(x: tn.Tensor[dt, "R C"], val: tn.Tensor[dt, "R"], idx: tn.Tensor[i64, "R"], *,
               rp=2, width=0):
        rows, cols = x.shape
        r, c = x.dims()
        val = val.with_dims(r)
        idx = idx.with_dims(r)
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rp))):
            r0 = p.index() * rp
            if width == 0:
                t = x[tn.coord(r0, 0), tn.shape(rp, cols)]
            else:
                t = x(tn.coord(r0, 0), tn.shape(rp, width)).load(-np.inf)
            i = tn.argmax(t, c)
            idx(tn.coord(r0), tn.shape(rp)).store(i)
            val(tn.coord(r0), tn.shape(rp)).store(tn.gather(t, i, c, 0.0))

    return argmax


@functools.cache
def sort_kernel(dt, descending):  # type: ignore[no-untyped-def]
    @tn.kernel
    def sort(x: tn.Tensor[dt, "R C"], val: tn.Tensor[dt, "R C"], idx: tn.Tensor[i64, "R C"], *,
             rp=1, width=0):
        rows, cols = x.shape
        r, c = x.dims()
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rp))):
            r0 = p.index() * rp
            t = _tile(x, r0, rp, cols, width)
            vs, ix = tn.sort(t, c, descending=descending)
            w = cols if width == 0 else width
            val(tn.coord(r0, 0), tn.shape(rp, w)).store(vs)
            idx(tn.coord(r0, 0), tn.shape(rp, w)).store(ix)

    return sort


@functools.cache
def topk_kernel(dt):  # type: ignore[no-untyped-def]
    @tn.kernel
    def topk(x: tn.Tensor[dt, "R C"], val: tn.Tensor[dt, "R K"], idx: tn.Tensor[i64, "R K"], *,
             k=1, rp=1, width=0):
        rows, cols = x.shape
        r, c = x.dims()
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rp))):
            r0 = p.index() * rp
            t = _tile(x, r0, rp, cols, width)
            vs, ix = tn.topk(t, c, k)
            val(tn.coord(r0, 0), tn.shape(rp, k)).store(vs)
            idx(tn.coord(r0, 0), tn.shape(rp, k)).store(ix)

    return topk


def ranking_values(rng: np.random.Generator, shape: tuple[int, int], dt) -> np.ndarray:  # type: ignore[no-untyped-def]
    """31 distinct dyadic values in [-3.75, 3.75] (so ties are frequent), zeros of
    both signs, and the special rows the contract singles out: row 0 all zeros of
    mixed sign, row 1 all equal, row 2 with a NaN and an infinity."""
    x = rng.integers(-15, 16, shape).astype(np.float64) / 4
    x = np.where((x == 0) & (rng.random(shape) < 0.5), -0.0, x)
    rows, cols = shape
    if rows > 0:
        x[0] = np.where(np.arange(cols) % 3 == 0, 0.0, -0.0)
    if rows > 1:
        x[1] = 1.25
    if rows > 2 and cols > 2:
        x[2, cols // 2] = np.nan
        x[2, cols // 3] = np.inf
    return x.astype(dt.np)


def _argmax_args(rng, s, dt):  # type: ignore[no-untyped-def]
    return {"x": ranking_values(rng, (s["R"], s["C"]), dt), "val": sentinel((s["R"],), dt),
            "idx": sentinel((s["R"],), tn.i64)}


def first_max(row: np.ndarray) -> int:
    """Index of the first greatest element; NaN is greatest; -0.0 ties +0.0."""
    best = 0
    for j in range(1, len(row)):
        if np.isnan(row[best]):
            break
        if np.isnan(row[j]) or row[j] > row[best]:
            best = j
    return best


def _argmax_formula(a, s, dt):  # type: ignore[no-untyped-def]
    x = a["x"]
    ix = np.array([first_max(row.astype(np.float64)) for row in x], np.int64)
    return {"idx": ix, "val": x[np.arange(len(x)), ix]}


def stable_order(x: np.ndarray, descending: bool) -> np.ndarray:
    """Source indices of each row in the stable order of R-15."""
    key = x.astype(np.float64)
    return np.argsort(-key if descending else key, axis=1, kind="stable")


def _sort_args(rng, s, dt):  # type: ignore[no-untyped-def]
    k = s.get("K", s["C"])
    return {"x": ranking_values(rng, (s["R"], s["C"]), dt), "val": sentinel((s["R"], k), dt),
            "idx": sentinel((s["R"], k), tn.i64)}


def _sort_formula(descending: bool):  # type: ignore[no-untyped-def]
    def formula(a, s, dt):  # type: ignore[no-untyped-def]
        k = s.get("K", s["C"])
        order = stable_order(a["x"], descending)[:, :k]
        return {"idx": order.astype(np.int64), "val": np.take_along_axis(a["x"], order, axis=1)}

    return formula


_RANK_SIZES = {"small": {"R": 4, "C": 17}, "pow2": {"R": 3, "C": 64},
               "medium": {"R": 4, "C": 129}, "large": {"R": 3, "C": 1025}}

WORKLOADS = [
    Workload("argmax", "selection", "stable argmax: first index, NaN greatest, value bits kept",
             argmax_kernel, _argmax_args, _argmax_formula,
             {"small": {"R": 5, "C": 9}, "medium": {"R": 40, "C": 300},
              "wide": {"R": 3, "C": 1025}, "large": {"R": 256, "C": 4096}},
             ({"rp": 2, "width": 0}, {"rp": 1, "width": POW2}, {"rp": 4, "width": 0})),
    Workload("sort", "selection", "stable ascending sort (values, indices)",
             functools.partial(sort_kernel, descending=False), _sort_args, _sort_formula(False),
             _RANK_SIZES, ({"rp": 1, "width": 0}, {"rp": 2, "width": POW2})),
    Workload("sort_desc", "selection", "stable descending sort (values, indices)",
             functools.partial(sort_kernel, descending=True), _sort_args, _sort_formula(True),
             _RANK_SIZES, ({"rp": 1, "width": POW2}, {"rp": 3, "width": 0})),
    Workload("topk", "selection", "top-k (descending, original-index ties)", topk_kernel,
             _sort_args, _sort_formula(True),
             {"small": {"R": 4, "C": 17, "K": 3}, "k1": {"R": 3, "C": 64, "K": 1},
              "near_n": {"R": 3, "C": 65, "K": 63}, "medium": {"R": 4, "C": 129, "K": 8},
              "wide": {"R": 2, "C": 1025, "K": 32}, "large": {"R": 16, "C": 1025, "K": 1000}},
             ({"rp": 1, "width": 0}, {"rp": 2, "width": POW2}),
             size_consts=lambda s: {"k": s["K"]}),
]
