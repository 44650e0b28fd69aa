"""The CUDA backend: loop IR (SIMT form) -> CUDA C++ -> NVRTC sm_90a cubin.

Stages (``STAGES``; ``tilenest lower FILE --target cuda --emit NAME``):

* ``schedule``       -- the schedule and its legality verdicts;
* ``loopir``         -- the SIMT-form loop IR (``lowering/simt.py``);
* ``cuda``           -- the CUDA C++ source (``emit.py``, with ``prelude/``);
* ``ptx``            -- the PTX NVRTC generates for it;
* ``sass-resources`` -- the ptxas report of each ``__global__`` function
  (registers, spills, shared and stack bytes).

:func:`compile_program` proves the program legal (the legality gate with
the CUDA binding catalogue: each top-level ``parallel`` instance a block),
lowers it, discharges the SIMT form's own obligations (the exact coverage of
every distribution's task map and barrier sufficiency -- refuted: the
lowering is illegal -- and the resource limits, which leave a launch
precondition), emits
and compiles the source, and returns a
:class:`~tilenest.backends.cuda.runtime.CudaKernel` that runs on a GPU
(``device="gpu"``) or on the host emulator (``device="emulated"``; the
default where no GPU is usable). Compiled kernels are cached
(:mod:`tilenest.backends.kernelcache`): in this process in a bounded LRU, and
on disk as a whole (cubin, source, call and launch facts, every verdict, the
launch precondition), so that a second process compiling the same kernel
neither lowers, proves nor runs NVRTC.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any, Callable

from ...errors import TilenestError
from ...lowering import Schedule, lower_verified, print_kernel
from ...lowering.schedule import for_target
from ...lowering.legality import legality, summary
from ...semantics import expr as E
from ...semantics.ir import TileProgram
from .. import kernelcache as KC
from ...lowering.simt_trees import TreePlacement
from ...semantics.trees import tree_from_json
from .emit import CudaKernelInfo, CudaSource, emit_cuda
from .runtime import CudaKernel, gpu_available
from .tensormaps import MapSpec
from ...targets import CUDA as CUDA_ROW

__all__ = ["compile_program", "emit", "STAGES", "CudaKernel", "prelude_dir", "prelude_dirs",
           "prelude_files", "gpu_available", "clear_cache", "device_available",
           "require_host_run"]

VERSION = "cuda-backend-1"
ARCH = "sm_90a"


def prelude_dir() -> str:
    """The folder of ``tn_prelude.cuh``, CUDA's own prelude; it includes the
    portable ``tn_scalar.h`` of ``backends/simt/prelude``, so a compile
    searches both folders (:func:`prelude_dirs`)."""
    return os.path.join(os.path.dirname(__file__), "prelude")


def prelude_dirs() -> tuple[str, ...]:
    """The include path of a generated CUDA source: CUDA's prelude folder,
    then the portable SIMT prelude's (``backends/simt/prelude``)."""
    from ..simt import prelude_dir as simt_prelude_dir

    return (prelude_dir(), simt_prelude_dir())


def prelude_files() -> tuple[str, ...]:
    """Every header of the include path (:func:`prelude_dirs`), in order."""
    return tuple(str(f) for d in prelude_dirs() for f in sorted(Path(d).iterdir())
                 if f.suffix in (".h", ".cuh"))


def _schedule(program: TileProgram, schedule: Schedule | None) -> Schedule:
    """The schedule to compile with: the given one made a ``cuda`` schedule,
    or the row's default (``lowering.schedule.for_target``)."""
    return for_target(program, schedule, "cuda")


def device_available() -> bool:
    """Whether a CUDA GPU can be used here (``runtime.gpu_available``, looked
    up at each call)."""
    from . import runtime

    return runtime.gpu_available()


def require_host_run() -> None:
    """Raise :class:`~tilenest.errors.NotAvailableError` unless this machine
    can run cuda kernels on the emulated device (the ``host_run`` of the
    registry row): NVRTC and a host C++ compiler."""
    import shutil

    from ...errors import NotAvailableError
    from .nvrtc import nvrtc_available

    cxx = os.environ.get("TILENEST_CXX", "g++")
    missing = [w for w, ok in (("NVRTC", nvrtc_available()), (cxx, shutil.which(cxx)))
               if not ok]
    if missing:
        raise NotAvailableError(f"the cuda target needs {' and '.join(missing)}, which this "
                                "machine lacks", hint="install the NVRTC wheels of "
                                "pyproject.toml and g++ (or set TILENEST_CXX), or fuzz "
                                "--targets llvm")


