"""The default cuda schedule of the benchmark's tensor-core kernels is the
code of the fastest schedule measured for them (``benchmarks/cuda.py``,
spec/lowering.md L-12, *The default schedule*): compiled with no schedule, a
GEMM tile runs warp-specialized with a 4-version ring, and attention one
warpgroup per 64 query rows with its tiles in registers. Same code means the
same source up to the names the lowering picks and its comments, and the
same launches (``tune.same_code_key``), so the figures measured for the
explicit form are the default's."""

from __future__ import annotations

import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.backends.cuda.tune import same_code_key
from tilenest.bench.kernels import kernels
from tilenest.lowering import default_schedule
from tilenest.workloads import WORKLOADS

#: the measured-fastest explicit form of each (spec/lowering.md L-12 and L-10)
ROLES4 = {"mma_unit": "wgmma", "tma": True, "warp_roles": True, "stages": 4}


def _key(kern, **over):  # type: ignore[no-untyped-def]
    return same_code_key(cuda.compile_program(
        kern.program, default_schedule(kern.program, "cuda", **over), device="emulated"))


@pytest.mark.parametrize("make,fastest", [
    (lambda: WORKLOADS["gemm"].kernel(tn.bf16, {"bm": 128, "bn": 256, "bk": 64,
                                                "loop": "pipeline"}), ROLES4),
    (lambda: kernels()["fp8_gemm"].specialize(bm=128, bn=256, bk=128), ROLES4),
    (lambda: WORKLOADS["flash_attention"].kernel(
        tn.bf16, {"bq": 64, "bk": 64, "dh": 128, "dv": 128, "causal": True}),
     {"block_threads": 128, "mma_unit": "wgmma"}),
    (lambda: WORKLOADS["flash_attention"].kernel(
        tn.bf16, {"bq": 128, "bk": 64, "dh": 128, "dv": 128, "causal": False}),
     {"block_threads": 256, "mma_unit": "wgmma"}),
], ids=["gemm-bf16", "gemm-fp8", "attention-bq64", "attention-bq128"])
def test_the_default_is_the_fastest_measured_code(make, fastest):
    kern = make()
    assert _key(kern) == _key(kern, **fastest)


def test_other_schedules_are_other_code():
    """The key tells the ring on block barriers from the specialized one."""
    kern = WORKLOADS["gemm"].kernel(tn.bf16, {"bm": 128, "bn": 256, "bk": 64,
                                              "loop": "pipeline"})
    assert _key(kern) != _key(kern, **{**ROLES4, "warp_roles": False})
    assert _key(kern) != _key(kern, **{**ROLES4, "stages": 3})
