"""Bulk tensor copies (the Tensor Memory Accelerator) of ``wgmma`` operand tiles
(``Schedule.tma``, on by default on ``cuda``: ``spec/lowering.md`` L-11).

A tile that a warpgroup mma reads from swizzled shared memory, loaded from a
box of a dense tensor with zeros outside it, is copied by one thread with
``cp.async.bulk.tensor`` per 128-byte panel, its completion tracked by
``mbarrier`` phases (``lowering/bulk_copy.py``). The loop IR keeps the
element copies as the meaning; the emulator runs the bulk copies from the
tensor maps alone (its own gather, zero fill and address swizzle), so a
wrong box, map or placement is a wrong product the oracle rejects, and it
lands each copy only at a wait on its barrier, so a consumer that does not
wait reads the poison.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.backends.cuda.tensormaps import MapSpec, encode_emulated, fits
from tilenest.errors import TilenestError
from tilenest.lowering import bulk_copy as BC
from tilenest.lowering import default_schedule, lower_verified, print_kernel
from tilenest.lowering import double_buffer as DB
from tilenest.lowering import loopir as L
from tilenest.proofs import gpu
from tilenest.semantics import expr as E
from tilenest.workloads import WORKLOADS


def _gemm(bm, bn, bk, dt=tn.bf16):  # type: ignore[no-untyped-def]
    return WORKLOADS["gemm"].kernel(dt, {"bm": bm, "bn": bn, "bk": bk, "loop": "pipeline"})


def _sched(kern, **kw):  # type: ignore[no-untyped-def]
    """Bulk copies on block barriers (no warp roles: ``test_warp_roles.py``)."""
    return default_schedule(kern.program, "cuda", mma_unit="wgmma",
                            **{"tma": True, "warp_roles": False, **kw})


def _run(ck, kern, M, K, N, runs=(("in_order", "nan"), ("random", "big"))):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(M * 7 + N * 3 + K)
    A = rng.standard_normal((M, K)).astype(tn.bf16.np)
    B = rng.standard_normal((K, N)).astype(tn.bf16.np)
    oracle = tn.reference(kern, A, B, np.zeros((M, N), tn.bf16.np))
    for policy, poison in runs:
        C = np.zeros((M, N), tn.bf16.np)
        ck(A, B, C, policy=policy, poison=poison, seed=3)
        v = oracle.admits(C)
        assert v.ok, f"{policy}/{poison}: {v}"


# ------------------------------------------------------------------ lowering
@pytest.mark.parametrize("stages", [3, 4, 5])
def test_operand_tiles_become_bulk_copies_with_enough_barriers(stages):
    kern = _gemm(128, 256, 64)
    k = lower_verified(kern.program, _sched(kern, stages=stages))
    text = print_kernel(k)
    # the prologue's S - 1 and the ring's producers of both operands carry the permission
    assert len(re.findall(r"bulk\(A\[128\*\$p0\.\d+, ", text)) == stages
    assert len(re.findall(r"bulk\(B\[", text)) == stages
    assert re.search(r"bulk\(A\[128\*\$p0\.\d+, 64\*\$kk\.\d+ \+ \d+\] 128x64 -> %a\.\d+\+8192\*",
                     text)
    bars = [b for b in k.locals if b.name == BC.BARRIERS]
    assert len(bars) == 1 and bars[0].space == "shared"
    assert int(bars[0].size.value) == BC.max_keep(k) + 1 == stages - 1
    obs = cuda.tma_obligations(k)
    assert [o.kind for o in obs].count(gpu.TMA_PHASES) == 1
    assert all(o.status == "proved" for o in obs)
    assert sum(o.kind == gpu.TMA_PLACEMENT for o in obs) == 2 * stages


def test_no_bulk_copy_without_tma_or_for_a_read_that_is_not_a_box():
    kern = _gemm(128, 128, 64)
    assert default_schedule(kern.program, "cuda").tma  # the cuda row's default
    assert not default_schedule(kern.program, "llvm").tma
    plain = lower_verified(kern.program, _sched(kern, stages=3, tma=False))
    assert "bulk(" not in print_kernel(plain)
    assert not any(b.name == BC.BARRIERS for b in plain.locals)
    # mma.sync operands are not swizzled tiles: no bulk copies either
    sync = lower_verified(kern.program, default_schedule(kern.program, "cuda",
                                                         mma_unit="tensor", stages=3, tma=True))
    assert "bulk(" not in print_kernel(sync)


def test_a_permission_whose_stores_are_not_asynchronous_is_dropped():
    kern = _gemm(128, 128, 64)
    k = lower_verified(kern.program, _sched(kern, stages=3))
    loops = [s for ph in k.phases for s in L.walk(ph.body) if isinstance(s, L.For)
             and s.bulk is not None]
    assert loops and all(BC.standing(s) for s in loops)

    def sync(s):  # type: ignore[no-untyped-def]
        return (replace(s, mode=""),) if isinstance(s, L.Store) and s.mode == "async" else None

    plain = replace(k, phases=tuple(replace(ph, body=L.map_stmts(ph.body, lambda x: None, sync))
                                    for ph in k.phases),
                    locals=tuple(b for b in k.locals if b.name != BC.BARRIERS))
    again = BC.bulk_copies(plain)
    assert "bulk(" not in print_kernel(again)
    assert not any(b.name == BC.BARRIERS for b in again.locals)


# ------------------------------------------------------------------ emission
def test_emitted_bulk_copies_and_completion_barriers():
    kern = _gemm(128, 256, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=4), device="emulated")
    text = ck.source.text
    assert ck.source.maps == (
        MapSpec(0, "A", (E.Sym("M"), E.Sym("K")), (128, 64), 2),
        MapSpec(1, "B", (E.Sym("K"), E.Sym("N")), (64, 64), 2))
    assert "const __grid_constant__ tn_tmap tn_map0, const __grid_constant__ tn_tmap tn_map1)" \
        in text
    body = text[text.index('extern "C"'):]
    assert "tn_cp_async" not in body  # every tile copy is a bulk copy
    # one copy of A's 128 x 64 tile, four panels of B's 64 x 256 (16 + 32 KiB)
    assert body.count("tn_mbar_expect(tn_bar, 16384u);") == 4
    assert body.count("tn_mbar_expect(tn_bar, 32768u);") == 4
    assert body.count("TN_TMA_LOAD(2, ") == 4 * (1 + 4)
    # barriers: keep 2 inside the ring over 3 completion barriers
    assert "tn_tma_commit_wait<2, 3>(" in body and "tn_tma_commit_wait<0, 3>(" in body
    assert "tn_mbar_init(b__tma_bars_s + 8u * i, 1u);" in body
    ptx = cuda._build(ck.source, want_ptx=True, cache=False).ptx
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "mbarrier.try_wait.parity.shared::cta.b64" in ptx
    assert "mbarrier.expect_tx.relaxed.cta.shared::cta.b64" in ptx
    assert "cp.async.cg" not in ptx


def test_emulated_tensor_map_layout():
    spec = MapSpec(0, "A", (E.Sym("M"), E.Sym("K")), (128, 64), 2)
    w = np.frombuffer(encode_emulated(spec, 4096, [100, 136]).tobytes(), np.uint64)
    assert list(w[:4]) == [4096, 2 | 2 << 8 | 128 << 16, 136, 100]
    assert w[7] == 272 and w[11] == 64 | 128 << 16
    assert fits(spec, 4096, [100, 136]) and not fits(spec, 4096, [100, 131])
    assert not fits(spec, 4104, [100, 136])  # an 8-byte aligned base


# ------------------------------------------------------------------ emulation
@pytest.mark.parametrize("tile,kw,shape", [
    ((128, 128, 64), {"stages": 4}, (256, 192, 256)),
    ((128, 256, 64), {"stages": 3}, (300, 136, 128)),
    ((128, 128, 64), {"stages": 4}, (100, 200, 520)),
    ((256, 128, 64), {"stages": 4, "block_threads": 512}, (129, 328, 131)),
    ((128, 128, 64), {"stages": 5}, (64, 72, 136)),
], ids=["square", "tall", "wide", "ragged", "k-not-a-tile-multiple"])
def test_bulk_copy_gemm_validates_emulated(tile, kw, shape):
    """Every shape class: square, tall, wide, ragged in M and N, and a K that
    is not a multiple of the tile (the boxes reach past the tensor and are
    filled with zeros), under two interleavings and poisons."""
    kern = _gemm(*tile)
    ck = cuda.compile_program(kern.program, _sched(kern, **kw), device="emulated")
    assert ck.source.maps
    M, K, N = shape
    _run(ck, kern, M, K, N)


def test_a_row_pitch_off_16_bytes_runs_the_element_copies():
    """K = 131 bf16 elements is a 262-byte row: no tensor map can describe
    it, so the call runs the same program compiled with ``tma=False``."""
    kern = _gemm(128, 128, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=3), device="emulated")
    A = np.zeros((70, 131), tn.bf16.np)
    assert not ck.maps_fit([A, np.zeros((131, 90), tn.bf16.np), None], {"M": 70, "K": 131,
                                                                         "N": 90})
    other = ck.variant(ck.schedule.aliases, ck.schedule.strided, tma=False)
    assert not other.source.maps and "tn_cp_async<16>" in other.source.text
    _run(ck, kern, 70, 131, 90, runs=(("in_order", "nan"),))


def test_too_few_completion_barriers_are_refuted_and_caught(monkeypatch):
    """Mutation: as many barriers as the largest keep (one too few). The
    ``tma.phases`` obligation is refuted; with the proof silenced, the
    emulator catches group g + M signalling the barrier of group g before
    every thread has waited for it."""
    monkeypatch.setattr(BC, "barrier_count", BC.max_keep)
    kern = _gemm(128, 128, 64)
    with pytest.raises(TilenestError, match="tma.phases"):
        cuda.compile_program(kern.program, _sched(kern, stages=4), device="emulated",
                             cache=False)
    monkeypatch.setattr(gpu, "tma_obligations", lambda k: [])
    ck = cuda.compile_program(kern.program, _sched(kern, stages=4), device="emulated",
                              cache=False)
    with pytest.raises(TilenestError, match="reused before the group it tracked was waited"):
        _run(ck, kern, 128, 512, 128, runs=(("in_order", "nan"),))


def test_a_missing_wait_is_caught(mutate_source):
    """Mutation: the ring's barriers wait for one group fewer than the
    barrier proof requires. Depending on the interleaving a consumer reads
    a tile whose copy has not landed (the poison), thread 0 leaves with
    copies in flight, or the next group reuses a barrier not yet waited
    for (or arrives on one whose phase is complete); the run fails in each
    case."""
    mutate_source("tn_tma_commit_wait<2, 3>", "tn_tma_commit_wait<3, 3>")
    kern = _gemm(128, 128, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=4), device="emulated",
                              cache=False)
    with pytest.raises((AssertionError, TilenestError),
                       match="not admitted|bulk copy it issued .* is in flight|"
                             "reused before the group it tracked was waited for|"
                             "whose phase has had all its arrivals"):
        _run(ck, kern, 128, 384, 128, runs=(("in_order", "nan"),))


def test_a_slot_released_early_is_refuted(monkeypatch):
    """Mutation of the ring: producing ``S - 1`` steps ahead with no barrier
    after the consumer's mma (the version released at the top of the step,
    while the previous step's mma may still read it) has a bulk copy
    overwrite it; the barrier proof (the copies are the loop's asynchronous
    stores) refutes it."""
    monkeypatch.setattr(DB, "RELEASE_AFTER", False)
    monkeypatch.setattr(DB, "lookahead", lambda stages, overlap: stages - 1)
    kern = _gemm(128, 128, 64)
    with pytest.raises(TilenestError, match=r"barrier.sufficiency.*%(a|b)\.\d+"):
        cuda.compile_program(kern.program, _sched(kern, stages=4), device="emulated",
                             cache=False)


#: a GEMM of 128 x 128 x 64 bf16 tiles in a pipelined K loop, as a user's file
BGEMM_SOURCE = '''
import tilenest as tn
from tilenest import bf16, f32


@tn.kernel
def bgemm(A: tn.Tensor[bf16, "M K"], B: tn.Tensor[bf16, "K N"], C: tn.Tensor[f32, "M N"]):
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    M, K = A.shape
    for nest in tn.parallel(tn.shape(tn.cdiv(M, 128), tn.cdiv(B.shape[1], 128))):
        i, j = nest.index(0), nest.index(1)
        acc = tn.zeros(f32, tn.shape(128, 128), dims=(m, n))
        for kk in nest.pipeline(tn.shape(tn.cdiv(K, 64)), tn.pipeline_policy(window=2)):
            kk.stage("load")
            a = A[tn.coord(i * 128, kk.index() * 64), tn.shape(128, 64), tn.bounds.zero]
            b = B[tn.coord(kk.index() * 64, j * 128), tn.shape(64, 128), tn.bounds.zero]
            kk.stage("compute")
            acc = tn.mma(a, b, acc, allow_reassociation=True)
        C(tn.coord(i * 128, j * 128), tn.shape(128, 128)).store(acc)
'''


def test_check_reports_the_tma_obligations(tmp_path):
    src = tmp_path / "bgemm.py"
    src.write_text(BGEMM_SOURCE)
    # the ring on block barriers (warp roles off): the tiles' phases are proved
    r = subprocess.run([sys.executable, "-m", "tilenest.cli", "check", str(src), "--target",
                        "cuda", "--set", "tma=True", "--set", "warp_roles=False"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r"tma\.phases +proved", r.stdout)
    assert len(re.findall(r"tma\.placement +proved", r.stdout)) >= 2
    assert re.search(r"barrier\.sufficiency +proved", r.stdout)
    # by default the ring is warp-specialized: its handshake is proved instead
    r = subprocess.run([sys.executable, "-m", "tilenest.cli", "check", str(src), "--target",
                        "cuda", "--set", "tma=True"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    for kind in ("roles.full", "roles.versions", "roles.release", "roles.parity"):
        assert re.search(kind.replace(".", r"\.") + " +proved", r.stdout), kind
    assert not re.search(r"tma\.phases", r.stdout)


# ------------------------------------------------------------------ device
@pytest.mark.device
@pytest.mark.parametrize("tile,kw", [
    ((128, 256, 64), {"stages": 4}),
    ((128, 128, 64), {"stages": 3}),
    ((256, 128, 64), {"stages": 4, "block_threads": 512}),
])
@pytest.mark.parametrize("shape", [(512, 512, 512), (1000, 264, 776), (300, 1096, 200),
                                   (129, 72, 4099)],
                         ids=["square", "tall-ragged", "wide-ragged", "pitch-off-16-bytes"])
def test_bulk_copy_gemm_on_the_gpu(tile, kw, shape):
    """The same kernels on the device, every shape class, against the oracle."""
    kern = _gemm(*tile)
    ck = cuda.compile_program(kern.program, _sched(kern, **kw), device="gpu")
    assert ck.source.maps
    M, K, N = shape
    _run(ck, kern, M, K, N, runs=((None, None),))


def test_batched_tiles_with_a_unit_dim_are_rank_3_boxes():
    """A batched GEMM whose tiles are ``[1, rows, cols]`` of rank-3 tensors:
    the unit dim is one coordinate of the box (``cp.async.bulk.tensor.3d``),
    validated emulated with a ragged batch member."""
    from tilenest import bf16, f32

    @tn.kernel
    def bgemm(A: tn.Tensor[bf16, "B M K"], Bm: tn.Tensor[bf16, "B K N"],
              C: tn.Tensor[f32, "B M N"], *, bm=128, bn=128, bk=64):
        nb, M, K = A.shape
        N = Bm.shape[2]
        b, m, k = A.dims()
        n = C.dim(2)
        Bm = Bm.with_dims(b, k, n)
        C = C.with_dims(b, m, n)
        for p in tn.parallel(tn.shape(nb, tn.cdiv(M, bm), tn.cdiv(N, bn))):
            z, i, j = p.index(0), p.index(1), p.index(2)
            acc = tn.zeros(f32, tn.shape(1, bm, bn), dims=(b, m, n))
            for kk in p.pipeline(tn.shape(tn.cdiv(K, bk)), tn.pipeline_policy(window=2)):
                kk.stage("load")
                a = A[tn.coord(z, i * bm, kk.index() * bk), tn.shape(1, bm, bk), tn.bounds.zero]
                w = Bm[tn.coord(z, kk.index() * bk, j * bn), tn.shape(1, bk, bn),
                       tn.bounds.zero]
                kk.stage("compute")
                acc = tn.mma(a, w, acc, allow_reassociation=True)
            C(tn.coord(z, i * bm, j * bn), tn.shape(1, bm, bn)).store(acc)

    ck = cuda.compile_program(bgemm.program, _sched(bgemm, stages=3), device="emulated")
    assert [len(m.shape) for m in ck.source.maps] == [3, 3]
    assert ck.source.maps[0].box == (1, 128, 64) and "TN_TMA_LOAD(3, " in ck.source.text
    rng = np.random.default_rng(4)
    A = rng.standard_normal((2, 150, 136)).astype(tn.bf16.np)
    B = rng.standard_normal((2, 136, 200)).astype(tn.bf16.np)
    oracle = tn.reference(bgemm, A, B, np.zeros((2, 150, 200), np.float32))
    C = np.zeros((2, 150, 200), np.float32)
    ck(A, B, C, policy="random", poison="nan", seed=1)
    res = oracle.admits(C)
    assert res.ok, str(res)
