"""``mma`` skips the products of zero padding (``lowering/values._padding_clamp``).

Where both operand copies hold ``+0`` past the tensors' edge (``bounds.zero``
reads), the contraction loop stops at the last point where either operand is
real, and one ``+0`` is added to each output element in place of the dropped
products. The value is unchanged bit for bit -- also the sign of a zero sum,
and NaN from an infinity met by the other operand's padding -- on the llvm
target and on the emulated CUDA device.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.lowering import loopir as L
from tilenest.semantics import expr as E


def padded_gemm(b_shift: int = 0, b_bounds=None, init: float = 0.0):
    """``C = init + A @ B`` over K steps of 4, both operands read with
    ``bounds.zero`` (``b_bounds`` overrides B's); B's K origin is shifted by
    ``b_shift`` (its padding then starts elsewhere than A's)."""
    bb = b_bounds if b_bounds is not None else tn.bounds.zero

    @tn.kernel
    def gemm(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K2 N"], C: tn.Tensor[f32, "M N"], *,
             reassoc=False):
        M, K = A.shape
        m, k = A.dims()
        n = C.dim(1)
        B = B.with_dims(k, n)
        C = C.with_dims(m, n)
        N = C.shape[1]
        for p in tn.parallel(tn.shape(tn.cdiv(M, 4), tn.cdiv(N, 8))):
            i, j = p.index(0), p.index(1)
            acc = tn.full(f32, tn.shape(4, 8), init, dims=(m, n))
            for kk in p.reduce(tn.shape(tn.cdiv(K, 4)), policy=tn.fold_left):
                a = A[tn.coord(i * 4, kk.index() * 4), tn.shape(4, 4), tn.bounds.zero]
                b = B[tn.coord(kk.index() * 4 + b_shift, j * 8), tn.shape(4, 8), bb]
                acc = tn.mma(a, b, acc, allow_reassociation=reassoc)
            C(tn.coord(i * 4, j * 8), tn.shape(4, 8)).store(acc)

    return gemm


def _stmts(body):
    for s in body:
        yield s
        for f in ("body", "then", "orelse"):
            yield from _stmts(getattr(s, f, ()))


def _contraction_loops(ck):
    """The loops whose body updates the accumulator with products."""
    out = []
    for s in _stmts(ck.kernel.phases[0].body):
        if isinstance(s, L.For) and any(
                isinstance(x, L.Store) and isinstance(x.value, (L.Fma, L.Bin)) and (
                    isinstance(x.value, L.Fma) or "'mul'" in repr(x.value))
                for x in _stmts(s.body)):
            out.append(s)
    return out


def _clamped(ck) -> bool:
    """Whether some contraction loop's bound depends on the data's edge."""
    return any(not isinstance(f.hi, E.Const) for f in _contraction_loops(ck)
               if not any(isinstance(x, L.For) and x is not f and x.kind != "vector"
                          for x in f.body))


def _run(kern, A, B, M, N, **consts):
    k = kern.specialize(**consts) if consts else kern
    want = np.empty((M, N), np.float32)
    k(A, B, want)
    got = np.empty((M, N), np.float32)
    ck = k.compile(target="llvm", threads=1)
    ck(A, B, got)
    return want, got, ck


def test_contraction_stops_at_the_padding_and_keeps_bits():
    rng = np.random.default_rng(3)
    kern = padded_gemm()
    for K in (1, 5, 7, 8, 13):
        A = rng.standard_normal((6, K)).astype(np.float32) * np.float32(1e3) ** rng.integers(
            -2, 3, (6, K)).astype(np.float32)
        B = rng.standard_normal((K, 11)).astype(np.float32)
        want, got, ck = _run(kern, A, B, 6, 11)
        assert _clamped(ck)
        np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_a_zero_sum_keeps_the_sign_the_padding_gives():
    """acc = -0 and every real product -0: the ordered sum is -0 until the
    padding's +0 products make it +0. Dropping them without the added +0
    would give -0."""
    kern = padded_gemm(init=-0.0)
    K = 5  # the second K step has one real point and three of padding
    A = np.full((4, K), -0.0, np.float32)
    B = np.zeros((K, 8), np.float32)
    want, got, ck = _run(kern, A, B, 4, 8)
    assert _clamped(ck)
    assert not np.signbit(want).any()
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    # with K a multiple of the step nothing is padding: the sum stays -0
    want, got, _ = _run(kern, A[:, :4].copy(), B[:4].copy(), 4, 8)
    assert np.signbit(want).all() and np.signbit(got).all()


def test_padding_of_one_operand_against_real_data_of_the_other_is_kept():
    """B's K origin is one past A's: at A's first padded point B is still real
    (here inf), so 0 * inf = NaN must be computed; only the points where both
    are padding are skipped."""
    kern = padded_gemm(b_shift=1)
    K = 6
    A = np.ones((4, K), np.float32)
    B = np.ones((K + 3, 8), np.float32)
    B[K + 1] = np.inf  # read at step 1, point 2: A's column 6 there is padding
    want, got, ck = _run(kern, A, B, 4, 8)
    assert np.isnan(want).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_no_clamp_without_zero_padding_on_both_operands():
    kern = padded_gemm(b_bounds=tn.bounds.checked)
    A = np.ones((4, 8), np.float32)
    B = np.ones((8, 8), np.float32)
    _, _, ck = _run(kern, A, B, 4, 8)
    assert not _clamped(ck)


def test_reassociating_mma_is_clamped_and_admitted():
    rng = np.random.default_rng(5)
    kern = padded_gemm()
    A = rng.standard_normal((9, 13)).astype(np.float32)
    B = rng.standard_normal((13, 17)).astype(np.float32)
    want, got, ck = _run(kern, A, B, 9, 17, reassoc=True)
    assert _clamped(ck)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # the oracle's envelope on generated ragged sizes, the clamped build
    rep = tn.validate(kern.specialize(reassoc=True), "llvm", cases=4, seed=0, compiled=ck)
    assert rep.ok


@pytest.mark.slow
def test_emulated_cuda_keeps_the_sign_of_a_zero_sum():
    from tilenest.backends import cuda
    from tilenest.lowering import default_schedule

    kern = padded_gemm(init=-0.0)
    A = np.full((4, 5), -0.0, np.float32)
    B = np.zeros((5, 8), np.float32)
    want = np.empty((4, 8), np.float32)
    kern(A, B, want)
    sched = default_schedule(kern.program, "cuda")
    ck = cuda.compile_program(kern.program, sched, device="emulated")
    got = np.empty((4, 8), np.float32)
    ck(A, B, got)
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
