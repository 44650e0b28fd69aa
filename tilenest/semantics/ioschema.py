"""Rules shared by the interchange forms (text and JSON) of TileIR.

Both readers enforce the same reference discipline, stated once here:

* an op name must be in :data:`~tilenest.semantics.ops.REGISTRY`; its operand
  count, region count and attribute names must fit the op's schema, and every
  required attribute must be present;
* every ``%value`` is defined exactly once in its isolation unit (the kernel
  body, or one custom reducer's blocks) and is used only where it is visible:
  after its definition, in the same block or a block nested inside it;
* the dims of a program are the entries of its dim table, rebuilt as
  ``Dim(("p", i), label)`` in table order (the canonical identity).

The writers share :class:`DimNames`, which gives each dim a printable,
program-unique name. :func:`number_ops` assigns ``Operation.oid`` in pre-order.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from . import expr as E
from .ir import Block, Operation, TileProgram, Value
from .ops import REGISTRY, OpDef
from .space import Dim

SCHEMA_VERSION = "tilenest.tileir/1"

#: characters a printed dim / value / symbol name may hold
NAME_CHARS = re.compile(r"[^A-Za-z0-9_]")


def canonical_dim(index: int, label: str | None) -> Dim:
    """The dim a reader builds for entry ``index`` of a program's dim table."""
    return Dim(("p", index), label)


class DimNames:
    """Printable names for dims: the label with characters outside
    ``[A-Za-z0-9_]`` replaced by ``_`` (or ``d<i>`` when unlabeled), made unique
    with a ``_<k>`` suffix. Dims met that are not in the table are appended, so
    printing never fails; such a program re-reads with the extra entries."""

    def __init__(self, dims: Iterable[Dim] = ()):
        self.order: list[Dim] = []
        self.names: dict[Dim, str] = {}
        self._used: set[str] = set()
        for d in dims:
            self.add(d)

    def add(self, d: Dim) -> str:
        if d in self.names:
            return self.names[d]
        base = NAME_CHARS.sub("_", d.label) if d.label else ""
        base = base or f"d{len(self.order)}"
        name = base
        for k in itertools.count(1):
            if name not in self._used:
                break
            name = f"{base}_{k}"
        self._used.add(name)
        self.names[d] = name
        self.order.append(d)
        return name

    def __getitem__(self, d: Dim) -> str:
        return self.add(d)

    def index(self, d: Dim) -> int:
        self.add(d)
        return self.order.index(d)


#: the largest constant shift count a reader folds (a larger one is rejected)
MAX_SHIFT = 4096


def build_bitop(op: str, a: E.Expr, b: E.Expr) -> E.Expr:
    """``E.bitop(op, a, b)``; a constant shift by a negative or huge count is a
    ValueError here rather than an exception (or a huge integer) in folding."""
    if op in ("<<", ">>") and isinstance(a, E.Const) and isinstance(b, E.Const) \
            and not 0 <= b.value <= MAX_SHIFT:
        raise ValueError(f"cannot fold the shift {a.value} {op} {b.value}")
    return E.bitop(op, a, b)


# ---------------------------------------------------------------------------
# op schema


def opdef_or_none(name: str) -> OpDef | None:
    return REGISTRY.get(name)


def unknown_op_hint(name: str) -> str:
    close = difflib.get_close_matches(name, list(REGISTRY), n=3)
    if close:
        return "did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    return "see spec/interchange.md for the op list"


def unknown_attr_hint(d: OpDef, attr: str) -> str:
    names = [n for n, _ in d.all_attrs()]
    if not names:
        return f"'{d.name}' takes no attributes"
    return f"'{d.name}' takes " + ", ".join(names)


def attr_kind(d: OpDef, attr: str) -> str | None:
    for n, k in d.all_attrs():
        if n == attr:
            return k
    return None


def attr_order(op: Operation) -> list[str]:
    """The op's attribute names in schema order, then any the schema lacks."""
    d = REGISTRY.get(op.name)
    order = [n for n, _ in d.all_attrs()] if d is not None else []
    return [k for k in order if k in op.attrs] + [k for k in op.attrs if k not in order]


def operand_count_problem(d: OpDef, n: int) -> str | None:
    lo, hi = d.operands
    if n >= lo and (hi is None or n <= hi):
        return None
    if hi == lo:
        want = f"{lo} operand" + ("" if lo == 1 else "s")
    elif hi is None:
        want = f"at least {lo} operand" + ("" if lo == 1 else "s")
    else:
        want = f"{lo} to {hi} operands"
    return f"'{d.name}' takes {want}, got {n}"


def region_count_problem(d: OpDef, n: int) -> str | None:
    if n == d.regions:
        return None
    want = f"{d.regions} region" + ("" if d.regions == 1 else "s")
    return f"'{d.name}' has {want}, got {n}"


def missing_attrs(d: OpDef, present: Iterable[str]) -> list[str]:
    have = set(present)
    return [n for n, _ in d.attrs if n not in have]


# ---------------------------------------------------------------------------
# SSA scopes


@dataclass
class Unit:
    """An isolation unit: every value defined in it, with where it was defined."""

    defined: dict[str, object] = field(default_factory=dict)


class Scope:
    """The values visible in one block: its own definitions and its parents'.

    ``declare`` reserves a name in the unit (a second definition anywhere in
    the unit is an error); ``bind`` makes a declared value visible here."""

    def __init__(self, unit: Unit | None = None, parent: Scope | None = None):
        self.unit = unit if unit is not None else Unit()
        self.parent = parent
        self.visible: dict[str, Value] = {}

    def child(self) -> Scope:
        return Scope(self.unit, self)

    def declare(self, name: str, where: object) -> object | None:
        """Reserve ``name``; return the earlier definition site if it was taken."""
        if name in self.unit.defined:
            return self.unit.defined[name] or "?"
        self.unit.defined[name] = where
        return None

    def bind(self, v: Value) -> None:
        self.visible[v.name] = v

    def lookup(self, name: str) -> Value | None:
        s: Scope | None = self
        while s is not None:
            v = s.visible.get(name)
            if v is not None:
                return v
            s = s.parent
        return None

    def undefined_message(self, name: str) -> tuple[str, str | None]:
        """Message and hint for a use of ``name`` that :meth:`lookup` missed."""
        if name in self.unit.defined:
            return (f"value %{name} is not visible here",
                    "a value defined inside a region (or later) cannot be used here")
        return f"undefined value %{name}", None


# ---------------------------------------------------------------------------
# op ids


def number_ops(p: TileProgram) -> TileProgram:
    """``p`` with ``oid`` assigned in pre-order from 0 over the body, then
    continuing over the custom reducers' blocks."""
    counter = itertools.count()

    def block(b: Block) -> Block:
        return Block(b.args, tuple(op_(o) for o in b.ops))

    def op_(o: Operation) -> Operation:
        oid = next(counter)
        return o.replace(oid=oid, regions=tuple(block(r) for r in o.regions))

    body = block(p.body)
    reducers = []
    for r in p.reducers:
        merge = block(r.merge)
        lift = block(r.lift) if r.lift is not None else None
        reducers.append(dataclasses.replace(r, merge=merge, lift=lift))
    return TileProgram(p.name, p.args, p.syms, p.assumptions, p.dims, body,
                       tuple(reducers), p.loc)

