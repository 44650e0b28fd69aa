"""Row reductions over tensor-core accumulators kept in registers.

A score tile ``S = Q K^T`` whose rows are then reduced (attention's row
maximum and row sum) stays in the lanes' registers in the ``mma`` fragment
layout (``lowering/fragments.py``, :class:`~tilenest.lowering.fragments.RowFold`):
each lane folds the cells of the rows it owns, the four lanes of a quad
combine by ``LaneReduce`` of width 4, and when several warps share a row
(``tn > 1``) their partials meet in a ``shared`` scratch. Tiles of the same
shape read only at their own element (the mask, the probabilities, the
running accumulator) follow the tile into registers.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.lowering import default_schedule, lower_verified, print_kernel
from tilenest.lowering import loopir as L
from tilenest.semantics import expr as E
from tilenest.workloads.attention import flash_kernel
from test_tensor_mma_dims import _attention_inputs


def row_stats(policy):  # type: ignore[no-untyped-def]
    @tn.kernel
    def stats(q: tn.Tensor[tn.bf16, "T D"], k: tn.Tensor[tn.bf16, "S D"],
              mx: tn.Tensor[tn.f32, "T"], sm: tn.Tensor[tn.f32, "T"],
              p: tn.Tensor[tn.f32, "T S"], *, bq=64, bk=16, dh=32):
        """Per row of ``q k^T``: the maximum, the sum of ``exp(s - max)`` and
        the probabilities themselves, in ``bq x bk`` tiles (one key tile)."""
        nt, nd = q.shape
        ns = k.shape[0]
        t, d = q.dims()
        s = k.dim(0)
        kk = k.with_dims(s, d)
        tn.assume(ns <= bk)
        tn.assume(nd <= dh)
        for prog in tn.parallel(tn.shape(tn.cdiv(nt, bq)), exec=tn.exec.block):
            i = prog.index(0)
            qt = q[tn.coord(i * bq, 0), tn.shape(bq, dh), tn.bounds.zero]
            kt = kk[tn.coord(0, 0), tn.shape(bk, dh), tn.bounds.zero]
            sc = tn.mma(qt, kt, tn.zeros(tn.f32, tn.shape(bq, bk), dims=(t, s)),
                        allow_reassociation=True)
            pair = tn.shape(tn.axis(t, bq), tn.axis(s, bk))
            seen = tn.index_tile(pair, lambda a, j: j) < ns
            sc = tn.ite(seen, sc, -np.inf)
            m = tn.reduce(sc, s, tn.maximum, policy=policy)
            e = tn.exp(sc - m)
            mx(tn.coord(i * bq), tn.shape(bq)).store(m)
            sm(tn.coord(i * bq), tn.shape(bq)).store(tn.reduce(e, s, tn.add, policy=policy))
            p(tn.coord(i * bq, 0), tn.shape(bq, bk)).store(e)

    return stats


def _inputs(T=100, S=13, D=29):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(T + S + D)
    q = rng.standard_normal((T, D)).astype(tn.bf16.np)
    k = rng.standard_normal((S, D)).astype(tn.bf16.np)
    return q, k


def _lowered(kern, threads):  # type: ignore[no-untyped-def]
    return lower_verified(kern.program, default_schedule(kern.program, "cuda",
                                                         block_threads=threads))


def _locals(k):  # type: ignore[no-untyped-def]
    return {b.name for b in k.locals if b.space == "local"}


def _admitted(ck, kern, before, outs, after=(), seed=0, emulated=True):  # type: ignore[no-untyped-def]
    """Run ``ck(*before, *outs, *after)`` on copies of the outputs ``outs``
    (on the emulator: in order with NaN poison, then a random interleaving
    with large poison) and assert the oracle of ``kern`` admits each output."""
    oracle = tn.reference(kern, *before, *(o.copy() for o in outs), *after)
    adms = oracle if isinstance(oracle, tuple) else (oracle,)
    runs = (("in_order", "nan"), ("random", "big")) if emulated else ((None, None),)
    for policy, poison in runs:
        got = tuple(o.copy() for o in outs)
        kw = {"policy": policy, "poison": poison, "seed": seed} if emulated else {}
        ck(*before, *got, *after, **kw)
        for adm, out in zip(adms, got, strict=True):
            verdict = adm.admits(out)
            assert verdict.ok, f"{policy}/{poison}: {verdict}"


@pytest.mark.parametrize("bk,threads,tn_", [(16, 128, 1), (64, 128, 1), (64, 256, 4)])
def test_row_folds_keep_the_score_tile_in_registers_and_validate(bk, threads, tn_):
    """One warp column per row of tiles (``tn = 1``: each quad finishes its
    rows) and four (partials through shared scratch): the score tile, its
    exponentials and the mask live in registers, the folds combine in quads,
    and the emulated kernel is admitted by the oracle under two
    interleavings."""
    kern = row_stats(tn.unordered_tree).specialize(bk=bk)
    k = _lowered(kern, threads)
    body = [s for ph in k.phases for s in L.walk(ph.body)]
    quads = [s for s in body if isinstance(s, L.LaneReduce) and s.width == 4]
    assert {s.op for s in quads} == {"maximum", "add"}
    scratch = [b for b in k.locals if b.name.startswith("rowpart_")]
    assert bool(scratch) == (tn_ > 1)
    shared = [b for b in k.locals if b.space == "shared" and not b.name.startswith("rowpart_")]
    # the operand tiles and the row vectors stay in shared memory, no f32 tile
    assert all(b.dtype == tn.bf16 or b.size.value <= 64 for b in shared), shared
    assert len([n for n in _locals(k) if ".frag" in n]) >= 3
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                             block_threads=threads),
                              device="emulated")
    q, kk = _inputs(S=bk - 3)
    outs = (np.zeros(100, np.float32), np.zeros(100, np.float32),
            np.zeros((100, bk - 3), np.float32))
    _admitted(ck, kern, (q, kk), outs, seed=3)


def test_a_strict_row_fold_keeps_the_tile_in_memory():
    """``fold_left`` fixes the order of the sum: its fold may not be regrouped
    into quads, so the score tile stays in shared memory (one row per thread,
    in order)."""
    kern = row_stats(tn.fold_left).specialize(bk=16)
    k = _lowered(kern, 128)
    body = [s for ph in k.phases for s in L.walk(ph.body)]
    assert not any(isinstance(s, L.LaneReduce) and s.width == 4 for s in body)
    assert any(b.space == "shared" and b.dtype == tn.f32 and b.size.value == 64 * 16
               for b in k.locals)


def test_attention_keeps_scores_probabilities_and_accumulator_in_registers():
    """The attention kernel's score tile, its mask and probabilities and the
    running accumulator are lane fragments (``P V`` accumulates into the
    rescaled accumulator itself: no copy of it, ``inplace.absorb_copies_back``):
    shared memory holds the operand tiles (Q, K, V and P in bf16), the row
    vectors of the online softmax and the row folds' partials."""
    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=64, dh=128, dv=128)
    k = _lowered(kern, 256)
    frags = [b for b in k.locals if ".frag" in b.name]
    assert len(frags) == 4 and {b.size.value for b in frags} == {16, 32}
    (pv,) = [w for ph in k.phases for w in L.walk(ph.body)
             if isinstance(w, L.WarpMma) and w.n == 32]
    assert pv.c.buf.name.startswith("%acc")
    shared = [b for b in k.locals if b.space == "shared"]
    big = [b for b in shared if b.size.value > 256]
    assert len(big) == 4 and all(b.dtype == tn.bf16 for b in big)
    (loop,) = [s for ph in k.phases for s in ph.body if isinstance(s, L.For)
               and s.kind == "serial"]
    inner = list(L.walk(loop.body))
    assert sum(1 for s in inner if isinstance(s, L.LaneReduce) and s.width == 4) == 2
    assert sum(1 for s in inner if L.is_block_barrier(s)) <= 8



