"""Embedding lookup: ``out[t, :] = table[ids[t], :]`` with ``i64`` token ids.

Invalid ids are rejected **before any store**: the kernel's first region is a
validation pass that, for every token, loads ``table[id, 0]`` under
``bounds.checked``. An id outside ``[0, V)`` makes that load a ``BoundsError``
naming the load and the offending coordinate; because sibling regions compose
sequentially (spec E-12), the gather region -- the only one that stores -- has
not started, so the output is untouched.

Schedules choose ``tpp`` tokens per program (a ``serial`` region over them,
one uniform id load per iteration) and a feature block ``bw`` (ragged feature
tails masked by ``bounds.zero``). The oracle is exact: a copy, bit for bit.
"""

from __future__ import annotations

import functools

import numpy as np

import tilenest as tn
from tilenest import i64

from .base import Workload, normal, sentinel


@functools.cache
def embedding_kernel(dt):  # type: ignore[no-untyped-def]
    @tn.kernel
    def embedding(table: tn.Tensor[dt, "V W"], ids: tn.Tensor[i64, "T"],
                  out: tn.Tensor[dt, "T W"], *, tpp=1, bw=32):
        vocab, width = table.shape
        (ntok,) = ids.shape
        for p in tn.parallel(tn.shape(ntok)):                      # validation pass
            one = ids[tn.coord(p.index()), tn.shape(1)]
            row = tn.reduce(one, one.dim(0), tn.add)
            table[tn.coord(row, 0), tn.shape(1, 1), tn.bounds.checked]
        for p in tn.parallel(tn.shape(tn.cdiv(ntok, tpp), tn.cdiv(width, bw))):
            for t in p.serial(tn.shape(tpp)):
                tok = p.index(0) * tpp + t.index()
                one = ids[tn.coord(tok), tn.shape(1)]
                row = tn.reduce(one, one.dim(0), tn.add)
                vals = table[tn.coord(row, p.index(1) * bw), tn.shape(1, bw)]
                if tn.if_(tok < ntok):
                    out(tn.coord(tok, p.index(1) * bw), tn.shape(1, bw)).store(vals)

    return embedding


def _args(rng, s, dt):  # type: ignore[no-untyped-def]
    ids = rng.integers(0, s["V"], s["T"]).astype(np.int64)
    ids[: min(2, s["T"])] = [0, s["V"] - 1][: min(2, s["T"])]     # both ends of the vocabulary
    table = normal(rng, (s["V"], s["W"]), dt)
    table[0, 0] = np.asarray(-0.0, dt.np)                        # a signed zero travels as is
    return {"table": table, "ids": ids, "out": sentinel((s["T"], s["W"]), dt)}


def _formula(a, s, dt):  # type: ignore[no-untyped-def]
    return {"out": a["table"][a["ids"]]}


WORKLOADS = [
    Workload("embedding", "embedding", "row gather with i64 ids; invalid ids rejected first",
             embedding_kernel, _args, _formula,
             {"small": {"V": 11, "W": 6, "T": 5}, "ragged": {"V": 50, "W": 70, "T": 9},
              "medium": {"V": 1000, "W": 256, "T": 64}, "large": {"V": 32000, "W": 1024, "T": 512}},
             ({"tpp": 1, "bw": 32}, {"tpp": 4, "bw": 16}, {"tpp": 8, "bw": 64})),
]
