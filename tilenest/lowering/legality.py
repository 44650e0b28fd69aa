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
  ``parallel`` the schedule runs on cores to the ``core`` scope of the CPU
  catalogue (``binding.*``, T-6), and for every tree-policy ``reduce`` the
  lowering may regroup (schedule entry ``auto``) the permission of its policy
  (``reduction.permission``) and the exact laws of its built-in merge
  (``reduction.law.*``; float ``add``/``mul`` regrouping rests on the policy's
  permission and is not a required law). Schedule transforms are checked
  where they are applied (:func:`~tilenest.lowering.schedule.apply_transforms`).

Outcome: a refuted race obligation raises :class:`~tilenest.errors.RaceError`
(the interpreter's error class for a race) naming the conflicting sites, with
the counterexample and a hint; a refuted schedule obligation raises a
:class:`~tilenest.errors.TilenestError` naming the decision; ``unknown``
obligations (e.g. data-dependent indices) are not refused, and are returned so
that the compiled kernel can report them. Coverage is not part of the gate
(partial writes are legal). Verdicts are cached by the program text and the
schedule's decisions.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

from ..errors import RaceError, TilenestError
from ..semantics.ir import TileProgram

#: per-query budget of the gate (seconds); an exhausted budget gives ``unknown``
TIMEOUT = 2.0

_CACHE: dict[str, list[Any]] = {}
_LOCK = threading.Lock()


def _keys(program: TileProgram, schedule: Any) -> tuple[str, str]:
    """Cache keys: the program's race obligations depend on its text only; the
    schedule's on its binding and reduction decisions too."""
    text = f"{program}\naliases {schedule.aliases}"
    race = hashlib.sha256(text.encode()).hexdigest()
    sched = f"{race}\n{sorted(schedule.bind)}\n{sorted(schedule.reductions)}\n{schedule.target}"
    return "race:" + race, "schedule:" + hashlib.sha256(sched.encode()).hexdigest()


def schedule_obligations(program: TileProgram, schedule: Any) -> list[Any]:
    """The obligations of ``schedule``'s binding and reduction decisions."""
    from ..proofs import bindings as BD
    from ..proofs import reductions as RD
    from ..proofs.model import Model
    from ..proofs.obligation import PROVED, Obligation
    from ..semantics.reducers import BUILTINS

    m = Model(program)
    out: list[Any] = []
    cores = {op.attrs["level"]: "core" for op in program.walk() if op.name == "parallel"
             and schedule.binding(op.oid, op.attrs["level"]) == "cores"}
    if cores:
        out += BD.binding_obligations(m, BD.CPU, cores)
    for op in program.walk():
        if op.name != "reduce":
            continue
        pol = op.attrs["policy"]
        if not pol.is_tree or schedule.reduction(op.oid) != "auto":
            continue
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
    return out


def legality(program: TileProgram, schedule: Any) -> list[Any]:
    """State and discharge the gate's obligations (see the module docstring);
    raise on a refuted one; return them all (with their verdicts)."""
    kr, ks = _keys(program, schedule)
    with _LOCK:
        races, sched = _CACHE.get(kr), _CACHE.get(ks)
    if races is None:
        races = _discharged(lambda: _race_obligations(program, schedule.aliases))
        with _LOCK:
            _CACHE[kr] = races
    if sched is None:
        sched = _discharged(lambda: schedule_obligations(program, schedule))
        with _LOCK:
            _CACHE[ks] = sched
    obs = races + sched
    _refuse(obs)
    return obs


def _race_obligations(program: TileProgram, aliases: tuple = ()) -> list[Any]:
    """The race obligations, with each alias group of the call one tensor (M-8)."""
    from ..proofs.model import Model
    from ..proofs.races import race_obligations

    return race_obligations(Model(program, aliases))


def _discharged(state: Any) -> list[Any]:
    from ..proofs.obligation import discharge

    try:
        obs = state()
        discharge(obs, timeout=TIMEOUT)
    except TilenestError:
        raise
    except Exception as e:  # noqa: BLE001 - a checker failure must not block compiling
        obs = [_failed(e)]
    return obs


def _failed(e: Exception) -> Any:
    """An ``unknown`` stand-in when stating or deciding the obligations failed."""
    from ..proofs.obligation import UNKNOWN, Obligation

    ob = Obligation("legality", "the program's race and schedule obligations")
    ob.set(UNKNOWN, "-", f"the checker could not state or decide them ({type(e).__name__}: "
           f"{e})")
    return ob


def _refuse(obs: list[Any]) -> None:
    from ..proofs.obligation import REFUTED
    from ..proofs.races import RACE_KINDS

    bad = [o for o in obs if o.role == "required" and o.status == REFUTED]
    if not bad:
        return
    races = [o for o in bad if o.kind in RACE_KINDS]
    ob = races[0] if races else bad[0]
    notes = tuple(ob.counterexample_lines() or ([ob.reason] if ob.reason else []))
    if races:
        raise RaceError(
            f"{ob.title} -- refuted statically ({ob.kind}); a compiled kernel cannot observe "
            "races while it runs, so it refuses the program", ob.sites,
            _HINTS.get(ob.kind, "") + "; `tilenest check FILE` lists every obligation", notes)
    raise TilenestError(
        f"the schedule is illegal: {ob.kind}: {ob.title}", ob.sites,
        "choose another binding or reduction realization in the Schedule; "
        "`tilenest check FILE` lists the program's obligations", notes)


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
