"""Obligations as data, and their discharge.

An :class:`Obligation` records *what* must hold -- its ``kind``, a one-line
``title``, the formula (a :class:`~tilenest.proofs.formula.Claim`, or for
finite/structural facts a ``decider``), the ``sites`` it concerns -- and, once
discharged, the **verdict**:

* ``proved``  -- the claim holds for every binding of the parameters that
  satisfies the program's assumptions;
* ``refuted`` -- a concrete counterexample (parameter values and coordinates)
  is attached; it has been re-evaluated against the claim's own formula
  outside the solver before being reported;
* ``unknown`` -- with the reason (budget exhausted, non-affine term the engine
  cannot decide, data-dependent index, over-approximated control flow);
* ``assumed`` -- the user took it as an axiom (``assume``); it is reported as
  such, never as proved.

Soundness bookkeeping: a claim built from an *over-approximation* of the
program (an ``if`` whose condition is data, a ``while``) can only be proved
when the approximation sits in the hypothesis (``refutable = False``), or only
refuted when it sits in the conclusion (``provable = False``); the discharge
downgrades the other outcome to ``unknown``. Counterexamples that need values
of data (``Val`` leaves) are likewise ``unknown``: no input is known to produce
them. ``role = "evidence"`` marks obligations reported for information (a
floating-point law that a reduction policy's permission makes unnecessary);
they never decide the check's outcome.

Engines: ``isl`` for the quasi-affine fragment (exact), ``z3`` beyond it (or for
scalar laws), ``catalogue`` for target-topology facts, ``structural`` for facts
read off the rewritten IR, ``policy`` for reduction permissions.
"""

from __future__ import annotations

import collections
import functools

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..diskcache import Store, key_of

from ..errors import InternalError, Site, TilenestError
from . import formula as Fm
from .model import VarInfo

PROVED, REFUTED, UNKNOWN, ASSUMED, PENDING = "proved", "refuted", "unknown", "assumed", "pending"

#: default time budget of one query, in seconds
DEFAULT_TIMEOUT = 5.0


@dataclass
class Obligation:
    """One proof obligation and (after :func:`discharge`) its verdict."""

    kind: str
    title: str
    sites: tuple[Site, ...] = ()
    claim: Fm.Claim | None = None
    lemma: Fm.Claim | None = None
    decider: Callable[[Obligation, float], None] | None = None
    info: dict[str, VarInfo] = field(default_factory=dict)
    explain: Callable[[dict], list[str]] | None = None
    role: str = "required"
    provable: bool = True
    refutable: bool = True
    inexact_note: str = ""
    formula_text: str = ""
    witness: Any = None
    unknown_note: str = ""
    # verdict
    status: str = PENDING
    engine: str = ""
    seconds: float = 0.0
    counterexample: dict[str, Any] | None = None
    reason: str = ""
    checked: bool = False
    assumed_by: str = ""
    details: list[str] = field(default_factory=list)

    @property
    def formula(self) -> str:
        """The printable statement (the claim's sentence, or the decider's text)."""
        if self.formula_text:
            return self.formula_text
        return self.claim.text() if self.claim is not None else self.title

    @property
    def ident(self) -> str:
        site = str(self.sites[0]) if self.sites else "-"
        return f"{self.kind}@{site}"

    def matches(self, selector: str) -> bool:
        """An ``assume`` selector: ``KIND``, a kind prefix ending in ``.``/``*``,
        ``KIND@SITE`` (a site substring, e.g. ``gemm.py:30``), or ``*``."""
        if selector == "*":
            return True
        kind, _, site = selector.partition("@")
        kind_ok = (kind == self.kind or (kind.endswith("*") and self.kind.startswith(kind[:-1]))
                   or (kind.endswith(".") and self.kind.startswith(kind)) or kind == "")
        if not kind_ok:
            return False
        return not site or any(site in str(s) for s in self.sites)

    def set(self, status: str, engine: str, reason: str = "",
            counterexample: dict | None = None) -> None:
        self.status, self.engine, self.reason = status, engine, reason
        self.counterexample = counterexample

    def counterexample_lines(self) -> list[str]:
        """The counterexample in the user's terms."""
        if self.details:
            return list(self.details)
        if self.counterexample is None:
            return []
        lines: list[str] = []
        cx = self.counterexample
        params = [k for k in cx if k in (self.claim.params if self.claim else ())]
        if params:
            lines.append("parameters: " + ", ".join(f"{k} = {cx[k]}" for k in params))
        if self.explain is not None:
            try:
                lines.extend(self.explain(cx))
            except Exception as e:  # noqa: BLE001 - rendering must never hide a verdict
                lines.append(f"(could not render: {e})")
        else:
            coords = [k for k in cx if k not in params]
            if coords:
                lines.append("at " + ", ".join(
                    f"{self.info[k].label if k in self.info else k} = {cx[k]}" for k in coords))
        return lines

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "title": self.title,
            "role": self.role,
            "sites": [str(s) for s in self.sites],
            "formula": self.formula,
            "verdict": self.status,
            "engine": self.engine,
            "seconds": round(self.seconds, 6),
            "reason": self.reason or None,
            "counterexample": _jsonable(self.counterexample),
            "counterexample_text": self.counterexample_lines() or None,
            "checked": self.checked,
            "assumed_by": self.assumed_by or None,
        }


