"""``tanh`` on f32 under a declared bound (spec/values.md V-14, *Declared
bounds*): the cuda row's ``tn_tanh_approx`` (3 ulp: a polynomial below 1,
``1 - 2/(e + 1)`` by the special function unit above), chosen only where the
program's bound admits it, and its values -- by the host emulator, which
computes the unit's ``ex2`` and ``rcp`` correctly rounded, and by the numpy
model of ``tests/tanh_approx_model.py`` with the unit anywhere within the
PTX ISA's promises. The device sweep over every f32 input is
``test_cuda_device.py::test_tanh_approx_for_every_f32_input_on_gpu``."""

from __future__ import annotations

import numpy as np
import pytest
import tanh_approx_model as M

import tilenest as tn
from tilenest import f32
from tilenest.backends import cuda
from tilenest.backends.cuda.dialect import CUDA
from tilenest.lowering import default_schedule, lower_verified

#: the row's bound, and the most the bounded model reaches over every input
#: (``benchmarks/tanh_approx.py``: 2.177 at x = 1.0445613)
BOUND = dict(CUDA.approx[("tanh", "f32")])["tn_tanh_approx"]
MODELLED = 2.2


def _tanh(ulp: float | None):  # type: ignore[no-untyped-def]
    @tn.kernel
    def th(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, ulp=ulp):
        (n,) = x.shape
        y(tn.coord(0), tn.shape(n)).store(tn.tanh(x[tn.coord(0), tn.shape(n)], ulp=ulp))

    return th


def _source(ulp: float | None, target: str = "cuda") -> str:
    from tilenest.backends.cuda.emit import emit_cuda
    from tilenest.backends.metal.emit import emit_msl

    p = _tanh(ulp).program
    low = lower_verified(p, default_schedule(p, target))
    return emit_cuda(low).text if target == "cuda" else emit_msl(low).text


def _inputs() -> np.ndarray:
    """Every float from -1.5 to 1.5 in steps of 97 floats, every 13th from 1.5
    to 12, the neighbours of the split at 1 and of the saturation near 9.01,
    and the exact cases: +-0, subnormals, +-inf, NaN."""
    pos = np.float32([0, 1.5, 12]).view(np.uint32)
    near = np.concatenate([np.arange(-64, 64) + int(np.float32(v).view(np.uint32))
                           for v in (1.0, 9.0, 9.01, 9.1)]).astype(np.uint32)
    bits = np.concatenate([np.arange(pos[0], pos[1], 97), np.arange(pos[1], pos[2], 13), near,
                           np.uint32([1, 0x7fffff, 0x7f800000, 0x7fc00000, 0x7f7fffff])])
    x = bits.astype(np.uint32).view(np.float32)
    return np.concatenate([x, -x])


def test_the_cuda_row_takes_it_only_where_the_bound_admits_it():
    """``tn_tanh_approx`` for a declared bound of at least the row's 3 ulp;
    CUDA's double ``tanh``, rounded once, under tanh's own bound and under
    2.9; on the metal row (no approximations) whatever the bound."""
    assert BOUND == 3.0
    for ulp in (3.0, 4, 1e6):
        text = _source(ulp)
        assert "tn_tanh_approx(" in text and "tanh(((double)" not in text, ulp
    for ulp in (None, 1.0, 2.9):
        text = _source(ulp)
        assert "tn_tanh_approx(" not in text and "tanh(((double)" in text, ulp
    assert "tn_tanh_approx(" not in _source(100.0, "metal")


def test_the_emulator_computes_the_model_bit_for_bit_within_the_bound():
    """NVRTC compiles the kernel to an sm_90a cubin; the emulator's results
    (the prelude's code with the unit's ``ex2`` and ``rcp`` correctly
    rounded) are the numpy model's with no shift, bit for bit, odd bit for
    bit, within :data:`MODELLED` ulp of tanh, and the exact cases exact."""
    ck = cuda.compile_program(_tanh(BOUND).program, device="emulated")
    assert ck.cubin[:4] == b"\x7fELF"
    assert "tn_tanh_approx(" in ck.source.text
    x = _inputs()
    y = np.full_like(x, np.nan)
    ck(x, y)
    want, _ = M.tanh_approx(x)
    assert np.array_equal(y.view(np.uint32), want.view(np.uint32))
    n = len(x) // 2
    assert np.array_equal(y[n:].view(np.uint32), (y[:n].view(np.uint32) ^ 0x80000000))
    err = M.ulp_error(x, y)
    assert err.max() <= MODELLED, x[np.argmax(err)]
    assert err.max() > 1.0  # the sample reaches past the polynomial's 0.95
    assert np.array_equal(y[x == 0].view(np.uint32), x[x == 0].view(np.uint32))
    inf = np.isinf(x)
    assert (y[inf] == np.sign(x[inf])).all() and np.isnan(y[np.isnan(x)]).all()
    assert (y[np.abs(x) >= 9.1] == np.sign(x[np.abs(x) >= 9.1])).all()


