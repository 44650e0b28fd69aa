"""Row softmax: one logical program per row; the max and sum are reductions."""

import tilenest as tn
from tilenest import f32


@tn.kernel
def row_softmax(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        m = tn.reduce(row, row.dim(1), tn.maximum)
        e = tn.exp(row - m)
        s = tn.reduce(e, e.dim(1), tn.add)
        y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(e / s)


def example_inputs(rng):
    x = rng.standard_normal((37, 129)).astype("float32")
    return x, x * 0


def numpy_reference(x, y):
    import numpy as np

    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
