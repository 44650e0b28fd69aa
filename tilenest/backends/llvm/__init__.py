"""The LLVM CPU backend: loop IR -> LLVM IR -> optimized -> MCJIT -> a callable.

Stages (``STAGES``, in order; ``tilenest lower FILE --target llvm --emit NAME``
prints any of them):

* ``schedule`` -- the schedule and the storage plan of intermediates;
* ``tileir``  -- the scheduled TileIR (after the schedule's transforms);
* ``loopir``  -- the lowered, verified loop IR (``tilenest.lowering``);
* ``fused``   -- the loop IR the code generator reads: one thread per program
  (``stage_serial``) and consecutive vector loops fused (``fusion.py``);
* ``ir``      -- LLVM IR as generated (``codegen.py``);
* ``opt``     -- LLVM IR after the O3 new-pass-manager pipeline for the host CPU;
* ``asm``     -- host assembly.

:func:`compile_program` first proves the program legal for the schedule (the
legality gate, :mod:`tilenest.lowering.legality`: race obligations, binding and
reduction obligations; a refuted race is a ``RaceError``), then runs them all
and returns a :class:`~tilenest.backends.llvm.runtime.CompiledKernel` whose
``obligations`` keep the gate's verdicts. Compiled kernels are cached
(:mod:`tilenest.backends.kernelcache`): in this process in a bounded LRU by a
hash of the printed TileIR, the schedule's code-relevant fields and the host
target, and on disk as a whole (object code, call facts, verdicts), so that
a second process compiling the same kernel neither lowers nor proves it.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Callable

from ...lowering import Schedule, default_schedule, lower_verified, print_kernel, verify_kernel
from ...lowering.serialize import serialize_kernel
from ...lowering import loopir as L
from ...lowering.legality import legality, summary
from ...semantics.ir import TileProgram
from .. import kernelcache as KC
from . import jit
from .fusion import fuse_kernel
from .codegen import Codegen
from .runtime import CompiledKernel

__all__ = ["compile_program", "build", "emit", "STAGES", "cache_key", "CompiledKernel",
           "clear_cache"]

VERSION = "llvm-backend-1"


def _schedule(program: TileProgram, schedule: Schedule | None, overrides: dict) -> Schedule:
    s = schedule or default_schedule(program, "llvm")
    return s.with_(**overrides) if overrides else s


def cache_key(program: TileProgram, schedule: Schedule, h: jit.Host) -> str:
    """The in-memory cache key: program text, schedule and target."""
    text = f"{VERSION}\n{h.triple}\n{h.cpu}\n{h.features}\n{schedule.key()}\n{program}"
    return "llvm:" + hashlib.sha256(text.encode()).hexdigest()


def disk_key(program: TileProgram, schedule: Schedule, h: jit.Host) -> str:
    """The whole-kernel disk key (:func:`tilenest.backends.kernelcache.kernel_key`):
    the program, the schedule, the host and the LLVM toolchain."""
    return KC.kernel_key("llvm", program, schedule, [VERSION, *jit.pipeline_key(h)])


def stage_loopir(program: TileProgram, schedule: Schedule) -> L.Kernel:
    return lower_verified(program, schedule)


def stage_serial(k: L.Kernel) -> L.Kernel:
    """``k`` with one thread per program: a SIMT-form kernel's thread loops run
    one thread after another, split at synchronization points
    (``lowering/serialize.py``); other kernels are returned as they are."""
    s = serialize_kernel(k)
    if s is not k:
        verify_kernel(s)
    return s


def stage_fused(k: L.Kernel, schedule: Schedule) -> L.Kernel:
    """The serial kernel ``k`` (:func:`stage_serial`) with its consecutive
    vector loops fused where that is legal and stays vector code
    (:mod:`.fusion`)."""
    aliased = frozenset(n for group in schedule.aliases for n in group)
    return fuse_kernel(k, schedule.vector_bits or 512, aliased)


def stage_ir(k: L.Kernel, schedule: Schedule, h: jit.Host) -> str:
    """LLVM IR of a serial kernel ``k`` (:func:`stage_serial`), its vector
    loops fused first (:func:`stage_fused`)."""
    aliased = frozenset(n for group in schedule.aliases for n in group)
    return Codegen(stage_fused(k, schedule), schedule.vector_bits or 512, h.cpu, h.features,
                   aliased).text()


def build(program: TileProgram, k: L.Kernel, schedule: Schedule,
          host: jit.Host | None = None, cache: bool = True) -> CompiledKernel:
    """Generate, optimize and JIT an already lowered kernel ``k`` (uncached)
    for ``host`` (default: this process's CPU and all its features; another
    host must be one this CPU can run, e.g. the same CPU with features
    turned off)."""
    t0 = time.perf_counter()
    h = host or jit.host()
    k = stage_serial(k)
    text = stage_ir(k, schedule, h)
    obj, opt = jit.compile_object(text, h, jit.target_machine(h), cache)
    return CompiledKernel(program, k, jit.Engine(obj, h, f"module '{program.name}'"), schedule,
                          text, opt, time.perf_counter() - t0, h, object_code=obj)


def compile_program(program: TileProgram, schedule: Schedule | None = None,
                    cache: bool = True, host: jit.Host | None = None,
                    **overrides: Any) -> CompiledKernel:
    """Prove ``program`` legal for this schedule, then lower, generate, optimize
    and JIT it for this host.

    The legality gate (:func:`tilenest.lowering.legality.legality`) discharges
    the program's race obligations and its schedule's binding and reduction
    obligations first: a refuted race obligation raises ``RaceError`` (compiled
    code cannot observe a race while it runs, so it refuses the program), a
    refuted schedule obligation a ``TilenestError``; the verdicts, ``unknown``
    ones included, are kept in the kernel's ``obligations``. ``host`` is as
    for :func:`build`.

    Caching (:mod:`tilenest.backends.kernelcache`): kernels are kept in this
    process (a bounded LRU) by program, schedule and host; whole kernels on
    disk by the same plus the toolchain and tilenest's own source, so that
    another process loads the object code, the call facts and the verdicts
    without lowering or proving (``kernel.cached`` is ``"disk"`` for a kernel
    read from there, None for one compiled here; a hit in memory returns the
    kernel object compiled or read before); object code alone on disk
    by LLVM IR, host and toolchain (``jit.DISK``). ``cache=False`` lowers,
    proves and compiles afresh (and stores the result on disk)."""
    s = _schedule(program, schedule, overrides)
    h = host or jit.host()
    key = cache_key(program, s, h)
    if cache:
        got = KC.MEMORY.get(key)
        if got is not None:
            return got.with_schedule(s)
    t0 = time.perf_counter()
    dkey = disk_key(program, s, h)
    ck = _load(dkey, program, s, h) if cache else None
    if ck is None:
        obs = legality(program, s)
        ck = build(program, stage_loopir(program, s), s, h, cache)
        ck.obligations = obs
        _store(dkey, ck)
    ck.compile_seconds = time.perf_counter() - t0
    if cache:
        KC.MEMORY.put(key, ck, ck.nbytes)
    return ck


def _store(dkey: str, ck: CompiledKernel) -> None:
    """Keep ``ck`` on disk as a whole (see :mod:`tilenest.backends.kernelcache`)."""
    KC.write(dkey, "llvm",
             lambda: {"facts": ck.facts.to_json(),
                      "obligations": [KC.obligation_json(o) for o in ck.obligations]},
             lambda: {"object": ck.object_code, "llvm_ir": ck.llvm_ir.encode(),
                      "optimized": ck.optimized_ir.encode(), "loopir": ck.loopir.encode()})


def _load(dkey: str, program: TileProgram, s: Schedule, h: jit.Host) -> CompiledKernel | None:
    """The kernel of the disk entry ``dkey``, or None (no entry, or a damaged
    or stale one, which is discarded). The object's imported symbols are
    checked before it is loaded, as for a fresh compile."""

    def decode(meta: dict, parts: dict[str, bytes]) -> CompiledKernel:
        facts = KC.CallFacts.from_json(meta["facts"])
        obs = [KC.obligation_of(o) for o in meta["obligations"]]
        obj = parts["object"]
        engine = jit.Engine(obj, h, f"module '{program.name}'")
        ck = CompiledKernel(program, facts, engine, s, parts["llvm_ir"].decode(),
                            parts["optimized"].decode(), 0.0, h, object_code=obj,
                            lower=lambda: stage_serial(stage_loopir(program, s)),
                            loopir=parts["loopir"].decode())
        ck.obligations = obs
        ck.cached = "disk"
        return ck

    return KC.read(dkey, "llvm", decode)


def clear_cache(release: bool = True) -> None:
    """Forget this process's compiled llvm kernels and the legality verdicts,
    and with ``release`` give the memory back (kernels a caller still holds
    keep working)."""
    from ...lowering import legality as LG

    KC.MEMORY.clear("llvm:")
    LG.clear_cache()
    if release:
        KC.release_memory()


def _emit_schedule(program: TileProgram, s: Schedule) -> str:
    from ...lowering import storage_plan

    plan = storage_plan(program, s)
    lines = [repr(s), summary(legality(program, s)), "storage plan:"]
    lines += [f"  %{k}: {v}" for k, v in sorted(plan.items())]
    return "\n".join(lines) + "\n"


def _emit_tileir(program: TileProgram, s: Schedule) -> str:
    from ...lowering.schedule import apply_transforms

    return str(apply_transforms(program, s)[0]) + "\n"


def _emit_loopir(program: TileProgram, s: Schedule) -> str:
    return print_kernel(stage_loopir(program, s))


def _emit_fused(program: TileProgram, s: Schedule) -> str:
    return print_kernel(stage_fused(stage_serial(stage_loopir(program, s)), s))


def _emit_ir(program: TileProgram, s: Schedule) -> str:
    return stage_ir(stage_serial(stage_loopir(program, s)), s, jit.host())


def _emit_opt(program: TileProgram, s: Schedule) -> str:
    return compile_program(program, s).optimized_ir


def _emit_asm(program: TileProgram, s: Schedule) -> str:
    return compile_program(program, s).asm()


#: stage name -> printer of that stage's output
STAGES: dict[str, Callable[[TileProgram, Schedule], str]] = {
    "schedule": _emit_schedule,
    "tileir": _emit_tileir,
    "loopir": _emit_loopir,
    "fused": _emit_fused,
    "ir": _emit_ir,
    "opt": _emit_opt,
    "asm": _emit_asm,
}


def emit(program: TileProgram, stage: str, schedule: Schedule | None = None) -> str:
    """The text of one stage for ``program``."""
    from .. import stage_text

    return stage_text("llvm", STAGES, program, stage, lambda: _schedule(program, schedule, {}))