def test_the_unit_anywhere_within_its_promises_stays_within_the_bound():
    """The exponential form with every ``ex2`` result within 2.5 ulp of
    ``2^a`` and every ``rcp`` within one float of the rounded ``1/s`` (the
    model's shifts), on every 31st float from 1 to 9.1: within
    :data:`MODELLED` ulp, below the row's bound."""
    lo, hi = np.float32([1.0, 9.1]).view(np.uint32)
    x = np.arange(lo, hi, 31, dtype=np.uint32).view(np.float32)
    ref = np.tanh(x.astype(np.float64))
    worst = np.zeros(len(x))
    for k in range(-3, 4):
        for j in (-1, 0, 1):
            y, ok = M.exponential(x, k, j)
            worst = np.maximum(worst, np.where(ok, np.abs(y - ref) / M.ulp32(ref), 0.0))
    assert 1.5 < worst.max() <= MODELLED < BOUND


def test_the_model_rounds_fma_once():
    """:func:`tanh_approx_model.fma32` is the exactly rounded ``a * b + c``:
    where the f64 sum alone would round twice (a product just past a
    midpoint of f32 and a tiny addend) and where it is exact."""
    a, b = np.float32(1 + 2.0**-12), np.float32(1 + 2.0**-12)  # a b = 1 + 2^-11 + 2^-24
    assert M.fma32(a, b, np.float32(0)) == np.float32(1 + 2.0**-11)  # tie, to even
    assert M.fma32(a, b, np.float32(2.0**-60)) == np.float32(1 + 2.0**-11 + 2.0**-23)
    assert M.fma32(a, b, np.float32(-2.0**-60)) == np.float32(1 + 2.0**-11)
    assert M.fma32(np.float32(3), np.float32(5), np.float32(-15)) == 0


@pytest.mark.parametrize("ulp", [None, 3.0])
def test_the_formula_states_the_declared_bound(ulp):
    """``bounds.tanh(x, ulp=k)`` widens the result's error by ``k`` ulp where
    the function's own bound gives 1."""
    from tilenest.workloads import bounds as B

    x = B.Approx.exact(np.array([0.3, -2.0, 5.0]))
    base = B.tanh(x).e
    got = B.tanh(x, ulp).e
    assert np.allclose(got, base * (1.0 if ulp is None else ulp))


def test_gemm_gelu_declares_its_tanh_bound():
    """The fused GEMM's GELU epilogue declares ``GELU_TANH_ULP`` for its tanh:
    the cuda row computes it by ``tn_tanh_approx``, with no double
    arithmetic left in the epilogue; ``tanh_ulp=1.0`` (tanh's own bound)
    keeps the faithful tanh."""
    from tilenest.backends.cuda.emit import emit_cuda
    from tilenest.workloads.gemm import GELU_TANH_ULP, gemm_kernel

    assert GELU_TANH_ULP >= BOUND
    sched = {"bm": 32, "bn": 32, "bk": 16, "loop": "pipeline", "epilogue": "gelu"}
    k = gemm_kernel(tn.bf16).specialize(**sched)
    assert "tanh %" in str(k.program) and f"{{ulp = {GELU_TANH_ULP!r}}}" in str(k.program)
    text = emit_cuda(lower_verified(k.program, default_schedule(k.program, "cuda"))).text
    assert "tn_tanh_approx(" in text and "(double)" not in text
    plain = gemm_kernel(tn.bf16).specialize(**sched, tanh_ulp=1.0)
    text = emit_cuda(lower_verified(plain.program, default_schedule(plain.program, "cuda"))).text
    assert "tn_tanh_approx(" not in text and "tanh(" in text
