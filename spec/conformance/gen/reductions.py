"""Cases for spec/reductions.md (R-1 .. R-15)."""

from __future__ import annotations

import tilenest as tn
from tilenest import bf16, f32, i32, i64
from common import (CASES, arange, cancel, case, ints, mutate, normal, out, t, text_case,
                    values)

F = "f32"

# ---------------------------------------------------------------- R-1 reduce regions


@case("R01-reduce-states", "R-1", "a variable assigned in the body is a state; the seed is its entry",
      [t("x", "i32", [10], arange(1)), out("y", "i32", [1])])
@tn.kernel
def r01_reduce(x: tn.Tensor[i32, 1], y: tn.Tensor[i32, 1]):
    (n,) = x.shape
    total = tn.zeros(i32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n)):
        item = x[tn.coord(r.index()), tn.shape(1)]
        total = total + item
    y(tn.coord(0), tn.shape(1)).store(total)


@case("R01-parallel-is-not-reduce", "R-1", "accumulating from parallel instances overlaps: race",
      [t("x", "i32", [10], arange(1)), out("y", "i32", [1])], "race")
@tn.kernel
def r01_parallel(x: tn.Tensor[i32, 1], y: tn.Tensor[i32, 1]):
    (n,) = x.shape
    total = tn.zeros(i32, tn.shape(1), dims=x.dims())
    for p in tn.parallel(tn.shape(n)):
        total = total + x[tn.coord(p.index()), tn.shape(1)]
    y(tn.coord(0), tn.shape(1)).store(total)


# ---------------------------------------------------------------- R-2 source order


@case("R02-source-order-2d", "R-2", "contributions in lexicographic order, first axis slowest",
      [t("x", "i64", [2, 3], values(1, 2, 3, 4, 5, 6)), out("y", "i64", [1, 1])])
@tn.kernel
def r02_digits(x: tn.Tensor[i64, 2], y: tn.Tensor[i64, 2]):
    acc = tn.zeros(i64, tn.shape(1, 1), dims=x.dims())
    for r in tn.reduce(tn.shape(2, 3), policy=tn.fold_left):
        acc = acc * 10 + x[tn.coord(r.index(0), r.index(1)), tn.shape(1, 1)]
    y(tn.coord(0, 0), tn.shape(1, 1)).store(acc)


@tn.kernel
def r02_colmajor(x: tn.Tensor[i64, 2], y: tn.Tensor[i64, 2]):
    acc = tn.zeros(i64, tn.shape(1, 1), dims=x.dims())
    for r in tn.reduce(tn.shape(3, 2), policy=tn.fold_left):
        acc = acc * 10 + x[tn.coord(r.index(1), r.index(0)), tn.shape(1, 1)]
    y(tn.coord(0, 0), tn.shape(1, 1)).store(acc)


CASES[-1].wrong = r02_colmajor


@case("R02-fibers-independent", "R-2", "each point of a state's space has its own fiber",
      [t("x", F, [3, 5], normal(2)), out("y", F, [3])])
@tn.kernel
def r02_fibers(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 1]):
    r_, c = x.dims()
    y = y.with_dims(r_)
    acc = tn.zeros(f32, tn.shape(3), dims=(r_,))
    for r in tn.reduce(tn.shape(5), policy=tn.fold_left):
        col = x[tn.coord(0, r.index()), tn.shape(3, 1)]
        acc = acc + tn.reduce(col, c, tn.add)
    y(tn.coord(0), tn.shape(3)).store(acc)


# ---------------------------------------------------------------- R-3 strict folds


@case("R03-fold-orientations", "R-3", "fold_right keeps the written operand orientation",
      [t("x", F, [3], values(1, 2, 3)), out("o", F, [2])])
@tn.kernel
def r03_folds(x: tn.Tensor[f32, 1], o: tn.Tensor[f32, 1]):
    (n,) = x.shape
    left = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_left):
        left = left - x[tn.coord(r.index()), tn.shape(1)]
    right = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_right):
        right = x[tn.coord(r.index()), tn.shape(1)] - right
    o(tn.coord(0), tn.shape(1)).store(left)
    o(tn.coord(1), tn.shape(1)).store(right)


