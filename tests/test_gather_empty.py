"""``tn.gather`` over an axis of extent 0 (spec V-19): no index is valid, so
every element is the fallback -- in the interpreter, the reference, the LLVM backend and the CUDA source on the emulator; and
``validate`` compares such cases instead of failing inside."""

from __future__ import annotations

import numpy as np

import tilenest as tn
from tilenest import f32, i32


@tn.kernel
def pick(x: tn.Tensor[f32, "N"], idx: tn.Tensor[i32, "M"], y: tn.Tensor[f32, "M"]):  # noqa: F821
    """``y[j] = x[idx[j]]``, -1 where ``idx[j]`` is outside ``x``."""
    (n,) = x.shape
    (m,) = idx.shape
    y = y.with_dims(idx.dim(0))
    t = x[tn.coord(0), tn.shape(n)]
    i = idx[tn.coord(0), tn.shape(m)]
    y(tn.coord(0), tn.shape(m)).store(tn.gather(t, i, 0, -1.0))


@tn.kernel
def pick_sums(x: tn.Tensor[f32, "N C"], idx: tn.Tensor[i32, "M"],  # noqa: F821
              y: tn.Tensor[f32, "M"]):  # noqa: F821
    """Gathers from row sums (a tile under the envelope contract when it
    holds elements)."""
    n, c = x.shape
    (m,) = idx.shape
    y = y.with_dims(idx.dim(0))
    t = x[tn.coord(0, 0), tn.shape(n, c)]
    s = tn.reduce(t, t.dim(1), tn.add)
    i = idx[tn.coord(0), tn.shape(m)]
    y(tn.coord(0), tn.shape(m)).store(tn.gather(s, i, 0, -1.0))


IDX = np.array([0, 1, -1, 5], np.int32)


def test_the_interpreter_gives_the_fallback_for_every_index_of_an_empty_axis():
    y = np.zeros(4, np.float32)
    tn.interpret(pick, np.zeros(0, np.float32), IDX, y)
    assert y.tolist() == [-1.0] * 4
    y = np.zeros(4, np.float32)
    tn.interpret(pick, np.array([10, 20], np.float32), IDX, y)
    assert y.tolist() == [10.0, 20.0, -1.0, -1.0]


def test_the_reference_of_a_gather_from_a_reduction_over_an_empty_axis():
    a = tn.reference(pick_sums, np.zeros((0, 3), np.float32), IDX, np.zeros(4, np.float32))
    assert a.value.tolist() == [-1.0] * 4
    assert a.admits(np.full(4, -1.0, np.float32))
    assert not a.admits(np.array([-1.0, 0.0, -1.0, -1.0], np.float32))


def test_llvm_and_cuda_agree_with_the_interpreter_on_an_empty_axis():
    for k in (pick.compile(target="llvm"), pick.compile(target="cuda", device="emulated")):
        for x in (np.zeros(0, np.float32), np.array([10, 20], np.float32)):
            want = np.zeros(4, np.float32)
            tn.interpret(pick, x, IDX, want)
            got = np.zeros(4, np.float32)
            k(x, IDX, got)
            assert got.tolist() == want.tolist(), (k, x)


def test_validate_compares_gathers_over_empty_axes():
    for kern in (pick, pick_sums):
        rep = tn.validate(kern, cases=8, seed=0)
        assert rep.ok, rep.summary()
        assert 0 in rep.sizes()["N"], rep.summary()
