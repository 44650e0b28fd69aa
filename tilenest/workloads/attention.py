"""Attention with an online (flash-style) softmax.

``q: [B, Hq, Q, D]``, ``k: [B, Hkv, K, D]``, ``v: [B, Hkv, K, Dv]``,
``o: [B, Hq, Q, Dv]``; query head ``h`` reads key/value head
``h // (Hq // Hkv)`` (GQA; MQA is ``Hkv = 1``, MHA ``Hkv = Hq``). Queries are the
last ``Q`` of the ``K`` key positions: query ``i`` sits at position
``K - Q + i`` and sees keys ``j <= K - Q + i`` (a bottom-right aligned causal
mask), so decode is ``Q = 1`` and prefill ``Q = K``. ``scale`` is a runtime f32
scalar (``1/sqrt(D)`` rounded to f32).

One program per (batch, head, ``bq`` queries); a ``loop`` (``serial`` or
``pipeline``) over key blocks of ``bk`` carries the running max ``m``, the
denominator ``l`` and the numerator ``acc``; ragged query and key tails are
zero-filled and masked, and their stores dropped.

The FP64 formula is the full-score causal softmax and value contraction,
independent of the online recurrence. Its error bound, per output element
(``u`` = f32 roundoff, ``T = K`` an upper bound on the number of key blocks):

1. scores: ``s~ = fl(fl(q . k) * scale)``, ``|s~ - s| <= sigma`` by the
   ``contract``/``mul`` rules;
2. exact softmax of the perturbed scores: ``w~_j / w_j`` lies in
   ``[e^{-2 sigma}, e^{2 sigma}]`` (``sigma`` the row maximum), hence
   ``|o* - o| <= (e^{2 sigma} - 1) * sum_j w_j |v_j - o|``;
3. the recurrence: every ``exp`` of a difference of computed scores (at most
   the score range ``R`` apart) is off by a factor within
   ``delta_e = (1 + 2ku) e^{u R} - 1`` for an ``exp`` within ``k`` ulp
   (``k = 1`` unless the kernel declares more); each term of ``l`` meets at
   most ``T + 1`` such factors, ``2T`` roundings and one block sum, so
   ``|l~/l* - 1| <= delta_l = (1 + delta_e)^{T+1} (1 + u)^{2T} (1 + gamma_K) - 1``,
   and the numerator likewise with ``gamma_{K+1}`` (``delta_a``);
4. ``o~ = fl(acc~ / l~)``:
   ``|o~ - o*| <= (delta_a e^{2 sigma} sum w|v| + |o*| delta_l) / (1 - delta_l) + u|o~|``.

For f16/bf16 storage the store adds ``u_T * |o|``.
"""

from __future__ import annotations

import functools

import numpy as np

import tilenest as tn
from tilenest import f32

from . import bounds as B
from .base import Workload, normal, sentinel, x64


def _gqa(q, k, v, o, dh=None, dv=None):  # type: ignore[no-untyped-def]
    """The sizes, dims and views a GQA attention kernel shares: ``(nb, hq, nq,
    hk, nk, D, DV)``, the dims ``(b, h, qd, d, kd, e)``, ``k``, ``v`` and ``o``
    with the query's batch, head and head-dim dims, and the query heads per
    key/value head; with ``dh`` / ``dv`` (tile widths) it assumes ``D <= dh``
    and ``DV <= dv``, and always ``HK >= 1`` and ``HQ % HK == 0``."""
    nb, hq, nq, ndh = q.shape
    hk, nk = k.shape[1], k.shape[2]
    ndv = v.shape[3]
    if dh is not None:
        tn.assume(ndh <= dh)
        tn.assume(ndv <= dv)
    tn.assume(hk >= 1)
    tn.assume(hq % hk == 0)  # each key/value head serves a group of query heads
    b, h, qd, d = q.dims()
    kd = k.dim(2)
    e = v.dim(3)
    views = (k.with_dims(b, h, kd, d), v.with_dims(b, h, kd, e), o.with_dims(b, h, qd, e))
    return (nb, hq, nq, hk, nk, ndh, ndv), (b, h, qd, d, kd, e), views, hq // hk


