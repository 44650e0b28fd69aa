"""Lowering: Candidate TileIR -> Scheduled TileIR -> loop IR.

Stages (each inspectable; ``tilenest lower --emit NAME``):

* ``schedule`` -- the :class:`Schedule` (default per target, or given), with
  the storage plan of intermediates and any transforms applied through the
  proofs layer (``schedule.apply_transforms``);
* ``loopir``   -- :func:`lower` builds the :class:`~tilenest.lowering.loopir.Kernel`,
  ``simt.py`` distributes each program over threads when the schedule asks
  (``block_threads``; ``inplace.py`` first computes a tile copied back into
  another in that tile, ``fusion.py`` fuses row folds with the row nests
  after them -- its legality shared with the CPU's loop fusion --, and
  ``fragments.py`` keeps tensor-core accumulator tiles and the tiles around
  them in the lanes' registers), ``double_buffer.py`` overlaps the production of
  the next tiles with the consumption of the current ones, ``lifetimes.py``
  lets shared buffers of disjoint lifetimes share storage, ``mma_waits.py``
  waits for each warpgroup mma where its result is first needed, and
  :func:`verify_kernel` checks it; ``serialize.py``
  turns the SIMT form back into one thread per program for the CPU.

Backends consume the loop IR (``tilenest.backends.llvm``).
"""

from __future__ import annotations

from dataclasses import replace

from ..errors import NotAvailableError, TilenestError
from ..semantics import expr as E
from . import loopir
from .bulk_copy import bulk_copies
from .invariants import hoist_divisions
from .core import RULES, lower, target_row
from .loopir import Kernel, print_kernel
from .schedule import Schedule, default_schedule, host_vector_bits, storage_plan
from .verify import verify_kernel

__all__ = ["RULES", "Kernel", "Schedule", "default_schedule", "host_vector_bits", "lower",
           "loopir", "print_kernel", "storage_plan", "verify_kernel", "lower_verified"]


def lower_verified(program, schedule: Schedule | None = None, maps: list | None = None
                   ) -> Kernel:
    """:func:`lower`, then the SIMT form when the schedule asks for threads
    per program (``block_threads``; the task maps of its distributions are
    appended to ``maps``) with its passes (buffering, in-place reuse, async
    staging, rows in registers), then :func:`verify_kernel`.

    ``mma_unit="auto"`` on a target with warpgroup tensor cores first lowers
    the program for them (``mma.warpgroups_first``); when some ``mma`` does
    not fit their plan, some step of the SIMT form refuses that lowering, or
    its shared buffers cannot fit a block, the program is lowered again as
    ``auto`` says elsewhere (``mma.sync`` where the plan allows, else SIMT
    arithmetic). Both lowerings are deterministic, so the choice is a
    function of the program and the schedule."""
    from .mma import warpgroups_first

    prof = target_row(schedule.target).profile if schedule is not None else None
    if prof is not None and warpgroups_first(program, schedule, prof):
        tried: list = []
        try:
            k = _lower_simt(program, replace(schedule, mma_unit="wgmma"), tried)
        except TilenestError:
            pass
        else:
            need = loopir.shared_bytes(k)
            if not (isinstance(need, E.Const) and need.value > prof.shared_bytes):
                if maps is not None:
                    maps.extend(tried)
                return k
    return _lower_simt(program, schedule, maps)


def _loop_sites(program):  # type: ignore[no-untyped-def]
    """The source site of the region op that introduced a loop-IR loop
    variable (``kk.7`` -> the op whose ``vars`` holds ``kk``), by name."""
    where = {v: op.loc for op in program.walk() if op.regions
             for v in op.attrs.get("vars", ())}
    return lambda name: where.get(name.rsplit(".", 1)[0])


#: the ring depths ``Schedule.stages=None`` tries for a ring it can
#: warp-specialize, deepest first: the warp-specialized GEMMs measured fastest
#: at 4 versions (bf16 128 x 256 x 64 and FP8 128 x 256 x 128 on an H200; 5
#: gave nothing more at 128 x 128, spec/lowering.md L-12)
AUTO_STAGES = (4, 3)
#: the ring depth ``stages=None`` keeps for any other ring (double buffering:
#: the measured default of rings on block barriers, attention's key loop)
PLAIN_STAGES = 2


def _lower_simt(program, schedule: Schedule | None, maps: list | None) -> Kernel:
    """:func:`lower_verified` for the schedule's own ``mma_unit``."""
    from .simt import simt_kernel

    k = lower(program, schedule)
    if schedule is None or not schedule.block_threads:
        if schedule is not None and schedule.warp_roles:
            from ..errors import UsageError

            raise UsageError("warp_roles needs the SIMT form (block_threads)",
                             hint="warp_roles is a cuda schedule field")
        k = bulk_copies(k)
        verify_kernel(k)
        return k
    k = simt_kernel(k, schedule.block_threads, schedule.vector_lanes, maps)
    _check_simt_fields(schedule)
    if schedule.stages is not None and schedule.warp_roles is not None:
        return _ring(k, program, schedule, schedule.stages, schedule.warp_roles)
    return _auto_ring(k, program, schedule)


