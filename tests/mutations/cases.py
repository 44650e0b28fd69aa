"""The mutation corpus of the checker: (wrong, right) pairs.

Each :class:`Case` builds the obligations of a deliberately wrong transform,
binding, schedule or kernel (``wrong``) and of its corrected version
(``right``). The checker must refute at least one obligation of kind ``kind``
in ``wrong`` (with a counterexample the tests re-check against the original
maps) and prove every obligation of that kind in ``right``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tilenest as tn
from tilenest.proofs import bindings as BD
from tilenest.proofs import phases as PH
from tilenest.proofs import reductions as RD
from tilenest.proofs import serial_fusion as SF
from tilenest.proofs import transforms as T
from tilenest.proofs.obligation import Obligation
from tilenest.proofs.remap import NewLevel, Remap, apply
from tilenest.semantics import expr as E
from tilenest.semantics.dtypes import f32, i32
from tilenest.semantics.maps import Map
from tilenest.semantics.space import DimFactor, IndexSet, Space

from . import kernels as K


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    wrong: Callable[[], list[Obligation]]
    right: Callable[[], list[Obligation]]


def obs(t: object) -> list[Obligation]:
    return list(getattr(t, "obligations", t))  # type: ignore[arg-type]


def prog(k: tn.Kernel) -> tn.TileProgram:
    return k.program


def level_vars(p: tn.TileProgram, lid: int) -> tuple[str, ...]:
    return p.analysis.nest.levels[lid].domain.vars


# -- custom (wrong) remaps, built with the general Remap constructor -----------

def coalesce_wrong_radix() -> list[Obligation]:
    """grid8 (R x 8) coalesced with digits (f div 9, f mod 8): a wrong radix."""
    p = prog(K.grid8)
    a, b = level_vars(p, 1)
    f = E.Var("f_bad")
    dom = p.analysis.nest.levels[1].domain
    fac = DimFactor(dom.space.factors[0].dim, E.Sym("R") * 8)
    nl = NewLevel(("f_bad",), IndexSet(Space((fac,)), ("f_bad",)))
    return obs(apply(p, Remap("coalesce", (1,), (nl,), {a: f // 9, b: f % 8}, {1: 0})))


def unit_of_two() -> list[Obligation]:
    """A "unit" level of extent 2: two new points perform each old one."""
    p = prog(K.flat)
    (v,) = level_vars(p, 1)
    dom = p.analysis.nest.levels[1].domain
    outer = NewLevel(dom.vars, dom)
    inner = NewLevel(("u_bad",), IndexSet(Space((DimFactor(
        tn.dim("unit_bad"), E.Const(2)),)), ("u_bad",)))
    return obs(apply(p, Remap("insert_unit", (1,), (outer, inner), {v: E.Var(v)}, {1: 1})))


def custom_bind(kernel: tn.Kernel, target: str, scopes: dict, mk: Callable | None = None
                ) -> list[Obligation]:
    p = prog(kernel)
    maps = mk(p) if mk else None
    return obs(BD.bind(p, target, scopes, maps))


def collapse_map(p: tn.TileProgram) -> dict:
    v1, v2 = level_vars(p, 1), level_vars(p, 2)
    return {2: Map(v1 + v2, (E.Var(v1[0]), E.Var(v2[0]) % 2))}


def skew_map(p: tn.TileProgram) -> dict:
    v1, v2 = level_vars(p, 1), level_vars(p, 2)
    return {2: Map(v1 + v2, (E.Var(v1[0]) + E.Var(v2[0]) // 2, E.Var(v2[0]) % 2))}


def ident_map(p: tn.TileProgram) -> dict:
    v1, v2 = level_vars(p, 1), level_vars(p, 2)
    return {2: Map(v1 + v2, (E.Var(v1[0]), E.Var(v2[0])))}


def law(dt: object, name: str) -> list[Obligation]:
    from tilenest.semantics.reducers import BUILTINS

    b = BUILTINS[name]
    out = RD.law_obligations(RD.builtin_merge(b), (b.identity(dt),), dt, 1, name, (),
                             need_comm=True)
    for o in out:
        o.role = "required"
    return [o for o in out if o.kind == "reduction.law.associative"]


def program_kind(k: tn.Kernel) -> list[Obligation]:
    from tilenest.proofs.report import program_obligations

    return program_obligations(prog(k))


CASES: list[Case] = [
    # --- transforms -----------------------------------------------------------
    Case("split: wrong div/mod (q + r*b)", "tau.cover",
         lambda: obs(T.split(prog(K.flat), 1, 0, 4, tau=lambda q, r: q + r * 4)),
         lambda: obs(T.split(prog(K.flat), 1, 0, 4))),
    Case("split: wrong stride (q*(b-1) + r)", "tau.injective",
         lambda: obs(T.split(prog(K.flat), 1, 0, 4, tau=lambda q, r: q * 3 + r)),
         lambda: obs(T.split(prog(K.flat), 1, 0, 4))),
    Case("split: tail guard dropped", "tau.function",
         lambda: obs(T.split(prog(K.flat), 1, 0, 4, guard=False)),
         lambda: obs(T.split(prog(K.flat), 1, 0, 4))),
    Case("split: floor outer extent loses the tail", "tau.cover",
         lambda: obs(T.split(prog(K.flat), 1, 0, 4, outer_extent=E.Sym("N") // 4)),
         lambda: obs(T.split(prog(K.flat), 1, 0, 4, outer_extent=E.cdiv(E.Sym("N"), 4)))),
    Case("split in place: tail guard dropped", "tau.function",
         lambda: obs(T.split(prog(K.flat), 1, 0, 8, nest=False, guard=False)),
         lambda: obs(T.split(prog(K.flat), 1, 0, 8, nest=False))),
    Case("fuse: fused extent loses the tail", "tau.cover",
         lambda: obs(T.fuse(prog(K.two), 1, extent=E.Sym("R") * 4 - 1)),
         lambda: obs(T.fuse(prog(K.two), 1))),
    Case("fuse: fused extent overshoots", "tau.function",
         lambda: obs(T.fuse(prog(K.two), 1, extent=E.Sym("R") * 4 + 1)),
         lambda: obs(T.fuse(prog(K.two), 1))),
    Case("fuse across the home of acc (identity cut)", "cut.identity",
         lambda: obs(T.fuse(prog(K.owner), 1)),
         lambda: obs(T.permute(prog(K.mem_owner2), 1, [1, 0, 2]))),
    Case("fuse across a memory owner (identity cut)", "cut.identity",
         lambda: obs(T.fuse(prog(K.mem_owner2), 1, linear=False)),
         lambda: obs(T.permute(prog(K.mem_owner2), 1, [1, 0, 2]))),
    Case("permute across a memory-owner cut", "cut.factor",
         lambda: obs(T.interchange(prog(K.mem_owner), 1)),
         lambda: obs(T.permute(prog(K.mem_owner2), 1, [1, 0, 2]))),
    Case("permute an axis out of the memory owner's level", "cut.factor",
         lambda: obs(T.permute(prog(K.mem_owner2), 1, [0, 2, 1])),
         lambda: obs(T.permute(prog(K.mem_owner2), 1, [1, 0, 2]))),
    Case("coalesce with a wrong radix", "tau.injective",
         coalesce_wrong_radix, lambda: obs(T.coalesce(prog(K.grid8), 1))),
    Case("reshape that changes the cardinality", "tau.cover",
         lambda: obs(T.reshape(prog(K.grid8), 1, [E.Sym("R"), 4])),
         lambda: obs(T.reshape(prog(K.grid8), 1, [E.Sym("R") * 2, 4]))),
    Case("remove a level that is not a unit", "tau.cover",
         lambda: obs(T.remove_unit(prog(K.flat), 1)),
         lambda: obs(T.remove_unit(prog(K.unit), 1))),
    Case("insert a 'unit' level of extent 2", "tau.injective",
         unit_of_two, lambda: obs(T.insert_unit(prog(K.flat), 1))),
    Case("tile with a floor outer extent", "tau.cover",
         lambda: obs(T.split(T.split(prog(K.grid8), 1, 1, 4), 1, 0, 2,
                             outer_extent=E.Sym("R") // 2)),
         lambda: obs(T.tile(prog(K.grid8), 1, [2, 4]))),
    # --- program: noninterference, bounds, coverage, ParallelMaps ---------------
    Case("racy store map y[p // 2]", "noninterference",
         lambda: program_kind(K.halves_bad), lambda: program_kind(K.flat)),
    Case("collective read of what children write", "noninterference",
         lambda: program_kind(K.read_back_bad), lambda: program_kind(K.shared_reads)),
    Case("inner level stores one element per outer instance", "noninterference",
         lambda: program_kind(K.inner_race_bad), lambda: program_kind(K.inner_ok)),
    Case("serial loop inside parallel stores y[t]", "noninterference",
         lambda: program_kind(K.serial_race_bad), lambda: program_kind(K.serial_ok)),
    Case("off-by-one read x[p + 1] (checked)", "bounds",
         lambda: program_kind(K.shift_bad), lambda: program_kind(K.shift_ok)),
    Case("off-by-one read x[p - 1] (assume)", "bounds",
         lambda: program_kind(K.back_bad), lambda: program_kind(K.back_ok)),
    Case("output misses its last element", "coverage.cover",
         lambda: program_kind(K.cover_bad), lambda: program_kind(K.flat)),
    Case("output element written twice by a serial loop", "coverage.once",
         lambda: program_kind(K.twice_bad), lambda: program_kind(K.once_ok)),
    Case("exec layout q // 2 is not injective", "parallel-map.injective",
         lambda: program_kind(K.layout_bad), lambda: program_kind(K.layout_ok)),
    Case("exec layout q + 1 leaves the domain", "parallel-map.into",
         lambda: program_kind(K.layout_out_bad), lambda: program_kind(K.layout_rot_ok)),
    # --- bindings ---------------------------------------------------------------
    Case("warp -> block binding", "binding.containment",
         lambda: custom_bind(K.two, "cuda", {1: "warp", 2: "block"}),
         lambda: custom_bind(K.two, "cuda", {1: "block", 2: "warp"})),
    Case("vector -> core binding on a CPU", "binding.containment",
         lambda: custom_bind(K.two, "cpu", {1: "vector", 2: "core"}),
         lambda: custom_bind(K.two, "cpu", {1: "core", 2: "vector"})),
    Case("Metal has no cluster scope", "binding.scope",
         lambda: custom_bind(K.two, "metal", {1: "cluster", 2: "thread"}),
         lambda: custom_bind(K.two, "metal", {1: "threadgroup", 2: "simdgroup"})),
    Case("2048 threads per block", "binding.limit",
         lambda: obs(BD.bind(T.split(prog(K.flat), 1, 0, 2048), "cuda",
                             {1: "block", 2: "thread"})),
         lambda: obs(BD.bind(T.split(prog(K.flat), 1, 0, 256), "cuda",
                             {1: "block", 2: "thread"}))),
    Case("symbolic extent bound to threads", "binding.limit",
         lambda: custom_bind(K.rowcol, "cuda", {1: "block", 2: "thread"}),
         lambda: obs(BD.bind(T.split(prog(K.rowcol), 2, 0, 256), "cuda",
                             {1: "block", 3: "thread"}))),
    Case("thread map q % 2 collapses instances", "binding.unique",
         lambda: custom_bind(K.two, "cuda", {1: "block", 2: "thread"}, collapse_map),
         lambda: custom_bind(K.two, "cuda", {1: "block", 2: "thread"}, ident_map)),
    Case("block id depends on the thread coordinate", "binding.projection",
         lambda: custom_bind(K.two, "cuda", {1: "block", 2: "thread"}, skew_map),
         lambda: custom_bind(K.two, "cuda", {1: "block", 2: "thread"})),
    # --- fusion and pipelines ---------------------------------------------------
    Case("fuse a rotated consumer", "fusion.dependence",
         lambda: obs(PH.fuse_phases(prog(K.rotate_bad), 1)),
         lambda: obs(PH.fuse_phases(prog(K.phases_ok), 1))),
    Case("fuse a WAR across instances", "fusion.dependence",
         lambda: obs(PH.fuse_phases(prog(K.war_bad), 1)),
         lambda: obs(PH.fuse_phases(prog(K.war_ok), 1))),
    Case("pipeline window too small for its buffers", "pipeline.versions",
         lambda: obs(PH.schedule_pipeline(prog(K.gemv), 0, window=3, versions=2, offsets=[0, 2])),
         lambda: obs(PH.schedule_pipeline(prog(K.gemv), 0, window=3, versions=3, offsets=[0, 2]))),
    Case("pipeline consumer issued with its producer", "pipeline.dependence",
         lambda: obs(PH.schedule_pipeline(prog(K.gemv), 0, offsets=[0, 0])),
         lambda: obs(PH.schedule_pipeline(prog(K.gemv), 0, offsets=[0, 1]))),
    Case("pipeline overlaps more iterations than its window", "pipeline.window",
         lambda: obs(PH.schedule_pipeline(prog(K.gemv), 0, window=2, offsets=[0, 3])),
         lambda: obs(PH.schedule_pipeline(prog(K.gemv), 0, window=2, interval=2,
                                          offsets=[0, 3]))),
    Case("fuse serial loops whose consumer reads ahead", "fusion.order",
         lambda: obs(SF.fuse_serial(prog(K.serial_pair_bad), 0)),
         lambda: obs(SF.fuse_serial(prog(K.serial_pair), 0))),
    Case("fuse serial loops with a WAR edge going back", "fusion.order",
         lambda: obs(SF.fuse_serial(prog(K.serial_war_bad), 0)),
         lambda: obs(SF.fuse_serial(prog(K.serial_war), 0))),
    # --- Memory layouts ---------------------------------------------------------
    Case("swizzle that XORs onto the bits it reads (4M elements)", "layout.injective",
         lambda: program_kind(K.swizzled_bad), lambda: program_kind(K.swizzled)),
    Case("swizzled Memory with a size 8 elements short", "layout.range",
         lambda: program_kind(K.swizzled_small), lambda: program_kind(K.swizzled)),
    Case("broadcast row stride over symbolic extents", "layout.injective",
         lambda: program_kind(K.sym_layout_bad), lambda: program_kind(K.sym_layout)),
    Case("XOR of a symbolic row offset with the column", "layout.injective",
         lambda: program_kind(K.xor_layout_bad), lambda: program_kind(K.sym_layout)),
    # --- reductions -------------------------------------------------------------
    Case("strided placement of an ordered_tree reduction", "reduction.order",
         lambda: obs(RD.place_reduction(prog(K.ordered), 0, 4, "strided")),
         lambda: obs(RD.place_reduction(prog(K.ordered), 0, 4, "blocked"))),
    Case("placing a fold_left reduction", "reduction.permission",
         lambda: obs(RD.place_reduction(prog(K.folded), 0, 4)),
         lambda: obs(RD.place_reduction(prog(K.ordered), 0, 4))),
    Case("placement with too few steps", "reduction.cover",
         lambda: obs(RD.place_reduction(prog(K.isum), 0, 4, "strided",
                                        steps=E.Sym("C") // 4)),
         lambda: obs(RD.place_reduction(prog(K.isum), 0, 4, "strided"))),
    Case("float add is not associative (i32 add is)", "reduction.law.associative",
         lambda: law(f32, "add"), lambda: law(i32, "add")),
    # --- races beyond storage noninterference ----------------------------------
    Case("overlapping put patches of an ancestor value", "noninterference.join",
         lambda: program_kind(K.patches_bad), lambda: program_kind(K.patches)),
    Case("pipeline window wider than the distance of a tensor relay",
         "noninterference.pipeline",
         lambda: program_kind(K.relay_bad), lambda: program_kind(K.relay)),
]

