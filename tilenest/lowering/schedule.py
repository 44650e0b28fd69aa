"""Scheduling decisions as data: the :class:`Schedule` of one lowering.

A schedule never changes what a program means; it picks one realization among
those the program admits:

* ``threads``   -- worker threads running the programs of a top-level
  ``parallel`` (``None``: one per CPU core). Nested ``parallel`` levels run
  their children in row-major order inside one program (``bind`` may name a
  level ``"serial"`` or ``"vector"``; ``"cores"`` is only legal at level 1).
* ``vector_bits`` -- the preferred SIMD width (128/256/512); default from the
  host CPU's features.
* ``reductions`` -- per ``reduce`` op id, ``"auto"`` (vectorize/reassociate when
  the policy permits and the update is its contract's merge), or
  ``"sequential"`` (the strict left-to-right order, always admitted).
* ``storage``   -- per value name, ``"inline"`` (recompute at each use) or
  ``"materialize"`` (a per-program local buffer); values not listed follow
  :func:`storage_plan`.
* ``fma``       -- allow fused multiply-add where the program permits it (only
  reassociating ``mma``; elementwise arithmetic is never contracted).
* ``chunk``     -- program ids per chunk that a worker thread takes at a time
  (``None``: about four chunks per thread; ``backends/llvm/workers.py``).
* ``mma_block`` -- the register block of ``mma``, ``(rows, vectors)``: ``rows``
  elements of the last free(a) dim by ``vectors`` vector registers of the last
  free(b) dim are accumulated in registers across the whole contraction
  (``lowering/mma.py``); ``None``: :func:`default_mma_block` of ``vector_bits``.
* ``aliases``   -- groups of tensor parameters that are one array in the call
  (M-8): a write through one member is a write to all of them, so none of
  them is read lazily, and the code does not treat them as ``noalias``. The
  runtime picks this field from the arrays it is given.
* ``strided``   -- tensor parameters read through a strided view: element
  ``(i_0, .., i_{r-1})`` at ``sum_d i_d * s_d`` with the outer strides
  ``s_d`` (elements) runtime arguments, the symbols :func:`stride_symbol`,
  and the innermost 1. The runtime picks this field too: a call passing a
  read-only argument whose rows are packed but not each other's neighbours
  (a slice of a wider array) runs the variant compiled for it; every other
  call reads C-contiguous arrays.
* ``check_assumes`` -- a checked build: ``bounds.assume`` promises are checked
  like ``bounds.checked`` (M-7 allows compiled code to skip them).
* ``block_threads`` -- threads per program for the SIMT form
  (``lowering/simt.py``; a multiple of 32): each program is run
  cooperatively by that many threads. A SIMT target (``cuda``) always uses
  it (default: its registry row's, ``tilenest.targets``); on ``llvm`` it is
  off by default (``None``), and setting it
  runs the same SIMT form serialized (``lowering/serialize.py``), so the CPU
  also executes and validates the GPU lowering.
* ``vector_lanes`` -- in the SIMT form, consecutive elements each thread
  takes per step of a distributed loop (1, 2, 4 or 8; the cuda default
  :func:`default_lanes` makes one 128-bit access of the widest bulk input).
* ``stage_loads`` -- on ``cuda``, a tensor tile the program reads more than
  once is read from global memory once into shared memory (one DRAM pass,
  at the cost of its shared bytes per block: occupancy) instead of re-read
  at each use (the default: re-reads hit the L2 cache only partly). The
  benchmark's schedule search picks it per kernel.
* ``cache_hints`` -- on ``cuda``, L2 cache policies on the wide (vector)
  accesses of global memory, from the program's own order of accesses
  (``backends/cuda/emit.py``, :func:`cache_hints`): each read of a tensor
  the program reads at several sites but the last keeps its lines in the L2
  (``evict_last`` policy) for the reads that follow, the last one streams
  (``ld.global.cs``: its lines are the first to go), and stores stream
  (``st.global.cs``: the program does not read its outputs back). Hints
  change only which lines the L2 keeps, never a value. On by default for a
  program with no ``mma`` (the target row's ``stream_defaults``: the row
  kernels were fastest with it on an H200), off for one with an ``mma``
  (whose tiles other programs re-read from the L2).
* ``row_registers`` -- on ``cuda``, a shared row buffer that every thread
  accesses only at its own elements (one distribution of the row over the
  threads for all its accesses: a softmax's exponentials) keeps its first
  ``row_registers`` elements per thread and row in registers and the rest
  in shared memory (``lowering/row_registers.py``); a row of at most
  ``row_registers`` elements per thread needs no shared memory. ``0``:
  every such buffer stays in shared memory (the default for a program with
  an ``mma``; one without takes 32, the target row's ``stream_defaults``).
  An input row the kernel never stores and reads in several passes under that distribution
  (a softmax's or a normalization's ``x``) is cached the same way: the
  first pass keeps the elements it reads in registers, the later passes
  read those. Registers are ``row_registers`` values per thread, row and
  buffer (at most 8 steps).
* ``grid_blocks`` -- on ``cuda``, a cap on the blocks launched for a
  parallel phase: with ``G`` blocks, block ``b`` runs the programs ``b, b +
  G, b + 2G, ...`` one after another, with a block barrier between two
  programs (as an ordered phase does), so a grid of exactly the blocks the
  device holds at once has no partly filled last wave, and a block's setup
  is paid once. ``None`` (the default): one block per program.
* ``mma_unit`` -- in the SIMT form, what computes a reassociating ``mma``:
  ``"tensor"`` (warp tiles of ``mma.m16n8k16`` on the tensor cores,
  ``lowering/mma.py``; an error naming the reason where the ``mma`` does not
  qualify), ``"simt"`` (per-thread micro-tiles on the ordinary FMA units) or
  ``"auto"`` (the default: on ``cuda`` the warpgroup tensor cores where
  every such ``mma`` of the program takes them, else ``mma.sync`` wherever
  the ``mma`` qualifies, else SIMT -- ``lower_verified``; on ``llvm``
  always SIMT). ``"wgmma"`` computes it
  by Hopper's warpgroup instructions (``wgmma.mma_async``, sm_90a): tiles of
  64 rows per warpgroup of 128 threads, the operands read straight from
  shared memory, which holds them in the 128-byte swizzled arrangement
  (``loopir.Swizzle128``); it needs ``block_threads`` a multiple of 128,
  16-bit operand tiles read only by the ``mma`` with rows a multiple of 64
  (``a``) or 8 (``b``) and 64-column panels (an error naming the reason
  otherwise). The choice is noted in the loop IR as a comment at the ``mma``.
* ``stages`` -- in the SIMT form, loops that produce tiles into shared
  memory and then consume them keep that many versions of the tiles: the
  next ``stages - 1`` iterations' tiles are produced while the current ones
  are consumed (``lowering/double_buffer.py``; 1: no rewrite, 2: double
  buffering, where the producers' stores become ``cp.async`` copies; each
  version counts against the shared capacity). ``None`` (the default on
  ``cuda``): the lowering's choice, with ``warp_roles`` below.
* ``warp_roles`` -- on ``cuda``, with ``tma`` and ``stages >= 3``: a ring
  whose producers are all bulk tensor copies and whose consumer is a
  warpgroup mma into registers runs *warp-specialized*
  (``lowering/warp_roles.py``): one extra warp issues the copies up to
  ``stages`` steps ahead and the consumers hand each version back through
  completion barriers, with no block barrier in the loop (the ``roles.*``
  obligations of ``proofs/gpu.py``). ``True``: a program with no such ring
  is an error naming why; ``False``: no ring is specialized. ``None`` (the
  default on ``cuda``): the lowering's choice (``lower_verified``): a ring
  that qualifies is specialized, with the most versions of 4 or 3 whose
  tiles fit a block when ``stages`` is ``None`` too (the warp-specialized
  GEMMs measured fastest at 4 on an H200); any other ring keeps ``stages``,
  2 when that is ``None``. Only ``True`` also specializes a ring on one
  barrier a step whose consumer computes in the lanes' registers between its
  warpgroup mmas and completes them within the step (attention's key loop;
  any ``stages >= 2``): measured slower than its block barriers
  (spec/lowering.md L-12, *Rings whose consumer computes*).
* ``index_bits`` -- on ``cuda``, the width of the generated code's index
  arithmetic: 32 (the default) where every index value is bounded by the
  loop ranges (the ``index.width`` obligation of ``proofs/gpu.py``; a call
  whose sizes break the bound runs the 64-bit variant of the kernel, compiled
  when first needed), or 64. 32-bit code has about half the integer
  instructions (and NVRTC compiles it many times faster).
* ``min_blocks`` -- on ``cuda``, blocks of each kernel that one
  multiprocessor must be able to hold at once as far as registers go
  (``__launch_bounds__``' second argument): ptxas then keeps each thread's
  registers at or under ``65536 / (min_blocks * threads)``, spilling if it
  must (a spill is a reported warning). ``None`` (the default): two for a
  tensor-core kernel where two blocks' shared memory fits a multiprocessor
  and their private tiles leave registers to spare
  (``backends/cuda/occupancy.py``), else the allocation is ptxas's. More
  resident blocks hide more latency in a kernel
  bound by it; on the H200 no row kernel got faster with it
  (``benchmarks/cuda.py --set min_blocks=N``), so the benchmark's schedule
  search leaves it out.
* ``reduce_splits`` -- split-K for a program's reduction: with ``S > 1``,
  the first ``reduce`` at the top of a top-level ``parallel``'s program body
  that may be regrouped (a tree policy under ``auto``, every state under a
  contract; a custom one's laws proved) is folded in ``S`` runs of its
  domain by ``S`` programs each, and a second phase merges the partial
  states in run order (``phases.parallel_phases``): a decode attention
  whose few programs each walk a long key axis then fills the machine. 1
  (the default): each program folds its own reduce.
* ``transforms`` -- execution transforms applied before lowering through the
  proofs layer's ``tilenest.transform`` (spec strings like ``"split(1, 0, 2)"``);
  their obligations must be proved, or selected by ``assume`` (see
  :func:`apply_transforms`).

:func:`default_schedule` gives the automatic choice for a target. Its
decisions carry obligations (``bind`` of a level to cores: the CPU binding
catalogue; ``reductions`` ``"auto"`` on a tree policy: the reassociation
permission and the built-in merge's laws), which the compile-time legality
gate discharges together with the program's race obligations
(:mod:`tilenest.lowering.legality`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from .. import targets as T
from ..semantics.signature import stored_tensors
from ..errors import NotAvailableError, TilenestError
from ..semantics.ir import Operation, TileProgram
from ..semantics.ops.values import ELEMENTWISE

#: ops whose result is a view of its operand (free to recompute)
VIEW_OPS = frozenset({"const", "index", "broadcast", "reindex", "permute", "per", "reshape"})
#: ops that can be computed lazily at their use
LAZY_OPS = VIEW_OPS | frozenset(ELEMENTWISE) | {"map"}
#: cheap elementwise ops recomputed at each use rather than kept in a
#: buffer (a few instructions each): on a SIMT target at any count short of a
#: broadcast (a materialized row would cost shared capacity, hence
#: occupancy, and a pass over it), on the CPU at up to
#: :data:`CPU_RECOMPUTE_USES` uses (a row stored and read back from the cache
#: costs a store and a load per element and use, more than the op)
RECOMPUTE = frozenset({"cast", "add", "sub", "mul", "neg", "abs", "maximum", "minimum",
                       "select", "ite", "bitcast"})
CPU_RECOMPUTE_USES = 3


@dataclass(frozen=True)
class Schedule:
    """One realization choice for a target (see the module docstring)."""

    target: str = "llvm"
    threads: int | None = None
    vector_bits: int | None = None
    bind: tuple[tuple[int, str], ...] = ()
    reductions: tuple[tuple[int, str], ...] = ()
    storage: tuple[tuple[str, str], ...] = ()
    fma: bool = True
    chunk: int | None = None
    mma_block: tuple[int, int] | None = None
    transforms: tuple[Any, ...] = field(default=())
    assume: tuple[str, ...] = ()
    check_assumes: bool = False
    aliases: tuple[tuple[str, ...], ...] = ()
    strided: tuple[str, ...] = ()
    block_threads: int | None = None
    vector_lanes: int = 1
    stage_loads: bool = False
    mma_unit: str = "auto"
    stages: int | None = 1
    index_bits: int = 32
    min_blocks: int | None = None
    cache_hints: bool = False
    grid_blocks: int | None = None
    row_registers: int = 0
    reduce_splits: int = 1
    tma: bool = False
    warp_roles: bool | None = False

    def __post_init__(self) -> None:
        """Refuse a field value outside its range (:data:`VALUE_RULES`): a
        zero ``block_threads`` or ``threads`` is an error, not a default."""
        for name in VALUE_RULES:
            why = value_problem(name, getattr(self, name))
            if why is not None:
                from ..errors import UsageError

                raise UsageError(f"Schedule field {why}", hint="give a value in that range")

    def key(self) -> str:
        """The parts of the schedule that change generated code (cache key)."""
        return repr((self.target, self.vector_bits, self.bind, self.reductions,
                     self.storage, self.fma, self.transforms, self.assume,
                     self.check_assumes, self.aliases, self.strided, self.mma_block, self.block_threads, self.vector_lanes,
                     self.stage_loads, self.mma_unit, self.stages, self.index_bits,
                     self.min_blocks, self.cache_hints, self.grid_blocks,
                     self.row_registers, self.reduce_splits, self.tma,
                     self.warp_roles))

    def written(self, program: TileProgram) -> set[str]:
        """Tensor parameters whose storage ``program`` may write: those it stores
        to, and every member of an alias group that has one."""
        stored = stored_tensors(program)
        for group in self.aliases:
            if stored.intersection(group):
                stored.update(group)
        return stored

    def reduction(self, oid: int) -> str:
        return dict(self.reductions).get(oid, "auto")

    def binding(self, oid: int, level: int) -> str:
        return dict(self.bind).get(oid, "cores" if level == 1 else "serial")

    def with_(self, **kw: Any) -> "Schedule":
        return replace(self, **kw)


def stride_symbol(param: str, dim: int) -> str:
    """The symbol holding the stride (in elements) of dimension ``dim`` of
    tensor parameter ``param`` in a ``strided`` schedule."""
    return f"{param}.stride{dim}"


def host_vector_bits() -> int:
    """The widest profitable SIMD width of this host: 512 with AVX-512, 256
    with AVX2, else 128."""
    try:
        import llvmlite.binding as llvm

        feats = llvm.get_host_cpu_features()
        if feats.get("avx512f"):
            return 512
        if feats.get("avx2"):
            return 256
    except Exception:  # pragma: no cover - llvmlite always present in practice
        pass
    return 128


#: the automatic ``mma_block`` by vector register count: as many accumulators
#: as leave registers for one step's ``b`` vectors and the ``a`` broadcast
MMA_BLOCKS = {32: (8, 2), 16: (6, 2)}


def default_mma_block(vector_bits: int | None) -> tuple[int, int]:
    """The automatic ``mma`` register block for a SIMD width: AVX-512 hosts
    (512 bits) have 32 vector registers, AVX2 and SSE hosts 16."""
    return MMA_BLOCKS[32 if (vector_bits or 128) >= 512 else 16]


def default_lanes(program: TileProgram) -> int:
    """The SIMT ``vector_lanes`` default: as many consecutive elements per
    thread as make 16 bytes of the widest element type among the program's
    bulk tensors, at most 8. The bulk tensors are the highest-rank ones it
    only reads (they carry the reads a row or tile kernel streams) and those
    it stores of the same shape as one of them (an elementwise result, as a
    dequantized tensor is of its codes; not a top-k's indices); with no
    input of that rank, the highest-rank tensors. So no bulk access takes
    more than one 128-bit access per thread and step, and a narrower tensor
    still a vector access.

    Measured on an H200 (8192^2 rows): 32 bytes per thread and step instead
    of 16 -- two 128-bit accesses whose neighbours interleave, in global
    memory and in a staged shared row -- cost LayerNorm f32 19 points of the
    copy bandwidth and softmax f32 5, and dequantizing e4m3fn codes into
    f32 (8 lanes by the codes alone: 32-byte stores) ran at 68% of copy
    (spec/lowering.md)."""
    from ..semantics.types import TensorType

    tensors = [v for v in program.args if isinstance(v.type, TensorType)]
    if not tensors:
        return 1
    rank = max(len(v.type.shape) for v in tensors)
    top = [v for v in tensors if len(v.type.shape) == rank]
    written = stored_tensors(program)
    inputs = [v for v in top if v.name not in written]
    shapes = {tuple(map(str, v.type.shape)) for v in inputs}
    bulk = inputs + [v for v in top if v.name in written
                     and tuple(map(str, v.type.shape)) in shapes] if inputs else top
    widest = max(max(1, v.type.dtype.itemsize) for v in bulk)
    return max(1, min(8, 16 // widest))


def target_row(target: str) -> T.Target:
    """The registry row of ``target`` (:mod:`tilenest.targets`): an error
    naming the targets for an unknown one."""
    got = T.TARGETS.get(target)
    if got is None:
        raise NotAvailableError(f"no lowering for target '{target}'",
                                hint=f"available targets: {', '.join(T.TARGETS)}")
    return got


def unused_fields(target: str) -> tuple[str, ...]:
    """The fields of :class:`Schedule` that ``target`` never reads (its row's
    ``unused``): overriding one is refused (it would change nothing), not
    ignored."""
    return target_row(target).unused


def _field_types() -> dict[str, set[type]]:
    """Each :class:`Schedule` field's declared types (a union's members)."""
    import types
    import typing

    out = {}
    for k, h in typing.get_type_hints(Schedule).items():
        union = typing.get_origin(h) in (typing.Union, types.UnionType)
        out[k] = set(typing.get_args(h)) if union else {h}
    return out


def settable_fields() -> dict[str, type]:
    """The :class:`Schedule` fields a command line may set (``--set
    FIELD=VALUE``): those of one scalar type, ``int``, ``bool`` or ``str``
    (optionally ``None``), by that type; the target is chosen by its own
    option."""
    out = {}
    for k, allowed in _field_types().items():
        simple = allowed - {type(None)}
        if k != "target" and len(simple) == 1 and simple <= {int, bool, str}:
            out[k] = simple.pop()
    return out


def _positive(v: Any) -> bool:
    return v >= 1


#: the values a number field of :class:`Schedule` may take (``None`` is
#: always allowed where the field's type allows it): (test, what it means)
VALUE_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "threads": (_positive, "worker threads, a positive int"),
    "chunk": (_positive, "program ids per chunk, a positive int"),
    "vector_bits": (lambda v: v in (128, 256, 512), "the SIMD width in bits: 128, 256 or 512"),
    # (the SIMT lowering refuses one that is not a multiple of 32 in [32, 1024],
    # as an illegal candidate of a tuning search)
    "block_threads": (_positive, "threads per program, a positive int"),
    "vector_lanes": (lambda v: v in (1, 2, 4, 8), "elements per thread and step: 1, 2, 4 or 8"),
    "stages": (lambda v: 1 <= v <= 8, "versions of each produced tile, an int in [1, 8]"),
    "index_bits": (lambda v: v in (32, 64), "the width of index arithmetic, 32 or 64"),
    "min_blocks": (_positive, "blocks per multiprocessor, a positive int"),
    "grid_blocks": (_positive, "the most blocks a parallel phase launches, a positive int"),
    "reduce_splits": (_positive, "programs that share one program's reduce, a positive int"),
    "row_registers": (lambda v: 0 <= v <= 64, "row elements per thread kept in registers, an "
                                              "int in [0, 64]"),
}


def value_problem(name: str, value: Any) -> str | None:
    """Why ``value`` is out of range for the Schedule field ``name``
    (:data:`VALUE_RULES`), or None (also for a value of another type, which
    :func:`check_overrides` reports)."""
    rule = VALUE_RULES.get(name)
    if rule is None or value is None or isinstance(value, bool) or not isinstance(value, int):
        return None
    ok, meaning = rule
    return None if ok(value) else f"{name}={value!r}: {meaning}"


def check_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` after checking that each key is a :class:`Schedule`
    field and each value has its declared type where that is ``int``,
    ``bool``, ``str`` or ``float``, optionally ``None`` (the other fields are
    left to the lowering's own checks); a ``UsageError`` otherwise."""
    from ..errors import UsageError

    hints = _field_types()
    for k, v in overrides.items():
        if k not in hints:
            raise UsageError(f"'{k}' is not a Schedule field",
                             hint=f"fields: {', '.join(sorted(hints))}")
        allowed = hints[k]
        if allowed <= {int, bool, str, float, type(None)} and type(v) not in allowed:
            names = " or ".join(sorted(a.__name__ for a in allowed if a is not type(None))
                                + (["None"] if type(None) in allowed else []))
            example = "True" if bool in allowed else "256" if int in allowed else "'auto'"
            raise UsageError(f"Schedule field '{k}' takes {names}, got {v!r}",
                             hint=f"e.g. {{'{k}': {example}}}")
        why = value_problem(k, v)
        if why is not None:  # never replaced by a default, never left to fail later
            raise UsageError(f"Schedule field {why}", hint="give a value in that range")
    return overrides


