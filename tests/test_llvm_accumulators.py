"""Accumulator tiles filled and stored by their ``mma`` micro-kernels (CPU).

``lowering/accumulators.py``: a loop that sums into a constant-filled tile
with ``mma`` and then stores the tile into a tensor nothing else touches has
the fill done by each micro-tile at the first step and the store at the
last, while the values are in registers; the fill and the store keep their
own code for a loop without steps. These tests pin where the folds apply
(and where they must not), and that the results stay the interpreter's bit
for bit, for ragged tiles, K not a multiple of the step, no step at all,
fill constants other than zero, and several threads.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.errors import TilenestError
from tilenest.lowering import loopir as L


def accumulating_gemm(loop: str = "pipeline", init: float = 0.0, store_bounds=None,
                      reads_c: bool = False, reassoc: bool = False):
    """``C = init + A @ B`` (``reads_c``: ``C += A @ B``) in tiles of
    ``bm x bn``, its K loop a ``pipeline``, a ``serial`` region (``"reverse"``:
    run backwards) or a ``reduce`` folding left (``"reduce_right"``: right),
    the result stored with ``store_bounds``."""
    sb = store_bounds if store_bounds is not None else tn.bounds.zero

    @tn.kernel
    def gemm(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], C: tn.Tensor[f32, "M N"], *,
             bm=16, bn=32, bk=8):
        M, K = A.shape
        N = B.shape[1]
        m, k = A.dims()
        n = C.dim(1)
        B = B.with_dims(k, n)
        C = C.with_dims(m, n)
        for p in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
            i, j = p.index(0), p.index(1)
            if reads_c:
                acc = C[tn.coord(i * bm, j * bn), tn.shape(bm, bn), tn.bounds.zero]
            else:
                acc = tn.full(f32, tn.shape(bm, bn), init, dims=(m, n))
            steps = tn.shape(tn.cdiv(K, bk))
            loops = {"pipeline": lambda: p.pipeline(steps, tn.pipeline_policy(window=2)),
                     "serial": lambda: p.serial(steps),
                     "reverse": lambda: p.serial(steps, order="reverse"),
                     "reduce": lambda: p.reduce(steps, policy=tn.fold_left),
                     "reduce_right": lambda: p.reduce(steps, policy=tn.fold_right)}
            for kk in loops[loop]():
                a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
                b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
                acc = tn.mma(a, b, acc, allow_reassociation=reassoc)
            C(tn.coord(i * bm, j * bn), tn.shape(bm, bn), sb).store(acc)

    return gemm


def _walk(body, inside=()):
    """``(statement, enclosing statements)`` for every statement of ``body``."""
    for s in body:
        yield s, inside
        for f in ("body", "then", "orelse"):
            yield from _walk(getattr(s, f, ()), inside + (s,))


def folds(ck) -> tuple[bool, bool]:
    """``(fill, store)``: whether the accumulator's fill runs only under a
    condition (the loop without steps) and whether ``C`` is stored inside
    the K loop (the loop whose body holds the products)."""
    body = ck.kernel.phases[0].body
    fills = [enc for s, enc in _walk(body)
             if isinstance(s, L.Store) and s.buf.name.startswith("%acc")
             and isinstance(s.value, L.Const)]
    guarded = all(any(isinstance(e, L.If) for e in enc) for enc in fills)
    k_loops = [s for s in body if isinstance(s, L.For) and any(
        isinstance(x, L.Store) and isinstance(x.value, (L.Fma, L.Bin)) for x, _ in _walk(s.body))]
    store_inside = any(isinstance(x, L.Store) and x.buf.name == "C"
                       for f in k_loops for x, _ in _walk(f.body))
    return bool(fills) and guarded, store_inside


def operands(m: int, k: int, n: int, seed: int = 0):
    """Operands spanning many binades: another summation order shows."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)) * np.exp2(rng.integers(-10, 10, (m, k)))
    b = rng.standard_normal((k, n)) * np.exp2(rng.integers(-10, 10, (k, n)))
    c = rng.standard_normal((m, n))
    return a.astype(np.float32), b.astype(np.float32), c.astype(np.float32)


def same_as_interpreter(kern, shapes, threads=(1, 2), **consts):
    k = kern.specialize(**consts) if consts else kern
    ck = k.compile(target="llvm")
    for m, kk, n in shapes:
        a, b, c = operands(m, kk, n)
        want = k(a, b, c.copy())
        for t in threads:
            got = ck(a, b, c.copy(), threads=t)
            assert got.tobytes() == want.tobytes(), (consts, (m, kk, n), t)
    return ck


# ragged against the tiles and the register block, K not a multiple of the
# step, one step, no step (K = 0: C is the fill), a single element
SHAPES = [(37, 19, 53), (16, 8, 32), (40, 3, 70), (5, 0, 9), (1, 1, 1)]


@pytest.mark.parametrize("loop", ["pipeline", "serial", "reduce"])
@pytest.mark.parametrize("init", [0.0, 1.5])
def test_fill_and_store_fold_and_keep_the_bits(loop, init):
    ck = same_as_interpreter(accumulating_gemm(loop, init), SHAPES, bm=13, bn=37, bk=5)
    assert folds(ck) == (True, True)
    ck = same_as_interpreter(accumulating_gemm(loop, init), SHAPES, bm=16, bn=32, bk=8)
    assert folds(ck) == (True, True)


@pytest.mark.parametrize("loop", ["reverse", "reduce_right"])
def test_without_the_folds_the_fill_and_the_store_are_passes_of_their_own(loop):
    """A loop run backwards (a serial region in reverse, a right fold) has
    its first step at its last index: nothing folds, and the result is the
    same."""
    ck = same_as_interpreter(accumulating_gemm(loop), SHAPES[:3])
    assert folds(ck) == (False, False)


