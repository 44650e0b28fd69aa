"""Differential translation validation: compiled kernel vs the reference.

For each case, :func:`run_case` runs the oracle (``tn.reference``: the
interpreter with interval shadows) and the compiled kernel on identical copies
of the arguments, and judges every output with ``Admitted.admits`` -- bitwise
where the contract is bitwise, the FP64 envelope downstream of tree
reductions and reassociating ``mma``. Outcomes:

* ``ok``        -- every output admitted;
A compiled kernel that evaluates a reduction under a custom contract in one
fixed tree (``compiled.trees``, e.g. the CUDA block tree) is judged against
that tree's value, which the reference computes (``reference(trees=...)``).

* ``mismatch``  -- some output not admitted (the first offending element and
  why), or the compiled kernel rejected a call the reference accepts, or
  accepted one the reference rejects with a checkable error (a ``checked``
  view out of bounds, integer division by zero);
* ``rejected``  -- both reject the call (agreement);
* ``skipped``   -- the reference finds the *program* invalid on this input (a
  race, a read of an unwritten output, a contract error) or cannot determine
  the admitted set (control flow on inexact values): there is nothing to
  compare against.

A run *compares* a case when its verdict is ``ok``, ``mismatch`` or
``rejected``. A run that compares nothing (no case generated because the
assumptions reject every size tried, ``cases=0``, every case skipped) proves
nothing: its :attr:`Report.status` is ``"nothing compared"`` and
``report.ok`` is False, as for a mismatch.

With generated cases, the report also lists the required size paths
(:mod:`tilenest.validation.sizes`: each tiled symbol at three tiles and a
ragged tail) that no compared case took, and why. When the kernel's size
space itself keeps one out of reach (its assumptions exclude it, every such
case is over the element budget, or Z3 cannot decide) the status is
``"unreached"`` and ``report.ok`` is False, unless the caller accepts it
(``accept_unreached=True``, ``--accept-unreached``): the untested path is
then named in the report, not hidden. A path above the caller's own
``limit``, or one the cases were too few to reach, is listed as a note.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .. import progress as _progress
from ..errors import (
    ContractError,
    RaceError,
    RuntimeSemanticError,
    TilenestError,
    UninitializedReadError,
)
from ..semantics.ir import TileProgram
from .inputs import REQUIRED_ELEMENTS, Case, generate, tile_sizes, user_case
from .sizes import Unreached, unreached

_INVALID = (RaceError, UninitializedReadError, ContractError)


@dataclass
class CaseResult:
    """The verdict on one case."""

    index: int
    label: str
    status: str
    message: str = ""
    output: str | None = None
    element: tuple[int, ...] | None = None
    size: int = 0
    case: Case | None = field(default=None, repr=False)


#: the verdicts that compare the compiled kernel with the reference
COMPARED = ("ok", "mismatch", "rejected")


@dataclass
class Report:
    """All case verdicts of one validation run, with the schedules it used:
    ``compile_schedule`` the code generator's (what differs from the target's
    defaults), ``reference_schedule`` the interpreter's order of ``parallel``
    children in the reference runs."""

    kernel: str
    target: str
    results: list[CaseResult]
    compile_seconds: float = 0.0
    seconds: float = 0.0
    compile_schedule: str = "default"
    reference_schedule: str = "batched"
    unreached: list[Unreached] = field(default_factory=list)
    accept_unreached: bool = False

    @property
    def compared(self) -> int:
        """How many cases compared the compiled kernel with the reference."""
        return sum(r.status in COMPARED for r in self.results)

    @property
    def status(self) -> str:
        """``"mismatch"`` if any case mismatched, else ``"nothing compared"`` if
        no case was compared, else ``"unreached"`` if a required size path is
        out of the kernel's reach and that was not accepted, else ``"ok"``."""
        if self.mismatches:
            return "mismatch"
        if not self.compared:
            return "nothing compared"
        if self.blocking_unreached and not self.accept_unreached:
            return "unreached"
        return "ok"

    @property
    def blocking_unreached(self) -> list[Unreached]:
        """The unreached paths that fail a validation unless accepted."""
        return [u for u in self.unreached if u.blocking]

    @property
    def ok(self) -> bool:
        """Some case was compared and none mismatched."""
        return self.status == "ok"

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def mismatches(self) -> list[CaseResult]:
        return [r for r in self.results if r.status == "mismatch"]

    def smallest_failure(self) -> CaseResult | None:
        bad = self.mismatches
        return min(bad, key=lambda r: r.size) if bad else None

    def sizes(self) -> dict[str, list[int]]:
        """For each symbol, the values it took in the compared cases."""
        out: dict[str, set[int]] = {}
        for r in self.results:
            if r.status in COMPARED and r.case is not None:
                for k, v in r.case.syms.items():
                    out.setdefault(k, set()).add(int(v))
        return {k: sorted(v) for k, v in sorted(out.items())}

    def sizes_text(self) -> str:
        """``M in {0, 1, 33, 106}; N in {...}`` over the compared cases."""
        if not self.compared:
            return "none"
        sz = self.sizes()
        return "; ".join(f"{k} in {{{', '.join(map(str, v))}}}" for k, v in sz.items()) \
            or "(no symbolic extents)"

    def why_nothing(self) -> str:
        """Why no case was compared (empty when some was)."""
        if self.compared:
            return ""
        if not self.results:
            return ("no case was generated: the kernel's assumptions reject every size "
                    "tried, or zero cases were asked for")
        skipped = next((r.message for r in self.results if r.status == "skipped"), "")
        return f"the reference skipped every case ({skipped})"

    def summary(self) -> str:
        s = (f"{self.kernel} [{self.target}]: {self.count('ok')} ok, "
             f"{self.count('mismatch')} mismatch, {self.count('rejected')} both-rejected, "
             f"{self.count('skipped')} skipped")
        s += f"\n  schedules: compiled {self.compile_schedule}; reference {self.reference_schedule}"
        s += f"\n  sizes compared: {self.sizes_text()}"
        if self.status == "nothing compared":
            s += f"\n  nothing compared: {self.why_nothing()}"
        s += "".join(f"\n  {line}" for line in self.unreached_lines())
        f = self.smallest_failure()
        if f is not None:
            s += f"\n  smallest failing case #{f.index} ({f.label}): {f.message}"
        return s

    def unreached_lines(self) -> list[str]:
        """One line per required size path no compared case took, tagged
        ``not reached`` (fails the run), ``not reached (accepted)`` or
        ``note: not reached`` (a limit of the caller's, or too few cases)."""
        out = []
        for u in self.unreached:
            tag = ("not reached (accepted)" if self.accept_unreached else "not reached") \
                if u.blocking else "note: not reached"
            out.append(f"{tag}: {u.text()}")
        return out

    def __bool__(self) -> bool:
        return self.ok


