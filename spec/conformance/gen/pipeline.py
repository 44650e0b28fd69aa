"""Cases for spec/pipeline.md (P-1 .. P-9)."""

from __future__ import annotations

import tilenest as tn
from tilenest import f32
from common import CASES, arange, case, mutate, normal, out, t, text_case, values

F = "f32"
POL = tn.pipeline_policy(window=2, interval=1)

# ---------------------------------------------------------------- P-1 reference meaning


@case("P01-pipelined-gemv", "P-1", "a pipeline means its serial loop (ragged last block)",
      [t("x", F, [3, 10], normal(1)), t("w", F, [10], normal(2)), out("y", F, [3])])
@tn.kernel
def p01_gemv(x: tn.Tensor[f32, 2], w: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, bk=4):
    rows, cols = x.shape
    w = w.with_dims(x.dim(1))
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        acc = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
        for k in p.pipeline(tn.shape(tn.cdiv(cols, bk)), POL):
            k.stage("load")
            a = x[tn.coord(p.index(), k.index() * bk), tn.shape(1, bk)]
            b = w[tn.coord(k.index() * bk), tn.shape(bk)]
            k.stage("compute")
            acc = acc + tn.reduce(a * b, x.dim(1), tn.add)
        y(tn.coord(p.index()), tn.shape(1)).store(acc)


@tn.kernel
def p01_uncarried(x: tn.Tensor[f32, 2], w: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, bk=4):
    rows, cols = x.shape
    w = w.with_dims(x.dim(1))
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        acc = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
        for k in p.pipeline(tn.shape(tn.cdiv(cols, bk)), POL):
            k.stage("load")
            a = x[tn.coord(p.index(), k.index() * bk), tn.shape(1, bk)]
            b = w[tn.coord(k.index() * bk), tn.shape(bk)]
            k.stage("compute")
            acc = tn.reduce(a * b, x.dim(1), tn.add)       # iterations as independent
        y(tn.coord(p.index()), tn.shape(1)).store(acc)


CASES[-1].wrong = p01_uncarried

# ---------------------------------------------------------------- P-2 stage cuts


@case("P02-named-stages", "P-2", "three named stages carrying an accumulator",
      [t("x", F, [5], values(1, 2, 3, 4, 5)), out("y", F, [5])])