def stage_source(program: TileProgram, s: Schedule, maps: list | None = None
                 ) -> tuple[Any, CudaSource]:
    """The SIMT-form kernel and its CUDA source (the task maps of its
    distributed loops appended to ``maps``)."""
    from .occupancy import default_min_blocks

    from ...lowering.simt import block_threads

    k = lower_verified(program, s, maps)
    aliased = frozenset(n for g in s.aliases for n in g)
    # the block's threads: a warp-specialized ring's producer warp included
    threads = max(block_threads(k).values()) if s.block_threads else None
    blocks = s.min_blocks if s.min_blocks is not None else \
        default_min_blocks(k, threads, CUDA_ROW.profile)
    return k, emit_cuda(k, aliased, s.index_bits, blocks, s.cache_hints, s.grid_blocks)


def _build(src: CudaSource, want_ptx: bool = False, cache: bool = True) -> Any:
    from .nvrtc import compile_cuda

    return compile_cuda(src.text, "tilenest.cu", arch=ARCH, include_dirs=prelude_dirs(),
                        want_ptx=want_ptx, cache=cache)


def lowering_obligations(program: TileProgram, s: Schedule) -> tuple:
    """Lower ``program`` under ``s`` to its SIMT form and discharge what the
    lowering decided: ``(kernel, source, task maps, resource obligations,
    the others)`` -- barrier sufficiency, the bulk copies' ``tma.*`` and
    their warp-specialized rings' ``roles.*``, task-map
    coverage and tree placement. A schedule that fits no GPU is an error
    (:func:`_refuse_unlaunchable`); refuted obligations are returned, not
    raised (``tilenest check --target cuda`` reports them)."""
    maps: list = []
    k, src = stage_source(program, s, maps)
    res = _refuse_unlaunchable(resource_obligations(k), program)
    simt = (barrier_obligations(k) + tma_obligations(k) + coverage_obligations(maps)
            + tree_obligations(program, maps))
    return k, src, maps, res, simt


def resource_obligations(k: Any, target: str = "cuda") -> list:
    """The SIMT form's resource obligations (shared-memory capacity, threads
    per block, grid size) against ``target``'s device profile, discharged:
    each holds for all sizes or leaves a *launch precondition* over the
    symbols, which every call checks (``runtime.CudaKernel``) before it
    launches. Cheap: asked before the barrier proofs, so a schedule that fits
    no GPU is refused at once."""
    from ...proofs import gpu
    from ...proofs.obligation import discharge
    from ...targets import profile

    res = gpu.resource_obligations(k, profile(target))
    discharge(res, timeout=2.0)
    return res


def barrier_obligations(k: Any) -> list:
    """The SIMT form's barrier-sufficiency obligations, discharged; a refuted
    one makes the lowering illegal."""
    from ...proofs import barriers

    return barriers.check_barriers(k)


def tma_obligations(k: Any) -> list:
    """The bulk tensor copies' obligations (``tma.phases``, ``tma.placement``:
    :func:`tilenest.proofs.gpu.tma_obligations`) and the handshake of the
    warp-specialized rings that issue them (``roles.*``:
    :func:`tilenest.proofs.gpu.roles_obligations`), discharged."""
    from ...proofs import gpu
    from ...proofs.obligation import discharge

    obs = gpu.tma_obligations(k) + gpu.roles_obligations(k)
    discharge(obs, timeout=2.0)
    return obs


def coverage_obligations(maps: list) -> list:
    """``taskmap.coverage`` of every distributed loop's task map over the
    extent it stands for, discharged (each distinct pair once)."""
    from ...proofs.obligation import discharge

    from ...lowering.simt import distribution

    seen: dict[str, Any] = {}
    for m in maps:
        # a tree placement (simt_trees.TreePlacement) or a distribution (W, V, n)
        W, V, n = (m.tree.threads, 1, m.n) if isinstance(m, TreePlacement) else m
        blocked = isinstance(m, TreePlacement) and m.tree.blocked
        # an extent reading the program's locals (a loop index) must be
        # covered for every value of them: they become parameters (>= 0)
        free = {lf: E.Sym("_" + lf.name.replace(".", "_")) for lf in E.leaves(n)
                if isinstance(lf, (E.Var, E.Val))}
        n = E.subst(n, free)
        tm = distribution(W, V, n, blocked)
        key = f"{tm} over {E.to_str(n)}"
        if key not in seen:
            seen[key] = tm.coverage((n,))
    obs = list(seen.values())
    discharge(obs, timeout=2.0)
    return obs


