"""The LLVM backend joins of ``parallel`` regions with carried values
(``execution.md`` E-6, E-11; ``transforms.md`` T-3): each child's footprint is
taken from that child -- ``put`` blocks even when the entry value has other
uses, only the branch an ``if`` took, the union of a nested parallel's
children's blocks -- and every other element keeps the entry value."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends.llvm import compile_program

CASES = pathlib.Path(__file__).resolve().parent.parent / "spec" / "conformance" / "cases"


def _program(rel: str):
    p = CASES / rel
    return tn.parse(p.read_text(), str(p))


def _admits(adm, name, out):
    a = adm if not isinstance(adm, tuple) else next(x for x in adm if x.name == name)
    assert a.name == name
    v = a.admits(out)
    assert v.ok, str(v)


def test_control_anchored_update_has_one_writer():
    prog = _program("execution/E06-control-anchor.tile")
    y = np.full(4, np.nan, np.float32)
    adm = tn.reference(prog, y.copy())
    compile_program(prog, cache=False)(y)
    np.testing.assert_array_equal(y, np.ones(4, np.float32))
    _admits(adm, "y", y)


def test_put_patches_join_when_entry_has_other_uses():
    prog = _program("execution/E11-patch-join.tile")
    x = np.arange(8, dtype=np.float32)
    y = np.full(8, np.nan, np.float32)
    before = np.full(8, np.nan, np.float32)
    adm = tn.reference(prog, x, y.copy(), before.copy())
    compile_program(prog, cache=False)(x, y, before)
    want = np.full(8, -1.0, np.float32)
    want[:6] = x[:6] - 8.0
    np.testing.assert_array_equal(y, want)
    np.testing.assert_array_equal(before, np.full(8, -1.0, np.float32))
    _admits(adm, "y", y)
    _admits(adm, "before", before)


def test_nested_parallel_patches_join_in_outer_child():
    prog = _program("transforms/T03-split-below-cut.tile")
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.full((3, 4), np.nan, np.float32)
    adm = tn.reference(prog, x, y.copy())
    compile_program(prog, cache=False)(x, y)
    np.testing.assert_array_equal(y, 2 * x)
    _admits(adm, "y", y)


@pytest.mark.parametrize("rel", ["execution/E06-control-anchor.tile",
                                 "execution/E11-patch-join.tile",
                                 "transforms/T03-split-below-cut.tile"])
def test_join_cases_validate(rel):
    rep = tn.validate(_program(rel))
    assert rep.ok, rep
