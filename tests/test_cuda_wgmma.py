"""Warpgroup tensor cores (``mma_unit="wgmma"``): the swizzled shared layout,
the warpgroup ``WarpMma`` and its overlapped ring, emission and emulation.

The emulator runs ``wgmma.mma_async`` by decoding its matrix descriptors
with the hardware's 128-byte swizzle of shared addresses, independently of
the code generator's ``tn_swz128`` placement of the operand tiles, so a
disagreement between the two (or a wrong descriptor) is a wrong product the
oracle rejects. Its reads happen at the wait that retires the group (the
latest moment the device may read). A producer that refills a version the
overlapped mma may still read is refuted by the barrier proof.
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
from tilenest.lowering import double_buffer as DB
from tilenest.lowering import loopir as L
from tilenest.lowering.mma import group_tile
from tilenest.workloads import WORKLOADS


def _gemm(bm, bn, bk, dt=tn.bf16, loop="pipeline"):  # type: ignore[no-untyped-def]
    return WORKLOADS["gemm"].kernel(dt, {"bm": bm, "bn": bn, "bk": bk, "loop": loop})


def _sched(kern, **kw):  # type: ignore[no-untyped-def]
    """Warpgroup mmas on block-barrier rings (no warp roles: ``test_warp_roles.py``)."""
    return default_schedule(kern.program, "cuda", mma_unit="wgmma",
                            **{"warp_roles": False, **kw})


def _run(kern, sched, M, K, N, dt=tn.bf16, runs=(("in_order", "nan"), ("random", "big")),
         cache=True):  # type: ignore[no-untyped-def]
    """The emulated kernel against the oracle on seeded inputs (raises
    AssertionError naming the run that is not admitted)."""
    rng = np.random.default_rng(M * 1000 + N + K)
    A = rng.standard_normal((M, K)).astype(dt.np)
    B = rng.standard_normal((K, N)).astype(dt.np)
    oracle = tn.reference(kern, A, B, np.zeros((M, N), dt.np))
    ck = cuda.compile_program(kern.program, sched, cache=cache, device="emulated")
    assert f"tn_wgmma_{dt.name}_n" in ck.source.text
    for policy, poison in runs:
        C = np.zeros((M, N), dt.np)
        ck(A, B, C, policy=policy, poison=poison, seed=5)
        v = oracle.admits(C)
        assert v.ok, f"{policy}/{poison}: {v}"
    return ck


# ------------------------------------------------------------------ the layout
@pytest.mark.parametrize("rows,cols,itemsize", [(8, 64, 2), (64, 64, 2), (16, 256, 2),
                                                (24, 128, 2), (8, 32, 4)])
def test_swizzle128_is_a_permutation_of_each_copy(rows, cols, itemsize):
    lay = L.Swizzle128(rows, cols, itemsize)
    n = rows * cols
    phys = [lay.phys(i) for i in range(3 * n)]  # a ring of three copies
    assert sorted(phys) == list(range(3 * n))
    assert all(n * (i // n) <= p < n * (i // n + 1) for i, p in enumerate(phys))
    # 16-byte chunks stay whole and aligned
    g = lay.chunk
    for i in range(0, 3 * n, g):
        assert [lay.phys(i + e) for e in range(g)] == list(range(phys[i], phys[i] + g))
        assert phys[i] % g == 0


@pytest.mark.parametrize("rows,cols", [(64, 64), (128, 64), (64, 256)])
def test_swizzle128_matches_the_descriptor_address_rule(rows, cols):
    """The canonical 128-byte-swizzle layouts a wgmma descriptor names, with
    the swizzle taken on byte addresses (bits 4-6 XOR bits 7-9): K-major
    (``a``: row r, column k of a panel) and MN-major (``b``: row k, column j,
    panels ``rows x 128`` bytes apart) are both this placement."""
    lay = L.Swizzle128(rows, cols, 2)

    def swz(addr: int) -> int:
        return addr ^ (((addr >> 7) & 7) << 4)

    for r in range(rows):
        for c in range(cols):
            byte = 2 * lay.phys(r * cols + c)
            panel, cc = divmod(c, 64)
            canon = panel * rows * 128 + (r % 8) * 128 + (r // 8) * 1024 + 2 * cc
            assert byte == swz(canon), (r, c)


@pytest.mark.parametrize("M,N,groups,want", [(128, 256, 2, (64, 256)), (128, 128, 2, (64, 128)),
                                             (256, 128, 4, (64, 128)), (64, 64, 1, (64, 64)),
                                             (64, 192, 4, (64, 64)), (64, 32, 1, (64, 32)),
                                             (128, 96, 2, (64, 32)), (64, 40, 1, (64, 8)),
                                             (64, 12, 1, None)])
def test_group_tile_shapes(M, N, groups, want):
    """Widths below 64 only where no wider one divides ``N`` (the
    instruction takes any multiple of 8 up to 256); none for an ``N`` that is
    not a multiple of 8, which the plan then refuses with the reason (it used
    to fail with an internal IndexError)."""
    assert group_tile(M, N, groups) == want


# ------------------------------------------------------------------ lowering
def test_wgmma_gemm_lowers_to_warpgroup_tiles_on_swizzled_operands():
    kern = _gemm(128, 256, 64)
    k = lower_verified(kern.program, _sched(kern, stages=3))
    text = print_kernel(k)
    mmas = [s for ph in k.phases for s in L.walk(ph.body) if isinstance(s, L.WarpMma)]
    assert len(mmas) == 1
    w = mmas[0]
    assert (w.group, w.m, w.n, w.k, w.overlap) == (4, 64, 256, 64, True)
    assert w.c.lane_cols == 256 and w.c.lane_period == 64  # registers, 128 per thread
    assert w.a.buf.layout == L.Swizzle128(128, 64, 2) and w.b.buf.layout == L.Swizzle128(64, 256, 2)
    assert "group_mma.overlap.64x256x64" in text and "mma_keep=1" in text
    # the accumulator's registers: 128 cells per thread of a 256-thread block
    frag = [b for b in k.locals if b.space == "local"]
    assert [int(b.size.value) for b in frag] == [128]


def test_two_stage_ring_keeps_the_mma_synchronous():
    """With two versions the next tile overwrites the one the mma read, so
    no barrier keeps the mma in flight: it completes at the next barrier (the
    loop's top, where the waits pass leaves it: ``lowering/mma_waits.py``),
    with no wait of its own."""
    kern = _gemm(128, 128, 64)
    k = lower_verified(kern.program, _sched(kern, stages=2))
    (w,) = [s for ph in k.phases for s in L.walk(ph.body) if isinstance(s, L.WarpMma)]
    assert w.group == 4
    assert not any(isinstance(s, L.Barrier) and s.mma_keep for ph in k.phases
                   for s in L.walk(ph.body))
    (loop,) = [s for s in k.phases[0].body if isinstance(s, L.For) and s.kind == "serial"]
    assert L.is_block_barrier(loop.body[0])
    assert not any(isinstance(s, L.MmaWait) for s in L.walk(loop.body))


@pytest.mark.parametrize("tile,kw,why", [
    ((128, 128, 32), {}, "not a shared tile in the 128-byte swizzled layout"),
    ((32, 64, 64), {}, "multiples of 64"),
    ((128, 128, 64), {"block_threads": 192}, "whole number of warpgroups"),
])
def test_wgmma_refused_with_the_reason(tile, kw, why):
    kern = _gemm(*tile)
    with pytest.raises(TilenestError, match=why) as e:
        lower_verified(kern.program, _sched(kern, **kw))
    assert "mma_unit='wgmma'" in str(e.value) and e.value.hint


def test_verifier_rejects_a_warpgroup_mma_on_an_unswizzled_operand():
    kern = _gemm(128, 128, 64)
    k = lower_verified(kern.program, _sched(kern, stages=1))
    a = next(s for ph in k.phases for s in L.walk(ph.body) if isinstance(s, L.WarpMma)).a.buf
    plain = replace(a, layout=None)

    def fe(x):  # type: ignore[no-untyped-def]
        if isinstance(x, L.Load) and x.buf.name == a.name:
            return replace(x, buf=plain)
        return None

    def fs(st):  # type: ignore[no-untyped-def]
        if isinstance(st, L.WarpMma):
            return (replace(st, a=replace(st.a, buf=plain)),)
        if isinstance(st, L.Store) and st.buf.name == a.name:
            return (replace(st, buf=plain, value=L.map_expr(st.value, fe)),)
        return None

    bad = replace(k, locals=tuple(plain if b.name == a.name else b for b in k.locals),
                  phases=tuple(replace(ph, body=L.map_stmts(ph.body, fe, fs))
                               for ph in k.phases))
    from tilenest.errors import VerifyError
    from tilenest.lowering.verify import verify_kernel

    with pytest.raises(VerifyError, match="swizzle128"):
        verify_kernel(bad)


def test_verifier_rejects_an_overlapped_mma_without_register_accumulator(monkeypatch):
    """An overlapped warpgroup mma completes at a later barrier, so an
    accumulator outside its registers (copied at the statement) would be
    stale: the verifier refuses the combination."""
    from tilenest.errors import VerifyError
    from tilenest.lowering import fragments
    from tilenest.lowering.verify import verify_kernel

    monkeypatch.setattr(fragments, "MAX_CELLS", 0)  # the accumulator stays a shared tile
    kern = _gemm(128, 128, 64)
    k = lower_verified(kern.program, _sched(kern, stages=3))
    assert not any(isinstance(s, L.WarpMma) and s.overlap for ph in k.phases
                   for s in L.walk(ph.body))

    def fs(st):  # type: ignore[no-untyped-def]
        return (replace(st, overlap=True),) if isinstance(st, L.WarpMma) else None

    bad = replace(k, phases=tuple(replace(ph, body=L.map_stmts(ph.body, lambda x: None, fs))
                                  for ph in k.phases))
    with pytest.raises(VerifyError, match="overlapped mma"):
        verify_kernel(bad)


def test_shared_arrangement_aligns_swizzled_tiles_and_the_proof_counts_it():
    from tilenest.proofs import gpu

    kern = _gemm(128, 256, 64)
    k = lower_verified(kern.program, _sched(kern, stages=3, tma=True))
    placed, total = L.shared_arrangement(k)
    swz = [(b, off) for b, off in placed if b.layout is not None]
    assert len(swz) == 2 and all(int(off.value) % 1024 == 0 for _, off in swz)
    # + the bulk copies' completion barriers (8 bytes each, 16-byte aligned)
    # and the alignment slack
    bars = [b for b, _ in placed if b.name == "%tma.bars"]
    assert len(bars) == 1 and int(bars[0].size.value) == 2  # keep <= 1: two barriers
    want = sum(int(b.size.value) * 2 for b, _ in swz) + 16 + 1024
    assert int(total.value) == want == 3 * (128 * 64 + 64 * 256) * 2 + 16 + 1024
    assert gpu.shared_bytes(k) == total


# ------------------------------------------------------------------ emission
def test_emitted_wgmma_descriptors_and_waits():
    """The element copies' form (``tma=False``; the bulk copies' form is
    ``test_cuda_tma.py``'s)."""
    kern = _gemm(128, 256, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=3, tma=False),
                              device="emulated")
    text = ck.source.text
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in text
    assert "tn_swz128<128, 64, 64, 8>" in text and "tn_swz128<64, 256, 64, 8>" in text
    # four 16-deep steps: a advances 32 bytes in its panel row, b 16 rows of 128 bytes
    # (one descriptor per operand, each step's offset added to its address field)
    assert re.search(r"mma_wm_14_a = tn_wgmma_desc\(\(b__a_\d+_s \+ 2u \* .*, 16u, 1024u\), "
                     r"mma_wm_14_b = tn_wgmma_desc\(\(b__b_\d+_s \+ 2u \* .*, 8192u, 1024u\);",
                     text)
    for ao, bo in ((0, 0), (32, 2048), (64, 4096), (96, 6144)):
        assert (f"tn_wgmma_desc_at(mma_wm_14_a, {ao}u), "
                f"tn_wgmma_desc_at(mma_wm_14_b, {bo}u)") in text
    # overlapped: committed, completed at the loop's barrier (one group left running)
    assert "tn_wgmma_wait<1>(); tn_fence_proxy_async();" in text
    assert "tn_wgmma_wait<0>(); tn_fence_proxy_async();" in text
    res = ck.built.resources["gemm_gemm_0"]
    assert res.spill_store_bytes == 0 and res.registers <= 255
    # the tile copies' wide-access tests: the part that does not change along
    # the contraction (group extent, rows in range, alignment) is one bit per
    # thread and step computed before the loop; inside, only the K bounds
    loop = text[text.index("for (v_kk_7 = 0;"):]
    loop = loop[:loop.index("tn_wgmma_wait<0>")]  # to the barrier after the loop
    tests = [ln for ln in loop.splitlines() if "vector accesses" in ln]
    assert tests and all("tn_ok_" in ln and "S_M" not in ln and "tn_aligned" not in ln
                         for ln in tests)
    assert ">= 0)" not in "".join(tests)  # nothing to test for non-negative indices
    assert "unsigned tn_ok_" in text[:text.index("for (v_kk_7 = 0;")]


