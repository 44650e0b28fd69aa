"""``tilenest.transform``: the public transform API (``tn.transform``).

Each function takes a program (or a kernel, or the result of an earlier
transform, so calls compose) and returns a :class:`Transformed`: the rewritten
candidate program plus every obligation stated so far. Obligations are
discharged by :meth:`Transformed.check` (or lazily by ``.admitted``); the
program to use is ``.result`` -- the candidate only when every required
obligation is proved or assumed, else the source (spec T-10)::

    t = tn.transform.split(gemm, level=1, axis=0, factor=2)
    t = tn.transform.bind(t, "cuda", {1: "block", 2: "warp"})
    t.check(timeout=2.0)
    for ob in t.obligations:
        print(ob.kind, ob.status, ob.counterexample_lines())

Execution remaps: :func:`split`, :func:`fuse`, :func:`coalesce`,
:func:`reshape`, :func:`permute`, :func:`interchange`, :func:`tile`,
:func:`insert_unit`, :func:`remove_unit`, :func:`compose`. Realization choices
(no remap of the nest): :func:`bind`, :func:`place_reduction`,
:func:`schedule_pipeline`. Scope fusion: :func:`fuse_phases` (sibling
``parallel`` regions), :func:`fuse_serial` (sibling ``serial`` regions, T-8).
Whole-program check: :func:`check` (what ``tilenest check`` runs).
"""

from __future__ import annotations

from .bindings import CPU, CUDA, METAL, Target, bind, catalogues
from .obligation import Obligation, discharge
from .phases import fuse_phases, schedule_pipeline
from .reductions import place_reduction
from .serial_fusion import fuse_serial
from .remap import NewLevel, Remap, Transformed, TransformError, apply
from .report import Report, check, parse_spec, program_obligations
from .transforms import (
                         coalesce,
                         compose,
                         fuse,
                         insert_unit,
                         interchange,
                         permute,
                         remove_unit,
                         reshape,
                         split,
                         tile,
)

__all__ = [
                         "CPU",
                         "CUDA",
                         "METAL",
                         "NewLevel",
                         "Obligation",
                         "Remap",
                         "Report",
                         "Target",
                         "TransformError",
                         "Transformed",
                         "apply",
                         "bind",
                         "catalogues",
                         "check",
                         "coalesce",
                         "compose",
                         "discharge",
                         "fuse",
                         "fuse_phases",
                         "fuse_serial",
                         "insert_unit",
                         "interchange",
                         "parse_spec",
                         "permute",
                         "place_reduction",
                         "program_obligations",
                         "remove_unit",
                         "reshape",
                         "schedule_pipeline",
                         "split",
                         "tile",
]
