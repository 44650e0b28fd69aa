"""Hand-built TileIR programs for the interchange tests.

Together they hold every op of ``ops.REGISTRY``, every attribute kind, every
type class, labelled and unlabelled dims, every exec scope and every
pipeline/bounds/reduction policy, custom reducers, nested regions and source
locations. They need not type-check: the interchange forms are syntactic.
Dims are the canonical table entries ``Dim(("p", i), label)`` so that the
readers reproduce them exactly.
"""

from __future__ import annotations

import math

from tilenest.errors import Site
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E
from tilenest.semantics.ir import Block, FrozenDict, Operation, TileProgram, Value
from tilenest.semantics.maps import Map, MemLayout, strided_layout
from tilenest.semantics.ops.values import BINARY, COMPARE, UNARY_ANY, UNARY_FLOAT, UNARY_PRED
from tilenest.semantics.policies import (
    EXEC_SCOPES,
    Bounds,
    BoundsPolicy,
    ExecPolicy,
    PipelinePolicy,
    ReductionPolicy,
)
from tilenest.semantics.reducers import CustomReducer
from tilenest.semantics.space import Dim, DimFactor, IndexSet, Space
from tilenest.semantics.types import MemoryType, StateType, TensorType, TileType, scalar

R, C, N = E.Sym("R"), E.Sym("C"), E.Sym("N")
Vp, Vq, V0, V1 = E.Var("p"), E.Var("q"), E.Var("0"), E.Var("1")


def dims(*labels: str | None) -> tuple[Dim, ...]:
    return tuple(Dim(("p", i), lab) for i, lab in enumerate(labels))


def tile(dt: D.DType, *pairs: tuple[Dim, E.IntLike]) -> TileType:
    return TileType(dt, Space.of(*pairs))


def op(name: str, /, *operands: Value, res: tuple[Value, ...] = (), regions: tuple[Block, ...] = (),
       loc: Site | None = None, **attrs: object) -> Operation:
    return Operation(name, tuple(operands), tuple(res), FrozenDict(attrs), tuple(regions), loc)


def blk(*ops: Operation, args: tuple[Value, ...] = ()) -> Block:
    return Block(tuple(args), tuple(ops))


def yld(*vals: Value) -> Operation:
    return op("yield", *vals)


def iset(vars_: tuple[str, ...], pairs: tuple[tuple[Dim, E.IntLike], ...],
         pred: E.Pred = E.TRUE) -> IndexSet:
    return IndexSet(Space.of(*pairs), vars_, pred)


def program(name: str, args: tuple[Value, ...], syms: tuple[str, ...], dims_: tuple[Dim, ...],
            body: Block, *, assume: tuple[E.Pred, ...] = (), reducers: tuple = (),
            loc: Site | None = None) -> TileProgram:
    return TileProgram(name, args, syms, assume, dims_, body, reducers, loc)


# ---------------------------------------------------------------------------