def tree_obligations(program: TileProgram, maps: list) -> list:
    """The placement of every reduction the SIMT form runs as a block tree
    (``simt_trees.TreePlacement``), stated against the program and
    discharged (``proofs.reductions.place_reduction``): ``reduction.cover``
    (each contribution placed exactly once on ``threads`` participants,
    ``blocked`` or ``strided``), ``reduction.permission`` (the policy is a
    tree) and, for ``blocked``, ``reduction.order`` (the participants' runs
    are in source order). The custom contract's laws are its declaration
    (R-11): they are reported as evidence, never required here."""
    from ...proofs.obligation import discharge
    from ...proofs.reductions import place_reduction, reduces

    index = {op.oid: i for i, op in enumerate(reduces(program))}
    obs: list = []
    for m in maps:
        if not isinstance(m, TreePlacement) or m.oid not in index:
            continue
        order = "blocked" if m.tree.blocked else "strided"
        for o in place_reduction(program, index[m.oid], m.tree.threads, order).obligations:
            if o.kind.startswith("reduction.law."):
                o.role = "evidence"
            obs.append(o)
    discharge(obs, timeout=2.0)
    return obs


def compile_program(program: TileProgram, schedule: Schedule | None = None,
                    cache: bool = True, device: str | None = None, **overrides: Any
                    ) -> CudaKernel:
    """Prove ``program`` legal, lower it to the SIMT form, emit CUDA C++ and
    compile it to an sm_90a cubin; the kernel runs on ``device`` (``"gpu"`` or
    ``"emulated"``; default: the GPU when one is usable, else the emulator).
    A refuted obligation of the program or of the SIMT form is an error
    naming it.

    Kernels are cached in this process (a bounded LRU) by device, schedule
    and program, and whole on disk by schedule, program, NVRTC and
    tilenest's own source: a hit lowers, proves and compiles nothing
    (``kernel.cached == "disk"``). ``cache=False`` does it all afresh (and
    stores the result on disk)."""
    s = _schedule(program, schedule)
    if overrides:
        s = s.with_(**overrides)
    dev = device or ("gpu" if gpu_available() else "emulated")
    if dev not in ("gpu", "emulated"):
        raise TilenestError(f"unknown cuda device '{dev}'", hint="use 'gpu' or 'emulated'")
    text = f"{VERSION}\n{dev}\n{s.key()}\n{program}"
    key = "cuda:" + hashlib.sha256(text.encode()).hexdigest()
    if cache:
        got = KC.MEMORY.get(key)
        if got is not None:
            return got
    t0 = time.perf_counter()
    ck = _load(disk_key(program, s), program, s, dev) if cache else None
    if ck is None:
        ck = _compile(program, s, dev, cache)
        # the key again, now that the compile has loaded NVRTC: the entry is
        # stored under the identity of the library that produced it
        _store(disk_key(program, s), ck)
    ck.compile_seconds = time.perf_counter() - t0
    if cache:
        KC.MEMORY.put(key, ck, ck.nbytes)
    return ck


def _compile(program: TileProgram, s: Schedule, dev: str, cache: bool) -> CudaKernel:
    """Prove, lower, discharge the SIMT obligations, emit and build (no kernel cache)."""
    t0 = time.perf_counter()
    obs = legality(program, s)
    k, src, maps, res, simt = lowering_obligations(program, s)
    obs = obs + _refuse_refuted(simt) + res
    built = _build(src, cache=cache)
    from ...proofs import gpu

    regs = {i.phase: built.resources[i.name].registers for i in src.kernels
            if i.name in built.resources and built.resources[i.name].registers}
    from ...proofs.obligation import discharge

    reg_obs = list(gpu.register_limits(k, regs))
    discharge(reg_obs, timeout=2.0)
    obs += _refuse_refuted(reg_obs)
    if not isinstance(src.index, str | None):
        obs.append(src.index)
    ck = CudaKernel(program, k, s, src, built, dev, obs, time.perf_counter() - t0)
    ck.trees = {**dict(k.trees), **{m.oid: m.tree for m in maps if isinstance(m, TreePlacement)}}
    ck.precondition = gpu.launch_precondition(res)
    ck.index_precondition = _index_precondition(src)
    return ck


def _index_precondition(src: CudaSource) -> Any:
    """What a launch of ``src`` must check for its index width (None: nothing)."""
    from ...proofs.obligation import PROVED

    if src.index_bits == 64 or src.index.status == PROVED:
        return None
    return src.index.witness["precondition"]


