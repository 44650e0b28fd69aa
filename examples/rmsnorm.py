"""RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, rows_per_program rows per program."""

import tilenest as tn
from tilenest import f32


@tn.kernel
def rmsnorm(x: tn.Tensor[f32, "R C"], w: tn.Tensor[f32, "C"], y: tn.Tensor[f32, "R C"],
            eps: tn.Scalar[f32], *, rows_per_program=4):
    rows, cols = x.shape
    c = x.dim(1)
    w = w.with_dims(c)
    for p in tn.parallel(tn.shape(tn.cdiv(rows, rows_per_program))):
        r0 = p.index() * rows_per_program
        xs = x[tn.coord(r0, 0), tn.shape(rows_per_program, cols)]
        ms = tn.reduce(xs * xs, c, tn.add) / tn.cast(cols, f32)
        scale = tn.rsqrt(ms + eps)
        y(tn.coord(r0, 0), tn.shape(rows_per_program, cols)).store(
            xs * scale * w[tn.coord(0), tn.shape(cols)])


def example_inputs(rng):
    import numpy as np

    x = rng.standard_normal((30, 65)).astype(np.float32)
    w = rng.standard_normal(65).astype(np.float32)
    return x, w, x * 0, np.float32(1e-5)


def numpy_reference(x, w, y, eps):
    import numpy as np

    x64 = x.astype(np.float64)
    r = x64 / np.sqrt((x64 * x64).mean(axis=1, keepdims=True) + float(eps)) * w
    return r.astype(np.float32)
