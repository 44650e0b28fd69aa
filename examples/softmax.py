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