def test_attention_key_and_value_tiles_are_double_buffered():
    """With its score tile cleared in registers, the key-block loop's
    producer is only the K and V tile loads: they are copied asynchronously
    into a 2-stage ring (the next block's tiles in flight while this one is
    consumed), the register clear moved behind the ring's barrier; the
    emulated kernel validates, and without the ring the same kernel keeps
    synchronous loads."""
    kern = flash_kernel(tn.bf16).specialize(bq=32, bk=32, dh=32, dv=32)
    for stages in (1, 2):
        k = lower_verified(kern.program, default_schedule(kern.program, "cuda",
                                                          block_threads=128, stages=stages))
        text = print_kernel(k)
        assert ("2-stage ring: " in text) == (stages == 2)
        assert ("(async) k[" in text and "(async) v[" in text) == (stages == 2)
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                             block_threads=128),
                              device="emulated")
    q, kk, v, o0, sc = _attention_inputs(tn.bf16)
    _admitted(ck, kern, (q, kk, v), (o0,), (sc,), seed=2)


def test_ring_tiles_stay_in_flight_across_the_consumers_barriers():
    """The key-block loop's consumer has block barriers of its own (the row
    states and P pass through shared memory): the next block's K and V
    copies stay in flight across them and land at the next iteration's top
    barrier (every barrier of the loop keeps ``ahead * (c + 1) - 1`` groups,
    ``c`` the consumer's barriers; the prologue commits its copies as the
    loop does). The barrier proof proves the rewritten kernel; one barrier
    more of lag lets a copy land after the tile is read, which it refutes;
    the emulated kernel validates."""
    from dataclasses import replace

    from tilenest.lowering import double_buffer as DB
    from tilenest.proofs.barriers import check_barriers
    from tilenest.proofs.obligation import PROVED, REFUTED

    kern = flash_kernel(tn.bf16).specialize(bq=32, bk=32, dh=32, dv=32)
    sched = default_schedule(kern.program, "cuda", block_threads=128)
    k = lower_verified(kern.program, sched)
    (loop,) = [s for ph in k.phases for s in ph.body
               if isinstance(s, L.For) and s.kind == "serial"]
    keeps = [s.keep for s in loop.body if L.is_block_barrier(s)]
    c = len(keeps) - 1
    assert c >= 1 and keeps == [c] * (c + 1), keeps  # ahead = 1: keep = c everywhere
    assert all(o.status == PROVED for o in check_barriers(k))

    def late(body: tuple) -> tuple:
        return tuple(replace(s, keep=s.keep + 1) if L.is_block_barrier(s) else s for s in body)

    ph = k.phases[0]
    bad = replace(k, phases=(replace(ph, body=tuple(
        replace(s, body=late(s.body)) if s is loop else s for s in ph.body)),))
    assert any(o.status == REFUTED for o in check_barriers(bad))
    assert DB.consumer_barriers((L.Barrier("block"), L.If(L.IPred(E.TRUE),
                                                           (L.Barrier("block"),)))) == 0

    ck = cuda.compile_program(kern.program, sched, device="emulated")
    q, kk, v, o0, sc = _attention_inputs(tn.bf16)
    _admitted(ck, kern, (q, kk, v), (o0,), (sc,), seed=3)


