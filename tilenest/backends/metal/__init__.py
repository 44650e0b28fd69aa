"""The Metal backend: loop IR (SIMT form) -> Metal Shading Language.

Stages (``STAGES``; ``tilenest lower FILE --target metal --emit NAME``):

* ``schedule`` -- the schedule and its legality verdicts;
* ``loopir``   -- the SIMT-form loop IR (``lowering/simt.py``);
* ``msl``      -- the MSL source (``emit.py``, with ``prelude/``), as
  :func:`.emit.standalone` would paste it for Metal's runtime less the
  prelude (the source names ``tn_metal.h``).

:func:`compile_program` refuses f64 (:mod:`.nodouble`), proves the program
legal for the ``metal`` row (its binding catalogue: each top-level
``parallel`` instance a threadgroup), lowers it, discharges the SIMT form's
obligations against the row's profile (coverage, barrier sufficiency,
reduction trees, and the threadgroup-memory and thread limits, which may
leave a launch precondition) and emits the source. The kernel it returns
runs nowhere yet on this machine: calling it raises
:class:`~tilenest.errors.NotAvailableError` (off macOS, the runtime's
refusal; ``device="emulated"``, until the Metal emulator is wired in).
"""

from __future__ import annotations

from typing import Any, Callable

from ...errors import NotAvailableError, TilenestError
from ...lowering import Schedule, lower_verified, print_kernel
from ...lowering.legality import legality, summary
from ...lowering.schedule import for_target
from ...semantics.ir import TileProgram
from ...semantics.signature import stored_tensors
from .emit import MetalSource, emit_msl, standalone
from .nodouble import refuse_f64

__all__ = ["compile_program", "emit", "STAGES", "MetalKernel", "stage_source", "standalone"]

#: the devices a Metal kernel can be asked to run on
DEVICES = ("gpu", "emulated")


def _schedule(program: TileProgram, schedule: Schedule | None) -> Schedule:
    """The schedule to compile with: the given one made a ``metal``
    schedule, or the row's default (``lowering.schedule.for_target``)."""
    return for_target(program, schedule, "metal")


def stage_source(program: TileProgram, s: Schedule, maps: list | None = None
                 ) -> tuple[Any, MetalSource]:
    """The SIMT-form kernel and its MSL source (f64 refused first; the task
    maps of the distributed loops appended to ``maps``)."""
    refuse_f64(program)
    k = lower_verified(program, s, maps)
    src = emit_msl(k, stored_tensors(program), s.index_bits or 64,
                   grid_blocks=s.grid_blocks)
    return k, src


class MetalKernel:
    """A compiled Metal kernel: the program, its SIMT-form kernel, schedule,
    MSL source and every obligation discharged, and ``precondition``, the
    launch precondition left by the resource limits. Calling it runs it on
    ``device`` -- which this machine cannot do yet (see the module docstring)."""

    def __init__(self, program: TileProgram, kernel: Any, schedule: Schedule,
                 source: MetalSource, device: str, obligations: list, precondition: Any):
        self.program = program
        self.kernel = kernel
        self.schedule = schedule
        self.source = source
        self.device = device
        self.obligations = obligations
        self.precondition = precondition
        #: seconds the compile took (proofs, lowering, emission)
        self.compile_seconds = 0.0
        #: where it came from (nothing is cached on metal)
        self.cached: str | None = None

    @property
    def text(self) -> str:
        """The one-string source Metal's runtime compiles (:func:`standalone`)."""
        return standalone(self.source.text)

    def __repr__(self) -> str:
        return f"<MetalKernel {self.program.name} on {self.device}>"

    def __call__(self, *arrays: Any, params: dict[str, int] | None = None) -> Any:
        if self.device == "emulated":
            return run_emulated(self, arrays, params)
        from .runtime import metal_module

        metal_module()  # off macOS: the runtime's NotAvailableError
        raise NotAvailableError("calling a compiled Metal kernel on a Mac is not wired yet",
                                hint="run MetalKernel.text with runtime.MetalDevice")


