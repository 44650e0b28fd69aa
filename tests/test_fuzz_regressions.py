"""Programs the differential fuzzer found, reduced to their smallest form.

Each test states the bug it pins down. Bugs not fixed yet are ``xfail(strict=True)``:
the test fails loudly once the bug is fixed, so that the mark is removed and
the generator's workaround (in ``tilenest/validation/fuzz.py``) dropped."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest.validation import validate
from tilenest.validation.fuzz import Spec, check_spec


def test_memory_declared_inside_if_branch_captures():
    """A Memory declared inside an ``if_`` branch is local to that branch (the
    capture used to look up its state in the other branch and crash)."""
    s = Spec("f32", 2, (1, 8), False, False, [("loop", "if", 3, [("mem", 3)])])
    r = check_spec(s, cases=2)
    assert r.status == "ok", r.message


@pytest.mark.parametrize("dtype", ["i32", "f32"])
@pytest.mark.parametrize("policy", ["unordered_tree", "ordered_tree"])
def test_the_maxabs_reducer_is_a_legal_tree_reduction_for_every_dtype(dtype, policy):
    """The generator's ``maxabs`` reducer (merge ``max``, lift ``abs``) under a
    tree policy. With identity 0 on i32 the checker rightly refutes the
    identity law (``abs`` wraps at the minimum, a reachable state below 0),
    so every such draw was reported as a failure of the compiled code; the
    identity is now the least state."""
    s = Spec(dtype, 1, (1,), False, False, [("cred", 0, "maxabs", policy)])
    r = check_spec(s, cases=2)
    assert r.status == "ok", r.message


def _region_in_branch():
    @tn.kernel
    def k(x: tn.Tensor[tn.f32, 1], y: tn.Tensor[tn.f32, 1]):
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
            t = x[tn.coord(p.index() * 4), tn.shape(4), tn.bounds.zero]
            c = tn.reduce(t, t.dim(0), tn.maximum)
            if tn.if_(c > 0.0):
                s = tn.scalar(0.0, tn.f32)
                for r in p.reduce(t.domain(t.dim(0)), policy=tn.fold_left):
                    s = s + t.at(r)
                t = t - s
            else:
                t = -t
            y(tn.coord(p.index() * 4), tn.shape(4)).store(t)
    return k


def test_region_from_enclosing_handle_inside_if_branch():
    """``if_``/``while_`` add no nest level (E-15): inside a branch, regions are
    opened from the enclosing region's handle (``p.reduce``)."""
    k = _region_in_branch()
    x = np.arange(-3, 9, dtype=np.float32)
    rep = validate(k, inputs=[x, np.zeros_like(x)])
    assert rep.ok and rep.count("ok") == 1, rep.summary()
