"""Addressable effects: tensor views and explicit Memory objects.

``tensor.load`` / ``tensor.store`` access an external tensor through a view:
``map`` gives, for each tile-local coordinate ``($0, ..., $r-1)``, the tensor
coordinate it touches; ``valid`` further restricts the view (sub-views); the
bounds policy says what an access outside ``valid`` and the tensor's extents
means. ``memory.alloc`` creates one Memory object per instance of its owner
(the nearest enclosing ``parallel`` prefix) and its initial, *uninitialized*
state token; ``memory.store`` consumes a state and defines the next one;
``memory.load`` reads the state it is given and returns an immutable snapshot.
"""

from __future__ import annotations

from typing import Any

from ...errors import TypeCheckError
from ..types import MemoryType, StateType, TensorType, TileType
from . import define, type_rule

define("tensor.load", "memory",
       attrs=(("vars", "vars"), ("map", "exprs"), ("valid", "pred"), ("bounds", "bounds")),
       traits=("effect",), operands=(1, 1))
define("tensor.store", "memory",
       attrs=(("vars", "vars"), ("map", "exprs"), ("valid", "pred"), ("bounds", "bounds")),
       traits=("effect",), operands=(2, 2))
define("memory.alloc", "memory", traits=("effect",), operands=(0, 0))
define("memory.store", "memory", traits=("effect",), operands=(3, 3))
define("memory.load", "memory", traits=("effect",), operands=(2, 2))


@type_rule("tensor.load")
def _tload(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    (t,) = ts
    if not isinstance(t, TensorType):
        raise TypeCheckError("tensor.load needs a tensor operand")
    (r,) = hint
    if r.dtype != t.dtype:
        raise TypeCheckError(f"load of a {t.dtype} tensor cannot produce {r.dtype}")
    if len(attrs["map"]) != t.rank:
        raise TypeCheckError(f"view map gives {len(attrs['map'])} coordinates for a "
                             f"rank-{t.rank} tensor")
    if len(attrs["vars"]) != r.rank:
        raise TypeCheckError("view needs one local variable per tile dim")
    return (r,)


@type_rule("tensor.store")
def _tstore(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    t, v = ts
    if not isinstance(t, TensorType) or not isinstance(v, TileType):
        raise TypeCheckError("tensor.store needs a tensor and a tile")
    if v.dtype != t.dtype:
        raise TypeCheckError(f"cannot store a {v.dtype} tile into a {t.dtype} tensor",
                             hint="cast the value with tn.cast(value, dtype) first")
    if len(attrs["map"]) != t.rank or len(attrs["vars"]) != v.rank:
        raise TypeCheckError("view map arity does not match the tensor/tile ranks")
    return ()


@type_rule("memory.alloc")
def _alloc(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    m, s = hint
    if not isinstance(m, MemoryType) or not isinstance(s, StateType):
        raise TypeCheckError("memory.alloc defines a memory and its initial state")
    if len(m.layout.vars) != m.space.rank:
        raise TypeCheckError("memory layout needs one variable per dim")
    return hint


@type_rule("memory.store")
def _mstore(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    m, s, v = ts
    if not isinstance(m, MemoryType) or not isinstance(s, StateType):
        raise TypeCheckError("memory.store needs a memory, a state and a tile")
    if (not isinstance(v, TileType) or v.dtype != m.dtype
            or v.space.extents != m.space.extents):
        raise TypeCheckError(
            f"memory.store value must be a {m.dtype} tile with the memory's extents "
            f"{[str(x) for x in m.space.extents]}",
            hint="stores write the whole logical tile, axis by axis; cast or reindex first")
    return (s,)


@type_rule("memory.load")
def _mload(ts: tuple, attrs: Any, hint: tuple) -> tuple:
    m, s = ts
    if not isinstance(m, MemoryType) or not isinstance(s, StateType):
        raise TypeCheckError("memory.load needs a memory and a state")
    return (TileType(m.dtype, m.space),)
