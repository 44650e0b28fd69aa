"""Layout obligations of ``Memory`` objects (M-12, O-5) and how they are decided.

For every ``memory.alloc`` with layout ``L`` (offset over the element
coordinates ``u``, capacity ``size``) and space ``S = prod [0, e_i)``, made
once per instance ``x`` of the regions enclosing it (``Inst(alloc)``, see
:mod:`tilenest.proofs.model`; the extents, offset and size may depend on
``x``, e.g. a Memory of extent ``p + 1`` in instance ``p``)::

    layout.range      forall params, x in Inst(alloc), u in S(x):
                          0 <= L(x, u) < size(x)
    layout.injective  forall params, x in Inst(alloc), u, v in S(x):
                          L(x, u) = L(x, v)  =>  u = v

The owner coordinates ``x`` are bound variables of the claim, shared by
``u`` and ``v`` (two elements of one allocation). When ``Inst(alloc)`` is an
over-approximation (the alloc sits under a data-dependent ``if`` or a
``while``), a conflict found there is not a refutation (``refutable =
False``). Each obligation is a claim over the kernel's parameters (the
general engines can decide it), with a decider that tries the exact special
procedures first, in this order:

1. **empty space** -- an extent that is the constant 0: no element, no
   address event; both facts hold (``structural``).
2. **GF(2)** -- constant extents and an offset that is bit-linear
   (:mod:`tilenest.proofs.gf2`: XOR/shift/mask swizzles, dense and padded
   power-of-two strides): injectivity is full column rank, decided for any
   number of points; a kernel vector gives the colliding pair. Range is proved
   when the largest image is below ``size`` and refuted when that maximum is
   attained (``gf2``; exact on ragged spaces too).
3. **enumeration** -- constant extents, no parameter in the offset or size,
   and at most :data:`ENUMERATION_BUDGET` points: every offset is computed
   (``enumeration``).
4. for a claim with parameters outside the quasi-affine fragment, a bounded
   **search** for a counterexample: small values of the parameters the
   layout mentions, every element enumerated, reported only with parameter
   values that satisfy the program's assumptions. A point found is a sound
   refutation (re-checked against the claim's own formula); finding none
   decides nothing;
5. the claim, through isl (quasi-affine) or Z3 (otherwise).

Every refutation carries the parameters and the two elements (or the one
out-of-range element) and is re-evaluated from the layout expression before
it is reported. Consumers: ``tilenest check`` (all program obligations) and the
compile-time legality gate, which refuses a refuted layout and, unless the
user assumed it, an unknown one.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from ..semantics import expr as E
from ..semantics.layout_facts import first_collision, first_outside
from ..semantics.maps import MemLayout
from ..semantics.types import MemoryType
from . import formula as Fm
from . import gf2
from .model import Instance, Model, VarInfo
from .obligation import PROVED, REFUTED, UNKNOWN, Obligation, decide_claim

#: largest space enumerated when no structural procedure applies
ENUMERATION_BUDGET = 1 << 20
#: parameter values tried by the bounded counterexample search, and its limits
SEARCH_VALUES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 0)
SEARCH_COMBINATIONS = 512
SEARCH_POINTS = 1 << 16
SEARCH_TRIES = 4096
SEARCH_BUDGET = 1 << 20  # elements evaluated in all, over every parameter choice

INJECTIVE, RANGE = "layout.injective", "layout.range"


def layout_obligations(m: Model) -> list[Obligation]:
    """``layout.range`` and ``layout.injective`` for every Memory of the program."""
    out: list[Obligation] = []
    for op in m.ops("memory.alloc"):
        mt = op.results[0].type
        assert isinstance(mt, MemoryType)
        name = f"%{op.results[0].name}"
        out.extend(obligations_of(mt, name, m.sites(op), m.assumptions, m.instance(op)))
    return out


def obligations_of(mt: MemoryType, name: str, sites: tuple = (),
                   assumptions: Fm.F = Fm.TRUE, owner: Instance | None = None
                   ) -> list[Obligation]:
    """The two layout obligations of one Memory type (see the module docstring);
    ``owner`` is the instance domain of its ``memory.alloc`` (none: a type whose
    extents, offset and size mention no region coordinate)."""
    lay = mt.layout
    ext = mt.space.extents
    x = list(owner.vars) if owner is not None else []
    u = list(lay.vars)
    v = [y + "'" for y in u]
    dom = owner.constraint if owner is not None else Fm.TRUE
    box_u = Fm.in_box([E.Var(y) for y in u], ext)
    box_v = Fm.in_box([E.Var(y) for y in v], ext)
    off_v = E.rename(lay.offset, dict(zip(u, v, strict=True)))
    info = dict(owner.info) if owner is not None else {}
    info.update({y: VarInfo(f"m{i}") for i, y in enumerate(u)})
    info.update({y: VarInfo(f"m{i}'") for i, y in enumerate(v)})
    rng = Fm.conj(Fm.atom(lay.offset.ge(0)), Fm.atom(lay.offset.lt(lay.size)))
    witness = {"memory": name, "type": mt}
    inexact = "; ".join(owner.why_inexact) if owner is not None else ""

    def point(pt: dict, names: list[str]) -> tuple:
        return tuple(pt.get(y) for y in names)

    def of_owner(pt: dict) -> str:
        if not x:
            return ""
        return " (owner instance " + ", ".join(
            f"{info[y].label if y in info else y} = {pt.get(y)}" for y in x) + ")"

    def explain_range(pt: dict) -> list[str]:
        return [f"element {point(pt, u)} of Memory {name}{of_owner(pt)} maps to offset "
                f"{_offset(lay, pt, u)}, outside [0, {_value(lay.size, pt)})"]

    def explain_inj(pt: dict) -> list[str]:
        return [f"elements {point(pt, u)} and {point(pt, v)} of Memory {name}{of_owner(pt)} "
                f"share offset {_offset(lay, pt, u)}"]

    rng_ob = Obligation(
        RANGE, f"Memory {name}: offsets lie in [0, size)", sites,
        Fm.Claim(tuple(x + u), Fm.conj(dom, box_u), rng, assumptions), info=info,
        explain=explain_range, witness=witness, refutable=not inexact, inexact_note=inexact)
    inj_ob = Obligation(
        INJECTIVE, f"Memory {name}: distinct elements get distinct offsets", sites,
        Fm.Claim(tuple(x + u + v), Fm.conj(dom, box_u, box_v, Fm.atom(lay.offset.eq(off_v))),
                 Fm.eqs([E.Var(y) for y in u], [E.Var(y) for y in v]), assumptions),
        info=info, explain=explain_inj, witness=witness, refutable=not inexact,
        inexact_note=inexact)
    rng_ob.decider = lambda o, t: decide_layout(o, t, mt, RANGE)
    inj_ob.decider = lambda o, t: decide_layout(o, t, mt, INJECTIVE)
    return [rng_ob, inj_ob]


def _env(pt: dict) -> dict:
    env: dict = {}
    for k, x in pt.items():
        if isinstance(x, (int, np.integer)):
            env[E.Var(k)] = int(x)
            env[E.Sym(k)] = int(x)
    return env


def _value(e: E.Expr, pt: dict) -> Any:
    try:
        return int(E.evaluate(e, _env(pt)))
    except KeyError:
        return E.to_str(e)


def _offset(lay: MemLayout, pt: dict, names: list[str]) -> Any:
    env = _env(pt)
    env.update({E.Var(x): int(pt[n]) for x, n in zip(lay.vars, names, strict=True)
                if n in pt})
    try:
        return int(E.evaluate(lay.offset, env))
    except KeyError:
        return "?"


# ---------------------------------------------------------------------------
# the decider


def decide_layout(ob: Obligation, timeout: float, mt: MemoryType, kind: str) -> None:
    """Give ``ob`` (a ``layout.range`` or ``layout.injective`` obligation of
    ``mt``) its verdict by the procedures of the module docstring."""
    lay = mt.layout
    ext = mt.space.extents
    if any(isinstance(x, E.Const) and x.value <= 0 for x in ext):
        ob.set(PROVED, "structural", "the space is empty: no element has an address")
        return
    const = all(isinstance(x, E.Const) for x in ext)
    if const:
        extents = [x.value for x in ext]  # type: ignore[attr-defined]
        if _gf2(ob, lay, extents, kind):
            return
        closed = not any(isinstance(lf, (E.Sym, E.Val))
                         or (isinstance(lf, E.Var) and lf.name not in lay.vars)
                         for lf in E.leaves(lay.offset) | E.leaves(lay.size))
        if closed and math.prod(extents) <= ENUMERATION_BUDGET:
            try:
                _enumerate(ob, lay, extents, {}, kind, "enumeration", refute_only=False)
                return
            except (ZeroDivisionError, OverflowError, ValueError):
                pass  # e.g. a modulo by zero somewhere: leave it to the engines
    claim = ob.claim
    assert claim is not None
    # outside the affine fragment Z3 often times out; a small counterexample is cheaper
    searched = bool(claim.params) and not Fm.is_affine(claim.counterexample_set())
    if searched and _search(ob, mt, kind):
        return
    decide_claim(ob, timeout)
    if ob.status == UNKNOWN and searched:
        ob.set(UNKNOWN, ob.engine, ob.reason + "; no counterexample among small parameter "
               "values")


def _gf2(ob: Obligation, lay: MemLayout, extents: list[int], kind: str) -> bool:
    """Decide by the GF(2) procedure when the offset is bit-linear; True when
    decided."""
    bm = gf2.bit_linear(lay.offset, lay.vars, extents)
    if bm is None:
        return False
    u = list(lay.vars)
    if kind == INJECTIVE:
        pair = bm.collision(extents)
        if pair is None:
            ob.set(PROVED, "gf2", f"full column rank {bm.rank()} of the bit matrix")
            return True
        x, y = pair
        if gf2.evaluate(lay.offset, u, x) != gf2.evaluate(lay.offset, u, y):
            return False  # the matrix disagrees with the expression: decide otherwise
        cx = {**dict(zip(u, x, strict=True)), **{k + "'": b for k, b in zip(u, y, strict=True)}}
        _refute(ob, cx, "gf2", f"rank {bm.rank()} < {bm.n_inputs} input bits")
        return True
    if not isinstance(lay.size, E.Const):
        return False
    mx, arg = bm.maximum(extents)
    if gf2.evaluate(lay.offset, u, arg) != mx:
        return False  # the matrix disagrees with the expression: decide otherwise
    if mx < lay.size.value:
        ob.set(PROVED, "gf2", f"largest offset {mx} < size {lay.size.value}")
    else:
        _refute(ob, dict(zip(u, arg, strict=True)), "gf2",
                f"offset {mx} >= size {lay.size.value}")
    return True


def _refute(ob: Obligation, cx: dict, engine: str, reason: str = "") -> None:
    """Report ``cx`` after re-evaluating the claim's counterexample set there.
    Parameters and owner coordinates the point does not fix are given the
    first small values under which the counterexample set holds (a layout fact
    that fails at constant extents fails in every instance of every call, but
    the point must be a complete one, in an instance that exists)."""
    claim = ob.claim
    assert claim is not None
    free = [k for k in (*claim.params, *claim.vars) if k not in cx]
    for fill in _assignments(claim, free, cx):
        full = {**fill, **cx}
        try:
            holds = Fm.evaluate(claim.counterexample_set(), Fm.env_of(full, claim.params))
        except (KeyError, ZeroDivisionError, Fm.Undecided):
            holds = False
        if holds:
            ob.checked = True
            if not ob.refutable:
                ob.set(UNKNOWN, engine, "a collision exists in an over-approximation of the "
                       f"Memory's instances ({ob.inexact_note}); not a proof that the program "
                       "has one", full)
                return
            ob.set(REFUTED, engine, reason, full)
            return
    ob.set(UNKNOWN, engine, "a counterexample was found but failed the concrete re-check "
           "(or no parameter values satisfy the assumptions)")


def _assignments(claim: Fm.Claim, names: list[str], fixed: dict) -> Any:
    """Small values for ``names`` (with ``fixed`` as given) under which the
    claim's assumptions hold, at most :data:`SEARCH_TRIES` candidates tried."""
    if not names:
        yield {}
        return
    for k, vals in enumerate(itertools.product(SEARCH_VALUES, repeat=len(names))):
        if k >= SEARCH_TRIES:
            return
        pt = dict(zip(names, vals, strict=True))
        env = Fm.env_of({**fixed, **pt}, claim.params)
        try:
            if Fm.evaluate(claim.assume, env):
                yield pt
        except (KeyError, ZeroDivisionError, Fm.Undecided):
            continue