@tn.kernel
def r03_swapped(x: tn.Tensor[f32, 1], o: tn.Tensor[f32, 1]):
    (n,) = x.shape
    left = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_left):
        left = left - x[tn.coord(r.index()), tn.shape(1)]
    right = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_right):
        right = right - x[tn.coord(r.index()), tn.shape(1)]      # operands swapped
    o(tn.coord(0), tn.shape(1)).store(left)
    o(tn.coord(1), tn.shape(1)).store(right)


CASES[-1].wrong = r03_swapped


@case("R03-fold-left-bitwise", "R-3", "fold_left on cancelling floats is one exact order",
      [t("x", F, [64], cancel(3)), out("o", F, [1])])
@tn.kernel
def r03_fold_sum(x: tn.Tensor[f32, 1], o: tn.Tensor[f32, 1]):
    (n,) = x.shape
    s = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_left):
        s = s + x[tn.coord(r.index()), tn.shape(1)]
    o(tn.coord(0), tn.shape(1)).store(s)


@tn.kernel
def r03_fold_reversed(x: tn.Tensor[f32, 1], o: tn.Tensor[f32, 1]):
    (n,) = x.shape
    s = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_right):
        s = s + x[tn.coord(r.index()), tn.shape(1)]
    o(tn.coord(0), tn.shape(1)).store(s)


CASES[-1].wrong = r03_fold_reversed

# ---------------------------------------------------------------- R-4 empty domains


@case("R04-empty-returns-seed", "R-4", "no contribution: the seed, under tree and fold",
      [t("x", F, [0], values()), out("o", F, [2])])
@tn.kernel
def r04_nothing(x: tn.Tensor[f32, 1], o: tn.Tensor[f32, 1]):
    (n,) = x.shape
    a = tn.full(f32, tn.shape(1), 7.0, dims=x.dims())
    for r in tn.reduce(tn.shape(n)):
        a = a + x[tn.coord(r.index()), tn.shape(1)]
    b = tn.full(f32, tn.shape(1), 7.0, dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_right):
        b = x[tn.coord(r.index()), tn.shape(1)] - b
    o(tn.coord(0), tn.shape(1)).store(a)
    o(tn.coord(1), tn.shape(1)).store(b)


@tn.kernel
def r04_identity(x: tn.Tensor[f32, 1], o: tn.Tensor[f32, 1]):
    (n,) = x.shape
    a = tn.full(f32, tn.shape(1), -0.0, dims=x.dims())          # as if the identity replaced it
    for r in tn.reduce(tn.shape(n)):
        a = a + x[tn.coord(r.index()), tn.shape(1)]
    b = tn.full(f32, tn.shape(1), 7.0, dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_right):
        b = x[tn.coord(r.index()), tn.shape(1)] - b
    o(tn.coord(0), tn.shape(1)).store(a)
    o(tn.coord(1), tn.shape(1)).store(b)


CASES[-1].wrong = r04_identity

# ---------------------------------------------------------------- R-5 contracts


@case("R05-recognized-updates", "R-5", "c + s, maximum(c, s) and xor are recognized contracts",
      [t("x", "i32", [6], ints(4, -50, 50)), out("o", "i32", [3])])
@tn.kernel
def r05_shapes(x: tn.Tensor[i32, 1], o: tn.Tensor[i32, 1]):
    (n,) = x.shape
    a = tn.zeros(i32, tn.shape(1), dims=x.dims())
    m = tn.full(i32, tn.shape(1), -1000, dims=x.dims())
    z = tn.zeros(i32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n)):
        v = x[tn.coord(r.index()), tn.shape(1)]
        a = v + a
        m = tn.maximum(v, m)
        z = z ^ v
    o(tn.coord(0), tn.shape(1)).store(a)
    o(tn.coord(1), tn.shape(1)).store(m)
    o(tn.coord(2), tn.shape(1)).store(z)


