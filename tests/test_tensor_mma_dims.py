"""Tensor cores for ``mma`` tiles that are not plain 2-d products.

Attention's ``Q K^T`` reads tiles of ``[batch, head, rows, D]`` tensors: the
batch and head dims of a program's tile have extent 1 (they are squeezed),
several heads per program make a true batch dim (looped, one warp tile per
point), and the second operand is stored ``[keys, D]``, contiguous along the
contraction (loaded transposed). ``lowering/mma.tensor_plan`` takes all of
these onto ``mma.sync`` (cuda) and simdgroup matrices (metal); the emulator
runs the generated source against the interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda, metal
from tilenest.errors import TilenestError
from tilenest.lowering import default_schedule, lower_verified, print_kernel
from tilenest.lowering import loopir as L
from tilenest.workloads.attention import flash_kernel


def scores(dt):  # type: ignore[no-untyped-def]
    @tn.kernel
    def qk(Q: tn.Tensor[dt, "B H T D"], K: tn.Tensor[dt, "B H S D"],
           S: tn.Tensor[tn.f32, "B H T S"], *, bq=32, bk=32, hb=1, dh=32):
        """S[b, h] = Q[b, h] @ K[b, h]^T in bq x bk tiles of hb heads."""
        nb, nh, nt, _ = Q.shape
        ns = K.shape[2]
        b, h, t, d = Q.dims()
        s = S.dim(3)
        K = K.with_dims(b, h, s, d)
        S = S.with_dims(b, h, t, s)
        for nest in tn.parallel(tn.shape(nb, tn.cdiv(nh, hb), tn.cdiv(nt, bq),
                                         tn.cdiv(ns, bk))):
            ib, ih, it, js = (nest.index(i) for i in range(4))
            q = Q[tn.coord(ib, ih * hb, it * bq, 0), tn.shape(1, hb, bq, dh), tn.bounds.zero]
            k = K[tn.coord(ib, ih * hb, js * bk, 0), tn.shape(1, hb, bk, dh), tn.bounds.zero]
            acc = tn.zeros(tn.f32, tn.shape(1, hb, bq, bk), dims=(b, h, t, s))
            acc = tn.mma(q, k, acc, allow_reassociation=True)
            S(tn.coord(ib, ih * hb, it * bq, js * bk), tn.shape(1, hb, bq, bk)).store(acc)

    return qk


def _mmas(kern, target, **sched):  # type: ignore[no-untyped-def]
    k = lower_verified(kern.program, default_schedule(kern.program, target, **sched))
    return k, [s for ph in k.phases for s in L.walk(ph.body) if isinstance(s, L.WarpMma)]


@pytest.mark.parametrize("hb", [1, 2])
def test_unit_and_batch_dims_reach_tensor_cores(hb):
    kern = scores(tn.bf16).specialize(hb=hb)
    k, mmas = _mmas(kern, "cuda", mma_unit="tensor")
    assert mmas and all(not w.opaque for w in mmas)
    (w,) = mmas
    assert w.b.si == 1 and w.b.sj in (32, 40)  # K^T: contiguous along the contraction (a padded row pitch)
    text = print_kernel(k)
    over = " for each of 2" if hb == 2 else ""
    assert f"mma on tensor cores: 32x32x32{over} in" in text
    # the tiles of every head are the iterations of one warp-distributed nest
    assert "warp_mma.16x16x32" in text or "warp_mma.32x16x32" in text


def _inputs(dt, B=2, H=3, T=45, S=37, D=29):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(T * S + H)
    q = rng.standard_normal((B, H, T, D)).astype(dt.np)
    k = rng.standard_normal((B, H, S, D)).astype(dt.np)
    return q, k, np.zeros((B, H, T, S), np.float32)


def _admitted_in_two_runs(ck, kern, inputs, out0, seed):  # type: ignore[no-untyped-def]
    """``ck`` (emulated) on ``inputs`` and a copy of output ``out0``, in order
    with NaN poison and in a random interleaving with large poison: each
    output admitted by the oracle of ``kern``."""
    oracle = tn.reference(kern, *inputs, out0.copy())
    for policy, poison in (("in_order", "nan"), ("random", "big")):
        out = out0.copy()
        ck(*inputs, out, policy=policy, poison=poison, seed=seed)
        verdict = oracle.admits(out)
        assert verdict.ok, f"{policy}/{poison}: {verdict}"


@pytest.mark.parametrize("hb", [1, 2])
def test_attention_scores_validate_on_emulated_cuda(hb):
    """Ragged T and S, D below the tile's 32 (zero padded), H not a multiple
    of the heads per program: validated against the oracle under two
    interleavings and poisons."""
    kern = scores(tn.bf16).specialize(hb=hb)
    sched = default_schedule(kern.program, "cuda", block_threads=128, mma_unit="tensor")
    ck = cuda.compile_program(kern.program, sched, device="emulated")
    assert "tn_mma_bf16" in ck.source.text and "tn_ldsm_x4" in ck.source.text
    q, k, s0 = _inputs(tn.bf16)
    _admitted_in_two_runs(ck, kern, (q, k), s0, seed=5)


def test_attention_scores_validate_on_emulated_metal():
    kern = scores(tn.f16).specialize(hb=2)
    _, mmas = _mmas(kern, "metal", mma_unit="tensor")
    assert mmas and all(w.opaque for w in mmas)
    ck = metal.compile_program(kern.program, None, device="emulated")
    assert "simdgroup_multiply_accumulate(" in ck.source.text
    q, k, s0 = _inputs(tn.f16, H=2)
    s = s0.copy()
    ck(q, k, s)
    v = tn.reference(kern, q, k, s0.copy()).admits(s)
    assert v.ok, str(v)


def test_two_free_dims_still_refused_with_the_reason():
    """A dim of extent > 1 in a operand's free role beside another (here the
    head dim free in q only) is not a 2-d product: refused, naming why."""
    @tn.kernel
    def outer_heads(Q: tn.Tensor[tn.bf16, "H T D"], K: tn.Tensor[tn.bf16, "S D"],
                    S: tn.Tensor[tn.f32, "H T S"]):
        h, t, d = Q.dims()
        s = S.dim(2)
        K = K.with_dims(s, d)
        S = S.with_dims(h, t, s)
        for _ in tn.parallel(tn.shape(1)):
            q = Q[tn.coord(0, 0, 0), tn.shape(2, 16, 16), tn.bounds.zero]
            k = K[tn.coord(0, 0), tn.shape(16, 16), tn.bounds.zero]
            acc = tn.zeros(tn.f32, tn.shape(2, 16, 16), dims=(h, t, s))
            S(tn.coord(0, 0, 0), tn.shape(2, 16, 16)).store(
                tn.mma(q, k, acc, allow_reassociation=True))

    with pytest.raises(TilenestError, match="one free dim in each operand"):
        _mmas(outer_heads, "cuda", mma_unit="tensor")


@pytest.mark.device
@pytest.mark.parametrize("hb,dh", [(1, 64), (2, 32), (1, 128)])
def test_attention_scores_validate_on_gpu(hb, dh):
    """On the GPU: every tile of every head of a ragged problem, against
    the interpreter."""
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    kern = scores(tn.bf16).specialize(hb=hb, dh=dh, bq=64, bk=64)
    sched = default_schedule(kern.program, "cuda", mma_unit="tensor")
    ck = cuda.compile_program(kern.program, sched, device="gpu")
    q, k, s0 = _inputs(tn.bf16, B=2, H=4, T=301, S=259, D=dh - 3)
    s = s0.copy()
    ck(q, k, s)
    v = tn.reference(kern, q, k, s0.copy()).admits(s)
    assert v.ok, str(v)


@tn.kernel
def weighted_values(X: tn.Tensor[tn.f32, "T S"], V: tn.Tensor[tn.bf16, "S E"],
                    O: tn.Tensor[tn.f32, "T E"], *, bt=32, bs=32, be=32):
    """O = cast(exp(X), bf16) @ V: the probabilities of attention's ``P V``
    are computed in f32 and rounded to bf16 as the program says; the value
    tile is passed as a permuted view (its dims reordered), an operand that
    no buffer holds until the mma needs one."""
    nt, ns = X.shape
    ne = V.shape[1]
    t, s = X.dims()
    e = O.dim(1)
    V = V.with_dims(s, e)
    O = O.with_dims(t, e)
    for nest in tn.parallel(tn.shape(tn.cdiv(nt, bt), tn.cdiv(ne, be))):
        i, j = nest.index(0), nest.index(1)
        acc = tn.zeros(tn.f32, tn.shape(bt, be), dims=(t, e))
        for kb in nest.serial(tn.shape(tn.cdiv(ns, bs))):
            x = X[tn.coord(i * bt, kb.index() * bs), tn.shape(bt, bs), tn.bounds.zero]
            v = V[tn.coord(kb.index() * bs, j * be), tn.shape(bs, be), tn.bounds.zero]
            acc = tn.mma(tn.cast(tn.exp(x), tn.bf16), tn.permute(v, (1, 0)), acc,
                         allow_reassociation=True)
        O(tn.coord(i * bt, j * be), tn.shape(bt, be)).store(acc)


def test_an_operand_view_is_evaluated_into_a_buffer_for_tensor_cores():
    k, mmas = _mmas(weighted_values, "cuda", mma_unit="tensor")
    assert mmas and "mma on tensor cores: 32x32x32" in print_kernel(k)
    sched = default_schedule(weighted_values.program, "cuda", block_threads=128,
                             mma_unit="tensor")
    ck = cuda.compile_program(weighted_values.program, sched, device="emulated")
    rng = np.random.default_rng(2)
    x = rng.standard_normal((50, 70)).astype(np.float32)
    v = rng.standard_normal((70, 40)).astype(tn.bf16.np)
    o0 = np.zeros((50, 40), np.float32)
    _admitted_in_two_runs(ck, weighted_values, (x, v), o0, seed=1)


def flash_attention(dt, **consts):  # type: ignore[no-untyped-def]
    """The workload library's attention written for speed
    (``workloads/attention.flash_kernel``: 16-bit operands into f32 scores,
    an online softmax, the probabilities rounded to the operand type for
    ``P V`` accumulated into the rescaled accumulator, GQA, and with
    ``causal`` a key loop that stops at the last block a query block sees),
    with 32 x 32 tiles and 32-wide head dims unless ``consts`` says
    otherwise."""
    return flash_kernel(dt).specialize(**{"bq": 32, "bk": 32, "dh": 32, "dv": 32, **consts})


def _attention_inputs(dt, B=1, HQ=4, HK=2, Q=45, K=70, D=29):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(Q * K + D)
    q = rng.standard_normal((B, HQ, Q, D)).astype(dt.np)
    k = rng.standard_normal((B, HK, K, D)).astype(dt.np)
    v = rng.standard_normal((B, HK, K, D)).astype(dt.np)
    return q, k, v, np.zeros((B, HQ, Q, D), dt.np), np.float32(1 / np.sqrt(D))


@pytest.mark.parametrize("target,dt", [("cuda", tn.bf16), ("metal", tn.f16)])
def test_flash_attention_runs_both_products_on_the_matrix_unit(target, dt):
    """Both products of the attention kernel above (bf16 operands, unit
    batch and head dims, K stored [keys, D], P computed in f32 and cast)
    reach the matrix unit, and the generated source validates on the
    emulator for ragged GQA shapes with the causal trip count."""
    kern = flash_attention(dt)
    k, mmas = _mmas(kern, target, mma_unit="tensor")
    assert len(mmas) == 2
    if target == "cuda":
        ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                                 block_threads=128),
                                  device="emulated")
    else:
        ck = metal.compile_program(kern.program, None, device="emulated")
    q, kk, v, o0, sc = _attention_inputs(dt)
    o = o0.copy()
    ck(q, kk, v, o, sc)
    verdict = tn.reference(kern, q, kk, v, o0.copy(), sc).admits(o)
    assert verdict.ok, str(verdict)


@pytest.mark.device
@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_validates_on_gpu(causal):
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    kern = flash_attention(tn.bf16, bq=64, bk=64, dh=64, dv=64, causal=causal)
    ck = cuda.compile_program(kern.program, None, device="gpu")
    q, kk, v, o0, sc = _attention_inputs(tn.bf16, B=1, HQ=4, HK=2, Q=100, K=150, D=61)
    o = o0.copy()
    ck(q, kk, v, o, sc)
    verdict = tn.reference(kern, q, kk, v, o0.copy(), sc).admits(o)
    assert verdict.ok, str(verdict)


def test_row_reductions_of_a_score_tile_fold_one_row_per_thread():
    """The row max and row sum of a 64 x 64 score tile in shared memory (f32
    products on the SIMT units; a tile on the tensor cores folds in its
    registers instead, ``test_fragment_rows.py``) fold each row in one
    thread (64 folds side by side, no barrier between rows), where they used
    to run as 64 block reductions one after another with two barriers each;
    a whole-row reduction of a row kernel keeps the block tree."""
    from tilenest.workloads.attention import attention_kernel

    kern = attention_kernel(tn.bf16).specialize(bq=64, bk=64)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda", block_threads=256))
    loop = max((s for ph in k.phases for s in ph.body if isinstance(s, L.For)
                and s.kind == "serial"), key=lambda s: len(list(L.walk(s.body))))  # key blocks
    inner = list(L.walk(loop.body))
    assert not any(isinstance(s, L.LaneReduce) for s in inner)
    # one block reduction per row would need two barriers each: 256 for both
    assert sum(1 for s in inner if L.is_block_barrier(s)) <= 16
    from tilenest.workloads import WORKLOADS

    row = WORKLOADS["softmax"].kernel(tn.f32, {"rp": 1})
    kr = lower_verified(row.program, default_schedule(row.program, "cuda"))
    assert any(isinstance(s, L.LaneReduce) for ph in kr.phases for s in L.walk(ph.body))


def test_a_probability_tile_with_unit_dims_gets_a_conflict_free_pitch():
    """``P V``'s ``a`` is attention's probabilities cast to bf16, a tile
    ``[bq, bk, 1, 1]`` (its dims of extent 1 last) evaluated into shared
    memory for the tensor cores. Its rows must be padded like any operand
    copy's (an odd number of 16-byte units apart), which needs the unit dims
    stored first: dense 64-byte rows put the eight rows of a fragment read on
    the same banks."""
    kern = flash_kernel(tn.bf16).specialize(bq=32, bk=32, dh=32, dv=32, causal=True)
    k, mmas = _mmas(kern, "cuda", mma_unit="tensor")
    qk, pv = mmas  # in program order
    assert pv.a.buf is not qk.a.buf and pv.a.buf.dtype == tn.bf16 and pv.a.sj == 1
    assert pv.a.si == 40 and (pv.a.si * 2 // 16) % 2 == 1  # 32 columns + 16 bytes
    assert int(pv.a.buf.size.value) == 32 * 40