def run_emulated(kernel: MetalKernel, arrays: tuple, params: dict[str, int] | None) -> Any:
    """Run ``kernel`` on the emulated Metal device (the hook the emulator fills)."""
    raise NotAvailableError("the Metal emulator is not wired yet",
                            hint="compile for the cuda target (device='emulated') or llvm")


def compile_program(program: TileProgram, schedule: Schedule | None = None,
                    cache: bool = True, device: str | None = None, **overrides: Any
                    ) -> MetalKernel:
    """Refuse f64, prove ``program`` legal for the ``metal`` row, lower it to
    the SIMT form, discharge its obligations and emit MSL (see the module
    docstring). ``device``: ``"gpu"`` (the default on macOS) or
    ``"emulated"`` (elsewhere). ``cache`` is accepted for the backends'
    common signature (nothing is cached)."""
    import sys

    from ..cuda import barrier_obligations, coverage_obligations, resource_obligations
    from ..cuda import tree_obligations
    from ...proofs import gpu
    from ...proofs.obligation import REFUTED

    import time

    t0 = time.perf_counter()
    s = _schedule(program, schedule)
    if overrides:
        s = s.with_(**overrides)
    dev = device or ("gpu" if sys.platform == "darwin" else "emulated")
    if dev not in DEVICES:
        raise TilenestError(f"unknown metal device '{dev}'", hint="use 'gpu' or 'emulated'")
    refuse_f64(program)
    obs = legality(program, s)
    maps: list = []
    k, src = stage_source(program, s, maps)
    res = resource_obligations(k, "metal")
    bad = gpu.never_launchable(res)
    if bad:
        o = bad[0]
        raise TilenestError(f"the metal schedule does not fit a threadgroup: {o.kind}: "
                            f"{o.title}", o.sites or program.loc,
                            "use smaller tiles or fewer threads per program "
                            "(Schedule.block_threads)", notes=tuple(o.counterexample_lines()))
    more = (barrier_obligations(k) + coverage_obligations(maps)
            + tree_obligations(program, maps))
    refuted = [o for o in more if o.status == REFUTED and o.role == "required"]
    if refuted:
        o = refuted[0]
        raise TilenestError(f"the metal lowering is illegal: {o.kind}: {o.title}", o.sites,
                            "this is a bug of the SIMT lowering; please report it with the "
                            "kernel")
    obs = obs + more + res
    if not isinstance(src.index, str | None):
        obs.append(src.index)
    mk = MetalKernel(program, k, s, src, dev, obs, gpu.launch_precondition(res))
    mk.compile_seconds = time.perf_counter() - t0
    return mk


def _emit_schedule(program: TileProgram, s: Schedule) -> str:
    """The schedule and every obligation the compile discharged."""
    mk = compile_program(program, s, device="emulated")
    lines = [repr(s), summary(mk.obligations)]
    lines += [f"  {o.status:8} {o.kind}: {o.title}" for o in mk.obligations
              if o.kind.startswith(("taskmap", "barrier", "shared", "binding", "index"))]
    lines.append(f"launch precondition: {mk.precondition}")
    return "\n".join(lines) + "\n"


def _emit_loopir(program: TileProgram, s: Schedule) -> str:
    return print_kernel(lower_verified(program, s))


def _emit_msl(program: TileProgram, s: Schedule) -> str:
    return stage_source(program, s)[1].text


#: stage name -> printer of that stage's output
STAGES: dict[str, Callable[[TileProgram, Schedule], str]] = {
    "schedule": _emit_schedule,
    "loopir": _emit_loopir,
    "msl": _emit_msl,
}


def emit(program: TileProgram, stage: str, schedule: Schedule | None = None) -> str:
    """The text of one stage for ``program``."""
    from .. import stage_text

    return stage_text("metal", STAGES, program, stage, lambda: _schedule(program, schedule))