# ------------------------------------------------------------------ emulation
@pytest.mark.parametrize("tile,kw", [
    ((128, 256, 64), {"stages": 3}),
    ((256, 128, 64), {"stages": 4, "block_threads": 512}),
    ((64, 64, 128), {"stages": 2, "block_threads": 128}),
], ids=["128x256x64-s3", "256x128x64-s4-512", "64x64x128-s2-128"])
def test_wgmma_gemm_validates_emulated(tile, kw):
    """Ragged sizes (a tail in every dim, at least three contraction steps,
    several blocks) against the oracle under two interleavings and poisons."""
    bm, bn, bk = tile
    kern = _gemm(bm, bn, bk)
    _run(kern, _sched(kern, **kw), bm + 9, 3 * bk + 5, bn + 13)


def test_wgmma_f16_validates_emulated():
    kern = _gemm(128, 128, 64, tn.f16)
    _run(kern, _sched(kern, stages=3), 130, 200, 140, tn.f16, runs=(("warp_ahead", "nan"),))


def test_wgmma_on_an_accumulator_outside_registers_validates_emulated(monkeypatch):
    """Where the accumulator tile is not given to the lanes' registers (the
    register budget switched off), each warpgroup mma copies the thread's
    cells of it into the instruction's registers and back (in the
    instruction's order, ``lane_cell``); the ring is then not overlapped."""
    from tilenest.lowering import fragments

    monkeypatch.setattr(fragments, "MAX_CELLS", 0)
    kern = _gemm(128, 128, 64)
    ck = _run(kern, _sched(kern, stages=3), 137, 197, 141, cache=False)
    text = ck.source.text
    assert "_oc = " in text and "group_mma.overlap" not in print_kernel(ck.kernel)
    assert "float b__acc" not in text  # no register tile of the accumulator


