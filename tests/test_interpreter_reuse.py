"""The interpreter writes an elementwise result into the array of an operand it
reads for the last time (``Interpreter.reusable``), and never into one that
anything else still holds: a view of it taken by a live value, a value that is
read later, or a caller's tensor."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.interpreter.core import (EXACT_REFCOUNTS, REUSE_BYTES, Interpreter, Options,
                                       last_uses)


@tn.kernel
def _softmax(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        e = tn.exp(row - tn.reduce(row, row.dim(1), tn.maximum))
        y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(e / tn.reduce(e, e.dim(1), tn.add))


@tn.kernel
def _viewed(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "C R"], z: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    t = x[tn.coord(0, 0), tn.shape(rows, cols)] + 1.0
    u = tn.permute(t, (1, 0))  # a view of t's array, stored after t's last use
    z(tn.coord(0, 0), tn.shape(rows, cols)).store(tn.exp(t))
    y(tn.coord(0, 0), tn.shape(cols, rows)).store(u)


@tn.kernel
def _twice(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"], z: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    t = x[tn.coord(0, 0), tn.shape(rows, cols)] * 2.0
    z(tn.coord(0, 0), tn.shape(rows, cols)).store(tn.exp(t))
    y(tn.coord(0, 0), tn.shape(rows, cols)).store(t - 1.0)  # t is read again here


class _Recording(Interpreter):
    """Notes where each value's array lies (without holding the array, which
    would keep it from being reused)."""

    def set(self, v, rv):
        super().set(v, rv)
        self.seen[v.name] = (rv.a.ctypes.data, rv.a.nbytes)


def _run(kernel, *arrays, **opts):
    """The (address, size) of each op's results, by op name."""
    it = _Recording(kernel.program, arrays, {}, Options(**({"fast": True} | opts)))
    it.seen = {}
    it.run()
    by_op = {}
    for op in kernel.program.walk():
        for r in op.results:
            if r.name in it.seen:
                by_op.setdefault(op.name, []).append(it.seen[r.name])
    return by_op


def _rows(n=256):
    # one row of f32 per instance, all rows together: n * n * 4 bytes
    assert n * n * 4 >= REUSE_BYTES
    return np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)


@pytest.mark.skipif(not EXACT_REFCOUNTS, reason="this Python's reference counts may not "
                    "count every holder: nothing is reused")
def test_the_softmax_chain_writes_each_result_into_the_dead_operand():
    x = _rows()
    y = np.zeros_like(x)
    by_op = _run(_softmax, x, y)
    (sub,), (exp,), (div,) = by_op["sub"], by_op["exp"], by_op["div"]
    # exp overwrites row - max, and the division overwrites exp's result
    assert exp == sub and div == exp
    e = np.exp((x - x.max(axis=1, keepdims=True)).astype(np.float64))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-6)


def test_an_oracle_run_keeps_the_operands_its_bounds_are_made_from():
    # the ulp bound of exp is computed from exp's operand after exp's result:
    # writing the result over the operand would bound the wrong values
    x = _rows()
    y = np.zeros_like(x)
    by_op = _run(_softmax, x, y, fast=False, oracle=True)
    assert by_op["exp"][0][0] != by_op["sub"][0][0]
    assert by_op["div"][0][0] != by_op["exp"][0][0]


def test_a_live_view_keeps_the_array_it_views():
    x = _rows()
    y, z = np.zeros_like(x), np.zeros_like(x)
    by_op = _run(_viewed, x, y, z)
    assert by_op["exp"][0][0] != by_op["add"][0][0]
    np.testing.assert_array_equal(y, (x + np.float32(1)).T)
    np.testing.assert_allclose(z, np.exp((x + np.float32(1)).astype(np.float64)), rtol=1e-6)


def test_a_value_read_later_is_not_overwritten():
    x = _rows()
    y, z = np.zeros_like(x), np.zeros_like(x)
    by_op = _run(_twice, x, y, z)
    assert by_op["exp"][0][0] != by_op["mul"][0][0]
    t = x * np.float32(2)
    np.testing.assert_array_equal(y, t - np.float32(1))
    np.testing.assert_allclose(z, np.exp(t.astype(np.float64)), rtol=1e-6)


def test_a_callers_tensor_is_never_written_by_a_value_op():
    x = _rows()
    keep = x.copy()
    y = np.zeros_like(x)
    _run(_softmax, x, y)
    np.testing.assert_array_equal(x, keep)


def test_last_uses_count_reads_in_nested_regions_and_the_yield():
    prog = _softmax.program
    (par,) = [op for op in prog.body.ops if op.regions]
    body = par.regions[0]
    plan = last_uses(body)
    dies = {n: k for k, vs in plan.items() for n, _ in vs}
    ops = body.ops
    # the loaded row is read by the max's region and last by the subtraction
    (load,) = [op for op in ops if op.name == "tensor.load"]
    (sub,) = [k for k, op in enumerate(ops) if op.name == "sub"]
    assert dies[load.result.name] == sub
    # exp's result is read by the sum's region and last by the division
    (exp,) = [op for op in ops if op.name == "exp"]
    (div,) = [k for k, op in enumerate(ops) if op.name == "div"]
    assert dies[exp.result.name] == div
    # no value dies at a region op, and each dies after its definition
    assert all(not ops[k].regions for k in plan)
    assert all(at < k for k, vs in plan.items() for _, at in vs)
