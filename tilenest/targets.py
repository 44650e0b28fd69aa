"""The target registry: one row per code-generation target.

A row (:class:`Target`) holds every fact about a target that a layer above
the backends needs:

* ``profile`` (:class:`Profile`) -- the device's shape and limits: whether
  programs run as blocks of cooperating threads (``simt``), the lane width
  of a warp or simdgroup, threads per block, shared (threadgroup) memory per
  block, f64 support, its asynchronous-copy and matrix-unit kinds, the width
  of index arithmetic;
* ``defaults`` -- the schedule fields the target sets beyond the common
  automatic choice (``lowering.schedule.default_schedule`` applies them
  once), and ``unused`` -- the schedule fields it never reads (setting one is
  refused);
* ``catalogue`` (:class:`Catalogue`) -- its execution scopes, their
  containment order and limits, which the binding obligations of the proofs
  layer are stated against (``proofs/bindings.py``);
* ``module`` -- the backend module holding its stages (``compile_program``,
  ``emit``, ``STAGES``), imported only when the target compiles; ``None``
  for a target whose code generation does not exist yet (its catalogue is
  still checked by ``tilenest check --target``).

Where it sits: the layering runs ``semantics`` <- ``proofs`` <- ``lowering``
<- ``backends``, and the facts of a row are read by all of them (bindings by
the proofs, defaults and limits by the lowering, stages by the backends).
So the registry is a leaf beside ``errors``: this module imports nothing of
tilenest but :mod:`tilenest.errors`, holds only data, and names each
backend by its module path, so that reading a profile never imports a
backend. Adding a target is adding a row here and a folder under
``backends/``; no layer compares a target's name.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .errors import NotAvailableError, UsageError

#: lanes of a warp in the SIMT form the lowering builds (``lowering/simt.py``:
#: shuffles, warp tiles and tree levels are 32 lanes wide); a SIMT row must
#: have this lane width until the form takes it as a parameter
SIMT_LANES = 32
#: the most threads per program of the SIMT form (also when the CPU runs it
#: serialized); a SIMT row may allow fewer, never more
SIMT_MAX_THREADS = 1024


@dataclass(frozen=True)
class Catalogue:
    """A target's execution-scope catalogue for the binding obligations
    (``tile/execution.md``; ``spec/obligations.md`` O-7): its scopes, their
    containment partial order (given by covering pairs, closed transitively;
    never by the order of the names), the most instances of a scope per
    instance of an enclosing one, aliases (``subgroup = warp``...) and the
    scopes ``bind`` assigns by depth when nothing is bound."""

    name: str
    scopes: tuple[str, ...]
    covers: frozenset[tuple[str, str]]
    limits: Mapping[tuple[str, str], int] = field(default_factory=dict)
    aliases: Mapping[str, str] = field(default_factory=dict)
    auto: tuple[str, ...] = ()

    def canon(self, s: str) -> str | None:
        """The scope ``s`` names in this catalogue (through an alias), or None."""
        s = self.aliases.get(s, s)
        return s if s in self.scopes else None

    def contains(self, a: str, b: str) -> bool:
        """``a`` strictly contains ``b`` (transitive closure of the covers)."""
        todo, seen = [a], set()
        while todo:
            x = todo.pop()
            for p, c in self.covers:
                if p == x and c not in seen:
                    if c == b:
                        return True
                    seen.add(c)
                    todo.append(c)
        return False

    @staticmethod
    def custom(name: str, scopes: tuple[str, ...], covers: list[tuple[str, str]],
               limits: Mapping[tuple[str, str], int] | None = None,
               auto: tuple[str, ...] = ()) -> Catalogue:
        """A custom catalogue, e.g. an accelerator with incomparable engines."""
        return Catalogue(name, tuple(scopes), frozenset(covers), dict(limits or {}), {}, auto)


@dataclass(frozen=True)
class Profile:
    """What a target's device is, as the layers above the backends need it.

    ``simt``: each program runs as a block of ``block_threads`` cooperating
    threads (the SIMT form is always used; storage planning recomputes cheap
    values rather than spend shared memory); otherwise a program runs on one
    core. ``lanes``: threads of a warp / simdgroup (1: no lockstep group).
    ``max_threads``: threads per block. ``shared_bytes``: shared
    (threadgroup) memory one block may use, with the opt-in to dynamic shared
    memory where the device has one; ``static_shared_bytes``: what a block
    gets without that opt-in; ``sm_shared_bytes``: shared memory of one
    multiprocessor (what resident blocks divide, occupancy);
    ``reserved_shared_bytes``: what the system takes from each block of it.
    ``registers_per_block``: 32-bit registers the threads of one block
    share. ``max_grid``: blocks of one launch. ``f64``: the device computes in
    double. ``fp8``: the backend compiles the FP8 storage formats (V-24).
    ``async_copy`` and ``tensor_cores``: the asynchronous
    global-to-shared copies and the matrix-unit instructions the backend can
    use (by name; empty: none). ``index_bits``: the narrowest index width
    the generated code may use (it widens a call that needs more).
    """

    simt: bool
    lanes: int
    max_threads: int
    shared_bytes: int
    static_shared_bytes: int
    f64: bool
    index_bits: int
    max_grid: int
    fp8: bool = False
    sm_shared_bytes: int = 0
    reserved_shared_bytes: int = 0
    registers_per_block: int = 0
    async_copy: tuple[str, ...] = ()
    tensor_cores: tuple[str, ...] = ()


@dataclass(frozen=True)
class Target:
    """One registry row (see the module docstring)."""

    name: str
    about: str
    profile: Profile
    catalogue: Catalogue
    defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: schedule fields set after ``defaults`` for a program with no ``mma``
    #: (a row or elementwise kernel): the choice that measured best on the
    #: target's device for such kernels (``lowering.default_schedule``)
    stream_defaults: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    unused: tuple[str, ...] = ()
    module: str | None = None
    #: compile options that run the target's code on this machine without
    #: its device (the fuzzer's runs); empty: it always runs here
    host_run: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    #: the benchmark script of a source checkout that times the target
    #: (None: ``tilenest bench`` times it in process)
    bench_script: str | None = None
    #: the module whose ``tune`` searches the target's schedules on its
    #: device (``tn.tune``; None: the target has no tuner)
    tuner: str | None = None
    #: whether its compiled kernels run (on the device, or here as
    #: ``host_run`` says); False: code generation and proofs only, so the
    #: fuzzer does not draw it
    runs: bool = True

    @property
    def compiles(self) -> bool:
        """Whether the target has code generation (a backend module)."""
        return self.module is not None

    def load(self) -> Any:
        """The backend module (imported now); an error for a target without one."""
        if self.module is None:
            raise NotAvailableError(f"no code generation for target '{self.name}' yet",
                                    hint="targets that compile: " + ", ".join(compiling()))
        return importlib.import_module(self.module)

    def compile(self, program: Any, schedule: Any = None, **kw: Any) -> Any:
        """``program`` compiled for this target (the backend's ``compile_program``)."""
        return self.load().compile_program(program, schedule, **kw)

    def emit(self, program: Any, stage: str, schedule: Any = None) -> str:
        """The text of one stage of ``program`` (the backend's ``emit``)."""
        return self.load().emit(program, stage, schedule)

    def stages(self) -> tuple[str, ...]:
        """The names of the backend's printable stages, in order."""
        return tuple(self.load().STAGES)


def _frozen(**kw: Any) -> Mapping[str, Any]:
    return MappingProxyType(dict(kw))


#: CUDA's scopes: clusters of blocks of warps of threads
CUDA_CATALOGUE = Catalogue(
    "cuda", ("cluster", "block", "warp", "thread"),
    frozenset({("cluster", "block"), ("block", "warp"), ("warp", "thread")}),
    {("cluster", "block"): 8, ("block", "warp"): SIMT_MAX_THREADS // SIMT_LANES,
     ("warp", "thread"): SIMT_LANES, ("block", "thread"): SIMT_MAX_THREADS},
    {"subgroup": "warp"}, ("block", "warp", "thread"))
#: Metal's scopes under CUDA's names: threadgroup = block, simdgroup = warp
METAL_CATALOGUE = Catalogue(
    "metal", ("block", "warp", "thread"),
    frozenset({("block", "warp"), ("warp", "thread")}),
    {("block", "warp"): SIMT_MAX_THREADS // SIMT_LANES, ("warp", "thread"): SIMT_LANES,
     ("block", "thread"): SIMT_MAX_THREADS},
    {"threadgroup": "block", "simdgroup": "warp", "subgroup": "warp"},
    ("block", "warp", "thread"))
#: the host CPU's scopes: cores, each with vector lanes
CPU_CATALOGUE = Catalogue("cpu", ("core", "vector"), frozenset({("core", "vector")}),
                          {("core", "vector"): 16}, {}, ("core", "vector"))

LLVM = Target(
    "llvm", "the host CPU through LLVM (JIT)",
    Profile(simt=False, lanes=1, max_threads=SIMT_MAX_THREADS, shared_bytes=0,
            static_shared_bytes=0, f64=True, index_bits=64, max_grid=2**63 - 1, fp8=True),
    CPU_CATALOGUE,
    unused=("index_bits", "min_blocks", "cache_hints", "grid_blocks", "row_registers", "tma",
            "warp_roles"),
    module="tilenest.backends.llvm")
CUDA = Target(
    "cuda", "NVIDIA GPUs (sm_90a) through CUDA C++ and NVRTC; on a GPU, or on the host "
            "emulator",
    # sm_90: 227 KiB of shared memory per block with the dynamic opt-in, 48 KiB
    # without; 228 KiB per multiprocessor, 1 KiB of it reserved per block
    Profile(simt=True, lanes=SIMT_LANES, max_threads=SIMT_MAX_THREADS,
            shared_bytes=227 * 1024, static_shared_bytes=48 * 1024, f64=True, index_bits=32,
            max_grid=2**31 - 1, sm_shared_bytes=228 * 1024, reserved_shared_bytes=1024,
            registers_per_block=65536, fp8=True,
            async_copy=("cp.async", "tma"), tensor_cores=("mma.sync", "wgmma")),
    CUDA_CATALOGUE,
    # operand tiles of warpgroup mmas by bulk tensor copies: validated on an
    # H100, 1.3-1.4x the GEMM rate of cp.async copies (spec/lowering.md L-11);
    # the ring's depth and warp roles left to the lowering (a ring it can
    # warp-specialize is, 4 versions deep where they fit; others keep 2)
    defaults=_frozen(block_threads=256, stages=None, warp_roles=None, tma=True),
    # rows kept in registers and L2 policies: the fastest row kernels on an
    # H200 (spec/lowering.md, L-7's defaults)
    stream_defaults=_frozen(row_registers=32, cache_hints=True),
    unused=("threads", "chunk"),
    module="tilenest.backends.cuda",
    host_run=_frozen(device="emulated"),
    bench_script="benchmarks/cuda.py",
    tuner="tilenest.backends.cuda.tune")
METAL = Target(
    "metal", "Apple GPUs through the Metal Shading Language; here, the MSL on the host "
             "emulator",
    # Apple GPUs: 32 KiB of threadgroup memory, 1,024 threads per threadgroup,
    # no double
    Profile(simt=True, lanes=SIMT_LANES, max_threads=SIMT_MAX_THREADS,
            shared_bytes=32 * 1024, static_shared_bytes=32 * 1024, f64=False, index_bits=32,
            max_grid=2**32 - 1, tensor_cores=("simdgroup_matrix",)),
    METAL_CATALOGUE,
    defaults=_frozen(block_threads=256),
    unused=("threads", "chunk", "tma", "warp_roles"),
    module="tilenest.backends.metal",
    host_run=_frozen(device="emulated"))

#: the registry: target name -> row, in the order targets are listed
TARGETS: dict[str, Target] = {t.name: t for t in (LLVM, CUDA, METAL)}


def register(row: Target) -> Target:
    """Add ``row`` to the registry (an error for a name already there, or a
    SIMT row the SIMT lowering cannot serve: a lane width other than
    :data:`SIMT_LANES`, more than :data:`SIMT_MAX_THREADS` threads)."""
    if row.name in TARGETS:
        raise UsageError(f"target '{row.name}' is registered already",
                         hint="pick another name")
    p = row.profile
    if p.simt and (p.lanes != SIMT_LANES or p.max_threads > SIMT_MAX_THREADS):
        raise UsageError(f"target '{row.name}': the SIMT lowering builds warps of "
                         f"{SIMT_LANES} lanes and at most {SIMT_MAX_THREADS} threads per block",
                         hint=f"lanes={SIMT_LANES}, max_threads <= {SIMT_MAX_THREADS}")
    TARGETS[row.name] = row
    return row


def row(name: str) -> Target:
    """The registry row of ``name`` (an error listing the targets otherwise)."""
    t = TARGETS.get(name)
    if t is None:
        raise NotAvailableError(f"no target '{name}'", hint="targets: " + ", ".join(TARGETS))
    return t


def profile(name: str) -> Profile:
    """The device profile of target ``name``."""
    return row(name).profile


def compiling() -> tuple[str, ...]:
    """The names of the targets with code generation, in registry order."""
    return tuple(n for n, t in TARGETS.items() if t.compiles)


def compiler(name: str) -> Target:
    """The row of a target that compiles: an error naming the targets that do
    for an unknown name or a target without code generation."""
    t = TARGETS.get(name)
    if t is None or not t.compiles:
        what = f"no code generation for target '{name}'" + (" yet" if t is not None else "")
        raise NotAvailableError(what,
                                hint="targets that compile: " + ", ".join(compiling()))
    return t


def catalogue(name: str) -> Catalogue:
    """The binding catalogue of a target, by the target's name or the
    catalogue's own (``cpu`` is the ``llvm`` row's); an error listing them."""
    for t in TARGETS.values():
        if name in (t.name, t.catalogue.name):
            return t.catalogue
    raise NotAvailableError(f"no binding catalogue '{name}'",
                            hint="catalogues: " + ", ".join(catalogue_names()))


def catalogue_names() -> tuple[str, ...]:
    """Every name :func:`catalogue` accepts: each row's name, then its
    catalogue's name where that differs."""
    out: list[str] = []
    for t in TARGETS.values():
        for n in (t.name, t.catalogue.name):
            if n not in out:
                out.append(n)
    return tuple(out)
