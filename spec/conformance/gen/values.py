"""Cases for spec/values.md (V-1 .. V-24)."""

from __future__ import annotations

import tilenest as tn
from tilenest import bf16, f8e4m3fn, f8e5m2, f16, f32, f64, i32, i64, u8, u32
from common import (CASES, arange, case, const, mutate, normal, out, t, text_case, uniform,
                    values)

F = "f32"

# ---------------------------------------------------------------- V-1 dims are identities


@case("V01-shared-dim", "V-1", "a view retyped to x's dim joins with x elementwise",
      [t("x", F, [5], normal(1)), t("y", F, [5], normal(2)), out("out", F, [5])])
@tn.kernel
def v01_shared(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], out: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    a = x[tn.coord(0), tn.shape(n)]
    b = y.with_dims(x.dim(0))[tn.coord(0), tn.shape(n)]
    out(tn.coord(0), tn.shape(n)).store(a + b)


text_case("V01-unrelated-dims", "V-1",
          "equal extents and labels never make two dims equal: x.0 + y.0 is ill-typed",
          mutate(v01_shared, ("%b = tensor.load %y {vars = ($0), map = ($0), valid = true, "
                              "bounds = zero} : tile<f32, [#x_0:N]>",
                              "%b = tensor.load %y {vars = ($0), map = ($0), valid = true, "
                              "bounds = zero} : tile<f32, [#y_0:N]>")),
          [t("x", F, [5], normal(1)), t("y", F, [5], normal(2)), out("out", F, [5])], "type")

# ---------------------------------------------------------------- V-2 spaces and tile types


@case("V02-rank0-scalar", "V-2", "a full reduction is a rank-0 tile that broadcasts",
      [t("x", F, [4], values(1, 3, 4, 8)), out("y", F, [4])])