def default_schedule(program: TileProgram, target: str = "llvm", **overrides: Any) -> Schedule:
    """The automatic schedule of ``program`` for ``target`` (overrides applied
    after :func:`check_overrides`; one the target never reads,
    :func:`unused_fields`, is an error).

    The target's registry row decides: on a SIMT target (``profile.simt``)
    every program runs as a block of threads, each thread taking
    :func:`default_lanes` elements per step; otherwise programs run on the
    host's cores (one worker per core) with its SIMD width and the
    ``mma`` register block for it. The row's ``defaults`` are then set
    (e.g. ``block_threads``), its ``stream_defaults`` for a program with no
    ``mma`` (``cuda``: rows in registers and L2 policies), on a target with
    warpgroup tensor cores one warpgroup per 64-row band of a program whose
    tensor-core products have unit dims (``mma.band_threads``: attention's
    query tiles), and the overrides last."""
    row = target_row(target)
    check_overrides(overrides)
    unused = [f for f in row.unused if f in overrides]
    if unused:
        from ..errors import UsageError

        raise UsageError(f"schedule field {unused[0]} is not used by the {target} target "
                         "(setting it would change nothing)",
                         hint=f"the {target} target never reads "
                              f"{', '.join(row.unused)}; drop the setting")
    if row.profile.simt:
        s = Schedule(target=target, threads=None, vector_bits=None,
                     vector_lanes=default_lanes(program), **row.defaults)
        if row.stream_defaults and not any(op.name == "mma" for op in program.walk()):
            s = replace(s, **row.stream_defaults)
        from .mma import band_threads

        banded = band_threads(program, row.profile)
        if banded is not None and "block_threads" in row.defaults:
            s = replace(s, block_threads=banded)
    else:
        bits = overrides.get("vector_bits") or host_vector_bits()
        s = Schedule(target=target, threads=os.cpu_count() or 1, vector_bits=bits,
                     mma_block=default_mma_block(bits), **row.defaults)
    return replace(s, **overrides) if overrides else s


