"""Pointwise workloads: add, tanh GELU, residual GELU, SwiGLU and split-half RoPE.

All read ``[rows, cols]`` (RoPE: ``[rows, 2, half]``) in blocks of
``br x bc`` (ragged edges masked by ``bounds.zero``), compute in f32 and store
in the storage dtype.

Error bounds follow the operation sequence of the kernel exactly: the DSL
helper (``gelu_tanh``) and the FP64 formula are the same Python expression,
evaluated once on Tiles (capture) and once on :class:`~.bounds.Approx` values,
so every rounding of the kernel is accounted for by the ``Approx`` rule of its
op (``u`` per arithmetic op, 1 ulp per transcendental, spec V-14). The FP64
value of each formula is the textbook expression with the same f32-rounded
coefficients the kernel uses.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

import tilenest as tn
from tilenest import f32

from . import bounds as B
from .base import Workload, normal, sentinel, x64

#: sqrt(2/pi) and the cubic coefficient of the tanh GELU approximation
GELU_C = 0.7978845608028654
GELU_A = 0.044715


def gelu_tanh(x: Any, tanh: Callable[..., Any] = tn.tanh, ulp: float | None = None) -> Any:
    """``0.5*x*(1 + tanh(c*(x + a*x^3)))`` in a fixed operation order; ``ulp``
    the accuracy bound declared for the tanh (spec V-14), None for its own."""
    inner = x + GELU_A * (x * x * x)
    return 0.5 * x * (1.0 + tanh(GELU_C * inner, ulp=ulp))


def gelu_tanh_formula(x: B.Approx, ulp: float | None = None) -> B.Approx:
    """:func:`gelu_tanh` on FP64 values with their error bounds; ``ulp`` as
    the kernel declared it."""
    return gelu_tanh(x, B.tanh, ulp)


def silu_mul(g: Any, u: Any, sigmoid: Callable[[Any], Any] = tn.sigmoid) -> Any:
    """SwiGLU's ``silu(g) * u = g * sigmoid(g) * u``."""
    return g * sigmoid(g) * u


@functools.cache
def pointwise_kernel(dt, op):  # type: ignore[no-untyped-def]
    """``out = f(x, y)`` over ``[rows, cols]`` in ``br x bc`` blocks."""

    @tn.kernel
    def pointwise(x: tn.Tensor[dt, "R C"], y: tn.Tensor[dt, "R C"], out: tn.Tensor[dt, "R C"],
                  *, br=4, bc=32):
        rows, cols = x.shape
        y = y.with_dims(*x.dims())
        out = out.with_dims(*x.dims())
        for p in tn.parallel(tn.shape(tn.cdiv(rows, br), tn.cdiv(cols, bc))):
            o = tn.coord(p.index(0) * br, p.index(1) * bc)
            a = tn.cast(x[o, tn.shape(br, bc)], f32)
            b = tn.cast(y[o, tn.shape(br, bc)], f32)
            if op == "add":
                r = a + b
            elif op == "gelu":
                r = gelu_tanh(a)
            elif op == "residual_gelu":
                r = b + gelu_tanh(a)
            else:
                r = silu_mul(a, b)
            out(o, tn.shape(br, bc)).store(tn.cast(r, dt))

    return pointwise


def _pointwise_formula(op: str):  # type: ignore[no-untyped-def]
    def formula(a, s, dt):  # type: ignore[no-untyped-def]
        x, y = x64(a["x"]), x64(a["y"])
        if op == "add":
            r = x + y
        elif op == "gelu":
            r = gelu_tanh_formula(x)
        elif op == "residual_gelu":
            r = y + gelu_tanh_formula(x)
        else:
            r = silu_mul(x, y, B.sigmoid)
        return {"out": B.cast(r, dt)}

    return formula


def _pointwise_args(rng, s, dt):  # type: ignore[no-untyped-def]
    shape = (s["R"], s["C"])
    return {"x": normal(rng, shape, dt, 2.0), "y": normal(rng, shape, dt),
            "out": sentinel(shape, dt)}