def test_unswizzled_placement_is_caught(monkeypatch):
    """Mutation: the code generator stores the operand tiles in plain
    row-major order while the descriptors still name the swizzled layout;
    the emulated wgmma reads the wrong elements and the oracle rejects it."""
    def plain(self, b, index):  # type: ignore[no-untyped-def]
        return index if isinstance(index, str) else self.idx(index)

    monkeypatch.setattr(Emitter, "position", plain)
    kern = _gemm(128, 128, 64)
    with pytest.raises(AssertionError, match="not admitted"):  # the element copies' form
        _run(kern, _sched(kern, stages=2, tma=False), 128, 192, 128,
             runs=(("in_order", "nan"),), cache=False)


def test_missing_wgmma_wait_is_caught(mutate_source):
    """Mutation: an overlapped mma never waited for before the epilogue
    reads its registers; the emulator reports the pending wgmma at the
    thread's exit."""
    mutate_source("tn_wgmma_wait<0>();", "")
    kern = _gemm(128, 128, 64)
    with pytest.raises(TilenestError, match="wait_group is missing"):
        _run(kern, _sched(kern, stages=3), 128, 256, 128, runs=(("in_order", "nan"),),
             cache=False)


def test_refilling_a_version_the_overlapped_mma_reads_is_refuted(monkeypatch):
    """Mutation of the ring: producing ``S - 1`` steps ahead with no barrier
    after the consumer's mma refills the version the previous step's mma
    may still be reading; the barrier proof refutes the lowering, naming an
    operand buffer."""
    monkeypatch.setattr(DB, "RELEASE_AFTER", False)
    monkeypatch.setattr(DB, "lookahead", lambda stages, overlap: stages - 1)
    kern = _gemm(128, 128, 64)
    with pytest.raises(TilenestError, match=r"barrier.sufficiency.*%(a|b)\.\d+"):
        cuda.compile_program(kern.program, _sched(kern, stages=3), device="emulated",
                             cache=False)


