"""Tensor-core ``mma`` (``loopir.WarpMma``): lowering, proofs, emission, emulation.

On SIMT schedules a reassociating f16/bf16 -> f32 ``mma`` of constant,
16-aligned tile extents runs in warp tiles of ``mma.m16n8k16``
(``lowering/mma.tensor_plan``). The emulator executes ``ldmatrix`` and
``mma.sync`` by the PTX fragment layouts, so the oracle judges the generated
source itself; the serialized form (llvm) runs each lane's reference. The
barrier-sufficiency proof sees every access a lane of the collective may
make, and a wrong fragment mapping in the emitter is caught by validation.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.backends.cuda.emit import Emitter
from tilenest.errors import TilenestError
from tilenest.lowering import default_schedule, lower_verified, print_kernel
from tilenest.lowering import loopir as L
from tilenest.lowering.mma import warp_tile
from tilenest.proofs import barriers
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E
from tilenest.workloads import WORKLOADS


def _gemm(bm, bn, bk, dt=tn.bf16, loop="pipeline"):  # type: ignore[no-untyped-def]
    return WORKLOADS["gemm"].kernel(dt, {"bm": bm, "bn": bn, "bk": bk, "loop": loop})


@pytest.mark.parametrize("rows,cols,warps,want", [
    (64, 64, 8, (32, 16)), (128, 128, 8, (64, 32)), (32, 32, 2, (32, 16)),
    (16, 16, 8, (16, 16)), (64, 16, 2, (32, 16)), (128, 64, 4, (64, 32))])
def test_warp_tile_shapes(rows, cols, warps, want):
    wm, wn = warp_tile(rows, cols, warps)
    assert (wm, wn) == want
    assert rows % wm == 0 and cols % wn == 0
    assert (rows // wm) * (cols // wn) >= warps or (wm, wn) == (16, 16)


def test_cuda_bf16_gemm_lowers_to_warp_tiles():
    kern = _gemm(64, 64, 32)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda"))
    text = print_kernel(k)
    mmas = [s for ph in k.phases for s in L.walk(ph.body) if isinstance(s, L.WarpMma)]
    assert len(mmas) == 1 and (mmas[0].m, mmas[0].n, mmas[0].k) == (32, 16, 32)
    assert mmas[0].lane is not None and "mma on tensor cores" in text
    # no per-thread FMA nest is left for the contraction
    assert not any(isinstance(x, L.Fma) for ph in k.phases for s in L.walk(ph.body)
                   for e in L.stmt_exprs(s) for x in L.subexprs(e))


@pytest.mark.parametrize("dt,loop,why", [
    (tn.f32, "pipeline", "f16 or bf16"),
])
def test_tensor_unit_refused_with_the_reason(dt, loop, why):
    kern = _gemm(64, 64, 32, dt, loop)
    with pytest.raises(TilenestError, match=why) as e:
        lower_verified(kern.program, default_schedule(kern.program, "cuda", mma_unit="tensor"))
    assert e.value.hint and "mma_unit" in e.value.hint


def test_untileable_extents_fall_to_simt_with_a_note():
    kern = _gemm(16, 8, 8)  # columns and contraction not multiples of 16
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda"))
    text = print_kernel(k)
    assert "warp_mma" not in text and "mma on the SIMT units: tile 16x8x8" in text
    with pytest.raises(TilenestError, match="multiples of 16"):
        lower_verified(kern.program, default_schedule(kern.program, "cuda", mma_unit="tensor"))


def test_bad_mma_unit_is_a_schedule_error():
    kern = _gemm(64, 64, 32)
    with pytest.raises(TilenestError, match="mma_unit='gpu'"):
        lower_verified(kern.program, default_schedule(kern.program, "cuda", mma_unit="gpu"))


def test_accumulator_tile_lives_in_the_lanes_registers():
    """The GEMM's accumulator is filled, updated and read out only by its
    owners (lowering/fragments.py): a local buffer of each thread's 16
    elements, no shared copy, no barrier around it; the loop steps are
    ldmatrix + mma.sync on those registers."""
    kern = _gemm(32, 32, 16)  # 32 x 16 warp tiles on 2 warps: 2 x 2 mma blocks per step
    sched = default_schedule(kern.program, "cuda", block_threads=64)
    ir = print_kernel(lower_verified(kern.program, sched))
    assert re.search(r"local %acc\S*\.frag\d+: f32\[16\]", ir)
    assert not re.search(r"shared %acc", ir) and "lane cells of 16 cols" in ir
    ck = cuda.compile_program(kern.program, sched, device="emulated")
    text = ck.source.text
    loop = text[text.index("for (v_kk"):]
    loop = loop[:loop.index("\n  }\n")]
    assert loop.count("tn_mma_bf16(&b__acc") == 4 and "tn_ldsm_x4_t(" in loop
    # the accumulator is a thread's array, with no pointer into shared memory
    assert re.search(r"\n\s*float b__acc\w*_frag\d+\[16\];", text)
    assert not re.search(r"float\* const b__acc", text)


def test_accumulator_fragments_stay_in_registers(monkeypatch):
    """Where the tile must stay in shared memory (here: the register tile is
    switched off), the fragments are still kept in registers across the
    contraction loop: loaded before it, stored after it."""
    from tilenest.lowering import fragments

    monkeypatch.setattr(fragments, "MAX_CELLS", 0)
    kern = _gemm(32, 32, 16)  # 32 x 16 warp tiles on 2 warps: 2 x 2 mma blocks per step
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                             block_threads=64),
                              device="emulated", cache=False)
    text = ck.source.text
    assert "resident across the loop" in text
    loop = text[text.index("for (v_kk"):]
    loop = loop[:loop.index("(store)")]
    steps = loop[loop.index("(steps)"):]
    # inside the contraction loop: fragments from shared by ldmatrix, mma.sync,
    # and no access to the accumulator buffer
    assert "b__acc" not in steps
    assert steps.count("tn_mma_bf16(") == 4 and "tn_ldsm_x4_t(" in steps


def _validate(kern, dt, M, K, N, sched, runs=2, cache=True):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(M * 1000 + N)
    npdt = dt.np
    A = rng.standard_normal((M, K)).astype(npdt)
    B = rng.standard_normal((K, N)).astype(npdt)
    oracle = tn.reference(kern, A, B, np.zeros((M, N), npdt))
    if sched.target == "cuda":
        ck = cuda.compile_program(kern.program, sched, cache=cache, device="emulated")
        assert "tn_mma_" in ck.source.text
        for policy, poison in (("in_order", "nan"), ("random", "big"))[:runs]:
            C = np.zeros((M, N), npdt)
            ck(A, B, C, policy=policy, poison=poison, seed=3)
            v = oracle.admits(C)
            assert v.ok, f"{policy}/{poison}: {v}"
    else:
        ck = kern.compile(target="llvm", schedule=sched)
        C = np.zeros((M, N), npdt)
        ck(A, B, C)
        v = oracle.admits(C)
        assert v.ok, str(v)


_SHAPES = [(32, 32, 16, "pipeline", 64), (64, 16, 32, "pipeline", 64),
           (32, 32, 32, "reduce", 128), (64, 64, 32, "pipeline", 256)]


@pytest.mark.parametrize("dt,bm,bn,bk,loop,threads", [
    pytest.param(dt, *shape, id=f"{dt.name}-{shape[0]}x{shape[1]}x{shape[2]}-{shape[3]}-"
                 f"{shape[4]}", marks=() if dt == tn.bf16 or i == 0 else pytest.mark.slow)
    for dt in (tn.bf16, tn.f16) for i, shape in enumerate(_SHAPES)])
def test_tensor_gemm_validates_emulated(dt, bm, bn, bk, loop, threads):
    """Ragged sizes (tails in every dim, at least three contraction steps)
    against the oracle under two interleavings and poisons (bf16 in every
    shape by default, f16 in one; the other f16 shapes under -m slow)."""
    kern = _gemm(bm, bn, bk, dt, loop)
    sched = default_schedule(kern.program, "cuda", block_threads=threads)
    _validate(kern, dt, bm + 5, 3 * bk + 3, bn + 7, sched)


@pytest.mark.parametrize("stages", [1, 2, 3], ids=["single", "double-buffered", "3-stage"])
def test_serialized_tensor_form_validates_on_llvm(stages):
    """The same loop IR on the CPU: each lane's reference contraction (and
    the multi-stage loop, serialized)."""
    kern = _gemm(32, 32, 16)
    sched = default_schedule(kern.program, "llvm", block_threads=64, mma_unit="tensor",
                             stages=stages)
    text = print_kernel(lower_verified(kern.program, sched))
    assert "warp_mma" in text and (f"{stages}-stage ring" in text) == (stages > 1)
    _validate(kern, tn.bf16, 37, 51, 39, sched)


def test_wrong_fragment_mapping_is_caught(monkeypatch):
    """Mutation: ``ldmatrix`` of B without the transpose hands each lane the
    wrong elements; the emulated run must be rejected by the oracle."""
    real = Emitter.ldsm

    def wrong(self, f, u, regs, i0, j0, pair):  # type: ignore[no-untyped-def]
        return real(self, f, u, regs, i0, j0, pair).replace("tn_ldsm_x4_t(", "tn_ldsm_x4(")

    monkeypatch.setattr(Emitter, "ldsm", wrong)
    kern = _gemm(32, 32, 16)
    sched = default_schedule(kern.program, "cuda", block_threads=64)
    with pytest.raises(AssertionError, match="not admitted"):
        _validate(kern, tn.bf16, 32, 48, 32, sched, runs=1, cache=False)


@pytest.mark.parametrize("stages", [1, 2, 3], ids=["single", "double-buffered", "3-stage"])
def test_dropped_barrier_in_the_contraction_loop_is_refuted(stages):
    """Mutation: without the last barrier of each contraction step, a lane may
    read an operand element another thread is writing (single buffer: the
    tile copy of the same step; multi-stage: the copy of a later step into
    the version being read); the proof names the buffer."""
    kern = _gemm(32, 32, 16)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda", block_threads=64,
                                                      stages=stages))
    loops = [s for ph in k.phases for s in L.walk(ph.body)
             if isinstance(s, L.For) and s.kind == "serial"
             and any(isinstance(w, L.WarpMma) for w in L.walk(s.body))
             and any(isinstance(t, L.For) and t.kind == "thread" for t in L.walk(s.body))]
    assert len(loops) == 1
    loop = loops[0]
    assert any("-stage ring" in getattr(s, "text", "") for ph in k.phases
               for s in L.walk(ph.body)) == (stages > 1)
    last = max(i for i, s in enumerate(loop.body) if isinstance(s, L.Barrier))
    cut = replace(loop, body=loop.body[:last] + loop.body[last + 1:])

    def swap(body: tuple) -> tuple:
        return tuple(cut if s is loop else replace(s, body=swap(s.body))
                     if isinstance(s, L.For) else s for s in body)

    bad = replace(k, phases=tuple(replace(ph, body=swap(ph.body)) for ph in k.phases))
    good = barriers.check_barriers(k)
    # (a solver timeout on a loaded machine may leave one unknown: never refuted)
    assert not [o for o in good if o.status == "refuted"]
    assert any(o.status == "proved" and re.search(r"%(a|b)\.\d+", o.title) for o in good)
    # the accumulator lives in each thread's registers: nothing to order
    assert not any("conflict on %acc" in o.title for o in good)
    obs = barriers.check_barriers(bad)
    refuted = [o for o in obs if o.status == "refuted"]
    assert refuted, [o.status for o in obs]
    assert any(re.search(r"%(a|b)\.\d+", o.title) for o in refuted)


def _copy_then_use(consumer_reads_local: bool) -> tuple:
    """A loop ``for k: barrier; for.thread t: x = k; X[t] = A[k, t];
    barrier; Y[k] = X[0] (+ x)`` and its phase, as loop IR."""
    k, t, x = L.LVar("k", L.INDEX), L.LVar("t", L.INDEX), L.LVar("x", L.INDEX)
    A = L.Buffer("A", D.f32, "global", E.Const(64), 0)
    Y = L.Buffer("Y", D.f32, "global", E.Const(8), 1)
    X = L.Buffer("X", D.f32, "shared", E.Const(32))
    kv, tv = E.Var("k"), E.Var("t")
    prod = L.For(t, E.Const(0), E.Const(32), (
        L.Assign(x, L.IExpr(kv)),
        L.Store(X, L.IExpr(tv), L.Load(A, L.IExpr(E.add(E.mul(kv, 8), tv))))), "thread",
        scope="block")
    val: L.Expr = L.Load(X, L.IExpr(E.Const(0)))
    if consumer_reads_local:
        val = L.Bin("add", val, L.Cast(L.Ref(x), D.f32), D.f32)
    cons = L.Store(Y, L.IExpr(kv), val)
    loop = L.For(k, E.Const(0), E.Const(8), (L.Barrier("block"), prod, L.Barrier("block"),
                                             cons))
    return loop, (L.Assign(x, L.IExpr(E.Const(0))), loop), {"X": X}


def test_double_buffer_needs_an_independent_consumer():
    """The rewrite runs P(k + 1) before C(k): it applies to a consumer that
    reads only the produced tiles, and not when the consumer reads a local the
    producer assigns (it would see the next iteration's value)."""
    from tilenest.lowering.double_buffer import plan

    loop, body, bufs = _copy_then_use(False)
    assert plan(loop, [body], bufs) is not None
    loop, body, bufs = _copy_then_use(True)
    assert plan(loop, [body], bufs) is None
    # a buffer another phase touches cannot change size
    loop, body, bufs = _copy_then_use(False)
    other = (L.Store(bufs["X"], L.IExpr(E.Const(0)), L.Const(1.0, bufs["X"].dtype)),)
    assert plan(loop, [body, other], bufs) is None


@pytest.mark.parametrize("stages", [3, pytest.param(4, marks=pytest.mark.slow)])
def test_ring_gemm_validates_emulated(stages):
    """An S-stage ring (``Schedule.stages``): more than ``2 S`` contraction
    steps with a ragged tail, so every version is reused; the emulator lands
    each ``cp.async`` only when a wait orders it, so an early read would see
    the poison. (Three stages by default, four under -m slow.)"""
    kern = _gemm(32, 32, 16)
    sched = default_schedule(kern.program, "cuda", block_threads=64, stages=stages)
    text = print_kernel(lower_verified(kern.program, sched))
    assert f"barrier block keep={stages - 2}" in text and f"{stages}-stage ring" in text
    _validate(kern, tn.bf16, 37, (2 * stages + 1) * 16 + 5, 39, sched)


def _ring(stages: int, keep: int) -> L.Kernel:
    """The loop IR of a ring GEMM whose loop-top barrier has ``keep`` instead
    of ``stages - 2``."""
    kern = _gemm(32, 32, 16)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda", block_threads=64,
                                                      stages=stages))

    def fix(body: tuple) -> tuple:
        out = []
        for s in body:
            if isinstance(s, L.For):
                b = s.body
                if b and isinstance(b[0], L.Barrier) and b[0].keep == stages - 2 and \
                        any(isinstance(w, L.WarpMma) for w in L.walk(b)):
                    b = (replace(b[0], keep=keep),) + b[1:]
                s = replace(s, body=fix(b))
            elif isinstance(s, L.If):
                s = replace(s, then=fix(s.then), orelse=fix(s.orelse))
            out.append(s)
        return tuple(out)

    return replace(k, phases=tuple(replace(ph, body=fix(ph.body)) for ph in k.phases))


