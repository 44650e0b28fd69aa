"""Reducer contracts: the algebra a tree-realized reduction may use.

A contract states, for a state type ``S`` and contributions ``x``:

* ``lift(x)``    -- the partial state of one contribution (identity by default);
* ``merge(a, b)``-- combination of two partial states;
* ``identity``   -- a two-sided identity of ``merge``;
* declared laws  -- ``associative`` and ``commutative``, with their provenance.

A left-reference update ``s = u(s, x)`` is compatible with the contract when
``u(s, x) = merge(s, lift(x))``; a right-reference one when
``u(x, s) = merge(lift(x), s)``. The laws are evidence about the mathematical
operation; *permission* to regroup inexact arithmetic (floating-point add)
comes from the reduction policy, never from the law declaration.

Built-ins: ``add mul max min and or xor``. Float ``add`` uses the identity
``-0.0`` (the only value with ``x + i == x`` for every ``x``, including ``-0.0``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .dtypes import DType


@dataclass(frozen=True)
class Builtin:
    """A built-in reducer: ``merge`` is the elementwise op of the same name."""

    name: str
    op: str  # the binary elementwise op implementing merge
    associative: bool = True
    commutative: bool = True
    provenance: str = "builtin"

    def identity(self, dt: DType) -> Any:
        """The identity element of ``merge`` in dtype ``dt``."""
        if self.name == "add":
            return -0.0 if dt.is_float else (False if dt.is_bool else 0)
        if self.name == "mul":
            return 1.0 if dt.is_float else (True if dt.is_bool else 1)
        if self.name == "max":
            if dt.is_float:
                return -math.inf
            if dt.is_bool:
                return False
            return -(1 << (dt.bits - 1)) if dt.is_signed else 0
        if self.name == "min":
            if dt.is_float:
                return math.inf
            if dt.is_bool:
                return True
            return (1 << (dt.bits - 1)) - 1 if dt.is_signed else (1 << dt.bits) - 1
        if self.name == "and":
            if dt.is_bool:
                return True
            return -1 if dt.is_signed else (1 << dt.bits) - 1
        if self.name in ("or", "xor"):
            return False if dt.is_bool else 0
        raise KeyError(self.name)

    def exact_for(self, dt: DType) -> bool:
        """Whether the declared laws hold exactly in dtype ``dt`` (not just by
        permission): true for integers/bools, and for max/min on floats."""
        if dt.is_float:
            return self.name in ("max", "min")
        return True

    def accepts(self, dt: DType) -> bool:
        if self.name in ("and", "or", "xor"):
            return dt.is_int or dt.is_bool
        return True


BUILTINS: dict[str, Builtin] = {
    b.name: b
    for b in (
        Builtin("add", "add"),
        Builtin("mul", "mul"),
        Builtin("max", "maximum"),
        Builtin("min", "minimum"),
        Builtin("and", "and"),
        Builtin("or", "or"),
        Builtin("xor", "xor"),
    )
}

#: elementwise op name -> builtin reducer whose merge it is
BY_OP: dict[str, Builtin] = {b.op: b for b in BUILTINS.values()}


@dataclass(frozen=True)
class CustomReducer:
    """A user contract: ``merge``/``lift`` are scalar regions (see ``ir.Block``),
    ``identity`` one constant per state component."""

    name: str
    state: tuple[DType, ...]
    identity: tuple[Any, ...]
    merge: Any  # ir.Block: (a..., b...) -> (c...)
    lift: Any | None  # ir.Block: (x...) -> (s...), None = identity
    associative: bool
    commutative: bool
    provenance: str = "declared"


#: ``(program, reducer, need_comm) -> (proved, why)``: whether the laws a tree
#: policy relies on (associativity and a two-sided identity, commutativity when
#: ``need_comm``) are proved for ``reducer`` on the states ``program``'s tree
#: reductions form. Installed by ``tilenest.proofs`` (the semantics and the
#: interpreter import no prover); ``None``: nothing can prove them.
_LAW_ORACLE: Any = None


def install_law_oracle(oracle: Any) -> None:
    """Make ``oracle`` the decision procedure of :func:`tree_laws`."""
    global _LAW_ORACLE
    _LAW_ORACLE = oracle


def tree_laws(program: Any, reducer: CustomReducer, need_comm: bool) -> tuple[bool, str]:
    """Whether ``reducer``'s laws a tree policy needs are proved, and if not, why."""
    if _LAW_ORACLE is None:
        return False, "no prover is loaded to decide them"
    proved, why = _LAW_ORACLE(program, reducer, need_comm)
    return bool(proved), str(why)
