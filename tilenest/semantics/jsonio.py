"""The JSON form of TileIR (schema ``tilenest.tileir/1``).

Everything is plain JSON data, so a reader in another language needs no
expression parser: index expressions and predicates are trees
(``{"add": [...]}``, ``{"cmp": "<", "args": [a, b]}``, ...), dims are indices
into the program's ``dims`` table, values are referred to by name, and floats
are strings (``{"float": "-0.0"}``) so that ``1`` and ``1.0``, ``inf`` and
``nan`` survive every JSON library. ``from_json(to_json(p)) == p`` for every
program whose dims are its canonical table entries; the reader checks the same
references as the text parser and reports a mistake with its JSON path, e.g.
``body.ops[3].attrs.map: ...``. See ``spec/interchange.md`` for the schema.

The reader holds names, integers and strings to the lexical rules of the text
grammar (:func:`~tilenest.semantics.ioschema.name_problem` and friends, one
definition for both readers), so every document it accepts prints as text that
parses back. :func:`from_json` and :func:`loads` verify the program they read
(the verifier a captured kernel passes), placing diagnostics at the op's path.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any, NoReturn

import numpy as np

from ..errors import ParseError, Site
from . import dtypes as D
from . import expr as E
from .expr import Expr, Pred
from .ioschema import (
    SCHEMA_VERSION,
    DimNames,
    ReadSite,
    Scope,
    attr_kind,
    attr_order,
    build_bitop,
    canonical_dim,
    grammar,
    literal_problem,
    missing_attrs,
    name_hint,
    name_problem,
    number_ops,
    opdef_or_none,
    operand_count_problem,
    region_count_problem,
    site_problem,
    string_problem,
    unknown_attr_hint,
    unknown_op_hint,
)
from .ir import Block, FrozenDict, Operation, TileProgram, Value
from .maps import Map, MemLayout
from .module import TileModule
from .policies import (
    EXEC_SCOPES,
    RESOURCES,
    Bounds,
    BoundsPolicy,
    ExecPolicy,
    PipelinePolicy,
    ReductionPolicy,
)
from .printer import guess_kind
from .reducers import BUILTINS, CustomReducer
from .space import Dim, DimFactor, IndexSet, Space
from .types import MemoryType, StateType, TensorType, TileType, Type

# ---------------------------------------------------------------------------
# encoding


def encode_expr(e: Expr) -> Any:
    """An index expression as a JSON tree."""
    if isinstance(e, E.Const):
        return {"const": e.value}
    if isinstance(e, E.Sym):
        return {"sym": e.name}
    if isinstance(e, E.Var):
        return {"var": e.name}
    if isinstance(e, E.Val):
        return {"val": e.name}
    if isinstance(e, E.Add):
        return {"add": [encode_expr(t) for t in e.terms]}
    if isinstance(e, E.Mul):
        return {"mul": [encode_expr(t) for t in e.factors]}
    if isinstance(e, E.FloorDiv):
        return {"floordiv": [encode_expr(e.a), encode_expr(e.b)]}
    if isinstance(e, E.Mod):
        return {"mod": [encode_expr(e.a), encode_expr(e.b)]}
    if isinstance(e, E.MinMax):
        return {e.op: [encode_expr(e.a), encode_expr(e.b)]}
    if isinstance(e, E.BitOp):
        return {"bit": e.op, "args": [encode_expr(e.a), encode_expr(e.b)]}
    raise TypeError(f"not an index expression: {e!r}")


def encode_pred(p: Pred) -> Any:
    """A predicate as a JSON tree."""
    if isinstance(p, E.BoolConst):
        return {"bool": p.value}
    if isinstance(p, E.Cmp):
        return {"cmp": p.op, "args": [encode_expr(p.a), encode_expr(p.b)]}
    if isinstance(p, E.PAnd):
        return {"and": [encode_pred(q) for q in p.items]}
    if isinstance(p, E.POr):
        return {"or": [encode_pred(q) for q in p.items]}
    if isinstance(p, E.PNot):
        return {"not": encode_pred(p.item)}
    raise TypeError(f"not a predicate: {p!r}")


def encode_number(v: Any) -> Any:
    """An int or bool as itself; a float as ``{"float": repr}``."""
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    f = float(v)
    return {"float": "nan" if math.isnan(f) else repr(f)}


def encode_space(s: Space, names: DimNames) -> list[Any]:
    return [{"dim": names.index(f.dim), "extent": encode_expr(f.extent)} for f in s.factors]


def encode_map(m: Map) -> dict[str, Any]:
    return {"inputs": list(m.inputs), "outputs": [encode_expr(o) for o in m.outputs]}


def encode_type(t: Type, names: DimNames) -> dict[str, Any]:
    """A type as ``{"kind": "tile"|"tensor"|"memory"|"state", ...}``."""
    if isinstance(t, TileType):
        return {"kind": "tile", "dtype": t.dtype.name, "space": encode_space(t.space, names)}
    if isinstance(t, TensorType):
        return {"kind": "tensor", "dtype": t.dtype.name, "space": encode_space(t.space, names)}
    if isinstance(t, MemoryType):
        lay = t.layout
        return {"kind": "memory", "dtype": t.dtype.name, "space": encode_space(t.space, names),
                "layout": {"vars": list(lay.vars), "offset": encode_expr(lay.offset),
                           "size": encode_expr(lay.size)},
                "resource": t.resource}
    if isinstance(t, StateType):
        return {"kind": "state", "memory": t.memory}
    raise TypeError(f"cannot encode type {t!r}")


_KIND_ENCODERS: dict[str, Callable[[Any, DimNames], Any]] = {
    "int": lambda v, n: int(v),
    "bool": lambda v, n: bool(v),
    "str": lambda v, n: v,
    "number": lambda v, n: encode_number(v),
    "dtype": lambda v, n: v.name,
    "expr": lambda v, n: encode_expr(v),
    "exprs": lambda v, n: [encode_expr(e) for e in v],
    "vars": lambda v, n: list(v),
    "ints": lambda v, n: [int(i) for i in v],
    "indexset": lambda v, n: {"vars": list(v.vars), "space": encode_space(v.space, n),
                              "pred": encode_pred(v.pred)},
    "pred": lambda v, n: encode_pred(v),
    "bounds": lambda v, n: ({"kind": "fill", "fill": encode_number(v.fill)}
                            if v.kind is Bounds.fill else {"kind": v.kind.value}),
    "exec": lambda v, n: {"scope": v.scope,
                          "layout": None if v.layout is None else encode_map(v.layout)},
    "pipeline": lambda v, n: {"window": v.window, "interval": v.interval},
    "rpolicy": lambda v, n: v.value,
    "contracts": lambda v, n: list(v),
    "repr": lambda v, n: repr(v),
}


def encode_attr(kind: str, v: Any, names: DimNames) -> Any:
    return _KIND_ENCODERS[kind](v, names)


def encode_site(s: Site) -> dict[str, Any]:
    return {"file": s.file, "line": s.line, "col": s.col}


def _value(v: Value, names: DimNames) -> dict[str, Any]:
    return {"name": v.name, "type": encode_type(v.type, names)}


def encode_block(b: Block, names: DimNames) -> dict[str, Any]:
    return {"args": [_value(a, names) for a in b.args],
            "ops": [encode_op(o, names) for o in b.ops]}


def encode_op(op: Operation, names: DimNames) -> dict[str, Any]:
    d = opdef_or_none(op.name)
    attrs = {}
    for k in attr_order(op):
        kind = (attr_kind(d, k) if d is not None else None) or guess_kind(op.attrs[k])
        attrs[k] = encode_attr(kind, op.attrs[k], names)
    out = {"op": op.name, "operands": [o.name for o in op.operands],
           "results": [_value(r, names) for r in op.results], "attrs": attrs,
           "regions": [encode_block(r, names) for r in op.regions]}
    if op.loc is not None:
        out["loc"] = encode_site(op.loc)
    return out


def to_json(p: TileProgram) -> dict[str, Any]:
    """The program as a JSON-ready dict (schema ``tilenest.tileir/1``)."""
    names = DimNames(p.dims)
    reducers = [{
        "name": r.name, "state": [d.name for d in r.state],
        "identity": [encode_number(x) for x in r.identity],
        "associative": r.associative, "commutative": r.commutative,
        "provenance": r.provenance, "merge": encode_block(r.merge, names),
        "lift": None if r.lift is None else encode_block(r.lift, names),
    } for r in p.reducers]
    args = [_value(a, names) for a in p.args]
    body = encode_block(p.body, names)
    # the table is read after encoding: it grows with dims met only in types (see DimNames)
    out: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "name": p.name,
        "syms": list(p.syms),
        "assume": [encode_pred(a) for a in p.assumptions],
        "dims": [d.label for d in names.order],
        "args": args,
        "reducers": reducers,
        "body": body,
    }
    if p.loc is not None:
        out["loc"] = encode_site(p.loc)
    return out


#: nesting depth up to which :func:`dumps` breaks lines and indents; deeper
#: parts are written on one line, so the text stays linear in the program's size
INDENT_DEPTH = 32


def dumps(p: TileProgram, indent: int | None = 1) -> str:
    """``to_json(p)`` as JSON text. With ``indent``, the outer
    :data:`INDENT_DEPTH` levels are laid out as ``json.dumps(..., indent=indent)``
    lays them out and deeper values are written on one line (an indentation
    that grows with depth would make the text quadratic in it); without, the
    text is ``json.dumps``'s compact form. Either way the writer is iterative,
    so its time and the text's length are linear in the program's size."""
    out: list[str] = []
    _write(to_json(p), indent, out)
    return "".join(out)


_encode_str = json.encoder.encode_basestring  # json.dumps(s, ensure_ascii=False)


def _write(d: Any, indent: int | None, out: list[str]) -> None:
    """Append ``d`` as JSON text to ``out``, using a stack instead of recursion."""
    stack: list[tuple[Any, int] | str] = [(d, 0)]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item)
            continue
        v, depth = item
        if not isinstance(v, (dict, list)):
            if isinstance(v, str):
                out.append(_encode_str(v))
            elif v is None or isinstance(v, bool):
                out.append("null" if v is None else "true" if v else "false")
            elif isinstance(v, int):
                out.append(int.__repr__(v))
            else:
                out.append(json.dumps(v, ensure_ascii=False))
            continue
        is_dict = isinstance(v, dict)
        if not v:
            out.append("{}" if is_dict else "[]")
            continue
        if indent is not None and depth < INDENT_DEPTH:
            sep = "\n" + " " * (indent * (depth + 1))
            close = "\n" + " " * (indent * depth)
            first, comma = sep, "," + sep
        else:
            first, comma, close = "", ", ", ""
        close += "}" if is_dict else "]"
        items: list[tuple[str | None, Any]] = (
            list(v.items()) if isinstance(v, dict) else [(None, x) for x in v])
        parts: list[tuple[Any, int] | str] = []
        for i, (k, x) in enumerate(items):
            lead = comma if i else first
            if k is not None:
                if not isinstance(k, str):
                    raise TypeError(f"JSON keys are strings, not {k!r}")
                lead += _encode_str(k) + ": "
            parts += [lead, (x, depth + 1)]
        out.append("{" if is_dict else "[")
        stack.append(close)
        stack.extend(reversed(parts))


# ---------------------------------------------------------------------------
# decoding

_EXPR_KEYS = {"const", "sym", "var", "val", "add", "mul", "floordiv", "mod", "min", "max", "bit"}
_BITOPS = ("^", "&", "|", "<<", ">>")
_CMPOPS = ("<", "<=", ">", ">=", "==", "!=")


@lru_cache(maxsize=1)
def _float_text() -> re.Pattern[str]:
    """A float written in ``{"float": ...}``: the text grammar's FLOAT or INT
    token with an optional sign, or ``inf``, ``-inf``, ``nan``."""
    g = grammar()
    body = "|".join(g.get_terminal(t).pattern.to_regexp() for t in ("FLOAT", "INT"))
    return re.compile(f"-?(?:{body})|-?inf|nan")


class Decoder:
    """Builds IR from JSON data, checking references; errors name the JSON path."""

    def __init__(self, file: str | None = None, prefix: str = ""):
        self.file = file
        #: where this program sits in its document (``kernels[1]`` in a module)
        self.prefix = prefix
        self.syms: set[str] | None = None
        self.dims: list[Dim] = []
        self.reducers: set[str] = set()
        #: the JSON path of each op, by the provisional op id it is built with
        self.sites: dict[int, Site] = {}

    def fail(self, path: str, message: str, hint: str | None = None) -> NoReturn:
        notes = (f"in {self.file}",) if self.file else ()
        raise ParseError(f"{self.at(path)}: {message}", (), hint=hint, notes=notes)

    def at(self, path: str) -> str:
        """``path`` (relative to the program) as a path in the whole document."""
        if not self.prefix:
            return path
        return self.prefix if path == "(root)" else f"{self.prefix}.{path}"

    # -- plain data -----------------------------------------------------
    def obj(self, d: Any, path: str, required: tuple[str, ...] = (),
            optional: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(d, dict):
            self.fail(path, "expected an object")
        for k in required:
            if k not in d:
                self.fail(path, f"missing key '{k}'")
        for k in d:
            if k not in required and k not in optional:
                self.fail(f"{path}.{k}", f"unknown key '{k}'")
        return d

    def list_(self, d: Any, path: str) -> list[Any]:
        if not isinstance(d, list):
            self.fail(path, "expected a list")
        return d

    def str_(self, d: Any, path: str) -> str:
        if not isinstance(d, str):
            self.fail(path, "expected a string")
        problem = string_problem(d)
        if problem:
            self.fail(path, problem)
        return d

    def name(self, d: Any, path: str, kind: str) -> str:
        """A name of ``kind`` (value, var, global, sym), as the text grammar spells it."""
        problem = name_problem(kind, self.str_(d, path))
        if problem:
            self.fail(path, problem, hint=name_hint(kind))
        return d

    def int_(self, d: Any, path: str) -> int:
        if not isinstance(d, int) or isinstance(d, bool):
            self.fail(path, "expected an integer")
        problem = literal_problem(d)
        if problem:
            self.fail(path, problem, hint="index integers are int64; element literals fit "
                                          "their dtype")
        return d

    def bool_(self, d: Any, path: str) -> bool:
        if not isinstance(d, bool):
            self.fail(path, "expected true or false")
        return d

    def number(self, d: Any, path: str) -> int | float | bool:
        """An int, a bool, ``{"float": "<decimal, inf, -inf or nan>"}``, or (leniently)
        a JSON number with a fraction or exponent."""
        if isinstance(d, bool):
            return d
        if isinstance(d, int):
            return self.int_(d, path)
        if isinstance(d, float):
            return math.nan if math.isnan(d) else d
        if isinstance(d, dict) and set(d) == {"float"} and isinstance(d["float"], str):
            if d["float"] == "nan":
                return math.nan  # one shared NaN object, so equal programs compare equal
            if _float_text().fullmatch(d["float"]):
                return float(d["float"])
        self.fail(path, 'expected an integer, a bool or {"float": "<decimal>"}')

    def dtype(self, d: Any, path: str) -> D.DType:
        if not isinstance(d, str) or d not in D.BY_NAME:
            self.fail(path, f"unknown dtype {json.dumps(d)}",
                      hint="dtypes are " + ", ".join(D.BY_NAME))
        return D.BY_NAME[d]

    def site(self, d: Any, path: str) -> Site:
        o = self.obj(d, path, ("line",), ("file", "col"))
        f = o.get("file")
        if f is not None:
            self.str_(f, path + ".file")
        line = self.int_(o["line"], path + ".line")
        col = self.int_(o.get("col", 0), path + ".col")
        problem = site_problem(line, col)
        if problem:
            self.fail(path, problem)
        return Site(f, line, col)

    # -- expressions ----------------------------------------------------
    def expr(self, d: Any, path: str, scope: Scope | None) -> Expr:
        """An index expression tree, rebuilt canonical with the smart constructors."""
        if not isinstance(d, dict) or not (set(d) & _EXPR_KEYS):
            self.fail(path, "expected an index expression such as {\"const\": 1}")
        if "bit" in d:
            self.obj(d, path, ("bit", "args"))
            if d["bit"] not in _BITOPS:
                self.fail(path + ".bit", "unknown bitwise operator",
                          hint="one of " + " ".join(_BITOPS))
            a, b = self.pair(d["args"], path + ".args", scope)
            try:
                return build_bitop(d["bit"], a, b)
            except ValueError as e:
                self.fail(path, str(e))
        if len(d) != 1:
            self.fail(path, "an expression node has exactly one key")
        ((k, v),) = d.items()
        p = f"{path}.{k}"
        if k == "const":
            return E.Const(self.int_(v, p))
        if k == "sym":
            name = self.name(v, p, "sym")
            if self.syms is not None and name not in self.syms:
                self.fail(p, f"unknown symbol '{name}'", hint="declare it in \"syms\"")
            return E.Sym(name)
        if k == "var":
            return E.Var(self.name(v, p, "var"))
        if k == "val":
            name = self.name(v, p, "value")
            if scope is not None and scope.lookup(name) is None:
                self.fail(p, *scope.undefined_message(name))
            return E.Val(name)
        if k in ("add", "mul"):
            out: Expr = E.Const(0 if k == "add" else 1)
            for i, t in enumerate(self.list_(v, p)):
                t_ = self.expr(t, f"{p}[{i}]", scope)
                out = E.add(out, t_) if k == "add" else E.mul(out, t_)
            return out
        a, b = self.pair(v, p, scope)
        try:
            return {"floordiv": E.floordiv, "mod": E.mod, "min": E.minimum,
                    "max": E.maximum}[k](a, b)
        except ZeroDivisionError:
            self.fail(p, "index expression divides by zero")

    def pair(self, v: Any, path: str, scope: Scope | None) -> tuple[Expr, Expr]:
        items = self.list_(v, path)
        if len(items) != 2:
            self.fail(path, "expected two operands")
        return (self.expr(items[0], path + "[0]", scope),
                self.expr(items[1], path + "[1]", scope))

    def pred(self, d: Any, path: str, scope: Scope | None) -> Pred:
        if isinstance(d, dict) and "cmp" in d:
            self.obj(d, path, ("cmp", "args"))
            if d["cmp"] not in _CMPOPS:
                self.fail(path + ".cmp", "unknown comparison", hint="one of " + " ".join(_CMPOPS))
            a, b = self.pair(d["args"], path + ".args", scope)
            return E.cmp(d["cmp"], a, b)
        if not isinstance(d, dict) or len(d) != 1 or not (set(d) & {"bool", "and", "or", "not"}):
            self.fail(path, "expected a predicate such as {\"bool\": true}")
        ((k, v),) = d.items()
        p = f"{path}.{k}"
        if k == "bool":
            return E.BoolConst(self.bool_(v, p))
        if k == "not":
            return E.pnot(self.pred(v, p, scope))
        items = [self.pred(q, f"{p}[{i}]", scope) for i, q in enumerate(self.list_(v, p))]
        return E.pand(*items) if k == "and" else E.por(*items)

    # -- types ----------------------------------------------------------
    def space(self, d: Any, path: str, scope: Scope | None) -> Space:
        factors = []
        seen: set[Dim] = set()
        for i, f in enumerate(self.list_(d, path)):
            p = f"{path}[{i}]"
            o = self.obj(f, p, ("dim", "extent"))
            k = self.int_(o["dim"], p + ".dim")
            if not 0 <= k < len(self.dims):
                self.fail(p + ".dim", f"unknown dim {k}",
                          hint=f"the dims table has {len(self.dims)} entries")
            if self.dims[k] in seen:
                self.fail(p + ".dim", f"dim {k} appears twice in one space")
            seen.add(self.dims[k])
            factors.append(DimFactor(self.dims[k], self.expr(o["extent"], p + ".extent", scope)))
        return Space(tuple(factors))

    def type_(self, d: Any, path: str, scope: Scope | None = None) -> Type:
        kind = d.get("kind") if isinstance(d, dict) else None
        if kind == "state":
            o = self.obj(d, path, ("kind", "memory"))
            return StateType(self.name(o["memory"], path + ".memory", "value"))
        if kind in ("tile", "tensor"):
            o = self.obj(d, path, ("kind", "dtype", "space"))
        elif kind == "memory":
            o = self.obj(d, path, ("kind", "dtype", "space", "layout"), ("resource",))
        else:
            self.fail(path, "expected a type {\"kind\": \"tile\"|\"tensor\"|\"memory\"|\"state\"}")
        dt = self.dtype(o["dtype"], path + ".dtype")
        space = self.space(o["space"], path + ".space", scope)
        if kind == "tile":
            return TileType(dt, space)
        if kind == "tensor":
            return TensorType(dt, space.extents, space.dims)
        lp = path + ".layout"
        lay = self.obj(o["layout"], lp, ("vars", "offset", "size"))
        vars_ = self.vars_(lay["vars"], lp + ".vars")
        res = o.get("resource", "auto")
        if res not in RESOURCES:
            self.fail(path + ".resource", f"unknown memory resource {json.dumps(res)}",
                      hint="one of " + ", ".join(RESOURCES))
        return MemoryType(dt, space, MemLayout(vars_, self.expr(lay["offset"], lp + ".offset",
                                                                scope),
                                               self.expr(lay["size"], lp + ".size", scope)), res)

    # -- attributes -----------------------------------------------------
    def vars_(self, d: Any, path: str) -> tuple[str, ...]:
        out = tuple(self.name(v, f"{path}[{i}]", "var")
                    for i, v in enumerate(self.list_(d, path)))
        if len(set(out)) != len(out):
            self.fail(path, "a variable is named twice")
        return out

    def attr(self, kind: str, d: Any, path: str, scope: Scope | None) -> Any:
        """The JSON value ``d`` as an attribute of ``kind``."""
        if kind == "int":
            return self.int_(d, path)
        if kind == "bool":
            return self.bool_(d, path)
        if kind == "str":
            return self.str_(d, path)
        if kind == "number":
            return self.number(d, path)
        if kind == "dtype":
            return self.dtype(d, path)
        if kind == "expr":
            return self.expr(d, path, scope)
        if kind == "exprs":
            return tuple(self.expr(e, f"{path}[{i}]", scope)
                         for i, e in enumerate(self.list_(d, path)))
        if kind == "vars":
            return self.vars_(d, path)
        if kind == "ints":
            return tuple(self.int_(e, f"{path}[{i}]") for i, e in enumerate(self.list_(d, path)))
        if kind == "pred":
            return self.pred(d, path, scope)
        if kind == "indexset":
            o = self.obj(d, path, ("vars", "space"), ("pred",))
            vars_ = self.vars_(o["vars"], path + ".vars")
            space = self.space(o["space"], path + ".space", scope)
            if len(vars_) != space.rank:
                self.fail(path + ".vars", f"{len(vars_)} variables for {space.rank} dims")
            pred = self.pred(o["pred"], path + ".pred", scope) if "pred" in o else E.TRUE
            return IndexSet(space, vars_, pred)
        if kind == "bounds":
            o = self.obj(d, path, ("kind",), ("fill",))
            if not isinstance(o["kind"], str) or o["kind"] not in Bounds.__members__:
                self.fail(path + ".kind", "unknown bounds policy",
                          hint="one of " + ", ".join(Bounds.__members__))
            if o["kind"] == "fill":
                if "fill" not in o:
                    self.fail(path, "missing key 'fill'")
                return BoundsPolicy(Bounds.fill, self.number(o["fill"], path + ".fill"))
            return BoundsPolicy(Bounds(o["kind"]))
        if kind == "exec":
            o = self.obj(d, path, (), ("scope", "layout"))
            sc = o.get("scope")
            if sc is not None and sc not in EXEC_SCOPES:
                self.fail(path + ".scope", "unknown exec scope",
                          hint="one of " + ", ".join(EXEC_SCOPES))
            layout = None
            if o.get("layout") is not None:
                lp = path + ".layout"
                m = self.obj(o["layout"], lp, ("inputs", "outputs"))
                layout = Map(self.vars_(m["inputs"], lp + ".inputs"),
                             tuple(self.expr(e, f"{lp}.outputs[{i}]", scope)
                                   for i, e in enumerate(self.list_(m["outputs"],
                                                                    lp + ".outputs"))))
            return ExecPolicy(sc, layout)
        if kind == "pipeline":
            o = self.obj(d, path, (), ("window", "interval"))
            try:
                return PipelinePolicy(self.int_(o.get("window", 2), path + ".window"),
                                      self.int_(o.get("interval", 1), path + ".interval"))
            except ValueError as e:
                self.fail(path, str(e))
        if kind == "rpolicy":
            if not isinstance(d, str) or d not in ReductionPolicy.__members__:
                self.fail(path, "unknown reduction policy",
                          hint="one of " + ", ".join(ReductionPolicy.__members__))
            return ReductionPolicy[d]
        if kind == "contracts":
            out = []
            for i, c in enumerate(self.list_(d, path)):
                ok = c is None or isinstance(c, str) and (
                    c in BUILTINS or c.startswith("@") and c[1:] in self.reducers)
                if not ok:
                    self.fail(f"{path}[{i}]", f"unknown reducer {json.dumps(c)}",
                              hint="built-ins are " + ", ".join(BUILTINS)
                              + "; custom reducers are written \"@name\"")
                out.append(c)
            return tuple(out)
        raise ValueError(f"unknown attribute kind {kind!r}")

    # -- ops, blocks, program -------------------------------------------
    def define(self, d: Any, path: str, scope: Scope) -> Value:
        o = self.obj(d, path, ("name", "type"))
        v = Value(self.name(o["name"], path + ".name", "value"),
                  self.type_(o["type"], path + ".type", scope))
        self.declare(v.name, path, scope)
        scope.bind(v)
        return v

    def declare(self, name: str, path: str, scope: Scope) -> None:
        earlier = scope.declare(name, path)
        if earlier is not None:
            self.fail(path, f"value %{name} is already defined",
                      hint=f"each value is defined once; the first definition is {earlier}")

    def block(self, d: Any, path: str, scope: Scope) -> Block:
        o = self.obj(d, path, (), ("args", "ops"))
        args = tuple(self.define(a, f"{path}.args[{i}]", scope)
                     for i, a in enumerate(self.list_(o.get("args", []), path + ".args")))
        ops = tuple(self.op(x, f"{path}.ops[{i}]", scope)
                    for i, x in enumerate(self.list_(o.get("ops", []), path + ".ops")))
        return Block(args, ops)

    def op(self, d: Any, path: str, scope: Scope) -> Operation:
        o = self.obj(d, path, ("op",), ("operands", "results", "attrs", "regions", "loc"))
        name = self.str_(o["op"], path + ".op")
        od = opdef_or_none(name)
        if od is None:
            self.fail(path + ".op", f"unknown op '{name}'", hint=unknown_op_hint(name))
        operands = []
        for i, x in enumerate(self.list_(o.get("operands", []), path + ".operands")):
            p = f"{path}.operands[{i}]"
            v = scope.lookup(self.str_(x, p))
            if v is None:
                self.fail(p, *scope.undefined_message(x))
            operands.append(v)
        problem = operand_count_problem(od, len(operands))
        if problem:
            self.fail(path + ".operands", problem)
        attrs = {}
        raw = o.get("attrs", {})
        if not isinstance(raw, dict):
            self.fail(path + ".attrs", "expected an object")
        for k, v in raw.items():
            kind = attr_kind(od, k)
            if kind is None:
                self.fail(f"{path}.attrs.{k}", f"unknown attribute '{k}' of '{name}'",
                          hint=unknown_attr_hint(od, k))
            attrs[k] = self.attr(kind, v, f"{path}.attrs.{k}", scope)
        missing = missing_attrs(od, attrs)
        if missing:
            self.fail(path + ".attrs", f"'{name}' lacks attribute "
                      + ", ".join(f"'{m}'" for m in missing))
        results = []
        for i, r in enumerate(self.list_(o.get("results", []), path + ".results")):
            p = f"{path}.results[{i}]"
            r = self.obj(r, p, ("name", "type"))
            v = Value(self.name(r["name"], p + ".name", "value"),
                      self.type_(r["type"], p + ".type", scope))
            self.declare(v.name, p, scope)
            results.append(v)
        regions_raw = self.list_(o.get("regions", []), path + ".regions")
        problem = region_count_problem(od, len(regions_raw))
        if problem:
            self.fail(path + ".regions", problem)
        regions = tuple(self.block(r, f"{path}.regions[{i}]", scope.child())
                        for i, r in enumerate(regions_raw))
        for v in results:
            scope.bind(v)
        loc = self.site(o["loc"], path + ".loc") if o.get("loc") is not None else None
        oid = len(self.sites)
        self.sites[oid] = ReadSite(self.file, 0, 0, self.at(path))
        return Operation(name, tuple(operands), tuple(results), FrozenDict(attrs), regions, loc,
                         oid)

    def reducer(self, d: Any, path: str) -> CustomReducer:
        o = self.obj(d, path, ("name", "state", "identity", "associative", "commutative",
                               "merge"), ("provenance", "lift"))
        name = self.name(o["name"], path + ".name", "global")
        if name in self.reducers:
            self.fail(path + ".name", f"reducer @{name} is declared twice")
        self.reducers.add(name)
        state = tuple(self.dtype(x, f"{path}.state[{i}]")
                      for i, x in enumerate(self.list_(o["state"], path + ".state")))
        ident = tuple(self.number(x, f"{path}.identity[{i}]")
                      for i, x in enumerate(self.list_(o["identity"], path + ".identity")))
        merge = self.block(o["merge"], path + ".merge", Scope())
        lift = self.block(o["lift"], path + ".lift", Scope()) if o.get("lift") is not None \
            else None
        return CustomReducer(name, state, ident, merge, lift,
                             self.bool_(o["associative"], path + ".associative"),
                             self.bool_(o["commutative"], path + ".commutative"),
                             self.str_(o.get("provenance", "declared"), path + ".provenance"))

    def program(self, d: Any) -> TileProgram:
        o = self.obj(d, "(root)", ("schema", "name", "body"),
                     ("args", "syms", "assume", "dims", "reducers", "loc"))
        if o["schema"] != SCHEMA_VERSION:
            self.fail("schema", f"unsupported schema {json.dumps(o['schema'])}",
                      hint=f"this reader understands \"{SCHEMA_VERSION}\"")
        syms = tuple(self.name(s, f"syms[{i}]", "sym") for i, s in enumerate(self.list_(
            o.get("syms", []), "syms")))
        if len(set(syms)) != len(syms):
            self.fail("syms", "a symbol is declared twice")
        self.syms = set(syms)
        for i, label in enumerate(self.list_(o.get("dims", []), "dims")):
            if label is not None:
                self.str_(label, f"dims[{i}]")
            self.dims.append(canonical_dim(i, label))
        scope = Scope()
        args = tuple(self.define(a, f"args[{i}]", scope)
                     for i, a in enumerate(self.list_(o.get("args", []), "args")))
        assume = tuple(self.pred(a, f"assume[{i}]", scope)
                       for i, a in enumerate(self.list_(o.get("assume", []), "assume")))
        reducers = tuple(self.reducer(r, f"reducers[{i}]")
                         for i, r in enumerate(self.list_(o.get("reducers", []), "reducers")))
        body = self.block(o["body"], "body", scope)
        loc = self.site(o["loc"], "loc") if o.get("loc") is not None else None
        renumbered: dict[int, int] = {}
        p = number_ops(TileProgram(self.name(o["name"], "name", "global"), args, syms, assume,
                                   tuple(self.dims), body, reducers, loc), renumbered)
        self.sites = {renumbered[k]: v for k, v in self.sites.items() if k in renumbered}
        from .verify import PROGRAM_SITE, remember_sites

        self.sites[PROGRAM_SITE] = ReadSite(self.file, 0, 0, self.at("(root)"))
        return remember_sites(p, self.sites)


def _decode(d: Any, file: str | None, prefix: str = ""
            ) -> tuple[TileProgram, dict[int, Site]]:
    dec = Decoder(file, prefix)
    try:
        return dec.program(d), dec.sites
    except RecursionError:
        raise ParseError("the JSON nests too deeply to read", ()) from None


def _decode_module(d: Any, file: str | None) -> list[tuple[TileProgram, dict[int, Site]]]:
    """Every program of a document: a module document ``{"schema", "kernels":
    [program, ...]}`` (I-19), or one program document (a module of one)."""
    if not (isinstance(d, dict) and "kernels" in d):
        if isinstance(d, list):
            Decoder(file).fail("(root)", "expected an object, not a list",
                               hint='several kernels travel as {"schema": '
                                    f'"{SCHEMA_VERSION}", "kernels": [program, ...]}}')
        return [_decode(d, file)]
    dec = Decoder(file)
    o = dec.obj(d, "(root)", ("schema", "kernels"))
    if o["schema"] != SCHEMA_VERSION:
        dec.fail("schema", f"unsupported schema {json.dumps(o['schema'])}",
                 hint=f"this reader understands \"{SCHEMA_VERSION}\"")
    docs = dec.list_(o["kernels"], "kernels")
    if not docs:
        dec.fail("kernels", "a module holds at least one kernel")
    out: list[tuple[TileProgram, dict[int, Site]]] = []
    first: dict[str, str] = {}
    for i, doc in enumerate(docs):
        p, sites = _decode(doc, file, f"kernels[{i}]")
        if p.name in first:
            dec.fail(f"kernels[{i}].name", f"kernel '{p.name}' is defined twice",
                     hint=f"kernel names of one module are distinct; the first is "
                          f"{first[p.name]}")
        first[p.name] = f"kernels[{i}]"
        out.append((p, sites))
    return out


def _verified(p: TileProgram, sites: dict[int, Site]) -> TileProgram:
    from .verify import verify

    try:
        verify(p, sites)
    except RecursionError:
        raise ParseError("the program nests too deeply to verify", ()) from None
    return p


def from_json(d: Any, file: str | None = None, kernel: str | None = None) -> TileProgram:
    """The one program ``d`` encodes, verified; op ids in pre-order from 0.
    ``d`` may be a module document (I-19): ``kernel`` then names the program
    to read, and a module of several kernels read without it is a ParseError.
    Raises ParseError naming the JSON path of the first mistake, or the
    verifier's error at the path of the op that breaks a static rule."""
    read = _decode_module(d, file)
    chosen = TileModule(tuple(p for p, _ in read)).single(kernel, file)
    return _verified(chosen, next(sites for q, sites in read if q is chosen))