def _auto_ring(k: Kernel, program, schedule: Schedule) -> Kernel:
    """The SIMT kernel ``k`` finished with the ring the schedule leaves to the
    lowering (``stages`` or ``warp_roles`` None): a ring that can be
    warp-specialized is, with the most versions of :data:`AUTO_STAGES` whose
    shared buffers fit a block (and whose producer warp fits the thread
    limit); otherwise no ring is specialized and it keeps the given
    ``stages``, or :data:`PLAIN_STAGES`. Deterministic: a function of the
    program and the schedule."""
    from .warp_roles import PRODUCERS

    prof = target_row(schedule.target).profile
    depths = AUTO_STAGES if schedule.stages is None else (schedule.stages,)
    # asked for, the roles are tried whatever the threads (the resource check
    # then says the producer warp is too many); chosen, only where it fits
    room = schedule.block_threads + PRODUCERS <= prof.max_threads
    if schedule.warp_roles or (schedule.warp_roles is None and room):
        for stages in (d for d in depths if d >= 3):
            try:
                got = _ring(k, program, schedule, stages, True)
            except NotAvailableError:  # no ring of the kernel qualifies (warp_roles says why)
                if schedule.warp_roles:
                    raise
                break
            need = loopir.shared_bytes(got)
            if isinstance(need, E.Const) and need.value <= prof.shared_bytes:
                return got
    if schedule.warp_roles:
        from ..errors import UsageError

        raise UsageError(f"warp_roles: no ring of {program.name} fits a block at "
                         f"{' or '.join(map(str, depths))} versions", program.loc,
                         hint="use smaller tiles, or give Schedule.stages")
    return _ring(k, program, schedule,
                 PLAIN_STAGES if schedule.stages is None else schedule.stages, False)


def _ring(k: Kernel, program, schedule: Schedule, stages: int, roles: bool) -> Kernel:
    """The SIMT kernel ``k`` with its loops buffered in ``stages`` versions,
    its staging passes, bulk copies and (``roles``) warp-specialized rings,
    verified."""
    if stages > 1:
        from .double_buffer import double_buffer

        k = double_buffer(k, stages)
    from .async_copy import async_staging
    from .inplace import reuse_in_place
    from .row_registers import keep_rows_in_registers

    k = keep_rows_in_registers(async_staging(reuse_in_place(k)), schedule.row_registers)
    k = hoist_divisions(k)
    k = bulk_copies(k)
    if roles:
        from .warp_roles import warp_roles

        # a ring on one barrier a step (its consumer computing between its
        # mmas: attention) only when asked for: not measured faster yet
        k = warp_roles(k, stages, schedule.block_threads, _loop_sites(program),
                       plain=schedule.warp_roles is True)
    from .lifetimes import share_disjoint

    from .mma_waits import defer_mma_waits

    k = defer_mma_waits(share_disjoint(k))
    verify_kernel(k)
    return k


def _check_simt_fields(schedule: Schedule) -> None:
    """Refuse a SIMT schedule field of the wrong type or range (a
    ``UsageError`` naming it and a value that would do)."""
    from ..errors import UsageError

    if schedule.stages is not None and (not isinstance(schedule.stages, int)
                                        or not 1 <= schedule.stages <= 8):
        raise UsageError(f"stages={schedule.stages!r}: versions of each produced tile, "
                         "an int in [1, 8] (None: the lowering's choice)",
                         hint="e.g. Schedule(stages=3); 1 turns the buffering off")
    if schedule.warp_roles is not None and not isinstance(schedule.warp_roles, bool):
        raise UsageError(f"warp_roles={schedule.warp_roles!r}: True, False or None "
                         "(the lowering's choice)", hint="e.g. Schedule(warp_roles=True)")
    if schedule.min_blocks is not None and (
            not isinstance(schedule.min_blocks, int) or isinstance(schedule.min_blocks, bool)
            or schedule.min_blocks < 1):
        raise UsageError(f"min_blocks={schedule.min_blocks!r}: blocks per multiprocessor "
                         "the registers must allow, a positive int (or None)",
                         hint="e.g. Schedule(min_blocks=8) for 256-thread blocks")
    if schedule.grid_blocks is not None and (
            not isinstance(schedule.grid_blocks, int) or isinstance(schedule.grid_blocks, bool)
            or schedule.grid_blocks < 1):
        raise UsageError(f"grid_blocks={schedule.grid_blocks!r}: the most blocks a parallel "
                         "phase launches, a positive int (or None)",
                         hint="e.g. Schedule(grid_blocks=1056): 132 multiprocessors "
                              "holding 8 blocks each")
    if not isinstance(schedule.cache_hints, bool):
        raise UsageError(f"cache_hints={schedule.cache_hints!r}: L2 policies on wide "
                         "global accesses, True or False",
                         hint="e.g. Schedule(cache_hints=True)")
    if (not isinstance(schedule.row_registers, int) or isinstance(schedule.row_registers, bool)
            or not 0 <= schedule.row_registers <= 64):
        raise UsageError(f"row_registers={schedule.row_registers!r}: elements of a "
                         "thread-private row each thread keeps in registers, an int in "
                         "[0, 64]", hint="e.g. Schedule(row_registers=32); 0 keeps such "
                         "rows in shared memory")
    if schedule.index_bits not in (32, 64):
        raise UsageError(f"index_bits={schedule.index_bits!r}: the width of index "
                         "arithmetic, 32 or 64", hint="e.g. Schedule(index_bits=64)")
