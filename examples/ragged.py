"""A ragged tail: blocks of 128 over a length-N vector. The last block is
partial: its loads read zeros past N and its stores are masked (bounds.zero).
The same kernel with bounds.checked would report the out-of-range access."""

import tilenest as tn
from tilenest import f32


@tn.kernel
def axpy(a: tn.Scalar[f32], x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"],
         out: tn.Tensor[f32, "N"], *, block=128):
    (n,) = x.shape
    y = y.with_dims(x.dim(0))  # share the element dim so x and y combine
    for p in tn.parallel(tn.shape(tn.cdiv(n, block))):
        o = tn.coord(p.index() * block)
        out(o, tn.shape(block)).store(a * x[o, tn.shape(block)] + y[o, tn.shape(block)])


def example_inputs(rng):
    import numpy as np

    x = rng.standard_normal(300).astype(np.float32)
    y = rng.standard_normal(300).astype(np.float32)
    return np.float32(2.5), x, y, x * 0


def numpy_reference(a, x, y, out):
    return a * x + y
