"""LLVM target machine, optimization pipeline and MCJIT engine.

The module is optimized with the new pass manager (``create_pass_builder`` with
``create_pipeline_tuning_options(speed_level=3)``, loop vectorization and
unrolling on, the SLP vectorizer off: :data:`SLP_VECTORIZE`) for the host CPU
and its features, then compiled to an object file.
Before MCJIT loads the object, every symbol it imports is checked against the
explicitly bound ones
(:func:`.symbols.check_object`): a module needing anything else is refused
with an ``UnresolvedSymbolError`` naming the symbols, so no call can go
through an unresolved (null) address. The bindings (C math and string
functions from libraries opened explicitly, soft-float helpers compiled from
IR) are made once per process by :func:`init`.

The optimizer is not trusted to keep the module well formed: LLVM's own
passes have been seen to emit IR that does not verify (the SLP vectorizer of
LLVM 22 placed a load after the shuffle using it, on a kernel whose input IR
verified), and the instruction selector aborts the whole process on such IR.
So :func:`optimize` verifies its result and, when it is malformed, optimizes
the unoptimized module again with a more conservative pipeline
(:data:`FALLBACK_PIPELINES`); only verified IR ever reaches code generation.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import llvmlite.binding as llvm

from ...diskcache import Store, key_of
from ...errors import TilenestError
from . import symbols

_LOCK = threading.Lock()
_HOST: list[Host] = []  # this process's CPU, once init() ran


def init() -> None:
    """Initialize the native target once, read this CPU's identity (once: it
    does not change while the process runs, and LLVM takes tens of
    milliseconds to answer) and bind the external symbols compiled code may
    use (:func:`.symbols.bind_all`)."""
    with _LOCK:
        if _HOST:
            return
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        h = Host(llvm.get_process_triple(), llvm.get_host_cpu_name(),
                 llvm.get_host_cpu_features().flatten())
        symbols.bind_all(h.triple, lambda: target_machine(h))
        _HOST.append(h)


@dataclass(frozen=True)
class Host:
    """The CPU code is generated for."""

    triple: str
    cpu: str
    features: str


def host() -> Host:
    """The CPU of this process, with all its features."""
    init()
    return _HOST[0]


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


#: Whether the default pipeline runs LLVM's SLP vectorizer. Off: the
#: differential campaigns found three defects of LLVM 22's SLP vectorizer and
#: no other optimizer defect -- IR that does not verify (a load placed after
#: the shuffle using it), and two silent miscompiles of integer kernels with a
#: fully unrolled strict fold followed by sums over the same tile (wrong
#: outputs, no error; ``tests/test_llvm_crash_regressions.py``). Nothing
#: depends on it for speed: the ``for.vector`` loops the lowering marks (the
#: ``mma`` micro-kernel among them) are emitted as explicit vector IR
#: (``vector.py``) and the rest are left to the loop vectorizer.
SLP_VECTORIZE = False

#: pipeline variants tried, in order, when the previous one produced IR that
#: does not verify: (name, loop vectorization, SLP vectorization, loop unrolling)
FALLBACK_PIPELINES: tuple[tuple[str, bool, bool, bool], ...] = (
    ("without vectorizers or unrolling", False, False, False),
)


def _run_pipeline(mod: llvm.ModuleRef, tm: llvm.TargetMachine, level: int, loop_vec: bool,
                  slp: bool, unroll: bool) -> None:
    """Run the O``level`` pipeline on ``mod``, then free the pipeline.

    The pass manager is freed explicitly (:func:`_dispose_pass_manager`):
    llvmlite 0.50's ``ModulePassManager`` never frees its passes on
    ``close()``, which cost about 80 KiB of native memory per optimized
    module for the life of the process. A fresh pass builder per run, rather
    than one shared, because a run registers instrumentation callbacks into
    its builder that point into that run's stack frame."""
    pto = llvm.create_pipeline_tuning_options(speed_level=level)
    pb = None
    mpm = None
    try:
        pto.loop_vectorization = loop_vec
        pto.slp_vectorization = slp
        pto.loop_unrolling = unroll
        pb = llvm.create_pass_builder(tm, pto)
        mpm = pb.getModulePassManager()
        mpm.run(mod, pb)
    finally:
        if mpm is not None:
            _dispose_pass_manager(mpm)
        if pb is not None:
            pb.close()
        pto.close()


def _dispose_pass_manager(mpm: llvm.ModulePassManager) -> None:
    """Free a module pass manager and every pass it holds.

    ``ModulePassManager`` lists ``ffi.ObjectRef`` before the mixin that knows
    how to free it, so its ``close()`` resolves to the base class's no-op and
    the passes are leaked. The dispose entry point is called here directly
    (once: ``detach`` marks the reference closed); should a later llvmlite
    order its bases the other way, ``close()`` frees it and this does the
    same."""
    if mpm.closed:
        return
    if type(mpm)._dispose is llvm.ffi.ObjectRef._dispose:
        llvm.ffi.lib.LLVMPY_DisposeNewModulePassManger(mpm)
        mpm.detach()
    else:
        mpm.close()