def _jsonable(x: Any) -> Any:
    if x is None:
        return None
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):
        return x if math.isfinite(x) else repr(x)  # JSON has no NaN/inf literals
    return x


# ---------------------------------------------------------------------------
# discharge


def decide_claim(ob: Obligation, timeout: float, engine: str = "auto") -> None:
    """Decide ``ob.claim`` with isl (quasi-affine) or z3 (otherwise). A ``lemma``
    (a stronger, quantifier-free form such as an explicit preimage for a
    coverage claim) is tried first: proving it proves the claim; failing to
    prove it decides nothing."""
    if ob.lemma is not None:
        sub = Obligation(ob.kind, ob.title, claim=ob.lemma, provable=ob.provable)
        _decide(sub, timeout / 2, engine)
        if sub.status == PROVED:
            ob.set(PROVED, sub.engine, "via an explicit witness")
            return
        timeout = timeout / 2
    _decide(ob, timeout, engine)


#: decided engine answers on disk (``tilenest.diskcache``), shared by processes
PROOFS = Store("proofs")
#: the answers of each engine that decide a claim (the ones kept on disk)
_DEFINITE = {"isl_engine": ("empty", "point"), "z3_engine": ("unsat", "sat")}


@functools.cache
def _engine_versions() -> tuple[str, str]:
    """The z3 and islpy versions (part of every proof's cache key; read once)."""
    import islpy
    import z3

    return z3.get_version_string(), str(getattr(islpy, "__version__", ""))


#: definite engine answers of this process by key (:func:`_answer`), the
#: most recent :data:`RECENT_ANSWERS` of them; with the disk store off too,
#: a compile whose obligations repeat one formula (the unrolled stores of a
#: GEMM micro-tile) asks the engine once
_RECENT: collections.OrderedDict[str, Any] = collections.OrderedDict()
RECENT_ANSWERS = 8192


def _answer(engine: Any, cs: Any, params: Any, vars_: Any, data: Any, timeout: float) -> Any:
    """``engine.decide(cs, params, vars_, data, timeout)``, with definite
    answers (proved, or a counterexample) kept by the formula's exact
    structure (its ``repr``), the variable lists and both engines' versions:
    in this process (:data:`_RECENT`) and in :data:`PROOFS` on disk. An
    ``unknown`` is never kept (a larger budget may decide it); a
    counterexample read back is re-checked by evaluating the claim like a
    fresh one (:func:`_decide`)."""
    name = engine.__name__.rsplit(".", 1)[-1]
    key = key_of(["proof", name, repr(cs), list(params), list(vars_), list(data),
                  *_engine_versions()])
    m = _RECENT.get(key)
    if m is None and PROOFS.folder() is not None:
        got = PROOFS.get(key)
        m = got[0] if got is not None else None
    if m is not None:
        _remember(key, m)
        point = dict(m["point"]) if isinstance(m["point"], dict) else m["point"]
        return engine.Answer(m["status"], point, m["reason"])
    a = engine.decide(cs, params, vars_, data, timeout)
    if a.status in _DEFINITE[name]:
        m = {"status": a.status, "point": a.point, "reason": a.reason}
        _remember(key, m)
        if PROOFS.folder() is not None:
            PROOFS.put(key, m, {})
    return a


def _remember(key: str, answer: dict) -> None:
    _RECENT[key] = answer
    _RECENT.move_to_end(key)
    while len(_RECENT) > RECENT_ANSWERS:
        _RECENT.popitem(last=False)