def _grid(extents: list[int]) -> list[np.ndarray]:
    return [g.reshape(-1) for g in np.meshgrid(*[np.arange(n, dtype=np.int64)
                                                 for n in extents], indexing="ij")]


def _enumerate(ob: Obligation, lay: MemLayout, extents: list[int], params: dict, kind: str,
               engine: str, refute_only: bool) -> bool:
    """Evaluate every offset at these parameter values; True when refuted (or,
    unless ``refute_only``, when proved)."""
    env: dict = {E.Sym(k): x for k, x in params.items()}
    grid = _grid(extents)
    env.update({E.Var(x): g for x, g in zip(lay.vars, grid, strict=True)})
    n = math.prod(extents)
    off = np.broadcast_to(np.asarray(E.evaluate(lay.offset, env), dtype=np.int64),
                          (n,)).reshape(tuple(extents))
    u = list(lay.vars)
    if kind == RANGE:
        size = int(E.evaluate(lay.size, env))
        bad = first_outside(off, size)
        if bad is not None:
            _refute(ob, {**params, **dict(zip(u, bad, strict=True))}, engine)
            return ob.status == REFUTED
        if not refute_only:
            ob.set(PROVED, engine, f"all {n} offsets lie in [0, {size})")
        return not refute_only
    pair = first_collision(off)
    if pair is not None:
        a, b = pair
        _refute(ob, {**params, **dict(zip(u, a, strict=True)),
                     **{k + "'": x for k, x in zip(u, b, strict=True)}}, engine)
        return ob.status == REFUTED
    if not refute_only:
        ob.set(PROVED, engine, f"all {n} offsets are distinct")
    return not refute_only


