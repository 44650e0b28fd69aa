"""Accumulators that their ``mma`` fills and stores (CPU micro-kernels).

A program that sums into a tile over a loop and then stores the sum::

    acc = broadcast(const c)                    -- the seed: a constant fill
    r = serial / pipeline / reduce over [0, T), carrying acc:
        acc' = mma(a, b, acc)                   -- once per step, yielded back
    tensor.store C, r                           -- r's only use

lowers by default into three passes over the accumulator tile: the fill
before the loop, the micro-kernels' read-modify-write at every step, and the
copy into ``C`` after the loop. When the ``mma`` updates the carried tile in
place, the two outer passes fold into the micro-kernels (``mma.contract``'s
:class:`Edges`): at the first step each micro-tile is set to ``c`` just
before its contraction, and at the last step it is stored into ``C`` just
after it, while its values are still in registers. The fill before the loop
and the store after it then run only when the loop has no step (``T <= 0``).

The meaning is unchanged: every element of the tile still starts at ``c``
and meets its contraction points in the same order, and ``C`` receives the
same values at the same places, only earlier -- during the last step rather
than after it. That is unobservable because nothing else in the program
touches ``C`` (:func:`accumulations` checks it) and a program's stores are
seen by no other program before the kernel ends (the join of a ``parallel``).

:func:`accumulations` finds the pattern on the tile program; the lowering
applies a fold only where the micro-kernel path runs with the tile updated in
place, and records it (``Lowerer.folded``) so that the loop (the fill) and
the store (the copy) keep their own code for the loop without steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..semantics import expr as E
from ..semantics.ir import Operation, TileProgram
from ..semantics.policies import Bounds, ReductionPolicy
from ..semantics.types import TileType

#: the loop regions whose carried tiles may be folded (a ``reduce`` that
#: folds whole tiles runs as a serial region does, ``reductions.py``)
LOOPS = ("serial", "pipeline", "reduce")


@dataclass(frozen=True)
class Accumulation:
    """An ``mma`` that updates a loop's carried tile (module doc): the loop,
    the carried position, the seed's constant (None: the seed is not a
    constant fill, so the fill is not folded) and the store of the loop's
    result (None: not folded)."""

    loop: Operation
    position: int
    fill: object
    store: Operation | None


def accumulations(prog: TileProgram) -> dict[int, Accumulation]:
    """``mma`` op id -> its :class:`Accumulation`, for every ``mma`` that is
    the only use of a loop's carried tile, runs once per step (in the loop's
    body or a pipeline ``stage`` of it, in no other region), and whose result
    is yielded back at the same position and used for nothing else; where
    neither the fill nor the store can be folded, the ``mma`` is left out.

    The loop has one variable, no domain predicate and runs forward; the fill
    folds when the seed is a ``broadcast`` of a ``const``; the store folds
    when the loop's result at that position has one use, a ``tensor.store``
    in the loop's block whose bounds are not ``checked`` and whose view (map
    and validity) reads no value defined from the loop on, into a tensor that
    no other op of the program reads or writes."""
    uses: dict[str, list[tuple[Operation, int]]] = {}
    defs: dict[str, Operation] = {}
    parent: dict[int, Operation | None] = {}
    block_of: dict[int, tuple[Operation, ...]] = {}

    def visit(ops: tuple[Operation, ...], up: Operation | None) -> None:
        for op in ops:
            parent[op.oid] = up
            block_of[op.oid] = ops
            for i, o in enumerate(op.operands):
                uses.setdefault(o.name, []).append((op, i))
            for r in op.results:
                defs[r.name] = op
            for reg in op.regions:
                visit(reg.ops, op)

    visit(prog.body.ops, None)
    out: dict[int, Accumulation] = {}
    for loop in prog.walk():
        if not _simple_loop(loop):
            continue
        body = loop.regions[0]
        for p, arg in enumerate(body.args):
            if not isinstance(arg.type, TileType):
                continue
            mma = _only_mma(uses.get(arg.name, []), loop, parent)
            if mma is None or not _yielded_at(mma, p, loop, uses, parent):
                continue
            fill = _const_fill(loop.operands[p], defs)
            store = _lone_store(loop, p, uses, block_of)
            if fill is not None or store is not None:
                out[mma.oid] = Accumulation(loop, p, fill, store)
    return out


def _simple_loop(op: Operation) -> bool:
    """A ``serial``, ``pipeline`` or ``reduce`` region of one variable over a
    domain without predicate, run forward (the lowering folds only where it
    runs the region as one loop: ``Lowerer.steps``)."""
    if op.name not in LOOPS or len(op.attrs.get("vars", ())) != 1:
        return False
    dom = op.attrs["domain"]
    policy = op.attrs.get("policy")
    backward = op.attrs.get("order") == "reverse" or (
        policy is not None and policy is ReductionPolicy.fold_right)
    return dom.pred == E.TRUE and not backward


def _only_mma(us: list[tuple[Operation, int]], loop: Operation,
              parent: dict[int, Operation | None]) -> Operation | None:
    """The ``mma`` that is the only use of a carried tile (as the
    accumulator), when it runs once per step of ``loop``."""
    if len(us) != 1 or us[0][0].name != "mma" or us[0][1] != 2:
        return None
    op = us[0][0]
    up = parent.get(op.oid)
    while up is not None and up is not loop:
        if up.name != "stage":
            return None
        up = parent.get(up.oid)
    return op if up is loop else None


def _yielded_at(mma: Operation, p: int, loop: Operation,
                uses: dict[str, list[tuple[Operation, int]]],
                parent: dict[int, Operation | None]) -> bool:
    """Whether ``mma``'s result reaches the yield of ``loop``'s body at
    position ``p`` and nothing else (through the yields of enclosing
    ``stage`` regions, each of whose results has that one use too)."""
    name = mma.results[0].name
    while True:
        us = uses.get(name, [])
        if len(us) != 1 or us[0][0].name != "yield":
            return False
        y, i = us[0]
        up = parent.get(y.oid)
        if up is loop:
            return i == p
        if up is None or up.name != "stage":
            return False
        name = up.results[i].name


def _const_fill(seed: object, defs: dict[str, Operation]) -> object:
    """The constant of a seed that is a ``broadcast`` of a ``const``, else None."""
    op = defs.get(seed.name)  # type: ignore[attr-defined]
    if op is None or op.name != "broadcast":
        return None
    src = defs.get(op.operands[0].name)
    if src is None or src.name != "const":
        return None
    return src.attrs["value"]


def _lone_store(loop: Operation, p: int, uses: dict[str, list[tuple[Operation, int]]],
                block_of: dict[int, tuple[Operation, ...]]) -> Operation | None:
    """The ``tensor.store`` that is the only use of ``loop``'s result ``p``,
    when its store may run during the loop's last step (module doc)."""
    us = uses.get(loop.results[p].name, [])
    if len(us) != 1:
        return None
    st, i = us[0]
    if st.name != "tensor.store" or i != 1 or block_of.get(st.oid) is not block_of.get(loop.oid):
        return None
    if st.attrs["bounds"].kind is Bounds.checked:
        return None
    # the store is lowered inside the loop: its view may read only values
    # defined before the loop (none of its block's ops from the loop on)
    block = block_of[loop.oid]
    at = next(i for i, o in enumerate(block) if o is loop)
    later = {r.name for o in block[at:] for r in o.results}
    view = [*st.attrs["map"], st.attrs["valid"]]
    if any(isinstance(x, E.Val) and x.name in later for v in view for x in E.leaves(v)):
        return None
    tensor = st.operands[0].name
    return st if len(uses.get(tensor, [])) == 1 else None
