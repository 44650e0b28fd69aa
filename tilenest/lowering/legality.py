"""The compile-time legality gate: what a compiled target proves before it runs
a program.

Compiled code cannot observe a race while it runs, so a compiled target
reproduces a race verdict by refusing the program statically. Before a
program is lowered, :func:`legality` states and discharges

* the program's **race obligations** (``tilenest.proofs.races``):
  ``noninterference`` (E-10: no two unordered actors of a ``parallel`` touch
  one storage element with a write), ``noninterference.join`` (E-11: per-child
  updates of an ancestor Tile value have disjoint footprints) and
  ``noninterference.pipeline`` (P-7: pipeline iterations that may be in flight
  together and that no carried value orders never conflict);
* the obligations of the schedule's own decisions: the binding of each
  ``parallel`` the schedule runs on cores to the ``core`` scope of the
  target's binding catalogue (its registry row's, ``tilenest.targets``;
  ``binding.*``, T-6) -- on a SIMT target (``profile.simt``: ``cuda``), of
  each top-level ``parallel`` to the ``block`` scope -- and for every
  tree-policy ``reduce`` the
  lowering may regroup (schedule entry ``auto``) the permission of its policy
  (``reduction.permission``) and the exact laws of its built-in merge
  (``reduction.law.*``; float ``add``/``mul`` regrouping rests on the policy's
  permission and is not a required law), and the laws of every custom
  reducer such a ``reduce`` uses (over the reals for float states, on the
  states the reduction can form; :mod:`tilenest.proofs.real_laws`), each
  once per reducer. Schedule transforms are checked
  where they are applied (:func:`~tilenest.lowering.schedule.apply_transforms`);
* the **layout obligations** of every ``Memory`` (M-12: ``layout.range``,
  ``0 <= L(u) < size``, and ``layout.injective``, ``L(u) = L(v) => u = v``,
  for all sizes; :mod:`tilenest.proofs.layouts`). Generated code stores and
  loads a Memory through its offsets without any check, so an aliasing layout
  would silently lose elements and an out-of-range one would write outside
  the allocation.

Outcome: a refuted race obligation raises :class:`~tilenest.errors.RaceError`
(the interpreter's error class for a race) naming the conflicting sites, with
the counterexample and a hint; a refuted schedule obligation raises a
:class:`~tilenest.errors.TilenestError` naming the decision; a refuted layout
obligation raises a :class:`~tilenest.errors.VerifyError` (M-12's class) with
the colliding elements or the out-of-range one. An ``unknown`` layout
obligation is refused too (a ``TilenestError``), unless ``schedule.assume``
selects it, as for schedule transforms: it is then reported as ``assumed``,
never as proved. A refuted reducer law is a
:class:`~tilenest.errors.ContractError` at the ``reduce`` and the reducer's
merge, with the counterexample; an ``unknown`` one is refused the same way
unless ``schedule.assume`` selects it. Other ``unknown`` obligations (e.g. data-dependent indices,
which the parallel contract covers) are not refused, and are returned so that
the compiled kernel can report them. An exception of the checker itself while
stating or deciding an obligation is an
:class:`~tilenest.errors.InternalError` (a bug of tilenest, reported as such),
never an ``unknown`` verdict. Coverage is not part of the gate
(partial writes are legal). Verdicts are cached by the program text and the
schedule's decisions.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from typing import Any

from ..errors import ContractError, RaceError, TilenestError, VerifyError
from ..semantics.ir import TileProgram
from ..semantics.policies import ReductionPolicy

#: per-query budget of the gate (seconds); an exhausted budget gives ``unknown``
TIMEOUT = 2.0

#: verdicts kept in memory (least recently used first out); each key is a
#: program's races, a schedule's decisions or a program's layouts
CACHE_ENTRIES = 512
_CACHE: OrderedDict[str, list[Any]] = OrderedDict()
_LOCK = threading.Lock()


def _get(key: str) -> list[Any] | None:
    with _LOCK:
        got = _CACHE.get(key)
        if got is not None:
            _CACHE.move_to_end(key)
        return got


def _put(key: str, obs: list[Any]) -> None:
    with _LOCK:
        _CACHE[key] = obs
        _CACHE.move_to_end(key)
        while len(_CACHE) > CACHE_ENTRIES:
            _CACHE.popitem(last=False)


def _keys(program: TileProgram, schedule: Any) -> tuple[str, str, str]:
    """Cache keys: the program's race obligations depend on its text only; the
    schedule's on its binding and reduction decisions too; the layouts' on the
    text and the user's ``assume`` selectors."""
    text = f"{program}\naliases {schedule.aliases}"
    race = hashlib.sha256(text.encode()).hexdigest()
    sched = (f"{race}\n{sorted(schedule.bind)}\n{sorted(schedule.reductions)}\n{schedule.target}"
             f"\nassume {sorted(schedule.assume)}")
    lay = f"{race}\nassume {sorted(schedule.assume)}"
    return ("race:" + race, "schedule:" + hashlib.sha256(sched.encode()).hexdigest(),
            "layout:" + hashlib.sha256(lay.encode()).hexdigest())


