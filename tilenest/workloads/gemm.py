"""Matrix products: GEMM (square, tall, wide, ragged tails), GEMV, batched GEMM
and the fused epilogues ``gemm_relu = max(0.125*(A@B) + 0.25, 0)`` and
``gemm_gelu`` (tanh GELU of the same affine map).

Storage is f32, or f16/bf16 with f32 accumulation (``mma`` converts its inputs
exactly into the accumulator's dtype) and one rounding at the store.

Error bound (``bounds.contract``): each output is ``acc + sum_k a_k b_k`` over
``K`` products, evaluated by a reassociating ``mma`` in any grouping, so
``|C - AB| <= gamma_{K+1}(f32) * sum_k |a_k b_k|``; padding products of a
ragged ``K`` tail are exact zeros and add no error. Epilogue ops add their
rounding by the ``Approx`` rules (the GELU's tanh its declared bound,
:data:`GELU_TANH_ULP`); f16/bf16 outputs add ``u_T*|C|`` at the store.
"""

from __future__ import annotations

import functools

import numpy as np

import tilenest as tn
from tilenest import f32

from . import bounds as B
from .base import Workload, normal, sentinel, x64
from .elementwise import gelu_tanh, gelu_tanh_formula

#: the accuracy bound, in ulp of f32, that the GELU epilogue of :func:`gemm_kernel`
#: declares for its tanh (``tn.tanh(y, ulp=...)``, spec V-14), as fused GEMM
#: kernels written for speed do: a target may then compute it by a cheaper
#: realization within the bound (on cuda ``tn_tanh_approx``, 3 ulp: a polynomial
#: below 1, the special function unit above) instead of the faithful tanh, whose
#: double-float arithmetic took about 0.16 ms of the 0.37 ms of a 128 x 256-tile
#: fused GEMM on an H100. 3 ulp of a tanh is at most 3 * 2^-24 absolute, far
#: below the bf16 and f16 stores' rounding; the FP64 formula states the same
#: bound (``gelu_tanh_formula``), so validation judges what was declared.
GELU_TANH_ULP = 3.0