def test_wgmma_serialized_form_validates_on_llvm():
    """The same warpgroup lowering run on the CPU (each thread's reference
    cells; the layout is the CUDA code generator's business only)."""
    kern = _gemm(128, 128, 64)
    sched = default_schedule(kern.program, "llvm", block_threads=256, mma_unit="wgmma",
                             stages=2)
    assert "group_mma" in print_kernel(lower_verified(kern.program, sched))
    rng = np.random.default_rng(1)
    A = rng.standard_normal((130, 100)).astype(tn.bf16.np)
    B = rng.standard_normal((100, 200)).astype(tn.bf16.np)
    oracle = tn.reference(kern, A, B, np.zeros((130, 200), tn.bf16.np))
    C = np.zeros((130, 200), tn.bf16.np)
    kern.compile(target="llvm", schedule=sched)(A, B, C)
    v = oracle.admits(C)
    assert v.ok, str(v)


# ------------------------------------------------------------------ auto
def _unit_of(kern, **kw):  # type: ignore[no-untyped-def]
    """"wgmma", "mma.sync" or "simt": what ``mma_unit="auto"`` lowered the
    program's mma to."""
    text = print_kernel(lower_verified(kern.program, default_schedule(kern.program, "cuda",
                                                                      **kw)))
    if "group_mma" in text:
        return "wgmma"
    return "mma.sync" if "mma on tensor cores" in text else "simt"


