"""Code-generation targets: one registry row per backend.

Each target names how to compile a program for it (``compile``: program,
schedule -> a callable kernel with ``obligations`` and ``compile_seconds``)
and how to print its stages (``emit``, ``STAGES``). ``Kernel.compile``,
``tn.validate``, ``tilenest lower / validate / conformance`` and the
benchmarks all look targets up here, so a backend is a row and a folder.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

from ..errors import NotAvailableError


@dataclass(frozen=True)
class Target:
    """A registry row: the backend's module (with ``compile_program``,
    ``emit`` and ``STAGES``) and a one-line description."""

    name: str
    module: str
    about: str

    def load(self) -> Any:
        return importlib.import_module(self.module)

    def compile(self, program: Any, schedule: Any = None, **kw: Any) -> Any:
        return self.load().compile_program(program, schedule, **kw)

    def emit(self, program: Any, stage: str, schedule: Any = None) -> str:
        return self.load().emit(program, stage, schedule)

    def stages(self) -> tuple[str, ...]:
        return tuple(self.load().STAGES)


TARGETS: dict[str, Target] = {
    "llvm": Target("llvm", "tilenest.backends.llvm", "the host CPU through LLVM (JIT)"),
    "cuda": Target("cuda", "tilenest.backends.cuda",
                   "NVIDIA GPUs (sm_90a) through CUDA C++ and NVRTC; on a GPU, or on the "
                   "host emulator"),
}


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
    """The registry row of target ``name`` (an error naming the targets otherwise)."""
    t = TARGETS.get(name)
    if t is None:
        raise NotAvailableError(f"no code generation for target '{name}'",
                                hint="targets: " + ", ".join(TARGETS))
    return t
