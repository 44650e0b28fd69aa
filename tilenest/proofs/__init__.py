"""Proof obligations of the execution-nest calculus, discharged with ISL and Z3.

Layout of this package (it imports only :mod:`tilenest.semantics`):

* ``formula``      -- the assertion IR (claims, counterexample sets, evaluation)
* ``isl_engine``   -- the only translation to isl (quasi-affine claims)
* ``z3_engine``    -- the only translation to Z3 (non-affine claims, scalar laws)
* ``obligation``   -- obligations as data, verdicts, discharge, exit status
* ``model``        -- instance domains and access relations of a program
* ``program``      -- noninterference, coverage, bounds, layouts, ParallelMaps
* ``races``        -- ancestor-value joins and pipeline overlap (with
  ``noninterference``, the race obligations a compiled target must prove)
* ``remap``/``rewrite``/``transforms`` -- execution remaps tau, their
  obligations and the mechanical rewrite; the transform basis
* ``bindings``     -- target catalogues and ExecBinding obligations
* ``phases``       -- sibling-phase fusion and pipeline issue schedules
* ``serial_fusion`` -- fusion of sibling ``serial`` regions (T-8)
* ``layouts``/``gf2`` -- Memory layout obligations; the GF(2) procedure for
  bit-linear (XOR/shift/mask) layouts
* ``reductions``   -- reduction placement and reducer laws
* ``report``       -- ``tilenest check``: gathering, tables, JSON
* ``transform``    -- the public API, exposed as ``tilenest.transform``

``spec/obligations.md`` states each obligation kind, its formula and the
verdict semantics.
"""

from .obligation import ASSUMED, PROVED, REFUTED, UNKNOWN, Obligation, discharge
from .report import Report, check

__all__ = [
           "ASSUMED",
           "PROVED",
           "REFUTED",
           "UNKNOWN",
           "Obligation",
           "Report",
           "check",
           "discharge",
]
