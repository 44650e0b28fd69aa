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
