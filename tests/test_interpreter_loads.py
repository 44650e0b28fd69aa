"""Loads from tensors the program never writes keep read-only views of the
caller's array (no copy); a tensor the program stores to is still loaded as a
snapshot that later stores do not change."""

from __future__ import annotations

import numpy as np

import tilenest as tn
from tilenest import f32
from tilenest.interpreter.core import Interpreter, Options


@tn.kernel
def _scaled(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        t = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(t + t)


@tn.kernel
def _snapshot(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    y = y.with_dims(*x.dims())
    t = x[tn.coord(0), tn.shape(n)]
    x(tn.coord(0), tn.shape(n)).store(t + t)  # overwrite after the load ...
    y(tn.coord(0), tn.shape(n)).store(t)  # ... the loaded value is the old one


class _Recording(Interpreter):
    """Keeps every value set (the environment drops values after their last use)."""

    def set(self, v, rv):
        super().set(v, rv)
        self.seen[v.name] = rv


def _loaded(kernel, *arrays):
    prog = kernel.program
    it = _Recording(prog, arrays, {}, Options(check_races=True))
    it.seen = {}
    it.run()
    (op,) = [o for o in prog.walk() if o.name == "tensor.load"]
    return it.seen[op.result.name].a, it


def test_a_tensor_nothing_writes_is_loaded_as_a_read_only_view():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.zeros_like(x)
    a, it = _loaded(_scaled, x, y)
    assert it.tensors["x"].constant and not it.tensors["y"].constant
    assert np.shares_memory(a, x) and not a.flags.writeable
    assert y.tolist() == (2 * x).tolist()


def test_a_stored_tensor_is_loaded_as_a_snapshot():
    x = np.arange(5, dtype=np.float32)
    y = np.zeros_like(x)
    a, it = _loaded(_snapshot, x, y)
    assert not it.tensors["x"].constant and not np.shares_memory(a, x)
    assert y.tolist() == [0, 1, 2, 3, 4] and x.tolist() == [0, 2, 4, 6, 8]


def test_an_aliased_argument_is_not_constant():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    _, it = _loaded(_scaled, base, base)  # y is x: the loads must be snapshots
    assert not it.tensors["x"].constant
