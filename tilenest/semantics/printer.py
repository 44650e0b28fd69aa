"""The textual form of TileIR: printing (``parser.py`` reads exactly this back).

A program prints as::

    kernel @name(%arg: type, ...)
        syms [N, ...] assume [pred, ...] dims [#name = "label", #d1, ...] loc(...) {
      reducer @r(state = [...], identity = [...], ...) merge { ^(...): ... } lift { ... }
      [%r0, %r1 =] opname [%operand, ...] [{attr = value, ...}] [: type, ...] [loc(...)] [region ...]
    }

where each region is ``{ ^(%arg: type, ...): op* }``. Attribute values are
printed according to the kind the op schema declares (see
:data:`~tilenest.semantics.ops.ATTR_KINDS` and ``spec/interchange.md``); the
printer mirrors the parser: ``print_x`` writes what ``parse_x`` reads.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..errors import Site
from . import expr as E
from .dtypes import DType
from .expr import Expr, Pred
from .ioschema import DimNames, attr_kind, attr_order, opdef_or_none
from .ir import Block, Operation, TileProgram, Value
from .maps import Map, MemLayout
from .policies import Bounds, BoundsPolicy, ExecPolicy, PipelinePolicy, ReductionPolicy
from .space import IndexSet, Space
from .types import MemoryType, StateType, TensorType, TileType, Type

INDENT = "  "


# ---------------------------------------------------------------------------
# leaves


def print_expr(e: Expr) -> str:
    """An index expression: symbols bare, ``$var``, ``%value``, Python operators."""
    return E.to_str(e)


def print_pred(p: Pred) -> str:
    """A predicate: comparisons joined by ``and``/``or``/``not``; ``true``/``false``."""
    return E.pred_to_str(p)


def print_loc(site: Site) -> str:
    """``loc("file":line:col)``, or ``loc(line:col)`` without a file."""
    f = f"{json.dumps(site.file, ensure_ascii=False)}:" if site.file is not None else ""
    return f"loc({f}{site.line}:{site.col})"


def print_number(v: Any) -> str:
    """An int, a float (always re-read as a float: ``1.0``, ``-0.0``, ``inf``,
    ``nan``, ``1e-05``) or a bool."""
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    f = float(v)
    if math.isnan(f):
        return "nan"
    return repr(f)


def print_space(s: Space, names: DimNames) -> str:
    """``[#dim:extent, ...]``."""
    return "[" + ", ".join(f"#{names[f.dim]}:{print_expr(f.extent)}" for f in s.factors) + "]"


def print_map(m: Map) -> str:
    """``($a, ...) -> (e, ...)``."""
    ins = ", ".join("$" + v for v in m.inputs)
    return f"({ins}) -> (" + ", ".join(print_expr(o) for o in m.outputs) + ")"


def print_layout(m: MemLayout) -> str:
    """``($a, ...) -> offset size n``."""
    ins = ", ".join("$" + v for v in m.vars)
    return f"({ins}) -> {print_expr(m.offset)} size {print_expr(m.size)}"


def print_type(t: Type, names: DimNames | None = None) -> str:
    """``f32`` (a scalar), ``tile<T, [...]>``, ``tensor<T, [...]>``,
    ``memory<T, [...], layout = ..., resource = r>`` or ``state<%mem>``."""
    names = names if names is not None else DimNames()
    if isinstance(t, TileType):
        if t.is_scalar:
            return t.dtype.name
        return f"tile<{t.dtype.name}, {print_space(t.space, names)}>"
    if isinstance(t, TensorType):
        return f"tensor<{t.dtype.name}, {print_space(t.space, names)}>"
    if isinstance(t, MemoryType):
        return (f"memory<{t.dtype.name}, {print_space(t.space, names)}, "
                f"layout = {print_layout(t.layout)}, resource = {t.resource}>")
    if isinstance(t, StateType):
        return f"state<%{t.memory}>"
    raise TypeError(f"cannot print type {t!r}")


# ---------------------------------------------------------------------------
# attributes


def _tuple(items: list[str]) -> str:
    return "(" + ", ".join(items) + ")"


def _list(items: list[str]) -> str:
    return "[" + ", ".join(items) + "]"


def print_indexset(s: IndexSet, names: DimNames) -> str:
    """``{($i, ...) in [#d:extent, ...] | pred}`` (no ``| pred`` when it is true)."""
    vs = _tuple(["$" + v for v in s.vars])
    guard = "" if s.pred == E.TRUE else f" | {print_pred(s.pred)}"
    return f"{{{vs} in {print_space(s.space, names)}{guard}}}"


def print_bounds(b: BoundsPolicy) -> str:
    return f"fill({print_number(b.fill)})" if b.kind is Bounds.fill else b.kind.value


def print_exec(x: ExecPolicy) -> str:
    parts = []
    if x.scope is not None:
        parts.append(f"scope = {x.scope}")
    if x.layout is not None:
        parts.append(f"layout = {print_map(x.layout)}")
    return "exec(" + ", ".join(parts) + ")"


def print_contracts(cs: tuple[str | None, ...]) -> str:
    return _list(["none" if c is None else str(c) for c in cs])


_KIND_PRINTERS: dict[str, Callable[[Any, DimNames], str]] = {
    "int": lambda v, n: str(int(v)),
    "bool": lambda v, n: "true" if v else "false",
    "str": lambda v, n: json.dumps(v, ensure_ascii=False),
    "number": lambda v, n: print_number(v),
    "dtype": lambda v, n: v.name,
    "expr": lambda v, n: print_expr(v),
    "exprs": lambda v, n: _tuple([print_expr(e) for e in v]),
    "vars": lambda v, n: _tuple(["$" + x for x in v]),
    "ints": lambda v, n: _list([str(int(i)) for i in v]),
    "indexset": lambda v, n: print_indexset(v, n),
    "pred": lambda v, n: print_pred(v),
    "bounds": lambda v, n: print_bounds(v),
    "exec": lambda v, n: print_exec(v),
    "pipeline": lambda v, n: f"pipeline(window = {v.window}, interval = {v.interval})",
    "rpolicy": lambda v, n: v.value,
    "contracts": lambda v, n: print_contracts(v),
}


def guess_kind(v: Any) -> str:
    """The attribute kind an unschematized value most plausibly has (used only
    to print attributes no schema describes, which the parser then rejects)."""
    if isinstance(v, (bool, np.bool_)):
        return "bool"
    if isinstance(v, (int, np.integer)):
        return "int"
    if isinstance(v, (float, np.floating)):
        return "number"
    for cls, kind in ((str, "str"), (DType, "dtype"), (Expr, "expr"), (Pred, "pred"),
                      (IndexSet, "indexset"), (BoundsPolicy, "bounds"),
                      (ExecPolicy, "exec"), (PipelinePolicy, "pipeline"),
                      (ReductionPolicy, "rpolicy")):
        if isinstance(v, cls):
            return kind
    if isinstance(v, tuple) and all(isinstance(x, Expr) for x in v):
        return "exprs"
    if isinstance(v, tuple) and all(isinstance(x, int) for x in v):
        return "ints"
    return "repr"


def print_attr(kind: str, value: Any, names: DimNames | None = None) -> str:
    """One attribute value written as its ``kind`` prescribes."""
    names = names if names is not None else DimNames()
    if kind == "repr":
        return json.dumps(repr(value), ensure_ascii=False)
    return _KIND_PRINTERS[kind](value, names)


def print_attrs(op: Operation, names: DimNames) -> str:
    """``{name = value, ...}`` in schema order, then any unschematized ones."""
    d = opdef_or_none(op.name)
    parts = []
    for k in attr_order(op):
        kind = (attr_kind(d, k) if d is not None else None) or guess_kind(op.attrs[k])
        parts.append(f"{k} = {print_attr(kind, op.attrs[k], names)}")
    return "{" + ", ".join(parts) + "}"


# ---------------------------------------------------------------------------
# ops and blocks


def _value_decl(v: Value, names: DimNames) -> str:
    return f"%{v.name}: {print_type(v.type, names)}"


def print_label(b: Block, names: DimNames) -> str:
    """A block's argument line ``^(%a: type, ...):``."""
    return "^(" + ", ".join(_value_decl(a, names) for a in b.args) + "):"


def print_region(b: Block, names: DimNames, indent: int) -> list[str]:
    """``{`` (to end the op's line), the label, the ops, and the closing ``}``."""
    pad = INDENT * indent
    lines = ["{", pad + print_label(b, names)]
    for op in b.ops:
        lines.extend(print_op_lines(op, names, indent + 1))
    lines.append(pad + "}")
    return lines


def print_op_lines(op: Operation, names: DimNames, indent: int = 0) -> list[str]:
    """The lines of one op, its regions included, indented ``indent`` levels."""
    pad = INDENT * indent
    head = pad
    if op.results:
        head += ", ".join("%" + r.name for r in op.results) + " = "
    head += op.name
    if op.operands:
        head += " " + ", ".join("%" + o.name for o in op.operands)
    if op.attrs:
        head += " " + print_attrs(op, names)
    if op.results:
        head += " : " + ", ".join(print_type(r.type, names) for r in op.results)
    if op.loc is not None:
        head += " " + print_loc(op.loc)
    lines = [head]
    for r in op.regions:
        region = print_region(r, names, indent)
        lines[-1] += " " + region[0]
        lines.extend(region[1:])
    return lines


def print_op(op: Operation, names: DimNames | None = None, indent: int = 0) -> str:
    """One op (and its regions) as text."""
    return "\n".join(print_op_lines(op, names if names is not None else DimNames(), indent))


def print_block(b: Block, names: DimNames | None = None, indent: int = 0) -> str:
    """A block as a region: ``{ ^(...): op* }``."""
    return "\n".join(print_region(b, names if names is not None else DimNames(), indent))


def print_reducer(r: Any, names: DimNames) -> list[str]:
    """``reducer @name(state = [...], identity = [...], associative = b,
    commutative = b[, provenance = "..."]) merge {...} [lift {...}]``."""
    params = [
        "state = " + _list([d.name for d in r.state]),
        "identity = " + _list([print_number(x) for x in r.identity]),
        f"associative = {'true' if r.associative else 'false'}",
        f"commutative = {'true' if r.commutative else 'false'}",
    ]
    if r.provenance != "declared":
        params.append("provenance = " + json.dumps(r.provenance, ensure_ascii=False))
    lines = [INDENT + f"reducer @{r.name}(" + ", ".join(params) + ") merge"]
    for key, blk in (("merge", r.merge), ("lift", r.lift)):
        if blk is None:
            continue
        if key == "lift":
            lines[-1] += " lift"
        region = print_region(blk, names, 1)
        lines[-1] += " " + region[0]
        lines.extend(region[1:])
    return lines


def print_program(p: TileProgram) -> str:
    """The whole kernel as TileIR text (ends with a newline)."""
    names = DimNames(p.dims)
    inner: list[str] = []
    for r in p.reducers:
        inner.extend(print_reducer(r, names))
    if p.body.args:
        inner.append(print_label(p.body, names))
    for op in p.body.ops:
        inner.extend(print_op_lines(op, names, 1))
    args = ", ".join(_value_decl(a, names) for a in p.args)
    assume = _list([print_pred(a) for a in p.assumptions])
    # printed after the body so that dims met only there still get a table entry
    dims = []
    for d in names.order:
        label = "" if d.label is None else " = " + json.dumps(d.label, ensure_ascii=False)
        dims.append(f"#{names[d]}{label}")
    header2 = f"    syms {_list(list(p.syms))} assume {assume} dims {_list(dims)}"
    if p.loc is not None:
        header2 += " " + print_loc(p.loc)
    return "\n".join([f"kernel @{p.name}({args})", header2 + " {", *inner, "}"]) + "\n"


def print_module(m: Any) -> str:
    """The kernels of a module as TileIR text, one blank line between kernels
    (ends with a newline). A module of one kernel prints as that kernel."""
    return "\n".join(print_program(p) for p in m)
