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
runs on ``device``: ``"emulated"`` (the default off macOS) runs the MSL on
the host emulator (:mod:`.emulated`: the SIMT emulator's ``metal`` dialect,
no NVRTC, every thread interleaving policy); ``"gpu"`` (the default on
macOS) runs it through Metal's runtime (:mod:`.runtime`, pyobjc; off macOS
a call raises the runtime's :class:`~tilenest.errors.NotAvailableError`).
"""

from __future__ import annotations

from typing import Any, Callable

from ...errors import NotAvailableError, TilenestError
from ...lowering import Schedule, lower_verified, print_kernel
from ...lowering.legality import legality, summary
from ...lowering.schedule import for_target
from ...lowering.simt_trees import TreePlacement
from ...semantics.ir import TileProgram
from ...semantics import expr as E
from ...semantics.signature import order_arguments, stored_tensors
from ..calls import ArgumentBinder, scratch_arrays
from .emit import MetalSource, emit_msl, standalone
from .nodouble import refuse_f64

__all__ = ["compile_program", "emit", "STAGES", "MetalKernel", "require_host_run",
           "stage_source", "standalone"]

#: the devices a Metal kernel can be asked to run on
DEVICES = ("gpu", "emulated")


def require_host_run() -> None:
    """Raise :class:`~tilenest.errors.NotAvailableError` unless this machine
    can run metal kernels on the emulated device (the registry row's
    ``host_run``): a host C++ compiler (no GPU toolkit is needed)."""
    import os
    import shutil

    cxx = os.environ.get("TILENEST_CXX", "g++")
    if not shutil.which(cxx):
        raise NotAvailableError(f"the metal target's emulated device needs {cxx}, which this "
                                "machine lacks", hint="install g++ (or set TILENEST_CXX), or "
                                "fuzz --targets llvm")


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


class MetalKernel(ArgumentBinder):
    """A compiled Metal kernel: the program, its SIMT-form kernel, schedule,
    MSL source and every obligation discharged, and ``precondition``, the
    launch precondition left by the resource limits. Call it like the
    interpreter (arrays written in place; returns the tensors it stores to).
    On ``device="emulated"`` the MSL runs on the host emulator
    (:mod:`.emulated`); on ``"gpu"`` it needs a Mac (see the module docstring)."""

    def __init__(self, program: TileProgram, kernel: Any, schedule: Schedule,
                 source: MetalSource, device: str, obligations: list, precondition: Any):
        from ..kernelcache import CallFacts

        self.program = program
        self.kernel = kernel
        #: what a call needs of the loop IR
        self.facts = CallFacts.of(kernel)
        self.schedule = schedule
        self.source = source
        self.device = device
        self.obligations = obligations
        self.precondition = precondition
        self.stored = stored_tensors(program)
        #: reduce op id -> the fixed tree the kernel evaluates that
        #: custom-contract reduction in (validation passes it to the reference)
        self.trees: dict = {}
        #: the precondition of 32-bit index code (None: nothing to check per call)
        self.index_precondition: Any = None
        #: seconds the compile took (proofs, lowering, emission)
        self.compile_seconds = 0.0
        #: where it came from (nothing is cached on metal)
        self.cached: str | None = None
        self._emu: Any = None
        #: on ``device="gpu"``: the runtime's compiled library (made on the first call)
        self._gpu: Any = None
        self._calls = 0

    @property
    def text(self) -> str:
        """The one-string source Metal's runtime compiles (:func:`standalone`)."""
        return standalone(self.source.text)

    @property
    def interleavings(self) -> tuple[dict, ...] | None:
        """On the emulator: the keyword arguments of one call under each
        thread interleaving policy (each with another poison); ``None`` on a GPU."""
        if self.device != "emulated":
            return None
        from ..simt.emulator import POISONS, POLICIES

        return tuple({"policy": p, "poison": POISONS[i % len(POISONS)], "seed": i}
                     for i, p in enumerate(POLICIES))

    def __repr__(self) -> str:
        return f"<MetalKernel {self.program.name} on {self.device}>"

    def variant(self, aliases: tuple[tuple[str, ...], ...], strided: tuple[str, ...] = (),
                index_bits: int | None = None) -> MetalKernel:
        """This kernel compiled for a call whose parameters alias as ``aliases``,
        whose ``strided`` parameters are strided views, with ``index_bits`` of
        index arithmetic (default: this kernel's)."""
        s = self.schedule.with_(aliases=aliases, strided=strided,
                                index_bits=index_bits or self.schedule.index_bits)
        return compile_program(self.program, s, device=self.device)

    def index_fits(self, syms: dict[str, int]) -> bool:
        """Whether the 32-bit index arithmetic is exact for these sizes."""
        pc = self.index_precondition
        return pc is None or pc.holds({s: int(syms[s]) for s in self.facts.syms})

    def launches(self, syms: dict[str, int]) -> list[tuple[Any, int, int]]:
        """``(kernel info, threadgroups, threadgroup memory bytes)`` of every
        dispatch of a call with these symbol values, in order (phases with no
        programs left out), after checking the launch precondition."""
        k = self.facts
        if self.precondition is not None:
            self.precondition.check({s: int(syms[s]) for s in k.syms})
        env: dict[E.Expr, Any] = {E.Sym(s): int(syms[s]) for s in k.syms}
        out = []
        for info in self.source.kernels:
            n = int(E.evaluate(info.programs, env))
            if n <= 0:
                continue
            if info.grid_cap is not None:  # grid-stride threadgroups
                n = min(n, info.grid_cap)
            out.append((info, n, int(E.evaluate(info.shared_bytes, env))))
        return out

    def __call__(self, *arrays: Any, params: dict[str, int] | None = None,
                 policy: str | None = None, seed: int | None = None, poison: str | None = None,
                 **named: Any) -> Any:
        """Run the kernel. On the emulator, ``policy``/``seed``/``poison`` pick
        the interleaving and the poison; left out, successive calls rotate
        through every policy and poison (call ``n``: policy ``n mod 4``,
        poison ``n mod 3``, seed ``n``). On ``device="gpu"`` the call runs
        through :func:`.runtime.run` and takes none of the three."""
        from ..simt.emulator import POISONS, POLICIES
        from . import emulated, runtime

        gpu = self.device != "emulated"
        if gpu and (policy, seed, poison) != (None, None, None):
            raise TilenestError("policy, seed and poison choose an emulated run",
                                hint="leave them out on device='gpu'")
        n = self._calls
        self._calls += 1
        policy = policy or POLICIES[n % len(POLICIES)]
        poison = poison or POISONS[n % len(POISONS)]
        seed = n if seed is None else seed
        arrays, params = order_arguments(self.program, arrays, named, params)
        keep, syms = self.bind(arrays, params)
        groups, strided = self.aliases(keep), self.strided(keep)
        fits = self.index_fits(syms)
        if groups != self.schedule.aliases or strided != self.schedule.strided or not fits:
            v = self.variant(groups, strided, None if fits else 64)
            if gpu:
                return v(*arrays, params=params)
            return v(*arrays, params=params, policy=policy, seed=seed, poison=poison)
        keep = keep + scratch_arrays(self.facts, len(keep), syms)
        values = {s: int(syms[s]) for s in self.facts.syms}
        if gpu:
            runtime.run(self, keep, values)
        else:
            emulated.run(self, keep, values, policy, seed, poison)
        outs = [a for v, a in zip(self.program.args, arrays, strict=True)
                if v.name in self.stored]
        return outs[0] if len(outs) == 1 else tuple(outs)


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
    mk.trees = {**dict(k.trees), **{m.oid: m.tree for m in maps if isinstance(m, TreePlacement)}}
    mk.index_precondition = _index_precondition(src)
    mk.compile_seconds = time.perf_counter() - t0
    return mk


def _index_precondition(src: MetalSource) -> Any:
    """What a call of ``src`` must check for its index width (None: nothing)."""
    from ...proofs.obligation import PROVED

    if src.index_bits == 64 or src.index.status == PROVED:
        return None
    return src.index.witness["precondition"]


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