text_case("R05-tree-without-contract", "R-5", "a tree policy over an update with no contract",
          mutate(r03_fold_sum, ("policy = fold_left, contracts = [add]",
                                "policy = unordered_tree, contracts = [none]")),
          [t("x", F, [64], cancel(3)), out("o", F, [1])], "contract")

text_case("R05-contract-disagrees", "R-5", "an explicit add contract on a subtraction update",
          mutate(r03_fold_sum, ("policy = fold_left, contracts = [add]",
                                "policy = unordered_tree, contracts = [add]"),
                 ("%s_2 = add %s_1, %", "%s_2 = sub %s_1, %")),
          [t("x", F, [64], cancel(3)), out("o", F, [1])], "contract")

# ---------------------------------------------------------------- R-6 tree admitted sets


@case("R06-seed-once", "R-6", "the seed occurs exactly once in every admitted tree",
      [t("x", "i32", [4], values(1, 2, 3, 4)), out("o", "i32", [1])])
@tn.kernel
def r06_seeded(x: tn.Tensor[i32, 1], o: tn.Tensor[i32, 1]):
    (n,) = x.shape
    s = tn.full(i32, tn.shape(1), 100, dims=x.dims())
    for r in tn.reduce(tn.shape(n)):
        s = s + x[tn.coord(r.index()), tn.shape(1)]
    o(tn.coord(0), tn.shape(1)).store(s)


@tn.kernel
def r06_seed_per_block(x: tn.Tensor[i32, 1], o: tn.Tensor[i32, 1]):
    s = tn.full(i32, tn.shape(1), 200, dims=x.dims())           # seed merged into two partials
    for r in tn.reduce(tn.shape(4)):
        s = s + x[tn.coord(r.index()), tn.shape(1)]
    o(tn.coord(0), tn.shape(1)).store(s)


CASES[-1].wrong = r06_seed_per_block


@case("R06-ordered-tree-float", "R-6", "ordered_tree regroups in order; result in the envelope",
      [t("x", F, [40], cancel(5)), out("o", F, [1])])
@tn.kernel
def r06_ordered(x: tn.Tensor[f32, 1], o: tn.Tensor[f32, 1]):
    (n,) = x.shape
    s = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.ordered_tree):
        s = s + x[tn.coord(r.index()), tn.shape(1)]
    o(tn.coord(0), tn.shape(1)).store(s)


# ---------------------------------------------------------------- R-7 exact contracts


@case("R07-exact-int-and-max", "R-7", "integer add wraps exactly; float max orders signed zeros",
      [t("a", "i32", [3], values(2147483647, 1, -1)), t("b", F, [3], values("-0.0", 0.0, "-0.0")),
       out("s", "i32", [1]), out("m", F, [1])])
@tn.kernel
def r07_exact(a: tn.Tensor[i32, 1], b: tn.Tensor[f32, 1], s: tn.Tensor[i32, 1],
              m: tn.Tensor[f32, 1]):
    total = tn.zeros(i32, tn.shape(1), dims=a.dims())
    for r in tn.reduce(tn.shape(3)):
        total = total + a[tn.coord(r.index()), tn.shape(1)]
    hi = b[tn.coord(0), tn.shape(1)]
    for r in tn.reduce(tn.shape(3)):
        hi = tn.maximum(hi, b[tn.coord(r.index()), tn.shape(1)])
    s(tn.coord(0), tn.shape(1)).store(total)
    m(tn.coord(0), tn.shape(1)).store(hi)


@tn.kernel
def r07_compare_max(a: tn.Tensor[i32, 1], b: tn.Tensor[f32, 1], s: tn.Tensor[i32, 1],
                    m: tn.Tensor[f32, 1]):
    total = tn.zeros(i32, tn.shape(1), dims=a.dims())
    for r in tn.reduce(tn.shape(3)):
        total = total + a[tn.coord(r.index()), tn.shape(1)]
    hi = b[tn.coord(0), tn.shape(1)]
    for r in tn.reduce(tn.shape(3), policy=tn.fold_left):
        v = b[tn.coord(r.index()), tn.shape(1)]
        hi = tn.ite(v > hi, v, hi)                  # keeps the first zero: -0.0
    s(tn.coord(0), tn.shape(1)).store(total)
    m(tn.coord(0), tn.shape(1)).store(hi)