@tn.kernel
def p02_prefix(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    acc = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for k in tn.pipeline(tn.shape(n), POL):
        k.stage("load")
        v = x[tn.coord(k.index()), tn.shape(1)]
        k.stage("add")
        acc = acc + v
        k.stage("store")
        y(tn.coord(k.index()), tn.shape(1)).store(acc)


text_case("P02-duplicate-stage-name", "P-2", "stage names are unique within a pipeline",
          mutate(p02_prefix, ('name = "add"', 'name = "load"')),
          [t("x", F, [5], values(1, 2, 3, 4, 5)), out("y", F, [5])], "verify")

text_case("P02-ordinal-out-of-order", "P-2", "stage ordinals count 0, 1, 2 in program order",
          mutate(p02_prefix, ("ordinal = 1", "ordinal = 7")),
          [t("x", F, [5], values(1, 2, 3, 4, 5)), out("y", F, [5])], "verify")

# ---------------------------------------------------------------- P-3 cut placement


@case("P03-index-before-first-cut", "P-3", "pure index computations may precede the first cut",
      [t("x", F, [4], arange(1)), out("y", F, [4])])
@tn.kernel
def p03_early(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for k in tn.pipeline(tn.shape(n), POL):
        i = tn.coord(n - 1 - k.index())
        k.stage("load")
        v = x[i, tn.shape(1)]
        k.stage("store")
        y(i, tn.shape(1)).store(v * 2.0)


text_case("P03-op-outside-stages", "P-3", "once cut, every tile op of the body is inside a stage",
          mutate(p03_early, ('    %v_1 = stage {name = "load", ordinal = 0}',
                             "    %early = tensor.load %x {vars = ($0), map = ($0 + x_0 - $k - 1), "
                             "valid = true, bounds = zero} : tile<f32, [#x_0:1]>\n"
                             '    %v_1 = stage {name = "load", ordinal = 0}')),
          [t("x", F, [4], arange(1)), out("y", F, [4])], "verify")

# ---------------------------------------------------------------- P-4 segments, not levels


@case("P04-reused-names", "P-4", "two pipelines reuse stage names without relation",
      [t("x", F, [3], values(1, 2, 3)), out("y", F, [3]), out("z", F, [3])])
@tn.kernel
def p04_two(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for k in tn.pipeline(tn.shape(n), POL):
        k.stage("load")
        v = x[tn.coord(k.index()), tn.shape(1)]
        k.stage("store")
        y(tn.coord(k.index()), tn.shape(1)).store(v + 1.0)
    for k in tn.pipeline(tn.shape(n), POL):
        k.stage("load")
        v = y[tn.coord(k.index()), tn.shape(1)]
        k.stage("store")
        z(tn.coord(k.index()), tn.shape(1)).store(v * 2.0)


@tn.kernel
def p04_stages_aligned(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for k in tn.pipeline(tn.shape(n), POL):         # "load" of both pipelines as one stage
        k.stage("load")
        v = x[tn.coord(k.index()), tn.shape(1)]
        w = y[tn.coord(k.index()), tn.shape(1)]
        k.stage("store")
        y(tn.coord(k.index()), tn.shape(1)).store(v + 1.0)
        z(tn.coord(k.index()), tn.shape(1)).store(w * 2.0)


CASES[-1].wrong = p04_stages_aligned


@tn.kernel
def p04_serial_stage(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for k in tn.serial(tn.shape(n)):
        v = x[tn.coord(k.index()), tn.shape(1)]
        y(tn.coord(k.index()), tn.shape(1)).store(v + 1.0)


text_case("P04-stage-outside-pipeline", "P-4", "a stage segments a pipeline body, nothing else",
          mutate(p04_serial_stage,
                 ("    %v = tensor.load %x", '    %v_s = stage {name = "load", ordinal = 0} : '
                                           "tile<f32, [#x_0:1]> {\n    ^():\n"
                                           "      %v = tensor.load %x"),
                 ("tile<f32, [#x_0:1]>\n    %0 = const", "tile<f32, [#x_0:1]>\n      yield %v\n"
                                                        "    }\n    %0 = const"),
                 ("%1 = add %v, %0", "%1 = add %v_s, %0")),
          [t("x", F, [3], values(1, 2, 3)), out("y", F, [3]), out("z", F, [3])], "verify")

# ---------------------------------------------------------------- P-5 dependences


@case("P05-carried-edge", ("P-5", "P-6"), "a carried value orders add(i) before add(i+1), window 0",
      [t("x", F, [6], normal(3)), out("y", F, [6])])
@tn.kernel
def p05_carried(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    acc = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for k in tn.pipeline(tn.shape(n), tn.pipeline_policy(window=0, interval=1)):
        k.stage("load")
        v = x[tn.coord(k.index()), tn.shape(1)]
        k.stage("add")
        acc = acc * 0.5 + v
        k.stage("store")
        y(tn.coord(k.index()), tn.shape(1)).store(acc)


@case("P05-tensor-is-no-edge", "P-5", "a value passed through a tensor between iterations is "
      "not a dependence (window 0): race", [t("x", F, [6], normal(3)), out("y", F, [6])], "race")
@tn.kernel
def p05_through_tensor(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    x = x.with_dims(y.dim(0))
    for k in tn.pipeline(tn.shape(n - 1), tn.pipeline_policy(window=0, interval=1)):
        k.stage("read")
        prev = y[tn.coord(k.index()), tn.shape(1), tn.bounds.zero]
        k.stage("write")
        y(tn.coord(k.index() + 1), tn.shape(1)).store(prev + x[tn.coord(k.index() + 1),
                                                               tn.shape(1)])


# ---------------------------------------------------------------- P-6 policy


@case("P06-window-one-is-serial", "P-6", "window 1 forbids overlap: the recurrence through y is fine",
      [t("x", F, [5], values(1, 2, 3, 4, 5)), t("y", F, [5], values(1, 0, 0, 0, 0))])
@tn.kernel
def p06_window(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, window=1):
    (n,) = x.shape
    x = x.with_dims(y.dim(0))
    for k in tn.pipeline(tn.shape(n - 1), tn.pipeline_policy(window=window, interval=1)):
        k.stage("read")
        prev = y[tn.coord(k.index()), tn.shape(1)]
        k.stage("write")
        y(tn.coord(k.index() + 1), tn.shape(1)).store(prev + x[tn.coord(k.index() + 1),
                                                               tn.shape(1)])


text_case("P06-negative-window", "P-6", "a negative window is not a policy",
          mutate(p06_window, ("window = 1", "window = -1")),
          [t("x", F, [5], values(1, 2, 3, 4, 5)), t("y", F, [5], values(1, 0, 0, 0, 0))],
          "verify")

text_case("P06-interval-zero", "P-6", "the initiation interval is at least 1",
          mutate(p06_window, ("interval = 1", "interval = 0")),
          [t("x", F, [5], values(1, 2, 3, 4, 5)), t("y", F, [5], values(1, 0, 0, 0, 0))],
          "verify")

# ---------------------------------------------------------------- P-7 permitted overlap


case("P07-undeclared-order", ("P-7", "P-6"), "window 2: iteration k reads what k-1 writes: race",
     [t("x", F, [5], values(1, 2, 3, 4, 5)), t("y", F, [5], values(1, 0, 0, 0, 0))],
     "race")(p06_window.specialize(window=2))


@case("P07-distance-beyond-window", "P-7", "iterations 3 apart never overlap under window 3",
      [t("x", F, [8], arange(1)), t("y", F, [8], values(1, 2, 3, 0, 0, 0, 0, 0))])
@tn.kernel
def p07_far(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, window=3):
    (n,) = x.shape
    x = x.with_dims(y.dim(0))
    for k in tn.pipeline(tn.shape(n - 3), tn.pipeline_policy(window=window, interval=1)):
        k.stage("read")
        prev = y[tn.coord(k.index()), tn.shape(1)]
        k.stage("write")
        y(tn.coord(k.index() + 3), tn.shape(1)).store(prev + x[tn.coord(k.index() + 3),
                                                               tn.shape(1)])


case("P07-distance-within-window", "P-7", "the same program under window 4 conflicts: race",
     [t("x", F, [8], arange(1)), t("y", F, [8], values(1, 2, 3, 0, 0, 0, 0, 0))],
     "race")(p07_far.specialize(window=4))

# ---------------------------------------------------------------- P-8 versions


@case("P08-values-cross-stages", "P-8", "a value skipping a stage needs no storage of the user's",
      [t("x", F, [6], normal(4)), out("y", F, [6])])
@tn.kernel
def p08_skip(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for k in tn.pipeline(tn.shape(n), tn.pipeline_policy(window=3, interval=1)):
        k.stage("load")
        v = x[tn.coord(k.index()), tn.shape(1)]
        k.stage("square")
        sq = v * v
        k.stage("store")
        y(tn.coord(k.index()), tn.shape(1)).store(sq + v)


@case("P08-one-slot-shared", "P-8", "a single tensor slot reused by overlapping iterations: race",
      [t("x", F, [6], normal(4)), out("y", F, [6]), out("slot", F, [1])], "race")
@tn.kernel
def p08_slot(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], slot: tn.Tensor[f32, 1]):
    (n,) = x.shape
    slot = slot.with_dims(x.dim(0))
    for k in tn.pipeline(tn.shape(n), tn.pipeline_policy(window=3, interval=1)):
        k.stage("load")
        slot(tn.coord(0), tn.shape(1)).store(x[tn.coord(k.index()), tn.shape(1)])
        k.stage("store")
        v = slot[tn.coord(0), tn.shape(1)]
        y(tn.coord(k.index()), tn.shape(1)).store(v * v + v)


# ---------------------------------------------------------------- P-9 Memory in pipelines


@case("P09-memory-states-order", "P-9", "a Memory carried across iterations is ordered by states",
      [t("x", F, [3, 4], arange()), out("y", F, [1, 4])])
@tn.kernel
def p09_staged(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    total = tn.memory(f32, tn.shape(1, 4), dims=x.dims())
    total.store(tn.zeros(f32, tn.shape(1, 4)))
    for k in tn.pipeline(tn.shape(rows), POL):
        k.stage("load")
        buf = tn.memory(f32, tn.shape(1, 4), dims=x.dims())
        buf.store(x[tn.coord(k.index(), 0), tn.shape(1, 4)])
        k.stage("accumulate")
        total.store(total.load() + buf.load())
    y(tn.coord(0, 0), tn.shape(1, 4)).store(total.load())


@tn.kernel
def p09_fresh_total(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    last = tn.zeros(f32, tn.shape(1, 4), dims=x.dims())
    for k in tn.pipeline(tn.shape(rows), POL):
        k.stage("load")
        buf = tn.memory(f32, tn.shape(1, 4), dims=x.dims())
        buf.store(x[tn.coord(k.index(), 0), tn.shape(1, 4)])
        k.stage("accumulate")
        total = tn.memory(f32, tn.shape(1, 4), dims=x.dims())    # a fresh object per iteration
        total.store(tn.zeros(f32, tn.shape(1, 4), dims=x.dims()) + buf.load())
        last = total.load()
    y(tn.coord(0, 0), tn.shape(1, 4)).store(last)


CASES[-1].wrong = p09_fresh_total


@case("P09-tensor-accumulator", "P-9", "the same accumulation through a tensor is unordered: race",
      [t("x", F, [3, 4], arange()), t("y", F, [1, 4])], "race")
@tn.kernel
def p09_tensor(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    y = y.with_dims(*x.dims())
    for k in tn.pipeline(tn.shape(rows), POL):
        k.stage("load")
        v = x[tn.coord(k.index(), 0), tn.shape(1, 4)]
        k.stage("accumulate")
        y(tn.coord(0, 0), tn.shape(1, 4)).store(y[tn.coord(0, 0), tn.shape(1, 4)] + v)


