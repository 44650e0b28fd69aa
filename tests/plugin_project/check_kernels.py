"""An implementer's own tests: outputs of "their" implementation (numpy here)
judged by the tilenest oracle through the `admitted` and `tilenest_oracle`
fixtures. One test fails on purpose; tilenest's plugin test expects it to."""

import numpy as np

import tilenest as tn
from tilenest import f32


@tn.kernel
def add_one(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
        o = tn.coord(p.index() * 4)
        y(o, tn.shape(4)).store(x[o, tn.shape(4)] + 1.0)


@tn.kernel
def row_sum(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 1]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        y(tn.coord(p.index()), tn.shape(1)).store(tn.reduce(row, row.dim(1), tn.add))


def my_add_one(x):
    return x + np.float32(1)


def test_bitwise_output_is_admitted(admitted):
    x = np.arange(16, dtype=np.float32)
    assert admitted(add_one, (x, np.zeros_like(x))).admits(my_add_one(x))


def test_reassociated_sum_is_admitted(tilenest_oracle):
    x = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    adm = tilenest_oracle.admitted(row_sum, {"x": x, "y": np.zeros(3, np.float32)})
    assert adm.names == ("y",)
    assert adm.admits({"y": x[:, ::-1].sum(axis=1)})     # another order
    assert not adm.admits(x.sum(axis=1) + np.float32(1))


def test_deliberately_wrong_output(admitted):
    x = np.arange(16, dtype=np.float32)
    out = my_add_one(x)
    out[13] = 0.0
    assert admitted(add_one, (x, np.zeros_like(x))).admits(out)
