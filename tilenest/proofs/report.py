"""``tilenest check``: gather, discharge and report a program's obligations.

:func:`check` states the obligations of the program itself (noninterference of
storage, ancestor-value joins and pipeline overlap, coverage, bounds, layouts,
ParallelMaps, pipeline schedules, reducer laws),
then of each transform in order (``split(1, 0, 2)``, ``bind(1:block, 2:warp)``,
... see :func:`parse_spec`), then of the binding to ``target``; discharges them
all under one per-query time budget; and returns a :class:`Report`.

Exit status (:meth:`Report.exit_status`): ``0`` every required obligation is
proved (or assumed by the user), ``5`` some required obligation is refuted,
``6`` some is unknown and none is refuted (numbers that no other outcome of
the command line shares). Evidence-only obligations (float
laws that a reduction permission makes unnecessary) are reported but never
change the status. ``--json`` prints :meth:`Report.to_json` (schema
``tilenest.check/1``, documented in ``spec/obligations.md``).

Debug mode re-states and re-discharges the program obligations of every
intermediate program after each rewrite (and verifies it).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import TilenestError
from ..semantics.ir import TileProgram
from . import bindings as BD
from . import phases as PH
from . import program as PO
from . import reductions as RD
from . import serial_fusion as SF
from . import transforms as T
from .model import Model
from .obligation import ASSUMED, PROVED, REFUTED, UNKNOWN, Obligation, discharge, outcome
from .remap import Transformed, TransformError

SCHEMA = "tilenest.check/1"

STEPS = {**T.TRANSFORMS, "bind": BD.bind, "fuse_phases": PH.fuse_phases,
         "fuse_serial": SF.fuse_serial, "place_reduction": RD.place_reduction,
         "schedule": PH.schedule_pipeline}


def program_obligations(p: TileProgram) -> list[Obligation]:
    """Everything the program alone must satisfy."""
    m = Model(p)
    return (PO.program_obligations(m) + PH.default_pipeline_obligations(m)
            + RD.program_reduction_obligations(m))


_TOKEN = re.compile(r"\s*(?:(-?\d+)|([A-Za-z_][A-Za-z_0-9.]*)|(\S))")


def parse_spec(text: str) -> tuple[str, tuple, dict]:
    """``name(arg, ...)`` where an argument is an int, a name (``None`` and
    ``true``/``false`` are those values), a list ``[...]``, ``key=value``, or
    ``level:scope`` (collected into the ``scopes`` mapping)."""
    toks: list[tuple[str, Any]] = []
    for mt in _TOKEN.finditer(text):
        num, name, sym = mt.groups()
        if num is not None:
            toks.append(("int", int(num)))
        elif name is not None:
            toks.append(("name", name))
        elif sym is not None:
            toks.append(("sym", sym))
    pos = 0

    def err(msg: str) -> TilenestError:
        return TransformError(f"bad transform spec {text!r}: {msg}",
                             hint="e.g. split(1, 0, 2), tile(1, [2, 2]), bind(1:block, 2:warp)")

    def peek() -> tuple[str, Any]:
        return toks[pos] if pos < len(toks) else ("end", None)

    def take(kind: str, val: Any = None) -> Any:
        nonlocal pos
        k, v = peek()
        if k != kind or (val is not None and v != val):
            raise err(f"expected {val or kind}, found {v!r}")
        pos += 1
        return v

    def value() -> Any:
        k, v = peek()
        if k == "sym" and v == "[":
            take("sym", "[")
            items = []
            while peek() != ("sym", "]"):
                items.append(value())
                if peek() == ("sym", ","):
                    take("sym", ",")
            take("sym", "]")
            return items
        if k in ("int", "name"):
            take(k)
            if k == "name" and v in ("None", "none"):
                return None
            if k == "name" and v in ("True", "true", "False", "false"):
                return v in ("True", "true")
            return v
        raise err("unexpected end of the spec" if k == "end" else f"unexpected {v!r}")

    name = take("name")
    take("sym", "(")
    args: list[Any] = []
    kw: dict[str, Any] = {}
    scopes: dict[int, str] = {}
    while peek() != ("sym", ")"):
        k, v = peek()
        nxt = toks[pos + 1] if pos + 1 < len(toks) else ("end", None)
        if k == "name" and nxt == ("sym", "="):
            take("name")
            take("sym", "=")
            kw[v] = value()
        elif k == "int" and nxt == ("sym", ":"):
            take("int")
            take("sym", ":")
            scopes[v] = take("name")
        else:
            args.append(value())
        if peek() == ("sym", ","):
            take("sym", ",")
        elif peek() != ("sym", ")"):
            raise err(f"expected ',' or ')', found {peek()[1]!r}")
    take("sym", ")")
    if peek()[0] != "end":
        raise err("trailing text")
    if scopes:
        kw["scopes"] = scopes
    if name not in STEPS:
        raise TransformError(f"unknown transform '{name}'",
                             hint="one of " + ", ".join(sorted(STEPS)))
    return name, tuple(args), kw


@dataclass
class Report:
    """The outcome of :func:`check`."""

    kernel: str
    target: str | None
    steps: list[str]
    obligations: list[Obligation]
    seconds: float = 0.0
    final: TileProgram | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def exit_status(self) -> int:
        return outcome(self.obligations)

    def counts(self) -> dict[str, int]:
        out = {PROVED: 0, REFUTED: 0, UNKNOWN: 0, ASSUMED: 0, "evidence": 0}
        for o in self.obligations:
            if o.role != "required":
                out["evidence"] += 1
            else:
                out[o.status] = out.get(o.status, 0) + 1
        return out

    def table(self, verbose: bool = False) -> str:
        c = self.counts()
        head = (f"tilenest check @{self.kernel}: {len(self.obligations)} obligations -- "
                f"{c[PROVED]} proved, {c[REFUTED]} refuted, {c[UNKNOWN]} unknown, "
                f"{c[ASSUMED]} assumed, {c['evidence']} evidence ({self.seconds:.3f} s)")
        lines = [head]
        for s in self.steps:
            lines.append(f"  step: {s}")
        if self.target:
            lines.append(f"  target: {self.target}")
        lines.append(f"  {'#':>3}  {'kind':<26} {'verdict':<9} {'engine':<20} {'time':>9}  sites")
        for i, o in enumerate(self.obligations, 1):
            verdict = o.status if o.role == "required" else f"{o.status}*"
            sites = ", ".join(str(s) for s in o.sites[:2]) + (
                f" +{len(o.sites) - 2}" if len(o.sites) > 2 else "")
            lines.append(f"  {i:>3}  {o.kind:<26} {verdict:<9} {o.engine:<20} "
                         f"{o.seconds * 1000:>7.1f}ms  {sites or '-'}")
            if verbose or o.status != PROVED:
                lines.append(f"       {o.title}")
            if o.status == REFUTED:
                cls = o.counterexample_lines()
                if cls:
                    lines.append("       counterexample:")
                    lines.extend(f"         {cl}" for cl in cls)
                if o.reason and not o.details:
                    lines.append(f"       {o.reason}")
            elif o.status in (UNKNOWN, ASSUMED):
                lines.append(f"       {o.status}: {o.reason}")
        if c["evidence"]:
            lines.append("  (* evidence only: reported, never decides the exit status)")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "kernel": self.kernel,
            "target": self.target,
            "steps": list(self.steps),
            "summary": self.counts(),
            "exit_status": self.exit_status,
            "seconds": round(self.seconds, 6),
            "obligations": [o.to_json() for o in self.obligations],
            "notes": list(self.notes),
        }


def validate_spec(spec: str | tuple) -> tuple[str, tuple, dict]:
    """A transform step -- a spec string (:func:`parse_spec`) or a ``(name,
    args, kwargs)`` triple -- checked against the transform's signature
    (:func:`~tilenest.proofs.transforms.check_arguments`) before anything is
    applied; returns the triple. A malformed spec, an unknown name or unfit
    arguments raise a TransformError (``tilenest check --transform``, the
    Python :func:`check` and schedule transforms give the same error)."""
    if isinstance(spec, str):
        name, args, kw = parse_spec(spec)
    else:
        try:
            name, args, kw = spec
            args, kw = tuple(args), dict(kw)
        except (TypeError, ValueError):
            raise TransformError(f"a transform step is a spec string or a (name, args, "
                                 f"kwargs) triple, not {spec!r}",
                                 hint="e.g. 'split(1, 0, 2)' or ('split', (1, 0, 2), {})") \
                from None
    if not isinstance(name, str) or name not in STEPS:
        raise TransformError(f"unknown transform {name!r}",
                             hint="one of " + ", ".join(sorted(STEPS)))
    T.check_arguments(name, STEPS[name], args, kw)
    return name, args, kw


def check(program: Any, transforms: Sequence[str | tuple] = (), target: str | BD.Target | None
          = None, *, timeout: float = 5.0, assume: Sequence[str] = (), engine: str = "auto",
          debug: bool = False, include_program: bool = True) -> Report:
    """State and discharge every obligation (see the module docstring)."""
    t0 = time.perf_counter()
    p = getattr(program, "program", program)
    if not isinstance(p, TileProgram):
        raise TransformError("check takes a TileProgram or a kernel")
    obs: list[Obligation] = program_obligations(p) if include_program else []
    cur: Any = p
    steps: list[str] = []
    notes: list[str] = []
    bound = False
    specs = [validate_spec(spec) for spec in transforms]  # every step, before any runs
    for name, args, kw in specs:
        if name == "bind":
            bound = True
            if target is not None and not args and "tgt" not in kw:
                kw = {**kw, "tgt": target}
        cur = STEPS[name](cur, *args, **kw)
        assert isinstance(cur, Transformed)
        if cur.program is None:
            notes.append(f"after {name}: no rewritten program ({cur.reason}); later steps "
                         "are skipped")
            break
        if debug:
            from ..semantics.verify import verify

            try:
                verify(cur.program)
            except TilenestError as e:
                notes.append(f"debug: the program after {name} does not verify: {e.message}")
            extra = program_obligations(cur.program)
            for o in extra:
                o.title = f"[after {name}] {o.title}"
            cur.obligations.extend(extra)
    if target is not None and not bound:
        cur = BD.bind(cur, target)
    if isinstance(cur, Transformed):
        obs += cur.obligations
        steps = cur.steps
        final = cur.program
    else:
        final = p
    discharge(obs, timeout, engine, assume)
    tname = target if isinstance(target, str) or target is None else target.name
    return Report(p.name, tname, steps, obs, time.perf_counter() - t0, final, notes)
