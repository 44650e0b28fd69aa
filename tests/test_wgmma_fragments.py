"""Warpgroup tensor-core tiles kept in registers (``lowering/fragments.py``
with ``group = 4``).

A ``wgmma`` tile of 64 rows spanning whole rows of its output (one
warpgroup per row of tiles, ``tn = 1``) gives each of its rows to one warp
of the group, in the same per-warp layout as ``mma.sync``. So the row folds
of attention's scores run in quads there as they do for warp tiles, the row
statistics live in the quads' registers, and the probabilities, computed in
the scores' layout, are the first operand of ``P V`` straight from the
lanes' registers (``wgmma``'s register-A form): no score, probability or
accumulator tile in shared memory, and one block barrier per key block.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import loopir as L
from tilenest.workloads import WORKLOADS
from tilenest.workloads.attention import flash_kernel
from test_fragment_rows import _admitted, _inputs, row_stats
from test_tensor_mma_dims import _attention_inputs

WG = {"mma_unit": "wgmma"}


def _sched(kern, threads):  # type: ignore[no-untyped-def]
    return default_schedule(kern.program, "cuda", block_threads=threads, **WG)


def _mmas(k):  # type: ignore[no-untyped-def]
    return [w for ph in k.phases for w in L.walk(ph.body) if isinstance(w, L.WarpMma)]


def test_row_folds_over_a_warpgroup_tile_run_in_quads_and_validate():
    """The score tile of one ``wgmma`` (64 x 64, one warpgroup) is a lane
    fragment; its row maximum and sum fold in quads (no partials in shared
    memory), the mask and the exponentials follow it into registers, and the
    emulated kernel is admitted by the oracle under two interleavings."""
    kern = row_stats(tn.unordered_tree).specialize(bq=64, bk=64, dh=64)
    k = lower_verified(kern.program, _sched(kern, 128))
    (w,) = _mmas(k)
    assert w.group == 4 and w.c.lane_cols == 64 and w.c.buf.space == "local"
    body = [s for ph in k.phases for s in L.walk(ph.body)]
    quads = [s for s in body if isinstance(s, L.LaneReduce) and s.width == 4]
    assert {s.op for s in quads} == {"maximum", "add"}
    assert not [b for b in k.locals if b.name.startswith("rowpart_")]
    assert not [b for b in k.locals if b.space == "shared" and b.dtype == tn.f32
                and b.size.value >= 64 * 64]
    ck = cuda.compile_program(kern.program, _sched(kern, 128), device="emulated")
    assert "wgmma.mma_async" in ck.source.text
    q, kk = _inputs(T=100, S=61, D=60)
    outs = (np.zeros(100, np.float32), np.zeros(100, np.float32),
            np.zeros((100, 61), np.float32))
    _admitted(ck, kern, (q, kk), outs, seed=3)


@pytest.mark.parametrize("bq,threads,causal", [(64, 128, True), (128, 256, True),
                                               (128, 256, False)])
def test_attention_on_warpgroups_keeps_its_tiles_in_registers(bq, threads, causal):
    """Both products of the attention kernel on ``wgmma`` with one warpgroup
    per 64 query rows: the scores, mask, probabilities and accumulator are
    lane fragments, the row statistics the quads' registers, ``P`` the
    first operand of ``P V`` from registers; shared memory holds only the
    query, key and value tiles (``Q``, loaded once, is read through its
    descriptor), the loop meets one block barrier per key block, and the
    emulated kernel validates for ragged GQA shapes."""
    kern = flash_kernel(tn.bf16).specialize(bq=bq, bk=64, dh=64, dv=64, causal=causal)
    k = lower_verified(kern.program, _sched(kern, threads))
    qk, pv = _mmas(k)
    assert qk.group == pv.group == 4
    assert not qk.a.lane_cols and qk.a.buf.space == "shared" and qk.a.buf.layout is not None
    assert pv.a.lane_cols == pv.k and pv.a.buf.space == "local"
    assert all(w.c.lane_cols and w.c.buf.space == "local" for w in (qk, pv))
    shared = {b.name for b in k.locals if b.space == "shared" and b.size.value > 64}
    assert shared == {qk.a.buf.name, qk.b.buf.name, pv.b.buf.name}  # Q, K, V
    assert [b for b in k.locals if ".rows" in b.name]
    (loop,) = [s for ph in k.phases for s in ph.body if isinstance(s, L.For)
               and s.kind == "serial"]
    assert sum(1 for s in L.walk(loop.body) if L.is_block_barrier(s)) == 1
    ck = cuda.compile_program(kern.program, _sched(kern, threads), device="emulated")
    q, kk, v, o0, sc = _attention_inputs(tn.bf16, HQ=2, HK=1, Q=77, K=150, D=60)
    _admitted(ck, kern, (q, kk, v), (o0,), (sc,), seed=11)


def test_a_zero_accumulator_starts_in_the_warpgroup_mma():
    """``Q K^T`` adds into ``tn.zeros``: its ``wgmma`` is ``fresh`` (scale-d 0
    on the first step, no statement zeroes the scores first), while ``P V``
    adds into the rescaled accumulator and reads it; the verifier refuses a
    fresh accumulator anywhere but a warpgroup's mma. A 3-version ring
    overlaps neither (the softmax reads the scores at once and writes ``P``,
    the register operand of ``P V``, while it would run on: the emulator
    reported that write), and the kernel validates emulated."""
    from dataclasses import replace

    from tilenest.backends.cuda.emit import emit_cuda
    from tilenest.lowering.verify import VerifyError, verify_kernel

    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=64, dh=64, dv=64, causal=True)
    k = lower_verified(kern.program, _sched(kern, 128))
    qk, pv = _mmas(k)
    assert qk.fresh and not pv.fresh
    stored = {s.buf.name for ph in k.phases for s in L.walk(ph.body) if isinstance(s, L.Store)}
    assert qk.c.buf.name not in stored and pv.c.buf.name in stored
    text = emit_cuda(k).text
    calls = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("tn_wgmma_bf16_n64")]
    assert calls[0].endswith(", 0);") and all(c.endswith(", 1);") for c in calls[1:])
    bad = replace(k, phases=tuple(replace(ph, body=L.map_stmts(
        ph.body, lambda x: None,
        lambda s: (replace(s, group=1),) if isinstance(s, L.WarpMma) and s.fresh
        else None)) for ph in k.phases))
    with pytest.raises(VerifyError, match="fresh accumulator"):
        verify_kernel(bad)
    ring = default_schedule(kern.program, "cuda", block_threads=128, stages=3,
                            warp_roles=False, **WG)
    k3 = lower_verified(kern.program, ring)
    qk3, pv3 = _mmas(k3)
    # the ring keeps no mma in flight across its barriers (attention reads
    # its scores at once); the waits pass completes them where needed
    assert qk3.fresh and not pv3.fresh
    assert not any(isinstance(s, L.Barrier) and s.mma_keep for ph in k3.phases
                   for s in L.walk(ph.body))
    ck = cuda.compile_program(kern.program, ring, device="emulated")
    q, kk, v, o0, sc = _attention_inputs(tn.bf16, HQ=2, HK=1, Q=70, K=131, D=60)
    _admitted(ck, kern, (q, kk, v), (o0,), (sc,), seed=5)


def _tile_product():  # type: ignore[no-untyped-def]
    """One 64 x 64 x 64 product into ``tn.zeros``, stored as it is."""
    from tilenest import bf16, f32

    @tn.kernel
    def tile_mm(a: tn.Tensor[bf16, "M K"], b: tn.Tensor[bf16, "K N"],
                c: tn.Tensor[f32, "M N"]):
        b = b.with_dims(a.dim(1), b.dim(1))
        c = c.with_dims(a.dim(0), b.dim(1))
        for _ in tn.parallel(tn.shape(1)):
            at = a[tn.coord(0, 0), tn.shape(64, 64), tn.bounds.zero]
            bt = b[tn.coord(0, 0), tn.shape(64, 64), tn.bounds.zero]
            r = tn.mma(at, bt, tn.zeros(f32, tn.shape(64, 64), dims=(at.dim(0), bt.dim(1))),
                       allow_reassociation=True)
            c(tn.coord(0, 0), tn.shape(64, 64)).store(r)

    return tile_mm


@pytest.mark.parametrize("device", ["emulated", pytest.param("gpu", marks=pytest.mark.device)])
def test_a_fresh_accumulator_sums_negative_zeros_to_positive_zero(device):
    """Products that are all ``-0`` (``a = -0``, ``b = 1``) summed into
    ``tn.zeros`` give ``+0``, as ``+0 + sum`` does (the oracle pins the sign
    of that zero): on the device the fresh ``wgmma`` adds them with scale-d 0,
    from no accumulator at all, and must still give ``+0``; a random product
    validates too."""
    import ml_dtypes

    kern = _tile_product()
    sched = default_schedule(kern.program, "cuda", block_threads=128, **WG)
    (w,) = _mmas(lower_verified(kern.program, sched))
    assert w.fresh and w.group == 4
    if device == "gpu" and not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    ck = cuda.compile_program(kern.program, sched, device=device)
    b = np.ones((64, 64), ml_dtypes.bfloat16)
    for a in (np.full((64, 64), -0.0, ml_dtypes.bfloat16),
              np.random.default_rng(4).standard_normal((64, 64)).astype(ml_dtypes.bfloat16)):
        _admitted(ck, kern, (a, b), (np.zeros((64, 64), np.float32),),
                  emulated=device == "emulated")


@pytest.mark.device
@pytest.mark.parametrize("bq,threads,causal", [(64, 128, True), (128, 256, True),
                                               (128, 256, False)])
def test_attention_on_warpgroups_validates_on_gpu(bq, threads, causal):
    """The same kernels at D = 128 on the device, ragged GQA."""
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    kern = flash_kernel(tn.bf16).specialize(bq=bq, bk=64, dh=128, dv=128, causal=causal)
    ck = cuda.compile_program(kern.program, _sched(kern, threads), device="gpu")
    q, k, v, o0, sc = _attention_inputs(tn.bf16, B=2, Q=130, K=200, D=128)
    _admitted(ck, kern, (q, k, v), (o0,), (sc,), emulated=False)


@pytest.mark.parametrize("bq,threads,group", [(64, 128, 4), (128, 256, 4), (64, 256, 1),
                                              (128, 512, 1), (128, 128, 1)])
def test_auto_takes_warpgroups_where_each_owns_whole_rows(bq, threads, group):
    """Under ``mma_unit="auto"`` attention's unit-dim products run on
    warpgroups when each warpgroup gets one 64-row band of its own, else on
    ``mma.sync``: two warpgroups sharing a row of tiles would pass the
    probabilities through shared memory, and several bands a warpgroup
    (a form not measured) would hold several tiles' registers."""
    kern = flash_kernel(tn.bf16).specialize(bq=bq, bk=64, dh=64, dv=64)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda",
                                                      block_threads=threads))
    assert {w.group for w in _mmas(k)} == {group}


