"""Tree ``reduce`` regions of ``mma`` updates under ``contract=tn.add`` (R-9)
run, in ``fast`` mode, as one contraction over the iterations and the
``mma``'s own contraction dims (interpreter/contraction.py). Their results are
admitted by the oracle, their reads are checked for races like the
one-by-one run's, and what the rule does not cover (``serial`` and
``pipeline`` loops, whose iterations are ordered) runs one product per
iteration, bit for bit as before."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import bf16, f32
from tilenest.errors import RaceError
from tilenest.interpreter import interpret, reference
from tilenest.interpreter import contraction
from tilenest.interpreter.core import Interpreter, Options
from tilenest.semantics.arrays import host_arguments


@tn.kernel
def tiled(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], C: tn.Tensor[f32, "M N"], *,
          bm=32, bn=32, bk=32, reassoc=True, form="reduce"):
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    for p in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
        i, j = p.index(0), p.index(1)
        acc = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
        if form == "pipeline":
            for kk in p.pipeline(tn.shape(tn.cdiv(K, bk)), tn.pipeline_policy(window=2)):
                kk.stage("load")
                a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
                b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
                kk.stage("compute")
                acc = tn.mma(a, b, acc, allow_reassociation=reassoc)
        elif form == "serial":
            for kk in p.serial(tn.shape(tn.cdiv(K, bk))):
                a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
                b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
                acc = tn.mma(a, b, acc, allow_reassociation=reassoc)
        elif form == "ordered":
            for kk in tn.reduce(tn.shape(tn.cdiv(K, bk)), contract=tn.add,
                                policy=tn.ordered_tree):
                a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
                b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
                acc = tn.mma(a, b, acc, allow_reassociation=reassoc)
        else:
            for kk in tn.reduce(tn.shape(tn.cdiv(K, bk)), contract=tn.add):
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
        for kk in tn.reduce(tn.shape(tn.cdiv(K, bk)), contract=tn.add):
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
        for kk in tn.reduce(tn.shape(tn.cdiv(K, bk)), contract=tn.add):
            a = A[tn.coord(0, 0, kk.index() * bk), tn.shape(H, M, bk), tn.bounds.zero]
            b = B[tn.coord(0, kk.index() * bk, 0), tn.shape(H, bk, N), tn.bounds.zero]
            acc = tn.mma(a, b, acc, allow_reassociation=True)
        C(tn.coord(0, 0, 0), tn.shape(H, M, N)).store(acc)


@tn.kernel
def added(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], C: tn.Tensor[f32, "M N"], *,
           bk=8):
    """The state is updated by an add of a product: not an mma update (the
    reduce batching's own fold covers it)."""
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(f32, tn.shape(M, N), dims=(m, n))
        for kk in tn.reduce(tn.shape(tn.cdiv(K, bk)), contract=tn.add):
            a = A[tn.coord(0, kk.index() * bk), tn.shape(M, bk), tn.bounds.zero]
            b = B[tn.coord(kk.index() * bk, 0), tn.shape(bk, N), tn.bounds.zero]
            acc = acc + tn.mma(a, b, tn.zeros(f32, tn.shape(M, N), dims=(m, n)),
                               allow_reassociation=True)
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
        for kk in tn.reduce(tn.shape(tn.cdiv(K, bk)), contract=tn.add):
            a = A[tn.coord(0, kk.index() * bk), tn.shape(M, bk), tn.bounds.zero]
            b = B[tn.coord(kk.index() * bk, 0), tn.shape(bk, N), tn.bounds.zero]
            acc = tn.mma(a, b, acc, allow_reassociation=True)
        C(tn.coord(0, 0), tn.shape(M, N)).store(acc)


_FAST = {"fast": True, "poison": False}


def _run(kernel, args, **kw):
    """The interpreter's output arrays, and how many (iteration, accumulator)
    pairs it added by contraction (the batch sizes of the
    ``contraction._contract`` calls, one call per accumulator and batch)."""
    prog = kernel.program
    work = [a.copy() for a in args]
    host = host_arguments(prog, work)
    it = Interpreter(prog, host, {}, Options(**kw))
    seen = []
    real = contraction._contract

    def counted(it_, m, b, s):
        seen.append(b.n)
        return real(it_, m, b, s)

    contraction._contract = counted
    try:
        with np.errstate(all="ignore"):
            it.run()
    finally:
        contraction._contract = real
    return work, sum(seen)


def _inputs(*shapes, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def test_split_k_reduce_is_one_contraction_admitted_by_the_oracle():
    # ragged in every dim: the zero-padded edge tiles are part of the sum
    A, B = _inputs((70, 100), (100, 50))
    C = np.zeros((70, 50), np.float32)
    (_, _, got), n = _run(tiled, (A, B, C), **_FAST)
    assert n == 4  # the four K steps, for all six programs at once
    ok = reference(tiled, A, B, C).admits(got)
    assert ok, ok
    np.testing.assert_allclose(got, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("form", ["pipeline", "serial", "ordered"])
def test_ordered_loops_keep_one_product_per_iteration(form):
    # their iterations are ordered: each mma regroups only its own sum;
    # an ordered_tree reduce keeps the contributions' order, which one product
    # over both sums need not
    A, B = _inputs((70, 100), (100, 50))
    C = np.zeros((70, 50), np.float32)
    k = tiled.specialize(form=form)
    (_, _, got), n = _run(k, (A, B, C), **_FAST)
    assert n == 0
    (_, _, same), _ = _run(k, (A, B, C), **_FAST, batch=False)
    assert np.array_equal(got, same)


def test_only_fast_mode_groups_the_iterations():
    A, B = _inputs((64, 64), (64, 64))
    C = np.zeros((64, 64), np.float32)
    (_, _, exact), n = _run(tiled, (A, B, C))
    assert n == 0  # the canonical tree: one mma per step
    (_, _, canonical), _ = _run(tiled, (A, B, C), batch=False)
    assert np.array_equal(exact, canonical)
    _, n = _run(tiled, (A, B, C), **_FAST, oracle=True)
    assert n == 0  # the oracle's bounds follow the steps
    _, n = _run(tiled, (A, B, C), **_FAST, batch=False)
    assert n == 0


def test_two_accumulators_sharing_an_operand():
    A, B, G = _inputs((40, 48), (48, 24), (48, 24))
    C, D = np.zeros((40, 24), np.float32), np.zeros((40, 24), np.float32)
    (_, _, _, x, y), n = _run(two_products, (A, B, G, C, D), **_FAST)
    assert n == 2 * 3  # three K steps for each accumulator
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
    (added, (*_inputs((8, 24), (24, 8)), np.zeros((8, 8), np.float32))),
    (narrow, (*_inputs((8, 48), (48, 8), dtype=np.float32),
              np.zeros((8, 8), np.float32))),
], ids=["no-reassociation", "add-of-a-product", "bf16-accumulator"])
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
        for kk in tn.reduce(tn.shape(tn.cdiv(K, 4)), contract=tn.add):
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


@tn.kernel
def write_then_read(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"],
                    C: tn.Tensor[f32, "M N"]):
    """Each program writes a tile of A, then its reduce reads all of A."""
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    for p in tn.parallel(tn.shape(2)):
        A(tn.coord(0, 4 * p.index()), tn.shape(M, 4)).store(
            tn.zeros(f32, tn.shape(M, 4), dims=(m, k)))
        acc = tn.zeros(f32, tn.shape(M, N), dims=(m, n))
        for kk in tn.reduce(tn.shape(tn.cdiv(K, 4)), contract=tn.add):
            a = A[tn.coord(0, kk.index() * 4), tn.shape(M, 4), tn.bounds.zero]
            b = B[tn.coord(kk.index() * 4, 0), tn.shape(4, N), tn.bounds.zero]
            acc = tn.mma(a, b, acc, allow_reassociation=True)
        C(tn.coord(0, 0), tn.shape(M, N)).store(acc)


def test_a_batched_read_of_a_written_element_is_the_one_by_one_race():
    A, B = _inputs((4, 8), (8, 4))
    C = np.zeros((4, 4), np.float32)
    errors = []
    for batch in (True, False):
        with pytest.raises(RaceError) as e:
            interpret(write_then_read, A.copy(), B.copy(), C.copy(), fast=True, batch=batch)
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def test_checked_batched_reads_are_recorded_as_boxes(monkeypatch):
    # the race check of a batch of affine reads folds them as boxes, as the
    # one-by-one reads are, not element by element (EffectLog._box_read)
    from tilenest.interpreter.effects import EffectLog

    def listed(*a, **k):
        raise AssertionError("batched affine reads listed element by element")

    monkeypatch.setattr(EffectLog, "_merged", listed)
    A, B = _inputs((96, 64), (64, 96))
    C = np.zeros((96, 96), np.float32)
    interpret(tiled, A, B, C, fast=True)
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-4)


