"""Causal attention, one query row per program: row ``i`` attends to keys
``0..i``, so its key loop has ``i + 1`` iterations -- the trip count depends on
the instance. The loop carries an online softmax (running maximum ``m``,
denominator ``l`` and weighted sum ``acc``) and no mask: the causal structure
is the domain ``serial(shape(i + 1))`` itself.

On the batched interpreter the rows run in lockstep; each row is masked to its
own iterations (the box of all rows' domains is ``S`` iterations long).
``causal_attention_blocked`` is the tiled form (``bq`` queries per program,
key blocks of ``bk`` up to the diagonal).
"""

import numpy as np

import tilenest as tn
from tilenest import f32


@tn.kernel
def causal_attention(q: tn.Tensor[f32, "S D"], k: tn.Tensor[f32, "S D"],
                     v: tn.Tensor[f32, "S E"], o: tn.Tensor[f32, "S E"], scale: tn.Scalar[f32]):
    seq, dh = q.shape
    ev = v.shape[1]
    r, d = q.dims()
    kr = k.dim(0)
    e = v.dim(1)
    k = k.with_dims(kr, d)
    v = v.with_dims(kr, e)
    o = o.with_dims(r, e)
    for p in tn.parallel(tn.shape(seq)):
        i = p.index()
        qt = q[tn.coord(i, 0), tn.shape(1, dh)]
        m = tn.full(f32, tn.shape(1), -np.inf, dims=(r,))
        den = tn.zeros(f32, tn.shape(1), dims=(r,))
        acc = tn.zeros(f32, tn.shape(1, ev), dims=(r, e))
        for kv in p.serial(tn.shape(i + 1)):
            j = kv.index()
            kt = k[tn.coord(j, 0), tn.shape(1, dh)]
            vt = v[tn.coord(j, 0), tn.shape(1, ev)]
            s = tn.mma(qt, kt, tn.zeros(f32, tn.shape(1, 1), dims=(r, kr))) * scale
            m_new = tn.maximum(m, tn.reduce(s, kr, tn.maximum))
            alpha = tn.exp(m - m_new)
            pr = tn.exp(s - m_new)
            den = den * alpha + tn.reduce(pr, kr, tn.add)
            acc = acc * alpha + tn.mma(pr, vt, tn.zeros(f32, tn.shape(1, ev), dims=(r, e)))
            m = m_new
        o(tn.coord(i, 0), tn.shape(1, ev)).store(acc / den)


@tn.kernel
def causal_attention_blocked(q: tn.Tensor[f32, "S D"], k: tn.Tensor[f32, "S D"],
                             v: tn.Tensor[f32, "S E"], o: tn.Tensor[f32, "S E"],
                             scale: tn.Scalar[f32], *, bq=4, bk=3):
    """The blocked form: one program per ``bq`` queries, a loop over the key
    blocks up to the diagonal -- ``cdiv((qb + 1) * bq, bk)`` of them, again a
    trip count of the instance -- and a mask inside the blocks it crosses."""
    seq, dh = q.shape
    ev = v.shape[1]
    r, d = q.dims()
    kr = k.dim(0)
    e = v.dim(1)
    k = k.with_dims(kr, d)
    v = v.with_dims(kr, e)
    o = o.with_dims(r, e)
    for p in tn.parallel(tn.shape(tn.cdiv(seq, bq))):
        qb = p.index()
        qt = q[tn.coord(qb * bq, 0), tn.shape(bq, dh), tn.bounds.zero]
        m = tn.full(f32, tn.shape(bq), -np.inf, dims=(r,))
        den = tn.zeros(f32, tn.shape(bq), dims=(r,))
        acc = tn.zeros(f32, tn.shape(bq, ev), dims=(r, e))
        for kb in p.serial(tn.shape(tn.cdiv((qb + 1) * bq, bk))):
            kt = k[tn.coord(kb.index() * bk, 0), tn.shape(bk, dh), tn.bounds.zero]
            vt = v[tn.coord(kb.index() * bk, 0), tn.shape(bk, ev), tn.bounds.zero]
            s = tn.mma(qt, kt, tn.zeros(f32, tn.shape(bq, bk), dims=(r, kr))) * scale
            pair = tn.shape(tn.axis(r, bq), tn.axis(kr, bk))
            qpos = tn.index_tile(pair, lambda i, j: qb * bq + i)
            kpos = tn.index_tile(pair, lambda i, j: kb.index() * bk + j)
            s = tn.ite(kpos <= qpos, s, -np.inf)
            m_new = tn.maximum(m, tn.reduce(s, kr, tn.maximum))
            alpha = tn.exp(m - m_new)
            pr = tn.exp(s - m_new)
            den = den * alpha + tn.reduce(pr, kr, tn.add)
            acc = acc * alpha + tn.mma(pr, vt, tn.zeros(f32, tn.shape(bq, ev), dims=(r, e)))
            m = m_new
        o(tn.coord(qb * bq, 0), tn.shape(bq, ev)).store(acc / den)


def example_inputs(rng):
    s, dh, ev = 19, 8, 5
    q = rng.standard_normal((s, dh)).astype(np.float32)
    k = rng.standard_normal((s, dh)).astype(np.float32)
    v = rng.standard_normal((s, ev)).astype(np.float32)
    return q, k, v, np.zeros((s, ev), np.float32), np.float32(1 / np.sqrt(dh))


def numpy_reference(q, k, v, o, scale):
    sc = (q.astype(np.float64) @ k.astype(np.float64).T) * float(scale)
    s = sc.shape[0]
    sc = np.where(np.arange(s)[None, :] <= np.arange(s)[:, None], sc, -np.inf)
    w = np.exp(sc - sc.max(axis=1, keepdims=True))
    return ((w / w.sum(axis=1, keepdims=True)) @ v.astype(np.float64)).astype(np.float32)