def disk_key(program: TileProgram, s: Schedule) -> str:
    """The whole-kernel disk key (:func:`tilenest.backends.kernelcache.kernel_key`):
    the program, the schedule, the architecture and the NVRTC installation.
    The device is not part of it: the cubin, the source and the verdicts are
    the same for a GPU and the emulator."""
    from .nvrtc import toolchain_identity

    return KC.kernel_key("cuda", program, s, [VERSION, ARCH, toolchain_identity()])


def _info_json(i: CudaKernelInfo) -> dict:
    return {"name": i.name, "phase": i.phase, "params": list(i.params), "threads": i.threads,
            "shared_bytes": KC.expr_json(i.shared_bytes), "programs": KC.expr_json(i.programs),
            "ordered": i.ordered, "grid_cap": i.grid_cap}


def _info_of(d: dict) -> CudaKernelInfo:
    return CudaKernelInfo(str(d["name"]), str(d["phase"]), tuple(str(p) for p in d["params"]),
                          int(d["threads"]), KC.expr_of(d["shared_bytes"]),
                          KC.expr_of(d["programs"]), bool(d["ordered"]),
                          None if d["grid_cap"] is None else int(d["grid_cap"]))


def _store(dkey: str, ck: CudaKernel) -> None:
    """Keep ``ck`` on disk as a whole (see :mod:`tilenest.backends.kernelcache`)."""
    b, pc = ck.built, ck.precondition

    def meta() -> dict:
        return {"facts": ck.facts.to_json(),
                "obligations": [KC.obligation_json(o) for o in ck.obligations],
                "precondition": None if pc is None else _precondition_json(pc),
                "kernels": [_info_json(i) for i in ck.source.kernels],
                "maps": [m.to_json() for m in ck.source.maps],
                "trees": {str(oid): t.to_json() for oid, t in ck.trees.items()},
                "index": {"bits": ck.source.index_bits,
                          "check": _index_json(ck.index_precondition),
                          "why": ck.source.index if isinstance(ck.source.index, str) else None},
                "nvrtc": {"log": b.log, "options": list(b.options), "arch": b.arch,
                          "name": b.name, "version": list(b.nvrtc_version)}}

    def parts() -> dict:
        out = {"cubin": b.cubin, "source": ck.source.text.encode()}
        if b.ptx is not None:
            out["ptx"] = b.ptx.encode()
        return out

    KC.write(dkey, "cuda", meta, parts)


def _precondition_json(pc: Any) -> dict:
    return {"pred": KC.pred_json(pc.pred), "what": pc.what,
            "parts": [_precondition_json(p) for p in pc.parts]}


def _precondition_of(d: dict) -> Any:
    from ...proofs.gpu import Precondition

    return Precondition(KC.pred_of(d["pred"]), str(d["what"]),
                        tuple(_precondition_of(p) for p in d["parts"]))


def _load(dkey: str, program: TileProgram, s: Schedule, dev: str) -> CudaKernel | None:
    """The kernel of the disk entry ``dkey`` for ``dev``, or None (no entry, or
    a damaged or stale one, which is discarded)."""

    def decode(meta: dict, parts: dict[str, bytes]) -> CudaKernel:
        from .nvrtc import compiled_cuda

        nv = meta["nvrtc"]
        built = compiled_cuda(parts["cubin"], parts["ptx"].decode() if "ptx" in parts else None,
                              str(nv["log"]), [str(o) for o in nv["options"]], str(nv["arch"]),
                              str(nv["name"]), tuple(nv["version"]))
        obs = [KC.obligation_of(o) for o in meta["obligations"]]
        ix = meta["index"]
        src = CudaSource(parts["source"].decode(), tuple(_info_of(i) for i in meta["kernels"]),
                         int(ix["bits"]), ix["why"] or next(
                             (o for o in obs if o.kind == "index.width"), None),
                         tuple(MapSpec.from_json(m) for m in meta.get("maps", [])))
        ck = CudaKernel(program, KC.CallFacts.from_json(meta["facts"]), s, src, built, dev, obs,
                        0.0, lower=lambda: lower_verified(program, s))
        ck.trees = {int(oid): tree_from_json(t) for oid, t in meta.get("trees", {}).items()}
        pc = meta["precondition"]
        ck.precondition = None if pc is None else _precondition_of(pc)
        ck.index_precondition = _index_of(ix["check"])
        ck.cached = "disk"
        return ck

    return KC.read(dkey, "cuda", decode)


def _index_json(pc: Any) -> dict | None:
    if pc is None:
        return None
    return {"limit": pc.limit, "roots": [KC.expr_json(r) for r in pc.roots],
            "defs": {n: [[d[0], *(KC.expr_json(x) for x in d[1:])] for d in ds]
                     for n, ds in pc.defs.items()}}