CASES[-1].wrong = r07_compare_max


@case("R07-empty-float-sum-is-negative-zero", "R-7", "the add identity is -0.0",
      [t("x", F, [1, 0], values()), out("z", F, [1])])
@tn.kernel
def r07_empty(x: tn.Tensor[f32, 2], z: tn.Tensor[f32, 1]):
    e = x[tn.coord(0, 0), tn.shape(1, 0)]
    z(tn.coord(0), tn.shape(1)).store(tn.broadcast(tn.reduce(e, e.dims(), tn.add), tn.shape(1),
                                                   dims=z.dims()))


# ---------------------------------------------------------------- R-8 float envelope


@case("R08-tree-envelope", "R-8", "a reordered float sum is admitted within gamma_N * sum|x|",
      [t("x", F, [4, 257], cancel(7)), out("y", F, [4])])
@tn.kernel
def r08_rows(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 1]):
    rows, cols = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        y(tn.coord(p.index()), tn.shape(1)).store(tn.reduce(row, row.dim(1), tn.add))


@tn.kernel
def r08_bf16_sum(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 1]):
    rows, cols = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        row = tn.cast(tn.cast(x[tn.coord(p.index(), 0), tn.shape(1, cols)], bf16), f32)
        y(tn.coord(p.index()), tn.shape(1)).store(tn.reduce(row, row.dim(1), tn.add))


CASES[-1].wrong = r08_bf16_sum


@case("R08-infinities", "R-8", "one-signed infinities admit only that infinity; NaN leaves NaN",
      [t("x", F, [3, 4], values(1, "inf", 2, 3, "-inf", 1, "inf", 0, "nan", 1, 2, 3)),
       out("y", F, [3])])
@tn.kernel
def r08_specials(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 1]):
    y = y.with_dims(x.dim(0))
    t_ = x[tn.coord(0, 0), tn.shape(3, 4)]
    y(tn.coord(0), tn.shape(3)).store(tn.reduce(t_, t_.dim(1), tn.add))


# ---------------------------------------------------------------- R-9 mma in reduce


@case("R09-mma-with-add-contract", "R-9", "contract=tn.add admits reordering mma contributions",
      [t("a", F, [4, 12], normal(8)), t("b", F, [12, 3], normal(9)), out("c", F, [4, 3])])
@tn.kernel
def r09_gemm(a: tn.Tensor[f32, 2], b: tn.Tensor[f32, 2], c: tn.Tensor[f32, 2], *, bk=4):
    m, k = a.dims()
    b = b.with_dims(k, c.dim(1))
    acc = tn.zeros(f32, tn.shape(4, 3), dims=(m, c.dim(1)))
    for kk in tn.reduce(tn.shape(3), contract=tn.add):
        acc = tn.mma(a[tn.coord(0, kk.index() * bk), tn.shape(4, bk)],
                     b[tn.coord(kk.index() * bk, 0), tn.shape(bk, 3)], acc)
    c(tn.coord(0, 0), tn.shape(4, 3)).store(acc)


text_case("R09-mma-tree-without-contract", "R-9", "mma alone grants no reordering of the fold",
          mutate(r09_gemm, ("policy = unordered_tree, contracts = [add]",
                            "policy = unordered_tree, contracts = [none]")),
          [t("a", F, [4, 12], normal(8)), t("b", F, [12, 3], normal(9)), out("c", F, [4, 3])],
          "contract")

# ---------------------------------------------------------------- R-10 several states


@case("R10-product-reducer", "R-10", "two independent states, each with its own contract",
      [t("x", "i32", [5], values(3, 9, 4, -2, 9)), out("o", "i32", [2])])