def test_ring_keep_is_proved_and_one_more_is_refuted():
    """Barrier sufficiency with copies in flight: ``keep = S - 2`` at the
    loop top is proved; ``keep = S - 1`` lets the copy into the version being
    read run on past the barrier, refuted with the operand buffer named and
    the hint to lower the keep."""
    good = barriers.check_barriers(_ring(3, 1))
    assert not [o for o in good if o.status == "refuted"]
    assert any(o.status == "proved" and re.search(r"%(a|b)\.\d+", o.title) for o in good)
    bad = [o for o in barriers.check_barriers(_ring(3, 2)) if o.status == "refuted"]
    assert bad and any(re.search(r"%(a|b)\.\d+", o.title) for o in bad)
    assert any("lower the keep" in line for o in bad for line in o.counterexample_lines())


def test_ring_wait_one_group_short_is_caught_by_the_emulator(mutate_source):
    """Mutation of the emitted code: waiting for one group fewer than the
    barrier's ``keep`` says leaves the version a step reads still in flight;
    the emulator (copies land at the wait) feeds the poison to the ``mma``
    and the oracle rejects the result."""
    mutate_source("tn_cp_async_wait<1>()", "tn_cp_async_wait<2>()")
    kern = _gemm(32, 32, 16)
    sched = default_schedule(kern.program, "cuda", block_threads=64, stages=3)
    with pytest.raises(AssertionError, match="not admitted"):
        _validate(kern, tn.bf16, 32, 7 * 16, 32, sched, runs=1, cache=False)


