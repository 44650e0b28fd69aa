"""Policies, orders and exec scopes given by name, and what a failed capture
leaves behind: the documented names are accepted as strings everywhere such
a value is taken, anything else is a capture error at the user's line, and a
kernel whose capture failed raises that same error on every later use."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import tilenest as tn
from tilenest import cli, f32
from tilenest.errors import CaptureError


def _line(fn, marker: str) -> int:
    src, first = inspect.getsourcelines(fn)
    return next(first + i for i, line in enumerate(src) if marker in line)


def _rowsum(policy):
    @tn.kernel
    def rowsum(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 1]):
        rows, cols = x.shape
        for p in tn.parallel(tn.shape(rows)):
            row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
            s = tn.reduce(row, row.dim(1), tn.add, policy=policy)  # HERE
            y(tn.coord(p.index()), tn.shape(1)).store(s)
    return rowsum


@pytest.mark.parametrize("name", ["fold_left", "fold_right", "ordered_tree", "unordered_tree"])
def test_expression_reduce_takes_the_policy_name(name):
    k = _rowsum(name)
    attrs = [op.attrs["policy"] for op in k.program.walk() if op.name == "reduce"]
    assert attrs == [getattr(tn, name)]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.zeros(3, np.float32)
    k(x, y)
    assert y.tolist() == x.sum(axis=1).tolist()


def test_a_wrong_policy_name_is_located_and_stays_the_error():
    k = _rowsum("fold_lefty")
    x = np.ones((3, 4), np.float32)
    errors = []
    for use in (lambda: k.program, lambda: k(x, np.zeros(3, np.float32)),
                lambda: tn.interpret(k, x, np.zeros(3, np.float32)), lambda: k.ir()):
        with pytest.raises(CaptureError, match="'fold_lefty' is not a reduction policy") as e:
            use()
        errors.append(e.value)
    assert all(e is errors[0] for e in errors)  # the capture's own error, every time
    assert errors[0].sites[0].line == _line(_rowsum, "# HERE")
    assert "tn.fold_left" in errors[0].hint


def test_show_of_a_string_policy_kernel(tmp_path, capsys):
    f = tmp_path / "k.py"
    f.write_text(inspect.getsource(_rowsum).replace("def _rowsum(policy):", "if True:")
                 .replace("policy=policy", 'policy="fold_left"')
                 .replace("    return rowsum\n", "")
                 .replace("@tn.kernel", "import tilenest as tn\n    from tilenest import f32\n"
                          "    @tn.kernel"))
    assert cli.main(["show", str(f)]) == 0  # was: exit 70, 'str' has no attribute 'is_tree'
    assert "policy = fold_left" in capsys.readouterr().out


def test_an_internal_attribute_error_in_capture_is_not_hidden(monkeypatch):
    """An AttributeError out of capture (a bug) must not read as "the kernel
    has no attribute 'program'" to ``getattr(k, "program", k)`` callers."""
    from tilenest.frontend import kernel as K

    def broken(*a, **kw):
        raise AttributeError("'str' object has no attribute 'is_tree'")

    monkeypatch.setattr(K, "capture", broken)
    k = _rowsum("fold_left")
    x = np.ones((3, 4), np.float32)
    for _ in range(2):
        with pytest.raises(RuntimeError, match="is_tree"):
            tn.interpret(k, x, np.zeros(3, np.float32))


def _region_kernel(**region_kw):
    kind = region_kw.pop("kind")

    @tn.kernel
    def k(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        if kind == "serial":
            for p in tn.serial(tn.shape(n), **region_kw):  # HERE
                y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])
        elif kind == "parallel":
            for p in tn.parallel(tn.shape(n), **region_kw):  # HERE
                y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])
        else:
            acc = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
            for r in tn.reduce(tn.shape(n), **region_kw):  # HERE
                acc = acc + x[tn.coord(r.index()), tn.shape(1)]
            y(tn.coord(0), tn.shape(1)).store(acc)
    return k


@pytest.mark.parametrize("kw,attr,want", [
    ({"kind": "parallel", "exec": "warp"}, "exec", tn.exec.warp),
    ({"kind": "parallel", "exec": "tn.exec.block"}, "exec", tn.exec.block),
    ({"kind": "serial", "order": "reverse"}, "order", "reverse"),
    ({"kind": "reduce", "policy": "fold_right"}, "policy", tn.fold_right),
    ({"kind": "reduce", "contract": "add", "policy": "ordered_tree"}, "policy", tn.ordered_tree),
])
def test_region_constructors_take_names(kw, attr, want):
    k = _region_kernel(**kw)
    region = next(op for op in k.program.walk() if op.name in ("parallel", "serial", "reduce"))
    assert region.attrs[attr] == want


@pytest.mark.parametrize("kw,needle", [
    ({"kind": "parallel", "exec": "wrap"}, "'wrap' is not an execution scope"),
    ({"kind": "parallel", "exec": 3}, "3 is not an execution scope"),
    ({"kind": "serial", "order": "backward"}, "'backward' is not a serial order"),
    ({"kind": "serial", "order": ["reverse"]}, "a list is not a serial order"),
    ({"kind": "reduce", "policy": "tree"}, "'tree' is not a reduction policy"),
    ({"kind": "reduce", "policy": 1}, "1 is not a reduction policy"),
])
def test_wrong_names_are_capture_errors_at_the_region(kw, needle):
    k = _region_kernel(**kw)
    with pytest.raises(CaptureError, match=needle) as e:
        _ = k.program
    lines = {_line(_region_kernel, "# HERE") + d for d in range(0, 12)}
    assert e.value.sites and e.value.sites[0].line in lines


def test_pipeline_and_mma_policies_are_checked():
    @tn.kernel
    def k(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        for p in tn.pipeline(tn.shape(n), policy="double"):
            y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])

    with pytest.raises(CaptureError, match="'double' is not a pipeline policy"):
        _ = k.program

    @tn.kernel
    def m(a: tn.Tensor[f32, 2], c: tn.Tensor[f32, 2]):
        t = a[tn.coord(0, 0), tn.shape(2, 2)]
        c(tn.coord(0, 0), tn.shape(2, 2)).store(tn.mma(t, t, t, policy="exact"))

    with pytest.raises(CaptureError, match="'exact' is not an mma policy"):
        _ = m.program
