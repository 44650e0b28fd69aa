"""The race log's box footprints (``interpreter/effects.py``): an affine access
checked and recorded box-wise gives the same verdict, the same report and the
same per-element state as the element-by-element check, and races between
overlapping strided boxes are still found."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.errors import RaceError
from tilenest.interpreter import effects as FX


@dataclass(frozen=True)
class _Op:
    """The fields of an operation the effect log reads."""

    name: str
    oid: int
    loc: object = None


def _run(accesses, size, fshape, box_path):
    """Record ``accesses`` (box, write, op, anchor depth) in one batched frame;
    the race message (or None) and the dense track's arrays."""
    log = FX.EffectLog(True)
    fr = FX.Frame(_Op("parallel", 0), 1, fshape, True, (0, len(fshape)))
    log.push(fr)
    buf = FX.Buffer(("tensor", "t"), "t", (size,))
    msg = None
    try:
        for box, write, op, depth in accesses:
            where = box if box_path else box.flat()
            log.record(buf, where, None, write, op, depth, fshape, box.shape[len(fshape):])
    except RaceError as e:
        msg = e.message
    tr = fr.dense.get(buf.key)
    state = None if tr is None else tuple(a.copy() for a in (tr.w, tr.r, tr.wop, tr.rop))
    return msg, state


def _random_box(rng, fshape, size):
    tile = tuple(int(n) for n in rng.integers(1, 4, rng.integers(0, 3)))
    shape = fshape + tile
    while True:
        steps = tuple(int(s) for s in rng.integers(-3, 4, len(shape)))
        lo = sum(min(0, s * (n - 1)) for s, n in zip(steps, shape))
        hi = sum(max(0, s * (n - 1)) for s, n in zip(steps, shape))
        if hi - lo < size:
            base = int(rng.integers(-lo, size - hi))
            return FX.Box(base, steps, shape)


@pytest.mark.parametrize("seed", range(300))
def test_box_path_equals_the_element_by_element_check(seed):
    rng = np.random.default_rng(seed)
    fshape = tuple(int(n) for n in rng.integers(1, 4, rng.integers(1, 3)))
    size = 40
    ops = [_Op(f"op{k}", k + 1) for k in range(4)]
    accesses = [(_random_box(rng, fshape, size), bool(rng.integers(2)), ops[k],
                 int(rng.integers(0, 2) if rng.random() < 0.2 else 1))
                for k in range(int(rng.integers(1, 5)))]
    want = _run(accesses, size, fshape, False)
    got = _run(accesses, size, fshape, True)
    assert got[0] == want[0]
    if want[0] is None:  # after a race the log is abandoned; before it, equal
        assert (got[1] is None) == (want[1] is None)
        if want[1] is not None:
            for a, b in zip(got[1], want[1]):
                assert np.array_equal(a, b)


def test_box_footprint_lists_distinct_elements():
    b = FX.Box(5, (0, -2, 1), (3, 4, 2))  # a broadcast axis, a backwards one
    assert FX.Footprint(b).elements().tolist() == sorted(set(b.flat().ravel().tolist()))
    b = FX.Box(0, (1, 1), (3, 3))  # not injective: elements met twice
    assert FX.Footprint(b).elements().tolist() == [0, 1, 2, 3, 4]


@tn.kernel
def _rows_scaled(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        t = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(t + t)


def test_race_free_affine_accesses_are_checked_box_wise(monkeypatch):
    """Without the box path every access would reach the per-element check."""
    def per_element(*a, **k):
        raise AssertionError("an affine race-free access was checked element by element")

    monkeypatch.setattr(FX.DenseTrack, "access", per_element)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.zeros_like(x)
    tn.interpret(_rows_scaled, x, y)
    assert y.tolist() == (2 * x).tolist()


@tn.kernel
def _overlapping_strided_writes(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "M"]):  # noqa: F821
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n - 2)):
        v = x[tn.coord(p.index()), tn.shape(3)]
        y(tn.coord(p.index() * 2), tn.shape(3)).store(v)  # [2i, 2i + 3): neighbours overlap


@tn.kernel
def _write_after_read(x: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n // 2)):
        v = x[tn.coord(p.index() * 2 + 1), tn.shape(1)]  # odd elements read ...
        x(tn.coord(p.index()), tn.shape(1)).store(v)  # ... 1 is written by instance 1


@tn.kernel
def _partial_overlap_2d(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(2, 2)):
        o = tn.coord(p.index(0) * 3, p.index(1) * 3)  # 4x4 tiles three apart
        y(o, tn.shape(4, 4)).store(x[o, tn.shape(4, 4)])


def _race_text(kernel, *arrays, monkeypatch, box_path):
    with monkeypatch.context() as m:
        if not box_path:
            m.setattr(FX, "canon", lambda *a, **k: None)
        with pytest.raises(RaceError) as ei:
            tn.interpret(kernel, *(a.copy() for a in arrays))
    return ei.value.message


@pytest.mark.parametrize("case", ["strided", "war", "2d"])
def test_box_path_finds_the_races_the_element_check_finds(case, monkeypatch):
    if case == "strided":
        k, args = _overlapping_strided_writes, (np.ones(6, np.float32),
                                                np.zeros(9, np.float32))
        expect = ("instance (0,)", "instance (1,)", "y[2]", "writes")
    elif case == "war":
        k, args = _write_after_read, (np.arange(8, dtype=np.float32),)
        expect = ("instance (0,)", "instance (1,)", "x[1]", "reads")
    else:
        k, args = _partial_overlap_2d, (np.ones((7, 7), np.float32),
                                        np.zeros((7, 7), np.float32))
        expect = ("y[0, 3]", "writes")
    got = _race_text(k, *args, monkeypatch=monkeypatch, box_path=True)
    want = _race_text(k, *args, monkeypatch=monkeypatch, box_path=False)
    assert got == want
    for part in expect:
        assert part in got
