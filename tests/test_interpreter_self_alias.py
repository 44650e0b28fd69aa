"""Race detection inside one argument: an output whose elements share storage
(a stride of 0, or rows that interleave, made with ``as_strided``) written by
several ``parallel`` instances is a race, as a partial overlap with another
argument already is; the oracle's copies keep that overlap, so ``reference``
and ``validate`` see it too."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.errors import RaceError
from tilenest.interpreter import copy_arguments
from tilenest.interpreter.effects import overlaps_itself

as_strided = np.lib.stride_tricks.as_strided


@tn.kernel
def double_rows(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):  # noqa: F821
    """``y = 2x``, one row per parallel instance."""
    r, c = x.shape
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(r)):
        row = tn.coord(p.index(), 0)
        y(row, tn.shape(1, c)).store(x[row, tn.shape(1, c)] * 2.0)


def _x() -> np.ndarray:
    return np.arange(32, dtype=np.float32).reshape(4, 8)


def _stride0_rows() -> tuple[np.ndarray, np.ndarray]:
    """A writable 4 x 8 view whose four rows are one row of storage."""
    store = np.zeros(8, np.float32)
    return store, as_strided(store, shape=(4, 8), strides=(0, 4), writeable=True)


def _half_rows() -> np.ndarray:
    """A writable 4 x 8 view whose rows overlap by half (a step of 4 elements)."""
    store = np.zeros(20, np.float32)
    return as_strided(store, shape=(4, 8), strides=(16, 4), writeable=True)


@pytest.mark.parametrize("schedule", [None, "canonical", "reversed", "random:3"])
def test_rows_sharing_storage_written_by_several_instances_race(schedule):
    _, y = _stride0_rows()
    with pytest.raises(RaceError) as e:
        tn.interpret(double_rows, _x(), y, schedule=schedule)
    assert "writes y" in e.value.message and "instance" in e.value.message
    with pytest.raises(RaceError):
        tn.interpret(double_rows, _x(), _half_rows(), schedule=schedule)


def test_the_reference_keeps_the_overlap_in_its_copies():
    store, y = _stride0_rows()
    with pytest.raises(RaceError):
        tn.reference(double_rows, _x(), y)
    assert not store.any()  # the reference wrote only its copies
    (_, cy) = copy_arguments((_x(), y))
    assert cy.strides == (0, 4) and not np.shares_memory(cy, y)


def test_validate_does_not_compare_on_storage_that_races():
    _, y = _stride0_rows()
    rep = tn.validate(double_rows, inputs=[_x(), y])
    assert rep.count("skipped") == 1 and not rep.ok, rep.summary()
    assert "race" in rep.results[0].message


def test_disjoint_outputs_and_overlapping_inputs_are_no_race():
    y = np.zeros((4, 8), np.float32)
    tn.interpret(double_rows, _x(), y)
    assert (y == 2 * _x()).all()
    # an input whose rows share storage is only read: no race
    row = np.arange(8, dtype=np.float32)
    x = as_strided(row, shape=(4, 8), strides=(0, 4))
    y = np.zeros((4, 8), np.float32)
    tn.interpret(double_rows, x, y)
    assert (y == 2 * row).all()


def test_overlaps_itself():
    a = np.zeros((4, 6), np.float32)
    assert not overlaps_itself(a) and not overlaps_itself(a.T) and not overlaps_itself(a[:, ::2])
    assert overlaps_itself(_stride0_rows()[1]) and overlaps_itself(_half_rows())
    # a stride of 0 along an axis of one element shares nothing
    assert not overlaps_itself(as_strided(a, shape=(1, 6), strides=(0, 4)))
    # interleaved rows that never meet: (0, 8, 16) and (4, 12, 20) bytes
    assert not overlaps_itself(as_strided(a, shape=(2, 3), strides=(4, 8)))
    # elements that meet only in part of their bytes (a step of 2 bytes)
    assert overlaps_itself(as_strided(a, shape=(3,), strides=(2,)))
