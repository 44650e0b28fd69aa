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


NEG_INF = float("-inf")


def softmax_merge(ma, la, aa, mb, lb, ab):
    """Merge two online-softmax states (running max, sum of exp(x - max),
    exp-weighted sum of values). A side whose max is -inf (an empty state)
    weighs 0, so merging two empty states stays empty instead of NaN."""
    m = tn.maximum(ma, mb)
    wa = tn.ite(ma > NEG_INF, tn.exp(ma - m), 0.0)
    wb = tn.ite(mb > NEG_INF, tn.exp(mb - m), 0.0)
    return m, la * wa + lb * wb, aa * wa + ab * wb


def unguarded_softmax_merge(ma, la, aa, mb, lb, ab):
    """The merge without the empty-state guard: exp(-inf - -inf) is NaN."""
    m = tn.maximum(ma, mb)
    wa, wb = tn.exp(ma - m), tn.exp(mb - m)
    return m, la * wa + lb * wb, aa * wa + ab * wb


def unscaled_softmax_merge(ma, la, aa, mb, lb, ab):
    """A wrong merge: the second state is not rescaled to the new max."""
    m = tn.maximum(ma, mb)
    wa = tn.ite(ma > NEG_INF, tn.exp(ma - m), 0.0)
    return m, la * wa + lb, aa * wa + ab


def _softmax_average(name, merge):
    """Per row, sum_j softmax(x)_j v_j as one tree reduction of online-softmax
    states."""

    @tn.kernel
    def average(x: tn.Tensor[f32, "R N"], v: tn.Tensor[f32, "R N"], out: tn.Tensor[f32, "R"]):
        rows, n = x.shape
        v = v.with_dims(*x.dims())
        out = out.with_dims(x.dim(0))
        osm = tn.reducer(name, identity=(NEG_INF, 0.0, 0.0), merge=merge, dtype=(f32, f32, f32))
        for p in tn.parallel(tn.shape(rows)):
            m = tn.full(f32, tn.shape(1), NEG_INF, dims=(x.dim(0),))
            s = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
            a = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
            xr = x[tn.coord(p.index(), 0), tn.shape(1, n)]
            vr = v[tn.coord(p.index(), 0), tn.shape(1, n)]
            for r in p.reduce(xr.domain(xr.dim(1)), contract=osm, policy=tn.unordered_tree):
                m, s, a = merge(m, s, a, xr.at(r), 1.0, vr.at(r))
            out(tn.coord(p.index()), tn.shape(1)).store(a / s)

    return average


#: the online-softmax merge, guarded: lawful, with identity (-inf, 0, 0)
softmax_average = _softmax_average("online_softmax", softmax_merge)
#: unguarded: merging two empty states is NaN, so the identity law fails
unguarded_softmax_average = _softmax_average("online_softmax_unguarded", unguarded_softmax_merge)
#: not rescaling the second state: not associative
unscaled_softmax_average = _softmax_average("online_softmax_unscaled", unscaled_softmax_merge)
