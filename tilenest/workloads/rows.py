"""Row reductions: row sum and row max.

Schedules choose ``rp`` rows per program and either a whole-row tile
(``bc=0``: one expression ``reduce``) or column blocks of ``bc`` combined by a
``reduce`` region (the ``add``/``max`` contract is recognized from the update).

Error bounds: a row sum is a sum of ``C`` terms in any order,
``|s - sum x| <= gamma_{C-1}(f32) * sum|x|`` (``bounds.total``); zero-filled
padding of a ragged last block adds exact zeros. A row max is exact (float
``max`` is associative and commutative bitwise, spec R-7), and its value bits,
signed zero included, must match: ``max(-0.0, +0.0) = +0.0``.
"""

from __future__ import annotations

import functools

import numpy as np

import tilenest as tn
from tilenest import f32

from . import bounds as B
from .base import Workload, normal, sentinel, x64


@functools.cache
def row_kernel(dt, op):  # type: ignore[no-untyped-def]
    @tn.kernel
    def rowreduce(x: tn.Tensor[dt, "R C"], y: tn.Tensor[dt, "R"], *, rp=2, bc=0):
        rows, cols = x.shape
        r, c = x.dims()
        y = y.with_dims(r)
        red = tn.add if op == "sum" else tn.maximum
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rp))):
            r0 = p.index() * rp
            if bc == 0:
                t = tn.cast(x[tn.coord(r0, 0), tn.shape(rp, cols)], f32)
                acc = tn.reduce(t, c, red)
            else:
                if op == "sum":
                    acc = tn.zeros(f32, tn.shape(rp), dims=(r,))
                else:
                    acc = tn.full(f32, tn.shape(rp), -np.inf, dims=(r,))
                for k in p.reduce(tn.shape(tn.cdiv(cols, bc))):
                    t = tn.cast(x(tn.coord(r0, k.index() * bc), tn.shape(rp, bc)).load(
                        0.0 if op == "sum" else -np.inf), f32)
                    if op == "sum":
                        acc = acc + tn.reduce(t, c, tn.add)
                    else:
                        acc = tn.maximum(acc, tn.reduce(t, c, tn.maximum))
            y(tn.coord(r0), tn.shape(rp)).store(tn.cast(acc, dt))

    return rowreduce


def _args(rng, s, dt):  # type: ignore[no-untyped-def]
    x = normal(rng, (s["R"], s["C"]), dt, 4.0)
    # exercise signed zeros and ties in the max: a row of zeros of both signs
    # (max must be +0.0) and a row whose maximum occurs twice
    x[0, :] = np.where(np.arange(s["C"]) % 2 == 0, -0.0, 0.0).astype(dt.np)
    if s["R"] > 1:
        x[1, -1] = x[1, 0] = np.abs(x[1]).max() + 1
    return {"x": x, "y": sentinel((s["R"],), dt)}


def _sum_formula(a, s, dt):  # type: ignore[no-untyped-def]
    return {"y": B.cast(B.total(x64(a["x"]), 1, keepdims=False), dt)}


def _max_formula(a, s, dt):  # type: ignore[no-untyped-def]
    x = a["x"].astype(np.float64)
    m = x.max(axis=1)
    # IEEE max orders -0.0 below +0.0: a zero maximum is +0.0 iff some element is +0.0
    pos_zero = ((x == 0) & ~np.signbit(x)).any(axis=1)
    m = np.where((m == 0) & pos_zero, 0.0, m)
    return {"y": m.astype(dt.np)}


_SIZES = {"small": {"R": 6, "C": 19}, "medium": {"R": 40, "C": 700},
          "large": {"R": 256, "C": 8192}}
_SCHEDULES = ({"rp": 2, "bc": 0}, {"rp": 1, "bc": 64}, {"rp": 4, "bc": 7})

WORKLOADS = [
    Workload("row_sum", "rows", "y[r] = sum_c x[r, c] (tree)",
             functools.partial(row_kernel, op="sum"), _args, _sum_formula, _SIZES, _SCHEDULES),
    Workload("row_max", "rows", "y[r] = max_c x[r, c] (exact, signed zeros kept)",
             functools.partial(row_kernel, op="max"), _args, _max_formula, _SIZES, _SCHEDULES),
]