def test_auto_takes_warpgroups_where_the_plan_applies_and_falls_back_elsewhere():
    """``auto`` = ``wgmma`` for a tile its plan takes; ``mma.sync`` for rows
    not a multiple of 64 and for a block of 192 threads; f32 operands stay
    on the SIMT units; an explicit ``"tensor"`` keeps ``mma.sync``."""
    assert _unit_of(_gemm(128, 256, 64)) == "wgmma"
    assert _unit_of(_gemm(64, 64, 64), stages=3) == "wgmma"
    assert _unit_of(_gemm(32, 64, 64)) == "mma.sync"
    assert _unit_of(_gemm(128, 128, 64), block_threads=192) == "mma.sync"
    assert _unit_of(_gemm(64, 64, 64, tn.f32)) == "simt"
    assert _unit_of(_gemm(128, 256, 64), mma_unit="tensor") == "mma.sync"


def test_auto_keeps_mma_sync_for_attention_whose_key_tile_is_read_along_k():
    """Flash attention's ``Q K^T`` reads a 16-bit ``b`` along the
    contraction, which ``wgmma``'s plan refuses: the whole program falls back
    (one matrix unit per kernel) and still validates."""
    from test_tensor_mma_dims import flash_attention

    kern = flash_attention(tn.bf16)
    assert _unit_of(kern) == "mma.sync"


def test_auto_falls_back_when_the_warpgroup_tiles_do_not_fit_shared_memory(monkeypatch):
    """A program whose swizzled rings would exceed a block's shared memory is
    lowered for ``mma.sync`` (whose own capacity obligation then decides)."""
    from tilenest.lowering import loopir

    kern = _gemm(128, 128, 64)
    assert _unit_of(kern) == "wgmma"
    real = loopir.phase_arrangements

    def huge(k):  # type: ignore[no-untyped-def]
        out = {}
        for name, (placed, need) in real(k).items():
            swz = any(b.layout is not None for b, _ in placed)
            out[name] = placed, (loopir.E.Const(1 << 30) if swz else need)
        return out

    monkeypatch.setattr(loopir, "phase_arrangements", huge)
    assert _unit_of(kern) == "mma.sync"


def test_auto_wgmma_gemm_validates_emulated():
    """The default schedule of a qualifying bf16 GEMM (two stages, 256
    threads) runs on warpgroups and is admitted by the oracle."""
    kern = _gemm(128, 128, 64)
    _run(kern, default_schedule(kern.program, "cuda"), 140, 200, 130)