def describe_schedule(s: Any) -> str:
    """A code-generation schedule as its fields that differ from the defaults
    (``"default"`` when none does)."""
    import dataclasses

    if s is None:
        return "default"
    if not dataclasses.is_dataclass(s) or isinstance(s, type):
        return str(s)
    base: Any = type(s)()
    diff = [f"{f.name}={getattr(s, f.name)!r}" for f in dataclasses.fields(s)
            if getattr(s, f.name) != getattr(base, f.name)]
    return ", ".join(diff) or "default"


def describe_reference_schedule(s: Any) -> str:
    """An interpreter schedule as text (``batched`` is the interpreter's default)."""
    if s is None:
        return "batched"
    if isinstance(s, str):
        return s
    kind = getattr(s, "kind", None)
    if kind == "random":
        return f"random:{getattr(s, 'seed', 0)}"
    return str(kind or s)


def _admitted_list(ref: Any) -> list:
    return [with_reference(a) for a in (list(ref) if isinstance(ref, tuple) else [ref])]


def with_reference(a: Any) -> Any:
    """``a`` with envelopes that exclude the reference value repaired.

    The canonical evaluation is a member of every admitted set (spec R-6), but
    the oracle's envelope can miss it when the canonical order overflows (the
    envelope bounds the exact sum): then a finite or infinite reference widens
    the envelope to contain it, and a NaN reference (infinities of both signs
    met, in some order) makes the element unbounded -- the oracle cannot bound
    it. Elements whose contract is bitwise are unchanged."""
    if a.lo is None:
        return a
    from dataclasses import replace

    from ..interpreter import shadow as S

    ref = S.as_f64(a.value)
    inexact = ~a.exact_mask
    missed = inexact & np.isnan(ref) & ~a.nan
    lo, hi, nan = S.join((a.lo, a.hi, a.nan), inexact & ~np.isnan(ref), ref)
    lo, hi, nan = S.settle(np.where(missed, np.nan, lo), hi, nan)
    return replace(a, lo=lo, hi=hi, nan=nan)