def test_a_reduce_outside_the_rule_still_batches_in_fast_mode():
    # the contraction's planner and the reduce batching's keep separate plans:
    # a region sum that is no mma update is batched by the latter
    from tilenest.bench.interpreter import _region_sum

    k = _region_sum()
    x = _inputs((5000,))[0]
    y = np.zeros(1, np.float32)
    prog = k.program
    host = host_arguments(prog, [x, y])
    it = Interpreter(prog, host, {}, Options(fast=True, poison=False))
    it.run()
    assert it.batched_iterations == x.size
    np.testing.assert_allclose(y, x.sum(dtype=np.float64), rtol=1e-4)


@tn.kernel
def crossed(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], C: tn.Tensor[f32, "M N"]):
    """Program p reads its own 4 rows of A in its reduce (a box per program),
    then overwrites the other program's rows."""
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    for p in tn.parallel(tn.shape(2)):
        acc = tn.zeros(f32, tn.shape(4, N), dims=(m, n))
        for kk in tn.reduce(tn.shape(tn.cdiv(K, 4)), contract=tn.add):
            a = A[tn.coord(4 * p.index(), kk.index() * 4), tn.shape(4, 4), tn.bounds.zero]
            b = B[tn.coord(kk.index() * 4, 0), tn.shape(4, N), tn.bounds.zero]
            acc = tn.mma(a, b, acc, allow_reassociation=True)
        C(tn.coord(4 * p.index(), 0), tn.shape(4, N)).store(acc)
        A(tn.coord(4 - 4 * p.index(), 0), tn.shape(4, K)).store(
            tn.zeros(f32, tn.shape(4, K), dims=(m, k)))


def test_per_program_batched_reads_race_as_one_by_one():
    A, B = _inputs((8, 12), (12, 4))
    C = np.zeros((8, 4), np.float32)
    errors = []
    for batch in (True, False):
        with pytest.raises(RaceError) as e:
            interpret(crossed, A.copy(), B.copy(), C.copy(), fast=True, batch=batch)
        errors.append(str(e.value))
    assert errors[0] == errors[1]
    assert "instance (0,) writes A[4, 0]" in errors[0] and "instance (1,) reads it" in errors[0]
