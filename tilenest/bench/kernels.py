"""The kernels the benchmarks time, kept inside the package so that an
installed tilenest can run them (``examples/`` is not installed).

``row_softmax`` and ``gemm`` are the programs of ``examples/softmax.py`` and
``examples/gemm.py``; ``rmsnorm_rows`` that of ``examples/rmsnorm.py``. The
GEMM's ``mma`` allows reassociation unless ``reassoc=False`` (then every output
element sums its products in K order, separately rounded: bitwise the
interpreter).

The rest are written as a user new to the DSL would write them: ``swiglu``
(the gated MLP of LLMs, two GEMMs sharing each loaded ``x`` tile, one ``mma``
accumulator each), ``bmm_nt`` (a batched product with the second operand
stored transposed, as attention's ``Q @ K^T``: the contraction dimension is
named, not positioned), ``global_sum`` (a whole array to one scalar: a
``reduce`` region over chunks at the top level), ``logsumexp`` (a row's
``m + log(sum(exp(x - m)))``, the normalizer of a cross-entropy: a reduction
of exponentials that stores none), and the two bandwidth
probes ``read`` (every element read once, one sum per block of rows written)
and ``copy``. Built on first use: importing this module captures nothing.
"""

import functools
from typing import Any


@functools.cache
def fp8_gemm_kernel(out: Any, a_dt: Any = None, b_dt: Any = None) -> Any:
    """``C = (A B) sa sb`` rounded to ``out`` (``kernels()["fp8_gemm"]``: bf16):
    FP8 operands (``a_dt``, ``b_dt``; default e4m3fn) with per-tensor scales, ``B`` stored transposed (``N x
    K``, as ``torch._scaled_mm`` takes it), f32 accumulation, the scales
    applied to the sum. With ``out`` f32 and unit scales the output is the
    accumulator itself (``benchmarks/fp8_accumulation.py``)."""
    import tilenest as tn
    from tilenest import f32

    a_dt = a_dt or tn.f8e4m3fn
    b_dt = b_dt or tn.f8e4m3fn

    @tn.kernel
    def fp8_gemm(A: tn.Tensor[a_dt, "M K"], Bt: tn.Tensor[b_dt, "N K"],
                 C: tn.Tensor[out, "M N"], sa: tn.Scalar[f32], sb: tn.Scalar[f32], *,
                 bm=64, bn=64, bk=64):
        M, K = A.shape
        N = Bt.shape[0]
        m, k = A.dims()
        n = C.dim(1)
        Bt = Bt.with_dims(n, k)
        C = C.with_dims(m, n)
        for p in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
            i, j = p.index(0), p.index(1)
            acc = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
            for kk in p.pipeline(tn.shape(tn.cdiv(K, bk)), tn.pipeline_policy(window=2)):
                kk.stage("load")
                a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
                w = Bt[tn.coord(j * bn, kk.index() * bk), tn.shape(bn, bk), tn.bounds.zero]
                kk.stage("compute")
                acc = tn.mma(a, w, acc, allow_reassociation=True)  # contracts k
            C(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(tn.cast(acc * (sa * sb), out))

    return fp8_gemm


@functools.cache
def bmm_nt_kernel(dt: Any) -> Any:
    """``C[z] = A[z] B[z]^T`` with ``B`` stored ``[batch, N, K]``, ``dt``
    throughout (``kernels()["bmm_nt"]``: f32): one program per batch member
    and ``bm x bn`` output tile."""
    import tilenest as tn

    @tn.kernel
    def bmm_nt(A: tn.Tensor[dt, "B M K"], Bt: tn.Tensor[dt, "B N K"],
               C: tn.Tensor[dt, "B M N"], *, bm=32, bn=32, bk=32):
        nb, M, K = A.shape
        N = Bt.shape[1]
        b, m, k = A.dims()
        n = C.dim(2)
        Bt = Bt.with_dims(b, n, k)
        C = C.with_dims(b, m, n)
        for p in tn.parallel(tn.shape(nb, tn.cdiv(M, bm), tn.cdiv(N, bn))):
            z, i, j = p.index(0), p.index(1), p.index(2)
            acc = tn.zeros(dt, tn.shape(1, bm, bn), dims=(b, m, n))
            for kk in p.pipeline(tn.shape(tn.cdiv(K, bk)), tn.pipeline_policy(window=2)):
                kk.stage("load")
                a = A[tn.coord(z, i * bm, kk.index() * bk), tn.shape(1, bm, bk), tn.bounds.zero]
                w = Bt[tn.coord(z, j * bn, kk.index() * bk), tn.shape(1, bn, bk), tn.bounds.zero]
                kk.stage("compute")
                acc = tn.mma(a, w, acc)   # contracts k, the dimension a and w share
            C(tn.coord(z, i * bm, j * bn), tn.shape(1, bm, bn)).store(acc)

    return bmm_nt


@functools.cache
def kernels() -> dict[str, Any]:
    """name -> kernel: softmax, rmsnorm (a row per program), rmsnorm_rows
    (``rows_per_program`` rows), layernorm, add, fp8_quantize, fp8_dequantize,
    fp8_gemm, row_sum, logsumexp, gemm, gemm_strict,
    swiglu, bmm_nt, global_sum, read, copy."""
    import tilenest as tn
    from tilenest import f32

    @tn.kernel
    def row_softmax(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
        rows, cols = x.shape
        for p in tn.parallel(tn.shape(rows)):
            row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
            m = tn.reduce(row, row.dim(1), tn.maximum)
            e = tn.exp(row - m)
            s = tn.reduce(e, e.dim(1), tn.add)
            y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(e / s)

    @tn.kernel
    def rmsnorm(x: tn.Tensor[f32, "R C"],
                w: tn.Tensor[f32, "C"],  # noqa: F821 (a shape's name)
                y: tn.Tensor[f32, "R C"], eps: tn.Scalar[f32]):
        rows, cols = x.shape
        c = x.dim(1)
        w = w.with_dims(c)
        for p in tn.parallel(tn.shape(rows)):
            xs = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
            ms = tn.reduce(xs * xs, c, tn.add) / tn.cast(cols, f32)
            y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(
                xs * tn.rsqrt(ms + eps) * w[tn.coord(0), tn.shape(cols)])

    @tn.kernel
    def rmsnorm_rows(x: tn.Tensor[f32, "R C"],
                     w: tn.Tensor[f32, "C"],  # noqa: F821
                     y: tn.Tensor[f32, "R C"], eps: tn.Scalar[f32], *, rows_per_program=4):
        rows, cols = x.shape
        c = x.dim(1)
        w = w.with_dims(c)
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rows_per_program))):
            r0 = p.index() * rows_per_program
            xs = x[tn.coord(r0, 0), tn.shape(rows_per_program, cols)]
            ms = tn.reduce(xs * xs, c, tn.add) / tn.cast(cols, f32)
            y(tn.coord(r0, 0), tn.shape(rows_per_program, cols)).store(
                xs * tn.rsqrt(ms + eps) * w[tn.coord(0), tn.shape(cols)])

    @tn.kernel
    def layernorm(x: tn.Tensor[f32, "R C"],
                  w: tn.Tensor[f32, "C"], b: tn.Tensor[f32, "C"],  # noqa: F821
                  y: tn.Tensor[f32, "R C"], eps: tn.Scalar[f32]):
        rows, cols = x.shape
        c = x.dim(1)
        w = w.with_dims(c)
        b = b.with_dims(c)
        for p in tn.parallel(tn.shape(rows)):
            t = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
            mu = tn.reduce(t, c, tn.add) / tn.cast(cols, f32)
            d = t - mu
            var = tn.reduce(d * d, c, tn.add) / tn.cast(cols, f32)
            y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(
                d * tn.rsqrt(var + eps) * w[tn.coord(0), tn.shape(cols)]
                + b[tn.coord(0), tn.shape(cols)])

    @tn.kernel
    def add(x: tn.Tensor[f32, "R C"], z: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
        rows, cols = x.shape
        z = z.with_dims(*x.dims())
        for p in tn.parallel(tn.shape(rows)):
            o = tn.coord(p.index(), 0)
            y(o, tn.shape(1, cols)).store(x[o, tn.shape(1, cols)] + z[o, tn.shape(1, cols)])

    @tn.kernel
    def fp8_quantize(x: tn.Tensor[f32, "R C"], q: tn.Tensor[tn.f8e4m3fn, "R C"],
                     scale: tn.Scalar[f32]):
        """Per-tensor scaled quantization to e4m3fn, saturating (V-24)."""
        rows, cols = x.shape
        q = q.with_dims(*x.dims())
        for p in tn.parallel(tn.shape(rows)):
            o = tn.coord(p.index(), 0)
            q(o, tn.shape(1, cols)).store(
                tn.cast(x[o, tn.shape(1, cols)] * scale, tn.f8e4m3fn, overflow="saturate"))

    @tn.kernel
    def fp8_dequantize(q: tn.Tensor[tn.f8e4m3fn, "R C"], y: tn.Tensor[f32, "R C"],
                       scale: tn.Scalar[f32]):
        """e4m3fn values widened (exactly) and scaled back to f32."""
        rows, cols = q.shape
        y = y.with_dims(*q.dims())
        for p in tn.parallel(tn.shape(rows)):
            o = tn.coord(p.index(), 0)
            y(o, tn.shape(1, cols)).store(tn.cast(q[o, tn.shape(1, cols)], f32) * scale)

    @tn.kernel
    def row_sum(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R"]):  # noqa: F821
        rows, cols = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(tn.cdiv(rows, 4))):
            t = x[tn.coord(p.index() * 4, 0), tn.shape(4, cols)]
            y(tn.coord(p.index() * 4), tn.shape(4)).store(tn.reduce(t, t.dim(1), tn.add))

    @tn.kernel
    def logsumexp(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R"]):  # noqa: F821
        rows, cols = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(rows)):
            row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
            m = tn.reduce(row, row.dim(1), tn.maximum)
            s = tn.reduce(tn.exp(row - m), row.dim(1), tn.add)
            y(tn.coord(p.index()), tn.shape(1)).store(m + tn.log(s))

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

    @tn.kernel
    def swiglu(x: tn.Tensor[f32, "M K"], wg: tn.Tensor[f32, "K N"],
               wu: tn.Tensor[f32, "K N"], h: tn.Tensor[f32, "M N"], *, bm=32, bn=32, bk=32):
        M, K = x.shape
        N = wg.shape[1]
        m, k = x.dims()
        n = h.dim(1)
        wg = wg.with_dims(k, n)
        wu = wu.with_dims(k, n)
        h = h.with_dims(m, n)
        for p in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
            i, j = p.index(0), p.index(1)
            gate = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
            up = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
            for kk in p.pipeline(tn.shape(tn.cdiv(K, bk)), tn.pipeline_policy(window=2)):
                kk.stage("load")
                a = x[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
                g = wg[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
                u = wu[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
                kk.stage("compute")
                gate = tn.mma(a, g, gate)
                up = tn.mma(a, u, up)
            h(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(gate * tn.sigmoid(gate) * up)

    @tn.kernel
    def global_sum(x: tn.Tensor[f32, "N"], total: tn.Tensor[f32, "1"], *,  # noqa: F821
                   chunk=16384):
        (n,) = x.shape
        (e,) = x.dims()
        total = total.with_dims(e)
        s = tn.zeros(f32, tn.shape(1), dims=(e,))
        for c in tn.reduce(tn.shape(tn.cdiv(n, chunk)), contract=tn.add):
            part = x[tn.coord(c.index() * chunk), tn.shape(chunk), tn.bounds.zero]
            s = s + tn.reduce(part, e, tn.add)
        total(tn.coord(0), tn.shape(1)).store(s)

    @tn.kernel
    def read(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "P"], *, rp=8):  # noqa: F821
        rows, cols = x.shape
        r, c = x.dims()
        y = y.with_dims(r)
        for p in tn.parallel(tn.shape(tn.cdiv(rows, rp))):
            t = x[tn.coord(p.index() * rp, 0), tn.shape(rp, cols), tn.bounds.zero]
            s = tn.reduce(tn.reduce(t, c, tn.add), r, tn.add)
            y(tn.coord(p.index()), tn.shape(1)).store(s)

    @tn.kernel
    def copy(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
        rows, cols = x.shape
        for p in tn.parallel(tn.shape(rows)):
            o = tn.coord(p.index(), 0)
            y(o, tn.shape(1, cols)).store(x[o, tn.shape(1, cols)])

    return {"softmax": row_softmax, "rmsnorm": rmsnorm, "rmsnorm_rows": rmsnorm_rows,
            "layernorm": layernorm, "add": add, "fp8_quantize": fp8_quantize,
            "fp8_dequantize": fp8_dequantize, "fp8_gemm": fp8_gemm_kernel(tn.bf16),
            "row_sum": row_sum, "logsumexp": logsumexp, "gemm": gemm,
            "gemm_strict": gemm.specialize(reassoc=False), "swiglu": swiglu, "bmm_nt": bmm_nt_kernel(f32),
            "global_sum": global_sum, "read": read, "copy": copy}
