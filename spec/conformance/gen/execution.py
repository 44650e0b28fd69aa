"""Cases for spec/execution.md (E-1 .. E-18)."""

from __future__ import annotations

import tilenest as tn
from tilenest import f32, i32, i64
from common import (CASES, arange, case, mutate, normal, out, s, t, text_case, tileir,
                    values)

F = "f32"

# ---------------------------------------------------------------- E-1 programs


@case("E01-host-arithmetic", "E-1", "host arithmetic on constants is fixed at capture",
      [t("x", F, [2, 3], arange()), out("y", F, [2, 3])])
@tn.kernel
def e01_scale(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2], *, factor=3):
    rows, cols = x.shape
    k = factor * 2 + 1
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(row * k)


text_case("E01-region-without-yield", "E-1", "every region body ends with its yield",
          tileir(e01_scale).replace("    yield\n  }\n}", "  }\n}"),
          [t("x", F, [2, 3], arange()), out("y", F, [2, 3])], "verify")

# ---------------------------------------------------------------- E-2 region kinds


@case("E02-four-kinds", "E-2", "parallel, reduce, serial and pipeline in one program",
      [t("x", F, [3, 4], normal(1)), out("y", F, [3, 1])])
@tn.kernel
def e02_four(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        acc = tn.zeros(f32, tn.shape(1, 1), dims=x.dims())
        for c in p.reduce(tn.shape(cols), policy=tn.fold_left):
            acc = acc + x[tn.coord(p.index(), c.index()), tn.shape(1, 1)]
        for it in p.serial(tn.shape(2)):
            acc = acc * 2.0
        for k in p.pipeline(tn.shape(1), tn.pipeline_policy(window=2, interval=1)):
            y(tn.coord(p.index(), 0), tn.shape(1, 1)).store(acc)


text_case("E02-no-fifth-kind", "E-2", "there is no fifth region kind",
          mutate(e02_four, ("%acc_6 = serial", "%acc_6 = vectorize")),
          [t("x", F, [3, 4], normal(1)), out("y", F, [3, 1])], "parse")

# ---------------------------------------------------------------- E-3 coordinates


@case("E03-coord-paths", "E-3", "q.coord() is (p.index(), q.index())", [out("y", "i64", [2, 3])])
@tn.kernel
def e03_paths(y: tn.Tensor[i64, 2]):
    for p in tn.parallel(tn.shape(2)):
        for q in p.parallel(tn.shape(3)):
            i, j = q.coord()
            y(tn.coord(i, j), tn.shape(1, 1)).store(tn.full(i64, tn.shape(1, 1), 0) + i * 10 + j)


@tn.kernel
def e03_flat(y: tn.Tensor[i64, 2]):
    for p in tn.parallel(tn.shape(2)):
        for q in p.parallel(tn.shape(3)):
            i, j = p.index(), q.index()
            y(tn.coord(i, j), tn.shape(1, 1)).store(tn.full(i64, tn.shape(1, 1), 0) + i + j * 10)


CASES[-1].wrong = e03_flat

# ---------------------------------------------------------------- E-4 creating regions


@case("E04-free-form-nests", "E-4", "tn.serial inside a region is the innermost handle's member",
      [t("x", F, [2, 3], arange(1)), out("y", F, [2, 3])])
@tn.kernel
def e04_nested(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        acc = tn.zeros(f32, tn.shape(1, 1), dims=x.dims())
        for c in tn.serial(tn.shape(cols)):
            acc = acc + x[tn.coord(p.index(), c.index()), tn.shape(1, 1)]
            y(tn.coord(p.index(), c.index()), tn.shape(1, 1)).store(acc)


@tn.kernel
def e04_at_root(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    acc = tn.zeros(f32, tn.shape(1, 1), dims=x.dims())
    for c in tn.serial(tn.shape(cols)):
        for p in tn.parallel(tn.shape(rows)):
            v = acc + x[tn.coord(p.index(), c.index()), tn.shape(1, 1)]
            y(tn.coord(p.index(), c.index()), tn.shape(1, 1)).store(v)


CASES[-1].wrong = e04_at_root

# ---------------------------------------------------------------- E-5 handles


@case("E05-outer-index-inside", "E-5", "outer.index() inside a nested region is outer's coordinate",
      [out("y", "i64", [2, 2])])
@tn.kernel
def e05_outer(y: tn.Tensor[i64, 2]):
    for p in tn.parallel(tn.shape(2, 2)):
        for t_ in p.serial(tn.shape(1)):
            y(tn.coord(p.index(0), p.index(1)), tn.shape(1, 1)).store(
                tn.full(i64, tn.shape(1, 1), 0) + p.index(0) * 2 + p.index(1) + t_.index())


text_case("E05-handle-escapes", "E-5", "a region coordinate used after its region is unbound",
          mutate(e05_outer, ("    yield\n  }\n}",
                             "    yield\n  }\n  %e = index {vars = (), value = $p0} : i64\n}")),
          [out("y", "i64", [2, 2])], "verify")

# ---------------------------------------------------------------- E-6 anchors


@case("E06-control-anchor", "E-6", "an update under if_ on q's index is anchored at q: one writer",
      [out("y", F, [4])])
@tn.kernel
def e06_bump(y: tn.Tensor[f32, 1], *, writers=1):
    acc = tn.zeros(f32, tn.shape(4))
    for q in tn.parallel(tn.shape(4)):
        if tn.if_(q.index() < writers):
            acc = acc + 1.0
    y(tn.coord(0), tn.shape(4)).store(acc)


case("E06-two-writers-race", "E-6", "two instances each redefine all of acc",
     [out("y", F, [4])], "race")(e06_bump.specialize(writers=2))

# ---------------------------------------------------------------- E-7 collective ops


@case("E07-collective-once", "E-7", "a store anchored above its frontier happens once",
      [t("x", F, [4], values(1, 2, 3, 4)), out("y", F, [4]), out("s", F, [1])])
@tn.kernel
def e07_once(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], s: tn.Tensor[f32, 1]):
    for q in tn.parallel(tn.shape(4)):
        i = tn.coord(q.index())
        y(i, tn.shape(1)).store(x[i, tn.shape(1)] * 2.0)
        whole = x[tn.coord(0), tn.shape(4)]
        total = tn.reduce(whole, whole.dim(0), tn.add)
        s(tn.coord(0), tn.shape(1)).store(tn.broadcast(total, tn.shape(1), dims=s.dims()))


@case("E07-collective-reads-children", "E-7",
      "a collective read of what the instances write is unordered: race",
      [t("x", F, [4], values(1, 2, 3, 4)), out("y", F, [4]), out("s", F, [4])], "race")
@tn.kernel
def e07_read_back(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], s: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(4)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])
        s(tn.coord(0), tn.shape(4)).store(y[tn.coord(0), tn.shape(4)])