@tn.kernel
def r10_stats(x: tn.Tensor[i32, 1], o: tn.Tensor[i32, 1]):
    (n,) = x.shape
    s = tn.zeros(i32, tn.shape(1), dims=x.dims())
    m = x[tn.coord(0), tn.shape(1)]
    for r in tn.reduce(tn.shape(n)):
        v = x[tn.coord(r.index()), tn.shape(1)]
        s = s + v
        m = tn.maximum(m, v)
    o(tn.coord(0), tn.shape(1)).store(s)
    o(tn.coord(1), tn.shape(1)).store(m)


@case("R10-coupled-fold", "R-10", "a state reading another state is fine under a fold",
      [t("x", "i32", [5], values(3, 9, 4, -2, 9)), out("o", "i32", [2])])
@tn.kernel
def r10_coupled(x: tn.Tensor[i32, 1], o: tn.Tensor[i32, 1]):
    (n,) = x.shape
    s = tn.zeros(i32, tn.shape(1), dims=x.dims())
    w = tn.zeros(i32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_left):
        v = x[tn.coord(r.index()), tn.shape(1)]
        w = w + s * v
        s = s + v
    o(tn.coord(0), tn.shape(1)).store(s)
    o(tn.coord(1), tn.shape(1)).store(w)


text_case("R10-state-without-contract", "R-10", "under a tree each state needs its own contract",
          mutate(r10_coupled, ("policy = fold_left, contracts = [add, none]",
                               "policy = unordered_tree, contracts = [add, none]")),
          [t("x", "i32", [5], values(3, 9, 4, -2, 9)), out("o", "i32", [2])], "contract")

text_case("R10-coupled-under-tree", "R-10", "a coupled state under a tree policy",
          mutate(r10_coupled, ("policy = fold_left, contracts = [add, none]",
                               "policy = unordered_tree, contracts = [add, add]")),
          [t("x", "i32", [5], values(3, 9, 4, -2, 9)), out("o", "i32", [2])], "contract")

# ---------------------------------------------------------------- R-11 custom reducers


@case("R11-custom-first-set", "R-11", "a declared associative, non-commutative reducer, ordered",
      [t("x", "i32", [6], values(-1, 7, -1, 5, -1, 3)), out("o", "i32", [1])])
@tn.kernel
def r11_first(x: tn.Tensor[i32, 1], o: tn.Tensor[i32, 1]):
    (n,) = x.shape
    first = tn.reducer("first", identity=-1, merge=lambda a, b: tn.ite(a != -1, a, b),
                       dtype=i32, associative=True, commutative=False)
    s = tn.full(i32, tn.shape(1), -1, dims=x.dims())
    for r in tn.reduce(tn.shape(n), contract=first, policy=tn.ordered_tree):
        v = x[tn.coord(r.index()), tn.shape(1)]
        s = tn.ite(s != -1, s, v)
    o(tn.coord(0), tn.shape(1)).store(s)


@tn.kernel
def r11_last(x: tn.Tensor[i32, 1], o: tn.Tensor[i32, 1]):
    (n,) = x.shape
    last = tn.reducer("last", identity=-1, merge=lambda a, b: tn.ite(b != -1, b, a),
                      dtype=i32, associative=True, commutative=False)
    s = tn.full(i32, tn.shape(1), -1, dims=x.dims())
    for r in tn.reduce(tn.shape(n), contract=last, policy=tn.ordered_tree):
        v = x[tn.coord(r.index()), tn.shape(1)]
        s = tn.ite(v != -1, v, s)
    o(tn.coord(0), tn.shape(1)).store(s)


CASES[-1].wrong = r11_last

text_case("R11-unordered-needs-commutative", "R-11",
          "unordered_tree with a reducer declared non-commutative",
          mutate(r11_first, ("policy = ordered_tree", "policy = unordered_tree")),
          [t("x", "i32", [6], values(-1, 7, -1, 5, -1, 3)), out("o", "i32", [1])], "contract")


@case("R11-custom-with-lift-tuple", "R-11", "a tuple state (sum, count) with a lift",
      [t("x", F, [6], values(1, 2, 3, 4, 5, 6)), out("o", F, [2])])