def from_json_module(d: Any, file: str | None = None) -> TileModule:
    """Every program of a module document (or of one program document), verified."""
    return TileModule(tuple(_verified(p, sites) for p, sites in _decode_module(d, file)))


def from_json_unverified(d: Any, file: str | None = None) -> TileProgram:
    """The schema layer of :func:`from_json` alone (references checked, static
    rules not): the inverse of :func:`to_json` for every program, well typed or
    not, which serves to test that pair. A document from outside is read with
    :func:`from_json`."""
    return _decode(d, file)[0]


def to_json_module(m: TileModule) -> dict[str, Any]:
    """A module as a JSON-ready dict: one kernel is its program document, as
    :func:`to_json` writes it; several are ``{"schema", "kernels": [...]}``."""
    if len(m) == 1:
        return to_json(m.kernels[0])
    return {"schema": SCHEMA_VERSION, "kernels": [to_json(p) for p in m]}


def dumps_module(m: TileModule, indent: int | None = 1) -> str:
    """``to_json_module(m)`` as JSON text, written as :func:`dumps` writes."""
    out: list[str] = []
    _write(to_json_module(m), indent, out)
    return "".join(out)


class _NotJson(ValueError):
    """A construct Python's JSON reader takes that JSON (RFC 8259) does not."""


