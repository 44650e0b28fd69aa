"""Row softmax and masked row softmax, ``rp`` rows per program, whole-row tiles.

``y = exp(x - max(x)) / sum(exp(x - max(x)))``; the masked variant replaces
masked-out entries by ``-inf`` first (every row keeps at least one entry), so
their outputs are exactly ``+0.0``.

Error bound, by the ``Approx`` rules in the kernel's operation order: the max
is exact; ``d = x - m`` rounds once (``u*|d|``), which ``exp`` turns into a
relative error ``exp(u*|d|) - 1`` plus its own 1 ulp; the sum adds
``gamma_{C-1}`` relative (all terms are positive); the division adds ``u`` and
the relative errors of numerator and denominator (``bounds._div``).
"""

from __future__ import annotations

import functools

import numpy as np

import tilenest as tn
from tilenest import f32

from . import bounds as B
from .base import Workload, normal, sentinel, x64


@functools.cache
def softmax_kernel(dt, masked):  # type: ignore[no-untyped-def]
    @tn.kernel
    def softmax(x: tn.Tensor[dt, "R C"], mask: tn.Tensor[tn.bool_, "R C"],
                y: tn.Tensor[dt, "R C"], *, rp=1):
        rows, cols = x.shape
        r, c = x.dims()
        mask = mask.with_dims(r, c)
        y = y.with_dims(r, c)
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rp))):
            o = tn.coord(p.index() * rp, 0)
            t = tn.cast(x[o, tn.shape(rp, cols)], f32)
            if masked:
                t = tn.ite(mask[o, tn.shape(rp, cols)], t, -np.inf)
            m = tn.reduce(t, c, tn.maximum)
            e = tn.exp(t - m)
            s = tn.reduce(e, c, tn.add)
            y(o, tn.shape(rp, cols)).store(tn.cast(e / s, dt))

    return softmax


def _args(rng, s, dt):  # type: ignore[no-untyped-def]
    shape = (s["R"], s["C"])
    x = normal(rng, shape, dt, 3.0)
    # a row-dependent, never empty mask: row r keeps columns c with (c + r) % 3 != 0
    # or c == r % C
    cc, rr = np.meshgrid(np.arange(s["C"]), np.arange(s["R"]))
    mask = ((cc + rr) % 3 != 0) | (cc == rr % s["C"])
    return {"x": x, "mask": mask, "y": sentinel(shape, dt)}


def _formula(masked: bool):  # type: ignore[no-untyped-def]
    def formula(a, s, dt):  # type: ignore[no-untyped-def]
        t = x64(a["x"])
        if masked:
            t = B.where(a["mask"], t, -np.inf)
        m = B.amax(t, 1)
        e = B.exp(t - m)
        return {"y": B.cast(e / B.total(e, 1), dt)}

    return formula


_SIZES = {"small": {"R": 5, "C": 13}, "medium": {"R": 33, "C": 500},
          "large": {"R": 128, "C": 4096}}
_SCHEDULES = ({"rp": 1}, {"rp": 4}, {"rp": 3})

WORKLOADS = [
    Workload("softmax", "softmax", "row softmax", functools.partial(softmax_kernel, masked=False),
             _args, _formula(False), _SIZES, _SCHEDULES),
    Workload("masked_softmax", "softmax", "row softmax with a row-dependent mask (-inf)",
             functools.partial(softmax_kernel, masked=True), _args, _formula(True), _SIZES,
             _SCHEDULES),
]