def test_a_register_limit_below_the_warpgroup_mma_is_an_error_naming_min_blocks():
    """``min_blocks`` that leaves fewer registers per thread than a ``wgmma``
    needs is a compile error whose hint names the schedule fields (ptxas
    says only that an instruction lacks registers)."""
    from tilenest.backends.cuda.nvrtc import CudaCompileError

    kern = _gemm(64, 128, 64)
    with pytest.raises(CudaCompileError, match="Insufficient registers") as info:
        cuda.compile_program(kern.program, _sched(kern, block_threads=128, min_blocks=16),
                             device="emulated", cache=False)
    assert "min_blocks" in info.value.hint


# ------------------------------------------------------------------ K-major b
def _gemm_nt(bm, bn, bk):  # type: ignore[no-untyped-def]
    """``C = A W^T`` in bf16 with ``W`` stored ``N x K`` (a linear layer's
    weight), unit scales: ``bench.kernels.fp8_gemm_kernel`` on bf16."""
    from tilenest.bench.kernels import fp8_gemm_kernel

    return fp8_gemm_kernel(tn.bf16, tn.bf16, tn.bf16).specialize(bm=bm, bn=bn, bk=bk)


def _run_nt(kern, sched, M, K, N, runs=(("in_order", "nan"), ("random", "big")),
            cache=True):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(M + 7 * N + 13 * K)
    A = rng.standard_normal((M, K)).astype(tn.bf16.np)
    W = rng.standard_normal((N, K)).astype(tn.bf16.np)
    one = np.float32(1.0)
    oracle = tn.reference(kern, A, W, np.zeros((M, N), tn.bf16.np), one, one)
    ck = cuda.compile_program(kern.program, sched, cache=cache, device="emulated")
    for policy, poison in runs:
        C = np.zeros((M, N), tn.bf16.np)
        ck(A, W, C, one, one, policy=policy, poison=poison, seed=2)
        v = oracle.admits(C)
        assert v.ok, f"{policy}/{poison}: {v}"
    return ck


def test_a_16_bit_b_stored_n_by_k_is_read_k_major():
    """``x @ W^T``: the 16-bit ``b`` tile stored ``N x K`` is swizzled like
    ``a`` and read K-major (``imm-trans-b = 0``, a descriptor of ``a``'s
    form), where it used to fall back to ``mma.sync``."""
    kern = _gemm_nt(128, 128, 64)
    sched = _sched(kern, stages=3)
    text = print_kernel(lower_verified(kern.program, sched))
    assert "warpgroup tiles of wgmma m64n128k16" in text
    assert re.search(r"shared %w\.\d+: bf16\[24576\] swizzle128\(128x64\)", text)
    ck = cuda.compile_program(kern.program, sched, device="emulated")
    src = ck.source.text
    assert "tn_wgmma_bf16_n128_kb(" in src and "p, 1, 1, 0, 0;" in src
    assert "tn_wgmma_bf16_n128(" not in src
    assert re.search(r"_b = tn_wgmma_desc\(\(b__w_\d+_s \+ 2u \* .*, 16u, 1024u\);", src)
    auto = default_schedule(kern.program, "cuda", stages=3)
    assert "warpgroup tiles of wgmma" in print_kernel(lower_verified(kern.program, auto))


@pytest.mark.parametrize("tma", [False, True])
def test_k_major_b_validates_emulated(tma):
    kern = _gemm_nt(128, 128, 64)
    _run_nt(kern, _sched(kern, stages=4, tma=tma), 137, 200, 264)


def test_a_tile_32_columns_wide_runs_on_warpgroups_and_validates_emulated():
    """``x @ W^T`` with 32-column output tiles: one ``m64n32k16`` warpgroup
    tile per 64 rows, the K-major ``b`` a 32-row swizzled tile, ragged."""
    kern = _gemm_nt(128, 32, 64)
    sched = _sched(kern, stages=3)
    assert "warpgroup tiles of wgmma m64n32k16" in print_kernel(
        lower_verified(kern.program, sched))
    ck = _run_nt(kern, sched, 136, 200, 72)
    assert "tn_wgmma_bf16_n32_kb(" in ck.source.text


def test_k_major_b_read_transposed_is_caught(mutate_source):
    """Mutation: the instruction told to read ``b`` MN-major (the transpose
    bit) while the tile is stored ``N x K``; the emulated wgmma reads the
    wrong elements and the oracle rejects it."""
    mutate_source("tn_emu::wgmma_at(__LINE__, 9,", "tn_emu::wgmma_at(__LINE__, 1,")
    kern = _gemm_nt(128, 128, 64)
    with pytest.raises(AssertionError, match="not admitted"):
        _run_nt(kern, _sched(kern, stages=2), 128, 128, 128, runs=(("in_order", "nan"),),
                cache=False)