def test_register_tile_needs_every_access_elementwise(monkeypatch):
    """``fragments.plan`` keeps the accumulator in registers only when every
    access besides the ``mma`` is an elementwise nest over the whole tile:
    one more read of one element (a non-owner may make it) keeps it in
    shared memory, as does a tile over the register budget."""
    from tilenest.lowering import fragments, lower
    from tilenest.lowering.simt import _nest

    kern = _gemm(64, 64, 32)
    k = lower(kern.program, default_schedule(kern.program, "cuda"))
    body = k.phases[0].body
    plans = fragments.plan(body, 256, _nest)
    assert list(plans) == ["%acc_4.4"] and plans["%acc_4.4"].cells == 16
    acc = plans["%acc_4.4"].buf
    x = L.LVar("x.probe", D.f32)
    extra = body + (L.Assign(x, L.Load(acc, L.IExpr(E.Const(5)))),)
    assert fragments.plan(extra, 256, _nest) == {}
    # one warp takes all 8 warp tiles: 128 cells per thread, within the budget
    assert fragments.plan(body, 32, _nest)["%acc_4.4"].reps == 8
    monkeypatch.setattr(fragments, "MAX_CELLS", 64)
    assert fragments.plan(body, 32, _nest) == {}


def _overflow_case(far: bool):  # type: ignore[no-untyped-def]
    """A 64 x 64 x 64 bf16 product whose output (0, 0) sums -1.13e38 * 3.16
    (beyond f32's range alone) and 1.74 * 1.69e38 (exact sum -6.13e37), at
    k = 4 and k = 60 (two instructions' chunks) or k = 4 and 9 (one)."""
    a = np.zeros((64, 64), np.float32)
    b = np.zeros((64, 64), np.float32)
    k2 = 60 if far else 9
    a[0, 4], b[4, 0] = -1.1298437964171785e38, 3.15625
    a[0, k2], b[k2, 0] = 1.7421875, 1.6947656946257677e38
    return a.astype(tn.bf16.np), b.astype(tn.bf16.np)