def row_softmax() -> TileProgram:
    """The example of the brief: a parallel over rows with two reductions."""
    x0, x1, y0, y1, d0 = dm = dims("x.0", "x.1", "y.0", "y.1", None)
    x = Value("x", TensorType(D.f32, (R, C), (x0, x1)))
    y = Value("y", TensorType(D.f32, (R, C), (y0, y1)))
    eps = Value("eps", scalar(D.f32))
    row_t = tile(D.f32, (x0, 1), (x1, C))
    col_t = tile(D.f32, (x0, 1))
    f = "softmax.py"
    row = Value("row", row_t)
    z = Value("z", col_t)
    m = Value("m", col_t)
    s = Value("s", col_t)
    e_ = Value("e", col_t)
    n_ = Value("n", col_t)
    ex = Value("ex", row_t)
    sh = Value("sh", row_t)
    tot = Value("tot", col_t)
    s2 = Value("s2", col_t)
    e2 = Value("e2", col_t)
    n2 = Value("n2", col_t)
    q = Value("q", row_t)
    qe = Value("qe", row_t)
    view = {"vars": ("0", "1"), "map": (Vp + V0, V1), "valid": E.TRUE, "bounds": BoundsPolicy()}
    reduce_max = op(
        "reduce", z, res=(m,), vars=("c",),
        domain=iset(("c",), ((x1, C),)), policy=ReductionPolicy.unordered_tree,
        contracts=("max",),
        regions=(blk(
            op("reindex", row, res=(e_,), vars=("0",), map=(V0, E.Var("c"))),
            op("maximum", s, e_, res=(n_,)),
            yld(n_), args=(s,)),))
    reduce_sum = op(
        "reduce", z, res=(tot,), vars=("c",),
        domain=iset(("c",), ((x1, C),), E.Var("c").lt(C)), policy=ReductionPolicy.fold_left,
        contracts=("add",), loc=Site(f, 12, 8),
        regions=(blk(
            op("reindex", ex, res=(e2,), vars=("0",), map=(V0, E.Var("c"))),
            op("add", s2, e2, res=(n2,)),
            yld(n2), args=(s2,)),))
    par = op(
        "parallel", vars=("p",), domain=iset(("p",), ((d0, R),)), level=1,
        exec=ExecPolicy(scope="warp"), loc=Site(f, 7, 4),
        regions=(blk(
            op("tensor.load", x, res=(row,), loc=Site(f, 8, 8), **view),
            op("const", res=(z,), value=-math.inf),
            reduce_max,
            op("sub", row, m, res=(sh,)),
            op("exp", sh, res=(ex,)),
            reduce_sum,
            op("div", ex, tot, res=(q,)),
            op("add", q, eps, res=(qe,)),
            op("tensor.store", y, qe, vars=("0", "1"), map=(Vp + V0, V1), valid=E.TRUE,
               bounds=BoundsPolicy(Bounds.checked)),
            yld()),))
    return program("row_softmax", (x, y, eps), ("R", "C"), dm, blk(par),
                   assume=(R.ge(1), C.ge(1)), loc=Site(f, 5, 0))


