"""Mutable construction state used while a kernel is captured.

The frontend appends ops to :class:`BBlock` s through a :class:`Builder`; values
are :class:`BValue` s that may *forward* to another value (the capture trick for
carried state: at region entry every live variable gets a forwarding
placeholder, resolved at region exit to either the region's block argument or
the incoming value). :meth:`Builder.finish` freezes everything into a canonical
:class:`~tilenest.semantics.ir.TileProgram`: forwarding resolved, values and
dims renamed in definition order, op ids assigned.
"""

from __future__ import annotations

import itertools
import re
import weakref
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any, Iterable

from ..errors import Site, TypeCheckError
from ..semantics import expr as E
from ..semantics.ir import Block, FrozenDict, Operation, TileProgram, Value
from ..semantics.ops import infer_types, opdef
from ..semantics.space import Dim
from ..semantics.types import StateType

_ids = itertools.count()
_REGISTRY: "weakref.WeakValueDictionary[int, BValue]" = weakref.WeakValueDictionary()


class BValue:
    """A value under construction. ``forward`` (if set) redirects every use."""

    __slots__ = ("type", "hint", "uid", "forward", "defop", "__weakref__")

    def __init__(self, type: Any, hint: str | None = None, defop: "BOp | None" = None):
        self.type = type
        self.hint = hint
        self.uid = next(_ids)
        self.forward: BValue | None = None
        self.defop = defop
        _REGISTRY[self.uid] = self

    @staticmethod
    def by_uid(uid: int) -> "BValue":
        return _REGISTRY[uid]

    def resolve(self) -> "BValue":
        v = self
        while v.forward is not None:
            v = v.forward
        return v

    @property
    def tmp_name(self) -> str:
        """The name of this value inside index expressions before renaming."""
        return f"tmp.{self.uid}"

    def __repr__(self) -> str:
        return f"BValue({self.hint or ''}#{self.uid})"


@dataclass(eq=False)
class BOp:
    name: str
    operands: list[BValue]
    results: list[BValue]
    attrs: dict[str, Any]
    regions: list["BBlock"]
    loc: Site | None


@dataclass(eq=False)
class BBlock:
    args: list[BValue] = field(default_factory=list)
    ops: list[BOp] = field(default_factory=list)


class Builder:
    """Appends ops to the innermost open block; computes result types with the
    op's type rule (the same rule the verifier re-checks)."""

    def __init__(self) -> None:
        self.blocks: list[BBlock] = [BBlock()]
        self.site: Site | None = None
        self._var_names: set[str] = set()

    @property
    def block(self) -> BBlock:
        return self.blocks[-1]

    def push(self, b: BBlock) -> None:
        self.blocks.append(b)

    def pop(self) -> BBlock:
        return self.blocks.pop()

    def fresh_var(self, base: str) -> str:
        """A program-unique index-variable name derived from ``base``."""
        base = re.sub(r"[^A-Za-z0-9_]", "_", base) or "i"
        if base[0].isdigit():
            base = "v" + base
        name, k = base, 1
        while name in self._var_names:
            name = f"{base}_{k}"
            k += 1
        self._var_names.add(name)
        return name

    def op(self, name: str, operands: Iterable[BValue] = (), attrs: dict | None = None,
           hint: tuple = (), regions: Iterable[BBlock] = (), names: tuple = (),
           result_types: tuple | None = None) -> BOp:
        """Create and append an op; its results get types from the type rule."""
        operands = [o.resolve() for o in operands]
        attrs = dict(attrs or {})
        d = opdef(name)
        lo, hi = d.operands
        if len(operands) < lo or (hi is not None and len(operands) > hi):
            raise TypeCheckError(f"'{name}' takes {lo}..{hi} operands, got {len(operands)}")
        if result_types is None:
            result_types = infer_types(name, tuple(o.type for o in operands), attrs, tuple(hint))
        op = BOp(name, list(operands), [], attrs, list(regions), self.site)
        op.results = [BValue(t, names[i] if i < len(names) else None, op)
                      for i, t in enumerate(result_types)]
        self.block.ops.append(op)
        return op

    # -- freezing -----------------------------------------------------------
    def finish(self, name: str, args: list[BValue], syms: list[str], assumptions: list,
               reducers: list, loc: Site | None) -> TileProgram:
        return _Freezer().freeze(name, args, syms, assumptions, reducers, self.blocks[0], loc)


def _sanitize(h: str | None) -> str:
    if not h:
        return ""
    s = re.sub(r"[^A-Za-z0-9_]", "_", h)
    return s