def _no_constant(name: str) -> Any:
    word = "nan" if name == "NaN" else "-inf" if name.startswith("-") else "inf"
    raise _NotJson(f"{name} is not JSON", f'write the float as {{"float": "{word}"}}')


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise _NotJson(f"key {json.dumps(k)} appears twice in one object",
                           "each key is given once")
        d[k] = v
    return d


def _json_text(text: str, file: str | None) -> Any:
    """The JSON data of ``text``; malformed JSON is a ParseError at its line:col,
    as are the liberties Python's reader takes: ``NaN`` and ``Infinity``
    literals, and a key given twice in one object."""
    try:
        return json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise ParseError(f"malformed JSON: {e.msg}", Site(file, e.lineno, e.colno)) from None
    except _NotJson as e:
        raise ParseError(f"malformed JSON: {e.args[0]}", Site(file, 1, 1), hint=e.args[1]) \
            from None
    except (ValueError, RecursionError) as e:  # e.g. an integer with too many digits
        raise ParseError(f"malformed JSON: {e}", Site(file, 1, 1)) from None


def loads(text: str, file: str | None = None, kernel: str | None = None) -> TileProgram:
    """``from_json`` of JSON text (verified); see :func:`_json_text` for what
    malformed JSON gives."""
    return from_json(_json_text(text, file), file, kernel)


def loads_module(text: str, file: str | None = None) -> TileModule:
    """``from_json_module`` of JSON text (verified)."""
    return from_json_module(_json_text(text, file), file)
