"""Warp-specialized rings (``Schedule.warp_roles``: ``lowering/warp_roles.py``,
``loopir.Roles``, the CUDA rule ``CudaEmitter.roles_loop``).

A ring whose producers are bulk tensor copies and whose consumer only runs
warpgroup mmas becomes one loop with a ``Roles`` permission: its body is the
sequential meaning (produce, barrier, consume, barrier), and on the device a
producer warp runs up to ``S`` steps ahead of the consumers, the two handing
each version over through ``full`` and ``empty`` completion barriers. The
emulator runs the specialized source: a copy lands only when a consumer
waits on its ``full`` slot, so a consumer that does not wait reads poison.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.errors import TilenestError
from tilenest.lowering import bulk_copy as BC
from tilenest.lowering import default_schedule, lower_verified, print_kernel
from tilenest.lowering import loopir as L
from tilenest.lowering import warp_roles as WR
from tilenest.lowering.simt import block_threads
from tilenest.workloads import WORKLOADS
from test_cuda_tma import _gemm
from test_cuda_tma import _run as _run_tma


def _sched(kern, **kw):  # type: ignore[no-untyped-def]
    return default_schedule(kern.program, "cuda", **{"mma_unit": "wgmma", "tma": True,
                                                     "warp_roles": True, **kw})


def _run(ck, kern, M, K, N, runs=(("in_order", "nan"), ("random", "big"))):  # type: ignore[no-untyped-def]
    """``test_cuda_tma``'s run against the oracle, after checking that the
    call's arrays fit the tensor maps (so the specialized variant runs, not
    the element copies of ``tma=False``)."""
    A, B = np.zeros((M, K), tn.bf16.np), np.zeros((K, N), tn.bf16.np)
    assert ck.maps_fit([A, B, None], {"M": M, "K": K, "N": N})
    _run_tma(ck, kern, M, K, N, runs)


def _roles_loops(k: L.Kernel) -> list[L.For]:
    return [s for ph in k.phases for s in L.walk(ph.body)
            if isinstance(s, L.For) and s.roles is not None]


# ------------------------------------------------------------------ lowering
@pytest.mark.parametrize("stages", [3, 4])
def test_the_ring_becomes_one_loop_with_roles(stages):
    kern = _gemm(128, 256, 64)
    k = lower_verified(kern.program, _sched(kern, stages=stages))
    text = print_kernel(k)
    (loop,) = _roles_loops(k)
    r = loop.roles
    assert (r.stages, r.producers, r.consumers, r.split) == (stages, WR.PRODUCERS, 256, 1)
    # the prologue is gone: each operand is copied once, at step kk of the loop
    assert len(re.findall(r"bulk\(A\[", text)) == 1 and len(re.findall(r"bulk\(B\[", text)) == 1
    assert re.search(rf"bulk\(A\[128\*\$p0\.\d+, 64\*\$kk\.\d+\] 128x64 -> %a\.\d+\+8192\*"
                     rf"\(\$kk\.\d+ % {stages}\)\)", text)
    # the meaning: produce, barrier, consume, barrier (no keep: nothing overlaps as written)
    assert [type(x).__name__ for x in (loop.body[0], loop.body[1], loop.body[-1])] == \
        ["If", "Barrier", "Barrier"]
    assert all(not b.keep and not b.mma_keep for b in (loop.body[1], loop.body[-1]))
    assert not any(b.name == BC.BARRIERS for b in k.locals)  # no block-barrier groups left
    bars = next(b for b in k.locals if b.name == WR.ROLE_BARRIERS)
    assert int(bars.size.value) == 2 * stages
    assert block_threads(k)[k.phases[0].name] == 256 + WR.PRODUCERS


@pytest.mark.parametrize("kw,why", [
    ({"stages": 4, "tma": False}, "not all bulk tensor copies"),
    ({"stages": 4, "mma_unit": "tensor"}, "not all bulk tensor copies"),
])
def test_a_ring_that_cannot_be_specialized_is_an_error(kw, why):
    """The refusal says why and points at the user's loop (the ``pipeline``
    region the ring came from)."""
    kern = _gemm(128, 128, 64)
    with pytest.raises(TilenestError, match=f"warp_roles: no ring of gemm.*{why}") as err:
        lower_verified(kern.program, _sched(kern, **kw))
    (site,) = err.value.sites
    loop = next(op for op in kern.program.walk() if op.name == "pipeline")
    assert site == loop.loc and site.file.endswith("workloads/gemm.py")


def test_a_two_version_ring_runs_its_mmas_within_the_step():
    """Asked for with two versions (``stages=2``), a ring on one barrier a
    step is specialized in its plain form: each step's mma is waited for
    within the step and the step's own slot released after it
    (``release_lag = release_keep = 0``); it validates emulated on a ragged
    shape. The default schedule never picks that form (not measured faster)."""
    kern = _gemm(128, 128, 64)
    k = lower_verified(kern.program, _sched(kern, stages=2))
    (loop,) = _roles_loops(k)
    r = loop.roles
    assert (r.stages, r.release_lag, r.release_keep) == (2, 0, 0)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=2), device="emulated")
    assert "release step i-0 after mma_keep=0" in ck.source.text
    _run(ck, kern, 200, 328, 264)


def test_a_program_without_an_mma_ring_is_an_error():
    kern = WORKLOADS["softmax"].kernel(tn.f32, {"rp": 1})
    s = default_schedule(kern.program, "cuda", warp_roles=True, stages=3)
    with pytest.raises(TilenestError, match="warp_roles: no ring of"):
        lower_verified(kern.program, s)


# ------------------------------------------------------------------ the lowering's choice
@pytest.mark.parametrize("tile,threads,stages", [
    ((128, 256, 64), 256, 4),   # 48 KiB a version: 4 fit a block
    ((128, 128, 128), 256, 3),  # 64 KiB a version: 3 fit, 4 do not
    ((256, 256, 64), 512, 3),
])
def test_the_default_schedule_specializes_the_deepest_ring_that_fits(tile, threads, stages):
    """``stages`` and ``warp_roles`` left to the lowering (the cuda
    defaults): a ring that qualifies runs warp-specialized, as many versions
    deep (4, else 3) as fit the shared capacity."""
    kern = _gemm(*tile)
    s = default_schedule(kern.program, "cuda", block_threads=threads)
    assert (s.stages, s.warp_roles, s.mma_unit) == (None, None, "auto")
    k = lower_verified(kern.program, s)
    assert [lp.roles.stages for lp in _roles_loops(k)] == [stages]
    assert int(L.shared_bytes(k).value) <= 227 * 1024


def test_a_ring_too_large_to_specialize_keeps_two_block_barrier_versions():
    """96 KiB a version: three do not fit, so the ring is not specialized and
    keeps double buffering; asking for the roles says why."""
    kern = _gemm(128, 256, 128)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda"))
    assert _roles_loops(k) == [] and "2-stage ring" in print_kernel(k)
    with pytest.raises(TilenestError, match="no ring of gemm fits a block at 4 or 3 versions"):
        lower_verified(kern.program, default_schedule(kern.program, "cuda", warp_roles=True,
                                                      mma_unit="wgmma"))


@pytest.mark.parametrize("kw,roles,ring", [
    ({"warp_roles": False}, [], "2-stage ring"),           # no roles: double buffering
    ({"warp_roles": False, "stages": 4}, [], "4-stage ring"),
    ({"stages": 3}, [3], None),                            # the given depth, specialized
    ({"warp_roles": True}, [4], None),                     # the deepest that fits
    ({"stages": 2}, [], "2-stage ring"),                   # too shallow to specialize
    ({"tma": False}, [], "2-stage ring"),                  # no bulk copies to hand over
])
def test_a_given_field_is_kept_and_the_other_chosen(kw, roles, ring):
    kern = _gemm(128, 128, 64)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda", **kw))
    assert [lp.roles.stages for lp in _roles_loops(k)] == roles
    if ring is not None:
        assert ring in print_kernel(k)


def test_attention_keeps_its_two_version_ring_by_default():
    """A ring whose consumer does more than warpgroup mmas (attention's
    softmax) is not specialized: it keeps the measured 2-version ring."""
    kern = WORKLOADS["flash_attention"].kernel(tn.bf16, {"bq": 64, "bk": 64, "dh": 128,
                                                         "dv": 128, "causal": True})
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda", block_threads=128))
    text = print_kernel(k)
    assert _roles_loops(k) == [] and "2-stage ring" in text and "wgmma" in text


def test_the_default_schedule_gemm_validates_emulated():
    """``compile_program`` with no schedule: the specialized 4-version ring,
    run on a ragged shape against the oracle."""
    kern = _gemm(128, 256, 64)
    ck = cuda.compile_program(kern.program, device="emulated")
    assert "warp-specialized ring" in ck.source.text and "__launch_bounds__(288" in ck.source.text
    _run(ck, kern, 200, 328, 264)


# ------------------------------------------------------------------ emission
def test_emitted_roles_have_no_block_barrier_in_the_ring():
    kern = _gemm(128, 256, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=4), device="emulated")
    text = ck.source.text
    assert "__launch_bounds__(288" in text
    ring = text[text.index("warp-specialized ring"):]
    ring = ring[:ring.index("__syncthreads")]  # up to the barrier after the ring
    assert "if (threadIdx.x >= 256u) {  // the producer warp" in ring
    assert ring.count("tn_mbar_wait(") == 3  # empty (producer, its tail), full (consumers)
    assert "tn_mbar_arrive(tn_full);" in ring and "tn_wgmma_wait<1>();" in ring
    assert "tn_tma_commit_wait" not in text
    # the empty slots expect one arrival from every consumer thread
    assert re.search(r"tn_mbar_init\(b__roles_bars_s \+ 8u \* \(4u \+ i\), 256u\)", text)
    ptx = cuda._build(ck.source, want_ptx=True, cache=False).ptx
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "mbarrier.try_wait.parity.shared::cta.b64" in ptx
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in ptx


# ------------------------------------------------------------------ emulation
@pytest.mark.parametrize("tile,kw,shape", [
    ((128, 256, 64), {"stages": 4}, (256, 512, 256)),
    ((128, 128, 64), {"stages": 3}, (392, 136, 128)),
    ((128, 128, 64), {"stages": 4}, (72, 1024, 520)),
    ((256, 128, 64), {"stages": 4, "block_threads": 512}, (129, 328, 136)),
    ((128, 128, 64), {"stages": 5}, (64, 72, 136)),
    ((128, 128, 64), {"stages": 4}, (128, 8, 64)),
], ids=["square", "tall", "wide-long-k", "ragged", "k-not-a-tile-multiple", "one-step"])
def test_specialized_gemm_validates_emulated(tile, kw, shape):
    """Every shape class, including rings shorter than their stages (the
    producer's tail waits and the consumers' final releases) and a ring of
    many rounds of its slots (the phases' parities), under two interleavings
    and poisons."""
    kern = _gemm(*tile)
    ck = cuda.compile_program(kern.program, _sched(kern, **kw), device="emulated")
    assert "warp-specialized ring" in ck.source.text
    _run(ck, kern, *shape)


def test_a_consumer_that_does_not_wait_for_its_slot_reads_poison(mutate_source):
    """Mutation of the emitted handshake: the consumers skip the wait for
    the ``full`` slot. The emulator lands a bulk copy only at a wait on its
    barrier, so the mmas read the poison; or the consumers, no longer held
    back, release a slot more often than it is refilled."""
    mutate_source("tn_mbar_wait((b__roles_bars_s + 8u * (unsigned)(0)) + 8u * (tn_ring_c",
                  "if (0) tn_mbar_wait((b__roles_bars_s + 8u * (unsigned)(0)) + 8u * (tn_ring_c")
    kern = _gemm(128, 128, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=4), device="emulated",
                              cache=False)
    with pytest.raises((AssertionError, TilenestError),
                       match="not admitted|in flight|never ends|whose phase has had all its "
                             "arrivals"):
        _run(ck, kern, 128, 384, 128, runs=(("in_order", "nan"),))


def test_the_producer_warp_runs_no_warpgroup_instruction(mutate_source):
    """The producer warp is a warpgroup of 32 threads, which no warpgroup
    instruction (``wgmma.fence``, ``commit_group``, ``wait_group``: all
    ``.sync.aligned`` over 128 threads) may run; at the block barriers
    outside the ring only the consumers wait for their wgmma groups. With
    that guard removed the emulator reports the instruction, as
    ``compute-sanitizer --tool synccheck`` does on the device ("warpgroup
    instruction executed with an incomplete warpgroup")."""
    kern = _gemm(128, 128, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=4), device="emulated")
    guarded = "if (threadIdx.x < 256u) tn_wgmma_wait<0>();"
    assert guarded in ck.source.text
    mutate_source(guarded, "tn_wgmma_wait<0>();")
    ck = cuda.compile_program(kern.program, _sched(kern, stages=4), device="emulated",
                              cache=False)
    with pytest.raises(TilenestError, match="wgmma.wait_group run by thread 2[5-8][0-9] of "
                                            "warpgroup 2, which the block of 288 threads"):
        _run(ck, kern, 128, 384, 128, runs=(("in_order", "nan"),))


# ------------------------------------------------------------------ device
@pytest.mark.device
@pytest.mark.parametrize("tile,kw", [
    ((128, 256, 64), {"stages": 4}),
    ((256, 128, 64), {"stages": 4, "block_threads": 512}),
    ((128, 128, 64), {"stages": 5}),
])
@pytest.mark.parametrize("shape", [(512, 512, 512), (1000, 264, 776), (300, 1096, 200),
                                   (136, 40, 264), (256, 4096, 256)],
                         ids=["square", "tall-ragged", "wide-ragged", "one-step", "long-k"])
def test_specialized_gemm_on_the_gpu(tile, kw, shape):
    """The specialized kernels on the device, every shape class, against the
    oracle (a race between the roles shows as a wrong tile)."""
    kern = _gemm(*tile)
    ck = cuda.compile_program(kern.program, _sched(kern, **kw), device="gpu")
    assert "warp-specialized ring" in ck.source.text
    _run(ck, kern, *shape, runs=((None, None),))


@pytest.mark.device
@pytest.mark.parametrize("tile", [(128, 256, 64), (128, 128, 128)])
@pytest.mark.parametrize("shape", [(512, 512, 512), (1000, 264, 776), (136, 40, 264)],
                         ids=["square", "tall-ragged", "one-step"])
def test_the_default_schedule_gemm_on_the_gpu(tile, shape):
    """``compile_program`` with no schedule (4 and 3 versions, chosen by
    the lowering) on the device against the oracle."""
    kern = _gemm(*tile)
    ck = cuda.compile_program(kern.program, device="gpu")
    assert "warp-specialized ring" in ck.source.text
    _run(ck, kern, *shape, runs=((None, None),))


def test_a_specialized_scaled_fp8_gemm_validates_emulated():
    """The FP8 ring (k32 steps on K-major tiles of both operands, the scales
    applied after the loop) takes the same roles."""
    from tilenest.bench.kernels import kernels

    kern = kernels()["fp8_gemm"].specialize(bm=128, bn=128, bk=128)
    M, N, K = 137, 141, 400
    rng = np.random.default_rng(5)
    A = rng.standard_normal((M, K)).astype(tn.f8e4m3fn.np)
    Bt = rng.standard_normal((N, K)).astype(tn.f8e4m3fn.np)
    args = [A, Bt, np.zeros((M, N), tn.bf16.np), np.float32(0.5), np.float32(2.0)]
    ck = cuda.compile_program(kern.program, _sched(kern, stages=4), device="emulated")
    assert "warp-specialized ring" in ck.source.text and "tn_wgmma_e4m3_e4m3_n" in ck.source.text
    rep = tn.validate(kern, "cuda", compiled=ck, inputs=[args])
    assert rep.ok and rep.count("ok") == 1, rep.summary()


@pytest.mark.parametrize("muts", [
    [("tn_wgmma_wait<1>();\n", "tn_wgmma_wait<2>();\n")],
    [("if (tn_ring_c >= tn_first + 1u) tn_mbar_arrive((b__roles_bars_s + 8u * (unsigned)(4)) "
      "+ 8u * ((tn_ring_c - 1u) % 4u));",
      "tn_mbar_arrive((b__roles_bars_s + 8u * (unsigned)(4)) + 8u * ((tn_ring_c) % 4u));"),
     ("tn_ring_c > tn_first + 1u ? tn_ring_c - 1u : tn_first; tn_n < tn_ring_c",
      "tn_ring_c; tn_n < tn_ring_c")],
], ids=["release-with-two-groups-pending", "release-before-the-mma"])
def test_a_slot_released_before_its_mma_completes_is_caught(mutate_source, muts):
    """Mutations of the emitted handshake that release a slot while an mma
    reading it may still run: the emulator refuses a bulk copy into shared
    memory that a queued wgmma has yet to read, or that one read whose warp
    released it before completing it (the issuing thread is ordered after
    the release, not after that read; on the device the copy may land at
    any time after its issue) -- whatever the interleaving."""
    for old, new in muts:
        mutate_source(old, new)
    kern = _gemm(128, 128, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=4), device="emulated",
                              cache=False)
    for M, K in ((128, 576), (256, 384)):
        with pytest.raises(TilenestError, match="(has not|may not have) read yet"):
            _run(ck, kern, M, K, 128, runs=(("in_order", "nan"),))
