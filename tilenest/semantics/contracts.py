"""Reduction contracts of a ``reduce`` region, checked on TileIR (spec R-5..R-12).

Under a tree policy (``unordered_tree``, ``ordered_tree``) every state needs a
contract that its update matches:

* a builtin ``c`` (add mul max min and or xor): the state's next value is
  ``merge_c(s, x)`` (either operand order) with ``x`` independent of every
  state of the region; for ``add`` also ``s' = mma(a, b, s)``;
* a custom reducer ``@r``: trusted as declared, but its laws must allow the
  policy -- associativity for any tree, commutativity for ``unordered_tree``.

A tree region may not write memory (its order is not defined). Strict folds
need no contract. Violations are :class:`ContractError` s at the region.
"""

from __future__ import annotations

from ..errors import ContractError
from .analysis import values_read
from .ir import Block, Operation, TileProgram
from .policies import ReductionPolicy
from .reducers import BUILTINS

_FOLD_HINT = ("a strict fold needs no merge law: policy=tn.fold_left (or tn.fold_right); "
              "or write the update as `s = s + x` / `s = tn.maximum(s, x)` with x independent "
              "of the states, or pass contract=...")


def _depends(name: str, targets: set[str], defs: dict[str, Operation]) -> bool:
    seen: set[str] = set()
    stack = [name]
    while stack:
        n = stack.pop()
        if n in targets:
            return True
        if n in seen:
            continue
        seen.add(n)
        d = defs.get(n)
        if d is not None:
            stack.extend(values_read(d))
    return False


def check_reduce(p: TileProgram, op: Operation) -> None:
    policy: ReductionPolicy = op.attrs["policy"]
    if not policy.is_tree:
        return
    body: Block = op.regions[0]
    for inner in body.walk():
        if inner.name in ("tensor.store", "memory.store"):
            raise ContractError(
                f"'{inner.name}' inside a {policy.value} reduce region has no defined order",
                inner.loc or op.loc,
                "tree policies admit any evaluation order; use policy=tn.fold_left or a "
                "serial region for effects")
    defs = {r.name: o for o in body.ops for r in o.results}
    states = {a.name for a in body.args}
    y = body.terminator
    for i, (arg, c) in enumerate(zip(body.args, op.attrs["contracts"], strict=True)):
        if c is None:
            raise ContractError(
                f"the update of '{arg.name}' in this reduce region matches no reducer "
                f"contract, but policy {policy.value} needs one to regroup contributions",
                op.loc, _FOLD_HINT)
        if c.startswith("@"):
            red = next((r for r in p.reducers if r.name == c[1:]), None)
            if red is None:
                raise ContractError(f"unknown reducer contract {c}", op.loc)
            if not red.associative:
                raise ContractError(f"reducer {c} is not associative; policy {policy.value} "
                                    "regroups contributions", op.loc,
                                    "use policy=tn.fold_left or tn.fold_right")
            if policy is ReductionPolicy.unordered_tree and not red.commutative:
                raise ContractError(f"reducer {c} is not commutative; unordered_tree may "
                                    "permute contributions", op.loc,
                                    "use policy=tn.ordered_tree (keeps order) or a strict fold")
            continue
        b = BUILTINS.get(c)
        if b is None:
            raise ContractError(f"unknown reducer contract '{c}'", op.loc)
        dt = getattr(arg.type, "dtype", None)  # tiles, tensors and memories have one
        if dt is None or not b.accepts(dt):
            what = dt if dt is not None else arg.type
            raise ContractError(f"reducer {c} is not defined on {what}", op.loc)
        fin = y.operands[i] if y is not None else arg
        d = defs.get(fin.name)
        contrib: list[str] = []
        if d is not None and d.name == b.op and len(d.operands) == 2 and arg in d.operands:
            contrib = [o.name for o in d.operands if o is not arg and o != arg] or [arg.name]
            if d.operands[0] == d.operands[1]:
                contrib = [arg.name]
        elif c == "add" and d is not None and d.name == "mma" and d.operands[2] == arg:
            contrib = [d.operands[0].name, d.operands[1].name]
        else:
            what = f"'{d.name}'" if d is not None else "no update"
            raise ContractError(
                f"the contract {c} of '{arg.name}' does not match its update ({what})",
                op.loc, _FOLD_HINT)
        if any(_depends(n, states, defs) for n in contrib):
            raise ContractError(
                f"the update of '{arg.name}' reads a state of the region (coupled states); "
                f"policy {policy.value} needs one joint contract for them", op.loc,
                "use a strict fold, or a custom reducer covering the coupled states")