@tn.kernel
def r11_mean(x: tn.Tensor[f32, 1], o: tn.Tensor[f32, 1]):
    (n,) = x.shape
    acc = tn.reducer("sumcount", identity=(0.0, 0.0),
                     merge=lambda a0, a1, b0, b1: (a0 + b0, a1 + b1), dtype=(f32, f32),
                     associative=True, commutative=True)
    s = tn.zeros(f32, tn.shape(1), dims=x.dims())
    c = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), contract=acc, policy=tn.fold_left):
        v = x[tn.coord(r.index()), tn.shape(1)]
        s = s + v
        c = c + 1.0
    o(tn.coord(0), tn.shape(1)).store(s)
    o(tn.coord(1), tn.shape(1)).store(c)


# ---------------------------------------------------------------- R-12 effects in the body


@case("R12-fold-stores-states", "R-12", "a fold body may store its intermediate states",
      [t("x", "i32", [4], values(1, 2, 3, 4)), out("y", "i32", [4])])
@tn.kernel
def r12_running(x: tn.Tensor[i32, 1], y: tn.Tensor[i32, 1]):
    (n,) = x.shape
    s = tn.zeros(i32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_left):
        s = s + x[tn.coord(r.index()), tn.shape(1)]
        y(tn.coord(r.index()), tn.shape(1)).store(s)


@tn.kernel
def r12_reverse_stores(x: tn.Tensor[i32, 1], y: tn.Tensor[i32, 1]):
    (n,) = x.shape
    s = tn.zeros(i32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_right):
        s = s + x[tn.coord(r.index()), tn.shape(1)]
        y(tn.coord(r.index()), tn.shape(1)).store(s)


CASES[-1].wrong = r12_reverse_stores

text_case("R12-tree-body-stores", "R-12", "a tree body has no order for its stores",
          mutate(r12_running, ("policy = fold_left, contracts = [add]",
                               "policy = unordered_tree, contracts = [add]")),
          [t("x", "i32", [4], values(1, 2, 3, 4)), out("y", "i32", [4])], "contract")

# ---------------------------------------------------------------- R-13 expression reductions


@case("R13-expression-reduce", "R-13", "tn.reduce over a dim keeps the others in order",
      [t("x", F, [2, 3, 4], normal(10)), out("y", F, [2, 4]), out("z", F, [3])])
@tn.kernel
def r13_expr(x: tn.Tensor[f32, 3], y: tn.Tensor[f32, 2], z: tn.Tensor[f32, 1]):
    a, b, c = x.dims()
    v = x[tn.coord(0, 0, 0), tn.shape(2, 3, 4)]
    y(tn.coord(0, 0), tn.shape(2, 4)).store(tn.reduce(v, b, tn.maximum))
    z(tn.coord(0), tn.shape(3)).store(tn.reduce(v, (a, c), tn.minimum))


text_case("R13-reducer-dtype", "R-13", "add is not defined on bool",
          "kernel @r13_bool(%x: tensor<bool, [#x_0:x_0]>, %y: tensor<bool, [#y_0:y_0]>)\n"
          "    syms [x_0, y_0] assume [] dims [#x_0 = \"x.0\", #y_0 = \"y.0\", #d] {\n"
          "  %v = tensor.load %x {vars = ($0), map = ($0), valid = true, bounds = zero} : "
          "tile<bool, [#x_0:4]>\n"
          "  %0 = const {value = false} : bool\n"
          "  %s = reduce %0 {vars = ($r), domain = {($r) in [#x_0:4]}, policy = unordered_tree, "
          "contracts = [add]} : bool {\n"
          "  ^(%a: bool):\n"
          "    %1 = reindex %v {vars = (), map = ($r)} : bool\n"
          "    %2 = add %a, %1 : bool\n"
          "    yield %2\n"
          "  }\n"
          "  %b = broadcast %s : tile<bool, [#y_0:1]>\n"
          "  tensor.store %y, %b {vars = ($0), map = ($0), valid = true, bounds = zero}\n}\n",
          [t("x", "bool", [4], values(1, 0, 1, 1)), out("y", "bool", [1])], "type")

# ---------------------------------------------------------------- R-14 scans