def _decide(ob: Obligation, timeout: float, engine: str) -> None:
    from . import isl_engine, z3_engine

    claim = ob.claim
    assert claim is not None
    cs = claim.counterexample_set()
    params, vars_, data = claim.params, claim.vars, claim.data
    affine = Fm.is_affine(cs)
    eng = engine if engine != "auto" else ("isl" if affine else "z3")
    if eng == "isl" and not affine:
        ob.set(UNKNOWN, "isl", "non-affine term " + "; ".join(Fm.non_affine_terms(cs)[:2]))
        return
    if eng == "isl":
        a = _answer(isl_engine, cs, params, vars_, data, timeout)
        status = {"empty": PROVED, "point": REFUTED}.get(a.status, UNKNOWN)
        if status == UNKNOWN and "budget" not in a.reason:
            # isl could not parse/handle it: give z3 the same budget
            b = _answer(z3_engine, cs, params, vars_, data, timeout)
            if b.status != "unknown":
                eng, a = "z3", isl_engine.Answer("empty" if b.status == "unsat" else "point",
                                                 b.point, b.reason)
                status = PROVED if b.status == "unsat" else REFUTED
        point, reason = a.point, a.reason
    else:
        b = _answer(z3_engine, cs, params, vars_, data, timeout)
        status = {"unsat": PROVED, "sat": REFUTED}.get(b.status, UNKNOWN)
        point, reason = b.point, b.reason
        if status == UNKNOWN and not affine:
            reason = f"{reason}; non-affine term " + "; ".join(Fm.non_affine_terms(cs)[:1])
    if status == PROVED:
        if not ob.provable:
            ob.set(UNKNOWN, eng, "the statement over-approximates the program "
                   f"({ob.inexact_note}); no counterexample exists in the approximation")
            return
        ob.set(PROVED, eng)
        return
    if status == UNKNOWN:
        ob.set(UNKNOWN, eng, reason)
        return
    assert point is not None
    # re-check the counterexample by evaluating the claim's own formula
    try:
        holds = Fm.evaluate(cs, Fm.env_of(point, params))
        ob.checked = True
    except Fm.Undecided:
        holds = True
    except (KeyError, ZeroDivisionError) as e:
        ob.set(UNKNOWN, eng, f"counterexample could not be re-evaluated: {e}")
        return
    if not holds:
        ob.set(UNKNOWN, eng, "engine counterexample failed the concrete re-check")
        return
    if data:
        ob.set(UNKNOWN, eng, "a counterexample needs data values ("
               + ", ".join(f"%{d} = {point.get('%' + d)}" for d in data)
               + "); no input is known to produce them", point)
        return
    if not ob.refutable:
        ob.set(UNKNOWN, eng, f"a conflict exists in an over-approximation ({ob.inexact_note}); "
               "not a proof that the program has one", point)
        return
    ob.set(REFUTED, eng, counterexample=point)


def checker_bug(e: Exception, doing: str, sites: Sequence[Site] = ()) -> InternalError:
    """The error for an unexpected exception ``e`` of the checker itself while
    ``doing`` something: a bug of tilenest, never a verdict. It is located at
    the innermost frame of tilenest that raised; ``sites`` (the kernel sites
    the obligation concerns) become notes."""
    import traceback
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[1]
    site = None
    for fr in reversed(traceback.extract_tb(e.__traceback__)):
        f = Path(fr.filename).resolve()
        if pkg in f.parents:
            site = Site(str(f.relative_to(pkg.parent)), fr.lineno or 0)
            break
    notes = tuple(f"the obligation concerns {s}" for s in sites)
    return InternalError(
        f"the checker failed while {doing}: {type(e).__name__}: {e}", site,
        "this is a bug in tilenest, not in your program; please report it with the kernel "
        "(set TILENEST_DEBUG=1 for the Python traceback)", notes)


def discharge(obs: Sequence[Obligation], timeout: float = DEFAULT_TIMEOUT,
              engine: str = "auto", assume: Iterable[str] = ()) -> list[Obligation]:
    """Give every obligation a verdict (in place); returns ``obs``. An engine's
    own limits (budget, a fragment it cannot decide) give ``unknown``; any
    other exception of a decision procedure is a bug of tilenest and raises
    :func:`checker_bug`'s :class:`~tilenest.errors.InternalError` (a crash is
    never reported as a verdict)."""
    sels = list(assume)
    for ob in obs:
        if ob.status != PENDING:
            continue
        hit = next((s for s in sels if ob.matches(s)), None)
        if hit is not None:
            ob.set(ASSUMED, "-", f"assumed by the user (selector '{hit}'), not proved")
            ob.assumed_by = hit
            continue
        t0 = time.perf_counter()
        try:
            if ob.decider is not None:
                ob.decider(ob, timeout)
            elif ob.claim is not None:
                decide_claim(ob, timeout, engine)
            else:
                ob.set(UNKNOWN, "-", "no decision procedure")
        except TilenestError:
            raise
        except Exception as e:  # re-raised as a located internal error
            raise checker_bug(e, f"deciding '{ob.kind}' ({ob.title})", ob.sites) from e
        finally:
            ob.seconds = time.perf_counter() - t0
        if ob.status == UNKNOWN and ob.unknown_note and not ob.reason.startswith(ob.unknown_note):
            ob.reason = f"{ob.unknown_note} ({ob.reason})"
    return list(obs)


#: ``tilenest check``'s exit status for a refuted / an unknown verdict:
#: numbers no other outcome of the command line uses (1 is a user error in
#: the input, 2 a usage error; see tilenest.cli)
EXIT_REFUTED = 5
EXIT_UNKNOWN = 6


def outcome(obs: Iterable[Obligation]) -> int:
    """Exit status: 0 when every required obligation is proved or assumed,
    :data:`EXIT_REFUTED` when one is refuted, :data:`EXIT_UNKNOWN` when one is
    unknown and none is refuted."""
    req = [o for o in obs if o.role == "required"]
    if any(o.status == REFUTED for o in req):
        return EXIT_REFUTED
    if any(o.status in (UNKNOWN, PENDING) for o in req):
        return EXIT_UNKNOWN
    return 0
