"""The default ``min_blocks`` of a tensor-core kernel (``backends/cuda/occupancy.py``):
two blocks where their shared memory fits a multiprocessor and their private
tiles take between a quarter and three quarters of the registers the cap
leaves a thread, else ptxas's own choice; an explicit field always wins."""

from __future__ import annotations

import re

import pytest

import tilenest as tn
from tilenest.backends.cuda import stage_source
from tilenest.backends.cuda.occupancy import default_min_blocks, register_words
from tilenest.lowering import default_schedule, lower_verified
from tilenest.targets import CUDA
from tilenest.workloads import WORKLOADS
from test_tensor_mma_dims import flash_attention


def _gemm(bm, bn, bk):  # type: ignore[no-untyped-def]
    return WORKLOADS["gemm"].kernel(tn.bf16, {"bm": bm, "bn": bn, "bk": bk, "loop": "pipeline"})


def _blocks(kern, **kw):  # type: ignore[no-untyped-def]
    s = default_schedule(kern.program, "cuda", **kw)
    k = lower_verified(kern.program, s)
    return default_min_blocks(k, s.block_threads, CUDA.profile), register_words(k)


@pytest.mark.parametrize("what,kern,kw,want", [
    ("prefill 64 x 64, D 128: 99 KB, 68 registers of tiles",
     lambda: flash_attention(tn.bf16, bq=64, bk=64, dh=128, dv=128, causal=True), {}, 2),
    ("prefill 128 x 64: 124 KB, one block fits",
     lambda: flash_attention(tn.bf16, bq=128, bk=64, dh=128, dv=128, causal=True), {}, None),
    ("warpgroup GEMM 128 x 256: its accumulators take the whole cap",
     lambda: _gemm(128, 256, 64), {}, None),
    ("warpgroup GEMM 256 x 128, 4 stages: 193 KB", lambda: _gemm(256, 128, 64),
     {"mma_unit": "wgmma", "stages": 4, "block_threads": 512}, None),
    ("mma.sync GEMM 128 x 128 x 32: 64 registers of accumulators",
     lambda: _gemm(128, 128, 32), {}, 2),
    ("mma.sync GEMM 64 x 64 x 32: 16, more blocks fit without the cap",
     lambda: _gemm(64, 64, 32), {}, None),
    ("small mma.sync GEMM", lambda: _gemm(32, 32, 16), {}, None),
])
def test_default_min_blocks(what, kern, kw, want):
    got, words = _blocks(kern(), **kw)
    assert got == want, (what, words)


def test_kernels_without_tensor_cores_keep_ptxas_choice():
    from tilenest.bench.kernels import kernels

    assert _blocks(kernels()["softmax"])[0] is None
    assert _blocks(_gemm(32, 32, 16), mma_unit="simt")[0] is None


def test_the_default_reaches_the_launch_bounds_and_an_explicit_field_wins():
    kern = _gemm(128, 128, 32)
    bounds = lambda **kw: re.findall(  # noqa: E731
        r"__launch_bounds__\(([^)]*)\)",
        stage_source(kern.program, default_schedule(kern.program, "cuda", **kw))[1].text)
    assert bounds() == ["256, 2"]
    assert bounds(min_blocks=1) == ["256, 1"]
    assert bounds(min_blocks=3) == ["256, 3"]
