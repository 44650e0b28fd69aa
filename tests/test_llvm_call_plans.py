"""Calls of compiled llvm kernels bound once per argument layout
(``backends/llvm/callplan.py``).

Identical calls do not redo the binding work (counted, not timed); every
fact a check depends on invalidates what was kept: a new shape, flags
(read-only), dtype, a scalar's value (down to the sign of zero), torch
properties; a new address is re-checked at every call for alignment and
overlap, so aliasing (M-8) is still decided per call: the same array passed
twice runs the alias variant, a partial overlap is refused.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.backends.llvm.callplan import Layout, fingerprint
from tilenest.errors import TilenestError
from test_llvm_workers import add_rows  # the same two-input row kernel


@tn.kernel
def scale_rows(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"], s: tn.Scalar[f32]):
    rows, cols = x.shape
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(rows)):
        o = tn.coord(p.index(), 0)
        y(o, tn.shape(1, cols)).store(x[o, tn.shape(1, cols)] * s)


@pytest.fixture(scope="module")
def add():
    return add_rows.compile()


def fresh(ck):
    """``ck`` with no bound calls, its ``bind`` counted."""
    from tilenest.backends.llvm.callplan import Calls

    ck.calls = Calls(ck)
    count = [0]
    bind = type(ck).bind

    def counted(*a, **kw):
        count[0] += 1
        return bind(ck, *a, **kw)

    ck.bind = counted
    return count


def operands(shape=(6, 5), seed=0):
    rng = np.random.default_rng(seed)
    return tuple(rng.standard_normal(shape).astype(np.float32) for _ in range(3))


def test_identical_calls_bind_once(add):
    count = fresh(add)
    x, z, y = operands()
    for _ in range(5):
        add(x, z, y)
    assert count[0] == 1 and add.calls.binds == 1 and add.calls.hits == 4
    assert y.tobytes() == (x + z).tobytes()
    add(x, z, y, threads=1)  # another thread count is another launch
    add(x, z, y, threads=1)
    assert count[0] == 2 and add.calls.hits == 5


def test_new_addresses_are_filled_in_without_binding_again(add):
    count = fresh(add)
    x, z, y = operands()
    add(x, z, y)
    for seed in (1, 2, 3):
        x2, z2, y2 = operands(seed=seed)
        add(x2, z2, y2)
        assert y2.tobytes() == (x2 + z2).tobytes()
    assert count[0] == 1
    with pytest.raises(TilenestError, match="threads"):
        add(x, z, y, threads=0)


def test_a_changed_shape_dtype_or_flag_is_checked_again(add):
    count = fresh(add)
    x, z, y = operands()
    add(x, z, y)
    x2, z2, y2 = operands((3, 7))
    add(x2, z2, y2)
    assert count[0] == 2 and y2.tobytes() == (x2 + z2).tobytes()
    y.flags.writeable = False
    with pytest.raises(TilenestError, match="read-only"):
        add(x, z, y)
    y.flags.writeable = True
    add(x, z, y)
    with pytest.raises(TilenestError, match="dtype"):
        add(x, z.astype(np.float64), y)
    with pytest.raises(TilenestError, match="extent"):
        add(x, z[:, :4].copy(), y)
    # a misaligned array of the same shape
    raw = np.zeros(x.nbytes + 1, np.uint8)
    odd = np.frombuffer(raw.data, np.float32, x.size, 1).reshape(x.shape)
    with pytest.raises(TilenestError, match="aligned"):
        add(odd, z, y)
    assert y.tobytes() == (x + z).tobytes()


def test_aliasing_is_decided_at_every_call(add):
    count = fresh(add)
    x, z, y = operands()
    add(x, z, y)
    # the written array passed twice: the alias variant, bound once
    for _ in range(2):
        y2 = z.copy()
        want = x + y2
        add(x, y2, y2)
        assert y2.tobytes() == want.tobytes()
    assert count[0] == 2
    # same layout, partly overlapping: refused, every time
    buf = np.zeros((7, 5), np.float32)
    for _ in range(2):
        with pytest.raises(TilenestError, match="overlap"):
            add(x, buf[1:], buf[:-1])
    # back to distinct arrays: the first plan, not bound again
    add(x, z, y)
    assert y.tobytes() == (x + z).tobytes() and count[0] == 4


def test_a_scalar_is_keyed_by_its_exact_value():
    ck = scale_rows.compile()
    count = fresh(ck)
    x = np.ones((2, 3), np.float32)
    y = np.empty_like(x)
    assert not np.signbit(ck(x, y, 0.0)).any()
    assert np.signbit(ck(x, y, -0.0)).all()
    assert (ck(x, y, np.float32(2.5)) == 2.5).all()
    assert (ck(x, y, 3) == 3).all()
    assert (ck(x, y, 0.0) == 0).all() and count[0] == 4
    assert fingerprint((True, True, False), (x, y, 1), None, None)[0] != \
        fingerprint((True, True, False), (x, y, True), None, None)[0]


def test_arrays_of_other_kinds_are_bound_at_every_call(add):
    count = fresh(add)
    x, z, y = operands()

    class Sub(np.ndarray):
        pass

    for _ in range(3):
        add(x.view(Sub), z, y)
    assert count[0] == 3 and y.tobytes() == (x + z).tobytes()


def test_torch_tensors_are_keyed_by_what_makes_them_viewable(add):
    torch = pytest.importorskip("torch")
    count = fresh(add)
    x, z, y = operands()
    tx, tz, ty = (torch.from_numpy(a.copy()) for a in (x, z, y))
    for _ in range(3):
        add(tx, tz, ty)
    assert count[0] == 1 and ty.numpy().tobytes() == (x + z).tobytes()
    other = torch.zeros_like(ty)
    ty.set_(other)  # the same tensor object, new storage
    add(tx, tz, ty)
    assert count[0] == 1 and other.numpy().tobytes() == (x + z).tobytes()
    tz.requires_grad_(True)
    with pytest.raises(TilenestError, match="grad"):
        add(tx, tz, ty)


def test_layout_groups_check_alignment_and_overlap():
    a = np.zeros((4, 4), np.float32)
    b = np.zeros((4, 4), np.float32)
    lay = Layout(["x", "y"], [a, b], (True, True), {"y"})
    pa, pb = a.ctypes.data, b.ctypes.data
    assert lay.groups([pa, pb]) == ()
    assert lay.groups([pa, pa]) == (("x", "y"),)
    assert lay.groups([pa, pa + 4]) is None  # overlapping, not the same array
    assert lay.groups([pa + 2, pb]) is None  # misaligned for f32
    assert lay.groups([pa, pa + a.nbytes]) == ()  # adjacent, disjoint
