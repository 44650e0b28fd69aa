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
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import TYPE_CHECKING

from ..errors import Site
from . import expr as E
from .ir import Block, Operation, TileProgram, Value
from .ops import REGISTRY, OpDef
from .space import Dim

if TYPE_CHECKING:
    from lark import Lark

SCHEMA_VERSION = "tilenest.tileir/1"


@lru_cache(maxsize=1)
def grammar() -> Lark:
    """The LALR parser for ``tileir.lark`` (built once; lark is imported here,
    on the first parse, so that ``import tilenest`` does not load it)."""
    from lark import Lark

    text = resources.files(__package__).joinpath("tileir.lark").read_text(encoding="utf-8")
    return Lark(text, parser="lalr", propagate_positions=True, maybe_placeholders=True,
                start=["start", "value", "type"])


# ---------------------------------------------------------------------------
# names, integers and strings: the lexical rules both readers enforce

#: what each kind of name is, and the grammar terminal that spells it (with
#: its sigil): a name of that kind is legal iff sigil + name is one token of
#: that terminal. The JSON reader applies exactly these rules, so every
#: program it accepts prints as text the parser reads back.
NAME_KINDS: dict[str, tuple[str, str, str]] = {
    "value": ("VALUE", "%", "a value name"),
    "var": ("VAR", "$", "an index variable name"),
    "global": ("GLOBAL", "@", "a kernel or reducer name"),
    "sym": ("NAME", "", "a symbol name"),
}


@lru_cache(maxsize=None)
def _terminal_regex(terminal: str) -> re.Pattern[str]:
    return re.compile(grammar().get_terminal(terminal).pattern.to_regexp())


@lru_cache(maxsize=1)
def keywords() -> frozenset[str]:
    """The grammar's keywords that a bare symbol name collides with: those of
    its literal tokens spelled like names (``kernel``, ``and``, ``in``, ...)
    that, written where an index expression starts, do not read as a symbol.
    (The lexer is contextual, so most keywords are still fine symbol names.)"""
    from lark.lexer import PatternStr

    name = _terminal_regex("NAME")
    g = grammar()
    out = set()
    for t in g.terminals:
        word = t.pattern.value
        if not (isinstance(t.pattern, PatternStr) and name.fullmatch(word)):
            continue
        try:
            tree = g.parse(f"{word} + 1", start="value")
        except Exception:  # noqa: BLE001 - any failure to read it means it is reserved
            out.add(word)
            continue
        first = tree.children[0]
        if getattr(first, "data", None) != "name":
            out.add(word)
    return frozenset(out)


def name_problem(kind: str, name: str) -> str | None:
    """Why ``name`` cannot be a name of ``kind`` (see :data:`NAME_KINDS`), or None."""
    terminal, sigil, what = NAME_KINDS[kind]
    if not isinstance(name, str):
        return f"{what} must be a string"
    if not _terminal_regex(terminal).fullmatch(sigil + name):
        return f"{json_str(name)} is not {what}"
    if kind == "sym" and name in keywords():
        return f"{json_str(name)} is a keyword of TileIR text, not {what}"
    return None


def name_hint(kind: str) -> str:
    """What a name of ``kind`` is made of, as the grammar says."""
    terminal, sigil, what = NAME_KINDS[kind]
    pattern = grammar().get_terminal(terminal).pattern.to_regexp()
    extra = " and is not a keyword" if kind == "sym" else ""
    return f"{what} matches {pattern[len(re.escape(sigil)) if sigil else 0:]}{extra}"


def json_str(s: str) -> str:
    """``s`` quoted as a JSON string (every character visible)."""
    return json.dumps(s, ensure_ascii=True)


#: index integers of TileIR (index-expression constants, extents, strides) are
#: signed 64-bit integers, the index type of every backend
INT_MIN, INT_MAX = -(1 << 63), (1 << 63) - 1


#: the largest magnitude of an integer literal (of any kind): an element
#: literal may be a u64; index integers are further held to int64 by the verifier
MAX_LITERAL = (1 << 64) - 1


def literal_problem(v: int) -> str | None:
    """Why the integer literal ``v`` can be no TileIR integer, or None."""
    if -MAX_LITERAL <= v <= MAX_LITERAL:
        return None
    return "integer is outside the 64-bit range"


def string_problem(s: str) -> str | None:
    """Why ``s`` cannot be a TileIR string (it must be encodable as UTF-8)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return "string holds a lone surrogate, which no UTF-8 text can carry"
    return None


def site_problem(line: int, col: int) -> str | None:
    """Why ``line:col`` cannot be a source position (both are non-negative)."""
    for what, v in (("line", line), ("column", col)):
        if v < 0:
            return f"source {what} {v} is negative"
        if v > INT_MAX:
            return f"source {what} is outside the signed 64-bit range"
    return None


@dataclass(frozen=True)
class ReadSite(Site):
    """Where a reader found a node: ``line:col`` of TileIR text, or with
    ``path`` the node's JSON path (``body.ops[3].regions[0].ops[1]``); ``origin``
    is the location the node records itself (its ``loc``, e.g. the Python line
    it was captured from), shown alongside."""

    path: str = ""
    origin: Site | None = None

    def __str__(self) -> str:
        if self.path:
            here = f"{self.file}: {self.path}" if self.file else self.path
        else:
            here = Site.__str__(self)
        return here + (f" (written at {self.origin})" if self.origin is not None else "")


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


def number_ops(p: TileProgram, renumbered: dict[int, int] | None = None) -> TileProgram:
    """``p`` with ``oid`` assigned in pre-order from 0 over the body, then
    continuing over the custom reducers' blocks. With ``renumbered``, records
    each op's old oid -> new oid there (readers key their sites by oid)."""
    counter = itertools.count()

    def block(b: Block) -> Block:
        return Block(b.args, tuple(op_(o) for o in b.ops))

    def op_(o: Operation) -> Operation:
        oid = next(counter)
        if renumbered is not None:
            renumbered[o.oid] = oid
        return o.replace(oid=oid, regions=tuple(block(r) for r in o.regions))

    body = block(p.body)
    reducers = []
    for r in p.reducers:
        merge = block(r.merge)
        lift = block(r.lift) if r.lift is not None else None
        reducers.append(dataclasses.replace(r, merge=merge, lift=lift))
    return TileProgram(p.name, p.args, p.syms, p.assumptions, p.dims, body,
                       tuple(reducers), p.loc)