def run_case(program: TileProgram, compiled: Callable, case: Case, index: int = 0,
             reference_schedule: Any = None) -> CaseResult:
    """Judge ``compiled`` against the reference on one case; the reference runs
    ``parallel`` children in ``reference_schedule`` (default: batched)."""
    from ..interpreter import reference

    base = dict(index=index, label=case.label, size=case.size, case=case)
    kw: dict[str, Any] = {} if reference_schedule is None else {"schedule": reference_schedule}
    trees = getattr(compiled, "trees", None)
    if trees:  # the fixed trees the kernel evaluates its custom reductions in
        kw["trees"] = trees
    try:
        ref = reference(program, *case.copy_args(), params=case.params, **kw)
    except _INVALID as e:
        return CaseResult(status="skipped", message=f"reference: {e.kind}: {e.message}", **base)
    except RuntimeSemanticError as e:
        ref_err: TilenestError | None = e
    else:
        ref_err = None
    work = case.copy_args()
    try:
        compiled(*work, params=case.params)
    except RuntimeSemanticError as e:
        if ref_err is not None:
            return CaseResult(status="rejected", message=f"both reject: {ref_err.message}", **base)
        return CaseResult(status="mismatch", message=f"compiled kernel raised {e.kind}: "
                          f"{e.message}; the reference accepts this call", **base)
    if ref_err is not None:
        return CaseResult(status="mismatch", message=f"the reference raises {ref_err.kind}: "
                          f"{ref_err.message}; the compiled kernel did not", **base)
    admitted = _admitted_list(ref)
    if not all(a.determined for a in admitted):
        return CaseResult(status="skipped", message="control flow depends on inexact values",
                          **base)
    by_name = {v.name: a for v, a in zip(program.args, work, strict=True)}
    for a in admitted:
        v = a.admits(by_name[a.name])
        if not v:
            return CaseResult(status="mismatch", message=v.reason, output=a.name,
                              element=v.index, **base)
    return CaseResult(status="ok", **base)


def _is_compile_schedule(s: Any) -> bool:
    from ..lowering.schedule import Schedule

    return isinstance(s, Schedule)


def validate(kernel: Any, target: str = "llvm", inputs: Any = None, cases: int = 20,
             seed: int = 0, schedule: Any = None, compiled: Callable | None = None,
             params: dict[str, int] | None = None, limit: int | None = None,
             progress: Callable[[int, int], None] | None = None,
             compile_schedule: Any = None, accept_unreached: bool = False) -> Report:
    """Validate the compiled ``kernel`` for ``target`` against the reference.

    ``inputs``: one argument list, or a list of them (outputs as given); when
    None, ``cases`` cases are generated from ``seed`` (:func:`generate`: sizes
    derived from the kernel's tiles, none above ``limit`` when it is given).
    ``schedule``: an interpreter schedule for the reference runs (as for
    ``tn.interpret``: ``'canonical'``, ``tn.interpreter.random(seed)``...), or
    a code-generation ``Schedule`` (then it is ``compile_schedule``).
    ``compiled`` replaces the compiled callable (used to validate a
    deliberately wrong lowering). Returns a :class:`Report`; ``report.ok`` is
    False on any mismatch, when nothing was compared, and when the kernel's
    assumptions keep a required size path out of reach unless
    ``accept_unreached`` (module docstring)."""
    program: TileProgram = getattr(kernel, "program", kernel)
    if schedule is not None and _is_compile_schedule(schedule):
        if compile_schedule is not None:
            raise TilenestError("validate got two code-generation schedules",
                                hint="pass the interpreter's as schedule=, the compiler's as "
                                     "compile_schedule=")
        schedule, compile_schedule = None, schedule
    t0 = time.perf_counter()
    csec = 0.0
    if compiled is None:
        from ..backends import target as lookup

        ck = lookup(target).compile(program, compile_schedule)
        compiled, csec = ck, ck.compile_seconds
    used = compile_schedule if compile_schedule is not None else \
        getattr(compiled, "schedule", None)
    if inputs is not None:
        groups = inputs if inputs and isinstance(inputs[0], (list, tuple)) else [inputs]
        todo = [user_case(program, list(g), params) for g in groups]
    else:
        todo = generate(program, cases, seed, limit)
    results = []
    # one step per case (a size), on stderr and only at a terminal (tilenest.progress)
    with _progress.bar(f"validate {program.name} ({target})", len(todo)) as step:
        for i, c in enumerate(todo):
            results.append(run_case(program, compiled, c, i, schedule))
            step(c.label)
            if progress is not None:
                progress(i + 1, len(todo))
    missing: list[Unreached] = []
    if inputs is None and any(r.status in COMPARED for r in results):
        compared = [r.case.syms for r in results if r.status in COMPARED and r.case is not None]
        missing = unreached(program, tile_sizes(program), compared, limit, REQUIRED_ELEMENTS)
    return Report(program.name, target, results, csec, time.perf_counter() - t0,
                  describe_schedule(used), describe_reference_schedule(schedule),
                  missing, accept_unreached)


def same_outputs(a: list, b: list) -> bool:
    """Bitwise equality of two argument lists (NaNs equal)."""
    for x, y in zip(a, b, strict=True):
        if isinstance(x, np.ndarray):
            if x.tobytes() != y.tobytes():
                return False
    return True
