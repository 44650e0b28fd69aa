"""How many blocks of a tensor-core kernel a multiprocessor should hold.

``__launch_bounds__``' second argument (``Schedule.min_blocks``) caps each
thread's registers at ``registers / (min_blocks x threads)`` so that that
many blocks can be resident together. Left unset, ptxas sizes the registers
for one block, and a kernel whose shared memory would let two blocks share a
multiprocessor often gets one: its warps then wait on their own latencies
with nothing to switch to. :func:`default_min_blocks` is the choice made when
the schedule leaves the field unset. It changes speed only: a register cap
never changes what a kernel computes (ptxas spills to local memory where it
must, and a spill is a reported warning).

Measured on an H100 and an H200 (spec/lowering.md, the attention
benchmark): two blocks where their shared memory fits one multiprocessor
sped the causal prefill with 64 x 64 tiles up 1.49x; with 128 x 64 tiles,
whose shared memory admits one block, the cap only slowed it; a warpgroup
GEMM on 512 threads with four stages failed to compile under it (64
registers a thread, below what its ``wgmma`` needs). The prefill's private
tiles take 68 registers a thread of the 128 two blocks of 256 threads
leave; the accumulators of a 128 x 256 warpgroup GEMM on 256 threads take
all 128, which the rule keeps at one block. On the ``mma.sync`` GEMM at
4096^3 (an H100), two blocks took 128 x 128 x 32 tiles (64 registers of
accumulators a thread) from 169 to 262 TFLOP/s but 64 x 64 x 32 tiles (16)
from 146 down to 100, and left 128 x 128 x 64 on ``wgmma`` (64) and 32 x 32 x
16 (8) unchanged: hence the lower bound of a quarter. The bounds are fitted
to these six kernels, not derived.
"""

from __future__ import annotations

from typing import Any

from ...lowering import loopir as L
from ...semantics import expr as E


def register_words(k: L.Kernel) -> int:
    """32-bit registers each thread's private tiles take (``local`` buffers
    of constant size: the tensor-core accumulators and the tiles kept in the
    lanes' registers), rounded up."""
    nbytes = sum(b.size.value * max(1, b.dtype.itemsize) for b in k.locals
                 if b.space == "local" and isinstance(b.size, E.Const))
    return -(-nbytes // 4)


def default_min_blocks(k: L.Kernel, threads: int, profile: Any) -> int | None:
    """``min_blocks`` for SIMT-form kernel ``k`` on ``threads`` threads a block
    when the schedule leaves it unset: 2 for a kernel with tensor-core steps
    (``WarpMma``) whose shared memory (a constant: ``loopir.shared_bytes``,
    plus what the system reserves per block) fits twice in one
    multiprocessor and whose private tiles take between a quarter and three
    quarters of the registers the cap of two blocks leaves a thread (below,
    the kernel holds more blocks without the cap, and the cap only changed
    ptxas's choices for the worse; above, too little is left for addresses
    and temporaries); else None (ptxas decides)."""
    if not threads or not any(isinstance(s, L.WarpMma) for ph in k.phases
                              for s in L.walk(ph.body)):
        return None
    need = L.shared_bytes(k)
    if not isinstance(need, E.Const):
        return None
    if 2 * (need.value + profile.reserved_shared_bytes) > profile.sm_shared_bytes:
        return None
    cap = profile.registers_per_block // (2 * threads)
    return 2 if cap <= 4 * register_words(k) <= 3 * cap else None
