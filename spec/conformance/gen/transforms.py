"""Cases for spec/transforms.md (T-1 .. T-10).

A transform relates two programs; a conformance case holds one. Positive cases
are legally transformed programs; negative cases are illegal ones: they race,
fail to verify, or are wrong companions (an illegal transform of the case's
program) whose outputs the case's oracle rejects.
"""

from __future__ import annotations

import tilenest as tn
from tilenest import f32, i32
from common import CASES, arange, case, mutate, normal, out, t, text_case, values

F = "f32"

# ---------------------------------------------------------------- T-1 remaps


@case("T01-tiled-with-guard", "T-1", "a split remap with a guard: a bijection onto the old points",
      [t("x", F, [10], arange(1)), out("y", F, [10])])
@tn.kernel
def t01_tiled(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, b=4):
    (n,) = x.shape
    for q in tn.parallel(tn.shape(tn.cdiv(n, b))):
        for r in q.parallel(tn.shape(b)):
            i = q.index() * b + r.index()
            if tn.if_(i < n):
                y(tn.coord(i), tn.shape(1)).store(x[tn.coord(i), tn.shape(1)] + 1.0)


@tn.kernel
def t01_floor(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, b=4):
    (n,) = x.shape
    for q in tn.parallel(tn.shape(n // b)):                       # not onto: the tail is lost
        for r in q.parallel(tn.shape(b)):
            i = q.index() * b + r.index()
            y(tn.coord(i), tn.shape(1)).store(x[tn.coord(i), tn.shape(1)] + 1.0)


CASES[-1].wrong = t01_floor


@case("T01-replicating-remap", "T-1", "a remap sending two new points to one old store: race",
      [t("x", F, [8], arange(1)), out("y", F, [8])], "race")
@tn.kernel
def t01_replicate(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for q in tn.parallel(tn.shape(2, 8)):
        i = q.index(1)
        y(tn.coord(i), tn.shape(1)).store(x[tn.coord(i), tn.shape(1)] + 1.0)


# ---------------------------------------------------------------- T-2 kinds of remap


@case("T02-coalesce", "T-2", "(a, b) -> 3a + b re-factors a domain of 6",
      [t("x", F, [6], normal(1)), out("y", F, [6])])
@tn.kernel
def t02_reshaped(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(2, 3)):
        i = p.index(0) * 3 + p.index(1)
        y(tn.coord(i), tn.shape(1)).store(x[tn.coord(i), tn.shape(1)] * 2.0)


@tn.kernel
def t02_wrong_radix(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(2, 2)):                        # cardinality not preserved
        i = p.index(0) * 3 + p.index(1)
        y(tn.coord(i), tn.shape(1)).store(x[tn.coord(i), tn.shape(1)] * 2.0)


CASES[-1].wrong = t02_wrong_radix


@case("T02-permute-levels", "T-2", "permuting the axes of a parallel domain",
      [t("x", F, [2, 3], arange()), out("y", F, [2, 3])])
@tn.kernel
def t02_permuted(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    for p in tn.parallel(tn.shape(3, 2)):
        c = tn.coord(p.index(1), p.index(0))
        y(c, tn.shape(1, 1)).store(x[c, tn.shape(1, 1)] - 1.0)


# ---------------------------------------------------------------- T-3 prefix cuts


@case("T03-split-below-cut", "T-3", "splitting below the home of acc keeps the cut",
      [t("x", F, [3, 4], arange()), out("y", F, [3, 4])])
@tn.kernel
def t03_rows_split(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    for p in tn.parallel(tn.shape(3)):
        acc = tn.zeros(f32, tn.shape(1, 4), dims=x.dims())
        for q1 in p.parallel(tn.shape(2)):
            for q2 in q1.parallel(tn.shape(2)):
                c = q1.index() * 2 + q2.index()
                acc = tn.put(acc, tn.coord(0, c), x[tn.coord(p.index(), c), tn.shape(1, 1)])
        y(tn.coord(p.index(), 0), tn.shape(1, 4)).store(acc * 2.0)


@case("T03-cut-not-factored", "T-3", "the inner split depends on the deeper coordinate only: the "
      "patches of different q1 collide", [t("x", F, [3, 4], arange()), out("y", F, [3, 4])], "race")
@tn.kernel
def t03_broken(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    for p in tn.parallel(tn.shape(3)):
        acc = tn.zeros(f32, tn.shape(1, 4), dims=x.dims())
        for q1 in p.parallel(tn.shape(2)):
            for q2 in q1.parallel(tn.shape(2)):
                c = q2.index() * 2                               # forgets q1
                acc = tn.put(acc, tn.coord(0, c), x[tn.coord(p.index(), c), tn.shape(1, 1)])
        y(tn.coord(p.index(), 0), tn.shape(1, 4)).store(acc * 2.0)


# ---------------------------------------------------------------- T-4 identity cuts


@case("T04-home-kept", "T-4", "acc stays one per row: the identity cut is a bijection",
      [t("x", F, [3, 4], arange()), out("y", F, [3, 4])])
@tn.kernel
def t04_rows(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    for p in tn.parallel(tn.shape(3)):
        acc = tn.zeros(f32, tn.shape(1, 4), dims=x.dims())
        for q in p.parallel(tn.shape(4)):
            acc = tn.put(acc, tn.coord(0, q.index()), x[tn.coord(p.index(), q.index()),
                                                        tn.shape(1, 1)])
        y(tn.coord(p.index(), 0), tn.shape(1, 4)).store(acc * 2.0)


@case("T04-home-replicated", "T-4", "levels permuted: four copies of each row's acc store it",
      [t("x", F, [3, 4], arange()), out("y", F, [3, 4])], "race")
@tn.kernel
def t04_swapped(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    for a in tn.parallel(tn.shape(4)):
        for b in a.parallel(tn.shape(3)):
            acc = tn.zeros(f32, tn.shape(1, 4), dims=x.dims())
            acc = tn.put(acc, tn.coord(0, a.index()), x[tn.coord(b.index(), a.index()),
                                                        tn.shape(1, 1)])
            y(tn.coord(b.index(), 0), tn.shape(1, 4)).store(acc * 2.0)


# ---------------------------------------------------------------- T-5 rewriting


@case("T05-fused-grid", "T-5", "Access' = Access o tau with tau(f) = (f div 3, f mod 3)",
      [t("x", F, [2, 3], normal(2)), out("y", F, [2, 3])])
@tn.kernel
def t05_fused(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    for f in tn.parallel(tn.shape(6)):
        c = tn.coord(f.index() // 3, f.index() % 3)
        y(c, tn.shape(1, 1)).store(x[c, tn.shape(1, 1)] * 3.0)


@tn.kernel
def t05_mixed_up(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    for f in tn.parallel(tn.shape(6)):
        y(tn.coord(f.index() // 3, f.index() % 3), tn.shape(1, 1)).store(
            x[tn.coord(f.index() % 2, f.index() // 2), tn.shape(1, 1)] * 3.0)    # tau^-1 misused


CASES[-1].wrong = t05_mixed_up

# ---------------------------------------------------------------- T-6 bindings


@case("T06-contained-scopes", "T-6", "cluster > block > warp > thread nests",
      [t("x", F, [2, 2, 2, 2], arange()), out("y", F, [2, 2, 2, 2])])
@tn.kernel
def t06_nested(x: tn.Tensor[f32, 4], y: tn.Tensor[f32, 4]):
    for a in tn.parallel(tn.shape(2), exec=tn.exec.cluster):
        for b in a.parallel(tn.shape(2), exec=tn.exec.block):
            for c in b.parallel(tn.shape(2), exec=tn.exec.warp):
                for d in c.parallel(tn.shape(2), exec=tn.exec.thread):
                    o = tn.coord(a.index(), b.index(), c.index(), d.index())
                    y(o, tn.shape(1, 1, 1, 1)).store(x[o, tn.shape(1, 1, 1, 1)] + 0.5)


text_case("T06-vector-above-core", "T-6", "vector cannot contain core in any family",
          mutate(t06_nested, ("exec = exec(scope = cluster)", "exec = exec(scope = vector)"),
                 ("exec = exec(scope = block)", "exec = exec(scope = core)")),
          [t("x", F, [2, 2, 2, 2], arange()), out("y", F, [2, 2, 2, 2])], "verify")

# ---------------------------------------------------------------- T-7 strength


@case("T07-serial-recurrence", "T-7", "a recurrence written serial", [t("y", F, [5], values(1, 0, 0,
                                                                                          0, 0))])
@tn.kernel
def t07_serial(y: tn.Tensor[f32, 1]):
    (n,) = y.shape
    for it in tn.serial(tn.shape(n - 1)):
        prev = y[tn.coord(it.index()), tn.shape(1)]
        y(tn.coord(it.index() + 1), tn.shape(1)).store(prev * 2.0 + 1.0)


@case("T07-recurrence-as-parallel", "T-7", "the same recurrence as parallel: race",
      [t("y", F, [5], values(1, 0, 0, 0, 0))], "race")
@tn.kernel
def t07_parallel(y: tn.Tensor[f32, 1]):
    (n,) = y.shape
    for it in tn.parallel(tn.shape(n - 1)):
        prev = y[tn.coord(it.index()), tn.shape(1)]
        y(tn.coord(it.index() + 1), tn.shape(1)).store(prev * 2.0 + 1.0)


@case("T07-parallel-as-serial", "T-7", "a valid parallel realized as serial keeps its result",
      [t("x", F, [5], normal(5)), out("y", F, [5])])
@tn.kernel
def t07_par_serial(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for it in tn.serial(tn.shape(n), order="reverse"):
        y(tn.coord(it.index()), tn.shape(1)).store(x[tn.coord(it.index()), tn.shape(1)] * 4.0)


# ---------------------------------------------------------------- T-8 fusion


@case("T08-diagonal-fusion", "T-8", "Dep = {(i, i)}: the fused pointwise program",
      [t("x", F, [4], values(1, 2, 3, 4)), out("tmp", F, [4]), out("y", F, [4])])
@tn.kernel
def t08_pointwise(x: tn.Tensor[f32, 1], tmp: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        i = tn.coord(p.index())
        tmp(i, tn.shape(1)).store(x[i, tn.shape(1)] + 1.0)
        y(i, tn.shape(1)).store(tmp[i, tn.shape(1)] * 2.0)


@case("T08-shifted-fusion", "T-8", "a shifted consumer fused into its producer: race",
      [t("x", F, [4], values(1, 2, 3, 4)), out("tmp", F, [4]), out("y", F, [4])], "race")
@tn.kernel
def t08_shifted(x: tn.Tensor[f32, 1], tmp: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        tmp(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] + 1.0)
        y(tn.coord(p.index()), tn.shape(1)).store(tmp[tn.coord((p.index() + 1) % n),
                                                      tn.shape(1)])


# ---------------------------------------------------------------- T-9 factoring a reduction


@case("T09-blocked-reduction", "T-9", "partials merged once; the seed enters once",
      [t("x", "i32", [10], arange(1)), out("y", "i32", [1])])
@tn.kernel
def t09_blocked(x: tn.Tensor[i32, 1], y: tn.Tensor[i32, 1], *, b=4):
    (n,) = x.shape
    total = tn.full(i32, tn.shape(1), 1000, dims=x.dims())
    for blk in tn.reduce(tn.shape(tn.cdiv(n, b))):
        part = x[tn.coord(blk.index() * b), tn.shape(b)]
        total = total + tn.broadcast(tn.reduce(part, part.dim(0), tn.add), tn.shape(1),
                                     dims=x.dims())
    y(tn.coord(0), tn.shape(1)).store(total)


@tn.kernel
def t09_seed_per_block(x: tn.Tensor[i32, 1], y: tn.Tensor[i32, 1], *, b=4):
    (n,) = x.shape
    total = tn.zeros(i32, tn.shape(1), dims=x.dims())
    for blk in tn.reduce(tn.shape(tn.cdiv(n, b))):
        part = x[tn.coord(blk.index() * b), tn.shape(b)]
        total = total + tn.broadcast(tn.reduce(part, part.dim(0), tn.add) + 1000, tn.shape(1),
                                     dims=x.dims())
    y(tn.coord(0), tn.shape(1)).store(total)


CASES[-1].wrong = t09_seed_per_block


@case("T09-float-partials", "T-9", "factored float sums stay within the tree envelope",
      [t("x", F, [37], {"pattern": "cancel", "seed": 9}), out("y", F, [1])])
@tn.kernel
def t09_float(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, b=8):
    (n,) = x.shape
    total = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for blk in tn.reduce(tn.shape(tn.cdiv(n, b))):
        part = x[tn.coord(blk.index() * b), tn.shape(b)]
        total = total + tn.broadcast(tn.reduce(part, part.dim(0), tn.add), tn.shape(1),
                                     dims=x.dims())
    y(tn.coord(0), tn.shape(1)).store(total)


# ---------------------------------------------------------------- T-10 obligations


@case("T10-split-exact-when-b-divides-n", "T-10", "the floor split covers n = 8 exactly",
      [t("x", F, [8], arange()), out("y", F, [8])])
@tn.kernel
def t10_split(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, b=4):
    (n,) = x.shape
    for q in tn.parallel(tn.shape(n // b)):
        for r in q.parallel(tn.shape(b)):
            i = tn.coord(q.index() * b + r.index())
            y(i, tn.shape(1)).store(x[i, tn.shape(1)] + 1.0)


@tn.kernel
def t10_flat(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] + 1.0)


case("T10-agreeing-sizes-prove-nothing", "T-10",
     "n = 10 is a counterexample: the flat program's oracle rejects the floor split",
     [t("x", F, [10], arange()), out("y", F, [10])], wrong=t10_split)(t10_flat)
