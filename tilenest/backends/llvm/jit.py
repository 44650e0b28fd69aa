"""LLVM target machine, optimization pipeline and MCJIT engine.

The module is optimized with the new pass manager (``create_pass_builder`` with
``create_pipeline_tuning_options(speed_level=3)``, loop and SLP vectorization
on) for the host CPU and its features, then compiled to an object file.
Before MCJIT loads the object, every symbol it imports is checked against the
explicitly bound ones
(:func:`.symbols.check_object`): a module needing anything else is refused
with an ``UnresolvedSymbolError`` naming the symbols, so no call can go
through an unresolved (null) address. The bindings (C math and string
functions from libraries opened explicitly, soft-float helpers compiled from
IR) are made once per process by :func:`init`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import llvmlite.binding as llvm

from ...errors import TilenestError
from . import symbols

_LOCK = threading.Lock()
_READY = False


def init() -> None:
    """Initialize the native target once and bind the external symbols compiled
    code may use (:func:`.symbols.bind_all`)."""
    global _READY
    with _LOCK:
        if _READY:
            return
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        h = Host(llvm.get_process_triple(), llvm.get_host_cpu_name(),
                 llvm.get_host_cpu_features().flatten())
        symbols.bind_all(h.triple, lambda: target_machine(h))
        _READY = True


@dataclass(frozen=True)
class Host:
    """The CPU code is generated for."""

    triple: str
    cpu: str
    features: str


def host() -> Host:
    init()
    return Host(llvm.get_process_triple(), llvm.get_host_cpu_name(),
                llvm.get_host_cpu_features().flatten())


def target_machine(h: Host) -> llvm.TargetMachine:
    t = llvm.Target.from_triple(h.triple)
    return t.create_target_machine(cpu=h.cpu, features=h.features, opt=3, codemodel="jitdefault")


def parse(text: str, h: Host) -> llvm.ModuleRef:
    """Parse and verify LLVM assembly (an internal error if it is malformed)."""
    init()
    try:
        mod = llvm.parse_assembly(text)
        mod.triple = h.triple
        mod.verify()
    except RuntimeError as e:
        raise TilenestError(f"internal: generated LLVM IR does not verify: {e}") from None
    return mod


def optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine, level: int = 3) -> None:
    """Run the O``level`` pipeline of the new pass manager on ``mod`` in place."""
    pto = llvm.create_pipeline_tuning_options(speed_level=level)
    pto.loop_vectorization = level >= 2
    pto.slp_vectorization = level >= 2
    pto.loop_unrolling = True
    pb = llvm.create_pass_builder(tm, pto)
    mpm = pb.getModulePassManager()
    mpm.run(mod, pb)
    mod.data_layout = str(tm.target_data)


class Engine:
    """An MCJIT engine running one optimized module; ``address(name)`` gives a
    compiled function's entry point.

    The module is compiled to an object file once; the object's imported
    symbols must all be bound (else ``UnresolvedSymbolError``, before anything
    is loaded), then the object is loaded into an engine of its own and
    linked."""

    def __init__(self, mod: llvm.ModuleRef, tm: llvm.TargetMachine, h: Host | None = None):
        self.tm = tm
        self.mod = mod
        obj = tm.emit_object(mod)
        symbols.check_object(obj, f"module '{mod.name}'")
        empty = llvm.parse_assembly("")
        empty.triple = mod.triple
        own_tm = target_machine(h or host())  # the engine owns its target machine
        with _LOCK:
            self.ee = llvm.create_mcjit_compiler(empty, own_tm)
            self.ee.add_object_file(llvm.ObjectFileRef.from_data(obj))
            self.ee.finalize_object()

    def address(self, name: str) -> int:
        a = self.ee.get_function_address(name)
        if not a:
            raise TilenestError(f"internal: JIT has no function {name}")
        return a


def asm(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> str:
    return tm.emit_assembly(mod)
