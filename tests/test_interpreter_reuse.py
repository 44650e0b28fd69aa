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
        self.history.setdefault(v.name, []).append(self.seen[v.name])


def _run(kernel, *arrays, **opts):
    """The (address, size) of each op's results, by op name (the last time each
    result was set)."""
    return _record(kernel, *arrays, **opts)[0]


def _every_result(kernel, op_name, *arrays, **opts):
    """The (address, size) of every result of ops ``op_name``, each time one was set."""
    history = _record(kernel, *arrays, **opts)[1]
    return [x for op in kernel.program.walk() if op.name == op_name
            for r in op.results for x in history.get(r.name, [])]


def _record(kernel, *arrays, **opts):
    it = _Recording(kernel.program, arrays, {}, Options(**({"fast": True} | opts)))
    it.seen, it.history = {}, {}
    it.run()
    by_op = {}
    for op in kernel.program.walk():
        for r in op.results:
            if r.name in it.seen:
                by_op.setdefault(op.name, []).append(it.seen[r.name])
    return by_op, it.history


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
    # the quotient dies at the store; each value dies after its definition
    (store,) = [k for k, op in enumerate(ops) if op.name == "tensor.store"]
    assert dies[ops[div].result.name] == store
    assert all(at < k for k, vs in plan.items() for _, at in vs)


def test_last_uses_of_arguments_inherited_names_and_values_read_by_a_region():
    # a loop body's carried argument and a name handed down by the op that runs
    # the block die at their last use (-1: held from the block's entry); a value
    # whose last use is a region op dies after that op
    prog = _pipelined_gemm().program
    (par,) = [op for op in prog.body.ops if op.regions]
    (loop,) = [op for op in par.regions[0].ops if op.name == "pipeline"]
    body = loop.regions[0]
    (carried,) = body.args
    load, compute = [op for op in body.ops if op.name == "stage"]
    dies = {n: (k, at) for k, vs in last_uses(body).items() for n, at in vs}
    assert dies[carried.name] == (body.ops.index(compute), -1)
    assert dies[load.results[0].name] == (body.ops.index(compute), body.ops.index(load))
    inner = compute.regions[0]
    (mma,) = [k for k, op in enumerate(inner.ops) if op.name == "mma"]
    got = {n: (k, at) for k, vs in last_uses(inner, frozenset({carried.name})).items()
           for n, at in vs}
    assert got[carried.name] == (mma, -1)
    assert carried.name not in {n for vs in last_uses(inner).values() for n, _ in vs}


def _pipelined_gemm():
    """The benchmarks' tiled GEMM: a pipelined K loop with load and compute stages."""
    from tilenest.bench.kernels import kernels

    return kernels()["gemm"].specialize(bm=64, bn=64, bk=32)


@tn.kernel
def _acc_read_after(A: tn.Tensor[f32, 2], B: tn.Tensor[f32, 2], C: tn.Tensor[f32, 2],
                    D: tn.Tensor[f32, 2], *, bk=32):
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    D = D.with_dims(m, n)
    acc = tn.zeros(f32, tn.shape(M, N), dims=(m, n))
    step = tn.zeros(f32, tn.shape(M, N), dims=(m, n))
    for kk in tn.serial(tn.shape(tn.cdiv(K, bk))):
        a = A[tn.coord(0, kk.index() * bk), tn.shape(M, bk), tn.bounds.zero]
        b = B[tn.coord(kk.index() * bk, 0), tn.shape(bk, N), tn.bounds.zero]
        new = tn.mma(a, b, acc, allow_reassociation=True)
        step = new - acc  # the old accumulator is read after the mma
        acc = new
    C(tn.coord(0, 0), tn.shape(M, N)).store(acc)
    D(tn.coord(0, 0), tn.shape(M, N)).store(step)


def _gemm_operands(m, n, k, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


@pytest.mark.skipif(not EXACT_REFCOUNTS, reason="this Python's reference counts may not "
                    "count every holder: nothing is reused")
def test_a_carried_accumulator_is_updated_in_its_own_array():
    # the K loop's accumulator dies at each step's mma (a loop argument handed to
    # the body, then to the compute stage): the product is added into its array
    A, B = _gemm_operands(256, 256, 256)
    C = np.zeros((256, 256), np.float32)
    steps = _every_result(_pipelined_gemm(), "mma", A, B, C)
    assert len(steps) == 256 // 32
    # the first step's accumulator is the broadcast zero tile (no array of its own)
    assert len({addr for addr, _ in steps[1:]}) == 1
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-4, atol=1e-3)


