"""An explicit two-level parallel: programs of 4 warps, each warp owning one row
of a 4-row block. The inner level is constrained to the warp scope."""

import tilenest as tn
from tilenest import f32


@tn.kernel
def scale_rows(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"], *, warps=4):
    rows, cols = x.shape
    for blk in tn.parallel(tn.shape(tn.cdiv(rows, warps)), exec=tn.exec.block):
        for w in blk.parallel(tn.shape(warps), exec=tn.exec.warp):
            r = blk.index() * warps + w.index()
            row = x[tn.coord(r, 0), tn.shape(1, cols)]
            y(tn.coord(r, 0), tn.shape(1, cols)).store(row * 2.0 + 1.0)


def example_inputs(rng):
    x = rng.standard_normal((10, 7)).astype("float32")
    return x, x * 0


def numpy_reference(x, y):
    import numpy as np

    return x * np.float32(2) + np.float32(1)
