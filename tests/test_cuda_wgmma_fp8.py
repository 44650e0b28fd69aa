"""FP8 products on Hopper's warpgroup tensor cores (``mma_unit="wgmma"``):
``wgmma.mma_async ... k32`` with e4m3 / e5m2 operands read from shared memory,
both K-major (the instruction has no transpose for 8-bit types, so ``b`` is
stored ``N x K``, as ``torch._scaled_mm`` takes it). The emulator decodes the
matrix descriptors with the hardware's swizzle independently of the code
generator's placement, so a wrong descriptor or layout is a wrong product
the oracle rejects; NVRTC builds the device code for sm_90a."""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilenest as tn
from tilenest import f8e4m3fn, f8e5m2, f32
from tilenest.backends import cuda
from tilenest.bench.kernels import fp8_gemm_kernel, kernels
from tilenest.errors import TilenestError
from tilenest.lowering import default_schedule, lower_verified, print_kernel


#: c = a bt^T (unit scales): an e5m2 x e4m3fn product, ``bt`` stored N x K
e5_by_e4 = fp8_gemm_kernel(f32, f8e5m2, f8e4m3fn)

ONE = np.float32(1.0)


def _sched(kern, **kw):  # type: ignore[no-untyped-def]
    return default_schedule(kern.program, "cuda", mma_unit="wgmma", **kw)


def _scaled(bm=128, bn=128, bk=128):  # type: ignore[no-untyped-def]
    return kernels()["fp8_gemm"].specialize(bm=bm, bn=bn, bk=bk)


def test_fp8_wgmma_emits_k32_steps_on_k_major_descriptors():
    kern = _scaled()
    ck = cuda.compile_program(kern.program, _sched(kern), device="emulated")
    text = ck.source.text
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in text
    # no transpose immediates for 8-bit operands: scale-d and the two scales only
    assert re.search(r"%\d+, %\d+, p, 1, 1;", text)
    # both descriptors K-major (leading offset 16), four 32-deep steps of 32
    # bytes within the 128-byte panel row of each operand
    desc = re.search(r"(mma_wm_\d+)_a = tn_wgmma_desc\(.*, 16u, 1024u\), \1_b = "
                     r"tn_wgmma_desc\(.*, 16u, 1024u\);", text)
    assert desc, "descriptors"
    u = desc.group(1)
    for off in (0, 32, 64, 96):
        assert f"tn_wgmma_desc_at({u}_a, {off}u), tn_wgmma_desc_at({u}_b, {off}u)" in text
    res = ck.built.resources  # NVRTC built the device code for sm_90a
    assert res and all(r.spill_store_bytes == 0 for r in res.values())


@pytest.mark.parametrize("M,N,K", [(128 + 9, 128 + 13, 3 * 128 + 5), (256, 128, 384)],
                         ids=["ragged", "whole"])
def test_scaled_fp8_gemm_on_wgmma_validates_emulated(M, N, K):
    kern = _scaled()
    rng = np.random.default_rng(M + N + K)
    A = rng.standard_normal((M, K)).astype(f8e4m3fn.np)
    Bt = rng.standard_normal((N, K)).astype(f8e4m3fn.np)
    args = [A, Bt, np.zeros((M, N), tn.bf16.np), np.float32(0.5), np.float32(2.0)]
    ck = cuda.compile_program(kern.program, _sched(kern), device="emulated")
    assert "tn_wgmma_e4m3_e4m3_n" in ck.source.text
    rep = tn.validate(kern, "cuda", compiled=ck, inputs=[args])
    assert rep.ok and rep.count("ok") == 1, rep.summary()


@pytest.mark.parametrize("tile,threads", [((64, 64, 128), 128), ((64, 64, 256), 128),
                                          ((64, 256, 128), 256)],
                         ids=["one-panel", "two-panels-of-k", "two-warpgroups"])
def test_mixed_fp8_formats_on_wgmma_validate_emulated(tile, threads):
    # a 256-deep tile steps into its second 128-byte panel of K (both operands'
    # descriptors move on by a panel); 256 columns on two warpgroups split N
    bm, bn, bk = tile
    kern = e5_by_e4.specialize(bm=bm, bn=bn, bk=bk)
    rng = np.random.default_rng(bk + bn)
    M, N, K = bm + 5, bn + 7, 2 * bk + 3
    a = rng.standard_normal((M, K)).astype(f8e5m2.np)
    bt = rng.standard_normal((N, K)).astype(f8e4m3fn.np)
    ck = cuda.compile_program(kern.program, _sched(kern, block_threads=threads),
                              device="emulated")
    wn = bn if threads == 128 else bn // 2
    assert f"wgmma.mma_async.sync.aligned.m64n{wn}k32.f32.e5m2.e4m3" in ck.source.text
    rep = tn.validate(kern, "cuda", compiled=ck,
                      inputs=[[a, bt, np.zeros((M, N), np.float32), ONE, ONE]])
    assert rep.ok and rep.count("ok") == 1, rep.summary()


def test_fp8_wgmma_needs_a_whole_128_byte_panel_of_k():
    # a 64-deep FP8 tile is half a swizzled panel row: refused with the reason
    kern = _scaled(bk=64)
    with pytest.raises(TilenestError, match="swizzled layout .*N x K") as e:
        lower_verified(kern.program, _sched(kern))
    assert "mma_unit='wgmma'" in str(e.value)


def test_fp8_wgmma_serialized_form_validates_on_llvm():
    """The same warpgroup lowering run on the CPU (each thread's reference
    cells of the FP8 product)."""
    kern = _scaled()
    sched = default_schedule(kern.program, "llvm", block_threads=256, mma_unit="wgmma",
                             stages=2)
    assert "group_mma" in print_kernel(lower_verified(kern.program, sched))
    rng = np.random.default_rng(2)
    M, N, K = 130, 140, 300
    A = rng.standard_normal((M, K)).astype(f8e4m3fn.np)
    Bt = rng.standard_normal((N, K)).astype(f8e4m3fn.np)
    args = (np.float32(0.5), np.float32(2.0))
    C = np.zeros((M, N), tn.bf16.np)
    oracle = tn.reference(kern, A, Bt, C, *args)
    kern.compile(target="llvm", schedule=sched)(A, Bt, C, *args)
    v = oracle.admits(C)
    assert v.ok, str(v)


@pytest.mark.device
def test_fp8_wgmma_on_the_gpu():
    """On a CUDA GPU: the scaled FP8 GEMM on wgmma is admitted by the oracle
    (V-24's accumulation) over the validator's shape classes."""
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    kern = _scaled()
    ck = cuda.compile_program(kern.program, _sched(kern), device="gpu")
    rep = tn.validate(kern, "cuda", compiled=ck, cases=8, seed=6)
    assert rep.ok and rep.count("ok") == 8, rep.summary()
