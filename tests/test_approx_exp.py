"""Declared accuracy bounds (spec/values.md V-14, *Declared bounds*): a
program may loosen a transcendental function's contract for one application
(``tn.exp(x, ulp=4)``); the oracle then admits any result within it, and a
target may compute it by a cheaper realization that meets it (the cuda row's
``exp`` on f32 by the special function unit, ``tn_exp_f32_approx``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.errors import CaptureError, TypeCheckError
from tilenest.lowering import default_schedule, lower_verified, print_kernel
from tilenest.semantics import numerics as N
from tilenest.semantics.jsonio import from_json, to_json
from tilenest.semantics.parser import parse_program


def _rows(ulp: float | None, fn=tn.exp):  # type: ignore[no-untyped-def]
    @tn.kernel
    def rows(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
        r, c = x.shape
        for p in tn.parallel(tn.shape(r)):
            row = x[tn.coord(p.index(), 0), tn.shape(1, c)]
            m = tn.reduce(row, row.dim(1), tn.maximum)
            e = fn(row - m) if ulp is None else fn(row - m, ulp=ulp)
            y(tn.coord(p.index(), 0), tn.shape(1, c)).store(e / tn.reduce(e, e.dim(1), tn.add))

    return rows


def test_a_declared_bound_prints_parses_and_round_trips():
    k = _rows(4)
    text = str(k.program)
    assert "exp %" in text and "{ulp = 4}" in text
    assert parse_program(text, "rt.tile") == k.program
    assert from_json(json.loads(json.dumps(to_json(k.program)))) == k.program
    assert "{ulp" not in str(_rows(None).program)


@pytest.mark.parametrize("ulp,why", [(0.5, "tighter than exp's own bound"),
                                     (float("inf"), "not a finite number"),
                                     (True, "not a finite number")])
def test_a_bound_that_admits_less_or_nothing_finite_is_refused(ulp, why):
    with pytest.raises((TypeCheckError, CaptureError)) as e:
        _rows(ulp).program
    assert why in str(e.value) and "exp(x, ulp=" in str(e.value)
    assert "at least 1" in (e.value.hint or "")


def test_only_the_declarable_functions_take_a_bound():
    with pytest.raises(CaptureError) as e:
        _rows(4, fn=tn.sqrt).program
    assert "tn.sqrt takes no ulp bound" in str(e.value)
    assert N.check_declared_ulp("sqrt", tn.f32, 4) is not None
    assert N.check_declared_ulp("tanh", tn.bf16, 2) is None


def test_the_oracle_admits_exactly_the_declared_bound():
    """A result k ulp away from every element's exact value: admitted under a
    bound of k ulp, refused under the function's own (1 ulp) and under k - 1."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-20, 0, (6, 50)).astype(np.float32)

    @tn.kernel
    def ex(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"], *, ulp=1.0):
        r, c = x.shape
        for p in tn.parallel(tn.shape(r)):
            row = x[tn.coord(p.index(), 0), tn.shape(1, c)]
            y(tn.coord(p.index(), 0), tn.shape(1, c)).store(tn.exp(row, ulp=ulp))

    exact = np.exp(x.astype(np.float64))
    spacing = np.spacing(exact.astype(np.float32)).astype(np.float64)
    off = (exact + 3 * spacing).astype(np.float32)  # about 3 ulp above (rounded once)
    err = np.abs(off.astype(np.float64) - exact) / spacing
    assert err.max() > 2.6
    for ulp, ok in ((4.0, True), (1.0, False), (2.0, False)):
        adm = tn.reference(ex.specialize(ulp=ulp), x, np.zeros_like(x))
        assert bool(adm.admits(off)) is ok, ulp


def test_the_cuda_row_takes_the_approximation_only_where_the_bound_admits_it():
    """``tn_exp_f32_approx`` (4 ulp) for a declared bound of at least 4 on f32,
    with no common-case test (it has no slow path); the faithful ``exp``
    under a bound below 4, on bf16 operands, and on the llvm and metal rows."""
    from tilenest.backends.cuda.emit import emit_cuda
    from tilenest.backends.metal.emit import emit_msl

    def src(ulp, target="cuda"):  # type: ignore[no-untyped-def]
        p = _rows(ulp).program
        low = lower_verified(p, default_schedule(p, target))
        return low, (emit_cuda(low).text if target == "cuda" else emit_msl(low).text)

    low, text = src(4)
    assert "tn_exp_f32_approx(" in text and "tn_exp_f32_ok(" not in text
    assert "exp{ulp=4}(" in print_kernel(low)
    for ulp in (None, 3.5):
        _, text = src(ulp)
        assert "tn_exp_f32_approx(" not in text and "tn_exp_f32" in text
    _, text = src(8, "metal")
    assert "tn_exp_f32_approx(" not in text


def test_attention_written_for_speed_declares_its_bound():
    """The workload's flash kernel declares ``FLASH_EXP_ULP`` for its two
    exponentials; its wgmma form on the cuda row computes them approximately
    and so needs no second, whole run of the probabilities' nest."""
    from tilenest.backends.cuda.emit import emit_cuda
    from tilenest.workloads.attention import FLASH_EXP_ULP, flash_kernel

    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=64, dh=64, dv=64, causal=True)
    assert str(kern.program).count(f"{{ulp = {FLASH_EXP_ULP!r}}}") == 2
    text = emit_cuda(lower_verified(kern.program, default_schedule(kern.program, "cuda"))).text
    assert text.count("tn_exp_f32_approx(") >= 2 and "tn_exp_f32_ok(" not in text


