"""Declared accuracy bounds (spec/values.md V-14, *Declared bounds*): a
program may loosen a transcendental function's contract for one application
(``tn.exp(x, ulp=4)``); the oracle then admits any result within it, and a
target may compute it by a cheaper realization that meets it (the cuda row's
``exp`` on f32 by the special function unit: ``tn_exp_f32_coarse`` within
96 ulp, ``tn_exp_f32_approx`` within 4)."""

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


def test_the_cuda_row_takes_the_cheapest_approximation_the_bound_admits():
    """On f32: ``tn_exp_f32_coarse`` (96 ulp) for a declared bound of at least
    96, ``tn_exp_f32_approx`` (4 ulp) for one of at least 4, both with no
    common-case test (they have no slow path); the faithful ``exp`` under a
    bound below 4, and on the metal row whatever the bound."""
    from tilenest.backends.cuda.emit import emit_cuda
    from tilenest.backends.metal.emit import emit_msl

    def src(ulp, target="cuda"):  # type: ignore[no-untyped-def]
        p = _rows(ulp).program
        low = lower_verified(p, default_schedule(p, target))
        return low, (emit_cuda(low).text if target == "cuda" else emit_msl(low).text)

    for ulp, fn in ((4, "tn_exp_f32_approx("), (95.5, "tn_exp_f32_approx("),
                    (96, "tn_exp_f32_coarse("), (1e6, "tn_exp_f32_coarse(")):
        low, text = src(ulp)
        assert fn in text and "tn_exp_f32_ok(" not in text, ulp
        assert f"exp{{ulp={ulp:g}}}(" in print_kernel(low)
    for ulp in (None, 3.5):
        _, text = src(ulp)
        assert "tn_exp_f32_a" not in text and "tn_exp_f32_c" not in text
        assert "tn_exp_f32" in text
    _, text = src(200, "metal")
    assert "tn_exp_f32_a" not in text and "tn_exp_f32_c" not in text


def test_a_declared_bound_measures_the_edges_by_distance():
    """Under a declared bound the infinities stand at 2^128: an approximation
    may overflow within the bound of where exp does, or give 0 within it of a
    tiny result; under the function's own bound those results stay exact."""
    @tn.kernel
    def ex(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, ulp=1.0):
        (n,) = x.shape
        y(tn.coord(0), tn.shape(n)).store(tn.exp(x[tn.coord(0), tn.shape(n)], ulp=ulp))

    big = np.float32(89.0)  # the greatest float whose e^x rounds to a finite float
    while np.exp(np.float64(big)) >= (2 - 2.0 ** -24) * 2.0 ** 127:
        big = np.nextafter(big, np.float32(0))
    x = np.array([big, -104.0, -103.9], np.float32)
    exact = np.exp(x.astype(np.float64))
    dist = (2.0 ** 128 - exact[0]) / 2.0 ** 104      # ulp of the top binade: about 124
    assert exact[1].astype(np.float32) == 0 and exact[2].astype(np.float32) > 0
    got = np.array([np.inf, 2.0 ** -149, 0.0], np.float32)
    near = tn.reference(ex.specialize(ulp=float(np.ceil(dist))), x, np.zeros(3, np.float32))
    short = tn.reference(ex.specialize(ulp=float(np.floor(dist))), x, np.zeros(3, np.float32))
    plain = tn.reference(_plain_exp(), x, np.zeros(3, np.float32))
    assert near.admits(got) and not plain.admits(got)
    for i in range(3):
        one = plain.value.copy()
        one[i] = got[i]
        assert near.admits(one) and bool(short.admits(one)) is (i > 0), i
        assert not plain.admits(one) or i == 2, i  # 0 for 2^-149.9: exp's own bound too


def _plain_exp():  # type: ignore[no-untyped-def]
    @tn.kernel
    def ex(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
        (n,) = x.shape
        y(tn.coord(0), tn.shape(n)).store(tn.exp(x[tn.coord(0), tn.shape(n)]))

    return ex


def test_attention_written_for_speed_declares_its_bound():
    """The workload's flash kernel declares ``FLASH_EXP_ULP`` for its two
    exponentials (powers of two of scores kept in units of log2); its wgmma
    form on the cuda row computes them by the special function unit alone
    (no multiplication of their own, no faithful ``exp2``) and so needs no
    second, whole run of the probabilities' nest."""
    from tilenest.backends.cuda.emit import emit_cuda
    from tilenest.workloads.attention import FLASH_EXP_ULP, flash_kernel

    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=64, dh=64, dv=64, causal=True)
    assert str(kern.program).count(f"{{ulp = {FLASH_EXP_ULP!r}}}") == 2
    text = emit_cuda(lower_verified(kern.program, default_schedule(kern.program, "cuda"))).text
    assert text.count("tn_ex2_approx(") >= 2 and "tnf_exp2(" not in text
    assert "tn_exp_f32" not in text


@pytest.mark.parametrize("ulp", [4, 96])
def test_softmax_with_a_declared_bound_validates_emulated(ulp):
    """Compiled for cuda and run by the emulator (whose ``ex2`` is the host's
    correctly rounded 2^a), against the oracle with the declared bound; the
    same kernel on llvm keeps its faithful ``exp``, which any looser bound
    admits."""
    k = _rows(ulp)
    for target in ("cuda", "llvm"):
        rep = tn.validate(k, target, cases=8)
        assert rep.ok and len(rep.results) == 8, rep


@pytest.mark.device
@pytest.mark.slow
@pytest.mark.parametrize("op,fn", [("exp", "tn_exp_f32_coarse"), ("exp", "tn_exp_f32_approx"),
                                   ("exp2", "tn_ex2_approx")])
def test_approx_exp_error_for_every_f32_input_on_gpu(op, fn, tmp_path):
    """Each of the cuda row's approximations of ``exp`` and ``exp2`` on f32, as
    the GPU computes it, over all 2^32 f32 inputs against CUDA's double ``exp``
    (``exp2``): within
    the bound the row states for it (``dialect.CUDA.approx``), measured as a
    declared bound is (an infinite result standing for every value from
    ``2^128`` on; ``shadow.within_ulp``),
    NaN stays NaN and the infinite inputs give exactly 0 and infinity."""
    from test_cuda_device import sweep_exp

    from tilenest.backends.cuda.dialect import CUDA

    err, bad = sweep_exp(fn, tmp_path, declared=True, ref=op)
    bound = dict(CUDA.approx[(op, "f32")])[fn]
    print(f"{fn}: at most {err:.3f} ulp over every f32 input (bound {bound:g})")
    assert bad == 0
    assert 0.5 <= err <= bound, err