@functools.cache
def gemm_kernel(dt):  # type: ignore[no-untyped-def]
    """C = epilogue(A @ B); one program per (bm x bn) block; the K loop is a
    pipeline (fold over K blocks, ``loop="pipeline"``) or a reduce region with
    the ``add`` contract (``loop="reduce"``). ``tanh_ulp``: the bound the GELU
    epilogue declares for its tanh (:data:`GELU_TANH_ULP`; 1.0 is tanh's own)."""

    @tn.kernel
    def gemm(A: tn.Tensor[dt, "M K"], B: tn.Tensor[dt, "K N"], C: tn.Tensor[dt, "M N"], *,
             bm=32, bn=32, bk=16, loop="pipeline", epilogue="none", tanh_ulp=GELU_TANH_ULP):
        M, K = A.shape
        N = B.shape[1]
        m, k = A.dims()
        n = C.dim(1)
        B = B.with_dims(k, n)
        C = C.with_dims(m, n)
        for p in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn)), exec=tn.exec.block):
            i, j = p.index(0), p.index(1)
            acc = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
            if loop == "pipeline":
                for kk in p.pipeline(tn.shape(tn.cdiv(K, bk)), tn.pipeline_policy(window=2)):
                    kk.stage("load")
                    a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk)]
                    b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn)]
                    kk.stage("mma")
                    acc = tn.mma(a, b, acc)
            else:
                for kk in p.reduce(tn.shape(tn.cdiv(K, bk)), contract=tn.add):
                    a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk)]
                    b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn)]
                    acc = tn.mma(a, b, acc)
            if epilogue == "relu":
                acc = tn.maximum(acc * 0.125 + 0.25, 0.0)
            elif epilogue == "gelu":
                acc = gelu_tanh(acc * 0.125 + 0.25, ulp=tanh_ulp)
            C(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(tn.cast(acc, dt))

    return gemm


def _gemm_args(rng, s, dt):  # type: ignore[no-untyped-def]
    return {"A": normal(rng, (s["M"], s["K"]), dt), "B": normal(rng, (s["K"], s["N"]), dt),
            "C": sentinel((s["M"], s["N"]), dt)}


def _epilogue(acc: B.Approx, which: str) -> B.Approx:
    if which == "relu":
        return B.maximum(acc * 0.125 + 0.25, 0.0)
    if which == "gelu":
        return gelu_tanh_formula(acc * 0.125 + 0.25, GELU_TANH_ULP)
    return acc


def _gemm_formula(which: str):  # type: ignore[no-untyped-def]
    def formula(a, s, dt):  # type: ignore[no-untyped-def]
        zero = B.Approx.exact(np.zeros((s["M"], s["N"]), np.float32))
        acc = B.contract("mk,kn->mn", x64(a["A"]), x64(a["B"]), zero)
        return {"C": B.cast(_epilogue(acc, which), dt)}

    return formula


_GEMM_SIZES = {
    "small": {"M": 32, "N": 32, "K": 32},
    "tall": {"M": 70, "N": 12, "K": 33},
    "wide": {"M": 9, "N": 75, "K": 40},
    "ragged": {"M": 37, "N": 29, "K": 23},
    "medium": {"M": 96, "N": 80, "K": 72},
    "large": {"M": 256, "N": 192, "K": 320},
}
_GEMM_SCHEDULES = ({"bm": 32, "bn": 32, "bk": 16, "loop": "pipeline"},
                   {"bm": 16, "bn": 8, "bk": 8, "loop": "reduce"},
                   {"bm": 64, "bn": 16, "bk": 32, "loop": "pipeline"})


@functools.cache
def gemv_kernel(dt):  # type: ignore[no-untyped-def]
    """y = A @ x; one program per ``br`` rows; a reduce region over K blocks."""

    @tn.kernel
    def gemv(A: tn.Tensor[dt, "M K"], x: tn.Tensor[dt, "K"], y: tn.Tensor[dt, "M"], *,
             br=8, bk=32):
        M, K = A.shape
        m, k = A.dims()
        x = x.with_dims(k)
        y = y.with_dims(m)
        for p in tn.parallel(tn.shape(tn.cdiv(M, br))):
            acc = tn.zeros(f32, tn.shape(br), dims=(m,))
            for kk in p.reduce(tn.shape(tn.cdiv(K, bk))):
                a = tn.cast(A[tn.coord(p.index() * br, kk.index() * bk), tn.shape(br, bk)], f32)
                v = tn.cast(x[tn.coord(kk.index() * bk), tn.shape(bk)], f32)
                acc = acc + tn.reduce(a * v, k, tn.add)
            y(tn.coord(p.index() * br), tn.shape(br)).store(tn.cast(acc, dt))

    return gemv


def _gemv_args(rng, s, dt):  # type: ignore[no-untyped-def]
    return {"A": normal(rng, (s["M"], s["K"]), dt), "x": normal(rng, (s["K"],), dt),
            "y": sentinel((s["M"],), dt)}


def _gemv_formula(a, s, dt):  # type: ignore[no-untyped-def]
    # each product rounds once (a*v), then a sum of K terms in any order: the
    # contract rule covers both (gamma_{K+1} >= product rounding + gamma_{K-1}).
    zero = B.Approx.exact(np.zeros((s["M"],), np.float32))
    return {"y": B.cast(B.contract("mk,k->m", x64(a["A"]), x64(a["x"]), zero), dt)}


@functools.cache
def bmm_kernel(dt):  # type: ignore[no-untyped-def]
    """Batched GEMM ``[B,M,N,K]``: one program per (batch, bm x bn block)."""

    @tn.kernel
    def bmm(A: tn.Tensor[dt, "B M K"], Bm: tn.Tensor[dt, "B K N"], C: tn.Tensor[dt, "B M N"],
            *, bm=16, bn=16, bk=16):
        nb, M, K = A.shape
        N = Bm.shape[2]
        b, m, k = A.dims()
        n = C.dim(2)
        Bm = Bm.with_dims(b, k, n)
        C = C.with_dims(b, m, n)
        for p in tn.parallel(tn.shape(nb, tn.cdiv(M, bm), tn.cdiv(N, bn))):
            z, i, j = p.index(0), p.index(1), p.index(2)
            acc = tn.zeros(f32, tn.shape(1, bm, bn), dims=(b, m, n))
            for kk in p.serial(tn.shape(tn.cdiv(K, bk))):
                a = A[tn.coord(z, i * bm, kk.index() * bk), tn.shape(1, bm, bk)]
                w = Bm[tn.coord(z, kk.index() * bk, j * bn), tn.shape(1, bk, bn)]
                acc = tn.mma(a, w, acc)
            C(tn.coord(z, i * bm, j * bn), tn.shape(1, bm, bn)).store(tn.cast(acc, dt))

    return bmm


def _bmm_args(rng, s, dt):  # type: ignore[no-untyped-def]
    return {"A": normal(rng, (s["B"], s["M"], s["K"]), dt),
            "Bm": normal(rng, (s["B"], s["K"], s["N"]), dt),
            "C": sentinel((s["B"], s["M"], s["N"]), dt)}


def _bmm_formula(a, s, dt):  # type: ignore[no-untyped-def]
    zero = B.Approx.exact(np.zeros((s["B"], s["M"], s["N"]), np.float32))
    return {"C": B.cast(B.contract("zmk,zkn->zmn", x64(a["A"]), x64(a["Bm"]), zero), dt)}


WORKLOADS = [
    Workload("gemm", "gemm", "C = A @ B, pipelined or reduce K loop, ragged edges masked",
             gemm_kernel, _gemm_args, _gemm_formula("none"), _GEMM_SIZES, _GEMM_SCHEDULES),
    Workload("gemm_relu", "gemm", "C = max(0.125*(A@B) + 0.25, 0)", gemm_kernel, _gemm_args,
             _gemm_formula("relu"),
             {k: _GEMM_SIZES[k] for k in ("small", "ragged", "medium", "large")},
             _GEMM_SCHEDULES[:2], fixed={"epilogue": "relu"}),
    Workload("gemm_gelu", "gemm", "C = gelu_tanh(0.125*(A@B) + 0.25)", gemm_kernel, _gemm_args,
             _gemm_formula("gelu"),
             {k: _GEMM_SIZES[k] for k in ("small", "ragged", "medium", "large")},
             _GEMM_SCHEDULES[:2], fixed={"epilogue": "gelu"}),
    Workload("gemv", "gemm", "y = A @ x, row blocks, tree reduce over K blocks", gemv_kernel,
             _gemv_args, _gemv_formula,
             {"small": {"M": 16, "K": 40}, "ragged": {"M": 13, "K": 77},
              "medium": {"M": 96, "K": 300}, "large": {"M": 512, "K": 2048}},
             ({"br": 8, "bk": 32}, {"br": 3, "bk": 16})),
    Workload("bmm", "gemm", "batched GEMM [B,M,N,K], serial K loop", bmm_kernel, _bmm_args,
             _bmm_formula,
             {"small": {"B": 2, "M": 16, "N": 16, "K": 16},
              "ragged": {"B": 3, "M": 13, "N": 9, "K": 21},
              "medium": {"B": 4, "M": 48, "N": 40, "K": 56},
              "large": {"B": 8, "M": 128, "N": 128, "K": 128}},
             ({"bm": 16, "bn": 16, "bk": 16}, {"bm": 8, "bn": 4, "bk": 8})),
]
