"""Every workload of the library, compiled for Metal and run on the host emulator.

The same judgement as ``test_cuda_workloads.py`` (``workload_checks``): each
case is compiled with ``target="metal"`` (``device="emulated"``: the MSL
source under the emulator's ``metal`` dialect, no NVRTC) with 32 threads per
threadgroup, run under two interleaving policies and two threadgroup-memory
poisons that rotate with the case, and every run's outputs must be admitted
by the interpreter's oracle and lie within the workload's FP64 formula bound.

The default run takes every workload at its ``small`` size in one storage
dtype, rotating over the dtypes the workload lists (f32, f16, bf16 in turn
over the library), so every workload and every dtype is covered; ``-m slow``
adds the other dtypes and the other small shape variants. Where a shape
needs more threadgroup memory than the metal row's 32 KiB (topk's ``wide``
variant: 1,025-element rows sorted in threadgroup memory), the compiled
kernel refuses the launch with the containment obligation and its hint.
"""

from __future__ import annotations

import pytest

from tilenest import f32
from tilenest.errors import TilenestError
from tilenest.targets import row
from tilenest.workloads import WORKLOADS
from workload_checks import judge_emulated

THREADS = 32
#: (workload, variant) pairs whose threadgroup memory exceeds the metal row's
OVER_THREADGROUP_MEMORY = {("topk", "wide")}


def _cases() -> list:  # type: ignore[type-arg]
    """Every small case, the default ones first in each workload: ``small``
    in the dtype its rotation picks."""
    out = []
    for j, (name, w) in enumerate(WORKLOADS.items()):
        pick = w.dtypes[j % len(w.dtypes)]
        for size in w.sizes:
            if size in ("medium", "large"):
                continue
            for dt in w.dtypes:
                default = size == "small" and dt == pick
                out.append(pytest.param(name, size, dt, id=f"{name}-{size}-{dt.name}",
                                        marks=() if default else pytest.mark.slow))
    return out


CASES = _cases()


@pytest.mark.parametrize("name,size,dt", CASES)
def test_workload_validates_on_emulated_metal(name, size, dt):  # type: ignore[no-untyped-def]
    i = [c.values for c in CASES].index((name, size, dt))
    gpu = {"block_threads": THREADS}
    if (name, size) in OVER_THREADGROUP_MEMORY:
        with pytest.raises(TilenestError) as e:
            judge_emulated("metal", name, size, dt, i, gpu=gpu)
        assert f"<= {row('metal').profile.shared_bytes}" in str(e.value), e.value
        assert e.value.hint and "smaller" in e.value.hint
        return
    judge_emulated("metal", name, size, dt, i, gpu=gpu)


@pytest.mark.parametrize("name,dt", [
    pytest.param("topk", f32, id="topk-f32"),
    pytest.param("gemm", f32, id="gemm-f32", marks=pytest.mark.slow)])
def test_every_tile_schedule_validates_on_emulated_metal(name, dt):  # type: ignore[no-untyped-def]
    """The further tile schedules of a row-sorting and a GEMM workload (the
    first one is covered above)."""
    wl = WORKLOADS[name]
    for j in range(1, len(wl.schedules)):
        judge_emulated("metal", name, "small", dt, j, wl.schedules[j],
                       gpu={"block_threads": THREADS})


def test_the_default_run_covers_every_workload_and_dtype():
    """Every workload runs by default, and so does every dtype any workload
    lists."""
    default = [c.values for c in CASES if not c.marks]
    assert {n for n, _, _ in default} == set(WORKLOADS)
    assert {dt for _, _, dt in default} == {dt for w in WORKLOADS.values() for dt in w.dtypes}