@pytest.mark.device
@pytest.mark.parametrize("tma", [False, True])
def test_k_major_b_on_the_gpu(tma):
    """On a CUDA GPU: ``x @ W^T`` in bf16 with the K-major ``b`` descriptor,
    over the validator's shape classes."""
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    kern = _gemm_nt(128, 128, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=4, tma=tma), device="gpu")
    rep = tn.validate(kern, "cuda", compiled=ck, cases=8, seed=4)
    assert rep.ok and rep.count("ok") == 8, rep.summary()


@pytest.mark.device
def test_a_tile_32_columns_wide_on_the_gpu():
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    kern = _gemm_nt(128, 32, 64)
    ck = cuda.compile_program(kern.program, _sched(kern, stages=3), device="gpu")
    assert "tn_wgmma_bf16_n32_kb(" in ck.source.text
    rep = tn.validate(kern, "cuda", compiled=ck, cases=8, seed=4)
    assert rep.ok and rep.count("ok") == 8, rep.summary()


# ------------------------------------------------------------------ attention
@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_on_warpgroups_validates_emulated(causal):
    """``mma_unit="wgmma"`` on the flash kernel: its ``[1, 1, rows, D]``
    tiles are 2-d apart from their unit dims, so ``Q K^T`` (``K`` read
    K-major) and ``P V`` (``P`` rounded to bf16 into a swizzled tile) both
    run on warpgroup tensor cores; ragged queries and keys, GQA, against the
    oracle. Under ``auto`` on 256 threads (two warpgroups would share the 64
    query rows) such tiles keep ``mma.sync``; with no ``block_threads``
    given, the default gives them one warpgroup (``test_wgmma_fragments``)."""
    from tilenest.workloads.attention import flash_kernel

    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=64, dh=64, dv=64, causal=causal)
    sched = _sched(kern, stages=2)
    text = print_kernel(lower_verified(kern.program, sched))
    assert text.count("warpgroup tiles of wgmma") == 2
    auto = default_schedule(kern.program, "cuda", stages=2, block_threads=256)
    assert "warpgroup tiles" not in print_kernel(lower_verified(kern.program, auto))
    ck = cuda.compile_program(kern.program, sched, device="emulated")
    assert "_kb(" in ck.source.text  # K read along the contraction
    rng = np.random.default_rng(11)
    q = rng.standard_normal((1, 2, 130, 64)).astype(tn.bf16.np)
    k = rng.standard_normal((1, 1, 130, 64)).astype(tn.bf16.np)
    v = rng.standard_normal((1, 1, 130, 64)).astype(tn.bf16.np)
    scale = np.float32(0.125)
    oracle = tn.reference(kern, q, k, v, np.zeros_like(q), scale)
    for policy in ("in_order", "random"):
        o = np.zeros_like(q)
        ck(q, k, v, o, scale, policy=policy, poison="nan", seed=3)
        res = oracle.admits(o)
        assert res.ok, f"{policy}: {res}"


@pytest.mark.device
def test_flash_attention_on_warpgroups_on_the_gpu():
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    from tilenest.workloads.attention import flash_kernel

    for causal in (True, False):
        kern = flash_kernel(tn.bf16).specialize(bq=64, bk=64, dh=128, dv=128, causal=causal)
        ck = cuda.compile_program(kern.program, _sched(kern, stages=2), device="gpu")
        rng = np.random.default_rng(5)
        q = rng.standard_normal((2, 4, 300, 128)).astype(tn.bf16.np)
        k = rng.standard_normal((2, 2, 300, 128)).astype(tn.bf16.np)
        v = rng.standard_normal((2, 2, 300, 128)).astype(tn.bf16.np)
        scale = np.float32(128 ** -0.5)
        oracle = tn.reference(kern, q, k, v, np.zeros_like(q), scale)
        o = np.zeros_like(q)
        ck(q, k, v, o, scale)
        res = oracle.admits(o)
        assert res.ok, f"causal={causal}: {res}"