def _block_scores(qt, k, v, at, tiles, sizes, dims, scale, causal, masked=True):  # type: ignore[no-untyped-def]
    """One key block of the 16-bit attention kernels: the ``dt`` key and value
    tiles at ``at = (batch, kv head, query block, key block)`` (zero-filled
    past the ends), and the f32 scores ``q . k * scale`` of the query tile
    ``qt`` from a reassociating ``mma``, ``-inf`` where a key lies past the
    keys or, with ``causal``, after the query (bottom-right aligned).
    ``tiles = (bq, bk, dh, dv)``, ``sizes = (Q, K)``, ``dims = (b, h, qd,
    kd)``; ``masked`` false: the caller knows every key of the block is seen
    by every query row (no mask computed). Returns ``(scores, value tile)``."""
    z, kvh, qb, kb = at
    bq, bk, dh, dv = tiles
    pos = tn.coord(z, kvh, kb * bk, 0)
    kt = k[pos, tn.shape(1, 1, bk, dh), tn.bounds.zero]
    vt = v[pos, tn.shape(1, 1, bk, dv), tn.bounds.zero]
    s = _product(qt, kt, tiles, dims) * scale
    return (_masked(s, at, tiles, sizes, dims, causal) if masked else s), vt


def _block(t, z, kvh, kb, bk, width):  # type: ignore[no-untyped-def]
    """Key (or value) block ``kb`` of ``bk`` rows and ``width`` columns of
    head ``kvh`` of batch ``z``, zero-filled past the ends."""
    return t[tn.coord(z, kvh, kb * bk, 0), tn.shape(1, 1, bk, width), tn.bounds.zero]


def _product(qt, kt, tiles, dims):  # type: ignore[no-untyped-def]
    """The f32 scores ``q . k`` of a ``bq``-row query and a ``bk``-key tile
    (``tiles = (bq, bk, ..)``), unscaled, from a reassociating ``mma`` into
    fresh zeros."""
    bq, bk = tiles[:2]
    b, h, qd, kd = dims
    return tn.mma(qt, kt, tn.zeros(f32, tn.shape(1, 1, bq, bk), dims=(b, h, qd, kd)),
                  allow_reassociation=True)


def _masked(s, at, tiles, sizes, dims, causal):  # type: ignore[no-untyped-def]
    """Scores ``s`` of key block ``at[3]`` with ``-inf`` where a key lies past
    the keys or, with ``causal``, after the query (:func:`_block_scores`)."""
    _, _, qb, kb = at
    bq, bk = tiles[:2]
    nq, nk = sizes
    _, _, qd, kd = dims
    pair = tn.shape(tn.axis(qd, bq), tn.axis(kd, bk))
    qpos = tn.index_tile(pair, lambda i, j: qb * bq + i + nk - nq)
    kpos = tn.index_tile(pair, lambda i, j: j) + kb * bk
    seen = (kpos <= qpos) & (kpos < nk) if causal else kpos < nk
    return tn.ite(seen, s, -np.inf)


