"""fold_left and fold_right keep their written orientation:
for x = [1, 2, 3], left = left - x gives -6 and right = x - right gives 2."""

import tilenest as tn
from tilenest import f32


@tn.kernel
def folds(x: tn.Tensor[f32, "N"], out: tn.Tensor[f32, "2"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(1)):
        v = x[tn.coord(0), tn.shape(n)]
        left = tn.scalar(0.0, f32)
        for r in p.reduce(v.domain(v.dim(0)), policy=tn.fold_left):
            left = left - v.at(r)
        right = tn.scalar(0.0, f32)
        for r in p.reduce(v.domain(v.dim(0)), policy=tn.fold_right):
            right = v.at(r) - right
        out(tn.coord(0), tn.shape(1)).store(tn.broadcast(left, tn.shape(tn.axis(out.dim(0), 1))))
        out(tn.coord(1), tn.shape(1)).store(tn.broadcast(right, tn.shape(tn.axis(out.dim(0), 1))))


def example_inputs(rng):
    import numpy as np

    return np.array([1, 2, 3], np.float32), np.zeros(2, np.float32)


def numpy_reference(x, out):
    import numpy as np

    left, right = np.float32(0), np.float32(0)
    for v in x:
        left = np.float32(left - v)
    for v in x[::-1]:
        right = np.float32(v - right)
    return np.array([left, right], np.float32)