def for_target(program: TileProgram, schedule: Schedule | None, target: str) -> Schedule:
    """The schedule a backend of ``target`` compiles with: ``schedule``, or
    :func:`default_schedule` when none is given. A given schedule made for
    another target takes ``target``'s name, and on a SIMT target one without
    ``block_threads`` takes the default schedule's (a SIMT target always runs
    the SIMT form); its other fields stay as given."""
    s = schedule or default_schedule(program, target)
    simt = target_row(target).profile.simt
    if s.target != target or (simt and not s.block_threads):
        threads = s.block_threads or (default_schedule(program, target).block_threads
                                      if simt else None)
        s = s.with_(target=target, block_threads=threads)
    return s


def apply_transforms(program: TileProgram, schedule: Schedule) -> tuple[TileProgram, list]:
    """Apply ``schedule.transforms`` through the proofs layer's transform API
    (``tilenest.transform``; each entry a spec string such as ``"split(1, 0, 2)"``
    or a ``(name, args, kwargs)`` triple, as ``tilenest check --transform``),
    discharge the obligations, and return the transformed program with them.

    A refuted obligation makes the schedule illegal (an error naming it); an
    unknown one is refused too unless ``schedule.assume`` selects it (it is then
    reported as assumed, never as proved)."""
    if not schedule.transforms:
        return program, []
    try:
        from ..proofs.obligation import REFUTED, UNKNOWN
        from ..proofs.remap import Transformed
        from ..proofs.report import STEPS, validate_spec
    except ImportError:  # pragma: no cover - the proofs layer ships with tilenest
        raise NotAvailableError(
            "schedule transforms need tilenest.transform (the proofs layer)",
            hint="lower without transforms") from None
    cur: Any = program
    for spec in schedule.transforms:
        name, args, kw = validate_spec(spec)  # the same check as tilenest check --transform
        cur = STEPS[name](cur, *args, **kw)
        assert isinstance(cur, Transformed)
        if cur.program is None:
            raise TilenestError(f"transform {spec!r} does not apply: {cur.reason}")
    cur.check(timeout=5.0, assume=schedule.assume)
    req = [o for o in cur.obligations if o.role == "required"]
    bad = [o for o in req if o.status == REFUTED]
    if bad:
        raise TilenestError(f"the schedule's transforms are illegal: {bad[0].kind}: "
                            f"{bad[0].title}", bad[0].sites,
                            "the obligation is refuted; see `tilenest check --transform ...`")
    unknown = [o for o in req if o.status in (UNKNOWN, "pending")]
    if unknown:
        raise TilenestError(
            f"the schedule's transforms have {len(unknown)} unproved obligation(s), first: "
            f"{unknown[0].kind}: {unknown[0].title}", unknown[0].sites,
            "take them as axioms with Schedule(assume=(KIND, ...)) if you know they hold")
    return cur.program, list(cur.obligations)


