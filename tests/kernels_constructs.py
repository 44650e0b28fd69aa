"""Kernels that exercise every construct the foundation captures.

Shared by the capture, analysis and interchange tests (and the interpreter's
tests later): each kernel is small and uses symbolic extents."""

from __future__ import annotations

import tilenest as tn
from tilenest import f32, i32, i64


@tn.kernel
def all_regions(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"], *, bc=8):
    """parallel -> parallel(warp) -> serial -> pipeline(stages) -> reduce, with an
    ancestor-owned accumulator updated through a child frontier."""
    rows, cols = x.shape
    for nest in tn.parallel(tn.shape(rows)):
        acc = tn.zeros(f32, tn.shape(1, bc), dims=(x.dim(0), x.dim(1)))
        for sub in nest.parallel(tn.shape(2), exec=tn.exec.warp):
            for s in sub.serial(tn.shape(2)):
                for k in s.pipeline(tn.shape(tn.cdiv(cols, bc)), tn.pipeline_policy(2, 1)):
                    k.stage("load")
                    t = x[tn.coord(nest.index(), k.index() * bc), tn.shape(1, bc)]
                    k.stage("accumulate")
                    acc = acc + t
        total = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
        for r in nest.reduce(acc.domain(acc.dim(1))):
            total += acc.at(r)
        y(tn.coord(nest.index(), 0), tn.shape(1, bc)).store(acc / total)


@tn.kernel
def values_zoo(x: tn.Tensor[f32, "N"], idx: tn.Tensor[i32, "N"], y: tn.Tensor[f32, "N"],
               eps: tn.Scalar[f32], *, b=16):
    (n,) = x.shape
    d = x.dim(0)
    idx = idx.with_dims(d)
    y = y.with_dims(d)
    tn.assume(n >= 1)
    for p in tn.parallel(tn.shape(tn.cdiv(n, b))):
        o = tn.coord(p.index() * b)
        v = x[o, tn.shape(b), tn.bounds.fill(1.0)]
        j = idx[o, tn.shape(b), tn.bounds.checked]
        w = tn.ite(v > 0.0, tn.exp(v), -v)
        w = tn.map(w, v, lambda a, c: a * c + 1.0)
        w = tn.maximum(w, eps) + tn.cast(j, f32)
        lanes = tn.iota(tn.shape(tn.axis(d, b)), 0)
        w = tn.ite(lanes + p.index() * b < n, w, 0.0)
        g = tn.gather(v, tn.cast(j, i64) % b, 0, 0.0)
        c = tn.cumsum(w, d)
        m = tn.argmax(w, d)
        vals, src = tn.topk(w, d, 3)
        s = tn.reduce(c + g, d, tn.add)
        r = tn.reshape(tn.broadcast(s, tn.shape(tn.axis(d, b))), tn.shape(4, b // 4))
        pr = tn.permute(r, (1, 0))
        back = tn.reindex(pr, tn.shape(tn.axis(d, b)), lambda i: (i % (b // 4), i // (b // 4)))
        u = tn.put(back, (0,), tn.broadcast(tn.cast(m, f32), tn.shape(tn.axis(d, 1))))
        u = tn.put(u, (1,), tn.reindex(vals, tn.shape(tn.axis(d, 1)), lambda i: (i,)))
        first = tn.per(p, tn.cast(src.slice((0,), (1,)), f32))
        y(o, tn.shape(b)).store(tn.put(u, (2,), first))


@tn.kernel
def control_flow(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(n)):
        v = x[tn.coord(p.index()), tn.shape(1)]
        s = tn.reduce(v, v.dim(0), tn.add)
        if tn.if_(s > 0.0):
            v = v * 2.0
        else:
            v = -v
        it = tn.scalar(0, i32)
        while tn.while_(it < 3):
            v = v + 1.0
            it = it + 1
        y(tn.coord(p.index()), tn.shape(1)).store(v)


@tn.kernel
def memory_and_layouts(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"], *, b=8):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(rows, b))):
        blk = x[tn.coord(p.index() * b, 0), tn.shape(b, b)]
        padded = tn.memory(f32, tn.layout(blk.shape(), strides=(b + 1, 1)), tn.mem.shared)
        swz = tn.memory(f32, tn.layout(blk.shape(), offset=lambda i, j: i * b + (j ^ (i % b)),
                                       size=b * b), tn.mem.private_)
        colmaj = tn.memory(f32, tn.layout(blk.shape(), order=(1, 0)))
        padded.store(blk)
        snap = padded.load()
        padded.store(snap * 2.0)
        for s in p.serial(tn.shape(2)):
            swz.store(padded.load() + tn.cast(s.index(), f32))
        colmaj.store(swz.load())
        y(tn.coord(p.index() * b, 0), tn.shape(b, b)).store(colmaj.load() + snap)


@tn.kernel
def gemm_reduce_fold(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"],
                     C: tn.Tensor[f32, "M N"], *, bm=16, bn=16, bk=8):
    """The DESIGN.md GEMM: a fold_left reduce over K tiles with an mma update."""
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    C = C.with_dims(m, n)
    for nest in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
        i, j = nest.index(0), nest.index(1)
        acc = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
        for kk in nest.reduce(tn.shape(tn.cdiv(K, bk)), policy=tn.fold_left):
            a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
            b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
            acc = tn.mma(a, b, acc, allow_reassociation=False)
        C(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(acc)


@tn.kernel
def nest_subnest_update(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"],
                        C: tn.Tensor[f32, "M N"], *, bm=8, bn=8, bk=4):
    """The reference's anchor/frontier example: acc declared in nest, updated by
    mma inside subnest -> pipeline (anchor nest, frontier subnest)."""
    M, K = A.shape
    N = B.shape[1]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(k, n)
    for nest in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
        acc = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
        for sub in nest.parallel(tn.shape(4), exec=tn.exec.warp):
            for kk in sub.pipeline(tn.shape(tn.cdiv(K, bk))):
                a = A[tn.coord(nest.index(0) * bm, kk.index() * bk), tn.shape(bm, bk)]
                b = B[tn.coord(kk.index() * bk, nest.index(1) * bn), tn.shape(bk, bn)]
                acc = tn.mma(a, b, acc)
        C(tn.coord(nest.index(0) * bm, nest.index(1) * bn), tn.shape(bm, bn)).store(acc)


@tn.kernel
def per_child_patches(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, w=4):
    """Children update disjoint slices of an ancestor tile with tn.put."""
    (n,) = x.shape
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(f32, tn.shape(4 * w), dims=(x.dim(0),))
        for c in p.parallel(tn.shape(4), exec=tn.exec.layout(lambda q: (3 - q,), scope="thread")):
            part = x[tn.coord(c.index() * w), tn.shape(w)]
            acc = tn.put(acc, (c.index() * w,), part * 2.0)
        y(tn.coord(0), tn.shape(4 * w)).store(acc)


@tn.kernel
def custom_reducer(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "2"]):
    (n,) = x.shape
    sumsq = tn.reducer("sum_and_count", identity=(0.0, 0.0),
                       merge=lambda a0, a1, b0, b1: (a0 + b0, a1 + b1), dtype=(f32, f32))
    for p in tn.parallel(tn.shape(1)):
        v = x[tn.coord(0), tn.shape(n)]
        s = tn.scalar(0.0, f32)
        c = tn.scalar(0.0, f32)
        for r in p.reduce(v.domain(v.dim(0)), contract=sumsq):  # both states, jointly
            s = s + v.at(r) * v.at(r)
            c = c + 1.0
        y(tn.coord(0), tn.shape(1)).store(tn.broadcast(s, tn.shape(tn.axis(y.dim(0), 1))))
        y(tn.coord(1), tn.shape(1)).store(tn.broadcast(c, tn.shape(tn.axis(y.dim(0), 1))))


@tn.kernel
def embedding(ids: tn.Tensor[i64, "T"], table: tn.Tensor[f32, "V D"],
              out: tn.Tensor[f32, "T D"]):
    t, dmod = ids.shape[0], table.shape[1]
    for p in tn.parallel(tn.shape(t)):
        row_id = tn.reduce(ids[tn.coord(p.index()), tn.shape(1)], ids.dim(0), tn.add)
        row = table[tn.coord(row_id, 0), tn.shape(1, dmod), tn.bounds.checked]
        out(tn.coord(p.index(), 0), tn.shape(1, dmod)).store(row)


@tn.kernel
def misc_constructs(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], y: tn.Tensor[f32, "M N"],
                    bits: tn.Tensor[i32, "M N"]):
    """matmul, full, a region-form max update, a reversed serial, bitcast, a tree scan,
    a Memory with named dims."""
    for p in tn.parallel(tn.shape(1)):
        a = A[tn.coord(0, 0), tn.shape(4, 4)]
        b = B[tn.coord(0, 0), tn.shape(4, 4)]
        c = tn.matmul(a, b)
        m = tn.full(f32, tn.shape(tn.axis(c.dim(0), 4)), -1.0e30)
        for r in p.reduce(c.domain(c.dim(1))):
            m = tn.maximum(m, c.at(r))
        rev = tn.scalar(0.0, f32)
        for s in p.serial(tn.shape(4), order="reverse"):
            rev = rev * 2.0 + tn.cast(s.index(), f32)
        mem = tn.memory(f32, tn.shape(4, 4), dims=c.dims())
        mem.store(tn.scan(c, c.dim(1), tn.add, policy=tn.ordered_tree) + m + rev)
        out = mem.load()
        y(tn.coord(0, 0), tn.shape(4, 4)).store(tn.reindex(out, tn.shape(4, 4),
                                                           lambda i, j: (i, j)))
        bits(tn.coord(0, 0), tn.shape(4, 4)).store(tn.reindex(tn.bitcast(out, i32),
                                                              tn.shape(4, 4), lambda i, j: (i, j)))


ALL = [misc_constructs, all_regions, values_zoo, control_flow, memory_and_layouts, gemm_reduce_fold,
       nest_subnest_update, per_child_patches, custom_reducer, embedding]