def _verify_error(mod: llvm.ModuleRef) -> str | None:
    """The verifier's message for ``mod``, or None when it is well formed."""
    try:
        mod.verify()
    except RuntimeError as e:
        return str(e)
    return None


def optimize(mod: llvm.ModuleRef, tm: llvm.TargetMachine, level: int = 3) -> llvm.ModuleRef:
    """Run the O``level`` pipeline of the new pass manager on ``mod`` and return
    the optimized module (``mod`` itself when the pipeline left it well formed).

    Postcondition: the result verifies. When the full pipeline breaks the
    module, the unoptimized module is optimized again under each of
    :data:`FALLBACK_PIPELINES` in turn and the first verified result is
    returned (``mod`` is then closed); if none verifies, an internal
    ``TilenestError`` is raised (never an abort in code generation)."""
    original = mod.clone()
    try:
        _run_pipeline(mod, tm, level, level >= 2, SLP_VECTORIZE and level >= 2, True)
        err = _verify_error(mod)
        out = mod
        for _name, loop_vec, slp, unroll in FALLBACK_PIPELINES if err else ():
            retry = original.clone()
            _run_pipeline(retry, tm, level, loop_vec and level >= 2, slp and level >= 2, unroll)
            if _verify_error(retry) is None:
                mod.close()
                out, err = retry, None
                break
            retry.close()
        if err is not None:
            raise TilenestError(
                f"internal: the LLVM optimizer made module '{mod.name}' malformed: {err}",
                hint="a bug of LLVM's optimizer; every fallback pipeline failed too")
    finally:
        original.close()
    out.data_layout = str(tm.target_data)
    return out


#: optimized object code on disk (``tilenest.diskcache``), shared by processes
DISK = Store("llvm")
#: the object code of tilenest's own runtime modules (the native worker
#: loop), kept apart from the kernels' so each store counts one kind
RUNTIME_DISK = Store("llvm-runtime", per_program=False)


def pipeline_key(h: Host) -> list:
    """What the object code of a module depends on besides its IR: the host
    (triple, CPU, features), llvmlite and LLVM versions, and the pipeline."""
    import llvmlite

    return [h.triple, h.cpu, h.features, llvmlite.__version__,
            list(llvm.llvm_version_info), SLP_VECTORIZE, [list(f) for f in FALLBACK_PIPELINES]]


def compile_object(text: str, h: Host, tm: llvm.TargetMachine,
                   cache: bool = True, store: Store = DISK) -> tuple[bytes, str]:
    """``(object code, optimized IR text)`` of the LLVM IR ``text`` for ``h``:
    parsed, optimized (:func:`optimize`) and compiled, or read from ``store``
    (:data:`DISK`) when this IR was compiled for this host and toolchain
    before (not with ``cache=False``: compiled afresh, and stored)."""
    key = key_of(["llvm-object", text, *pipeline_key(h)])
    got = store.get(key) if cache else None
    if got is not None:
        _, parts = got
        return parts["object"], parts["optimized"].decode()
    mod = optimize(parse(text, h), tm)
    opt = str(mod)
    obj = tm.emit_object(mod)
    mod.close()
    store.put(key, {}, {"object": obj, "optimized": opt.encode()})
    return obj, opt


class Engine:
    """An MCJIT engine running one compiled object; ``address(name)`` gives a
    compiled function's entry point.

    The object's imported symbols must all be bound (else
    ``UnresolvedSymbolError``, before anything is loaded), then the object is
    loaded into an engine of its own and linked."""

    def __init__(self, obj: bytes, h: Host, what: str = "module"):
        symbols.check_object(obj, what)
        empty = llvm.parse_assembly("")
        empty.triple = h.triple
        self.tm = target_machine(h)  # the engine owns its target machine
        with _LOCK:
            self.ee = llvm.create_mcjit_compiler(empty, self.tm)
            self.ee.add_object_file(llvm.ObjectFileRef.from_data(obj))
            self.ee.finalize_object()

    @classmethod
    def of_module(cls, mod: llvm.ModuleRef, tm: llvm.TargetMachine,
                  h: Host | None = None) -> Engine:
        """The engine of a module, compiled to an object with ``tm``."""
        return cls(tm.emit_object(mod), h or host(), f"module '{mod.name}'")

    def address(self, name: str) -> int:
        a = self.ee.get_function_address(name)
        if not a:
            raise TilenestError(f"internal: JIT has no function {name}")
        return a


def asm(mod: llvm.ModuleRef, tm: llvm.TargetMachine) -> str:
    return tm.emit_assembly(mod)