# ---------------------------------------------------------------------------
# storage of intermediates

MANY = 1000


def _uses(program: TileProgram) -> tuple[dict[str, list[Operation]], dict[int, Operation]]:
    """Users of every value, and for each ``stage`` yield the stage op it ends."""
    out: dict[str, list[Operation]] = {}
    stage_of: dict[int, Operation] = {}
    for op in program.walk():
        for o in op.operands:
            out.setdefault(o.name, []).append(op)
        if op.name == "stage" and op.regions[0].terminator is not None:
            stage_of[id(op.regions[0].terminator)] = op
    return out, stage_of


def _unit_growth(name: str, user: Operation) -> bool:
    """Whether every dim that ``user``'s result has and its operand ``name``
    lacks has extent 1 (each element of the operand is then used once per
    use, not recomputed across a larger space)."""
    from ..semantics import expr as E

    src = next(o.type for o in user.operands if o.name == name)
    rt = user.results[0].type
    have = set(getattr(src, "dims", ()))
    extra = [x for d, x in zip(getattr(rt, "dims", ()), getattr(rt, "extents", ()), strict=True)
             if d not in have]
    return all(x == E.Const(1) for x in extra)


def _full_rows(op: Operation) -> bool:
    """Whether a view's innermost tile axis covers a whole tensor axis from 0
    (``map`` component ``$last`` exactly, equal extents): re-reading it from
    memory needs no tail guard, so it is as cheap as reading a copy."""
    from ..semantics import expr as E

    t = op.results[0].type
    vars_ = op.attrs["vars"]
    shape = op.operands[0].type.shape
    last = E.Var(vars_[-1])
    for m, n in zip(op.attrs["map"], shape, strict=True):
        if m == last:
            return t.extents[-1] == n
    return False


