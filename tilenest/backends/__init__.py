"""Code-generation targets: the backends of the rows of the target registry.

The registry itself is :mod:`tilenest.targets` (one row per target: its
device profile, default schedule fields, binding catalogue and the module
path of its backend). This package holds the backends those rows name, and
:func:`target`, the lookup ``Kernel.compile``, ``tn.validate``, ``tilenest
lower / validate / conformance`` and the benchmarks use: a backend is a row
and a folder.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..targets import TARGETS, Target, compiler, compiling

__all__ = ["TARGETS", "Target", "compiling", "stage_text", "target"]


def stage_text(target_name: str, stages: Any, program: Any, stage: str,
               schedule: Callable[[], Any]) -> str:
    """The text of ``stage`` for ``program`` from a backend's ``STAGES``
    table, under the schedule ``schedule()`` resolves (called only for a
    known stage); an unknown stage is an error listing the stages."""
    from ..errors import TilenestError

    if stage not in stages:
        raise TilenestError(f"unknown stage '{stage}' for target {target_name}",
                            hint="stages: " + ", ".join(stages))
    return stages[stage](program, schedule())


def target(name: str) -> Target:
    """The registry row of target ``name`` when it compiles (an error naming
    the targets that do otherwise)."""
    return compiler(name)