@functools.cache
def attention_kernel(dt):  # type: ignore[no-untyped-def]
    @tn.kernel
    def attention(q: tn.Tensor[dt, "B HQ Q D"], k: tn.Tensor[dt, "B HK K D"],
                  v: tn.Tensor[dt, "B HK K DV"], o: tn.Tensor[dt, "B HQ Q DV"],
                  scale: tn.Scalar[f32], *, bq=2, bk=3, loop="serial"):
        (nb, hq, nq, hk, nk, dh, dv), (b, h, qd, d, kd, e), (k, v, o), group = _gqa(q, k, v, o)
        for p in tn.parallel(tn.shape(nb, hq, tn.cdiv(nq, bq)), exec=tn.exec.block):
            z, hh, qb = p.index(0), p.index(1), p.index(2)
            kvh = hh // group
            qt = tn.cast(q[tn.coord(z, hh, qb * bq, 0), tn.shape(1, 1, bq, dh)], f32)
            m = tn.full(f32, tn.shape(1, 1, bq), -np.inf, dims=(b, h, qd))
            den = tn.zeros(f32, tn.shape(1, 1, bq), dims=(b, h, qd))
            acc = tn.zeros(f32, tn.shape(1, 1, bq, dv), dims=(b, h, qd, e))
            blocks = tn.shape(tn.cdiv(nk, bk))
            region = p.serial(blocks) if loop == "serial" else p.pipeline(
                blocks, tn.pipeline_policy(window=2))
            for kb in region:
                if loop != "serial":
                    kb.stage("load")
                kt = tn.cast(k[tn.coord(z, kvh, kb.index() * bk, 0), tn.shape(1, 1, bk, dh)], f32)
                vt = tn.cast(v[tn.coord(z, kvh, kb.index() * bk, 0), tn.shape(1, 1, bk, dv)], f32)
                if loop != "serial":
                    kb.stage("compute")
                s = tn.mma(qt, kt, tn.zeros(f32, tn.shape(1, 1, bq, bk), dims=(b, h, qd, kd)))
                s = s * scale
                pair = tn.shape(tn.axis(qd, bq), tn.axis(kd, bk))
                qpos = tn.index_tile(pair, lambda i, j: qb * bq + i + nk - nq)
                kpos = tn.index_tile(pair, lambda i, j: kb.index() * bk + j)
                s = tn.ite((kpos <= qpos) & (kpos < nk), s, -np.inf)
                m_new = tn.maximum(m, tn.reduce(s, kd, tn.maximum))
                alpha = tn.exp(m - m_new)
                pr = tn.exp(s - m_new)
                den = den * alpha + tn.reduce(pr, kd, tn.add)
                acc = acc * alpha + tn.mma(pr, vt, tn.zeros(f32, tn.shape(1, 1, bq, dv),
                                                            dims=(b, h, qd, e)))
                m = m_new
            o(tn.coord(z, hh, qb * bq, 0), tn.shape(1, 1, bq, dv)).store(tn.cast(acc / den, dt))

    return attention


#: the accuracy bound, in ulp of f32, that :func:`flash_kernel` declares for its
#: exponentials (``tn.exp2(x, ulp=...)``, spec V-14): a target may then compute
#: them by its fast approximation (the cuda row: the special function unit's
#: ``ex2`` alone), as attention kernels written for speed do. 4 ulp is 2^-21
#: of each value, where ``P`` is then rounded to 16 bits.
FLASH_EXP_ULP = 4.0

#: log2(e), a literal next to the f32 ``scale`` and so rounded to f32 (V-8):
#: :func:`flash_kernel` keeps its scores in units of log2 (``q . k * scale *
#: LOG2E``), so its exponentials are powers of two
LOG2E = 1.4426950408889634