@functools.cache
def rope_kernel(dt):  # type: ignore[no-untyped-def]
    """Split-half rotary embedding. ``x`` is ``[rows, 2, half]``: the pair axis is
    kept separate, so a ragged feature block is masked within each half and a
    tail store never touches the other half. ``cos``/``sin`` are ``[rows, half]``.
    ``y0 = x0*cos - x1*sin``, ``y1 = x1*cos + x0*sin``."""

    @tn.kernel
    def rope(x: tn.Tensor[dt, "R 2 H"], cos: tn.Tensor[dt, "R H"], sin: tn.Tensor[dt, "R H"],
             y: tn.Tensor[dt, "R 2 H"], *, br=2, bf=16):
        rows, two, half = x.shape
        r, pr, f = x.dims()
        cos = cos.with_dims(r, f)
        sin = sin.with_dims(r, f)
        y = y.with_dims(r, pr, f)
        for p in tn.parallel(tn.shape(tn.cdiv(rows, br), tn.cdiv(half, bf))):
            r0, f0 = p.index(0) * br, p.index(1) * bf
            x0 = tn.cast(x[tn.coord(r0, 0, f0), tn.shape(br, 1, bf)], f32)
            x1 = tn.cast(x[tn.coord(r0, 1, f0), tn.shape(br, 1, bf)], f32)
            c = tn.cast(cos[tn.coord(r0, f0), tn.shape(br, bf)], f32)
            s = tn.cast(sin[tn.coord(r0, f0), tn.shape(br, bf)], f32)
            y(tn.coord(r0, 0, f0), tn.shape(br, 1, bf)).store(tn.cast(x0 * c - x1 * s, dt))
            y(tn.coord(r0, 1, f0), tn.shape(br, 1, bf)).store(tn.cast(x1 * c + x0 * s, dt))

    return rope


def _rope_args(rng, s, dt):  # type: ignore[no-untyped-def]
    rows, half = s["R"], s["H"]
    pos = np.arange(rows, dtype=np.float64)[:, None]
    freq = 10000.0 ** (-np.arange(half, dtype=np.float64) / half)
    ang = pos * freq[None, :]
    return {"x": normal(rng, (rows, 2, half), dt), "cos": np.cos(ang).astype(dt.np),
            "sin": np.sin(ang).astype(dt.np), "y": sentinel((rows, 2, half), dt)}


def _rope_formula(a, s, dt):  # type: ignore[no-untyped-def]
    x = x64(a["x"])
    x0, x1 = x[:, 0:1, :], x[:, 1:2, :]
    c = x64(a["cos"]).reshape(s["R"], 1, s["H"])
    sn = x64(a["sin"]).reshape(s["R"], 1, s["H"])
    y0, y1 = x0 * c - x1 * sn, x1 * c + x0 * sn
    v = np.concatenate([y0.v, y1.v], axis=1)
    e = np.concatenate([np.broadcast_to(y0.e, y0.v.shape), np.broadcast_to(y1.e, y1.v.shape)], 1)
    return {"y": B.cast(B.Approx(v, e, y0.dt), dt)}


_PW_SIZES = {"small": {"R": 5, "C": 37}, "medium": {"R": 33, "C": 300},
             "large": {"R": 256, "C": 2048}}
_PW_SCHEDULES = ({"br": 4, "bc": 32}, {"br": 1, "bc": 128}, {"br": 8, "bc": 8})

WORKLOADS = [
    Workload("add", "elementwise", "out = x + y", functools.partial(pointwise_kernel, op="add"),
             _pointwise_args, _pointwise_formula("add"), _PW_SIZES, _PW_SCHEDULES),
    Workload("gelu", "elementwise", "out = tanh-GELU(x)",
             functools.partial(pointwise_kernel, op="gelu"), _pointwise_args,
             _pointwise_formula("gelu"), _PW_SIZES, _PW_SCHEDULES),
    Workload("residual_gelu", "elementwise", "out = y + tanh-GELU(x)",
             functools.partial(pointwise_kernel, op="residual_gelu"), _pointwise_args,
             _pointwise_formula("residual_gelu"), _PW_SIZES, _PW_SCHEDULES),
    Workload("swiglu", "elementwise", "out = x * sigmoid(x) * y (gate x, up y)",
             functools.partial(pointwise_kernel, op="swiglu"), _pointwise_args,
             _pointwise_formula("swiglu"), _PW_SIZES, _PW_SCHEDULES),
    Workload("rope", "elementwise", "split-half RoPE with a separate pair axis", rope_kernel,
             _rope_args, _rope_formula,
             {"small": {"R": 5, "H": 3}, "ragged": {"R": 7, "H": 33},
              "medium": {"R": 33, "H": 64}, "large": {"R": 512, "H": 256}},
             ({"br": 2, "bf": 16}, {"br": 1, "bf": 5}, {"br": 8, "bf": 64})),
]
