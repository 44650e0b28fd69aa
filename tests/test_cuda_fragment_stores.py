"""Register-tile epilogues store a lane's adjacent columns as one access.

A thread's cells of an ``mma`` accumulator come in pairs of adjacent columns
(``e`` of ``loopir.lane_cell``): the elementwise nest reading them out runs
its innermost loop over the pair with every lane active. Such a lane loop is
widened like a distributed one (``analysis.lane_plan``): its store is one
2-element access when its guard holds at both lanes (the guard is an
interval over the lanes) and the address is aligned; any other pair (a
ragged last column, an odd row length) takes the element stores.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import bf16
from tilenest.backends import cuda
from tilenest.lowering import default_schedule
from tilenest.workloads import WORKLOADS


def _gemm(dt=bf16, bm=64, bn=64, bk=32):  # type: ignore[no-untyped-def]
    return WORKLOADS["gemm"].kernel(dt, {"bm": bm, "bn": bn, "bk": bk, "loop": "pipeline"})


@pytest.mark.parametrize("dt,unit,tile", [(bf16, "auto", (64, 64, 32)),
                                          (bf16, "wgmma", (128, 128, 64)),
                                          (tn.f16, "tensor", (64, 64, 32))])
def test_an_accumulator_epilogue_stores_column_pairs(dt, unit, tile):
    kern = _gemm(dt, *tile)
    s = default_schedule(kern.program, "cuda", mma_unit=unit)
    text = cuda.stage_source(kern.program, s)[1].text
    body = text[text.rindex("for (v_kk"):]
    assert f"tn_vstore<tn_{dt.name}, 2>(&b_C[" in body
    # the pair's guard: both columns in range, the row length and base aligned
    assert "tn_aligned(b_C, 4) && tn_multiple(S_N, 2)" in body


@pytest.mark.parametrize("M,K,N", [(70, 40, 90), (64, 64, 63), (33, 16, 129), (64, 32, 64)])
def test_column_pairs_validate_emulated(M, K, N):
    """Even and odd row lengths (an odd one misaligns every other row) and a
    ragged last pair: the oracle admits every run."""
    kern = _gemm()
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda"),
                              device="emulated", cache=False)
    assert "tn_vstore<tn_bf16, 2>(&b_C[" in ck.source.text
    rng = np.random.default_rng(M + 3 * N)
    A = rng.standard_normal((M, K)).astype(bf16.np)
    B = rng.standard_normal((K, N)).astype(bf16.np)
    oracle = tn.reference(kern, A, B, np.zeros((M, N), bf16.np))
    for policy, poison in (("in_order", "nan"), ("random", "big")):
        C = np.zeros((M, N), bf16.np)
        ck(A, B, C, policy=policy, poison=poison, seed=5)
        v = oracle.admits(C)
        assert v.ok, f"{policy}/{poison}: {v}"


@pytest.mark.device
@pytest.mark.parametrize("unit,tile", [("auto", (64, 64, 32)), ("wgmma", (128, 256, 64))])
@pytest.mark.parametrize("M,K,N", [(512, 256, 512), (300, 200, 777), (129, 72, 4099)])
def test_column_pairs_on_the_gpu(unit, tile, M, K, N):
    """The same on the device: square, ragged with an odd row length, and a
    long odd row."""
    kern = _gemm(bf16, *tile)
    ck = cuda.compile_program(kern.program,
                              default_schedule(kern.program, "cuda", mma_unit=unit), device="gpu")
    assert "tn_vstore<tn_bf16, 2>(&b_C[" in ck.source.text
    rng = np.random.default_rng(M + 3 * N)
    A = rng.standard_normal((M, K)).astype(bf16.np)
    B = rng.standard_normal((K, N)).astype(bf16.np)
    C = np.zeros((M, N), bf16.np)
    ck(A, B, C)
    v = tn.reference(kern, A, B, np.zeros((M, N), bf16.np)).admits(C)
    assert v.ok, v
