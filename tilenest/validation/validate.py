"""Differential translation validation: compiled kernel vs the reference.

For each case, :func:`run_case` runs the oracle (``tn.reference``: the
interpreter with interval shadows) and the compiled kernel on identical copies
of the arguments, and judges every output with ``Admitted.admits`` -- bitwise
where the contract is bitwise, the FP64 envelope downstream of tree
reductions and reassociating ``mma``. Outcomes:

* ``ok``        -- every output admitted;
* ``mismatch``  -- some output not admitted (the first offending element and
  why), or the compiled kernel rejected a call the reference accepts, or
  accepted one the reference rejects with a checkable error (a ``checked``
  view out of bounds, integer division by zero);
* ``rejected``  -- both reject the call (agreement);
* ``skipped``   -- the reference finds the *program* invalid on this input (a
  race, a read of an unwritten output, a contract error) or cannot determine
  the admitted set (control flow on inexact values): there is nothing to
  compare against.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..errors import (
    ContractError,
    RaceError,
    RuntimeSemanticError,
    TilenestError,
    UninitializedReadError,
)
from ..semantics.ir import TileProgram
from .inputs import Case, generate, user_case

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


@dataclass
class Report:
    """All case verdicts of one validation run."""

    kernel: str
    target: str
    results: list[CaseResult]
    compile_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(r.status == "mismatch" for r in self.results)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.results)

    @property
    def mismatches(self) -> list[CaseResult]:
        return [r for r in self.results if r.status == "mismatch"]

    def smallest_failure(self) -> CaseResult | None:
        bad = self.mismatches
        return min(bad, key=lambda r: r.size) if bad else None

    def summary(self) -> str:
        s = (f"{self.kernel} [{self.target}]: {self.count('ok')} ok, "
             f"{self.count('mismatch')} mismatch, {self.count('rejected')} both-rejected, "
             f"{self.count('skipped')} skipped")
        f = self.smallest_failure()
        if f is not None:
            s += f"\n  smallest failing case #{f.index} ({f.label}): {f.message}"
        return s

    def __bool__(self) -> bool:
        return self.ok


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

    with np.errstate(invalid="ignore"):
        ref = a.value.astype(np.float64)
        inexact = ~a.exact_mask & ~np.isnan(a.lo) & ~np.isnan(a.hi)
        nan_ref = inexact & np.isnan(ref)
        fin = inexact & ~np.isnan(ref)
        lo = np.where(fin, np.minimum(a.lo, ref), a.lo)
        hi = np.where(fin, np.maximum(a.hi, ref), a.hi)
        lo = np.where(nan_ref, np.nan, lo)
        hi = np.where(nan_ref, np.nan, hi)
    return replace(a, lo=lo, hi=hi)


def run_case(program: TileProgram, compiled: Callable, case: Case, index: int = 0
             ) -> CaseResult:
    """Judge ``compiled`` against the reference on one case."""
    from ..interpreter import reference

    base = dict(index=index, label=case.label, size=case.size, case=case)
    try:
        ref = reference(program, *case.copy_args(), params=case.params)
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


def validate(kernel: Any, target: str = "llvm", inputs: Any = None, cases: int = 20,
             seed: int = 0, schedule: Any = None, compiled: Callable | None = None,
             params: dict[str, int] | None = None, limit: int = 200,
             progress: Callable[[int, int], None] | None = None) -> Report:
    """Validate the compiled ``kernel`` for ``target`` against the reference.

    ``inputs``: one argument list, or a list of them (outputs as given); when
    None, ``cases`` cases are generated from ``seed`` (sizes up to ``limit``).
    ``compiled`` replaces the compiled callable (used to validate a
    deliberately wrong lowering). Returns a :class:`Report`; ``report.ok`` is
    False on any mismatch."""
    program: TileProgram = getattr(kernel, "program", kernel)
    t0 = time.perf_counter()
    csec = 0.0
    if compiled is None:
        from ..backends.llvm import compile_program

        if target != "llvm":
            from ..errors import NotAvailableError

            raise NotAvailableError(f"no compiler for target '{target}'", hint="targets: llvm")
        ck = compile_program(program, schedule) if schedule is not None else \
            compile_program(program)
        compiled, csec = ck, ck.compile_seconds
    if inputs is not None:
        groups = inputs if inputs and isinstance(inputs[0], (list, tuple)) else [inputs]
        todo = [user_case(program, list(g), params) for g in groups]
    else:
        todo = generate(program, cases, seed, limit)
    results = []
    for i, c in enumerate(todo):
        results.append(run_case(program, compiled, c, i))
        if progress is not None:
            progress(i + 1, len(todo))
    return Report(program.name, target, results, csec, time.perf_counter() - t0)


def same_outputs(a: list, b: list) -> bool:
    """Bitwise equality of two argument lists (NaNs equal)."""
    for x, y in zip(a, b, strict=True):
        if isinstance(x, np.ndarray):
            if x.tobytes() != y.tobytes():
                return False
    return True