def test_attention_row_statistics_live_in_the_quads_registers():
    """With the scores and ``P V`` in whole-row warp tiles of one layout,
    the online softmax's row vectors (the running maximum and sum, alpha and
    the folds' results) are registers of the lanes owning each row: no
    shared buffer of one element per row is left, the row folds' statements
    run in every lane of the quad (no ``lane % 4 == 0`` guard), and the key
    loop's consumer has no block barrier; the emulated kernel validates,
    causal and not, ragged."""
    from tilenest.lowering import fragments

    for causal in (True, False):
        kern = flash_kernel(tn.bf16).specialize(bq=64, bk=32, dh=32, dv=32, causal=causal)
        k = _lowered(kern, 128)
        rows = [b for b in k.locals if ".rows" in b.name]
        assert len(rows) == 6 and all(b.space == "local" and b.size.value == 2 for b in rows)
        assert not [b for b in k.locals if b.space == "shared" and b.size.value == 64]
        (loop,) = [s for ph in k.phases for s in ph.body
                   if isinstance(s, L.For) and s.kind == "serial"]
        # the ring's barrier alone: P is a register operand of P V as well
        assert sum(1 for s in L.walk(loop.body) if L.is_block_barrier(s)) == 1
        assert "% 32 % 4 == 0" not in print_kernel(k)
        ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                                 block_threads=128),
                                  device="emulated")
        q, kk, v, o0, sc = _attention_inputs(tn.bf16, HQ=2, HK=1, Q=77, K=90, D=30)
        _admitted(ck, kern, (q, kk, v), (o0,), (sc,), seed=5)
    # without whole-row tiles (64 query rows on eight warps) the row vectors
    # have no layout of their own: they stay in shared memory
    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=32, dh=32, dv=32)
    k = _lowered(kern, 256)
    assert not [b for b in k.locals if ".rows" in b.name]
    assert [b for b in k.locals if b.space == "shared" and b.size.value == 64]


