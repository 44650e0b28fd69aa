"""Kernels whose custom reducers' laws need real arithmetic with division
(``tests/test_reducer_laws.py``; ``tilenest check`` runs on this file)."""

from __future__ import annotations

import tilenest as tn
from tilenest import f32


def welford_merge(na, ma, qa, nb, mb, qb):
    """Welford's merge of two (count, mean, M2) states (Chan et al.); the
    guard keeps the weight defined when both counts are 0."""
    n = na + nb
    d = mb - ma
    w = tn.ite(n > 0.0, nb / tn.maximum(n, 1.0), 0.0)
    return n, ma + d * w, qa + qb + d * d * na * w


@tn.kernel
def row_stats(x: tn.Tensor[f32, "R C"], mean: tn.Tensor[f32, "R"], var: tn.Tensor[f32, "R"]):
    rows, cols = x.shape
    mean = mean.with_dims(x.dim(0))
    var = var.with_dims(x.dim(0))
    wf = tn.reducer("welford", identity=(0.0, 0.0, 0.0), merge=welford_merge,
                    dtype=(f32, f32, f32))
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        n = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
        m = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
        q = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
        for r in p.reduce(row.domain(row.dim(1)), contract=wf):
            n, m, q = welford_merge(n, m, q, 1.0, row.at(r), 0.0)   # = merge(s, (1, x, 0))
        mean(tn.coord(p.index()), tn.shape(1)).store(m)
        var(tn.coord(p.index()), tn.shape(1)).store(q / n)


def unguarded_merge(na, ma, nb, mb):
    """A count-weighted mean without a guard: 0 / 0 when both counts are 0."""
    n = na + nb
    return n, (na * ma + nb * mb) / n


def _one_state(name, merge, identity, policy, commutative):
    @tn.kernel
    def total(x: tn.Tensor[f32, 1], out: tn.Tensor[f32, 1]):
        (n,) = x.shape
        red = tn.reducer(name, identity=identity, merge=merge, dtype=f32,
                         commutative=commutative)
        s = tn.full(f32, tn.shape(1), identity, dims=x.dims())
        for r in tn.reduce(tn.shape(n), contract=red, policy=policy):
            s = merge(s, x[tn.coord(r.index()), tn.shape(1)])
        out(tn.coord(0), tn.shape(1)).store(s)

    return total


#: merge (a, b) -> a - b declared associative, under ordered_tree
difference = _one_state("difference", lambda a, b: a - b, 0.0, tn.ordered_tree, False)
#: a mean without counts, (a + b) / 2, under unordered_tree
halves = _one_state("halves", lambda a, b: (a + b) / 2.0, 0.0, tn.unordered_tree, True)
#: log-sum-exp: lawful, but exp has no meaning in the real arithmetic decided here
logsumexp = _one_state("logsumexp", lambda a, b: tn.log(tn.exp(a) + tn.exp(b)), -1e30,
                       tn.unordered_tree, True)


@tn.kernel
def unguarded_mean(x: tn.Tensor[f32, 1], out: tn.Tensor[f32, 1]):
    (n,) = x.shape
    red = tn.reducer("mean", identity=(0.0, 0.0), merge=unguarded_merge, dtype=(f32, f32))
    c = tn.zeros(f32, tn.shape(1), dims=x.dims())
    m = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), contract=red):
        c, m = unguarded_merge(c, m, 1.0, x[tn.coord(r.index()), tn.shape(1)])
    out(tn.coord(0), tn.shape(1)).store(m)


@tn.kernel
def max_abs(x: tn.Tensor[f32, 1], out: tn.Tensor[f32, 1]):
    """The largest magnitude: merge max with identity 0, which is an identity
    only on the states a reduction of magnitudes forms (>= 0), not on every
    real state."""
    (n,) = x.shape
    red = tn.reducer("maxabs", identity=0.0, merge=tn.maximum, dtype=f32, commutative=True)
    s = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), contract=red, policy=tn.unordered_tree):
        s = tn.maximum(s, tn.abs(x[tn.coord(r.index()), tn.shape(1)]))
    out(tn.coord(0), tn.shape(1)).store(s)