def test_softmax_with_a_declared_bound_validates_emulated():
    """Compiled for cuda and run by the emulator (whose ``ex2`` is the host's
    correctly rounded 2^a), against the oracle with the declared bound; the
    same kernel on llvm keeps its faithful ``exp``, which any looser bound
    admits."""
    k = _rows(4)
    for target in ("cuda", "llvm"):
        rep = tn.validate(k, target, cases=8)
        assert rep.ok and len(rep.results) == 8, rep


@pytest.mark.device
@pytest.mark.slow
def test_approx_exp_error_for_every_f32_input_on_gpu(tmp_path):
    """``tn_exp_f32_approx`` as the GPU computes it, over all 2^32 f32 inputs
    against CUDA's double ``exp``: within the 4 ulp the cuda row states
    (``dialect.CUDA.approx``), NaN stays NaN, every result that is not finite
    is exactly the right infinity, and ``exp(-inf) = +0``."""
    import cupy as cp

    from test_cuda_device import _device_function

    from tilenest.backends.cuda.dialect import CUDA

    src = r'''
#include "tn_prelude.cuh"
__device__ double ulp32(double y) {
  int e = ilogb(fabs(y));
  return ldexp(1.0, (e < -126 ? -126 : e) - 23);
}
extern "C" __global__ void sweep(unsigned long long* worst, unsigned long long* bad) {
  double mx = 0.0;
  unsigned long long nbad = 0;
  unsigned stride = gridDim.x * blockDim.x;
  for (unsigned long long u = blockIdx.x * blockDim.x + threadIdx.x; u < (1ull << 32); u += stride) {
    float x = tn_bitsf((unsigned)u);
    float y = tn_exp_f32_approx(x);
    if (x != x) { nbad += !(y != y); continue; }
    if (x == -INFINITY) { nbad += tn_fbits(y) != 0u; continue; }
    double ref = exp((double)x);
    if (ref >= 0x1.fffffefffffffp+127) { nbad += tn_fbits(y) != 0x7f800000u; continue; }
    if (!(fabs((double)y) <= 0x1.fffffep+127)) { ++nbad; continue; }
    double err = fabs((double)y - ref) / ulp32(ref);
    mx = err > mx ? err : mx;
  }
  atomicMax(worst, (unsigned long long)__double_as_longlong(mx));
  if (nbad) atomicAdd(bad, nbad);
}
'''
    fn = _device_function(src, "sweep", tmp_path)
    worst = cp.zeros(1, cp.uint64)
    bad = cp.zeros(1, cp.uint64)
    fn((132 * 16,), (256,), (worst, bad))
    cp.cuda.Device().synchronize()
    err = float(worst.view(cp.float64)[0])
    print(f"tn_exp_f32_approx: at most {err:.3f} ulp over every f32 input")
    assert int(bad[0]) == 0
    assert 0.5 <= err <= CUDA.approx[("exp", "f32")][1], err
