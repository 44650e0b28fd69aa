"""Pure value ops: constants, lifted elementwise scalar functions, index tiles,
reindex/gather/broadcast/reshape/permute/put, and the ``mma`` primitive.

Elementwise meaning (the lifting rule)::

    f(v0, ..., vn)[q] = f(v0[project_0(q)], ..., vn[project_n(q)])

The output space is the *identity join* of the operand spaces: dims are matched
by identity (never by label, extent or position), ordered by first appearance
from left to right. A dim missing from an operand broadcasts; a dim present in
two operands with different extents is an error.
"""

from __future__ import annotations

from typing import Any

from ...errors import TypeCheckError
from .. import dtypes as D
from .. import expr as E
from .. import numerics as N
from ..space import DimFactor, Space, dim_names
from ..types import TileType
from . import define, type_rule

UNARY_FLOAT = ("exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "sin",
               "cos", "tanh", "erf", "sigmoid", "floor", "ceil", "trunc", "round")
UNARY_ANY = ("neg", "abs")
UNARY_INT = ("bitnot",)
UNARY_BOOL = ("not",)
UNARY_PRED = ("isnan", "isinf", "isfinite", "signbit")
BINARY_ARITH = ("add", "sub", "mul", "div", "rem", "floordiv", "mod", "maximum", "minimum",
                "pow", "atan2")
BINARY_BITS = ("and", "or", "xor", "shl", "shr")
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")

UNARY = UNARY_FLOAT + UNARY_ANY + UNARY_INT + UNARY_BOOL + UNARY_PRED
BINARY = BINARY_ARITH + BINARY_BITS
ELEMENTWISE = UNARY + BINARY + COMPARE + ("ite", "cast", "bitcast")

for _n in UNARY:
    define(_n, "values", optional=(("ulp", "number"),) if _n in N.DECLARABLE_ULP else (),
           traits=("pure", "elementwise"), operands=(1, 1))
for _n in BINARY + COMPARE:
    define(_n, "values", traits=("pure", "elementwise"), operands=(2, 2))
define("ite", "values", traits=("pure", "elementwise"), operands=(3, 3))
define("cast", "values", optional=(("overflow", "str"),), traits=("pure", "elementwise"),
       operands=(1, 1))
define("bitcast", "values", traits=("pure", "elementwise"), operands=(1, 1))
define("const", "values", attrs=(("value", "number"),), traits=("pure",), operands=(0, 0))
define("index", "values", attrs=(("vars", "vars"), ("value", "expr")), traits=("pure",),
       operands=(0, 0))
define("map", "values", traits=("pure", "elementwise"), regions=1, operands=(1, None))
define("reindex", "values", attrs=(("vars", "vars"), ("map", "exprs")), traits=("pure",),
       operands=(1, 1))
define("gather", "values", attrs=(("axis", "int"), ("fallback", "number")), traits=("pure",),
       operands=(2, 2))
define("broadcast", "values", traits=("pure",), operands=(1, 1))
define("reshape", "values", traits=("pure",), operands=(1, 1))
define("permute", "values", attrs=(("perm", "ints"),), traits=("pure",), operands=(1, 1))
define("put", "values", attrs=(("origin", "exprs"),), traits=("pure",), operands=(2, 2))
define("mma", "values", attrs=(("allow_reassociation", "bool"),), traits=("pure",),
       operands=(3, 3))
define("per", "values", attrs=(("level", "int"),), traits=("pure",), operands=(1, 1))


def _tile(t: Any, what: str) -> TileType:
    if not isinstance(t, TileType):
        raise TypeCheckError(f"{what} must be a tile or scalar value, got {t}")
    return t


def describe_space(s: Space, names: dict | None = None) -> str:
    """``[label:extent, ...]``; ``names`` (from :func:`dim_names`) overrides labels."""
    names = names or {}
    return "[" + ", ".join(f"{names.get(f.dim, f.dim.describe())}:{E.to_str(f.extent)}"
                           for f in s.factors) + "]"