@functools.cache
def flash_kernel(dt):  # type: ignore[no-untyped-def]
    """Attention as written for speed: ``dt`` operands straight into a
    reassociating ``mma`` (f32 scores, scaled by ``scale * LOG2E`` so that
    ``exp(x) = exp2(x log2e)`` needs no multiplication of its own), an online
    softmax in f32, the probabilities rounded to ``dt`` for ``P V``
    accumulated into the rescaled accumulator, and with ``causal`` a key loop
    that stops at the last block a query block sees. Its exponentials admit
    ``exp_ulp`` ulp of error (:data:`FLASH_EXP_ULP`; 1.0 is exp2's own bound
    on f32). ``log2=False`` keeps the scores in natural units and takes
    ``exp`` instead (what the powers of two save). With ``prefetch`` each
    step issues the next key block's ``Q K^T`` before its own softmax, the
    scores carried to the next step (one block's scores computed past the
    last one and dropped): a target whose matrix unit runs asynchronously
    overlaps that product with the softmax (``lowering/mma_waits.py``);
    the arithmetic, and so the result, is the same bits. With ``defer_pv``
    each step issues the previous key block's ``P V`` right after its own
    ``Q K^T`` (``P`` carried to the next step in ``dt``, the value block read
    one step late, block ``-1`` being all zeros, and the last block's product
    after the loop), so that product runs during this block's softmax; the
    accumulator meets the same operations in the same order (``acc`` plus
    ``P V`` of block ``j``, then times block ``j + 1``'s ``alpha``), so the
    result is the same bits as well. Both measured slower than the plain
    loop on an H100, whose two blocks a multiprocessor already overlap one
    block's softmax with the other's products (spec/lowering.md L-9). ``dh`` and
    ``dv`` are the head dims of the tiles (constants, so that the products
    can run on a matrix unit); a call with a larger ``D`` or ``DV`` violates
    the kernel's assumption."""
    @tn.kernel
    def flash_attention(q: tn.Tensor[dt, "B HQ Q D"], k: tn.Tensor[dt, "B HK K D"],
                        v: tn.Tensor[dt, "B HK K DV"], o: tn.Tensor[dt, "B HQ Q DV"],
                        scale: tn.Scalar[f32], *, bq=16, bk=16, dh=16, dv=16, causal=True,
                        split=False, exp_ulp=FLASH_EXP_ULP, log2=True, prefetch=False,
                        defer_pv=False):
        assert not (prefetch and defer_pv), (
            "prefetch and defer_pv are two ways of overlapping a product with the softmax; "
            "a kernel takes one of them")
        (nb, hq, nq, hk, nk, _, _), (b, h, qd, d, kd, e), (k, v, o), group = _gqa(
            q, k, v, o, dh, dv)
        dims = (b, h, qd, kd)
        for p in tn.parallel(tn.shape(nb, hq, tn.cdiv(nq, bq)), exec=tn.exec.block):
            z, hh, qb = p.index(0), p.index(1), p.index(2)
            scale2 = scale * LOG2E if log2 else scale  # the scores in units of log2
            ex = tn.exp2 if log2 else tn.exp
            kvh = hh // group
            qt = q[tn.coord(z, hh, qb * bq, 0), tn.shape(1, 1, bq, dh), tn.bounds.zero]
            m = tn.full(f32, tn.shape(1, 1, bq), -np.inf, dims=(b, h, qd))
            den = tn.zeros(f32, tn.shape(1, 1, bq), dims=(b, h, qd))
            acc = tn.zeros(f32, tn.shape(1, 1, bq, dv), dims=(b, h, qd, e))
            last = tn.minimum(nk, qb * bq + bq + nk - nq) if causal else nk
            # the key blocks every query row of the block sees whole (no key
            # past the end, none after the block's first query) need no mask
            spans: tuple = ((0, tn.cdiv(last, bk), True),)
            if split:
                whole = tn.maximum(0, tn.minimum(nk // bk, (qb * bq + nk - nq + 1) // bk)) \
                    if causal else nk // bk
                spans = ((0, whole, False), (whole, tn.cdiv(last, bk) - whole, True))
            if prefetch:  # the first key block's scores, before the loops
                raw = _product(qt, _block(k, z, kvh, 0, bk, dh), (bq, bk), dims)
            if defer_pv:  # the probabilities of the block before the first: none
                pp = tn.zeros(dt, tn.shape(1, 1, bq, bk), dims=dims)
            for first, count, masked in spans:
                for kb in p.serial(tn.shape(count)):
                    at = (z, kvh, qb, first + kb.index())
                    if defer_pv:  # both tiles first: the step's copies, which a ring overlaps
                        kt = _block(k, z, kvh, at[3], bk, dh)
                        vt = _block(v, z, kvh, at[3] - 1, bk, dv)
                        raw = _product(qt, kt, (bq, bk), dims)
                        acc = tn.mma(pp, vt, acc, allow_reassociation=True)
                        s = raw * scale2
                        if masked:
                            s = _masked(s, at, (bq, bk), (nq, nk), dims, causal)
                    elif prefetch:
                        vt = _block(v, z, kvh, at[3], bk, dv)
                        ahead = _product(qt, _block(k, z, kvh, at[3] + 1, bk, dh), (bq, bk), dims)
                        s = raw * scale2
                        if masked:
                            s = _masked(s, at, (bq, bk), (nq, nk), dims, causal)
                    else:
                        s, vt = _block_scores(qt, k, v, at, (bq, bk, dh, dv), (nq, nk), dims,
                                              scale2, causal, masked)
                    m_new = tn.maximum(m, tn.reduce(s, kd, tn.maximum))
                    alpha = ex(m - m_new, ulp=exp_ulp)
                    pr = ex(s - m_new, ulp=exp_ulp)
                    den = den * alpha + tn.reduce(pr, kd, tn.add)
                    if defer_pv:
                        acc = acc * alpha
                        pp = tn.permute(tn.cast(pr, dt), dims)  # (a masked step's come as
                        # the mask's dims first)
                    else:
                        acc = tn.mma(tn.cast(pr, dt), vt, acc * alpha, allow_reassociation=True)
                    m = m_new
                    if prefetch:
                        raw = ahead
            if defer_pv:  # the last key block's product
                acc = tn.mma(pp, _block(v, z, kvh, tn.cdiv(last, bk) - 1, bk, dv), acc,
                             allow_reassociation=True)
            o(tn.coord(z, hh, qb * bq, 0), tn.shape(1, 1, bq, dv)).store(tn.cast(acc / den, dt))

    return flash_attention


def softmax_merge(ma, la, aa, mb, lb, ab):  # type: ignore[no-untyped-def]
    """Merge two online-softmax states ``(m, l, acc)``: the running maximum,
    the sum of ``exp(s - m)`` and the ``exp(s - m)``-weighted sum of values.
    Each side is rescaled to the joint maximum; a side whose maximum is
    ``-inf`` (an empty state, the identity) weighs 0, so that merging two
    empty states stays empty instead of ``exp(-inf - -inf)`` = NaN. The
    merge is associative and commutative with identity ``(-inf, 0, 0)``
    over the reals (``tilenest check`` proves it)."""
    m = tn.maximum(ma, mb)
    wa = tn.ite(ma > -np.inf, tn.exp(ma - m), 0.0)
    wb = tn.ite(mb > -np.inf, tn.exp(mb - m), 0.0)
    return m, la * wa + lb * wb, aa * wa + ab * wb


@functools.cache
def split_kv_kernel(dt):  # type: ignore[no-untyped-def]
    """Attention for decode: each program's key blocks form a ``reduce``
    under the online-softmax contract (:func:`softmax_merge`), so a schedule
    may split the key axis over programs (``reduce_splits``) and merge the
    partial states as a tree, which the contract's proved laws justify. Each
    key block contributes its own state: its scores' maximum, the sum of
    their exponentials and the exponential-weighted values (``P`` rounded to
    ``dt`` for ``P V``, as in :func:`flash_kernel`). ``m`` and ``l`` are per
    query row and ``acc`` per row and value column: the merge runs element by
    element of ``acc``, the row states broadcast (R-11)."""
    @tn.kernel
    def split_kv_attention(q: tn.Tensor[dt, "B HQ Q D"], k: tn.Tensor[dt, "B HK K D"],
                           v: tn.Tensor[dt, "B HK K DV"], o: tn.Tensor[dt, "B HQ Q DV"],
                           scale: tn.Scalar[f32], *, bq=16, bk=16, dh=16, dv=16):
        (nb, hq, nq, hk, nk, _, _), (b, h, qd, d, kd, e), (k, v, o), group = _gqa(
            q, k, v, o, dh, dv)
        osm = tn.reducer("online_softmax", identity=(-np.inf, 0.0, 0.0), merge=softmax_merge,
                         dtype=(f32, f32, f32))
        for p in tn.parallel(tn.shape(nb, hq, tn.cdiv(nq, bq)), exec=tn.exec.block):
            z, hh, qb = p.index(0), p.index(1), p.index(2)
            kvh = hh // group
            qt = q[tn.coord(z, hh, qb * bq, 0), tn.shape(1, 1, bq, dh), tn.bounds.zero]
            out = tn.shape(1, 1, bq, dv)
            m = tn.full(f32, tn.shape(1, 1, bq), -np.inf, dims=(b, h, qd))
            den = tn.zeros(f32, tn.shape(1, 1, bq), dims=(b, h, qd))
            acc = tn.zeros(f32, out, dims=(b, h, qd, e))
            for kb in p.reduce(tn.shape(tn.cdiv(nk, bk)), contract=osm,
                               policy=tn.unordered_tree):
                s, vt = _block_scores(qt, k, v, (z, kvh, qb, kb.index()), (bq, bk, dh, dv),
                                      (nq, nk), (b, h, qd, kd), scale, True)
                mc = tn.reduce(s, kd, tn.maximum)
                pr = tn.exp(s - tn.ite(mc > -np.inf, mc, 0.0))  # a row with no key: all 0
                lc = tn.reduce(pr, kd, tn.add)
                ac = tn.mma(tn.cast(pr, dt), vt, tn.zeros(f32, out, dims=(b, h, qd, e)),
                            allow_reassociation=True)
                m, den, acc = softmax_merge(m, den, acc, mc, lc, ac)
            o(tn.coord(z, hh, qb * bq, 0), out).store(tn.cast(acc / den, dt))

    return split_kv_attention


@functools.cache
def gqa_decode_kernel(dt):  # type: ignore[no-untyped-def]
    """Decode attention with the query heads of a key/value group as the rows
    of one tile: one program per (batch, key/value head, query position)
    reads that head's keys and values once for all ``HQ / HK`` query heads
    that share them, where :func:`split_kv_kernel` reads them once per query
    head. The ``bg`` rows of the tile are the group's heads (a tile constant,
    at least the group size): the query is read through a view of the group
    (rows past it read ``+0``) and the output stored through one (rows past
    it are dropped). Key blocks reduce under the online-softmax contract, as
    in :func:`split_kv_kernel`, so a schedule may split them over programs
    (``reduce_splits``)."""
    @tn.kernel
    def gqa_decode_attention(q: tn.Tensor[dt, "B HQ Q D"], k: tn.Tensor[dt, "B HK K D"],
                             v: tn.Tensor[dt, "B HK K DV"], o: tn.Tensor[dt, "B HQ Q DV"],
                             scale: tn.Scalar[f32], *, bg=16, bk=16, dh=16, dv=16):
        (nb, hq, nq, hk, nk, ndh, ndv), (b, h, qd, d, kd, e), _, group = _gqa(
            q, k, v, o, dh, dv)
        tn.assume(group <= bg)  # the tile's rows hold the whole group
        # keys and values: the query's batch dim, its (unit) position dim as
        # their head dim, so the products' only free dims are heads and keys
        kk, vv = k.with_dims(b, qd, kd, d), v.with_dims(b, qd, kd, e)
        osm = tn.reducer("online_softmax", identity=(-np.inf, 0.0, 0.0), merge=softmax_merge,
                         dtype=(f32, f32, f32))
        for p in tn.parallel(tn.shape(nb, hk, nq), exec=tn.exec.block):
            z, kvh, qi = p.index(0), p.index(1), p.index(2)
            heads = tn.coord(z, kvh * group, qi, 0)
            qt = q.view(heads, tn.shape(1, group, 1, ndh))[
                tn.coord(0, 0, 0, 0), tn.shape(1, bg, 1, dh), tn.bounds.zero]
            out = tn.shape(1, bg, 1, dv)
            m = tn.full(f32, tn.shape(1, bg, 1), -np.inf, dims=(b, h, qd))
            den = tn.zeros(f32, tn.shape(1, bg, 1), dims=(b, h, qd))
            acc = tn.zeros(f32, out, dims=(b, h, qd, e))
            for kb in p.reduce(tn.shape(tn.cdiv(nk, bk)), contract=osm,
                               policy=tn.unordered_tree):
                pos = tn.coord(z, kvh, kb.index() * bk, 0)
                kt = kk[pos, tn.shape(1, 1, bk, dh), tn.bounds.zero]
                vt = vv[pos, tn.shape(1, 1, bk, dv), tn.bounds.zero]
                s = tn.mma(qt, kt, tn.zeros(f32, tn.shape(1, bg, 1, bk), dims=(b, h, qd, kd)),
                           allow_reassociation=True) * scale
                kpos = tn.index_tile(tn.shape(tn.axis(h, bg), tn.axis(qd, 1), tn.axis(kd, bk)),
                                     lambda i, j, c: kb.index() * bk + c)
                # query position qi sits at key position nk - nq + qi (bottom-right)
                s = tn.ite((kpos <= qi + nk - nq) & (kpos < nk), s, -np.inf)
                mc = tn.reduce(s, kd, tn.maximum)
                pr = tn.exp(s - tn.ite(mc > -np.inf, mc, 0.0))  # a row with no key: all 0
                lc = tn.reduce(pr, kd, tn.add)
                ac = tn.mma(tn.cast(pr, dt), vt, tn.zeros(f32, out, dims=(b, h, qd, e)),
                            allow_reassociation=True)
                m, den, acc = softmax_merge(m, den, acc, mc, lc, ac)
            o.view(heads, tn.shape(1, group, 1, ndv))(
                tn.coord(0, 0, 0, 0), out).store(tn.cast(acc / den, dt))

    return gqa_decode_attention


def _head_tiles(s):  # type: ignore[no-untyped-def]
    """The head-dim tiles of a size: D and DV rounded up to 16."""
    return {"dh": -(-s["D"] // 16) * 16, "dv": -(-s["DV"] // 16) * 16}


def _args(rng, s, dt):  # type: ignore[no-untyped-def]
    nb, hq, hk, nq, nk, dh, dv = (s[x] for x in ("B", "HQ", "HK", "Q", "K", "D", "DV"))
    return {"q": normal(rng, (nb, hq, nq, dh), dt), "k": normal(rng, (nb, hk, nk, dh), dt),
            "v": normal(rng, (nb, hk, nk, dv), dt), "o": sentinel((nb, hq, nq, dv), dt),
            "scale": np.float32(1.0 / np.sqrt(dh))}


def _formula(a, s, dt, fast=False, exp_ulp=1.0, log2=False):  # type: ignore[no-untyped-def]
    """The FP64 formula and its bound (module docstring); ``fast``: the
    kernel of :func:`flash_kernel` (products regrouped with faithful
    additions, P rounded to ``dt`` before ``P V``); ``exp_ulp``: the bound of
    its exponentials in ulp of f32 (each within a factor ``1 + 2 exp_ulp u``);
    ``log2``: its scores are ``fl(q . k * c)`` with ``c = fl(scale * LOG2E)``
    and its exponentials powers of two. ``fl(x c) ln2`` is ``fl(x scale)``'s
    form times ``(1 + d1)(1 + d2)``, ``|d1|, |d2| <= u`` (the roundings of
    ``c`` and of ``LOG2E``), which step 1's ``sigma`` takes in; a difference
    of two such scores then rounds and exponentiates as before (``2^(u |d|)
    = e^(u |d| ln2)``)."""
    u = B.unit(B.D.f32)
    nb, hq, hk, nq, nk = (s[x] for x in ("B", "HQ", "HK", "Q", "K"))
    heads = np.arange(hq) // (hq // hk)
    qx = x64(a["q"])
    kx = x64(a["k"])[:, heads]
    vv = a["v"].astype(np.float64)[:, heads]                   # [B, Hq, K, Dv]
    zero = B.Approx.exact(np.zeros((nb, hq, nq, nk), np.float32))
    sc = B.contract("bhqd,bhkd->bhqk", qx, kx, zero) * B.Approx.const(float(a["scale"]), B.D.f32)
    if log2:
        grow = (1 + u) ** 2
        sc = B.Approx(sc.v, sc.e * grow + (np.abs(sc.v) + sc.e) * (grow - 1), B.D.f32)
    valid = np.arange(nk)[None, :] <= (nk - nq + np.arange(nq))[:, None]     # [Q, K]
    sv = np.where(valid, sc.v, -np.inf)
    w = np.exp(sv - sv.max(axis=-1, keepdims=True))
    w = w / w.sum(axis=-1, keepdims=True)                    # exact softmax weights
    out = np.einsum("bhqk,bhkd->bhqd", w, vv)                # the FP64 formula
    sigma = np.where(valid, sc.e, 0.0).max(axis=-1, keepdims=True)
    spread = np.where(valid[:, :, None], np.abs(vv[:, :, None, :, :] - out[:, :, :, None, :]), 0.0)
    pert = np.expm1(2 * sigma) * np.einsum("bhqk,bhqkd->bhqd", w, spread)
    lo = np.where(valid, sc.v, np.inf).min(axis=-1, keepdims=True)
    rng_ = sc.v.max(axis=-1, keepdims=True) - lo + 2 * sigma
    t = nk
    de = (1 + 2 * exp_ulp * u) * np.exp(u * rng_) - 1
    dl = (1 + de) ** (t + 1) * (1 + u) ** (2 * t) * (1 + B.gamma(nk, B.D.f32)) - 1
    terms = 2 * (nk + 1) if fast else nk + 1  # a faithful addition counts as two nearest
    da = (1 + de) ** (t + 1) * (1 + u) ** (2 * t) * (1 + B.gamma(terms, B.D.f32)) - 1
    wv = np.exp(2 * sigma) * np.einsum("bhqk,bhkd->bhqd", w, np.abs(vv))
    ostar = np.abs(out) + pert
    rec = (da * wv + ostar * dl) / (1 - dl)
    if fast:  # each probability rounded once to dt before P V
        rec = rec + B.unit(dt) * wv * (1 + da) / (1 - dl)
    err = pert + rec + u * (ostar + rec) + B.eta(B.D.f32)
    err = err + B.SLACK64 * nk * (np.abs(out) + wv)
    return {"o": B.cast(B.Approx(out, err, B.D.f32), dt)}


def _sizes(**named):  # type: ignore[no-untyped-def]
    keys = ("B", "HQ", "HK", "Q", "K", "D", "DV")
    return {n: dict(zip(keys, v, strict=True)) for n, v in named.items()}


_SCHEDULES = ({"bq": 2, "bk": 3, "loop": "serial"}, {"bq": 3, "bk": 5, "loop": "pipeline"},
              {"bq": 1, "bk": 1, "loop": "serial"}, {"bq": 8, "bk": 16, "loop": "serial"})

def _decode_sizes(gqa: tuple[int, ...]) -> dict:
    """The decode kernels' sizes, all but their GQA case ``gqa`` shared (the
    GQA decode kernel's takes a group of four query heads)."""
    return _sizes(small=(1, 4, 2, 1, 9, 4, 4), decode=(2, 4, 1, 1, 41, 16, 16), gqa=gqa,
                  medium=(1, 8, 2, 1, 300, 29, 29), large=(2, 16, 4, 1, 4096, 128, 128))

WORKLOADS = [
    Workload("attention_gqa", "attention", "online causal GQA/MQA attention, bottom-right mask",
             attention_kernel, _args, _formula,
             _sizes(small=(1, 2, 2, 4, 5, 4, 3), gqa=(2, 4, 2, 7, 11, 8, 7),
                    mqa=(2, 4, 1, 1, 17, 8, 7), medium=(2, 4, 2, 24, 40, 16, 16),
                    large=(2, 8, 2, 128, 256, 64, 64)),
             _SCHEDULES),
    Workload("attention_mha", "attention", "MHA decode (Q=1) and prefill (Q=K), ragged K",
             attention_kernel, _args, _formula,
             _sizes(small=(2, 2, 2, 1, 7, 4, 4), decode=(2, 4, 4, 1, 37, 8, 8),
                    prefill=(2, 2, 2, 19, 19, 8, 8), medium=(2, 4, 4, 1, 301, 16, 16),
                    large=(2, 8, 8, 256, 256, 64, 64)),
             (_SCHEDULES[0], _SCHEDULES[1], _SCHEDULES[3])),
    Workload("flash_attention", "attention",
             "causal GQA attention written for speed: 16-bit products, P cast, causal trip count",
             flash_kernel, _args,
             functools.partial(_formula, fast=True, exp_ulp=FLASH_EXP_ULP, log2=True),
             _sizes(small=(1, 4, 2, 5, 9, 4, 4), gqa=(2, 4, 2, 19, 37, 8, 8),
                    decode=(2, 4, 1, 1, 41, 16, 16), medium=(1, 4, 2, 40, 70, 29, 29),
                    large=(2, 16, 4, 512, 512, 128, 128)),
             ({"bq": 16, "bk": 16}, {"bq": 32, "bk": 16}), size_consts=_head_tiles),
    Workload("split_kv_attention", "attention",
             "decode attention whose key blocks reduce under the online-softmax contract",
             split_kv_kernel, _args, functools.partial(_formula, fast=True),
             _decode_sizes((2, 4, 2, 3, 37, 8, 8)),
             ({"bq": 16, "bk": 16}, {"bq": 16, "bk": 32}), size_consts=_head_tiles),
    Workload("gqa_decode_attention", "attention",
             "decode attention reading each key/value head once for its group of query heads",
             gqa_decode_kernel, _args, functools.partial(_formula, fast=True),
             _decode_sizes((2, 8, 2, 3, 37, 8, 8)),
             ({"bg": 16, "bk": 16}, {"bg": 16, "bk": 32}), size_consts=_head_tiles),
]