def test_an_accumulator_read_after_its_mma_keeps_its_values():
    A, B = _gemm_operands(128, 160, 96, seed=1)
    C, D = np.zeros((128, 160), np.float32), np.zeros((128, 160), np.float32)
    steps = _every_result(_acc_read_after, "mma", A, B, C, D)
    assert len({addr for addr, _ in steps}) == len(steps)  # a fresh array each time
    want = A.astype(np.float64) @ B
    np.testing.assert_allclose(C, want, rtol=1e-4, atol=1e-3)
    last = A[:, 64:].astype(np.float64) @ B[64:]
    np.testing.assert_allclose(D, last, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("schedule", ["batched", "canonical"])
def test_in_place_accumulation_agrees_with_the_reference_order(schedule):
    # fast mode's in-place BLAS products give an admitted result: within the
    # oracle's bounds of the exact interpreter run
    A, B = _gemm_operands(200, 136, 100, seed=2)  # ragged: zero-padded tiles
    C = np.zeros((200, 136), np.float32)
    gemm = _pipelined_gemm()
    tn.interpret(gemm, A, B, C, fast=True, schedule=schedule)
    ref = tn.reference(gemm, A, B, np.zeros((200, 136), np.float32))
    verdict = ref.admits(C)
    assert verdict.ok, verdict


@tn.kernel
def _minus_c(A: tn.Tensor[f32, 2], B: tn.Tensor[f32, 2], C: tn.Tensor[f32, 2],
             D: tn.Tensor[f32, 2], *, bm=128, bn=128):
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    D = D.with_dims(m, n)
    for p in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
        i, j = p.index(0), p.index(1)
        a = A[tn.coord(i * bm, 0), tn.shape(bm, K), tn.bounds.zero]
        b = B[tn.coord(0, j * bn), tn.shape(K, bn), tn.bounds.zero]
        c = C[tn.coord(i * bm, j * bn), tn.shape(bm, bn), tn.bounds.zero]
        D(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(tn.mma(a, b, -c))


@pytest.mark.parametrize("schedule", ["batched", "canonical"])
def test_an_accumulator_viewing_integer_bits_is_not_accumulated_into(schedule):
    # -c is computed on c's bits: an f32 view of a fresh uint32 array, which dies at
    # the mma; the product must not be added into the integer array
    A, B = _gemm_operands(256, 256, 64, seed=3)
    C = np.random.default_rng(4).standard_normal((256, 256)).astype(np.float32)
    D = np.zeros((256, 256), np.float32)
    tn.interpret(_minus_c, A, B, C, D, fast=True, schedule=schedule)
    verdict = tn.reference(_minus_c, A, B, C, np.zeros_like(D)).admits(D)
    assert verdict.ok, verdict
    np.testing.assert_allclose(D, A.astype(np.float64) @ B - C, rtol=1e-4, atol=1e-4)


@tn.kernel
def _cursor(X: tn.Tensor[f32, 2], Y: tn.Tensor[f32, 2]):
    R, C = X.shape
    r, c = X.dims()
    Y = Y.with_dims(r, c)
    for p in tn.parallel(tn.shape(1)):
        pos = tn.scalar(0, tn.i32)
        acc = tn.zeros(f32, tn.shape(1, C), dims=(r, c))
        for kk in p.pipeline(tn.shape(R // 2), tn.pipeline_policy(window=2)):
            kk.stage("load")
            nxt = pos + 2  # the last use of the carried pos as an operand...
            kk.stage("compute")
            acc = acc + X[tn.coord(pos, 0), tn.shape(1, C)]  # ...but an index reads it
            pos = nxt
        Y(tn.coord(0, 0), tn.shape(1, C)).store(acc)


@pytest.mark.parametrize("fast", [True, False])
def test_a_value_read_only_by_an_index_lives_until_that_read(fast):
    X = np.arange(32, dtype=np.float32).reshape(8, 4)
    Y = np.zeros((8, 4), np.float32)
    tn.interpret(_cursor, X, Y, fast=fast)
    np.testing.assert_array_equal(Y[0], X[::2].sum(axis=0))
