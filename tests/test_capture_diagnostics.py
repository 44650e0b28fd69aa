"""Every capture diagnostic fires at the user's file:line with a hint.

Each kernel marks its offending line with a ``# ERR`` comment; the test finds
that line in this file and asserts the error names it."""

from __future__ import annotations

import inspect
import os

import pytest

import tilenest as tn
from tilenest import f32
from tilenest.errors import CaptureError, ContractError, TilenestError, TypeCheckError, VerifyError

FILE = os.path.relpath(__file__)


def err_line(k: tn.Kernel) -> int:
    src, first = inspect.getsourcelines(k.fn)
    for i, line in enumerate(src):
        if "# ERR" in line:
            return first + i
    raise AssertionError("no # ERR marker")


def expect(k: tn.Kernel, exc: type, *needles: str, hint: str | None = None) -> TilenestError:
    with pytest.raises(exc) as ei:
        k.program
    e = ei.value
    line = err_line(k)
    assert any(s.file == FILE and s.line == line for s in e.sites), (e.render(), line)
    for n in needles:
        assert n in e.message, e.render()
    assert e.hint, e.render()
    if hint:
        assert hint in e.hint, e.render()
    return e


@tn.kernel
def k_break(x: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(4)):
        break  # ERR


@tn.kernel
def k_continue(x: tn.Tensor[f32, 1]):
    for p in tn.serial(tn.shape(4)):
        continue  # ERR


@tn.kernel
def k_escaped(x: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(4)):
        pass
    i = p.index()  # ERR


@tn.kernel
def k_escaped_stored(x: tn.Tensor[f32, 1]):
    handles = []
    for p in tn.parallel(tn.shape(4)):
        handles.append(p)
    i = handles[0].index()  # ERR


@tn.kernel
def k_python_if(x: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(4)):
        v = x[tn.coord(p.index()), tn.shape(1)]
        s = tn.reduce(v, v.dim(0), tn.add)
        if s > 0:  # ERR
            pass


@tn.kernel
def k_python_while(x: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(4)):
        s = tn.scalar(0.0, f32)
        while s < 3.0:  # ERR
            s = s + 1.0


@tn.kernel
def k_python_if_on_index(x: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(4)):
        if p.index() == 0:  # ERR
            pass


@tn.kernel
def k_index_rank2(x: tn.Tensor[f32, 2]):
    for p in tn.parallel(tn.shape(4, 4)):
        i = p.index()  # ERR


@tn.kernel
def k_mma_dims(A: tn.Tensor[f32, 2], B: tn.Tensor[f32, 2], C: tn.Tensor[f32, 2]):
    for p in tn.parallel(tn.shape(1)):
        a = A[tn.coord(0, 0), tn.shape(4, 4)]
        b = B[tn.coord(0, 0), tn.shape(4, 4)]
        acc = tn.zeros(f32, tn.shape(4, 4))
        acc = tn.mma(a, b, acc)  # ERR