def storage_plan(program: TileProgram, schedule: Schedule | None = None) -> dict[str, str]:
    """``value name -> 'inline' | 'materialize'`` for every lazily computable result.

    A view (``const index broadcast reindex permute per reshape``) is inlined.
    An elementwise result is materialized when its *effective use count* is
    above one. A use counts one when the user is materialized (or is not lazy:
    a store, a reduction...), and the user's own effective count when the user
    is inlined (the value is then recomputed wherever the user is); a use that
    broadcasts the value to a larger space or feeds ``mma``/``gather``/``put``/
    ``memory.store`` counts as many (each element would be recomputed many
    times); a use by a ``stage`` yield counts as the stage result's uses.
    Growth only along dims of extent 1 does not count as a broadcast.
    A ``tensor.load`` is inlined only when its effective count is one (a
    broadcast re-read from memory counts once), it reads a tensor the program
    never stores to (the read is then a snapshot wherever it happens), and its
    bounds are ``zero``/``fill``/``assume``. On a SIMT target (``profile.simt``
    of the schedule's target, e.g. ``cuda``) a load used a few
    times is re-read (from the L2 cache) (with ``schedule.stage_loads`` such
    a load is kept, in shared memory, as on the CPU). The cheap elementwise
    ops of :data:`RECOMPUTE` are recomputed at each use rather than kept: on
    a SIMT target at any count short of ``MANY``, on the CPU at up to
    :data:`CPU_RECOMPUTE_USES`. Rank-0 results are kept in scalar
    locals. Explicit ``schedule.storage`` entries win. Decisions are made
    users-first (reverse program order)."""
    uses, stage_of = _uses(program)
    ops = list(program.walk())
    gpu = schedule is not None and target_row(schedule.target).profile.simt
    loads = {o.results[0].name for o in ops if o.name == "tensor.load"}
    stored = (schedule or Schedule()).written(program)
    fixed = dict(schedule.storage) if schedule is not None else {}
    plan: dict[str, str] = {}
    eff: dict[str, int] = {}

    def count(name: str, rank: int, is_load: bool) -> int:
        n = 0
        for u in uses.get(name, []):
            if u.name in ("mma", "gather", "put", "memory.store"):
                n += MANY
            elif u.name == "yield" and id(u) in stage_of:
                st = stage_of[id(u)]
                i = [o.name for o in u.operands].index(name)
                sr = st.results[i]
                if sr.name not in eff:  # its users come later and are decided already
                    eff[sr.name] = count(sr.name, getattr(sr.type, "rank", 0), is_load)
                n += eff[sr.name]
            elif u.name in LAZY_OPS and len(u.results) == 1:
                r = u.results[0]
                grows = getattr(r.type, "rank", 0) > rank and not _unit_growth(name, u)
                if (u.name == "broadcast" or grows) and not is_load:
                    n += MANY
                elif plan.get(r.name) == "materialize":
                    n += 1
                else:
                    n += eff.get(r.name, 1)
            else:
                n += 1
        return n

    for op in reversed(ops):
        if len(op.results) != 1 or (op.regions and op.name != "map"):
            continue
        r = op.results[0]
        rank = getattr(r.type, "rank", 0)
        if op.name in VIEW_OPS:
            plan[r.name] = "inline"
            eff[r.name] = count(r.name, rank, False)
        elif op.name in ELEMENTWISE or op.name == "map":
            # on a GPU a converted load is re-read like the load itself
            reread = gpu and op.name == "cast" and op.operands[0].name in loads
            n = count(r.name, rank, reread)
            eff[r.name] = n
            cheap = op.name in RECOMPUTE and n < (MANY if gpu else CPU_RECOMPUTE_USES + 1)
            plan[r.name] = "materialize" if rank == 0 or (n > 1 and not cheap) else "inline"
        elif op.name == "tensor.load":
            n = count(r.name, rank, True)
            eff[r.name] = n
            pol = op.attrs["bounds"].kind.value
            if gpu:
                again = n <= 1 or (n < MANY and not schedule.stage_loads)
            else:
                again = n <= 1 or (n < MANY and _full_rows(op))
            ok = (op.operands[0].name not in stored and pol in ("zero", "fill", "assume")
                  and rank > 0 and again)
            plan[r.name] = "inline" if ok else "materialize"
        if r.name in fixed:
            plan[r.name] = fixed[r.name]
    return plan