def all_values() -> TileProgram:
    """One of each pure value op, constants of every number flavour, memory ops."""
    m, n, k, kk, blank, mn, d6, u = dm = dims("m", "n", "k", "k", "", "m n", None, "u")
    A = Value("A", TensorType(D.f16, (N, 8), (m, n)))
    Bt = Value("B", TensorType(D.i32, (N,), (k,)))
    f2 = tile(D.f32, (m, 4), (n, 8))
    i2 = tile(D.i32, (m, 4), (n, 8))
    b2 = tile(D.bool_, (m, 4), (n, 8))
    ops: list[Operation] = []

    def val(name: str, t: object) -> Value:
        return Value(name, t)

    a, b, c = val("a", f2), val("b", f2), val("c", f2)
    i, bo, t = val("i", i2), val("bo", b2), val("t", scalar(D.bool_))
    ops += [
        op("const", res=(a,), value=1.5, loc=Site(None, 3, 2)),
        op("const", res=(b,), value=-0.0),
        op("const", res=(c,), value=2.5e-300),
        op("const", res=(i,), value=-(2 ** 31)),
        op("const", res=(bo,), value=True),
        op("const", res=(t,), value=False),
        op("const", res=(val("nan", f2),), value=math.nan),
        op("const", res=(val("inf", f2),), value=math.inf),
        op("const", res=(val("ninf", f2),), value=-math.inf),
        op("const", res=(val("one", f2),), value=1.0),
        op("const", res=(val("seven", scalar(D.u8)),), value=7),
        op("const", res=(val("odd_dims", tile(D.f64, (blank, 2), (d6, N))),), value=3),
    ]
    for name in UNARY_FLOAT + UNARY_ANY:
        ops.append(op(name, a, res=(val("u_" + name, f2),)))
    for name in UNARY_PRED:
        ops.append(op(name, a, res=(val("u_" + name, b2),)))
    ops.append(op("bitnot", i, res=(val("u_bitnot", i2),)))
    ops.append(op("not", bo, res=(val("u_not", b2),)))
    for name in BINARY:
        x_, y_ = (i, i) if name in ("and", "or", "xor", "shl", "shr") else (a, b)
        ops.append(op(name, x_, y_, res=(val("b_" + name, x_.type),)))
    for name in COMPARE:
        ops.append(op(name, a, b, res=(val("c_" + name, b2),)))
    idx = val("idx", tile(D.i64, (m, 4), (u, 2)))
    mp_out = val("mp", f2)
    p_, q_ = val("p_", scalar(D.f32)), val("q_", scalar(D.f32))
    r_ = val("r_", scalar(D.f32))
    ops += [
        op("ite", bo, a, b, res=(val("sel", f2),)),
        op("cast", a, res=(val("cst", tile(D.bf16, (m, 4), (n, 8))),)),
        op("bitcast", a, res=(val("bc", i2),)),
        op("index", res=(idx,), vars=("0", "1"), value=V0 * 8 + (V1 ^ 1)),
        op("map", a, b, res=(mp_out,), regions=(blk(
            op("add", p_, q_, res=(r_,)), yld(r_), args=(p_, q_)),)),
        op("reindex", a, res=(val("ri", tile(D.f32, (n, 8), (m, 4))),), vars=("0", "1"),
           map=(V1, V0)),
        op("gather", a, idx, res=(val("g", tile(D.f32, (m, 4), (u, 2), (n, 8))),), axis=0,
           fallback=0.0),
        op("gather", a, idx, res=(val("g2", f2),), axis=1, fallback=-1),
        op("gather", a, idx, res=(val("g3", f2),), axis=1, fallback=True),
        op("broadcast", t, res=(val("bb", b2),)),
        op("reshape", a, res=(val("rs", tile(D.f32, (mn, 32))),)),
        op("permute", a, res=(val("pm", tile(D.f32, (n, 8), (m, 4))),), perm=(1, 0)),
        op("put", a, b, res=(val("pt", f2),), origin=(E.Const(0), N // 2 - 1)),
        op("mma", a, b, c, res=(val("mm", f2),), allow_reassociation=False),
        op("mma", a, b, c, res=(val("mm2", f2),), allow_reassociation=True),
        op("per", a, res=(val("pr", f2),), level=1),
    ]
    # memory: a padded, swizzled shared layout and a plain strided one
    lay = MemLayout(("0", "1"), V0 * 9 + (V1 ^ (V0 % 8)), E.Const(36))
    mem = val("mem", MemoryType(D.f32, Space.of((m, 4), (n, 8)), lay, "shared"))
    st0 = val("st0", StateType("mem"))
    st1 = val("st1", StateType("mem"))
    mem2 = val("mem2", MemoryType(D.i32, Space.of((kk, N)), strided_layout(("0",), (N,)), "auto"))
    st2 = val("st2", StateType("mem2"))
    ops += [
        op("memory.alloc", res=(mem, st0), loc=Site("k.py", 40, 0)),
        op("memory.store", mem, st0, a, res=(st1,)),
        op("memory.load", mem, st1, res=(val("ml", f2),)),
        op("memory.alloc", res=(mem2, st2)),
        op("tensor.load", A, res=(val("la", tile(D.f16, (m, 4), (n, 8))),), vars=("0", "1"),
           map=(V0 + N - 4, V1), valid=(V0.lt(4) & ~V1.ge(8)) | V0.eq(0),
           bounds=BoundsPolicy(Bounds.fill, -0.0)),
        op("tensor.load", Bt, res=(val("lb", tile(D.i32, (k, N))),), vars=("0",),
           map=(V0,), valid=V0.ne(N + 1), bounds=BoundsPolicy(Bounds.fill, 7)),
        op("tensor.load", Bt, res=(val("lc", tile(D.i32, (k, N))),), vars=("0",),
           map=(E.minimum(V0, N - 1),), valid=E.FALSE, bounds=BoundsPolicy(Bounds.assume)),
        op("tensor.load", A, res=(val("ld", tile(D.f16, (m, 4), (n, 8))),), vars=("0", "1"),
           map=(E.maximum(V0 // 2, V0 % 3), (V1 << 1) | (V1 >> 2) & 3), valid=E.TRUE,
           bounds=BoundsPolicy(Bounds.fill, math.inf)),
        op("tensor.load", A, res=(val("le", tile(D.f16, (m, 4), (n, 8))),), vars=("0", "1"),
           map=(E.Val("seven") * V0, V1), valid=E.TRUE,
           bounds=BoundsPolicy(Bounds.fill, math.nan)),
        op("tensor.load", A, res=(val("lf", tile(D.f16, (m, 4), (n, 8))),), vars=("0", "1"),
           map=(V0, V1), valid=E.TRUE, bounds=BoundsPolicy(Bounds.fill, False)),
        op("tensor.store", Bt, i, vars=("0", "1"), map=(V0 * 8 + V1,),
           valid=(V0 * 8 + V1).lt(N),
           bounds=BoundsPolicy(Bounds.zero)),
    ]
    return program("all_values", (A, Bt), ("N",), dm, blk(*ops),
                   assume=(N.ge(8), (N % 2).eq(0)))


def nested() -> TileProgram:
    """Nested regions, every policy, custom reducers, block arguments of the body."""
    g, w, t, s, kd, v = dm = dims("grid", "warp", "thread", "step", "k", "vec")
    X = Value("X", TensorType(D.f32, (N, N), (g, w)))
    nb = Value("nb", scalar(D.i32))
    acc = Value("acc", tile(D.f32, (w, 32)))
    f32 = scalar(D.f32)

    # custom reducers: welford with merge and lift; a second one without lift
    ma, mb, mc, md = (Value(n, f32) for n in ("ma", "mb", "mc", "md"))
    ms, mt = Value("ms", f32), Value("mt", f32)
    merge = blk(op("add", ma, mc, res=(ms,)), op("add", mb, md, res=(mt,)), yld(ms, mt),
                args=(ma, mb, mc, md))
    lx, l1 = Value("ma", f32), Value("l1", f32)
    lift = blk(op("const", res=(l1,), value=1.0), yld(lx, l1), args=(lx,))
    welford = CustomReducer("welford", (D.f32, D.f32), (0.0, -0.0), merge, lift, True, False)
    oa, ob, oc = Value("oa", scalar(D.i32)), Value("ob", scalar(D.i32)), Value("oc", scalar(D.i32))
    orr = CustomReducer("bor", (D.i32,), (0,), blk(op("or", oa, ob, res=(oc,)), yld(oc),
                                                    args=(oa, ob)),
                        None, True, True, provenance="proved")

    pa = Value("pa", tile(D.f32, (w, 32)))
    prs, prt = Value("prs", f32), Value("prt", f32)
    inner_p = op(
        "parallel", vars=("t",), domain=iset(("t",), ((t, 32),)), level=2,
        exec=ExecPolicy(scope="thread", layout=Map(("0",), (V0 * 2 % 32 + V0 // 16,))),
        regions=(blk(yld()),))
    ser = op("serial", vars=("i",), domain=iset(("i",), ((s, E.cdiv(N, 32)),)),
             order="reverse", loc=Site("n.py", 20, 6), regions=(blk(inner_p, yld()),))
    a0 = Value("a0", tile(D.f32, (w, 32)))
    ld = Value("ld", tile(D.f32, (w, 32)))
    st_out = Value("st_out", tile(D.f32, (w, 32)))
    a1 = Value("a1", tile(D.f32, (w, 32)))
    pipe = op(
        "pipeline", pa, res=(a1,), vars=("j",), domain=iset(("j",), ((kd, N),), E.Var("j").lt(N)),
        policy=PipelinePolicy(window=3, interval=2),
        regions=(blk(
            op("stage", res=(ld,), name="load", ordinal=0, regions=(blk(
                op("tensor.load", X, res=(Value("ld_in", tile(D.f32, (w, 32))),),
                   vars=("0",), map=(E.Var("j"), V0), valid=E.TRUE,
                   bounds=BoundsPolicy(Bounds.zero)),
                yld(Value("ld_in", tile(D.f32, (w, 32))))),)),
            op("stage", res=(st_out,), name="compute", ordinal=1, regions=(blk(
                op("add", a0, ld, res=(Value("sum_", tile(D.f32, (w, 32))),)),
                yld(Value("sum_", tile(D.f32, (w, 32))))),)),
            yld(st_out), args=(a0,)),))
    rs, rt = Value("rs", f32), Value("rt", f32)
    r_in_a, r_in_b = Value("ra", f32), Value("rb", f32)
    red = op(
        "reduce", prs, prt, res=(Value("r_out", f32), Value("r_out2", f32)),
        vars=("r", "r2"), domain=iset(("r", "r2"), ((v, 4), (kd, 2)),
                                       E.Var("r").le(E.Var("r2")) | E.Var("r").gt(2)),
        policy=ReductionPolicy.ordered_tree, contracts=("add", "@welford", None),
        regions=(blk(yld(r_in_a, r_in_b), args=(r_in_a, r_in_b)),))
    folds = [op("reduce", nb, res=(Value(f"f_{pol.value}", scalar(D.i32)),), vars=("r",),
                domain=iset(("r",), ((v, 4),)), policy=pol, contracts=("@bor",),
                regions=(blk(yld(Value(f"fa_{pol.value}", scalar(D.i32))),
                             args=(Value(f"fa_{pol.value}", scalar(D.i32)),)),))
             for pol in (ReductionPolicy.fold_right, ReductionPolicy.unordered_tree)]
    cnd = Value("cnd", scalar(D.bool_))
    iff = op("if", cnd, res=(Value("if_r", f32),), regions=(
        blk(yld(prs)), blk(op("neg", prs, res=(Value("nrs", f32),)), yld(Value("nrs", f32)))))
    wa, wb, wc = Value("wa", scalar(D.i32)), Value("wb", scalar(D.i32)), Value("wc", scalar(D.bool_))
    wz = Value("wz", scalar(D.i32))
    wh = op("while", nb, res=(Value("w_out", scalar(D.i32)),), regions=(
        blk(op("const", res=(wz,), value=0), op("gt", wa, wz, res=(wc,)), yld(wc), args=(wa,)),
        blk(op("sub", wb, wb, res=(Value("wd", scalar(D.i32)),)),
            yld(Value("wd", scalar(D.i32))), args=(wb,))))
    outer = op(
        "parallel", acc, rs, rt, res=(Value("acc_out", tile(D.f32, (w, 32))), Value("o2", f32),
                                      Value("o3", f32)),
        vars=("b", "c"), domain=iset(("b", "c"), ((g, E.cdiv(N, 64)), (w, 4))), level=0,
        exec=ExecPolicy(scope="block", layout=Map(("0", "1"), (V1, V0))),
        regions=(blk(ser, pipe, red, *folds, iff, wh,
                     yld(a1, Value("r_out", f32), Value("r_out2", f32)),
                     args=(pa, prs, prt)),))
    # exec policies: every scope, an empty one and a layout-only one
    extra = [op("parallel", vars=("e",), domain=iset(("e",), ((v, 2),)), level=3,
                exec=ExecPolicy(scope=sc), regions=(blk(yld()),)) for sc in EXEC_SCOPES]
    extra.append(op("parallel", vars=("e",), domain=iset(("e",), ((v, 2),)), level=3,
                    exec=ExecPolicy(), regions=(blk(yld()),)))
    extra.append(op("parallel", vars=("e",), domain=iset(("e",), ((v, 2),)), level=3,
                    exec=ExecPolicy(layout=Map((), ())), regions=(blk(yld()),)))
    extra.append(op("parallel", vars=(), domain=iset((), ()), level=0, regions=(blk(yld()),)))
    extra.append(op("pipeline", vars=("j",), domain=iset(("j",), ((kd, 2),)),
                    policy=PipelinePolicy(window=0), regions=(blk(yld()),)))
    body = blk(
        op("const", res=(cnd,), value=True),
        op("const", res=(rs,), value=0.0),
        op("const", res=(rt,), value=1.0),
        outer, *extra, args=(acc,))
    return program("nested", (X, nb), ("N",), dm, body, assume=(N.gt(0),),
                   reducers=(welford, orr), loc=Site("n.py", 1, 0))


def empty() -> TileProgram:
    """The smallest program: no args, no syms, no dims, no ops."""
    return program("empty", (), (), (), blk())


SAMPLES = {"row_softmax": row_softmax, "all_values": all_values, "nested": nested,
           "empty": empty}


def walk_all(p: TileProgram) -> list[Operation]:
    """Every op of ``p``: body and custom reducers."""
    out = list(p.walk())
    for r in p.reducers:
        out += list(r.merge.walk())
        if r.lift is not None:
            out += list(r.lift.walk())
    return out


__all__ = [
    "SAMPLES",
    "DimFactor",
    "blk",
    "dims",
    "iset",
    "op",
    "program",
    "tile",
    "walk_all",
    "yld",
]