def join_spaces(spaces: list[Space], what: str = "operands", nested: bool = False) -> Space:
    """The identity join of ``spaces`` (see module docstring). With ``nested``
    (elementwise ops), every operand's dims must lie within one operand's dims:
    a missing dim broadcasts, but two operands each having a dim the other lacks
    would silently form an outer product, which is rejected as ambiguous."""
    if nested:
        big = max(spaces, key=lambda s: s.rank)
        for s in spaces:
            extra = [f.dim for f in s.factors if not big.has(f.dim)]
            if extra:
                mine = [f.dim for f in big.factors if not s.has(f.dim)]
                names, notes = dim_names(extra + mine)
                raise TypeCheckError(
                    f"the {what} have unrelated dims: {', '.join(names[d] for d in extra)} "
                    f"vs {', '.join(names[d] for d in mine)} (dims are identities, not extents)",
                    hint="give shared axes one identity with with_dims(...) or tn.reindex, or "
                         "broadcast explicitly with tn.broadcast(x, shape)", notes=notes)
    out: list[DimFactor] = []
    where: dict[Any, int] = {}
    for s in spaces:
        for f in s.factors:
            i = where.get(f.dim)
            if i is None:
                where[f.dim] = len(out)
                out.append(f)
            elif out[i].extent != f.extent:
                raise TypeCheckError(
                    f"dim '{f.dim.describe()}' has extent {E.to_str(out[i].extent)} in one of the "
                    f"{what} and {E.to_str(f.extent)} in another",
                    hint="only a missing dim broadcasts; slice or reindex so extents agree")
    return Space(tuple(out))


def _same_dtype(ts: list[TileType], name: str) -> D.DType:
    dts = {t.dtype for t in ts}
    if len(dts) != 1:
        raise TypeCheckError(
            f"'{name}' operands have different dtypes: {', '.join(sorted(map(str, dts)))}",
            hint="convert explicitly with tn.cast(x, dtype)")
    return ts[0].dtype


def _fp8_arithmetic(name: str, dt: D.DType) -> None:
    """FP8 operands reach only the ops of ``dtypes.FP8_OPS`` (conversions,
    selection, comparisons, classification): the formats are for storage,
    and the calculus defines no arithmetic on them."""
    if dt.is_fp8 and name not in D.FP8_OPS:
        raise TypeCheckError(
            f"'{name}' on {dt} values: FP8 formats are for storage and conversion, and have "
            "no arithmetic", hint="cast to a wider float first, e.g. tn.cast(x, tn.f32), and "
            f"cast the result back with tn.cast(y, tn.{dt}, overflow='saturate')")


def check_unary(name: str, t: TileType) -> TileType:
    dt = t.dtype
    _fp8_arithmetic(name, dt)
    if name in UNARY_FLOAT and not dt.is_float:
        raise TypeCheckError(f"'{name}' needs a floating-point operand, got {dt}",
                             hint="cast to a float dtype first")
    if name in UNARY_INT and not dt.is_int:
        raise TypeCheckError(f"'{name}' needs an integer operand, got {dt}")
    if name in UNARY_BOOL and not dt.is_bool:
        raise TypeCheckError(f"'{name}' needs a bool operand, got {dt}")
    if name in UNARY_PRED:
        if not dt.is_float:
            raise TypeCheckError(f"'{name}' needs a floating-point operand, got {dt}")
        return t.with_dtype(D.bool_)
    if name in UNARY_ANY and dt.is_bool:
        raise TypeCheckError(f"'{name}' is not defined on bool")
    return t