@tn.kernel
def k_tree_no_contract(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        v = x[tn.coord(0), tn.shape(8)]
        s = tn.scalar(1.0, f32)
        for r in p.reduce(v.domain(v.dim(0))):  # ERR
            s = s * 0.5 + v.at(r)
        y(tn.coord(0), tn.shape(1)).store(tn.broadcast(s, tn.shape(tn.axis(y.dim(0), 1))))


@tn.kernel
def k_tree_mma_update(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"]):
    m, k = A.dims()
    B = B.with_dims(k, B.dim(1))
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(f32, tn.shape(4, 4), dims=(m, B.dim(1)))
        for r in p.reduce(tn.shape(2)):  # ERR
            a = A[tn.coord(0, r.index() * 4), tn.shape(4, 4)]
            b = B[tn.coord(r.index() * 4, 0), tn.shape(4, 4)]
            acc = tn.mma(a, b, acc)


@tn.kernel
def k_dims_mismatch(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        a = x[tn.coord(0), tn.shape(8)]
        b = y[tn.coord(0), tn.shape(8)]
        z(tn.coord(0), tn.shape(8)).store(a + b)  # ERR


@tn.kernel
def k_local_after_region(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        for s in p.serial(tn.shape(3)):
            t = x[tn.coord(s.index()), tn.shape(1)]
        y(tn.coord(0), tn.shape(1)).store(t)  # ERR


@tn.kernel
def k_host_rebound(x: tn.Tensor[f32, 1]):
    off = 0
    for s in tn.serial(tn.shape(3)):  # ERR
        off = off + 1


@tn.kernel
def k_store_dtype(x: tn.Tensor[f32, 1], y: tn.Tensor[tn.i32, 1]):
    for p in tn.parallel(tn.shape(1)):
        y(tn.coord(0), tn.shape(4)).store(x[tn.coord(0), tn.shape(4)])  # ERR


@tn.kernel
def k_subscript_store(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        y[tn.coord(0), tn.shape(4)] = x[tn.coord(0), tn.shape(4)]  # ERR


@tn.kernel
def k_memory_uninit(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        m = tn.memory(f32, tn.shape(4))
        y(tn.coord(0), tn.shape(4)).store(m.load())  # ERR


@tn.kernel
def k_memory_maybe_empty(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(1)):
        m = tn.memory(f32, tn.shape(4))
        for s in p.serial(tn.shape(n)):
            m.store(x[tn.coord(s.index()), tn.shape(4)])
        y(tn.coord(0), tn.shape(4)).store(m.load())  # ERR


@tn.kernel
def k_memory_not_injective(x: tn.Tensor[f32, 2]):
    for p in tn.parallel(tn.shape(1)):
        m = tn.memory(f32, tn.layout(tn.shape(4, 4), strides=(1, 2)))  # ERR
        m.store(x[tn.coord(0, 0), tn.shape(4, 4)])


@tn.kernel
def k_return_in_region(x: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        return  # ERR


@tn.kernel
def k_stage_nested(x: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        for k in p.pipeline(tn.shape(4)):
            for s in k.serial(tn.shape(2)):
                k.stage("a")  # ERR


@tn.kernel
def k_stage_dup(x: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        for k in p.pipeline(tn.shape(4)):
            k.stage("a")
            k.stage("a")  # ERR


@tn.kernel
def k_before_first_cut(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(f32, tn.shape(1))
        for k in p.pipeline(tn.shape(4)):
            v = x[tn.coord(k.index()), tn.shape(1)]  # ERR
            k.stage("use")
            acc = acc + tn.reindex(v, acc, lambda i: (i,))


@tn.kernel
def k_outer_handle(x: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(2)):
        for q in p.parallel(tn.shape(2)):
            for s in p.serial(tn.shape(2)):  # ERR
                pass


@tn.kernel
def k_undefined_name(x: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(2)):
        y = undefined_thing + 1  # ERR  # noqa: F821


@tn.kernel
def k_unsupported(x: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(2)):
        try:  # ERR
            pass
        finally:
            pass


@tn.kernel
def k_index_tile_staged(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        m = tn.cast(tn.reduce(x[tn.coord(0), tn.shape(4), tn.bounds.zero], x.dim(0),
                              tn.maximum), tn.i64)
        at = tn.index_tile(tn.shape(4), lambda i: m * 2 + i)  # ERR
        y(tn.coord(0), tn.shape(4), tn.bounds.zero).store(tn.cast(at, f32))


@tn.kernel
def k_index_tile_staged_cond(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        m = tn.cast(tn.reduce(x[tn.coord(0), tn.shape(4), tn.bounds.zero], x.dim(0),
                              tn.maximum), tn.i64)
        at = tn.index_tile(tn.shape(4), lambda i: tn.ite(i < 2, m, i))  # ERR
        y(tn.coord(0), tn.shape(4), tn.bounds.zero).store(tn.cast(at, f32))


CASES = [
    (k_break, CaptureError, ("break",), "tn.while_"),
    (k_continue, CaptureError, ("continue",), "tn.if_"),
    (k_escaped, CaptureError, ("outside its region",), None),
    (k_escaped_stored, CaptureError, ("outside its region",), None),
    (k_python_if, CaptureError, ("staged value",), "tn.if_"),
    (k_python_while, CaptureError, ("staged value",), "tn.while_"),
    (k_python_if_on_index, CaptureError, ("staged",), "tn.if_"),
    (k_index_rank2, CaptureError, ("rank-2",), "index(axis)"),
    (k_mma_dims, TypeCheckError, ("mma",), "with_dims"),
    (k_tree_no_contract, ContractError, ("no reducer contract",), "fold_left"),
    (k_tree_mma_update, ContractError, ("no reducer contract",), "fold_left"),
    (k_dims_mismatch, TypeCheckError, ("unrelated dims",), "with_dims"),
    (k_local_after_region, CaptureError, ("defined inside",), None),
    (k_host_rebound, CaptureError, ("host value",), "staged"),
    (k_store_dtype, TypeCheckError, ("i32",), "tn.cast"),
    (k_subscript_store, CaptureError, ("not a store",), ".store("),
    (k_memory_uninit, VerifyError, ("before a definite store",), "zero times"),
    (k_memory_maybe_empty, VerifyError, ("before a definite store",), "zero times"),
    (k_memory_not_injective, VerifyError, ("not injective",), None),
    (k_return_in_region, CaptureError, ("return",), None),
    (k_stage_nested, CaptureError, ("top-level",), None),
    (k_stage_dup, CaptureError, ("duplicate stage",), None),
    (k_before_first_cut, CaptureError, ("before the first",), "first cut"),
    (k_outer_handle, CaptureError, ("innermost",), None),
    (k_undefined_name, CaptureError, ("not defined",), None),
    (k_unsupported, CaptureError, ("unsupported",), None),
    (k_index_tile_staged, CaptureError, ("coordinate #0", "staged value"), "outside"),
    (k_index_tile_staged_cond, CaptureError, ("coordinate #0", "staged value"), "outside"),
]


@pytest.mark.parametrize("k,exc,needles,hint", CASES, ids=[c[0].fn.__name__ for c in CASES])
def test_diagnostic(k, exc, needles, hint):
    expect(k, exc, *needles, hint=hint)


def test_staged_values_combine_with_index_tiles_outside_their_function():
    """The form the index-function diagnostic suggests captures and runs."""
    @tn.kernel
    def shifted(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
        for p in tn.parallel(tn.shape(1)):
            m = tn.cast(tn.reduce(x[tn.coord(0), tn.shape(4), tn.bounds.zero], x.dim(0),
                                  tn.maximum), tn.i64)
            at = m * 2 + tn.index_tile(tn.shape(4), lambda i: i)
            y(tn.coord(0), tn.shape(4), tn.bounds.zero).store(tn.cast(at, f32))

    import numpy as np

    x = np.array([1.0, 3.0, 2.0, 0.0], np.float32)
    y = np.zeros(4, np.float32)
    tn.interpret(shifted, x, y)
    assert list(y) == [6.0, 7.0, 8.0, 9.0]


def test_dims_mismatch_is_about_identity_not_extent():
    """Equal extents do not make two dims interchangeable; with_dims fixes it."""

    @tn.kernel
    def fixed(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(1)):
            a = x[tn.coord(0), tn.shape(8)]
            b = y[tn.coord(0), tn.shape(8)]
            z(tn.coord(0), tn.shape(8)).store(a + b)

    p = fixed.program
    add = next(op for op in p.walk() if op.name == "add")
    assert add.result.type.rank == 1
    # without with_dims the two tiles of equal extent do not combine
    with pytest.raises(TypeCheckError, match="unrelated dims"):
        k_dims_mismatch.program


def test_labels_never_affect_meaning():
    def make(label: str) -> tn.Kernel:
        @tn.kernel
        def k(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
            d = tn.dim(label)
            for p in tn.parallel(tn.shape(1)):
                t = tn.full(f32, tn.shape(4), 1.0, dims=(d,))
                u = tn.reindex(x[tn.coord(0), tn.shape(4)], t, lambda i: (i,))
                y(tn.coord(0), tn.shape(4)).store(t + u)

        return k

    a, b = make("m").program, make("zzz").program
    assert a == b
    labels_a = {d.label for d in a.dims}
    labels_b = {d.label for d in b.dims}
    assert "m" in labels_a and "zzz" in labels_b


def test_errors_render_site_and_hint():
    e = expect(k_break, CaptureError, "break")
    text = e.render()
    assert f"{FILE}:{err_line(k_break)}" in text
    assert "hint:" in text
