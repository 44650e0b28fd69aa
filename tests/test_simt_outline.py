"""Functions evaluated in double, called out of line where unrolling would
copy them (``Emitter.via_f64``, ``spec/lowering.md`` *Transcendentals*).

A narrow transcendental on cuda is the double function of the exactly
widened argument, rounded once. In a register tile's epilogue the loops over
a thread's cells are unrolled (the cells must stay in registers), so an
inline call is copied once per cell: a GEMM's tanh-GELU epilogue had 128
copies of CUDA's double ``tanh`` and a cubin nine times the ReLU one's. From
:data:`~tilenest.backends.simt.emitter.OUTLINE_COPIES` copies on, the call
goes through one ``__noinline__`` helper computing the same expression.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import tilenest as tn
from tilenest import bf16, f32
from tilenest.backends import cuda
from tilenest.backends.simt import emitter
from tilenest.lowering import default_schedule
from tilenest.workloads import WORKLOADS


def _gemm(epilogue: str, dt=bf16, tile=64, bk=32):  # type: ignore[no-untyped-def]
    """The workload's GEMM with ``epilogue``; a GELU keeps tanh's own bound
    (``tanh_ulp=1.0``), so its tanh is the double function (the workload
    declares a looser one, which cuda computes in float, inline)."""
    faithful = {"tanh_ulp": 1.0} if epilogue == "gelu" else {}
    return WORKLOADS[f"gemm_{epilogue}"].kernel(
        dt, {"bm": tile, "bn": tile, "bk": bk, "loop": "pipeline", **faithful})


def _source(kern, **kw):  # type: ignore[no-untyped-def]
    return cuda.stage_source(kern.program, default_schedule(kern.program, "cuda", **kw))[1].text


def test_an_unrolled_epilogue_calls_one_helper():
    text = _source(_gemm("gelu"))
    helpers = re.findall(r"static __device__ __noinline__ float (tn_ol_\w+)\(float x0\) "
                         r"\{ return tn_round_f32\(tanh\(\(double\)x0\)\); \}", text)
    assert helpers == ["tn_ol_tanh_f32"]
    body = text[text.index("__global__"):]
    assert "tanh(" not in body.replace("tn_ol_tanh_f32(", "")
    assert body.count("tn_ol_tanh_f32(") >= 1
    # the cells of the epilogue are unrolled: at least OUTLINE_COPIES of them
    assert "#pragma unroll" in body


def test_a_short_lane_group_keeps_its_call_inline():
    @tn.kernel
    def tanh_rows(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
        R, C = x.shape
        y = y.with_dims(*x.dims())
        for p in tn.parallel(tn.shape(R)):
            o = tn.coord(p.index(), 0)
            t = x[o, tn.shape(1, C), tn.bounds.zero]
            y(o, tn.shape(1, C)).store(tn.tanh(t))

    text = _source(tanh_rows)
    assert "tn_ol_" not in text and re.search(r"tanh\(\(+double\)", text)


def test_the_helper_keeps_the_code_small():
    """NVRTC's cubins: the GELU epilogue's code is a small multiple of the
    ReLU one's, not one double ``tanh`` per cell (260 KB against 28 KB at
    128 x 256 tiles before)."""
    sizes = {}
    for ep in ("relu", "gelu"):
        kern = _gemm(ep, tile=128, bk=64)
        s = default_schedule(kern.program, "cuda", mma_unit="wgmma", stages=4)
        _, src = cuda.stage_source(kern.program, s)
        sizes[ep] = len(cuda._build(src).cubin)
    assert sizes["gelu"] < 3 * sizes["relu"], sizes


def test_outlined_epilogues_validate_emulated(monkeypatch):
    """The helper computes the inline expression: tanh-GELU and an epilogue
    of ``pow`` and ``atan2`` (both arguments widened) validate against the
    interpreter, also with every call outlined (``OUTLINE_COPIES = 1``)."""

    @tn.kernel
    def gemm_pow(A: tn.Tensor[bf16, "M K"], B: tn.Tensor[bf16, "K N"],
                 C: tn.Tensor[bf16, "M N"]):
        M, K = A.shape
        N = B.shape[1]
        m, k = A.dims()
        n = C.dim(1)
        B = B.with_dims(k, n)
        C = C.with_dims(m, n)
        for p in tn.parallel(tn.shape(tn.cdiv(M, 64), tn.cdiv(N, 64))):
            i, j = p.index(0), p.index(1)
            acc = tn.zeros(f32, tn.shape(64, 64), dims=(m, n))
            for kk in p.serial(tn.shape(tn.cdiv(K, 32))):
                a = A[tn.coord(i * 64, kk.index() * 32), tn.shape(64, 32)]
                b = B[tn.coord(kk.index() * 32, j * 64), tn.shape(32, 64)]
                acc = tn.mma(a, b, acc)
            acc = tn.pow(tn.abs(acc) + 1.0, 0.5) + tn.atan2(acc, 3.0)
            C(tn.coord(i * 64, j * 64), tn.shape(64, 64)).store(tn.cast(acc, bf16))

    rng = np.random.default_rng(3)
    A = rng.standard_normal((70, 40)).astype(bf16.np)
    B = rng.standard_normal((40, 90)).astype(bf16.np)
    for every in (False, True):
        if every:
            monkeypatch.setattr(emitter, "OUTLINE_COPIES", 1)
        for kern, args in ((gemm_pow, [A, B]), (_gemm("gelu"), [A, B])):
            ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda"),
                                      device="emulated", cache=False)
            assert "tn_ol_" in ck.source.text
            out = np.zeros((70, 90), bf16.np)
            rep = tn.validate(kern, "cuda", inputs=[*args, out], compiled=ck)
            assert rep.ok and rep.count("ok") == 1, rep.summary()


@pytest.mark.device
def test_an_outlined_gelu_epilogue_on_the_gpu():
    """The tanh-GELU GEMM with its helper, on the device, against the oracle."""
    kern = _gemm("gelu", tile=128, bk=64)
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                             mma_unit="wgmma", stages=4),
                              device="gpu")
    assert "tn_ol_tanh_f32" in ck.source.text
    rng = np.random.default_rng(9)
    A = rng.standard_normal((640, 320)).astype(bf16.np)
    B = rng.standard_normal((320, 520)).astype(bf16.np)
    C = np.zeros((640, 520), bf16.np)
    ck(A, B, C)
    v = tn.reference(kern, A, B, np.zeros((640, 520), bf16.np)).admits(C)
    assert v.ok, v
