"""Cases for spec/memory.md (M-1 .. M-14)."""

from __future__ import annotations

import tilenest as tn
from tilenest import f32
from common import CASES, alias, arange, case, mutate, normal, out, t, text_case, values

F = "f32"

# ---------------------------------------------------------------- M-1 only store writes


@case("M01-store-writes", "M-1", "assignment binds tiles; only .store writes the view",
      [t("x", F, [3], values(1, 2, 3)), t("y", F, [3], values(9, 9, 9))])
@tn.kernel
def m01_store(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    v = y[tn.coord(0), tn.shape(3)]
    v = x[tn.coord(0), tn.shape(3)]            # rebinding v changes no storage
    y(tn.coord(1), tn.shape(2)).store(v.slice((0,), (2,)))


text_case("M01-store-into-a-tile", "M-1", "a tile value is not storage: tensor.store needs a tensor",
          mutate(m01_store, ("tensor.store %y, %", "tensor.store %v, %")),
          [t("x", F, [3], values(1, 2, 3)), t("y", F, [3], values(9, 9, 9))], "type")

# ---------------------------------------------------------------- M-2 views


@case("M02-reference-load-store", "M-2", "a reference (origin, shape) is a window: load then store",
      [t("y", F, [5], values(1, 2, 3, 4, 5))])
@tn.kernel
def m02_window(y: tn.Tensor[f32, 1]):
    ref = y(tn.coord(1), tn.shape(3))
    ref.store(ref.load() * 10.0)


@tn.kernel
def m02_origin_zero(y: tn.Tensor[f32, 1]):
    ref = y(tn.coord(0), tn.shape(3))
    ref.store(ref.load() * 10.0)


CASES[-1].wrong = m02_origin_zero


@case("M02-negative-runtime-origin", "M-2", "origins may be negative and runtime values",
      [t("x", F, [4], values(1, 2, 3, 4)), t("o", "i64", [1], values(-2)), out("y", F, [6])])
@tn.kernel
def m02_runtime(x: tn.Tensor[f32, 1], o: tn.Tensor[tn.i64, 1], y: tn.Tensor[f32, 1]):
    one = o[tn.coord(0), tn.shape(1)]
    org = tn.reduce(one, one.dim(0), tn.add)
    y(tn.coord(0), tn.shape(6)).store(x[tn.coord(org), tn.shape(6)])


# ---------------------------------------------------------------- M-3 snapshots


@case("M03-load-is-snapshot", "M-3", "a store after a load does not change the loaded tile",
      [t("y", F, [3], values(1, 2, 3)), out("z", F, [3])])
@tn.kernel
def m03_snap(y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
    before = y[tn.coord(0), tn.shape(3)]
    y(tn.coord(0), tn.shape(3)).store(before + 1.0)
    z(tn.coord(0), tn.shape(3)).store(before)


@tn.kernel
def m03_reload(y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
    before = y[tn.coord(0), tn.shape(3)]
    y(tn.coord(0), tn.shape(3)).store(before + 1.0)
    z(tn.coord(0), tn.shape(3)).store(y[tn.coord(0), tn.shape(3)])


CASES[-1].wrong = m03_reload

# ---------------------------------------------------------------- M-4 positional stores


@case("M04-positional-store", "M-4", "axis i lands on axis i; a permute makes the transpose",
      [t("x", F, [2, 2], arange(1)), out("y", F, [2, 2]), out("z", F, [2, 2])])
@tn.kernel
def m04_transpose(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2], z: tn.Tensor[f32, 2]):
    m, n = x.dims()
    v = x[tn.coord(0, 0), tn.shape(2, 2)]
    y.with_dims(n, m)(tn.coord(0, 0), tn.shape(2, 2)).store(tn.permute(v, (n, m)))
    z(tn.coord(0, 0), tn.shape(2, 2)).store(v)


text_case("M04-dtype-mismatch", "M-4", "storing an f64 tile into an f32 view needs a cast",
          mutate(m04_transpose, ("  tensor.store %z, %v {",
                                 "  %w = cast %v : tile<f64, [#x_0:2, #x_1:2]>\n"
                                 "  tensor.store %z, %w {")),
          [t("x", F, [2, 2], arange(1)), out("y", F, [2, 2]), out("z", F, [2, 2])], "type")

# ---------------------------------------------------------------- M-5 zero and fill


@case("M05-zero-and-fill", "M-5", "out-of-view reads give 0 or the fill; writes are dropped",
      [t("x", F, [4], values(1, 2, 3, 4)), out("a", F, [6]), out("b", F, [6]), t("y", F, [5])])
@tn.kernel
def m05_ragged(x: tn.Tensor[f32, 1], a: tn.Tensor[f32, 1], b: tn.Tensor[f32, 1],
               y: tn.Tensor[f32, 1]):
    a(tn.coord(0), tn.shape(6)).store(x[tn.coord(-1), tn.shape(6)])
    b(tn.coord(0), tn.shape(6)).store(x(tn.coord(-1), tn.shape(6)).load(-1.0))
    y(tn.coord(2), tn.shape(6)).store(tn.full(f32, tn.shape(6), 7.0))


@tn.kernel
def m05_fill_ignored(x: tn.Tensor[f32, 1], a: tn.Tensor[f32, 1], b: tn.Tensor[f32, 1],
                     y: tn.Tensor[f32, 1]):
    a(tn.coord(0), tn.shape(6)).store(x[tn.coord(-1), tn.shape(6)])
    b(tn.coord(0), tn.shape(6)).store(x[tn.coord(-1), tn.shape(6)])
    y(tn.coord(2), tn.shape(6)).store(tn.full(f32, tn.shape(6), 7.0))


CASES[-1].wrong = m05_fill_ignored

# ---------------------------------------------------------------- M-6 checked


@case("M06-checked-in-view", "M-6", "a checked access inside the view is an ordinary access",
      [t("x", F, [6], arange()), out("y", F, [4])])
@tn.kernel
def m06_tail(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, at=2):
    y(tn.coord(0), tn.shape(4)).store(x[tn.coord(at), tn.shape(4), tn.bounds.checked])


case("M06-checked-out-of-view", "M-6", "x[6] is out of view under checked",
     [t("x", F, [6], arange()), out("y", F, [4])], "bounds")(m06_tail.specialize(at=3))

# ---------------------------------------------------------------- M-7 assume


@case("M07-assume-kept", "M-7", "an assume promise that holds", [t("x", F, [4], arange()),
                                                                 out("y", F, [4])])
@tn.kernel
def m07_head(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    y(tn.coord(0), tn.shape(4), tn.bounds.assume).store(
        x[tn.coord(0), tn.shape(4), tn.bounds.assume])


case("M07-assume-broken", "M-7", "the interpreter checks assume promises",
     [t("x", F, [3], arange()), out("y", F, [4])], "bounds")(m07_head)

# ---------------------------------------------------------------- M-8 aliasing


@case("M08-alias-same-instance", "M-8", "one array for x and y: an instance reads then writes",
      [t("x", F, [3], values(1, 2, 3)), alias("y", "x")])
@tn.kernel
def m08_double(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        i = tn.coord(p.index())
        y(i, tn.shape(1)).store(x[i, tn.shape(1)] * 2.0)


@case("M08-alias-across-instances", "M-8", "p reads a[p+1], which p+1 writes through the alias",
      [t("x", F, [3], values(1, 2, 3)), alias("y", "x")], "race")
@tn.kernel
def m08_shift(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n - 1)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index() + 1), tn.shape(1)])


case("M08-distinct-arrays", "M-8", "the same kernel on distinct arrays is race-free",
     [t("x", F, [3], values(1, 2, 3)), out("y", F, [3])])(m08_shift)

# ---------------------------------------------------------------- M-9 Memory homes


@case("M09-private-memory", "M-9", "one allocation per instance of the home",
      [t("x", F, [2, 4], arange()), out("y", F, [2, 4])])
@tn.kernel
def m09_private(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        buf = tn.memory(f32, tn.shape(1, 4))
        buf.store(x[tn.coord(p.index(), 0), tn.shape(1, 4)])
        y(tn.coord(p.index(), 0), tn.shape(1, 4)).store(buf.load() * 2.0)


@case("M09-root-memory-shared", "M-9", "a root Memory stored by every instance: race",
      [t("x", F, [2, 4], arange()), out("y", F, [2, 4])], "race")
@tn.kernel
def m09_one(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    buf = tn.memory(f32, tn.shape(1, 4))
    for p in tn.parallel(tn.shape(rows)):
        buf.store(x[tn.coord(p.index(), 0), tn.shape(1, 4)])
        y(tn.coord(p.index(), 0), tn.shape(1, 4)).store(buf.load())


# ---------------------------------------------------------------- M-10 Memory store/load


@case("M10-memory-snapshots", "M-10", "m.store replaces the content; earlier loads keep theirs",
      [t("x", F, [3], values(1, 2, 3)), out("a", F, [3]), out("b", F, [3])])
@tn.kernel
def m10_twice(x: tn.Tensor[f32, 1], a: tn.Tensor[f32, 1], b: tn.Tensor[f32, 1]):
    m = tn.memory(f32, tn.shape(3))
    m.store(x[tn.coord(0), tn.shape(3)])
    first = m.load()
    m.store(first * 10.0)
    a(tn.coord(0), tn.shape(3)).store(first)
    b(tn.coord(0), tn.shape(3)).store(m.load())


@tn.kernel
def m10_aliased_snapshot(x: tn.Tensor[f32, 1], a: tn.Tensor[f32, 1], b: tn.Tensor[f32, 1]):
    m = tn.memory(f32, tn.shape(3))
    m.store(x[tn.coord(0), tn.shape(3)])
    m.store(m.load() * 10.0)
    a(tn.coord(0), tn.shape(3)).store(m.load())
    b(tn.coord(0), tn.shape(3)).store(m.load())


CASES[-1].wrong = m10_aliased_snapshot

# ---------------------------------------------------------------- M-11 state tokens


@case("M11-definite-store-by-assumption", "M-11",
      "a store in a loop counts when the assumptions make it run", [t("x", F, [2, 4], arange()),
                                                                  out("y", F, [1, 4])])
@tn.kernel
def m11_ok(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    tn.assume(rows >= 1)
    m = tn.memory(f32, tn.shape(1, 4))
    for it in tn.serial(tn.shape(rows)):
        m.store(x[tn.coord(it.index(), 0), tn.shape(1, 4)])
    y(tn.coord(0, 0), tn.shape(1, 4)).store(m.load())


text_case("M11-load-before-definite-store", "M-11",
          "without the assumption the loop may run zero times: the load may see no value",
          mutate(m11_ok, ("assume [x_0 >= 1]", "assume []")),
          [t("x", F, [2, 4], arange()), out("y", F, [1, 4])], "verify")

# ---------------------------------------------------------------- M-12 layouts


@case("M12-padded-and-colmajor", "M-12", "admitted layouts give the dense result",
      [t("x", F, [4, 4], arange()), out("y1", F, [4, 4]), out("y2", F, [4, 4])])
@tn.kernel
def m12_layouts(x: tn.Tensor[f32, 2], y1: tn.Tensor[f32, 2], y2: tn.Tensor[f32, 2]):
    v = x[tn.coord(0, 0), tn.shape(4, 4)]
    padded = tn.memory(f32, tn.layout(tn.shape(4, 4), (5, 1)))
    colmajor = tn.memory(f32, tn.layout(tn.shape(4, 4), (1, 4)))
    padded.store(v)
    colmajor.store(v)
    y1(tn.coord(0, 0), tn.shape(4, 4)).store(padded.load())
    y2(tn.coord(0, 0), tn.shape(4, 4)).store(colmajor.load())


text_case("M12-non-injective-layout", "M-12", "a zero stride makes rows share storage",
          mutate(m12_layouts, ("($0, $1) -> 5*$0 + $1 size 19", "($0, $1) -> $1 size 4")),
          [t("x", F, [4, 4], arange()), out("y1", F, [4, 4]), out("y2", F, [4, 4])], "verify")

# ---------------------------------------------------------------- M-13 resources


@case("M13-resource-classes", "M-13", "resource classes do not change results",
      [t("x", F, [4], normal(1)), out("y", F, [4]), out("z", F, [4])])
@tn.kernel
def m13_staged(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
    a = tn.memory(f32, tn.shape(4), resource=tn.mem.shared)
    b = tn.memory(f32, tn.shape(4), resource=tn.mem.private_)
    a.store(x[tn.coord(0), tn.shape(4)])
    b.store(x[tn.coord(0), tn.shape(4)] + 1.0)
    y(tn.coord(0), tn.shape(4)).store(a.load())
    z(tn.coord(0), tn.shape(4)).store(b.load())


text_case("M13-unknown-resource", "M-13", "resource classes are a closed list",
          mutate(m13_staged, ("resource = shared", "resource = scratchpad")),
          [t("x", F, [4], normal(1)), out("y", F, [4]), out("z", F, [4])], "parse")

# ---------------------------------------------------------------- M-14 descendants


@case("M14-descendants-read-home", "M-14", "every q reads p's allocation",
      [t("x", F, [2, 3], arange()), out("y", F, [2, 3])])
@tn.kernel
def m14_fan_out(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        buf = tn.memory(f32, tn.shape(1, 3))
        buf.store(x[tn.coord(p.index(), 0), tn.shape(1, 3)])
        for q in p.parallel(tn.shape(3)):
            row = buf.load()
            mine = tn.reindex(row, tn.shape(1, 1), lambda a, b: (0, q.index()))
            y(tn.coord(p.index(), q.index()), tn.shape(1, 1)).store(mine * 2.0)


@case("M14-descendants-store-home", "M-14", "q instances storing p's single allocation: race",
      [t("x", F, [2, 3], arange()), out("y", F, [2, 3])], "race")
@tn.kernel
def m14_fan_in(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        buf = tn.memory(f32, tn.shape(1, 1))
        for q in p.parallel(tn.shape(3)):
            buf.store(x[tn.coord(p.index(), q.index()), tn.shape(1, 1)])
        y(tn.coord(p.index(), 0), tn.shape(1, 1)).store(buf.load())


text_case("M11-stale-state", "M-11", "a state superseded by a store is never consumed again",
          mutate(m12_layouts, ("%2 = memory.load %mem, %0", "%2 = memory.load %mem, %state")),
          [t("x", F, [4, 4], arange()), out("y1", F, [4, 4]), out("y2", F, [4, 4])], "verify")

text_case("M11-foreign-state", "M-11", "a state of one Memory is never consumed by another",
          mutate(m12_layouts, ("%3 = memory.load %mem_1, %1", "%3 = memory.load %mem_1, %0")),
          [t("x", F, [4, 4], arange()), out("y1", F, [4, 4]), out("y2", F, [4, 4])], "verify")