@pytest.mark.parametrize("bq,threads", [(64, 128), (128, 256), (256, 512)])
def test_the_default_schedule_gives_each_64_query_rows_a_warpgroup(bq, threads):
    """With no ``block_threads`` given, a program whose tensor-core products
    have unit dims gets one warpgroup per 64-row band of them
    (``mma.band_threads``), so ``auto`` runs them on warpgroups with their
    tiles in registers; a given ``block_threads`` is kept."""
    kern = flash_kernel(tn.bf16).specialize(bq=bq, bk=64, dh=64, dv=64)
    s = default_schedule(kern.program, "cuda")
    assert s.block_threads == threads
    assert {w.group for w in _mmas(lower_verified(kern.program, s))} == {4}
    assert default_schedule(kern.program, "cuda", block_threads=256).block_threads == 256
    assert cuda._schedule(kern.program, None).block_threads == threads


@pytest.mark.parametrize("make", [
    lambda: flash_kernel(tn.bf16).specialize(bq=32, bk=64, dh=64, dv=64),   # under 64 rows
    lambda: flash_kernel(tn.f32).specialize(bq=64, bk=64, dh=64, dv=64),    # f32: no tensor cores
    lambda: WORKLOADS["gemm"].kernel(tn.bf16, {"bm": 64, "bn": 64, "bk": 32}),  # 2-d operands
])
def test_other_programs_keep_the_rows_block_threads(make):
    kern = make()
    assert default_schedule(kern.program, "cuda").block_threads == 256
    assert default_schedule(kern.program, "metal").block_threads == 256  # no warpgroups there