def _search(ob: Obligation, mt: MemoryType, kind: str) -> bool:
    """The bounded counterexample search (step 5 of the module docstring):
    the parameters the layout mentions range over :data:`SEARCH_VALUES`; a
    collision found is reported only with values of the other parameters that
    satisfy the assumptions (:func:`_refute`)."""
    claim = ob.claim
    assert claim is not None
    lay = mt.layout
    leaves = E.leaves(lay.offset) | E.leaves(lay.size)
    for x in mt.space.extents:
        leaves |= E.leaves(x)
    mine = sorted(lf.name for lf in leaves if isinstance(lf, E.Sym) and lf.name in claim.params)
    tried, budget = 0, SEARCH_BUDGET
    for vals in itertools.product(SEARCH_VALUES, repeat=len(mine)):
        if tried >= SEARCH_COMBINATIONS:
            break
        pt = dict(zip(mine, vals, strict=True))
        env = {E.Sym(k): x for k, x in pt.items()}
        try:
            extents = [int(E.evaluate(x, env)) for x in mt.space.extents]
        except (KeyError, ZeroDivisionError):
            continue
        n = math.prod(extents)
        if any(x <= 0 for x in extents) or n > SEARCH_POINTS:
            continue
        tried += 1
        budget -= n
        if budget < 0:
            break
        try:
            if _enumerate(ob, lay, extents, pt, kind, "search", refute_only=True):
                return True
        except (KeyError, ZeroDivisionError, OverflowError, ValueError):
            continue
    return False
