"""Inclusive scans along rows, ``rp`` rows per program.

* ``scan_fold``: ``tn.cumsum(x, c)`` under ``fold_left`` (a serial region
  carrying the running sum): each prefix is the strict left fold, so the
  result is **bitwise** ``np.add.accumulate`` in f32 (then one rounding to
  the storage dtype), checked bit for bit, and also within the FP64 bound.
* ``scan_tree``: column blocks of ``bc`` (a compile-time constant), each
  scanned under ``ordered_tree`` (regroups, never permutes; see
  :func:`block_scan`), plus the carry of the previous blocks; a ``serial``
  region over blocks carries it.

Error bound (``bounds.prefix``): prefix ``i`` of either scan is a sum of
``i + 1`` terms in some grouping, ``|y_i - sum_{j<=i} x_j| <=
gamma_i(f32) * sum_{j<=i} |x_j|``; zero-filled padding past the row's end adds
exact zeros.
"""

from __future__ import annotations

import functools

import numpy as np

import tilenest as tn
from tilenest import f32

from . import bounds as B
from .base import Workload, normal, sentinel, x64


@functools.cache
def scan_fold_kernel(dt):  # type: ignore[no-untyped-def]
    @tn.kernel
    def scan_fold(x: tn.Tensor[dt, "R C"], y: tn.Tensor[dt, "R C"], *, rp=2):
        rows, cols = x.shape
        r, c = x.dims()
        y = y.with_dims(r, c)
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rp))):
            o = tn.coord(p.index() * rp, 0)
            t = tn.cast(x[o, tn.shape(rp, cols)], f32)
            y(o, tn.shape(rp, cols)).store(tn.cast(tn.cumsum(t, c), dt))

    return scan_fold


def block_scan(t, c, bc, algo):  # type: ignore[no-untyped-def]
    """Inclusive ordered-tree scan of tile ``t`` along its dim ``c`` (extent ``bc``).

    ``algo="reduce"``: prefix ``i`` is an ``ordered_tree`` expression reduce of
    the ``bc`` terms ``x_j`` for ``j <= i`` (the others replaced by ``-0.0``,
    the ``add`` identity), so every ordered regrouping is admitted (R-6, R-8).
    ``algo="library"``: ``tn.cumsum(policy=tn.ordered_tree)``, the library's
    Hillis-Steele composition of shifted gathers (one fixed grouping)."""
    if algo == "library":
        return tn.cumsum(t, c, policy=tn.ordered_tree)
    cj = tn.dim("cj")
    pair = tn.shape(*[tn.axis(d, t.extent(d)) for d in t.dims()], tn.axis(cj, bc))
    xj = tn.broadcast(tn.reindex(t, tn.shape(*[tn.axis(d if d != c else cj, t.extent(d))
                                                for d in t.dims()]),
                                 lambda *q: q), pair)
    ii = tn.index_tile(pair, lambda *q: q[t.dims().index(c)])
    jj = tn.index_tile(pair, lambda *q: q[-1])
    terms = tn.ite(jj <= ii, xj, -0.0)
    return tn.reduce(terms, cj, tn.add, policy=tn.ordered_tree)


@functools.cache
def scan_tree_kernel(dt):  # type: ignore[no-untyped-def]
    @tn.kernel
    def scan_tree(x: tn.Tensor[dt, "R C"], y: tn.Tensor[dt, "R C"], *, rp=2, bc=16,
                  algo="reduce"):
        rows, cols = x.shape
        r, c = x.dims()
        y = y.with_dims(r, c)
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rp))):
            r0 = p.index() * rp
            carry = tn.zeros(f32, tn.shape(rp), dims=(r,))
            for k in p.serial(tn.shape(tn.cdiv(cols, bc))):
                o = tn.coord(r0, k.index() * bc)
                t = tn.cast(x[o, tn.shape(rp, bc)], f32)
                sc = block_scan(t, c, bc, algo) + carry
                y(o, tn.shape(rp, bc)).store(tn.cast(sc, dt))
                carry = tn.reduce(sc.slice((0, bc - 1), (rp, 1)), c, tn.add)

    return scan_tree


def _args(rng, s, dt):  # type: ignore[no-untyped-def]
    shape = (s["R"], s["C"])
    x = normal(rng, shape, dt)
    # cancellation: a large value and its negative make the order visible
    x[:, 1] = np.asarray(1e4 if dt.name != "f16" else 1e3, dt.np)
    x[:, 3 % s["C"]] = -x[:, 1]
    return {"x": x, "y": sentinel(shape, dt)}


def _fold_formula(a, s, dt):  # type: ignore[no-untyped-def]
    seq = np.add.accumulate(a["x"].astype(np.float32), axis=1, dtype=np.float32)
    return {"y": [B.cast(B.prefix(x64(a["x"]), 1), dt), seq.astype(dt.np)]}


def _tree_formula(a, s, dt):  # type: ignore[no-untyped-def]
    return {"y": B.cast(B.prefix(x64(a["x"]), 1), dt)}


_SIZES = {"small": {"R": 3, "C": 13}, "medium": {"R": 24, "C": 400},
          "large": {"R": 128, "C": 8192}}

WORKLOADS = [
    Workload("scan_fold", "scans", "inclusive scan, fold_left (sequential, bitwise)",
             scan_fold_kernel, _args, _fold_formula, _SIZES, ({"rp": 2}, {"rp": 1}, {"rp": 5})),
    Workload("scan_tree", "scans", "inclusive scan, ordered_tree blocks + carry (bounded)",
             scan_tree_kernel, _args, _tree_formula, _SIZES,
             ({"rp": 2, "bc": 16, "algo": "reduce"}, {"rp": 1, "bc": 4, "algo": "reduce"},
              {"rp": 3, "bc": 64, "algo": "library"})),
]