def _index_of(d: dict | None) -> Any:
    from ...proofs.gpu import IndexWidth

    if d is None:
        return None
    defs = {str(n): tuple((str(x[0]), *(KC.expr_of(y) for y in x[1:])) for x in ds)
            for n, ds in d["defs"].items()}
    return IndexWidth(defs, tuple(KC.expr_of(r) for r in d["roots"]), int(d["limit"]))


def _refuse_refuted(obs: list) -> list:
    from ...proofs.obligation import REFUTED

    bad = [o for o in obs if o.status == REFUTED and o.role == "required"]
    if bad:
        o = bad[0]
        raise TilenestError(f"the cuda lowering is illegal: {o.kind}: {o.title}", o.sites,
                            "this is a bug of the SIMT lowering; please report it with the "
                            "kernel", notes=tuple(o.counterexample_lines()[:4]))
    return obs


def _refuse_unlaunchable(res: list, program: TileProgram) -> list:
    """``res`` (the discharged resource obligations), unless one of them fails
    for every size (:func:`tilenest.proofs.gpu.never_launchable`): then the
    schedule does not fit the GPU and compiling it is an error that says by
    how much; a limit that only some sizes break stays a launch precondition."""
    from ...proofs import gpu

    bad = gpu.never_launchable(res)
    if bad:
        o = bad[0]
        hint = {gpu.SHARED: "use smaller tiles or fewer pipeline versions "
                            "(Schedule.stages); shared memory holds every live version",
                gpu.LIMIT: "use fewer threads per block (Schedule.block_threads; "
                           "warp_roles adds a producer warp) or fewer programs"
                }.get(o.kind, "use a smaller schedule")
        raise TilenestError(f"the cuda schedule does not fit the GPU: {o.kind}: {o.title}",
                            o.sites or program.loc, hint, notes=tuple(o.counterexample_lines()))
    return res


def clear_cache(release: bool = True) -> None:
    """Forget this process's compiled cuda kernels, NVRTC results and legality
    verdicts, and with ``release`` give the memory back (kernels a caller
    still holds keep working)."""
    from ...lowering import legality as LG
    from . import nvrtc

    KC.MEMORY.clear("cuda:")
    nvrtc.clear_cache()
    LG.clear_cache()
    if release:
        KC.release_memory()


def _emit_schedule(program: TileProgram, s: Schedule) -> str:
    """The schedule, and every obligation the compile discharged: the
    legality gate's, the SIMT form's (coverage, barriers, resources), and the
    launch precondition the runtime checks per call."""
    ck = compile_program(program, s, device="emulated")
    lines = [repr(s), summary(ck.obligations)]
    lines += [f"  {o.status:8} {o.kind}: {o.title}" for o in ck.obligations
              if o.kind.startswith(("taskmap", "barrier", "shared", "binding", "index"))]
    lines.append(f"launch precondition: {ck.precondition}")
    why = ck.source.index if isinstance(ck.source.index, str) else (
        "checked per call" if ck.index_precondition is not None else "for every size")
    lines.append(f"index arithmetic: {ck.source.index_bits}-bit ({why})")
    return "\n".join(lines) + "\n"


def _emit_loopir(program: TileProgram, s: Schedule) -> str:
    return print_kernel(lower_verified(program, s))


def _emit_cuda(program: TileProgram, s: Schedule) -> str:
    return stage_source(program, s)[1].text


def _emit_ptx(program: TileProgram, s: Schedule) -> str:
    return _build(stage_source(program, s)[1], want_ptx=True).ptx or ""


def _emit_resources(program: TileProgram, s: Schedule) -> str:
    built = _build(stage_source(program, s)[1])
    lines = []
    for name, r in sorted(built.resources.items()):
        lines.append(f"{name}: registers {r.registers}, spill stores {r.spill_store_bytes} B, "
                     f"spill loads {r.spill_load_bytes} B, static shared {r.shared_bytes} B, "
                     f"stack {r.stack_frame_bytes} B")
    lines += [f"warning: {w}" for w in built.warnings()]
    return "\n".join(lines) + "\n"


#: stage name -> printer of that stage's output
STAGES: dict[str, Callable[[TileProgram, Schedule], str]] = {
    "schedule": _emit_schedule,
    "loopir": _emit_loopir,
    "cuda": _emit_cuda,
    "ptx": _emit_ptx,
    "sass-resources": _emit_resources,
}


def emit(program: TileProgram, stage: str, schedule: Schedule | None = None) -> str:
    """The text of one stage for ``program``."""
    from .. import stage_text

    return stage_text("cuda", STAGES, program, stage, lambda: _schedule(program, schedule))