def test_a_tensor_also_read_keeps_its_store_after_the_loop():
    """``C += A @ B``: the seed is read from C, so neither folds (C's tile
    must be read before anything is stored into it)."""
    ck = same_as_interpreter(accumulating_gemm(reads_c=True), SHAPES[:3])
    assert folds(ck)[1] is False


def test_a_checked_store_is_not_moved_into_the_loop():
    """A checked store reports an out-of-view element after the loop, as the
    interpreter does; its fill still folds."""
    kern = accumulating_gemm(store_bounds=tn.bounds.checked).specialize(bm=16, bn=32, bk=8)
    ck = kern.compile(target="llvm")
    assert folds(ck) == (True, False)
    a, b, c = operands(32, 16, 64)
    assert ck(a, b, c.copy()).tobytes() == kern(a, b, c.copy()).tobytes()
    a, b, c = operands(30, 16, 64)  # ragged: the last row tile's store is outside
    with pytest.raises(TilenestError):
        kern(a, b, c.copy())
    with pytest.raises(TilenestError):
        ck(a, b, c.copy())


def limited_gemm(limit_after_loop: bool):
    """``C = A @ B`` stored into the rows of C below ``Lim[0]``: a view whose
    extent is a value, computed after the K loop or before it."""
    from tilenest import i32

    @tn.kernel
    def gemm(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], C: tn.Tensor[f32, "M N"],
             Lim: tn.Tensor[i32, "P"], *, bm=16, bn=32, bk=8):
        M, K = A.shape
        N = B.shape[1]
        m, k = A.dims()
        n = C.dim(1)
        B = B.with_dims(k, n)
        C = C.with_dims(m, n)
        for p in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
            i, j = p.index(0), p.index(1)
            if not limit_after_loop:
                lt = Lim[tn.coord(0), tn.shape(1)]
                rows = tn.reduce(lt, dims=lt.dims(), reducer="add")
            acc = tn.full(f32, tn.shape(bm, bn), 0.0, dims=(m, n))
            for kk in p.serial(tn.shape(tn.cdiv(K, bk))):
                a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
                b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
                acc = tn.mma(a, b, acc, allow_reassociation=False)
            if limit_after_loop:
                lt = Lim[tn.coord(0), tn.shape(1)]
                rows = tn.reduce(lt, dims=lt.dims(), reducer="add")
            C.view((0, 0), tn.shape(rows, N))(tn.coord(i * bm, j * bn),
                                              tn.shape(bm, bn)).store(acc)

    return gemm


@pytest.mark.parametrize("after", [True, False])
def test_a_store_whose_view_reads_a_value_folds_only_if_the_value_comes_first(after):
    """The folded store is lowered inside the loop's last step, so its view
    may read only values defined before the loop: a row limit computed after
    the loop keeps the store after it."""
    k = limited_gemm(after)
    ck = k.compile(target="llvm")
    assert folds(ck) == (True, not after)
    a, b, c = operands(37, 19, 53)
    lim = np.array([20], np.int32)
    assert ck(a, b, c.copy(), lim).tobytes() == k(a, b, c.copy(), lim).tobytes()


def test_reassociating_products_fold_and_stay_in_the_envelope():
    from tilenest.validation import validate

    k = accumulating_gemm(reassoc=True).specialize(bm=24, bn=48, bk=16)
    ck = k.compile(target="llvm")
    assert folds(ck) == (True, True)
    rep = validate(k, schedule=ck.schedule,
                   inputs=[list(operands(m, kk, n)) for m, kk, n in SHAPES])
    assert rep.ok and rep.count("ok") == len(SHAPES), rep.summary()


def test_the_shipped_gemm_and_batched_products_fold():
    """The benchmark's GEMM and ``A @ B^T`` kernels (tiles as it sizes them)
    have no fill pass and no copy pass, and still compute numpy's product."""
    from tilenest.bench.kernels import kernels

    ks = kernels()
    rng = np.random.default_rng(1)
    A = rng.standard_normal((2, 40, 24)).astype(np.float32)
    Bt = rng.standard_normal((2, 72, 24)).astype(np.float32)
    ck = ks["bmm_nt"].specialize(bm=32, bn=64, bk=16).compile(target="llvm")
    assert folds(ck) == (True, True)
    np.testing.assert_allclose(ck(A, Bt, np.empty((2, 40, 72), np.float32)),
                               A @ Bt.transpose(0, 2, 1), rtol=1e-5, atol=1e-5)
    ck = ks["gemm"].specialize(bm=32, bn=64, bk=16).compile(target="llvm")
    assert folds(ck) == (True, True)


def test_the_workload_gemm_folds_with_either_k_loop():
    """The workload library's GEMM with its K loop a pipeline or a ``reduce``
    under the ``add`` contract (a tile-level fold, run in order on the CPU)."""
    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS["gemm"]
    rng = np.random.default_rng(2)
    A = rng.standard_normal((45, 70)).astype(np.float32)
    B = rng.standard_normal((70, 33)).astype(np.float32)
    for loop in ("pipeline", "reduce"):
        k = wl.kernel(f32, {"bm": 16, "bn": 32, "bk": 16, "loop": loop})
        ck = k.compile(target="llvm")
        assert folds(ck) == (True, True), loop
        np.testing.assert_allclose(ck(A, B, np.empty((45, 33), np.float32)), A @ B,
                                   rtol=1e-4, atol=1e-4)
