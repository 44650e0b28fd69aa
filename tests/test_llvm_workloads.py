"""Every workload of the library, compiled for LLVM, against both of its oracles.

For each workload, at every size except ``large`` (``small``, ``medium`` and
the shape variants such as gemm's tall/wide/ragged), in every storage dtype it
lists, the kernel is compiled with ``target="llvm"`` and run on the workload's
seeded arguments. The compiled outputs must be

* admitted by the interpreter's oracle (``tn.reference``) on the same inputs,
  and
* within the workload's own FP64 formula bound (bitwise where the formula is
  exact: indices, strict folds, sorts).

Every tile schedule of every workload is compiled and judged the same way at
the small size.

The default run takes the ``small`` size in every dtype and every other
size (``medium`` and the shape variants) in f32; ``-m slow`` adds those in
f16 and bf16.
"""

from __future__ import annotations

import numpy as np
import pytest

from tilenest import f32
from tilenest.workloads import WORKLOADS
from workload_checks import assert_validates
from tilenest.workloads.base import Result


def _cases() -> list:
    out = []
    for n, w in WORKLOADS.items():
        for s in w.sizes:
            if s == "large":
                continue
            for dt in w.dtypes:
                slow = s != "small" and dt != f32
                out.append(pytest.param(n, s, dt, id=f"{n}-{s}-{dt.name}",
                                        marks=pytest.mark.slow if slow else ()))
    return out


def _copy(a):  # type: ignore[no-untyped-def]
    return a.copy() if isinstance(a, np.ndarray) else a


def compiled_run(wl, size, dtype, schedule=None) -> Result:  # type: ignore[no-untyped-def]
    """Compile ``wl`` for llvm and run it on the seeded arguments."""
    sched = dict(wl.schedules[0] if schedule is None else schedule)
    sz = wl.size(size)
    k = wl.kernel(dtype, sched, sz)
    ck = k.compile(target="llvm")
    args = wl.args(sz, dtype)
    work = {n: _copy(a) for n, a in args.items()}
    ck(*work.values())
    return Result(wl, sz, dtype, sched, k, args, {n: work[n] for n in wl.outputs})


@pytest.mark.parametrize("name,size,dt", _cases())
def test_workload_compiles_and_validates(name, size, dt):
    assert_validates(compiled_run(WORKLOADS[name], size, dt))


SCHEDULES = [pytest.param(n, i, id=f"{n}-s{i}") for n, w in WORKLOADS.items()
             for i in range(1, len(w.schedules))]


@pytest.mark.parametrize("name,i", SCHEDULES)
def test_every_schedule_compiles_and_validates(name, i):
    """Schedule 0 is covered above; each other schedule at the small size, f32."""
    wl = WORKLOADS[name]
    assert_validates(compiled_run(wl, "small", f32, wl.schedules[i]))


def test_compiled_run_really_uses_the_compiled_kernel():
    """A wrong compiled output is caught: corrupt one element of a compiled
    gemm result and both judges must reject it."""
    wl = WORKLOADS["gemm"]
    r = compiled_run(wl, "small", f32)
    assert_validates(r)
    out = next(iter(r.outputs))
    r.outputs[out].flat[3] += np.float32(0.25) * (1 + abs(r.outputs[out].flat[3]))
    with pytest.raises(AssertionError):
        assert_validates(r)
