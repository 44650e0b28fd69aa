"""Translation validation: compiled kernels judged against the reference.

* :func:`validate` -- differential runs of a compiled kernel and the oracle
  (``tn.reference``) on generated or given inputs (``validate.py``);
* ``inputs.py``   -- cases with ragged sizes, special values and poisoned outputs;
* ``fuzz.py``     -- a hypothesis strategy of random well-typed TileIR programs
  for differential fuzzing of the whole lowering;
* ``report.py``   -- the summary table printed by ``tilenest validate``.
"""

from __future__ import annotations

from .inputs import Case, generate, make_case
from .validate import CaseResult, Report, run_case, validate

__all__ = ["Case", "CaseResult", "Report", "generate", "make_case", "run_case", "validate"]