@tn.kernel
def v02_scalar(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    a = x[tn.coord(0), tn.shape(n)]
    total = tn.reduce(a, a.dim(0), tn.add)
    y(tn.coord(0), tn.shape(n)).store(a / total)


@case("V02-empty-space", "V-2", "a space with a zero extent has no points; storing it is a no-op",
      [t("x", F, [3], normal(3)), t("y", F, [3], const(7.0))])
@tn.kernel
def v02_empty(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    e = x[tn.coord(0), tn.shape(0)]
    y(tn.coord(1), tn.shape(0)).store(e * 2.0)


text_case("V02-repeated-dim", "V-2", "a space lists each dim once: [#x_0:2, #x_0:2] is no space",
          mutate(v02_scalar, ("%3 = div %a, %total : tile<f32, [#x_0:x_0]>",
                              "%3 = div %a, %total : tile<f32, [#x_0:x_0]>\n"
                              "  %5 = const {value = 1.0} : tile<f32, [#x_0:2, #x_0:2]>")),
          [t("x", F, [4], values(1, 3, 4, 8)), out("y", F, [4])], "parse")

# ---------------------------------------------------------------- V-3 tensor parameters


@case("V03-named-extents", "V-3", "extents named alike bind one symbol",
      [t("x", F, [6], arange(1)), out("y", F, [6])])
@tn.kernel
def v03_named(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    y(tn.coord(0), tn.shape(n)).store(x[tn.coord(0), tn.shape(n)] * 3.0)


case("V03-extent-disagrees", "V-3", "arrays whose extents break a named equality: type error",
     [t("x", F, [6], arange(1)), out("y", F, [5])], "type")(v03_named)

# ---------------------------------------------------------------- V-4 with_dims


@case("V04-with-dims-transpose", "V-4",
      "with_dims retypes a view without moving data; a permute then stores the transpose",
      [t("a", F, [2, 3], arange()), out("b", F, [3, 2])])
@tn.kernel
def v04_retype(a: tn.Tensor[f32, 2], b: tn.Tensor[f32, 2]):
    m, n = a.dims()
    b = b.with_dims(n, m)
    t_ = a[tn.coord(0, 0), tn.shape(2, 3)]
    b(tn.coord(0, 0), tn.shape(3, 2)).store(tn.permute(t_, (n, m)))


text_case("V04-duplicate-dims", "V-4", "a tensor typed with one dim twice is rejected when read",
          mutate(v04_retype, ("%a: tensor<f32, [#a_0:a_0, #a_1:a_1]>",
                              "%a: tensor<f32, [#a_0:a_0, #a_0:a_1]>")),
          [t("a", F, [2, 3], arange()), out("b", F, [3, 2])], "parse")

# ---------------------------------------------------------------- V-5 numeric shapes


@case("V05-shared-by-dims", "V-5", "dims= shares a dim between two constructors",
      [out("y", F, [4])])
@tn.kernel
def v05_shared(y: tn.Tensor[f32, 1]):
    u = tn.full(f32, tn.shape(4), 1.5)
    w = tn.full(f32, tn.shape(4), 2.25, dims=(u.dim(0),))
    y(tn.coord(0), tn.shape(4)).store(u + w)


text_case("V05-fresh-dims-clash", "V-5", "two numeric shapes make two fresh dims: no join",
          mutate(v05_shared, ("%w = broadcast %1 : tile<f32, [#d0:4]>",
                              "%w = broadcast %1 : tile<f32, [#d1:4]>"),
                 ("dims [#y_0 = \"y.0\", #d0 = \"d0\"]", "dims [#y_0 = \"y.0\", #d0 = \"d0\", #d1]")),
          [out("y", F, [4])], "type")

# ---------------------------------------------------------------- V-6 variables


@case("V06-snapshot", "V-6", "old = acc keeps the snapshot; carried redefinitions keep the type",
      [t("x", F, [3], arange(1)), out("a", F, [3]), out("b", F, [3])])
@tn.kernel
def v06_snapshot(x: tn.Tensor[f32, 1], a: tn.Tensor[f32, 1], b: tn.Tensor[f32, 1]):
    acc = x[tn.coord(0), tn.shape(3)]
    old = acc
    for it in tn.serial(tn.shape(3)):
        acc = acc * 2.0
    a(tn.coord(0), tn.shape(3)).store(old)
    b(tn.coord(0), tn.shape(3)).store(acc)


text_case("V06-carried-type-changes", "V-6",
          "a serial body yielding another type for a carried variable",
          mutate(v06_snapshot, ("%acc_2 = mul %acc_1, %0 : tile<f32, [#x_0:3]>\n    yield %acc_2",
                                "%acc_2 = mul %acc_1, %0 : tile<f32, [#x_0:3]>\n"
                                "    %w = cast %acc_2 : tile<f64, [#x_0:3]>\n"
                                "    yield %w")),
          [t("x", F, [3], arange(1)), out("a", F, [3]), out("b", F, [3])], "verify")

# ---------------------------------------------------------------- V-7 lifting and the join


@case("V07-broadcast-order", "V-7",
      "a dim absent from an operand broadcasts; result dims in first-appearance order",
      [t("x", F, [2, 3], normal(4)), out("xr", F, [2, 3]), out("rx", F, [3, 2])])
@tn.kernel
def v07_order(x: tn.Tensor[f32, 2], xr: tn.Tensor[f32, 2], rx: tn.Tensor[f32, 2]):
    m = x[tn.coord(0, 0), tn.shape(2, 3)]
    r = tn.reduce(m, m.dim(0), tn.maximum)
    xr(tn.coord(0, 0), tn.shape(2, 3)).store(m - r)
    rx(tn.coord(0, 0), tn.shape(3, 2)).store(r - m)


@tn.kernel
def v07_positional(x: tn.Tensor[f32, 2], xr: tn.Tensor[f32, 2], rx: tn.Tensor[f32, 2]):
    m = x[tn.coord(0, 0), tn.shape(2, 3)]
    r = tn.reduce(m, m.dim(0), tn.maximum)
    xr(tn.coord(0, 0), tn.shape(2, 3)).store(m - r)
    rx(tn.coord(0, 0), tn.shape(3, 2)).store(tn.permute(m - r, (1, 0)))


case("V07-first-appearance-not-position", "V-7",
     "r - m is ordered (x1, x0), not x's axis order (a misreading negates the values)",
     [t("x", F, [2, 3], normal(4)), out("xr", F, [2, 3]), out("rx", F, [3, 2])],
     wrong=v07_positional)(v07_order)


@tn.kernel
def v07_twice(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    a = x[tn.coord(0), tn.shape(3)]
    y(tn.coord(0), tn.shape(3)).store(a + a)


text_case("V07-extent-conflict", "V-7", "one dim with two extents in a join",
          mutate(v07_twice, ("%0 = add %a, %a : tile<f32, [#x_0:3]>",
                             "%b = tensor.load %x {vars = ($0), map = ($0), valid = true, "
                             "bounds = zero} : tile<f32, [#x_0:2]>\n"
                             "  %0 = add %a, %b : tile<f32, [#x_0:3]>")),
          [t("x", F, [3], normal(1)), out("y", F, [3])], "type")


@case("V07-outer-product-needs-broadcast", "V-7",
      "an explicit broadcast builds the outer product the join refuses to form",
      [t("a", F, [3], arange(1)), t("b", F, [2], arange(10, 10)), out("y", F, [3, 2])])
@tn.kernel
def v07_outer(a: tn.Tensor[f32, 1], b: tn.Tensor[f32, 1], y: tn.Tensor[f32, 2]):
    i, j = y.dims()
    u = a.with_dims(i)[tn.coord(0), tn.shape(3)]
    v = b.with_dims(j)[tn.coord(0), tn.shape(2)]
    y(tn.coord(0, 0), tn.shape(3, 2)).store(tn.broadcast(u, tn.shape(tn.axis(i, 3), tn.axis(j, 2)))
                                            * v)


text_case("V07-implicit-outer-product", "V-7", "operands each lacking the other's dim: rejected",
          mutate(v07_outer, ("%0 = broadcast %u : tile<f32, [#y_0:3, #y_1:2]>\n  %1 = mul %0, %v",
                             "%0 = broadcast %u : tile<f32, [#y_0:3, #y_1:2]>\n  %1 = mul %u, %v")),
          [t("a", F, [3], arange(1)), t("b", F, [2], arange(10, 10)), out("y", F, [3, 2])], "type")

# ---------------------------------------------------------------- V-8 dtypes and literals


@case("V08-literal-rounds-first", "V-8", "a float literal takes the tile's dtype before the op",
      [t("x", "f16", [4], values(-0.05, -0.06, -0.0703125, 1.5)), out("y", "f16", [4])])
@tn.kernel
def v08_literal(x: tn.Tensor[f16, 1], y: tn.Tensor[f16, 1]):
    y(tn.coord(0), tn.shape(4)).store(x[tn.coord(0), tn.shape(4)] + 0.1)


@tn.kernel
def v08_wide_literal(x: tn.Tensor[f16, 1], y: tn.Tensor[f16, 1]):
    y(tn.coord(0), tn.shape(4)).store(tn.cast(tn.cast(x[tn.coord(0), tn.shape(4)], f64) + 0.1,
                                              f16))


CASES[-1].wrong = v08_wide_literal

text_case("V08-mixed-dtypes", "V-8", "f32 + f16 without a cast is ill-typed",
          mutate(v08_literal, ("%2 = add %0, %1 : tile<f16, [#x_0:4]>",
                               "%w = cast %0 : tile<f32, [#x_0:4]>\n"
                               "  %2 = add %w, %1 : tile<f16, [#x_0:4]>")),
          [t("x", "f16", [4], normal(5)), out("y", "f16", [4])], "type")

# ---------------------------------------------------------------- V-9 float arithmetic


@case("V09-no-fma", "V-9", "x*x - c rounds twice: no contraction into an FMA",
      [t("a", F, [2], values(1.000244140625, 16777216.0)),
       t("c", F, [2], values(1.00048828125, 281474976710656.0)), out("y", F, [2])])
@tn.kernel
def v09_nofma(a: tn.Tensor[f32, 1], c: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    c = c.with_dims(a.dim(0))
    x = a[tn.coord(0), tn.shape(2)]
    y(tn.coord(0), tn.shape(2)).store(x * x - c[tn.coord(0), tn.shape(2)])


@tn.kernel
def v09_fused(a: tn.Tensor[f32, 1], c: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    c = c.with_dims(a.dim(0))
    x = tn.cast(a[tn.coord(0), tn.shape(2)], f64)
    y(tn.coord(0), tn.shape(2)).store(tn.cast(x * x - tn.cast(c[tn.coord(0), tn.shape(2)], f64),
                                              f32))


CASES[-1].wrong = v09_fused


@case("V09-ieee-specials", "V-9", "x/0 = inf, 0/0 = NaN, NaN propagates, sqrt rounds once",
      [t("a", F, [6], values(1.0, -1.0, 0.0, "nan", 2.0, "-0.0")),
       t("b", F, [6], values("-0.0", 0.0, 0.0, 1.0, 3.0, 4.0)), out("q", F, [6]),
       out("r", F, [6])])
@tn.kernel
def v09_specials(a: tn.Tensor[f32, 1], b: tn.Tensor[f32, 1], q: tn.Tensor[f32, 1],
                 r: tn.Tensor[f32, 1]):
    b = b.with_dims(a.dim(0))
    x, y = a[tn.coord(0), tn.shape(6)], b[tn.coord(0), tn.shape(6)]
    q(tn.coord(0), tn.shape(6)).store(x / y)
    r(tn.coord(0), tn.shape(6)).store(tn.sqrt(tn.abs(x)) + y // 2.0 + y % 2.0)


# ---------------------------------------------------------------- V-10 integers


@case("V10-div-rem-floor-wrap", "V-10", "/ and rem truncate, // and % floor, + wraps",
      [t("a", "i32", [4], values(-7, 7, -7, 2147483647)), t("b", "i32", [4], values(2, -2, -2, 1)),
       out("y", "i32", [16])])
@tn.kernel
def v10_ints(a: tn.Tensor[i32, 1], b: tn.Tensor[i32, 1], y: tn.Tensor[i32, 1]):
    b = b.with_dims(a.dim(0))
    p, q = a[tn.coord(0), tn.shape(4)], b[tn.coord(0), tn.shape(4)]
    y(tn.coord(0), tn.shape(4)).store(p / q)
    y(tn.coord(4), tn.shape(4)).store(p // q)
    y(tn.coord(8), tn.shape(4)).store(p % q)
    y(tn.coord(12), tn.shape(4)).store(p + q)


case("V10-division-by-zero", "V-10", "an integer division by zero is a runtime error",
     [t("a", "i32", [4], values(-7, 7, -7, 5)), t("b", "i32", [4], values(2, 0, -2, 1)),
      out("y", "i32", [16])], "runtime")(v10_ints)

# ---------------------------------------------------------------- V-11 bitwise and shifts


@case("V11-shifts", "V-11", "arithmetic >> on signed, logical on unsigned, counts >= bits",
      [t("a", "i32", [4], values(-8, 8, -8, 1)), t("k", "i32", [4], values(1, 40, 40, 31)),
       t("u", "u32", [1], values(2147483648)), out("y", "i32", [8]), out("z", "u32", [1])])
@tn.kernel
def v11_shifts(a: tn.Tensor[i32, 1], k: tn.Tensor[i32, 1], u: tn.Tensor[u32, 1],
               y: tn.Tensor[i32, 1], z: tn.Tensor[u32, 1]):
    k = k.with_dims(a.dim(0))
    x, c = a[tn.coord(0), tn.shape(4)], k[tn.coord(0), tn.shape(4)]
    y(tn.coord(0), tn.shape(4)).store(x >> c)
    y(tn.coord(4), tn.shape(4)).store((x << c) ^ (x & c) | ~c)
    z(tn.coord(0), tn.shape(1)).store(u[tn.coord(0), tn.shape(1)] >> 31)


case("V11-negative-shift", "V-11", "a negative shift count is a runtime error",
     [t("a", "i32", [4], values(-8, 8, -8, 1)), t("k", "i32", [4], values(1, -1, 3, 31)),
      t("u", "u32", [1], values(2147483648)), out("y", "i32", [8]), out("z", "u32", [1])],
     "runtime")(v11_shifts)

# ---------------------------------------------------------------- V-12 max/min/comparisons


@case("V12-signed-zero-and-nan", "V-12",
      "maximum/minimum order -0.0 below +0.0 and propagate NaN; comparisons are IEEE",
      [t("a", F, [4], values("-0.0", 0.0, "nan", 1.0)), t("b", F, [4], values(0.0, "-0.0", 1.0,
                                                                               "nan")),
       out("hi", F, [4]), out("lo", F, [4]), out("ne", "bool", [4]), out("le", "bool", [4])])
@tn.kernel
def v12_minmax(a: tn.Tensor[f32, 1], b: tn.Tensor[f32, 1], hi: tn.Tensor[f32, 1],
               lo: tn.Tensor[f32, 1], ne: tn.Tensor[tn.bool_, 1], le: tn.Tensor[tn.bool_, 1]):
    b = b.with_dims(a.dim(0))
    x, y = a[tn.coord(0), tn.shape(4)], b[tn.coord(0), tn.shape(4)]
    hi(tn.coord(0), tn.shape(4)).store(tn.maximum(x, y))
    lo(tn.coord(0), tn.shape(4)).store(tn.minimum(x, y))
    ne(tn.coord(0), tn.shape(4)).store(x != y)
    le(tn.coord(0), tn.shape(4)).store(x <= y)


@tn.kernel
def v12_select_max(a: tn.Tensor[f32, 1], b: tn.Tensor[f32, 1], hi: tn.Tensor[f32, 1],
                   lo: tn.Tensor[f32, 1], ne: tn.Tensor[tn.bool_, 1], le: tn.Tensor[tn.bool_, 1]):
    b = b.with_dims(a.dim(0))
    x, y = a[tn.coord(0), tn.shape(4)], b[tn.coord(0), tn.shape(4)]
    hi(tn.coord(0), tn.shape(4)).store(tn.ite(x > y, x, y))       # C's fmax-by-compare
    lo(tn.coord(0), tn.shape(4)).store(tn.ite(x < y, x, y))
    ne(tn.coord(0), tn.shape(4)).store(x != y)
    le(tn.coord(0), tn.shape(4)).store(x <= y)


CASES[-1].wrong = v12_select_max

# ---------------------------------------------------------------- V-13 casts


@case("V13-casts", "V-13", "one rounding per cast; float->int truncates and saturates; NaN->0",
      [t("x", F, [7], values(3.7, -3.7, 1e10, -1e10, "nan", "inf", "-0.0")),
       t("w", "f64", [2], values(1.0039062509313226, -0.0)), out("xi", "i32", [7]),
       out("xb", "bool", [7]), out("wb", F, [2])])
@tn.kernel
def v13_casts(x: tn.Tensor[f32, 1], w: tn.Tensor[f64, 1], xi: tn.Tensor[i32, 1],
              xb: tn.Tensor[tn.bool_, 1], wb: tn.Tensor[f32, 1]):
    v = x[tn.coord(0), tn.shape(7)]
    xi(tn.coord(0), tn.shape(7)).store(tn.cast(v, i32))
    xb(tn.coord(0), tn.shape(7)).store(tn.cast(v, tn.bool_))
    wb(tn.coord(0), tn.shape(2)).store(tn.cast(tn.cast(w[tn.coord(0), tn.shape(2)], bf16), f32))


@tn.kernel
def v13_double_round(x: tn.Tensor[f32, 1], w: tn.Tensor[f64, 1], xi: tn.Tensor[i32, 1],
                     xb: tn.Tensor[tn.bool_, 1], wb: tn.Tensor[f32, 1]):
    v = x[tn.coord(0), tn.shape(7)]
    xi(tn.coord(0), tn.shape(7)).store(tn.cast(v, i32))
    xb(tn.coord(0), tn.shape(7)).store(tn.cast(v, tn.bool_))
    through = tn.cast(tn.cast(w[tn.coord(0), tn.shape(2)], f32), bf16)
    wb(tn.coord(0), tn.shape(2)).store(tn.cast(through, f32))


CASES[-1].wrong = v13_double_round


@case("V13-bitcast", "V-13", "bitcast keeps bits (NaN payloads included)",
      [t("x", "u32", [3], values(2143289345, 2147483648, 1065353216)), out("y", F, [3]),
       out("z", "u32", [3])])
@tn.kernel
def v13_bitcast(x: tn.Tensor[u32, 1], y: tn.Tensor[f32, 1], z: tn.Tensor[u32, 1]):
    f = tn.bitcast(x[tn.coord(0), tn.shape(3)], f32)
    y(tn.coord(0), tn.shape(3)).store(f)
    z(tn.coord(0), tn.shape(3)).store(tn.bitcast(f, u32))


# ---------------------------------------------------------------- V-14 transcendentals


@case("V14-transcendentals", "V-14", "f64 evaluation, one rounding; specials exact",
      [t("x", F, [8], values(0.0, 1.0, -3.5, 10.0, "-inf", "inf", "nan", "-0.0")),
       out("y", F, [48])])
@tn.kernel
def v14_fns(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    v = x[tn.coord(0), tn.shape(8)]
    y(tn.coord(0), tn.shape(8)).store(tn.exp(v))
    y(tn.coord(8), tn.shape(8)).store(tn.tanh(v))
    y(tn.coord(16), tn.shape(8)).store(tn.sigmoid(v))
    y(tn.coord(24), tn.shape(8)).store(tn.log1p(tn.abs(v)))
    y(tn.coord(32), tn.shape(8)).store(tn.erf(v))
    y(tn.coord(40), tn.shape(8)).store(tn.rsqrt(tn.abs(v)))


@tn.kernel
def v14_f32_steps(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    v = x[tn.coord(0), tn.shape(8)]
    y(tn.coord(0), tn.shape(8)).store(tn.exp(v))
    y(tn.coord(8), tn.shape(8)).store(tn.tanh(v))
    h = tn.cast(v, tn.f16)                                           # evaluated too narrow
    y(tn.coord(16), tn.shape(8)).store(tn.cast(tn.sigmoid(h), f32))
    y(tn.coord(24), tn.shape(8)).store(tn.log1p(tn.abs(v)))
    y(tn.coord(32), tn.shape(8)).store(tn.erf(v))
    y(tn.coord(40), tn.shape(8)).store(tn.cast(tn.rsqrt(tn.abs(h)), f32))


case("V14-sigmoid-rsqrt-one-rounding", "V-14",
     "sigmoid and rsqrt meet their f32 ulp bound (an f16 evaluation does not)",
     [t("x", F, [8], uniform(3, 0.1, 9.0)),
      out("y", F, [48])], wrong=v14_f32_steps)(v14_fns)

# ---------------------------------------------------------------- V-15 ite


@case("V15-ite-selects", "V-15", "ite with a safe divisor selects per element",
      [t("n", "i32", [3], values(7, 7, -9)), t("d", "i32", [3], values(2, 0, 4)),
       out("y", "i32", [3])])
@tn.kernel
def v15_guarded(n: tn.Tensor[i32, 1], d: tn.Tensor[i32, 1], y: tn.Tensor[i32, 1]):
    d = d.with_dims(n.dim(0))
    a, b = n[tn.coord(0), tn.shape(3)], d[tn.coord(0), tn.shape(3)]
    y(tn.coord(0), tn.shape(3)).store(tn.ite(b != 0, a / tn.ite(b != 0, b, 1), 0))


@case("V15-ite-evaluates-both", "V-15", "the unselected a/0 still raises: ite is not a guard",
      [t("n", "i32", [3], values(7, 7, -9)), t("d", "i32", [3], values(2, 0, 4)),
       out("y", "i32", [3])], "runtime")
@tn.kernel
def v15_unguarded(n: tn.Tensor[i32, 1], d: tn.Tensor[i32, 1], y: tn.Tensor[i32, 1]):
    d = d.with_dims(n.dim(0))
    a, b = n[tn.coord(0), tn.shape(3)], d[tn.coord(0), tn.shape(3)]
    y(tn.coord(0), tn.shape(3)).store(tn.ite(b != 0, a / b, 0))


# ---------------------------------------------------------------- V-16 map


@case("V16-map", "V-16", "a captured scalar lambda lifted over two tiles",
      [t("x", F, [5], normal(6)), t("y", F, [5], normal(7)), out("out", F, [5])])
@tn.kernel
def v16_map(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], out: tn.Tensor[f32, 1]):
    y = y.with_dims(x.dim(0))
    a, b = x[tn.coord(0), tn.shape(5)], y[tn.coord(0), tn.shape(5)]
    out(tn.coord(0), tn.shape(5)).store(tn.map(a, b, lambda p, q: tn.maximum(2.0 * p + q, 0.0)))


text_case("V16-map-mixed-dtypes", "V-16", "map's lambda arithmetic must have one dtype",
          mutate(v16_map, ("^(%a0: f32, %a1: f32):", "^(%a0: f32, %a1: f64):"),
                 ("%5 = map %a, %b", "%c = cast %b : tile<f64, [#x_0:5]>\n"
                                     "  %5 = map %a, %c")),
          [t("x", F, [5], normal(6)), t("y", F, [5], normal(7)), out("out", F, [5])], "type")

# ---------------------------------------------------------------- V-17 iota


@case("V17-iota-and-indices", "V-17", "iota and handle indices are exact i64 values",
      [out("y", "i64", [3, 4])])
@tn.kernel
def v17_iota(y: tn.Tensor[i64, 2]):
    for p in tn.parallel(tn.shape(3)):
        r = tn.iota(tn.shape(1, 4), 1) + p.index() * 10
        y(tn.coord(p.index(), 0), tn.shape(1, 4)).store(r)


@tn.kernel
def v17_iota_axis0(y: tn.Tensor[i64, 2]):
    for p in tn.parallel(tn.shape(3)):
        r = tn.iota(tn.shape(1, 4), 0) + p.index() * 10
        y(tn.coord(p.index(), 0), tn.shape(1, 4)).store(r)


CASES[-1].wrong = v17_iota_axis0

# ---------------------------------------------------------------- V-18 reindex


@case("V18-reindex-reverse", "V-18", "reindex reads x[fn(j)], here a reversal",
      [t("x", F, [5], arange(1)), out("y", F, [5])])
@tn.kernel
def v18_reverse(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, shift=0):
    v = x[tn.coord(0), tn.shape(5)]
    y(tn.coord(0), tn.shape(5)).store(tn.reindex(v, tn.shape(5), lambda i: (4 - i + shift,)))


case("V18-reindex-outside", "V-18", "a source coordinate outside the tile is a bounds error",
     [t("x", F, [5], arange(1)), out("y", F, [5])], "bounds")(v18_reverse.specialize(shift=1))

# ---------------------------------------------------------------- V-19 gather


@case("V19-gather-fallback", "V-19", "out-of-range indices give the fallback, never an error",
      [t("x", F, [4], arange(10, 10)), t("idx", "i32", [6], values(3, -1, 0, 4, 2, 2)),
       out("y", F, [6])])
@tn.kernel
def v19_gather(x: tn.Tensor[f32, 1], idx: tn.Tensor[i32, 1], y: tn.Tensor[f32, 1]):
    v = x[tn.coord(0), tn.shape(4)]
    i = idx[tn.coord(0), tn.shape(6)]
    y(tn.coord(0), tn.shape(6)).store(tn.gather(v, i, 0, -1.0))


@tn.kernel
def v19_clamped(x: tn.Tensor[f32, 1], idx: tn.Tensor[i32, 1], y: tn.Tensor[f32, 1]):
    v = x[tn.coord(0), tn.shape(4)]
    i = tn.maximum(tn.minimum(idx[tn.coord(0), tn.shape(6)], 3), 0)
    y(tn.coord(0), tn.shape(6)).store(tn.gather(v, i, 0, -1.0))


CASES[-1].wrong = v19_clamped

# ---------------------------------------------------------------- V-20 permute/reshape/broadcast


@case("V20-permute-reshape-broadcast", "V-20", "permute reorders dims, reshape is row-major",
      [t("x", F, [2, 3], arange()), out("tr", F, [3, 2]), out("r", F, [6]), out("b", F, [2, 3])])
@tn.kernel
def v20_shapes(x: tn.Tensor[f32, 2], tr: tn.Tensor[f32, 2], r: tn.Tensor[f32, 1],
               b: tn.Tensor[f32, 2]):
    m, n = x.dims()
    a = x[tn.coord(0, 0), tn.shape(2, 3)]
    tr(tn.coord(0, 0), tn.shape(3, 2)).store(tn.permute(a, (n, m)))
    r(tn.coord(0), tn.shape(6)).store(tn.reshape(tn.permute(a, (n, m)), tn.shape(6)))
    b(tn.coord(0, 0), tn.shape(2, 3)).store(tn.broadcast(tn.reduce(a, n, tn.add), a))


text_case("V20-reshape-count", "V-20", "reshape needs equal element counts",
          mutate(v20_shapes, ("%2 = reshape %1 : tile<f32, [#d0:6]>",
                              "%2 = reshape %1 : tile<f32, [#d0:5]>")),
          [t("x", F, [2, 3], arange()), out("tr", F, [3, 2]), out("r", F, [6]),
           out("b", F, [2, 3])], "type")

# ---------------------------------------------------------------- V-21 put


@case("V21-put-functional", "V-21", "put returns a new tile; the base snapshot is unchanged",
      [t("x", F, [3], values(7, 8, 9)), out("y", F, [6]), out("z", F, [6])])
@tn.kernel
def v21_put(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1], *, at=2):
    base = tn.zeros(f32, tn.shape(6))
    done = tn.put(base, tn.coord(at), x[tn.coord(0), tn.shape(3)])
    y(tn.coord(0), tn.shape(6)).store(done)
    z(tn.coord(0), tn.shape(6)).store(base)


case("V21-put-outside", "V-21", "a patch landing outside the target is a bounds error",
     [t("x", F, [3], values(7, 8, 9)), out("y", F, [6]), out("z", F, [6])],
     "bounds")(v21_put.specialize(at=4))

# ---------------------------------------------------------------- V-22 mma


@case("V22-mma-ordered", "V-22", "allow_reassociation=False: the unfused ordered recurrence",
      [t("a", "f16", [2, 5], normal(8)), t("b", "f16", [5, 3], normal(9)),
       t("c", F, [2, 3], const(0.5))])
@tn.kernel
def v22_mma(a: tn.Tensor[f16, 2], b: tn.Tensor[f16, 2], c: tn.Tensor[f32, 2]):
    m, k = a.dims()
    b = b.with_dims(k, c.dim(1))
    c = c.with_dims(m, c.dim(1))
    acc = c[tn.coord(0, 0), tn.shape(2, 3)]
    acc = tn.mma(a[tn.coord(0, 0), tn.shape(2, 5)], b[tn.coord(0, 0), tn.shape(5, 3)], acc,
                 allow_reassociation=False)
    c(tn.coord(0, 0), tn.shape(2, 3)).store(acc)


@tn.kernel
def v22_reversed(a: tn.Tensor[f16, 2], b: tn.Tensor[f16, 2], c: tn.Tensor[f32, 2]):
    m, k = a.dims()
    b = b.with_dims(k, c.dim(1))
    c = c.with_dims(m, c.dim(1))
    acc = c[tn.coord(0, 0), tn.shape(2, 3)]
    for kk in tn.serial(tn.shape(5), order="reverse"):
        acc = tn.mma(a[tn.coord(0, kk.index()), tn.shape(2, 1)],
                     b[tn.coord(kk.index(), 0), tn.shape(1, 3)], acc, allow_reassociation=False)
    c(tn.coord(0, 0), tn.shape(2, 3)).store(acc)


@case("V22-mma-reassociating", "V-22", "the default mma admits any order within the envelope",
      [t("a", F, [3, 64], {"pattern": "cancel", "seed": 10}), t("b", F, [64, 2], normal(11)),
       out("c", F, [3, 2])])
@tn.kernel
def v22_free(a: tn.Tensor[f32, 2], b: tn.Tensor[f32, 2], c: tn.Tensor[f32, 2]):
    m, k = a.dims()
    b = b.with_dims(k, c.dim(1))
    acc = tn.zeros(f32, tn.shape(3, 2), dims=(m, c.dim(1)))
    c(tn.coord(0, 0), tn.shape(3, 2)).store(
        tn.mma(a[tn.coord(0, 0), tn.shape(3, 64)], b[tn.coord(0, 0), tn.shape(64, 2)], acc))


text_case("V22-mma-lossy-input", "V-22", "an input dtype that does not convert exactly: rejected",
          mutate(v22_mma, ("%c: tensor<f32, [#c_0:c_0, #c_1:c_1]>",
                           "%c: tensor<f16, [#c_0:c_0, #c_1:c_1]>"),
                 ("tile<f32, [#a_0:2, #c_1:3]>", "tile<f16, [#a_0:2, #c_1:3]>")).replace(
              "%a: tensor<f16", "%a: tensor<f32").replace("tile<f16, [#a_0:2, #a_1:5]>",
                                                          "tile<f32, [#a_0:2, #a_1:5]>"),
          [t("a", F, [2, 5], normal(8)), t("b", "f16", [5, 3], normal(9)),
           t("c", "f16", [2, 3], const(0.5))], "type")

# ---------------------------------------------------------------- V-23 matmul


@case("V23-matmul", "V-23", "positional [M,K] x [K,N]", [t("a", F, [2, 3], arange()),
                                                         t("b", F, [3, 4], arange(1)),
                                                         out("c", F, [2, 4])])
@tn.kernel
def v23_matmul(a: tn.Tensor[f32, 2], b: tn.Tensor[f32, 2], c: tn.Tensor[f32, 2]):
    c(tn.coord(0, 0), tn.shape(2, 4)).store(
        tn.matmul(a[tn.coord(0, 0), tn.shape(2, 3)], b[tn.coord(0, 0), tn.shape(3, 4)]))


@tn.kernel
def v23_transposed(a: tn.Tensor[f32, 2], b: tn.Tensor[f32, 2], c: tn.Tensor[f32, 2]):
    m, k = a.dims()
    acc = tn.zeros(f32, tn.shape(2, 4), dims=(m, c.dim(1)))
    bt = b.with_dims(c.dim(1), k)[tn.coord(0, 0), tn.shape(4, 3)]     # reads b as [N, K]
    c(tn.coord(0, 0), tn.shape(2, 4)).store(tn.mma(a[tn.coord(0, 0), tn.shape(2, 3)], bt, acc))


CASES[-1].wrong = v23_transposed


@case("V13-bf16-storage", ("V-13", "V-9"), "bf16 storage, f32 arithmetic, one rounding back",
      [t("x", "bf16", [2, 3], normal(12)), out("y", "bf16", [2, 3])])
@tn.kernel
def v13_bf16(x: tn.Tensor[bf16, 2], y: tn.Tensor[bf16, 2]):
    v = tn.cast(x[tn.coord(0, 0), tn.shape(2, 3)], f32)
    y(tn.coord(0, 0), tn.shape(2, 3)).store(tn.cast(v * 3.0 + 0.1, bf16))


@tn.kernel
def v13_bf16_arith(x: tn.Tensor[bf16, 2], y: tn.Tensor[bf16, 2]):
    v = x[tn.coord(0, 0), tn.shape(2, 3)]
    y(tn.coord(0, 0), tn.shape(2, 3)).store(v * 3.0 + 0.1)       # rounds after every op


CASES[-1].wrong = v13_bf16_arith


# ---------------------------------------------------------------- V-24 FP8


@case("V24-fp8-decode-every-code", "V-24",
      "each of the 256 codes of both FP8 formats converts exactly to f32",
      [t("x", "u8", [256], arange()), out("a", F, [256]), out("b", F, [256])])
@tn.kernel
def v24_decode(x: tn.Tensor[u8, 1], a: tn.Tensor[f32, 1], b: tn.Tensor[f32, 1]):
    v = x[tn.coord(0), tn.shape(256)]
    a(tn.coord(0), tn.shape(256)).store(tn.cast(tn.bitcast(v, f8e4m3fn), f32))
    b(tn.coord(0), tn.shape(256)).store(tn.cast(tn.bitcast(v, f8e5m2), f32))


@tn.kernel
def v24_swapped(x: tn.Tensor[u8, 1], a: tn.Tensor[f32, 1], b: tn.Tensor[f32, 1]):
    v = x[tn.coord(0), tn.shape(256)]
    a(tn.coord(0), tn.shape(256)).store(tn.cast(tn.bitcast(v, f8e5m2), f32))  # the other format
    b(tn.coord(0), tn.shape(256)).store(tn.cast(tn.bitcast(v, f8e4m3fn), f32))


CASES[-1].wrong = v24_swapped

_V24_X = values(448.0, 464.0, 464.5, -1e6, "inf", "-inf", "nan", 2.0**-10, 3 * 2.0**-11, 0.3,
                "-0.0", 61440.0)


@case("V24-fp8-encode", "V-24",
      "into FP8: one rounding to nearest even from the exact value; overflow as stated",
      [t("x", F, [12], _V24_X), t("w", "f64", [2], values(1.0625 + 2.0**-40, -1.1875 - 2.0**-41)),
       out("sat", "u8", [12]), out("nf", "u8", [12]), out("e5", "u8", [12]),
       out("e5s", "u8", [12]), out("wq", "u8", [2])])
@tn.kernel
def v24_encode(x: tn.Tensor[f32, 1], w: tn.Tensor[f64, 1], sat: tn.Tensor[u8, 1],
               nf: tn.Tensor[u8, 1], e5: tn.Tensor[u8, 1], e5s: tn.Tensor[u8, 1],
               wq: tn.Tensor[u8, 1]):
    v = x[tn.coord(0), tn.shape(12)]
    sat(tn.coord(0), tn.shape(12)).store(
        tn.bitcast(tn.cast(v, f8e4m3fn, overflow="saturate"), u8))
    nf(tn.coord(0), tn.shape(12)).store(
        tn.bitcast(tn.cast(v, f8e4m3fn, overflow="nonfinite"), u8))
    e5(tn.coord(0), tn.shape(12)).store(tn.bitcast(tn.cast(v, f8e5m2, overflow="nonfinite"), u8))
    e5s(tn.coord(0), tn.shape(12)).store(tn.bitcast(tn.cast(v, f8e5m2, overflow="saturate"), u8))
    wq(tn.coord(0), tn.shape(2)).store(
        tn.bitcast(tn.cast(w[tn.coord(0), tn.shape(2)], f8e4m3fn, overflow="nonfinite"), u8))


@tn.kernel
def v24_through_f32(x: tn.Tensor[f32, 1], w: tn.Tensor[f64, 1], sat: tn.Tensor[u8, 1],
                    nf: tn.Tensor[u8, 1], e5: tn.Tensor[u8, 1], e5s: tn.Tensor[u8, 1],
                    wq: tn.Tensor[u8, 1]):
    v = x[tn.coord(0), tn.shape(12)]
    sat(tn.coord(0), tn.shape(12)).store(
        tn.bitcast(tn.cast(v, f8e4m3fn, overflow="saturate"), u8))
    nf(tn.coord(0), tn.shape(12)).store(
        tn.bitcast(tn.cast(v, f8e4m3fn, overflow="nonfinite"), u8))
    e5(tn.coord(0), tn.shape(12)).store(tn.bitcast(tn.cast(v, f8e5m2, overflow="nonfinite"), u8))
    e5s(tn.coord(0), tn.shape(12)).store(tn.bitcast(tn.cast(v, f8e5m2, overflow="saturate"), u8))
    once = tn.cast(w[tn.coord(0), tn.shape(2)], f32)  # a second rounding
    wq(tn.coord(0), tn.shape(2)).store(tn.bitcast(tn.cast(once, f8e4m3fn, overflow="nonfinite"),
                                                  u8))


CASES[-1].wrong = v24_through_f32

text_case("V24-fp8-no-arithmetic", "V-24", "an add on FP8 values is ill-typed",
          mutate(v24_decode, ("%0 = bitcast %v : tile<f8e4m3fn, [#x_0:256]>",
                              "%0 = bitcast %v : tile<f8e4m3fn, [#x_0:256]>\n"
                              "  %9 = add %0, %0 : tile<f8e4m3fn, [#x_0:256]>")),
          [t("x", "u8", [256], arange()), out("a", F, [256]), out("b", F, [256])], "type")

text_case("V24-fp8-cast-needs-policy", "V-24", "a cast into FP8 without an overflow policy is "
          "ill-typed", mutate(v24_encode, ('%0 = cast %v {overflow = "saturate"}', "%0 = cast %v")),
          [t("x", F, [12], _V24_X), t("w", "f64", [2], values(1.0, 2.0)),
           out("sat", "u8", [12]), out("nf", "u8", [12]), out("e5", "u8", [12]),
           out("e5s", "u8", [12]), out("wq", "u8", [2])], "type")


_BOUNDARY = [t("at", "u32", [8192], arange(0, 2**19)), t("up", "u32", [8192], arange(1, 2**19)),
             t("dn", "u32", [8192], arange(2**19 - 1, 2**19))] + [
    out(n, "u8", [3 * 8192]) for n in ("e4s", "e4n", "e5s", "e5n")]


@case("V24-fp8-every-boundary", "V-24",
      "every f32 with 4 fraction bits (each FP8 value and each midpoint, subnormals, "
      "overflow) and its two f32 neighbours, into both formats with both policies",
      _BOUNDARY)
@tn.kernel
def v24_boundaries(at: tn.Tensor[u32, 1], up: tn.Tensor[u32, 1], dn: tn.Tensor[u32, 1],
                   e4s: tn.Tensor[u8, 1], e4n: tn.Tensor[u8, 1], e5s: tn.Tensor[u8, 1],
                   e5n: tn.Tensor[u8, 1]):
    for i, src in enumerate((at, up, dn)):
        x = tn.bitcast(src[tn.coord(0), tn.shape(8192)], f32)
        for o, dt, pol in ((e4s, f8e4m3fn, "saturate"), (e4n, f8e4m3fn, "nonfinite"),
                           (e5s, f8e5m2, "saturate"), (e5n, f8e5m2, "nonfinite")):
            o(tn.coord(i * 8192), tn.shape(8192)).store(
                tn.bitcast(tn.cast(x, dt, overflow=pol), u8))


@tn.kernel
def v24_through_f16(at: tn.Tensor[u32, 1], up: tn.Tensor[u32, 1], dn: tn.Tensor[u32, 1],
                    e4s: tn.Tensor[u8, 1], e4n: tn.Tensor[u8, 1], e5s: tn.Tensor[u8, 1],
                    e5n: tn.Tensor[u8, 1]):
    for i, src in enumerate((at, up, dn)):
        x = tn.cast(tn.bitcast(src[tn.coord(0), tn.shape(8192)], f32), f16)  # rounds first
        for o, dt, pol in ((e4s, f8e4m3fn, "saturate"), (e4n, f8e4m3fn, "nonfinite"),
                           (e5s, f8e5m2, "saturate"), (e5n, f8e5m2, "nonfinite")):
            o(tn.coord(i * 8192), tn.shape(8192)).store(
                tn.bitcast(tn.cast(x, dt, overflow=pol), u8))


CASES[-1].wrong = v24_through_f16