def test_attention_first_operands_are_the_lanes_registers():
    """With whole-row warp tiles, attention's ``Q`` (first operand of ``Q
    K^T``, in the layout of the ``P V`` accumulator: 128 columns) and ``P``
    (first operand of ``P V``, computed in the scores' layout) are read by
    the tensor-core instruction from the lanes' own registers: shared memory
    holds only the key and value rings, and the emulated kernel validates.
    A lane-fragment first operand with other than ``k`` columns is refused
    by the verifier."""
    from dataclasses import replace

    from tilenest.errors import VerifyError
    from tilenest.lowering.verify import verify_kernel

    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=32, dh=32, dv=32, causal=False)
    k = _lowered(kern, 128)
    mmas = [w for ph in k.phases for w in L.walk(ph.body) if isinstance(w, L.WarpMma)]
    assert len(mmas) == 2 and all(w.a.lane_cols == w.k and w.a.buf.space == "local"
                                  for w in mmas)
    assert all(".frag" in w.a.buf.name for w in mmas)
    shared = [b for b in k.locals if b.space == "shared"]
    assert {b.name for b in shared} == {w.b.buf.name for w in mmas}  # the K and V rings
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                             block_threads=128),
                              device="emulated")
    q, kk, v, o0, sc = _attention_inputs(tn.bf16, HQ=2, HK=1, Q=77, K=90, D=30)
    _admitted(ck, kern, (q, kk, v), (o0,), (sc,), seed=7)
    w = mmas[0]
    bad = replace(w, a=replace(w.a, lane_cols=w.k // 2))

    def swap(x):  # noqa: ANN001, ANN202
        return (bad,) if x == w else None

    broken = replace(k, phases=tuple(replace(ph, body=L.map_stmts(ph.body, lambda e: None,
                                                                  swap))
                                     for ph in k.phases))
    with pytest.raises(VerifyError, match="first operand"):
        verify_kernel(broken)
    # a batched product's A tile, copied in from memory at every step of its
    # K loop (whole-row tiles of k columns too), stays a shared tile
    from tilenest.workloads import WORKLOADS

    bmm = WORKLOADS["bmm"].kernel(tn.f16, size="small")
    kb = lower_verified(bmm.program, default_schedule(bmm.program, "cuda"))
    (w,) = [w for ph in kb.phases for w in L.walk(ph.body) if isinstance(w, L.WarpMma)]
    assert not w.a.lane_cols and w.a.buf.space == "shared"


def test_row_reduced_scores_take_warp_tiles_spanning_whole_rows():
    """An ``mma`` whose rows are reduced prefers warp tiles spanning whole
    rows when they still give every warp a tile: attention's folds then
    finish within each warp (quads only, no partials through shared memory)
    and the kernel validates on the emulator. ``P V``, whose first operand
    is computed from the scores, takes them too (up to 128 wide), so its rows
    are owned by the warps owning them in the scores; the plain choice is
    kept where no such tile exists or nothing reduces the rows."""
    from tilenest.lowering.mma import warp_tile

    assert warp_tile(128, 64, 8, whole_rows=True) == (16, 64)
    assert warp_tile(128, 64, 8) == (32, 32)
    assert warp_tile(64, 64, 8, whole_rows=True) == warp_tile(64, 64, 8) == (32, 16)
    assert warp_tile(128, 128, 8, whole_rows=True) == (16, 128)
    assert warp_tile(128, 256, 8, whole_rows=True) == warp_tile(128, 256, 8)
    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=32, dh=32, dv=32)
    k = _lowered(kern, 128)
    text = print_kernel(k)
    # the scores and P V: whole rows
    assert text.count("64x32x32 in 16x32 warp tiles") == 2
    assert not [b for b in k.locals if b.name.startswith("rowpart_")]
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                             block_threads=128),
                              device="emulated")
    q, kk, v, o0, sc = _attention_inputs(tn.bf16, HQ=2, HK=1, Q=77, K=90, D=30)
    _admitted(ck, kern, (q, kk, v), (o0,), (sc,), seed=4)


