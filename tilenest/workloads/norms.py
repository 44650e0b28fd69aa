"""Normalizations over the last axis, ``rp`` rows per program, whole-row tiles:

* RMSNorm: ``y = x * rsqrt(mean(x^2) + eps) * w``;
* LayerNorm: ``mu = mean(x)``, ``var = mean((x - mu)^2)``,
  ``y = (x - mu) * rsqrt(var + eps) * g + b``;
* fused residual LayerNorm: ``h = x + r`` (stored) and ``y = LayerNorm(h)``.

``eps`` is a runtime f32 scalar. Error bounds come from the ``Approx`` rules in
the kernel's operation order: sums (``gamma_{C-1}``), the division by the exact
count ``C``, ``rsqrt`` (monotone propagation plus 1 ulp), products and
additions (``u`` each). The centred variance keeps the bound small: the error
of ``mu`` enters ``x - mu`` absolutely and the square relatively.
"""

from __future__ import annotations

import functools

import numpy as np

import tilenest as tn
from tilenest import f32

from . import bounds as B
from .base import Workload, normal, sentinel, x64


@functools.cache
def rmsnorm_kernel(dt):  # type: ignore[no-untyped-def]
    @tn.kernel
    def rmsnorm(x: tn.Tensor[dt, "R C"], w: tn.Tensor[dt, "C"], y: tn.Tensor[dt, "R C"],
                eps: tn.Scalar[f32], *, rp=2):
        rows, cols = x.shape
        r, c = x.dims()
        w = w.with_dims(c)
        y = y.with_dims(r, c)
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rp))):
            o = tn.coord(p.index() * rp, 0)
            t = tn.cast(x[o, tn.shape(rp, cols)], f32)
            ms = tn.reduce(t * t, c, tn.add) / tn.cast(cols, f32)
            scale = tn.rsqrt(ms + eps)
            g = tn.cast(w[tn.coord(0), tn.shape(cols)], f32)
            y(o, tn.shape(rp, cols)).store(tn.cast(t * scale * g, dt))

    return rmsnorm


def _rms_args(rng, s, dt):  # type: ignore[no-untyped-def]
    shape = (s["R"], s["C"])
    return {"x": normal(rng, shape, dt, 2.0), "w": normal(rng, (s["C"],), dt),
            "y": sentinel(shape, dt), "eps": np.float32(1e-5)}


def _rms_formula(a, s, dt):  # type: ignore[no-untyped-def]
    t = x64(a["x"])
    n = B.Approx.const(s["C"], B.D.f32)
    ms = B.total(t * t, 1) / n
    scale = B.rsqrt(ms + B.Approx.const(float(a["eps"]), B.D.f32))
    return {"y": B.cast(t * scale * x64(a["w"]), dt)}


@functools.cache
def layernorm_kernel(dt, residual):  # type: ignore[no-untyped-def]
    @tn.kernel
    def layernorm(x: tn.Tensor[dt, "R C"], res: tn.Tensor[dt, "R C"], g: tn.Tensor[dt, "C"],
                  b: tn.Tensor[dt, "C"], h: tn.Tensor[dt, "R C"], y: tn.Tensor[dt, "R C"],
                  eps: tn.Scalar[f32], *, rp=2):
        rows, cols = x.shape
        r, c = x.dims()
        res = res.with_dims(r, c)
        g = g.with_dims(c)
        b = b.with_dims(c)
        h = h.with_dims(r, c)
        y = y.with_dims(r, c)
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rp))):
            o = tn.coord(p.index() * rp, 0)
            t = tn.cast(x[o, tn.shape(rp, cols)], f32)
            if residual:
                hs = tn.cast(t + tn.cast(res[o, tn.shape(rp, cols)], f32), dt)
                h(o, tn.shape(rp, cols)).store(hs)
                t = tn.cast(hs, f32)
            n = tn.cast(cols, f32)
            mu = tn.reduce(t, c, tn.add) / n
            d = t - mu
            var = tn.reduce(d * d, c, tn.add) / n
            scale = tn.rsqrt(var + eps)
            gg = tn.cast(g[tn.coord(0), tn.shape(cols)], f32)
            bb = tn.cast(b[tn.coord(0), tn.shape(cols)], f32)
            y(o, tn.shape(rp, cols)).store(tn.cast(d * scale * gg + bb, dt))

    return layernorm


def _ln_args(rng, s, dt):  # type: ignore[no-untyped-def]
    shape = (s["R"], s["C"])
    return {"x": normal(rng, shape, dt, 2.0) + np.asarray(3.0, dt.np),
            "res": normal(rng, shape, dt), "g": normal(rng, (s["C"],), dt),
            "b": normal(rng, (s["C"],), dt), "h": sentinel(shape, dt), "y": sentinel(shape, dt),
            "eps": np.float32(1e-5)}


def _ln_formula(residual: bool):  # type: ignore[no-untyped-def]
    def formula(a, s, dt):  # type: ignore[no-untyped-def]
        t = x64(a["x"])
        out = {}
        if residual:
            hs = B.cast(t + x64(a["res"]), dt)
            out["h"] = hs
            t = B.cast(hs, B.D.f32)
        n = B.Approx.const(s["C"], B.D.f32)
        mu = B.total(t, 1) / n
        d = t - mu
        var = B.total(d * d, 1) / n
        scale = B.rsqrt(var + B.Approx.const(float(a["eps"]), B.D.f32))
        out["y"] = B.cast(d * scale * x64(a["g"]) + x64(a["b"]), dt)
        return out

    return formula


_SIZES = {"small": {"R": 5, "C": 7}, "wide": {"R": 3, "C": 65},
          "medium": {"R": 17, "C": 512}, "large": {"R": 256, "C": 4096}}
_SCHEDULES = ({"rp": 2}, {"rp": 1}, {"rp": 4})

WORKLOADS = [
    Workload("rmsnorm", "norms", "RMSNorm with a weight vector", rmsnorm_kernel, _rms_args,
             _rms_formula, _SIZES, _SCHEDULES),
    Workload("layernorm", "norms", "LayerNorm with gamma/beta",
             functools.partial(layernorm_kernel, residual=False), _ln_args, _ln_formula(False),
             _SIZES, _SCHEDULES),
    Workload("residual_layernorm", "norms", "h = x + r; y = LayerNorm(h)",
             functools.partial(layernorm_kernel, residual=True), _ln_args, _ln_formula(True),
             _SIZES, _SCHEDULES),
]