def _overflow_runs(unit: str, device: str) -> None:
    kern = _gemm(64, 64, 64)
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                            mma_unit=unit), device=device)
    for far, want in ((True, -np.inf), (False, -6.134698738358899e37)):
        a, b = _overflow_case(far)
        c = np.zeros((64, 64), tn.bf16.np)
        ck(a, b, c)
        assert float(c[0, 0]) == float(np.float32(want).astype(tn.bf16.np)), (far, c[0, 0])
        assert tn.reference(kern, a, b, np.zeros((64, 64), tn.bf16.np)).admits(c)


@pytest.mark.parametrize("unit", ["tensor", "wgmma"])
def test_a_tensor_core_partial_beyond_f32_is_infinite_as_on_the_gpu(unit):
    """The emulated tensor cores round a step's sum toward zero, but a sum
    beyond f32's range is the infinity (not the largest finite value), as
    an H100 gave: -inf when the two products fall in different instructions,
    the exact sum when one instruction sums both (its own sum is wider).
    Both results are admitted by the oracle."""
    _overflow_runs(unit, "emulated")


@pytest.mark.device
@pytest.mark.parametrize("unit", ["tensor", "wgmma"])
def test_a_tensor_core_partial_beyond_f32_on_the_gpu(unit):
    """The device behavior the emulator's rule follows."""
    _overflow_runs(unit, "gpu")
