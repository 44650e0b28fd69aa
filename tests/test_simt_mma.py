"""The SIMT realization of ``mma`` and the register promotion of the CUDA emitter.

``lowering/mma.py`` distributes the micro-tiles of an ``mma`` output over the
block's threads (:func:`simt_tile` picks their shape), and the CUDA emitter
keeps a thread's accumulators in registers across the contraction loop
(``Emitter.promoted_loop``). The results are judged by the oracle on the
emulator and on the serialized SIMT form (llvm); the shapes are read off the
loop IR and the generated source.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import loopir as L
from tilenest.lowering.mma import SIMT_TILE, simt_tile
from tilenest.semantics import expr as E
from tilenest.workloads import WORKLOADS


@pytest.mark.parametrize("rows,cols,threads,want", [
    (64, 64, 256, (4, 4)), (32, 32, 256, (2, 2)), (128, 128, 256, (8, 8)),
    (16, 16, 256, (1, 1)), (64, 32, 256, (2, 4)), (24, 64, 32, (4, 8)),
    (256, 256, 32, (8, 8))])
def test_simt_tile_shapes(rows, cols, threads, want):
    tm, tn_ = simt_tile(E.Const(rows), E.Const(cols), threads)
    assert (tm, tn_) == want
    # the micro-tiles divide the output and still number at least `threads`
    # (or the tile is 1 x 1), each side a power of two within bounds
    assert rows % tm == 0 and cols % tn_ == 0 and max(tm, tn_) <= SIMT_TILE
    assert (rows // tm) * (cols // tn_) >= threads or (tm, tn_) == (1, 1)


def test_simt_tile_is_one_for_symbolic_extents():
    assert simt_tile(E.Sym("M"), E.Const(64), 256) == (1, 1)


def _gemm(bm, bn, bk, dt=tn.f32):  # type: ignore[no-untyped-def]
    wl = WORKLOADS["gemm"]
    return wl, wl.kernel(dt, {"bm": bm, "bn": bn, "bk": bk, "loop": "pipeline"})


def _thread_loops(k: L.Kernel) -> list[L.For]:
    return [s for ph in k.phases for s in L.walk(ph.body)
            if isinstance(s, L.For) and s.kind == "thread"]


def test_mma_is_one_distributed_nest_per_contraction_step():
    """64 x 64 tiles on 256 threads: one thread loop runs the whole mma (a
    4 x 4 micro-tile per thread, 16 updates per contraction step), and each
    operand tile is loaded by one thread loop (not row by row)."""
    _, kern = _gemm(64, 64, 32)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda"))
    loops = _thread_loops(k)
    fma_loops = [lp for lp in loops if any(isinstance(x, L.Fma) for s in L.walk(lp.body)
                                           for e in L.stmt_exprs(s) for x in L.subexprs(e))]
    assert len(fma_loops) == 1
    inner = [s for s in L.walk(fma_loops[0].body) if isinstance(s, L.For) and s.kind == "serial"
             and all(isinstance(t, L.Store) for t in s.body)]
    assert inner and max(len(s.body) for s in inner) == 16
    # loads of A and B tiles: exactly one thread loop each per contraction step
    steps = [s for ph in k.phases for s in L.walk(ph.body)
             if isinstance(s, L.For) and s.kind == "serial" and s.var.name.startswith("kk")]
    assert len(steps) == 1
    inner_loops = [s for s in L.walk(steps[0].body)
                   if isinstance(s, L.For) and s.kind == "thread"]
    for tile in ("%a.", "%b."):
        writers = [lp for lp in inner_loops
                   if any(isinstance(s, L.Store) and s.buf.name.startswith(tile)
                          for s in L.walk(lp.body))]
        assert len(writers) == 1, (tile, len(writers))  # not row by row


def test_accumulators_live_in_registers_across_the_contraction():
    # the kernel and (default, 256-thread) schedule of the 64 x 64 x 16 case of
    # test_simt_gemm_validates below: one build (the compile cache) for both
    _, kern = _gemm(64, 64, 16)
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda"),
                              device="emulated")
    assert ck.schedule.block_threads == 256
    text = ck.source.text
    m = re.search(r"registers across the loop\n((?:.*\n){16})", text)
    assert m, "no promoted loop in the gemm kernel"
    assert all(" tn_rg_" in ln for ln in m.group(1).splitlines())  # 16 accumulators
    # inside the contraction loop no accumulator element is read or written in memory
    loop = text[m.end():text.index("}", m.end())]
    assert "b__acc" not in loop and loop.count("fmaf(") == 16


@pytest.mark.parametrize("target,bm,bn,bk,threads", [
    pytest.param(t, *shape, id=f"{shape[0]}-{shape[1]}-{shape[2]}-{shape[3]}-{t}",
                 marks=pytest.mark.slow if (t, shape[3]) == ("cuda", 64) else ())
    for shape in ((64, 64, 16, 256), (32, 64, 16, 64)) for t in ("cuda", "llvm")])
def test_simt_gemm_validates(target, bm, bn, bk, threads):
    """Ragged sizes (tails in every dim) against the oracle: the emulated CUDA
    build and the serialized SIMT form on llvm (the 64-thread emulated build,
    about 30 s, under -m slow: the f32 GEMM workloads cover that path)."""
    wl, kern = _gemm(bm, bn, bk)
    rng = np.random.default_rng(7)
    M, K, N = bm + 5, 3 * bk + 3, bn + 7
    A = rng.standard_normal((M, K)).astype(np.float32)
    B = rng.standard_normal((K, N)).astype(np.float32)
    C = np.full((M, N), np.nan, np.float32)
    sched = default_schedule(kern.program, target, block_threads=threads)
    if target == "cuda":
        ck = cuda.compile_program(kern.program, sched, device="emulated")
    else:
        ck = kern.compile(target="llvm", schedule=sched)
    ck(A, B, C)
    verdict = tn.reference(kern, A, B, np.full((M, N), np.nan, np.float32)).admits(C)
    assert verdict.ok, str(verdict)
