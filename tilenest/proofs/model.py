"""The program as proof objects: instance domains, access relations, guards.

An op occurrence is identified by the values of the coordinate variables of
its enclosing regions. For op ``o`` with enclosing regions ``R_1 ... R_k``
(outermost first):

    Inst(o) = { (x_1, ..., x_k) | x_i in domain(R_i) for nest regions,
                                  cond_i holds for if-branches }

``parallel``/``serial``/``pipeline``/``reduce`` contribute their variables and
domain constraint (box and predicate, which may mention outer coordinates);
``if`` contributes its condition when it decodes to an index predicate (a chain
of ``index``/comparison/``and``/``or``/``not`` ops), and otherwise makes the
domain an over-approximation (``exact = False``); ``while`` always does.

An access ``tensor.load``/``tensor.store`` touches, for each instance and each
tile-local coordinate ``u`` in the tile's box with ``valid(u)``, the element
``map(x, u)`` of its tensor when that element is inside the tensor (out-of-range
elements are masked, read as fill, or are errors checked separately by the
bounds obligations: in no case do they touch storage). ``memory.load`` reads and
``memory.store`` writes every element of one Memory allocation, identified by
the allocation op and the coordinates of the regions enclosing it (one object
per owner instance and per enclosing temporal iteration).

Tensor parameters the caller passes as one array (an *alias group*, M-8) are
one storage object: their accesses share the target of the group's first
member, and the members' extents are equal (an assumption of every query).

Copies of these relations for two-instance queries rename every variable not
in a ``shared`` set with a suffix (``x`` becomes ``x'``), so that a query about
two distinct instances of one region ranges over both.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from ..errors import Site
from ..semantics import expr as E
from ..semantics.ir import Block, Operation, TileProgram
from ..semantics.space import IndexSet
from ..semantics.types import MemoryType, TensorType, TileType
from . import formula as Fm

NEST = ("parallel", "serial", "pipeline", "reduce")
ACCESS_OPS = ("tensor.load", "tensor.store", "memory.load", "memory.store")
_CMP_OPS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


@dataclass(frozen=True)
class VarInfo:
    """How a query variable reads in the user's terms."""

    label: str
    note: str = ""


@dataclass
class Instance:
    """The (renamed) variables and constraint of an op's instance domain."""

    vars: list[str]
    constraint: Fm.F
    exact: bool
    why_inexact: list[str]
    info: dict[str, VarInfo]


@dataclass
class Access:
    """One access relation (see the module docstring)."""

    op: Operation
    write: bool
    target: tuple[str, str]  # ("tensor", arg name) or ("memory", alloc result name)
    inst: Instance
    local: list[str]
    local_box: Fm.F
    guard: Fm.F
    elem: tuple[E.Expr, ...]
    valid: Fm.F = Fm.TRUE

    @property
    def vars(self) -> list[str]:
        return self.inst.vars + self.local

    @property
    def domain(self) -> Fm.F:
        """Active instances and coordinates that touch storage."""
        return Fm.conj(self.inst.constraint, self.local_box, self.guard)


def suffixed(name: str, suffix: str, shared: Iterable[str] = ()) -> str:
    return name if (not suffix or name in shared) else name + suffix


def where(op: Operation | None) -> str:
    return str(op.loc) if op is not None and op.loc is not None else "?"


def op_ref(op: Operation) -> str:
    """An op as a user finds it: ``NAME at FILE:LINE:COL`` when the program has
    locations, else the value it defines (``%v = NAME``) or its first operand."""
    if op.loc is not None:
        return f"{op.name} at {op.loc}"
    if op.results:
        return f"%{op.results[0].name} = {op.name}"
    return f"{op.name} %{op.operands[0].name}" if op.operands else op.name


