"""Transposing copies as blocks transposed in registers.

The ``mma`` micro-kernel reads its ``b`` operand with the vector dim
contiguous; an operand stored the other way (``A @ B^T`` with ``B`` stored
``[n, k]``) is transposed as it is copied into its packed tile
(``Lowerer.materialize``: first a plain copy into a scratch tile, then this
copy, between two local tiles of constant extents). In the loop IR that
second copy is a nest::

    for u in [0, U):                      -- serial (or vector)
        for.vector v in [0, V):
            dst[D + C u + v] = src[S0 + u + R v]

whose store moves by one element along ``v`` and whose load moves by one
along ``u``. Element by element, its inner loop is a strided load per lane
(a gather); on hosts where gathers are slow that is most of the copy's time.
:meth:`TransposedCopies.transposed_copy` instead emits it as ``W x W``
blocks (``W`` the vector lanes of the element type; ``U`` and ``V``
multiples of ``W``): ``W`` contiguous loads along ``u`` (one per ``v`` of
the block), the block transposed in registers by ``log2 W`` rounds of
two-input shuffles, ``W`` contiguous stores along ``v``. Every element is
stored once, with the value the scalar nest stores there: a copy in another
order of independent iterations (the inner loop's are independent, the
outer loop's stores touch distinct elements and read none of them).

The butterfly: in round ``h`` (``h = W/2, W/4, ..., 1``), rows ``i`` and
``i + h`` (``i & h == 0``) exchange their off-diagonal ``h``-blocks:
``r_i[e] <- r_{i+h}[e - h]`` and ``r_{i+h}[e - h] <- r_i[e]`` for every
lane ``e`` with ``e & h``; after every round, row ``i`` holds column ``i``.
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir

from ...lowering import loopir as L
from ...semantics import expr as E
from ...semantics.expr import stride

I32, I64 = ir.IntType(32), ir.IntType(64)


def transpose_shape(s: Any, vector_bits: int) -> tuple[L.For, L.Store, int] | None:
    """``(inner loop, store, W)`` when ``s`` is the transposing copy of the
    module docstring with both extents multiples of ``W`` lanes of its
    element type, else None."""
    if not (isinstance(s, L.For) and s.kind in ("serial", "vector") and not s.reverse
            and s.tree is None and s.lo == E.Const(0) and isinstance(s.hi, E.Const)
            and len(s.body) == 1):
        return None
    inner = s.body[0]
    if not (isinstance(inner, L.For) and inner.kind == "vector" and not inner.reverse
            and inner.lo == E.Const(0) and isinstance(inner.hi, E.Const)
            and len(inner.body) == 1):
        return None
    st = inner.body[0]
    if not (isinstance(st, L.Store) and st.guard is None and st.mode == ""
            and isinstance(st.index, L.IExpr) and isinstance(st.value, L.Load)
            and st.value.guard is None and isinstance(st.value.index, L.IExpr)
            and st.value.buf.dtype == st.buf.dtype and st.buf.dtype.bits in (32, 64)
            and not st.buf.dtype.is_bool
            # two distinct tiles of the program: nothing read is written
            and st.buf.space == "local" and st.value.buf.space == "local"
            and st.buf.name != st.value.buf.name):
        return None
    u, v = E.Var(s.var.name), E.Var(inner.var.name)
    ld = st.value.index.e
    rows = stride(st.index.e, u)
    if not (stride(st.index.e, v) == 1 and stride(ld, u) == 1 and stride(ld, v) not in (None, 0, 1)
            and rows is not None and rows >= inner.hi.value):  # each element stored once
        return None
    w = vector_bits // st.buf.dtype.bits
    if w < 2 or s.hi.value % w or inner.hi.value % w:
        return None
    return inner, st, w


class TransposedCopies:
    """Mixed into the code generator of phase bodies (``codegen.FnGen``)
    beside ``vector.VectorLoops``: its builder, buffers, slots and index
    evaluation."""

    def transposed_copy(self, s: Any) -> bool:
        """Emit ``s`` as register-transposed blocks when it is a transposing
        copy (:func:`transpose_shape`); False (nothing emitted) otherwise."""
        shape = transpose_shape(s, self.cg.vector_bits)
        if shape is None:
            return False
        from .codegen import mem_type

        inner, st, w = shape
        b = self.b
        vt = ir.VectorType(mem_type(st.buf.dtype), w)
        align = st.buf.dtype.bits // 8
        uslot, vslot = self.var(s.var), self.var(inner.var)

        def at(buf: L.Buffer, index: E.Expr) -> ir.Value:
            return b.gep(self.ptr[buf.name], [self.idx(index)], inbounds=True,
                         source_etype=mem_type(buf.dtype))

        def block() -> None:
            u0 = b.load(uslot, typ=I64)
            v0 = b.load(vslot, typ=I64)
            rows = []
            for i in range(w):  # row i: the w elements along u at v0 + i
                b.store(b.add(v0, ir.Constant(I64, i), flags=("nsw",)), vslot)
                rows.append(b.load(at(st.value.buf, st.value.index.e), typ=vt, align=align))
            rows = _transpose(b, rows, w)
            b.store(v0, vslot)
            for t in range(w):  # row t: the w elements along v at u0 + t
                b.store(b.add(u0, ir.Constant(I64, t), flags=("nsw",)), uslot)
                b.store(rows[t], at(st.buf, st.index.e), align=align)
            b.store(u0, uslot)

        self.counted_loop(s.var, ir.Constant(I64, 0), ir.Constant(I64, s.hi.value), w,
                          lambda: self.counted_loop(inner.var, ir.Constant(I64, 0),
                                                    ir.Constant(I64, inner.hi.value), w, block))
        return True


def _transpose(b: ir.IRBuilder, rows: list, w: int) -> list:
    """The ``w x w`` block whose row ``i`` is ``rows[i]``, transposed (the
    module docstring's butterfly)."""
    rows = list(rows)
    h = w // 2
    while h:
        for i in range(w):
            if i & h:
                continue
            j = i + h
            lo = [e if not e & h else w + e - h for e in range(w)]
            hi = [e + h if not e & h else w + e for e in range(w)]
            a, c = rows[i], rows[j]
            rows[i] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(I32, w), lo))
            rows[j] = b.shuffle_vector(a, c, ir.Constant(ir.VectorType(I32, w), hi))
        h //= 2
    return rows
