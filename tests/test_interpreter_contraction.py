"""Loops that only accumulate reassociating ``mma``s run, in ``fast`` mode, as
one contraction over the loop and the ``mma``'s own contraction dims
(interpreter/contraction.py). Their results are admitted by the oracle, their
reads are checked for races like the one-by-one run's, and loops the rule
does not cover run one by one, bit for bit as before."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import bf16, f32
from tilenest.errors import RaceError
from tilenest.interpreter import interpret, reference
from tilenest.interpreter.core import Interpreter, Options
from tilenest.semantics.arrays import host_arguments


@tn.kernel
def tiled(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], C: tn.Tensor[f32, "M N"], *,
          bm=32, bn=32, bk=32, reassoc=True, staged=True):
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    for p in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
        i, j = p.index(0), p.index(1)
        acc = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
        if staged:
            for kk in p.pipeline(tn.shape(tn.cdiv(K, bk)), tn.pipeline_policy(window=2)):
                kk.stage("load")
                a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
                b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
                kk.stage("compute")
                acc = tn.mma(a, b, acc, allow_reassociation=reassoc)
        else:
            for kk in p.serial(tn.shape(tn.cdiv(K, bk)), order="reverse"):
                a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
                b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
                acc = tn.mma(a, b, acc, allow_reassociation=reassoc)
        C(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(acc)


@tn.kernel
def two_products(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], G: tn.Tensor[f32, "K N"],
                 C: tn.Tensor[f32, "M N"], D: tn.Tensor[f32, "M N"], *, bm=16, bk=16):
    """Two accumulators sharing the A tile (SwiGLU's shape), one row block each."""
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B, G = B.with_dims(k, n), G.with_dims(k, n)
    C, D = C.with_dims(m, n), D.with_dims(m, n)
    for p in tn.parallel(tn.shape(tn.cdiv(M, bm))):
        x = tn.zeros(f32, tn.shape(bm, N), dims=(m, n))
        y = tn.zeros(f32, tn.shape(bm, N), dims=(m, n))
        for kk in p.serial(tn.shape(tn.cdiv(K, bk))):
            a = A[tn.coord(p.index() * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
            b = B[tn.coord(kk.index() * bk, 0), tn.shape(bk, N), tn.bounds.zero]
            g = G[tn.coord(kk.index() * bk, 0), tn.shape(bk, N), tn.bounds.zero]
            x = tn.mma(a, b, x, allow_reassociation=True)
            y = tn.mma(a, g, y, allow_reassociation=True)
        C(tn.coord(p.index() * bm, 0), tn.shape(bm, N)).store(x)
        D(tn.coord(p.index() * bm, 0), tn.shape(bm, N)).store(y)


@tn.kernel
def batched(A: tn.Tensor[f32, "H M K"], B: tn.Tensor[f32, "H K N"], C: tn.Tensor[f32, "H M N"],
            *, bk=8):
    """An mma with a batch dim (the heads): the einsum form of the contraction."""
    H, M, K = A.shape
    N = B.shape[2]
    h, m, k = A.dims()
    n = C.dim(2)
    B = B.with_dims(h, k, n)
    C = C.with_dims(h, m, n)
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(f32, tn.shape(H, M, N), dims=(h, m, n))
        for kk in p.serial(tn.shape(tn.cdiv(K, bk))):
            a = A[tn.coord(0, 0, kk.index() * bk), tn.shape(H, M, bk), tn.bounds.zero]
            b = B[tn.coord(0, kk.index() * bk, 0), tn.shape(H, bk, N), tn.bounds.zero]
            acc = tn.mma(a, b, acc, allow_reassociation=True)
        C(tn.coord(0, 0, 0), tn.shape(H, M, N)).store(acc)


@tn.kernel
def damped(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], C: tn.Tensor[f32, "M N"], *,
           bk=8):
    """The carried value is the product scaled: not a sum of products."""
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(f32, tn.shape(M, N), dims=(m, n))
        for kk in p.serial(tn.shape(tn.cdiv(K, bk))):
            a = A[tn.coord(0, kk.index() * bk), tn.shape(M, bk), tn.bounds.zero]
            b = B[tn.coord(kk.index() * bk, 0), tn.shape(bk, N), tn.bounds.zero]
            acc = tn.mma(a, b, acc, allow_reassociation=True) * 0.5
        C(tn.coord(0, 0), tn.shape(M, N)).store(acc)


@tn.kernel
def narrow(A: tn.Tensor[bf16, "M K"], B: tn.Tensor[bf16, "K N"], C: tn.Tensor[bf16, "M N"], *,
           bk=16):
    """A bf16 accumulator: fast mode rounds it per mma, so the loop stays a loop."""
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(bf16, tn.shape(M, N), dims=(m, n))
        for kk in p.serial(tn.shape(tn.cdiv(K, bk))):
            a = A[tn.coord(0, kk.index() * bk), tn.shape(M, bk), tn.bounds.zero]
            b = B[tn.coord(kk.index() * bk, 0), tn.shape(bk, N), tn.bounds.zero]
            acc = tn.mma(a, b, acc, allow_reassociation=True)
        C(tn.coord(0, 0), tn.shape(M, N)).store(acc)


_FAST = {"fast": True, "poison": False}


def _run(kernel, args, **kw):
    """The interpreter's output arrays and how many loop iterations it batched."""
    prog = kernel.program
    work = [a.copy() for a in args]
    host = host_arguments(prog, work)
    it = Interpreter(prog, host, {}, Options(**kw))
    with np.errstate(all="ignore"):
        it.run()
    return work, it.batched_iterations


def _inputs(*shapes, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("staged", [True, False], ids=["pipeline", "reverse-serial"])
def test_tiled_gemm_loop_is_one_contraction_admitted_by_the_oracle(staged):
    # ragged in every dim: the zero-padded edge tiles are part of the sum
    A, B = _inputs((70, 100), (100, 50))
    C = np.zeros((70, 50), np.float32)
    k = tiled.specialize(staged=staged)
    (_, _, got), n = _run(k, (A, B, C), **_FAST)
    assert n == 4  # the four K steps, for all six programs at once
    ok = reference(k, A, B, C).admits(got)
    assert ok, ok
    np.testing.assert_allclose(got, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-4)


def test_only_fast_mode_groups_the_loop():
    A, B = _inputs((64, 64), (64, 64))
    C = np.zeros((64, 64), np.float32)
    (_, _, exact), n = _run(tiled, (A, B, C))
    assert n == 0  # the reference order: one mma per step
    (_, _, fast), n = _run(tiled, (A, B, C), **_FAST, oracle=True)
    assert n == 0  # the oracle's bounds follow the steps
    (_, _, unbatched), n = _run(tiled, (A, B, C), **_FAST, batch=False)
    assert n == 0
    assert np.array_equal(fast, unbatched)


def test_two_accumulators_sharing_an_operand():
    A, B, G = _inputs((40, 48), (48, 24), (48, 24))
    C, D = np.zeros((40, 24), np.float32), np.zeros((40, 24), np.float32)
    (_, _, _, x, y), n = _run(two_products, (A, B, G, C, D), **_FAST)
    assert n == 3
    np.testing.assert_allclose(x, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(y, A.astype(np.float64) @ G, rtol=1e-5, atol=1e-4)


def test_batch_dims_contract_with_the_loop():
    A, B = _inputs((3, 5, 20), (3, 20, 7))
    C = np.zeros((3, 5, 7), np.float32)
    (_, _, got), n = _run(batched, (A, B, C), **_FAST)
    assert n == 3
    ok = reference(batched, A, B, C).admits(got)
    assert ok, ok


@pytest.mark.parametrize("kernel,args", [
    (tiled.specialize(reassoc=False),
     (*_inputs((64, 64), (64, 64)), np.zeros((64, 64), np.float32))),
    (damped, (*_inputs((8, 24), (24, 8)), np.zeros((8, 8), np.float32))),
    (narrow, (*_inputs((8, 48), (48, 8), dtype=np.float32),
              np.zeros((8, 8), np.float32))),
], ids=["no-reassociation", "scaled-accumulator", "bf16-accumulator"])
def test_loops_outside_the_rule_run_step_by_step(kernel, args):
    import ml_dtypes

    if kernel is narrow:
        args = tuple(a.astype(ml_dtypes.bfloat16) for a in args)
    got, n = _run(kernel, args, **_FAST)
    assert n == 0
    same, _ = _run(kernel, args, **_FAST, batch=False)
    assert all(np.array_equal(x, y, equal_nan=True) for x, y in zip(got, same))


@tn.kernel
def racy(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], C: tn.Tensor[f32, "M N"]):
    """Each program overwrites a tile of A that the other's loop reads."""
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    for p in tn.parallel(tn.shape(2)):
        acc = tn.zeros(f32, tn.shape(M, N), dims=(m, n))
        for kk in p.serial(tn.shape(tn.cdiv(K, 4))):
            a = A[tn.coord(0, kk.index() * 4), tn.shape(M, 4), tn.bounds.zero]
            b = B[tn.coord(kk.index() * 4, 0), tn.shape(4, N), tn.bounds.zero]
            acc = tn.mma(a, b, acc, allow_reassociation=True)
        C(tn.coord(0, 0), tn.shape(M, N)).store(acc)
        A(tn.coord(0, 4 * p.index()), tn.shape(M, 4)).store(
            tn.zeros(f32, tn.shape(M, 4), dims=(m, k)))


def test_batched_reads_are_checked_for_races():
    A, B = _inputs((4, 8), (8, 4))
    C = np.zeros((4, 4), np.float32)
    errors = []
    for batch in (True, False):
        with pytest.raises(RaceError) as e:
            interpret(racy, A.copy(), B.copy(), C.copy(), fast=True, batch=batch)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