def check_binary(name: str, a: TileType, b: TileType) -> TileType:
    dt = _same_dtype([a, b], name)
    _fp8_arithmetic(name, dt)
    space = join_spaces([a.space, b.space], nested=True)
    if name in BINARY_BITS and not (dt.is_int or dt.is_bool):
        raise TypeCheckError(f"'{name}' needs integer or bool operands, got {dt}")
    if name in ("shl", "shr") and dt.is_bool:
        raise TypeCheckError(f"'{name}' needs integer operands, got {dt}")
    if name in ("pow", "atan2") and not dt.is_float:
        raise TypeCheckError(f"'{name}' needs floating-point operands, got {dt}")
    if name in BINARY_ARITH and dt.is_bool and name not in ("maximum", "minimum"):
        raise TypeCheckError(f"'{name}' is not defined on bool", hint="use and/or/xor")
    if name in COMPARE:
        return TileType(D.bool_, space)
    return TileType(dt, space)


def _declared_ulp(name: str, t: TileType, attrs: Any) -> TileType:
    """``t``, after checking the bound the application declares, if any
    (``numerics.check_declared_ulp``)."""
    declared = (attrs or {}).get("ulp")
    if declared is not None:
        why = N.check_declared_ulp(name, t.dtype, declared)
        if why:
            raise TypeCheckError(
                f"{name}(x, ulp={declared!r}): {why}",
                hint=f"give a number of ulp of at least {N.ulp_bound(name, t.dtype):g}, or "
                     "leave ulp out for the function's own bound")
    return t


for _n in UNARY:
    type_rule(_n)(lambda ts, attrs, hint, _n=_n: (
        _declared_ulp(_n, check_unary(_n, _tile(ts[0], "operand")), attrs),))
for _n in BINARY + COMPARE:
    type_rule(_n)(lambda ts, attrs, hint, _n=_n: (
        check_binary(_n, _tile(ts[0], "lhs"), _tile(ts[1], "rhs")),))