def schedule_obligations(program: TileProgram, schedule: Any) -> list[Any]:
    """The obligations of ``schedule``'s binding and reduction decisions."""
    from ..proofs import bindings as BD
    from ..proofs import reductions as RD
    from ..proofs.model import Model
    from ..proofs.obligation import PROVED, Obligation
    from ..semantics.reducers import BUILTINS

    from .schedule import target_row

    m = Model(program)
    out: list[Any] = []
    row = target_row(schedule.target)
    if row.profile.simt:
        # each instance of a top-level parallel is one block of the grid
        blocks = {op.attrs["level"]: "block" for op in program.walk()
                  if op.name == "parallel" and op.attrs["level"] == 1}
        if blocks:
            out += BD.binding_obligations(m, row.catalogue, blocks)
    else:
        cores = {op.attrs["level"]: "core" for op in program.walk() if op.name == "parallel"
                 and schedule.binding(op.oid, op.attrs["level"]) == "cores"}
        if cores:
            out += BD.binding_obligations(m, row.catalogue, cores)
    customs: dict[str, tuple[list, list[bool]]] = {}
    for op in program.walk():
        if op.name != "reduce":
            continue
        pol = op.attrs["policy"]
        if not pol.is_tree or schedule.reduction(op.oid) != "auto":
            continue
        for c in op.attrs["contracts"]:
            if c is not None and c.startswith("@"):
                uses, comms = customs.setdefault(c, ([], []))
                if op not in uses:
                    uses.append(op)
                    comms.append(pol is ReductionPolicy.unordered_tree)
        sites = (op.loc,) if op.loc is not None else ()
        perm = Obligation("reduction.permission", f"policy {pol.value} permits the "
                          "regrouping the lowering applies to this reduce", sites,
                          formula_text=f"{pol.value} is a tree policy")
        perm.decider = lambda o, t: o.set(PROVED, "policy")
        out.append(perm)
        for c, v in zip(op.attrs["contracts"], op.operands, strict=False):
            if c not in BUILTINS or not hasattr(v.type, "dtype"):
                continue
            b = BUILTINS[c]
            dt = v.type.dtype
            if not b.exact_for(dt):
                continue  # float add/mul: the policy's permission, not a law
            out += [o for o in RD.law_obligations(
                RD.builtin_merge(b), (b.identity(dt),), dt, 1, c, sites,
                need_comm=True, cache=True)
                if o.role == "required"]
    reducers = {f"@{r.name}": r for r in program.reducers}
    for c, (uses, comms) in customs.items():
        r = reducers.get(c)
        if r is None:
            continue
        sites = tuple(op.loc for op in uses if op.loc is not None)
        merge_site = next((o.loc for o in r.merge.ops if o.loc is not None), None)
        if merge_site is not None and merge_site not in sites:
            sites += (merge_site,)
        out += RD.custom_law_obligations(program, r, uses, any(comms), sites, ieee=False)
    return out


def legality(program: TileProgram, schedule: Any) -> list[Any]:
    """State and discharge the gate's obligations (see the module docstring);
    raise on a refuted one, or on an unknown layout obligation the user did
    not assume; return them all (with their verdicts)."""
    kr, ks, kl = _keys(program, schedule)
    races, sched, lays = _get(kr), _get(ks), _get(kl)
    if races is None:
        races = _discharged(lambda: _race_obligations(program, schedule.aliases))
        _put(kr, races)
    if sched is None:
        sched = _discharged(lambda: schedule_obligations(program, schedule),
                            tuple(schedule.assume))
        _put(ks, sched)
    if lays is None:
        lays = _discharged(lambda: layout_obligations(program), tuple(schedule.assume))
        _put(kl, lays)
    obs = races + sched + lays
    _refuse(obs)
    _refuse_unproved_layouts(lays)
    _refuse_unproved_laws(sched)
    return obs


def layout_obligations(program: TileProgram) -> list[Any]:
    """``layout.range`` and ``layout.injective`` of every Memory of ``program``."""
    from ..proofs.layouts import layout_obligations as state
    from ..proofs.model import Model

    return state(Model(program))


def _race_obligations(program: TileProgram, aliases: tuple = ()) -> list[Any]:
    """The race obligations, with each alias group of the call one tensor (M-8)."""
    from ..proofs.model import Model
    from ..proofs.races import race_obligations

    return race_obligations(Model(program, aliases))


def _discharged(state: Any, assume: tuple[str, ...] = ()) -> list[Any]:
    """State the obligations (``state()``) and decide them. A user's mistake
    found on the way (a ``TilenestError``) propagates; any other exception is
    a bug of the checker and raises an ``InternalError`` (never an ``unknown``
    verdict, which would let the compile go on unchecked or refuse a correct
    program for a reason that is not its own)."""
    from ..proofs.obligation import checker_bug, discharge

    try:
        obs = state()
    except TilenestError:
        raise
    except Exception as e:  # re-raised as a located internal error
        raise checker_bug(e, "stating the program's obligations") from e
    discharge(obs, timeout=TIMEOUT, assume=assume)
    return obs