# ---------------------------------------------------------------- E-8 per


@case("E08-per-instance-value", "E-8", "per(q, x) is one value per instance, equal to x",
      [t("x", F, [4], normal(2)), out("y", F, [4])])
@tn.kernel
def e08_per(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    whole = x[tn.coord(0), tn.shape(4)]
    for q in tn.parallel(tn.shape(4)):
        mine = tn.per(q, tn.reduce(whole, whole.dim(0), tn.maximum))
        y(tn.coord(q.index()), tn.shape(1)).store(
            tn.broadcast(mine, tn.shape(1), dims=x.dims()) - x[tn.coord(q.index()), tn.shape(1)])


@case("E08-per-makes-overlap", "E-8", "per turns a collective update into four overlapping ones",
      [out("y", F, [4])], "race")
@tn.kernel
def e08_each(y: tn.Tensor[f32, 1]):
    acc = tn.zeros(f32, tn.shape(4))
    for q in tn.parallel(tn.shape(4)):
        acc = tn.per(q, acc + 1.0)
    y(tn.coord(0), tn.shape(4)).store(acc)


# ---------------------------------------------------------------- E-9 homes


@case("E09-home-per-instance", "E-9", "a variable first defined in a parallel lives per instance",
      [t("x", F, [2, 3], arange()), out("y", F, [2, 3])])
@tn.kernel
def e09_home(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    for p in tn.parallel(tn.shape(2)):
        t_ = x[tn.coord(p.index(), 0), tn.shape(1, 3)]
        for it in p.serial(tn.shape(2)):
            t_ = t_ + 1.0
        y(tn.coord(p.index(), 0), tn.shape(1, 3)).store(t_)


text_case("E09-read-outside-home", "E-9", "a per-instance value read at the root is not visible",
          mutate(e09_home, ("    yield\n  }\n}",
                            "    yield\n  }\n  tensor.store %y, %t {vars = ($0, $1), "
                            "map = ($0, $1), valid = true, bounds = zero}\n}")),
          [t("x", F, [2, 3], arange()), out("y", F, [2, 3])], "parse")

# ---------------------------------------------------------------- E-10 noninterference


@case("E10-shared-reads", "E-10", "all instances read x[0]; each writes its own y[p]",
      [t("x", F, [4], normal(3)), out("y", F, [4])])
@tn.kernel
def e10_shared(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(4)):
        first = x[tn.coord(0), tn.shape(1)]
        y(tn.coord(p.index()), tn.shape(1)).store(first + x[tn.coord(p.index()), tn.shape(1)])


@case("E10-write-write", "E-10", "instances p and p+1 write y[p // 2]: race",
      [t("x", F, [4], normal(3)), out("y", F, [2])], "race")
@tn.kernel
def e10_halves(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(4)):
        y(tn.coord(p.index() // 2), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


@case("E10-guarded-disjoint", "E-10", "a guard makes the writers disjoint",
      [t("x", F, [4], normal(3)), out("y", F, [2])])
@tn.kernel
def e10_guarded(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(4)):
        if tn.if_(p.index() % 2 == 0):
            y(tn.coord(p.index() // 2), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


# ---------------------------------------------------------------- E-11 ancestor updates


@case("E11-patch-join", "E-11", "disjoint put patches join; untouched coordinates keep v0",
      [t("x", F, [8], arange()), out("y", F, [8]), out("before", F, [8])])
@tn.kernel
def e11_patches(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], before: tn.Tensor[f32, 1], *, step=2):
    d = x.dim(0)
    acc = tn.full(f32, tn.shape(8), -1.0, dims=(d,))
    old = acc
    for p in tn.parallel(tn.shape(3)):
        seen = tn.reduce(acc, d, tn.add)
        piece = x[tn.coord(step * p.index()), tn.shape(2)] + seen
        acc = tn.put(acc, tn.coord(step * p.index()), piece)
    y(tn.coord(0), tn.shape(8)).store(acc)
    before(tn.coord(0), tn.shape(8)).store(old)


case("E11-overlapping-patches", "E-11", "patches [i, i+2) overlap: no last-writer-wins",
     [t("x", F, [8], arange()), out("y", F, [8]), out("before", F, [8])],
     "race")(e11_patches.specialize(step=1))

# ---------------------------------------------------------------- E-12 siblings


@case("E12-siblings-sequential", "E-12", "all of A happens before B reads another instance's output",
      [t("x", F, [4], values(1, 2, 3, 4)), out("tmp", F, [4]), out("y", F, [4])])
@tn.kernel
def e12_rotate(x: tn.Tensor[f32, 1], tmp: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        tmp(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] + 1.0)
    for p in tn.parallel(tn.shape(n)):
        nxt = tmp[tn.coord((p.index() + 1) % n), tn.shape(1)]
        y(tn.coord(p.index()), tn.shape(1)).store(nxt)


@tn.kernel
def e12_swapped(x: tn.Tensor[f32, 1], tmp: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        nxt = tmp[tn.coord((p.index() + 1) % n), tn.shape(1)]
        y(tn.coord(p.index()), tn.shape(1)).store(nxt)
    for p in tn.parallel(tn.shape(n)):
        tmp(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] + 1.0)


CASES[-1].wrong = e12_swapped

# ---------------------------------------------------------------- E-13 serial order


@case("E13-reverse-order", "E-13", "order='reverse' runs the exact reverse (suffix sums)",
      [t("x", F, [5], normal(4)), out("y", F, [5])])
@tn.kernel
def e13_suffix(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    acc = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for it in tn.serial(tn.shape(n), order="reverse"):
        acc = acc + x[tn.coord(it.index()), tn.shape(1)]
        y(tn.coord(it.index()), tn.shape(1)).store(acc)


@tn.kernel
def e13_forward(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    acc = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for it in tn.serial(tn.shape(n)):
        acc = acc + x[tn.coord(it.index()), tn.shape(1)]
        y(tn.coord(it.index()), tn.shape(1)).store(acc)


CASES[-1].wrong = e13_forward


@case("E13-lexicographic-2d", "E-13", "a 2-D serial domain runs first axis slowest",
      [out("y", "i64", [6])])
@tn.kernel
def e13_lex(y: tn.Tensor[i64, 1]):
    n = tn.zeros(i64, tn.shape(1), dims=y.dims())
    for it in tn.serial(tn.shape(2, 3)):
        y(tn.coord(it.index(0) * 3 + it.index(1)), tn.shape(1)).store(n)
        n = n + 1


@tn.kernel
def e13_colmajor(y: tn.Tensor[i64, 1]):
    n = tn.zeros(i64, tn.shape(1), dims=y.dims())
    for it in tn.serial(tn.shape(3, 2)):
        y(tn.coord(it.index(1) * 3 + it.index(0)), tn.shape(1)).store(n)
        n = n + 1


CASES[-1].wrong = e13_colmajor


# ---------------------------------------------------------------- E-14 carried state


@case("E14-simultaneous-update", "E-14", "a, b = b, a + b advances both at the boundary",
      [out("y", "i64", [2])])
@tn.kernel
def e14_fib(y: tn.Tensor[i64, 1]):
    a = tn.zeros(i64, tn.shape(1), dims=y.dims())
    b = tn.full(i64, tn.shape(1), 1, dims=y.dims())
    for it in tn.serial(tn.shape(10)):
        a, b = b, a + b
    y(tn.coord(0), tn.shape(1)).store(a)
    y(tn.coord(1), tn.shape(1)).store(b)


@tn.kernel
def e14_sequential(y: tn.Tensor[i64, 1]):
    a = tn.zeros(i64, tn.shape(1), dims=y.dims())
    b = tn.full(i64, tn.shape(1), 1, dims=y.dims())
    for it in tn.serial(tn.shape(10)):
        a = b
        b = a + b
    y(tn.coord(0), tn.shape(1)).store(a)
    y(tn.coord(1), tn.shape(1)).store(b)


CASES[-1].wrong = e14_sequential

text_case("E14-yield-arity", "E-14", "a body must yield one value per carried variable",
          mutate(e14_fib, ("yield %b_1, %b_2", "yield %b_1")), [out("y", "i64", [2])], "verify")

# ---------------------------------------------------------------- E-15 control flow


@case("E15-while-and-if", "E-15", "while_ re-evaluates with the carried values; if_ merges",
      [s("n0", "i32", 27), out("steps", "i32", [1])])
@tn.kernel
def e15_collatz(n0: tn.Scalar[i32], steps: tn.Tensor[i32, 1]):
    n = n0
    count = tn.full(i32, tn.shape(), 0)
    while tn.while_(n != 1):
        if tn.if_(n % 2 == 0):
            n = n // 2
        else:
            n = 3 * n + 1
        count = count + 1
    steps(tn.coord(0), tn.shape(1)).store(tn.broadcast(count, tn.shape(1), dims=steps.dims()))


text_case("E15-condition-not-bool", "E-15", "an if_ condition must be a bool scalar",
          "kernel @e15_badif(%n0: i32, %y: tensor<i32, [#y_0:y_0]>)\n"
          "    syms [y_0] assume [] dims [#y_0 = \"y.0\"] {\n"
          "  %r = if %n0 : i32 {\n  ^():\n    yield %n0\n  } {\n  ^():\n    yield %n0\n  }\n"
          "  %b = broadcast %r : tile<i32, [#y_0:1]>\n"
          "  tensor.store %y, %b {vars = ($0), map = ($0), valid = true, bounds = zero}\n}\n",
          [s("n0", "i32", 6), out("y", "i32", [1])], "type")

# ---------------------------------------------------------------- E-16 empty domains


@case("E16-empty-domains", "E-16", "zero-extent serial keeps the entry value; empty parallel stores nothing",
      [t("x", F, [0], normal(5)), out("y", F, [2])])
@tn.kernel
def e16_maybe(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    acc = tn.full(f32, tn.shape(1), 5.0, dims=x.dims())
    for it in tn.serial(tn.shape(n)):
        acc = acc + x[tn.coord(it.index()), tn.shape(1)]
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(0), tn.shape(1)).store(tn.full(f32, tn.shape(1), 99.0))
    y(tn.coord(1), tn.shape(1)).store(acc)


@tn.kernel
def e16_runs_once(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    acc = tn.full(f32, tn.shape(1), 5.0, dims=x.dims())
    for it in tn.serial(tn.shape(n)):
        acc = acc + x[tn.coord(it.index()), tn.shape(1)]
    for p in tn.parallel(tn.shape(n + 1)):
        y(tn.coord(0), tn.shape(1)).store(tn.full(f32, tn.shape(1), 99.0))
    y(tn.coord(1), tn.shape(1)).store(acc)


CASES[-1].wrong = e16_runs_once


@case("E16-guarded-domain", "E-16", "points outside a domain guard take part in nothing",
      [out("y", "i64", [6])])
@tn.kernel
def e16_guard(y: tn.Tensor[i64, 1]):
    for p in tn.parallel(tn.shape(6)):
        if tn.if_(p.index() % 3 != 1):
            y(tn.coord(p.index()), tn.shape(1)).store(tn.full(i64, tn.shape(1), 7, dims=y.dims()))


# ---------------------------------------------------------------- E-17 assumptions


@case("E17-assume-holds", "E-17", "a call that satisfies tn.assume runs",
      [t("x", F, [3], values(4, 5, 6)), out("y", F, [1])])
@tn.kernel
def e17_first(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    tn.assume(n >= 1)
    y(tn.coord(0), tn.shape(1)).store(x[tn.coord(0), tn.shape(1), tn.bounds.assume])


case("E17-assume-broken", "E-17", "a call that breaks tn.assume is rejected before running",
     [t("x", F, [0], values()), out("y", F, [1])], "runtime")(e17_first)

# ---------------------------------------------------------------- E-18 exec constraints


@case("E18-exec-no-meaning", "E-18", "block/thread constraints leave the result unchanged",
      [t("x", F, [2, 3], normal(6)), out("y", F, [2, 3])])
@tn.kernel
def e18_bound(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    for p in tn.parallel(tn.shape(2), exec=tn.exec.block):
        for q in p.parallel(tn.shape(3), exec=tn.exec.thread):
            c = tn.coord(p.index(), q.index())
            y(c, tn.shape(1, 1)).store(x[c, tn.shape(1, 1)] * 2.0)


text_case("E18-impossible-nesting", "E-18", "a block inside a warp: no target accepts it",
          mutate(e18_bound, ("exec = exec(scope = block)", "exec = exec(scope = TMP)"),
                 ("exec = exec(scope = thread)", "exec = exec(scope = block)"),
                 ("exec = exec(scope = TMP)", "exec = exec(scope = warp)")),
          [t("x", F, [2, 3], normal(6)), out("y", F, [2, 3])], "verify")


@case("E17-symbolic-parameter", "E-17", "a symbolic parameter no array determines is bound by the "
      "call (params)", [t("x", F, [8], arange()), out("y", F, [8])], params={"n": 5})
@tn.kernel
def e17_param(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], n: int):
    tn.assume(n <= 8)
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] * 2.0)


case("E17-parameter-breaks-assumption", "E-17", "params that break tn.assume are rejected",
     [t("x", F, [8], arange()), out("y", F, [8])], "runtime", params={"n": 9})(e17_param)