class _Freezer:
    """Canonicalization: resolve forwarding, rename values (definition order,
    hinted names uniquified) and dims (first appearance -> ``("p", i)``)."""

    def __init__(self) -> None:
        self.vnames: dict[int, str] = {}
        self.used: set[str] = set()
        self.dims: dict[Dim, Dim] = {}
        self.values: dict[int, Value] = {}
        self.counter = 0
        self.oid = 0

    def freeze(self, name, args, syms, assumptions, reducers, body, loc) -> TileProgram:
        # pass 1: names in definition order
        for a in args:
            self._name(a)
        self._name_block(body)
        fargs = tuple(self._value(a) for a in args)
        fbody = self._block(body)
        freds = tuple(self._reducer(r) for r in reducers)
        prog = TileProgram(
            name=name, args=fargs, syms=tuple(syms),
            assumptions=tuple(self._conv(p) for p in assumptions),
            dims=tuple(self.dims.values()), body=fbody, reducers=freds, loc=loc)
        return prog

    def _name(self, v: BValue) -> None:
        v = v.resolve()
        if v.uid in self.vnames:
            return
        base = _sanitize(v.hint)
        if base:
            n, k = base, 1
            while n in self.used:
                n = f"{base}_{k}"
                k += 1
        else:
            while str(self.counter) in self.used:
                self.counter += 1
            n = str(self.counter)
            self.counter += 1
        self.used.add(n)
        self.vnames[v.uid] = n

    def _name_block(self, b: BBlock) -> None:
        for a in b.args:
            self._name(a)
        for op in b.ops:
            for r in op.regions:
                self._name_block(r)
            for r in op.results:
                self._name(r)

    def _dim(self, d: Dim) -> Dim:
        c = self.dims.get(d)
        if c is None:
            c = Dim(("p", len(self.dims)), d.label, d.origin)
            self.dims[d] = c
        return c

    def _val_map(self) -> dict:
        return {E.Val(f"tmp.{uid}"): E.Val(n) for uid, n in self.vnames.items()}

    def _conv(self, x: Any) -> Any:
        """Canonicalize dims and value references inside a type or attribute."""
        if isinstance(x, Dim):
            return self._dim(x)
        if isinstance(x, (E.Expr, E.Pred)):
            vals = [leaf for leaf in E.leaves(x) if isinstance(leaf, E.Val)]
            if not vals:
                return x
            m = {}
            for leaf in vals:
                uid = int(leaf.name.split(".")[1]) if leaf.name.startswith("tmp.") else None
                if uid is not None:
                    m[leaf] = E.Val(self._uid_name(uid))
            return E.subst(x, m)
        if isinstance(x, tuple):
            return tuple(self._conv(i) for i in x)
        if isinstance(x, list):
            return tuple(self._conv(i) for i in x)
        if isinstance(x, StateType):
            return StateType(self._uid_name(int(x.memory.split(".")[1]))
                             if x.memory.startswith("tmp.") else x.memory)
        if is_dataclass(x) and not isinstance(x, type):
            changes = {}
            for f in fields(x):
                if not f.init:
                    continue
                old = getattr(x, f.name)
                new = self._conv(old)
                if new is not old:
                    changes[f.name] = new
            return replace(x, **changes) if changes else x
        return x

    def _uid_name(self, uid: int) -> str:
        return self.vnames[BValue.by_uid(uid).resolve().uid]

    def _value(self, v: BValue) -> Value:
        v = v.resolve()
        got = self.values.get(v.uid)
        if got is None:
            got = Value(self.vnames[v.uid], self._conv(v.type))
            self.values[v.uid] = got
        return got

    def _block(self, b: BBlock) -> Block:
        args = tuple(self._value(a) for a in b.args)
        ops = tuple(self._op(o) for o in b.ops)
        return Block(args, ops)

    def _op(self, op: BOp) -> Operation:
        oid = self.oid
        self.oid += 1
        attrs = FrozenDict({k: self._conv(v) for k, v in op.attrs.items()})
        operands = tuple(self._value(o) for o in op.operands)
        regions = tuple(self._block(r) for r in op.regions)
        results = tuple(self._value(r) for r in op.results)
        return Operation(op.name, operands, results, attrs, regions, op.loc, oid)

    def _reducer(self, r: Any) -> Any:
        from ..semantics.reducers import CustomReducer

        assert isinstance(r, CustomReducer)
        self._name_block(r.merge)
        if r.lift is not None:
            self._name_block(r.lift)
        return replace(r, merge=self._block(r.merge),
                       lift=None if r.lift is None else self._block(r.lift))