@pytest.mark.device
@pytest.mark.parametrize("bk,threads", [(16, 128), (64, 128), (64, 256)])
def test_row_folds_validate_on_gpu(bk, threads):
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    kern = row_stats(tn.unordered_tree).specialize(bk=bk)
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                             block_threads=threads),
                              device="gpu")
    q, kk = _inputs(T=1000, S=bk - 3)
    outs = (np.zeros(1000, np.float32), np.zeros(1000, np.float32),
            np.zeros((1000, bk - 3), np.float32))
    _admitted(ck, kern, (q, kk), outs, emulated=False)


@pytest.mark.device
@pytest.mark.parametrize("bq,causal,min_blocks", [(64, True, None), (64, False, None),
                                                  (64, True, 2), (128, True, None),
                                                  (128, False, None)])
def test_attention_at_head_dim_128_validates_on_gpu(bq, causal, min_blocks):
    """The benchmark's tiles (64 or 128 x 64, D = 128, 256 threads), ragged GQA."""
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    kern = flash_kernel(tn.bf16).specialize(bq=bq, bk=64, dh=128, dv=128, causal=causal)
    ck = cuda.compile_program(kern.program, default_schedule(
        kern.program, "cuda", block_threads=256, min_blocks=min_blocks), device="gpu")
    q, k, v, o0, sc = _attention_inputs(tn.bf16, B=2, Q=130, K=200, D=128)
    _admitted(ck, kern, (q, k, v), (o0,), (sc,), emulated=False)


@pytest.mark.parametrize("Q,K", [(77, 90), (90, 77), (64, 200), (130, 130)],
                         ids=["more-keys", "more-queries", "long-keys", "square-ragged"])
def test_causal_attention_with_unmasked_key_blocks_first(Q, K):
    """``split=True``: the causal key loop runs the blocks every query row of
    the block sees whole without computing a mask, then the diagonal (or
    ragged last) blocks with it; the online-softmax state flows from one loop
    into the other. The oracle judges the split kernel against its own
    meaning, emulated, including query blocks with no unmasked key block and
    key blocks cut by the end of the keys; and the split kernel computes what
    the unsplit one does."""
    outs = []
    q, kk, v, o0, sc = _attention_inputs(tn.bf16, HQ=2, HK=1, Q=Q, K=K, D=30)
    for split in (False, True):
        kern = flash_kernel(tn.bf16).specialize(bq=32, bk=16, dh=32, dv=32, causal=True,
                                                split=split)
        ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                                 block_threads=128),
                                  device="emulated")
        _admitted(ck, kern, (q, kk, v), (o0,), (sc,), seed=5)
        o = o0.copy()
        ck(q, kk, v, o, sc, policy="in_order", poison="nan", seed=5)
        outs.append(o)
    # the same products, exponentials and folds in the same order: the same bits
    assert np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))
    text = print_kernel(_lowered(kern, 128))
    assert len(re.findall(r"^ *for kb(_1)?\.\d+ in ", text, re.M)) == 2  # two key loops


def test_register_planning_gathers_the_reads_of_a_phase_once(monkeypatch):
    """The register plans (``fragments.plan``, ``plan_rows``) ask, for nest
    after nest, whether a local it assigns is read outside it. The reads of
    the phase are gathered once per plan (``fragments.Readers``): asking each
    statement again per question made a plan quadratic in the phase's size
    (860,000 reads gathered for one prefetching attention kernel, two thirds
    of its compile time)."""
    from tilenest.lowering import fragments

    inside, calls, sizes = [False], [0], []
    real = L.own_references

    def counting(s):  # type: ignore[no-untyped-def]
        calls[0] += inside[0]
        return real(s)

    def counted(fn):  # type: ignore[no-untyped-def]
        def run(body, *a, **kw):  # type: ignore[no-untyped-def]
            sizes.append(sum(1 for _ in L.walk(body)))
            inside[0] = True
            try:
                return fn(body, *a, **kw)
            finally:
                inside[0] = False
        return run

    monkeypatch.setattr(L, "own_references", counting)
    for name in ("plan", "plan_rows"):
        monkeypatch.setattr(fragments, name, counted(getattr(fragments, name)))
    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=64, dh=64, dv=64, causal=True,
                                            split=True, prefetch=True)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda", block_threads=128))
    assert len([n for n in _locals(k) if ".frag" in n]) >= 3  # the plan still takes them
    assert sizes and 0 < calls[0] <= sum(sizes), (calls[0], sizes)
