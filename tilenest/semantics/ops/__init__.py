"""The op schema registry: every TileIR op declares itself here.

An :class:`OpDef` lists an op's attributes (each with an *attribute kind* that
the printer, parser and JSON codec use), the number of regions it owns, its
traits (``pure``, ``elementwise``, ``effect``, ``region``, ``terminator``) and
its family. Result types come from one type rule per op (:data:`TYPE_RULES`),
used both when the frontend builds an op and when the verifier re-checks it.
A missing rule is an error naming the op.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ...errors import TypeCheckError

#: attribute kinds understood by printer / parser / JSON
ATTR_KINDS = (
    "int", "bool", "str", "number", "dtype", "expr", "exprs", "vars", "ints",
    "indexset", "pred", "bounds", "exec", "pipeline", "rpolicy", "contracts",
)


@dataclass(frozen=True)
class OpDef:
    """Schema of one op: ``attrs`` are required ``(name, kind)`` pairs,
    ``optional`` may be absent; ``operands`` is ``(min, max)`` (max None = any)."""

    name: str
    family: str
    attrs: tuple[tuple[str, str], ...] = ()
    optional: tuple[tuple[str, str], ...] = ()
    traits: frozenset[str] = frozenset()
    regions: int = 0
    operands: tuple[int, int | None] = (0, None)

    def kind_of(self, attr: str) -> str:
        for n, k in self.attrs + self.optional:
            if n == attr:
                return k
        raise KeyError(attr)

    def all_attrs(self) -> tuple[tuple[str, str], ...]:
        return self.attrs + self.optional


REGISTRY: dict[str, OpDef] = {}

TypeRule = Callable[..., tuple[Any, ...]]
TYPE_RULES: dict[str, TypeRule] = {}


def define(name: str, family: str, *, attrs: tuple = (), optional: tuple = (),
           traits: tuple[str, ...] = (), regions: int = 0,
           operands: tuple[int, int | None] = (0, None)) -> OpDef:
    """Register an op schema."""
    d = OpDef(name, family, tuple(attrs), tuple(optional), frozenset(traits), regions, operands)
    for _, k in d.all_attrs():
        assert k in ATTR_KINDS, (name, k)
    REGISTRY[name] = d
    return d


def type_rule(*names: str) -> Callable[[TypeRule], TypeRule]:
    """Register ``fn(operand_types, attrs, result_hint) -> result types`` for ops."""

    def deco(fn: TypeRule) -> TypeRule:
        for n in names:
            TYPE_RULES[n] = fn
        return fn

    return deco


def opdef(name: str) -> OpDef:
    try:
        return REGISTRY[name]
    except KeyError:
        raise TypeCheckError(f"unknown op '{name}'",
                             hint="see spec/interchange.md for the op list") from None


def infer_types(name: str, operand_types: tuple, attrs: Any, hint: tuple = ()) -> tuple:
    """Result types of op ``name`` (``hint`` supplies types the op cannot derive,
    such as a constant's or a cast's result type)."""
    try:
        rule = TYPE_RULES[name]
    except KeyError:
        raise TypeCheckError(f"no type rule for op '{name}'") from None
    return rule(operand_types, attrs, hint)


# register all families
from . import memory as _memory, regions as _regions, values as _values  # noqa: E402,F401