@type_rule("ite")
def _ite(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    c, a, b = (_tile(t, "operand") for t in ts)
    if not c.dtype.is_bool:
        raise TypeCheckError(f"ite condition must be bool, got {c.dtype}",
                             hint="compare first, e.g. ite(x > 0, x, 0)")
    dt = _same_dtype([a, b], "ite")
    return (TileType(dt, join_spaces([c.space, a.space, b.space], nested=True)),)


@type_rule("cast")
def _cast(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    """A cast into an FP8 format states its ``overflow`` policy (``saturate``
    or ``nonfinite``, ``numerics.cast``); no other cast takes one."""
    t = _tile(ts[0], "operand")
    (r,) = hint
    if r.space != t.space:
        raise TypeCheckError("cast changes only the dtype")
    policy = (attrs or {}).get("overflow")
    if r.dtype.is_fp8 and r.dtype != t.dtype and policy not in N.OVERFLOW:
        got = "no overflow policy" if policy is None else f"overflow={policy!r}"
        raise TypeCheckError(
            f"cast {t.dtype} -> {r.dtype} with {got}: a cast into an FP8 format rounds to "
            "nearest even and must say what a value beyond the largest finite one becomes",
            hint=f"tn.cast(x, tn.{r.dtype}, overflow='saturate') (the largest finite value) or "
                 "overflow='nonfinite' (NaN in f8e4m3fn, infinity in f8e5m2)")
    if policy is not None and not r.dtype.is_fp8:
        raise TypeCheckError(f"cast {t.dtype} -> {r.dtype}: overflow={policy!r} applies only "
                             "to casts into an FP8 format", hint="drop the overflow argument")
    return (r,)


@type_rule("bitcast")
def _bitcast(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    t = _tile(ts[0], "operand")
    (r,) = hint
    if r.space != t.space or r.dtype.bits != t.dtype.bits:
        raise TypeCheckError(f"bitcast needs equal bit widths ({t.dtype} -> {r.dtype})")
    return (r,)


@type_rule("const")
def _const(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    (r,) = hint
    v = attrs["value"]
    if isinstance(v, float) and not r.dtype.is_float:
        raise TypeCheckError(f"constant {v!r} is not representable in {r.dtype}")
    if r.dtype.is_fp8 and not isinstance(v, bool):
        c = float(N.constant(v, r.dtype).astype("float64"))
        if not (c == v or (c != c and v != v)):
            raise TypeCheckError(
                f"constant {v!r} is not exactly representable in {r.dtype}: a constant "
                "of an FP8 format is never rounded (rounding into FP8 states its overflow "
                "policy)", hint=f"write an exact value, or tn.cast(tn.full(tn.f32, ...), "
                f"tn.{r.dtype}, overflow='saturate')")
    return (r,)


@type_rule("index")
def _index(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    (r,) = hint
    if not r.dtype.is_int:
        raise TypeCheckError("an index tile has an integer dtype")
    if len(attrs["vars"]) != r.rank:
        raise TypeCheckError("index tile needs one variable per dim")
    return (r,)


@type_rule("map")
def _map(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    spaces = [_tile(t, "map operand").space for t in ts]
    space = join_spaces(spaces, nested=True)
    return tuple(TileType(h.dtype, space) for h in hint)


@type_rule("reindex")
def _reindex(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    x = _tile(ts[0], "reindex source")
    (r,) = hint
    if len(attrs["map"]) != x.rank:
        raise TypeCheckError(f"reindex map gives {len(attrs['map'])} coordinates for a "
                             f"rank-{x.rank} source")
    if len(attrs["vars"]) != r.rank or r.dtype != x.dtype:
        raise TypeCheckError("reindex result needs one variable per dim and the source dtype")
    return (r,)


@type_rule("gather")
def _gather(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    x, idx = _tile(ts[0], "gather source"), _tile(ts[1], "gather index")
    ax = attrs["axis"]
    if not 0 <= ax < x.rank:
        raise TypeCheckError(f"gather axis {ax} out of range for rank {x.rank}")
    if not idx.dtype.is_int:
        raise TypeCheckError(f"gather indices must be integers, got {idx.dtype}")
    rest = x.space.without([x.dims[ax]])
    return (TileType(x.dtype, join_spaces([idx.space, rest], "gather operands")),)


@type_rule("broadcast")
def _broadcast(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    x = _tile(ts[0], "broadcast source")
    (r,) = hint
    for f in x.space.factors:
        if not r.space.has(f.dim) or r.space.extent_of(f.dim) != f.extent:
            names, notes = dim_names((f.dim,) + r.space.dims)
            if r.space.has(f.dim):
                raise TypeCheckError(
                    f"broadcast target has dim '{names[f.dim]}' with extent "
                    f"{E.to_str(r.space.extent_of(f.dim))}, the source "
                    f"{E.to_str(f.extent)}", notes=notes)
            raise TypeCheckError(f"broadcast target lacks dim '{names[f.dim]}' of the source "
                                 f"(target dims: {', '.join(names[d] for d in r.space.dims)})",
                                 hint="a broadcast keeps the source's dims and adds new ones; "
                                      "build the target from the source's dims",
                                 notes=notes)
    return (r,)


@type_rule("reshape")
def _reshape(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    x = _tile(ts[0], "reshape source")
    (r,) = hint
    if r.dtype != x.dtype:
        raise TypeCheckError("reshape keeps the dtype")
    a, b = x.space.size(), r.space.size()
    if isinstance(a, E.Const) and isinstance(b, E.Const) and a != b:
        raise TypeCheckError(f"reshape changes the element count ({a} -> {b})")
    return (r,)


@type_rule("permute")
def _permute(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    x = _tile(ts[0], "permute source")
    perm = attrs["perm"]
    if sorted(perm) != list(range(x.rank)):
        raise TypeCheckError(f"permute needs a permutation of 0..{x.rank - 1}, got {list(perm)}")
    return (TileType(x.dtype, Space(tuple(x.space.factors[i] for i in perm))),)


@type_rule("put")
def _put(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    x, p = _tile(ts[0], "put target"), _tile(ts[1], "put patch")
    if x.dtype != p.dtype:
        raise TypeCheckError(f"put patch dtype {p.dtype} differs from target {x.dtype}")
    if len(attrs["origin"]) != x.rank or p.rank != x.rank:
        raise TypeCheckError("put needs a patch and origin of the target's rank")
    return (x,)


def widens(src: D.DType, dst: D.DType) -> bool:
    """Whether every value of ``src`` is exactly representable in ``dst``."""
    if src == dst:
        return True
    if dst.is_float:
        mant = {"f8e4m3fn": 4, "f8e5m2": 3, "f16": 11, "bf16": 8, "f32": 24, "f64": 53}[dst.name]
        if src.is_float:
            order = {"f8e4m3fn": (4, 4), "f8e5m2": (5, 3), "f16": (5, 11), "bf16": (8, 8),
                     "f32": (8, 24), "f64": (11, 53)}
            se, sm = order[src.name]
            de, dm = order[dst.name]
            return de >= se and dm >= sm
        if src.is_bool:
            return True
        return src.bits - (1 if src.is_signed else 0) <= mant
    if dst.is_int:
        if src.is_bool:
            return True
        if not src.is_int:
            return False
        if src.is_signed == dst.is_signed:
            return dst.bits >= src.bits
        return dst.is_signed and dst.bits > src.bits
    return False


def mma_roles(a: TileType, b: TileType, c: TileType) -> dict[str, tuple]:
    """Classify dims of ``mma(a, b, c)`` by identity: batch (in a, b, c),
    contraction (a and b, not c), free_a (a and c), free_b (b and c)."""
    da, db, dc = set(a.dims), set(b.dims), set(c.dims)
    for d in da - db - dc:
        raise TypeCheckError(
            f"mma: dim '{d.describe()}' of the A operand is in neither B nor the accumulator",
            hint="relate the operands' dims with with_dims/reindex; roles come from identities")
    for d in db - da - dc:
        raise TypeCheckError(
            f"mma: dim '{d.describe()}' of the B operand is in neither A nor the accumulator",
            hint="relate the operands' dims with with_dims/reindex; roles come from identities")
    for d in dc - da - db:
        raise TypeCheckError(
            f"mma: accumulator dim '{d.describe()}' is in neither A nor B",
            hint="the accumulator's dims must be batch or free dims of A/B")
    contraction = tuple(d for d in a.dims if d in db and d not in dc)
    if not contraction:
        raise TypeCheckError("mma: A and B share no contraction dim",
                             hint="give the K axis the same identity, e.g. B.with_dims(k, n)")
    return {
        "batch": tuple(d for d in c.dims if d in da and d in db),
        "contraction": contraction,
        "free_a": tuple(d for d in c.dims if d in da and d not in db),
        "free_b": tuple(d for d in c.dims if d in db and d not in da),
    }


@type_rule("mma")
def _mma(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    a, b, c = (_tile(t, n) for t, n in zip(ts, ("A", "B", "accumulator"), strict=True))
    mma_roles(a, b, c)
    join_spaces([a.space, b.space, c.space], "mma operands")
    if c.dtype.is_fp8:
        raise TypeCheckError(f"mma: the accumulator is {c.dtype}, a storage format without "
                             "arithmetic", hint="accumulate in f32 and cast the result, e.g. "
                             f"tn.cast(acc, tn.{c.dtype}, overflow='saturate')")
    if c.dtype.is_bool:
        raise TypeCheckError("mma: the accumulator is bool, on which add and mul are not "
                             "defined", hint="accumulate bool operands in an integer dtype, "
                             "e.g. tn.zeros(tn.i32, ...)")
    for t, n in ((a, "A"), (b, "B")):
        if not widens(t.dtype, c.dtype):
            raise TypeCheckError(
                f"mma: converting {n} ({t.dtype}) to the accumulator dtype {c.dtype} would lose "
                "precision", hint="accumulate in a wider dtype, e.g. f32")
    return (c,)


@type_rule("per")
def _per(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    return (ts[0],)