@case("R14-cumsum-fold", "R-14", "inclusive prefix sums, strict left fold",
      [t("x", F, [2, 9], cancel(11)), out("y", F, [2, 9])])
@tn.kernel
def r14_prefix(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    v = x[tn.coord(0, 0), tn.shape(rows, cols)]
    y(tn.coord(0, 0), tn.shape(rows, cols)).store(tn.cumsum(v, v.dim(1)))


@tn.kernel
def r14_exclusive(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    v = x[tn.coord(0, 0), tn.shape(rows, cols)]
    y(tn.coord(0, 0), tn.shape(rows, cols)).store(tn.cumsum(v, v.dim(1)) - v)


CASES[-1].wrong = r14_exclusive


@case("R14-cumsum-ordered-tree", "R-14", "an ordered-tree scan of small integers",
      [t("x", "i32", [8], ints(12, -9, 9)), out("y", "i32", [8])])
@tn.kernel
def r14_tree(x: tn.Tensor[i32, 1], y: tn.Tensor[i32, 1]):
    v = x[tn.coord(0), tn.shape(8)]
    y(tn.coord(0), tn.shape(8)).store(tn.cumsum(v, v.dim(0), policy=tn.ordered_tree))


# ---------------------------------------------------------------- R-15 selection


@case("R15-sort-topk-argmax", "R-15", "stable order, NaN last, ties by index, argmax NaN first",
      [t("x", F, [7], values(2, "nan", 5, 5, -1, "-0.0", 0.0)), out("s", F, [7]),
       out("si", "i64", [7]), out("top", "i64", [3]), out("am", "i64", [1])])
@tn.kernel
def r15_order(x: tn.Tensor[f32, 1], s: tn.Tensor[f32, 1], si: tn.Tensor[i64, 1],
              top: tn.Tensor[i64, 1], am: tn.Tensor[i64, 1]):
    v = x[tn.coord(0), tn.shape(7)]
    vals, idx = tn.sort(v, v.dim(0))
    s(tn.coord(0), tn.shape(7)).store(vals)
    si(tn.coord(0), tn.shape(7)).store(idx)
    best, where = tn.topk(v, v.dim(0), 3)
    top(tn.coord(0), tn.shape(3)).store(where)
    am(tn.coord(0), tn.shape(1)).store(tn.broadcast(tn.argmax(v, v.dim(0)), tn.shape(1),
                                                    dims=am.dims()))


@tn.kernel
def r15_reversed_ties(x: tn.Tensor[f32, 1], s: tn.Tensor[f32, 1], si: tn.Tensor[i64, 1],
                      top: tn.Tensor[i64, 1], am: tn.Tensor[i64, 1]):
    v = tn.reindex(x[tn.coord(0), tn.shape(7)], tn.shape(7), lambda i: (6 - i,))
    vals, idx = tn.sort(v, v.dim(0))
    s(tn.coord(0), tn.shape(7)).store(vals)
    si(tn.coord(0), tn.shape(7)).store(6 - idx)                 # ties resolved last-index first
    best, where = tn.topk(v, v.dim(0), 3)
    top(tn.coord(0), tn.shape(3)).store(6 - where)
    am(tn.coord(0), tn.shape(1)).store(tn.broadcast(6 - tn.argmax(v, v.dim(0)), tn.shape(1),
                                                    dims=am.dims()))


CASES[-1].wrong = r15_reversed_ties


@case("R15-ties-ints", "R-15", "descending sort of tied integers keeps source order",
      [t("x", "i32", [9], values(3, 1, 3, 2, 1, 3, 0, 2, 1)), out("v", "i32", [9]),
       out("i", "i64", [9])])
@tn.kernel
def r15_int_sort(x: tn.Tensor[i32, 1], v: tn.Tensor[i32, 1], i: tn.Tensor[i64, 1]):
    t_ = x[tn.coord(0), tn.shape(9)]
    vals, idx = tn.sort(t_, t_.dim(0), descending=True)
    v(tn.coord(0), tn.shape(9)).store(vals)
    i(tn.coord(0), tn.shape(9)).store(idx)
