"""Capture, specialization, call binding and diagnostics of the Python frontend.

Each test pins one defect that was observed: an internal error where the user
deserved a diagnostic, a silently accepted mistake, or a message that misled.
Kernels mark the line a diagnostic must name with ``# ERR``.
"""

from __future__ import annotations

import inspect
import os
import warnings

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.errors import CaptureError, TilenestError, TilenestWarning, TypeCheckError

FILE = os.path.relpath(__file__)


def marked_line(k: tn.Kernel, marker: str = "# ERR") -> int:
    src, first = inspect.getsourcelines(k.fn)
    for i, line in enumerate(src):
        if marker in line:
            return first + i
    raise AssertionError(f"no {marker} marker")


def def_line(k: tn.Kernel) -> int:
    return marked_line(k, "def ")


def call_line() -> int:
    """The line marked ``# CALL`` in the calling test function."""
    f = inspect.currentframe().f_back
    src, first = inspect.getsourcelines(f.f_code)
    return next(first + i for i, line in enumerate(src) if "# CALL" in line)


def names_line(e: TilenestError, line: int) -> bool:
    return any(s.file == FILE and s.line == line for s in e.sites)


# ---------------------------------------------------------------- sibling regions
@tn.kernel
def three_locals(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    n = x.shape[0]
    for a in tn.serial(tn.shape(n)):
        h = x[tn.coord(a.index()), tn.shape(1)]
        y(tn.coord(a.index()), tn.shape(1)).store(h)
    for b in tn.serial(tn.shape(n)):
        h = x[tn.coord(b.index()), tn.shape(1)] * 2.0
        y(tn.coord(b.index()), tn.shape(1)).store(h)
    for c in tn.serial(tn.shape(n)):
        h = x[tn.coord(c.index()), tn.shape(1)] * 3.0
        y(tn.coord(c.index()), tn.shape(1)).store(h)
    for d in tn.serial(tn.shape(n)):
        h = y[tn.coord(d.index()), tn.shape(1)] + 1.0
        y(tn.coord(d.index()), tn.shape(1)).store(h)


def test_a_name_local_to_three_sibling_regions_is_three_locals():
    prog = three_locals.program            # was: VerifyError naming %h_1
    serials = [op for op in prog.body.ops if op.name == "serial"]
    assert len(serials) == 4 and all(not op.operands for op in serials)   # nothing carried
    x = np.arange(5, dtype=np.float32)
    y = np.zeros(5, np.float32)
    three_locals(x, y)
    assert y.tolist() == (3 * x + 1).tolist()


@tn.kernel
def local_used_after_third(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    n = x.shape[0]
    for a in tn.serial(tn.shape(n)):
        h = x[tn.coord(a.index()), tn.shape(1)]
    for b in tn.serial(tn.shape(n)):
        h = x[tn.coord(b.index()), tn.shape(1)]
    for c in tn.serial(tn.shape(n)):
        h = x[tn.coord(c.index()), tn.shape(1)]
    y(tn.coord(0), tn.shape(1)).store(h)  # ERR


def test_a_sibling_local_stays_invisible_after_the_last_region():
    with pytest.raises(CaptureError, match="defined inside a serial region") as ei:
        local_used_after_third.program
    assert names_line(ei.value, marked_line(local_used_after_third)), ei.value.render()


@tn.kernel
def locals_then_if(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    n = x.shape[0]
    for a in tn.serial(tn.shape(n)):
        h = x[tn.coord(a.index()), tn.shape(1)]
    for b in tn.serial(tn.shape(n)):
        h = x[tn.coord(b.index()), tn.shape(1)]
    for c in tn.serial(tn.shape(n)):
        s = tn.reduce(x[tn.coord(c.index()), tn.shape(1)], x.dim(0), tn.add)
        if tn.if_(s > 2.0):
            h = x[tn.coord(c.index()), tn.shape(1)] * 10.0
            y(tn.coord(c.index()), tn.shape(1)).store(h)
        else:
            h = x[tn.coord(c.index()), tn.shape(1)]
            y(tn.coord(c.index()), tn.shape(1)).store(h)


def test_sibling_locals_then_a_name_defined_in_both_branches():
    x = np.arange(5, dtype=np.float32)
    y = np.zeros(5, np.float32)
    locals_then_if(x, y)
    assert y.tolist() == np.where(x > 2, 10 * x, x).tolist()


# ---------------------------------------------------------------- specialize
@tn.kernel
def blocked(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, B=4, scale=1.0, flag=False):
    for p in tn.parallel(tn.shape(tn.cdiv(x.shape[0], 4))):
        v = x(tn.coord(p.index() * 4), tn.shape(B)).load()  # ERR
        y(tn.coord(p.index() * 4), tn.shape(4)).store(v * scale if not flag else v)


def test_a_negative_extent_is_a_located_capture_error():
    with pytest.raises(CaptureError, match="extent -4 is negative") as ei:
        blocked.specialize(B=-4).program
    e = ei.value
    assert names_line(e, marked_line(blocked)), e.render()
    assert any("B=-4" in n for n in e.notes), e.render()


def test_specialize_rejects_a_name_that_is_no_parameter():
    with pytest.raises(TilenestError, match="no parameter 'NOT_A_PARAM'") as ei:
        blocked.specialize(NOT_A_PARAM=1)  # CALL
    e = ei.value
    assert "B, flag, scale" in e.hint and names_line(e, call_line()), e.render()
    with pytest.raises(TilenestError, match="no parameter 'bogus'"):
        tn.kernel(bogus=1)(blocked.fn)


@pytest.mark.parametrize("consts,needle", [
    ({"B": 2.5}, "defaults to int 4; got float 2.5"),
    ({"B": True}, "got bool True"),
    ({"flag": 1}, "defaults to bool False"),
    ({"scale": "x"}, "defaults to float"),
    ({"x": 1}, "'x' is a tensor argument"),
])
def test_specialize_checks_the_value_type(consts, needle):
    with pytest.raises(TilenestError, match=needle) as ei:
        blocked.specialize(**consts)  # CALL
    assert names_line(ei.value, call_line()), ei.value.render()


def test_specialize_accepts_fitting_values():
    x = np.arange(8, dtype=np.float32)
    y = np.zeros(8, np.float32)
    blocked.specialize(scale=3)(x, y)          # an int where a float is expected is fine
    assert y.tolist() == (3 * x).tolist()


# ---------------------------------------------------------------- keyword arguments
@tn.kernel
def scaled(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], n: int, *, scale=2.0):
    for p in tn.serial(tn.shape(n)):
        v = x[tn.coord(p.index()), tn.shape(1)]
        y(tn.coord(p.index()), tn.shape(1)).store(v * scale)


def test_tensors_constants_and_symbols_by_keyword():
    x = np.arange(6, dtype=np.float32)
    y = np.zeros(6, np.float32)
    scaled(y=y, x=x, n=4)                      # was: TypeError from the interpreter
    assert y.tolist() == [0, 2, 4, 6, 0, 0]
    y[:] = 0
    scaled(x, y=y, scale=-1.0, params={"n": 3})
    assert y.tolist() == [0, -1, -2, 0, 0, 0]
    v1, _, _ = scaled.bind_arguments((x, y), {"scale": -1.0, "n": 1})
    v2, _, _ = scaled.bind_arguments((x, y), {"scale": -1.0, "n": 2})
    assert v1 is v2 and v1.consts == {"scale": -1.0}          # one variant per constant set


@pytest.mark.parametrize("args,kw,needle", [
    ((), {"x": 0, "n": 1}, "missing argument(s) 'y'"),
    ((0,), {"x": 0, "y": 0, "n": 1}, "both by position and by keyword"),
    ((0, 0, 0), {"n": 1}, "takes 2 positional arguments"),
    ((0, 0), {"z": 1, "n": 1}, "has no argument 'z'"),
    ((0, 0), {"n": 1, "params": {"n": 2}}, "both by keyword and in params="),
    ((0, 0), {"scale": "big", "n": 1}, "defaults to float"),
])
def test_call_binding_errors(args, kw, needle):
    with pytest.raises(TilenestError) as ei:
        scaled(*args, **kw)  # CALL
    e = ei.value
    # the user's line that made the call, not the kernel's def line
    assert needle in e.message and names_line(e, call_line()), e.render()
    assert not names_line(e, def_line(scaled))


def test_params_must_be_integers():
    x = np.arange(6, dtype=np.float32)
    y = np.zeros(6, np.float32)
    with pytest.raises(TilenestError, match="must be an integer, got float 4.5"):
        scaled(x, y, params={"n": 4.5})        # was: silently truncated to 4
    with pytest.raises(TilenestError, match="must be an integer"):
        scaled(x, y, n=True)
    with pytest.raises(TilenestError, match="must be a dict"):
        tn.interpret(scaled, x, y, params=[("n", 4)])
    assert not y.any()


# ---------------------------------------------------------------- diagnostics (item 8)
@tn.kernel
def retyped(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    a = tn.zeros(f32, tn.shape(1))  # FIRST
    for i in tn.serial(tn.shape(x.shape[0])):  # ERR
        a = tn.zeros(f32, tn.shape(1))  # SECOND
    y(tn.coord(0), tn.shape(1)).store(a)


def test_equal_labels_are_told_apart_with_where_each_dim_was_made():
    with pytest.raises(TypeCheckError) as ei:
        retyped.program
    e = ei.value
    assert "from f32[d0#1:1] to f32[d0#2:1]" in e.message, e.render()
    first, second = marked_line(retyped, "# FIRST"), marked_line(retyped, "# SECOND")
    notes = "\n".join(e.notes)
    assert f"'d0#1' is the fresh dim made by tn.zeros at {FILE}:{first}:" in notes, e.render()
    assert f"'d0#2' is the fresh dim made by tn.zeros at {FILE}:{second}:" in notes, e.render()
    assert names_line(e, marked_line(retyped))


@tn.kernel
def unrelated(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    a = tn.zeros(f32, tn.shape(4))  # FIRST
    b = tn.full(f32, tn.shape(4), 1.0)  # SECOND
    y(tn.coord(0), tn.shape(4)).store(a + b)  # ERR


def test_unrelated_dims_with_one_label_name_their_constructors():
    with pytest.raises(TypeCheckError, match="unrelated dims: d0#1 vs d0#2|unrelated dims: "
                                             "d0#2 vs d0#1") as ei:
        unrelated.program
    notes = "\n".join(ei.value.notes)
    first, second = marked_line(unrelated, "# FIRST"), marked_line(unrelated, "# SECOND")
    assert f"fresh dim made by tn.zeros at {FILE}:{first}:" in notes, ei.value.render()
    assert f"fresh dim made by tn.full at {FILE}:{second}:" in notes, ei.value.render()


@tn.kernel
def fresh_vs_tensor(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    a = x[tn.coord(0), tn.shape(4)]
    b = tn.zeros(f32, tn.shape(4))  # FIRST
    y(tn.coord(0), tn.shape(4)).store(a + b)  # ERR


def test_a_fresh_dim_is_named_even_without_a_label_clash():
    with pytest.raises(TypeCheckError, match="unrelated dims: d0 vs x.0") as ei:
        fresh_vs_tensor.program
    assert (f"'d0' is the fresh dim made by tn.zeros at {FILE}:"
            f"{marked_line(fresh_vs_tensor, '# FIRST')}:") in "\n".join(ei.value.notes)


@tn.kernel
def handle_as_index(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    for p in tn.parallel(tn.shape(4)):
        v = x[tn.coord(p), tn.shape(1)]  # ERR
        y(tn.coord(p.index()), tn.shape(1)).store(v)


def test_a_scope_handle_used_as_an_index_suggests_index():
    with pytest.raises(CaptureError, match="scope handle 'p'") as ei:
        handle_as_index.program
    e = ei.value
    assert "p.index()" in e.hint and names_line(e, marked_line(handle_as_index)), e.render()


def _shadowing():  # type: ignore[no-untyped-def]
    @tn.kernel
    def shadow(x: tn.Tensor[f32, "N C"], y: tn.Tensor[f32, "N C"], *, N=4):
        for p in tn.parallel(tn.shape(N)):
            v = x[tn.coord(p.index(), 0), tn.shape(1, 1)]
            y(tn.coord(p.index(), 0), tn.shape(1, 1)).store(v)

    return shadow


def test_a_shape_name_shadowing_a_constant_is_warned_at_the_kernel():
    k = _shadowing()
    with pytest.warns(TilenestWarning, match="names the extent 'N'.*constant 'N' \\(= 4\\)") as w:
        k.program
    assert len(w) == 1                               # once per name, not once per tensor
    assert w[0].filename == FILE and w[0].lineno == def_line(k)


def test_no_warning_without_shadowing():
    with warnings.catch_warnings():
        warnings.simplefilter("error", TilenestWarning)
        scaled.specialize(scale=1.0).program
        blocked.program


def test_a_compiled_kernel_takes_keyword_arguments():
    ck = scaled.compile(target="llvm")
    x = np.arange(6, dtype=np.float32)
    y = np.zeros(6, np.float32)
    ck(y=y, x=x, n=3)
    assert y.tolist() == [0, 2, 4, 0, 0, 0]
    with pytest.raises(TilenestError, match="has no argument 'scale'") as ei:
        ck(x, y, n=3, scale=1.0)
    assert "specialize" in ei.value.hint
    with pytest.raises(TilenestError, match="missing argument"):
        ck(x, n=3)


@tn.kernel
def broadcast_lookalike(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    a = tn.zeros(f32, tn.shape(4))  # FIRST
    b = tn.broadcast(a, tn.shape(4, 2), dims=(tn.dim("d0"), tn.dim("e")))  # ERR


def test_broadcast_to_a_lookalike_dim_says_which_is_which():
    with pytest.raises(TypeCheckError, match="lacks dim 'd0#1' of the source \\(target dims: "
                                             "d0#2, e\\)") as ei:
        broadcast_lookalike.program
    e = ei.value
    notes = "\n".join(e.notes)
    line = marked_line(broadcast_lookalike)
    assert (f"'d0#1' is the fresh dim made by tn.zeros at {FILE}:"
            f"{marked_line(broadcast_lookalike, '# FIRST')}:") in notes, e.render()
    assert f"'d0#2' is the dim made by tn.dim at {FILE}:{line}:" in notes, e.render()
    assert names_line(e, line)


@tn.kernel
def while_retyped(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    a = tn.zeros(f32, tn.shape(1))
    i = tn.scalar(0, tn.i32)
    while tn.while_(i < 3):  # ERR
        a = tn.zeros(f32, tn.shape(1))
        i = i + 1
    y(tn.coord(0), tn.shape(1)).store(a)


@tn.kernel
def if_retyped(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    s = tn.reduce(x[tn.coord(0), tn.shape(1)], x.dim(0), tn.add)
    if tn.if_(s > 0.0):  # ERR
        a = tn.zeros(f32, tn.shape(1))
    else:
        a = tn.full(f32, tn.shape(1), 1.0)
    y(tn.coord(0), tn.shape(1)).store(a)


@pytest.mark.parametrize("kern,needle", [
    (while_retyped, "the while loop changes the type of 'a' from f32[d0#1:1] to f32[d0#2:1]"),
    (if_retyped, "'a' has type f32[d0#1:1] in one branch of tn.if_ and f32[d0#2:1] in the other"),
])
def test_while_and_if_type_changes_name_both_types(kern, needle):
    with pytest.raises(TypeCheckError) as ei:
        kern.program
    e = ei.value
    assert needle in e.message and names_line(e, marked_line(kern)), e.render()
    assert sum("is the fresh dim made by tn." in n for n in e.notes) == 2, e.render()


@tn.kernel
def blocks_of(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, B=4):
    for p in tn.parallel(tn.shape(tn.cdiv(x.shape[0], B))):  # ERR
        y(tn.coord(p.index() * 4), tn.shape(4)).store(x(tn.coord(p.index() * 4), tn.shape(4)).load())


@pytest.mark.parametrize("b", [0, -4])
def test_cdiv_by_a_non_positive_constant_is_a_located_error(b):
    with pytest.raises(CaptureError, match=f"cdiv by {b}") as ei:
        blocks_of.specialize(B=b).program
    assert names_line(ei.value, marked_line(blocks_of)), ei.value.render()


def test_decorator_constants_do_not_force_early_annotation_evaluation():
    # a string annotation naming something defined after the kernel (as with
    # `from __future__ import annotations`) must not break the decorator
    def late(x: LATE_TENSOR, y: LATE_TENSOR, *, scale=1.0):  # noqa: F821
        y(tn.coord(0), tn.shape(x.shape[0])).store(x[tn.coord(0), tn.shape(x.shape[0])] * scale)

    kern = tn.kernel(scale=2.0)(late)
    late.__globals__["LATE_TENSOR"] = tn.Tensor[f32, "N"]
    try:
        x = np.arange(4, dtype=np.float32)
        y = np.zeros(4, np.float32)
        kern(x, y)
        assert y.tolist() == [0, 2, 4, 6]
    finally:
        del late.__globals__["LATE_TENSOR"]
