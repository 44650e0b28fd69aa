"""Small kernels with symbolic extents for the proof-obligation tests.

Names ending in ``_bad`` are deliberately wrong (a race, an out-of-bounds
access, a missed output element...); the checker must refute them."""

from __future__ import annotations

import tilenest as tn
from tilenest import f32, i32


@tn.kernel
def flat(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] * 3.0)


@tn.kernel
def unit(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for u in tn.parallel(tn.shape(1)):
        for p in u.parallel(tn.shape(n)):
            y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] - 1.0)


@tn.kernel
def two(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    tn.assume(cols == 4)
    for p in tn.parallel(tn.shape(rows)):
        for q in p.parallel(tn.shape(4)):
            c = tn.coord(p.index(), q.index())
            y(c, tn.shape(1, 1)).store(x[c, tn.shape(1, 1)] * 2.0 + 1.0)


@tn.kernel
def rowcol(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        for q in p.parallel(tn.shape(cols)):
            c = tn.coord(p.index(), q.index())
            y(c, tn.shape(1, 1)).store(x[c, tn.shape(1, 1)] * 0.5)


@tn.kernel
def grid8(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    tn.assume(cols == 8)
    for p in tn.parallel(tn.shape(rows, 8)):
        c = tn.coord(p.index(0), p.index(1))
        y(c, tn.shape(1, 1)).store(x[c, tn.shape(1, 1)] - 1.0)


@tn.kernel
def grid(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows, cols)):
        c = tn.coord(p.index(0), p.index(1))
        y(c, tn.shape(1, 1)).store(x[c, tn.shape(1, 1)] + 0.5)


@tn.kernel
def owner(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    """acc is a home at the outer level (an identity cut observed by the join)."""
    rows, cols = x.shape
    tn.assume(cols == 4)
    for p in tn.parallel(tn.shape(rows)):
        acc = tn.zeros(f32, tn.shape(1, 4), dims=x.dims())
        for q in p.parallel(tn.shape(4)):
            acc = tn.put(acc, tn.coord(0, q.index()),
                         x[tn.coord(p.index(), q.index()), tn.shape(1, 1)])
        y(tn.coord(p.index(), 0), tn.shape(1, 4)).store(acc * 2.0)


@tn.kernel
def mem_owner(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    """A Memory owned by the outer level, read by every child of the inner one."""
    rows, cols = x.shape
    tn.assume(cols == 4)
    for p in tn.parallel(tn.shape(rows)):
        buf = tn.memory(f32, tn.shape(1, 4), tn.mem.shared, dims=x.dims())
        buf.store(x[tn.coord(p.index(), 0), tn.shape(1, 4)])
        for q in p.parallel(tn.shape(4)):
            t = buf.load()
            y(tn.coord(p.index(), q.index()), tn.shape(1, 1)).store(
                x[tn.coord(p.index(), q.index()), tn.shape(1, 1)] + tn.reduce(t, t.dim(1), tn.add))


@tn.kernel
def mem_owner2(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    """A Memory owned by a two-axis outer level (p0, p1), read by an inner level."""
    rows, cols = x.shape
    tn.assume(cols == 8)
    for p in tn.parallel(tn.shape(rows, 2)):
        buf = tn.memory(f32, tn.shape(1, 4), tn.mem.shared, dims=x.dims())
        buf.store(x[tn.coord(p.index(0), p.index(1) * 4), tn.shape(1, 4)])
        for q in p.parallel(tn.shape(4)):
            t = buf.load()
            c = tn.coord(p.index(0), p.index(1) * 4 + q.index())
            y(c, tn.shape(1, 1)).store(x[c, tn.shape(1, 1)] + tn.reduce(t, t.dim(1), tn.maximum))


@tn.kernel
def halves_bad(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "M"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index() // 2), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


@tn.kernel
def read_back_bad(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], s: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])
        s(tn.coord(0), tn.shape(4)).store(y[tn.coord(0), tn.shape(4)])


@tn.kernel
def shared_reads(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        first = x[tn.coord(0), tn.shape(1)]
        y(tn.coord(p.index()), tn.shape(1)).store(first + x[tn.coord(p.index()), tn.shape(1)])


@tn.kernel
def inner_race_bad(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R"]):
    rows, cols = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        for q in p.parallel(tn.shape(4)):
            y(tn.coord(p.index()), tn.shape(1)).store(
                tn.reshape(x[tn.coord(p.index(), q.index()), tn.shape(1, 1)], tn.shape(1)))


@tn.kernel
def inner_ok(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "N"]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        for q in p.parallel(tn.shape(4)):
            y(tn.coord(p.index() * 4 + q.index()), tn.shape(1)).store(
                tn.reshape(x[tn.coord(p.index(), q.index()), tn.shape(1, 1)], tn.shape(1)))


@tn.kernel
def serial_race_bad(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "T"], *, steps=4):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        for t in p.serial(tn.shape(steps)):
            y(tn.coord(t.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


@tn.kernel
def serial_ok(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "T"], *, steps=4):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        for t in p.serial(tn.shape(steps)):
            y(tn.coord(p.index() * steps + t.index()), tn.shape(1)).store(
                x[tn.coord(p.index()), tn.shape(1)])


@tn.kernel
def shift_bad(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(
            x[tn.coord(p.index() + 1), tn.shape(1), tn.bounds.checked])


@tn.kernel
def shift_ok(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n - 1)):
        y(tn.coord(p.index()), tn.shape(1)).store(
            x[tn.coord(p.index() + 1), tn.shape(1), tn.bounds.checked])


@tn.kernel
def back_bad(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(
            x[tn.coord(p.index() - 1), tn.shape(1), tn.bounds.assume])


@tn.kernel
def back_ok(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(
            x[tn.coord(p.index()), tn.shape(1), tn.bounds.assume])


@tn.kernel
def cover_bad(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n - 1)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


@tn.kernel
def twice_bad(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "T"], *, steps=4):
    (n,) = x.shape
    for t in tn.serial(tn.shape(steps)):
        y(tn.coord(0), tn.shape(1)).store(x[tn.coord(t.index()), tn.shape(1)])


@tn.kernel
def once_ok(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "T"], *, steps=4):
    (n,) = x.shape
    for t in tn.serial(tn.shape(steps)):
        y(tn.coord(t.index()), tn.shape(1)).store(x[tn.coord(t.index()), tn.shape(1)])


@tn.kernel
def layout_bad(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(f32, tn.shape(8), dims=(x.dim(0),))
        for c in p.parallel(tn.shape(4), exec=tn.exec.layout(lambda q: (q // 2,))):
            acc = tn.put(acc, (c.index() * 2,), x[tn.coord(c.index() * 2), tn.shape(2)])
        y(tn.coord(0), tn.shape(8)).store(acc)


@tn.kernel
def layout_ok(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(f32, tn.shape(8), dims=(x.dim(0),))
        for c in p.parallel(tn.shape(4), exec=tn.exec.layout(lambda q: (3 - q,))):
            acc = tn.put(acc, (c.index() * 2,), x[tn.coord(c.index() * 2), tn.shape(2)])
        y(tn.coord(0), tn.shape(8)).store(acc)


@tn.kernel
def layout_out_bad(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(f32, tn.shape(8), dims=(x.dim(0),))
        for c in p.parallel(tn.shape(4), exec=tn.exec.layout(lambda q: (q + 1,))):
            acc = tn.put(acc, (c.index() * 2,), x[tn.coord(c.index() * 2), tn.shape(2)])
        y(tn.coord(0), tn.shape(8)).store(acc)


@tn.kernel
def layout_rot_ok(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(f32, tn.shape(8), dims=(x.dim(0),))
        for c in p.parallel(tn.shape(4), exec=tn.exec.layout(lambda q: ((q + 1) % 4,))):
            acc = tn.put(acc, (c.index() * 2,), x[tn.coord(c.index() * 2), tn.shape(2)])
        y(tn.coord(0), tn.shape(8)).store(acc)


@tn.kernel
def scatter(x: tn.Tensor[f32, "N"], idx: tn.Tensor[i32, "N"], y: tn.Tensor[f32, "M"]):
    """A data-dependent store: noninterference holds by contract, not by proof."""
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        j = idx[tn.coord(p.index()), tn.shape(1)]
        k = tn.reduce(j, j.dim(0), tn.add)
        y(tn.coord(k), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


@tn.kernel
def phases_ok(x: tn.Tensor[f32, "N"], tmp: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        tmp(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] + 1.0)
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(tmp[tn.coord(p.index()), tn.shape(1)] * 2.0)


@tn.kernel
def rotate_bad(x: tn.Tensor[f32, "N"], tmp: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        tmp(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] + 1.0)
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(tmp[tn.coord((p.index() + 1) % n), tn.shape(1)])


@tn.kernel
def war_bad(x: tn.Tensor[f32, "N"], tmp: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n - 1)):
        y(tn.coord(p.index()), tn.shape(1)).store(tmp[tn.coord(p.index() + 1), tn.shape(1)])
    for p in tn.parallel(tn.shape(n - 1)):
        tmp(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


@tn.kernel
def war_ok(x: tn.Tensor[f32, "N"], tmp: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n - 1)):
        y(tn.coord(p.index()), tn.shape(1)).store(tmp[tn.coord(p.index()), tn.shape(1)])
    for p in tn.parallel(tn.shape(n - 1)):
        tmp(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


@tn.kernel
def gemv(x: tn.Tensor[f32, "R C"], w: tn.Tensor[f32, "C"], y: tn.Tensor[f32, "R"], *, bk=4):
    rows, cols = x.shape
    w = w.with_dims(x.dim(1))
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        acc = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
        for k in p.pipeline(tn.shape(tn.cdiv(cols, bk)), tn.pipeline_policy(window=2, interval=1)):
            k.stage("load")
            a = x[tn.coord(p.index(), k.index() * bk), tn.shape(1, bk)]
            b = w[tn.coord(k.index() * bk), tn.shape(bk)]
            k.stage("compute")
            acc = acc + tn.reduce(a * b, x.dim(1), tn.add)
        y(tn.coord(p.index()), tn.shape(1)).store(acc)


@tn.kernel
def isum(x: tn.Tensor[i32, "R C"], y: tn.Tensor[i32, "R"]):
    rows, cols = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        y(tn.coord(p.index()), tn.shape(1)).store(tn.reduce(row, row.dim(1), tn.add))


@tn.kernel
def ordered(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "M"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(1)):
        v = x[tn.coord(0), tn.shape(n)]
        s = tn.scalar(0.0, f32)
        for r in p.reduce(v.domain(v.dim(0)), policy=tn.ordered_tree):
            s = s + v.at(r)
        y(tn.coord(0), tn.shape(1)).store(tn.broadcast(s, tn.shape(1), dims=y.dims()))


@tn.kernel
def folded(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "M"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(1)):
        v = x[tn.coord(0), tn.shape(n)]
        s = tn.scalar(0.0, f32)
        for r in p.reduce(v.domain(v.dim(0)), policy=tn.fold_left):
            s = s + v.at(r)
        y(tn.coord(0), tn.shape(1)).store(tn.broadcast(s, tn.shape(1), dims=y.dims()))


@tn.kernel
def patches(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "M"], *, step=2):
    d = x.dim(0)
    acc = tn.full(f32, tn.shape(8), -1.0, dims=(d,))
    for p in tn.parallel(tn.shape(3)):
        acc = tn.put(acc, tn.coord(step * p.index()), x[tn.coord(step * p.index()), tn.shape(2)])
    y(tn.coord(0), tn.shape(8)).store(acc)


patches_bad = patches.specialize(step=1)


@tn.kernel
def relay(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, window=3):
    (n,) = x.shape
    x = x.with_dims(y.dim(0))
    for k in tn.pipeline(tn.shape(n - 3), tn.pipeline_policy(window=window, interval=1)):
        k.stage("read")
        prev = y[tn.coord(k.index()), tn.shape(1)]
        k.stage("write")
        y(tn.coord(k.index() + 3), tn.shape(1)).store(prev + x[tn.coord(k.index() + 3),
                                                                tn.shape(1)])


relay_bad = relay.specialize(window=4)


# -- serial fusion (T-8) and Memory layouts (M-12) -------------------------------

@tn.kernel
def serial_pair(x: tn.Tensor[f32, "N"], t: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *,
                shift=-1):
    (n,) = x.shape
    for a in tn.serial(tn.shape(n)):
        t(tn.coord(a.index()), tn.shape(1)).store(x[tn.coord(a.index()), tn.shape(1)] + 1.0)
    for b in tn.serial(tn.shape(n)):
        y(tn.coord(b.index()), tn.shape(1)).store(t[tn.coord(b.index() + shift), tn.shape(1)])


serial_pair_bad = serial_pair.specialize(shift=1)   # B(j) reads what A(j + 1) writes


@tn.kernel
def serial_war(x: tn.Tensor[f32, "N"], t: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *,
               shift=1):
    (n,) = x.shape
    for a in tn.serial(tn.shape(n)):
        y(tn.coord(a.index()), tn.shape(1)).store(t[tn.coord(a.index() + shift), tn.shape(1)])
    for b in tn.serial(tn.shape(n)):
        t(tn.coord(b.index()), tn.shape(1)).store(x[tn.coord(b.index()), tn.shape(1)])


serial_war_bad = serial_war.specialize(shift=-1)    # B(i - 1) overwrites what A(i) reads


def _swizzle(o, s):
    """CUTLASS Swizzle<3, 3, s> of a dense offset."""
    return o ^ ((o & (7 << (3 + s))) >> s)


@tn.kernel
def swizzled(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2], *, shift=3, size=4096 * 1024):
    m = tn.memory(f32, tn.layout(tn.shape(4096, 1024), offset=lambda i, j: _swizzle(
        i * 1024 + j, shift), size=size))
    m.store(x[tn.coord(0, 0), tn.shape(4096, 1024)])
    y(tn.coord(0, 0), tn.shape(4096, 1024)).store(m.load())


swizzled_bad = swizzled.specialize(shift=0)         # XOR onto the bits it reads
swizzled_small = swizzled.specialize(size=4096 * 1024 - 8)


@tn.kernel
def sym_layout(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"], *, row=1):
    rows, cols = x.shape
    m = tn.memory(f32, tn.layout(tn.shape(rows, cols), (cols * row, 1)))
    m.store(x[tn.coord(0, 0), tn.shape(rows, cols)])
    y(tn.coord(0, 0), tn.shape(rows, cols)).store(m.load())


sym_layout_bad = sym_layout.specialize(row=0)       # a broadcast: rows share storage


@tn.kernel
def xor_layout_bad(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    m = tn.memory(f32, tn.layout(tn.shape(rows, cols), offset=lambda i, j: (i * cols) ^ j,
                                 size=rows * cols))
    m.store(x[tn.coord(0, 0), tn.shape(rows, cols)])
    y(tn.coord(0, 0), tn.shape(rows, cols)).store(m.load())
