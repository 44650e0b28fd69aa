"""Tiled GEMM: C = A @ B with a pipelined K loop and ragged edges masked.

The output block is one logical program; the K loop is a pipeline whose
"load" stage produces the A/B tiles and whose "compute" stage updates the
accumulator (a carried state). Out-of-range reads are zero-filled and
out-of-range stores are masked (bounds policy ``zero``). ``reassoc=False``
makes every output element sum its products in K order (bitwise the
interpreter on every target)."""

import tilenest as tn
from tilenest import f32


@tn.kernel
def gemm(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], C: tn.Tensor[f32, "M N"], *,
         bm=32, bn=32, bk=32, reassoc=True):
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    for nest in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
        i, j = nest.index(0), nest.index(1)
        acc = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
        for kk in nest.pipeline(tn.shape(tn.cdiv(K, bk)), tn.pipeline_policy(window=2)):
            kk.stage("load")
            a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
            b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
            kk.stage("compute")
            acc = tn.mma(a, b, acc, allow_reassociation=reassoc)
        C(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(acc)


def example_inputs(rng):
    a = rng.standard_normal((70, 45)).astype("float32")
    b = rng.standard_normal((45, 33)).astype("float32")
    return a, b, (a[:, :33] @ b[:33, :] * 0)


def numpy_reference(a, b, c):
    return a @ b
