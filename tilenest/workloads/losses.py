"""Per-row cross-entropy: ``loss[r] = logsumexp(x[r]) - x[r, label[r]]``, computed
as ``m + log(sum exp(x - m)) - x[label]`` with ``m = max(x)``; labels are
``i64``, the target logit is picked with ``gather``.

Error bound by the ``Approx`` rules in this operation order: ``m`` and the
gathered logit are exact; ``exp(x - m)`` as in softmax; the sum (positive
terms, ``gamma_{C-1}`` relative, ``s >= 1``); ``log`` by monotone propagation
plus 1 ulp; two additions.
"""

from __future__ import annotations

import functools

import numpy as np

import tilenest as tn
from tilenest import f32, i64

from . import bounds as B
from .base import Workload, normal, sentinel, x64


@functools.cache
def xent_kernel(dt):  # type: ignore[no-untyped-def]
    @tn.kernel
    def cross_entropy(x: tn.Tensor[dt, "R C"], label: tn.Tensor[i64, "R"],
                      loss: tn.Tensor[dt, "R"], *, rp=2):
        rows, cols = x.shape
        r, c = x.dims()
        label = label.with_dims(r)
        loss = loss.with_dims(r)
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rp))):
            r0 = p.index() * rp
            t = tn.cast(x[tn.coord(r0, 0), tn.shape(rp, cols)], f32)
            lab = label[tn.coord(r0), tn.shape(rp)]
            m = tn.reduce(t, c, tn.maximum)
            s = tn.reduce(tn.exp(t - m), c, tn.add)
            target = tn.gather(t, lab, c, 0.0)
            loss(tn.coord(r0), tn.shape(rp)).store(tn.cast(m + tn.log(s) - target, dt))

    return cross_entropy


def _args(rng, s, dt):  # type: ignore[no-untyped-def]
    return {"x": normal(rng, (s["R"], s["C"]), dt, 3.0),
            "label": rng.integers(0, s["C"], s["R"]).astype(np.int64),
            "loss": sentinel((s["R"],), dt)}


def _formula(a, s, dt):  # type: ignore[no-untyped-def]
    t = x64(a["x"])
    m = B.amax(t, 1, keepdims=False)
    e = B.exp(t - B.amax(t, 1))
    sm = B.total(e, 1, keepdims=False)
    target = t[np.arange(s["R"]), a["label"]]
    return {"loss": B.cast(m + B.log(sm) - target, dt)}


WORKLOADS = [
    Workload("cross_entropy", "losses", "per-row cross-entropy with i64 labels", xent_kernel,
             _args, _formula,
             {"small": {"R": 6, "C": 11}, "medium": {"R": 40, "C": 1000},
              "large": {"R": 512, "C": 8192}},
             ({"rp": 2}, {"rp": 1}, {"rp": 5})),
]
