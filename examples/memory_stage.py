"""Explicit Memory: a per-program staging buffer with a padded layout.

The memory is owned by the enclosing parallel instance; store() is its only
mutation and load() returns a snapshot that later stores do not change."""

import tilenest as tn
from tilenest import f32


@tn.kernel
def transpose_blocks(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "C R"], *, b=8):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(rows, b), tn.cdiv(cols, b))):
        i, j = p.index(0), p.index(1)
        blk = x[tn.coord(i * b, j * b), tn.shape(b, b)]
        buf = tn.memory(f32, tn.layout(tn.shape(b, b), strides=(b + 1, 1)), tn.mem.shared)
        buf.store(blk)
        t = tn.permute(buf.load(), (1, 0))
        y(tn.coord(j * b, i * b), tn.shape(b, b)).store(
            tn.reindex(t, tn.shape(b, b), lambda u, v: (u, v)))


def example_inputs(rng):
    import numpy as np

    x = rng.standard_normal((13, 21)).astype(np.float32)
    return x, np.zeros((21, 13), np.float32)


def numpy_reference(x, y):
    return x.T.copy()