class Model:
    """Per-program tables: enclosing regions, value definitions, nest levels."""

    def __init__(self, p: TileProgram, aliases: Iterable[Iterable[str]] = ()):
        self.p = p
        #: tensor parameter -> the storage object it names (its alias group's first member)
        self.storage: dict[str, str] = {}
        for group in aliases:
            members = list(group)
            for n in members:
                self.storage[n] = members[0]
        self.chain: dict[int, tuple[tuple[Operation, int], ...]] = {}
        self.defs: dict[str, Operation] = {}
        self.loads_of: dict[str, list[Operation]] = {}
        self._walk(p.body, ())

    def _walk(self, b: Block, chain: tuple[tuple[Operation, int], ...]) -> None:
        for op in b.ops:
            self.chain[op.oid] = chain
            for v in op.results:
                self.defs[v.name] = op
            for i, reg in enumerate(op.regions):
                for a in reg.args:
                    self.defs.setdefault(a.name, op)
                self._walk(reg, chain + ((op, i),))

    @cached_property
    def an(self):
        return self.p.analysis

    @cached_property
    def params(self) -> tuple[str, ...]:
        return tuple(self.p.syms)

    @cached_property
    def assumptions(self) -> Fm.F:
        """The program's assumptions, plus ``extent >= 0`` for every symbol used
        as a tensor extent."""
        facts = [Fm.atom(a) for a in self.p.assumptions]
        for t in self.p.tensors:
            assert isinstance(t.type, TensorType)
            for x in t.type.shape:
                if isinstance(x, E.Sym):
                    facts.append(Fm.atom(x.ge(0)))
        shapes = {t.name: t.type.shape for t in self.p.tensors}
        for n, first in self.storage.items():
            if n != first:
                for x, y in zip(shapes[n], shapes[first], strict=True):
                    facts.append(Fm.atom(E.cmp("==", x, y)))
        return Fm.conj(*facts)

    @cached_property
    def all_vars(self) -> set[str]:
        out: set[str] = set()
        for op in self.p.walk():
            out.update(op.attr("vars", ()) or ())
        return out

    def ops(self, name: str) -> list[Operation]:
        return [op for op in self.p.walk() if op.name == name]

    def level_op(self, level: int) -> Operation:
        """The ``parallel`` region of ``level``; a level the program lacks is a
        TransformError (a user's transform or binding named it)."""
        for op in self.p.walk():
            if op.name == "parallel" and op.attrs["level"] == level:
                return op
        from .remap import TransformError

        have = sorted(op.attrs["level"] for op in self.p.walk() if op.name == "parallel")
        raise TransformError(f"the program has no parallel level {level}",
                             hint="its parallel levels: " + (", ".join(map(str, have)) or "none")
                             + " (the 'level = N' attributes in 'tilenest show')")

    def regions_of(self, op: Operation) -> list[Operation]:
        return [r for r, _ in self.chain[op.oid]]

    def subtree(self, region: Operation) -> list[Operation]:
        """Every op nested (at any depth) in ``region``'s regions."""
        out: list[Operation] = []
        for r in region.regions:
            out.extend(r.walk())
        return out

    # -- guards -------------------------------------------------------------
    def decode_bool(self, name: str, depth: int = 0) -> E.Pred | None:
        """The index predicate a bool scalar value computes, if it is one."""
        op = self.defs.get(name)
        if op is None or depth > 64:
            return None
        if op.name == "const" and isinstance(op.attrs["value"], bool):
            return E.TRUE if op.attrs["value"] else E.FALSE
        if op.name in _CMP_OPS:
            a, b = (self.decode_int(o.name, depth + 1) for o in op.operands)
            if a is None or b is None:
                return None
            return E.cmp(_CMP_OPS[op.name], a, b)
        if op.name in ("and", "or"):
            ps = [self.decode_bool(o.name, depth + 1) for o in op.operands]
            if any(q is None for q in ps):
                return None
            return E.pand(*ps) if op.name == "and" else E.por(*ps)  # type: ignore[arg-type]
        if op.name == "not":
            q = self.decode_bool(op.operands[0].name, depth + 1)
            return None if q is None else E.pnot(q)
        return None

    def decode_int(self, name: str, depth: int = 0) -> E.Expr | None:
        op = self.defs.get(name)
        if op is None:
            return None
        if op.name == "index" and not op.attrs["vars"]:
            return op.attrs["value"]
        if op.name == "const" and isinstance(op.attrs["value"], int) \
                and not isinstance(op.attrs["value"], bool):
            return E.Const(op.attrs["value"])
        return None

    # -- instances ----------------------------------------------------------
    def region_info(self, r: Operation, v: str, i: int) -> VarInfo:
        dom: IndexSet = r.attrs["domain"]
        label = dom.space.factors[i].dim.describe() if i < dom.rank else v
        what = f"level {r.attrs['level']}" if r.name == "parallel" else r.name
        return VarInfo(label, f"{r.name} coordinate ({what}) at {where(r)}")

    def instance(self, op: Operation, suffix: str = "", shared: Iterable[str] = (),
                 upto: Operation | None = None) -> Instance:
        """``Inst(op)`` with variables renamed; with ``upto``, only the regions
        strictly enclosing ``upto`` (and ``upto`` itself) are included."""
        shared = set(shared)
        names: dict[str, str] = {}
        vars_: list[str] = []
        cons: list[Fm.F] = []
        exact, why = True, []
        info: dict[str, VarInfo] = {}
        for r, ri in self.chain[op.oid]:
            if r.name in NEST:
                dom: IndexSet = r.attrs["domain"]
                for i, v in enumerate(dom.vars):
                    nv = suffixed(v, suffix, shared)
                    names[v] = nv
                    vars_.append(nv)
                    info[nv] = self.region_info(r, v, i)
                cons.append(Fm.rename(Fm.atom(dom.constraint()), names))
            elif r.name == "if":
                q = self.decode_bool(r.operands[0].name)
                if q is None:
                    exact = False
                    why.append(f"data-dependent if at {where(r)}")
                else:
                    q = q if ri == 0 else E.pnot(q)
                    cons.append(Fm.rename(Fm.atom(q), names))
            elif r.name == "while":
                exact = False
                why.append(f"while loop at {where(r)}")
            if upto is not None and r is upto:
                break
        return Instance(vars_, Fm.conj(*cons), exact, why, info)

    def renaming(self, op: Operation, suffix: str, shared: Iterable[str] = ()) -> dict[str, str]:
        shared = set(shared)
        out = {}
        for r, _ in self.chain[op.oid]:
            for v in r.attr("vars", ()) or ():
                out[v] = suffixed(v, suffix, shared)
        return out

    # -- accesses -----------------------------------------------------------
    def access(self, op: Operation, suffix: str = "", shared: Iterable[str] = ()) -> Access:
        """The access relation of an effect op (renamed copy)."""
        inst = self.instance(op, suffix, shared)
        ren = self.renaming(op, suffix, shared)
        tag = f"{op.oid}{suffix}"
        if op.name in ("tensor.load", "tensor.store"):
            t = op.operands[0]
            assert isinstance(t.type, TensorType)
            tile = op.results[0].type if op.name == "tensor.load" else op.operands[1].type
            assert isinstance(tile, TileType)
            local = [f"u{i}@{tag}" for i in range(len(op.attrs["vars"]))]
            ren.update({v: n for v, n in zip(op.attrs["vars"], local, strict=True)})
            m = {E.Var(a): E.Var(b) for a, b in ren.items()}
            elem = tuple(E.subst(x, m) for x in op.attrs["map"])
            extents = [E.subst(x, m) for x in tile.extents]
            box = Fm.in_box([E.Var(u) for u in local], extents)
            valid = Fm.atom(E.subst(op.attrs["valid"], m))
            guard = Fm.conj(valid, Fm.in_box(elem, t.type.shape))
            for i, u in enumerate(local):
                inst.info[u] = VarInfo(f"u{i}", f"tile coordinate {i} of {op.name} at {where(op)}")
            return Access(op, op.name == "tensor.store",
                          ("tensor", self.storage.get(t.name, t.name)), inst, local, box,
                          guard, elem, valid)
        mem = op.operands[0]
        mt = mem.type
        assert isinstance(mt, MemoryType)
        alloc = self.defs[mem.name]
        owner_vars = [suffixed(v, suffix, shared) for r, _ in self.chain[alloc.oid]
                      for v in (r.attr("vars", ()) or ()) if r.name in NEST]
        local = [f"m{i}@{tag}" for i in range(mt.space.rank)]
        m = {E.Var(a): E.Var(b) for a, b in ren.items()}
        box = Fm.in_box([E.Var(u) for u in local], [E.subst(x, m) for x in mt.space.extents])
        for i, u in enumerate(local):
            inst.info[u] = VarInfo(f"m{i}", f"element coordinate {i} of Memory %{mem.name}")
        elem = tuple(E.Var(v) for v in owner_vars) + tuple(E.Var(u) for u in local)
        return Access(op, op.name == "memory.store", ("memory", mem.name), inst, local, box,
                      Fm.TRUE, elem)

    def accesses_in(self, ops: Iterable[Operation]) -> list[Operation]:
        return [o for o in ops if o.name in ACCESS_OPS]

    def sites(self, *ops: Operation | None) -> tuple[Site, ...]:
        out: list[Site] = []
        for o in ops:
            if o is not None and o.loc is not None and o.loc not in out:
                out.append(o.loc)
        return tuple(out)

    # -- element rendering --------------------------------------------------
    def element_text(self, acc: Access, point: dict[str, int]) -> str:
        env = Fm.env_of(point, self.params)
        try:
            vals = [int(E.evaluate(x, env)) for x in acc.elem]
        except (KeyError, ZeroDivisionError):
            return f"{acc.target[1]}[?]"
        if acc.target[0] == "tensor":
            return f"%{acc.target[1]}[{', '.join(map(str, vals))}]"
        k = len(acc.local)
        owner = vals[:len(vals) - k]
        return (f"Memory %{acc.target[1]}[{', '.join(map(str, vals[len(vals) - k:]))}]"
                + (f" of owner instance {tuple(owner)}" if owner else ""))