def _refuse(obs: list[Any]) -> None:
    from ..proofs.obligation import REFUTED
    from ..proofs.races import RACE_KINDS

    bad = [o for o in obs if o.role == "required" and o.status == REFUTED]
    if not bad:
        return
    races = [o for o in bad if o.kind in RACE_KINDS]
    ob = races[0] if races else bad[0]
    notes = tuple(ob.counterexample_lines() or ([ob.reason] if ob.reason else []))
    if not races and ob.kind.startswith("reduction.law."):
        raise ContractError(
            f"{ob.title} -- refuted ({ob.kind}); the reduce's tree policy regroups "
            "contributions, so compiled code would not compute what the reduction means",
            ob.sites, _LAW_HINT + "; `tilenest check FILE` lists the laws", notes)
    if not races and ob.kind.startswith("layout."):
        raise VerifyError(
            f"{ob.title} -- refuted ({ob.kind}); compiled code would "
            + ("let distinct elements overwrite each other" if ob.kind == "layout.injective"
               else "access storage outside the allocation"), ob.sites,
            "whole-tile Memory storage needs a one-to-one layout within its size (M-12); "
            "fix the strides, swizzle or size", notes)
    if races:
        raise RaceError(
            f"{ob.title} -- refuted statically ({ob.kind}); a compiled kernel cannot observe "
            "races while it runs, so it refuses the program", ob.sites,
            _HINTS.get(ob.kind, "") + "; `tilenest check FILE` lists every obligation", notes)
    raise TilenestError(
        f"the schedule is illegal: {ob.kind}: {ob.title}", ob.sites,
        "choose another binding or reduction realization in the Schedule; "
        "`tilenest check FILE` lists the program's obligations", notes)


def _refuse_unproved(rest: list[Any], why: str, error: type, hint: str) -> None:
    """Stop the compile at the first of ``rest`` (required obligations neither
    proved nor assumed): ``why`` says what compiled code would then get wrong;
    the hint ends with the ``assume=`` selector that accepts it as an axiom."""
    if not rest:
        return
    ob = rest[0]
    site = str(ob.sites[0]) if ob.sites else ""
    sel = f"{ob.kind}@{site}" if site else ob.kind
    raise error(
        f"{ob.title} -- not proved ({ob.kind}: {ob.status}"
        + (f", {ob.reason}" if ob.reason else "") + f"); {why}", ob.sites,
        hint.format(assume=f"compile(..., assume=({sel!r},))"))


def _refuse_unproved_laws(obs: list[Any]) -> None:
    """A reducer law a tree policy relies on that is neither proved nor assumed
    stops the compile (compiled trees regroup without checking)."""
    from ..proofs.obligation import ASSUMED, PROVED

    _refuse_unproved(
        [o for o in obs if o.role == "required" and o.kind.startswith("reduction.law.")
         and o.status not in (PROVED, ASSUMED)],
        "a tree policy regroups contributions, so the compile is refused", ContractError,
        _LAW_HINT + "; if the law holds, take it as an axiom: {assume}")


_LAW_HINT = ("a tree policy needs an associative merge with a two-sided identity (and a "
             "commutative one under unordered_tree); use policy=tn.fold_left to keep the "
             "source order, or correct the reducer's merge")


def _refuse_unproved_layouts(obs: list[Any]) -> None:
    """A layout obligation that is neither proved nor assumed stops the compile."""
    from ..proofs.obligation import ASSUMED, PROVED

    _refuse_unproved(
        [o for o in obs if o.role == "required" and o.status not in (PROVED, ASSUMED)],
        "compiled code does not check Memory offsets, so the compile is refused",
        TilenestError,
        "if the layout is one-to-one within its size for every call, take it as an axiom: "
        "{assume}; `tilenest check FILE` shows the obligation")


_HINTS = {
    "noninterference": "give each instance of the parallel its own elements, or end the "
                       "parallel region before the conflicting access (E-10)",
    "noninterference.join": "make the per-child patches disjoint, or accumulate "
                            "overlapping contributions in a reduce region (E-11)",
    "noninterference.pipeline": "pass the value between iterations as a carried value or "
                                "through a Memory object, or use window=1 (P-7)",
}


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()


def summary(obs: list[Any]) -> str:
    """One line per obligation that is not proved (for ``tilenest lower``/
    ``validate``), or a count when all are proved."""
    from ..proofs.obligation import PROVED

    rest = [o for o in obs if o.status != PROVED and o.role == "required"]
    head = (f"legality: {len(obs)} obligation(s), {len(obs) - len(rest)} proved, "
            f"{len(rest)} not proved")
    lines = [head]
    for o in rest:
        site = f" at {o.sites[0]}" if o.sites else ""
        lines.append(f"  {o.status}: {o.kind}{site}: {o.title}"
                     + (f" ({o.reason})" if o.reason else ""))
    return "\n".join(lines)
