"""Explicit vector code for ``for.vector`` loops.

A ``For(kind="vector")`` promises that its iterations are independent (loop
IR, ``For``). When every statement of its body is a plain or guarded store
whose index moves by one element per iteration, and every expression in it
is one this module can evaluate lane by lane (:func:`plan`), the code
generator emits the loop itself as vector IR: ``W`` consecutive iterations
per step, each scalar operation of the body becoming the same operation on
``<W x T>`` values, then the remaining ``< W`` iterations as scalar code.
So the speed of such loops -- the ``mma`` micro-kernel's rows above all,
tile copies and elementwise bodies -- is a property of the lowering, not of
a cost model of LLVM's vectorizers (which see no loop at all once a short
constant loop is fully unrolled).

Meaning is unchanged: every vector operation is the lane-wise IEEE (or
two's complement) operation of the scalar one, so each lane computes
exactly what its scalar iteration computes; with independent iterations the
order between lanes is immaterial. A statement's guard becomes a lane mask:
masked loads read no element whose lane is off (``llvm.masked.load``, the
fill where off) and masked stores write none (``llvm.masked.store``), as a
guarded scalar access does not touch memory when its guard is false.

Values in the body are *uniform* (the same in every lane: constants, locals,
loads at an index that does not depend on the loop variable -- the
broadcast operand of the ``mma`` micro-kernel) or *varying* (one value per
lane). A load whose index moves by a constant other than one element per
iteration (the transposing copy of an ``mma`` operand) is a gather
(``llvm.masked.gather``); stores must move by exactly one element. Uniform values are computed once, as scalars, and broadcast where they
meet a varying one. The lane width ``W`` is the schedule's vector width over
the widest data type of the body (index arithmetic, 64-bit, is not counted:
it only forms addresses and masks).
"""

from __future__ import annotations

from typing import Any

from llvmlite import ir

from ...lowering import loopir as L
from ...lowering.divisors import float_division
from ...semantics import dtypes as D
from ...semantics import expr as E
from ...semantics.expr import stride

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)

#: float unary ops that are one lane-wise instruction or intrinsic; ``exp`` on
#: f32 is one call of the lane-wise function ``MathLib.exp_f32_vec`` as well
_FLOAT_UN = frozenset({"neg", "abs", "sqrt", "floor", "ceil", "trunc", "round"})
_CMP = frozenset({"lt", "le", "gt", "ge", "eq", "ne"})
_FLOAT_BIN = frozenset({"add", "sub", "mul", "div", "maximum", "minimum"}) | _CMP
_INT_BIN = frozenset({"add", "sub", "mul", "and", "or", "xor", "maximum", "minimum"}) | _CMP
_BOOL_BIN = frozenset({"and", "or", "xor", "maximum", "minimum"}) | _CMP


def _lane_dtype(dt: D.DType) -> bool:
    """Whether values of ``dt`` are kept as vectors here: every dtype. The
    16-bit floats and the FP8 formats are bit patterns whose conversions to
    and from f32 are lane-wise code (``half`` conversions, ``softfloat``)."""
    return dt.is_bool or dt.is_int or dt.is_fp8 or dt.is_float


#: float dtypes whose arithmetic is lane-wise here: f32/f64 directly, f16 and
#: bf16 on their exact f32 values with each result rounded once (the scalar
#: rule, ``codegen.FnGen.binary``)
_ARITH_FLOATS = frozenset({"f16", "bf16", "f32", "f64"})


class _Check:
    """Decides whether a loop body is vectorizable (:func:`plan`)."""

    def __init__(self, x: E.Var, name: str):
        self.x, self.name = x, name
        self.widest = 0

    def data(self, dt: D.DType) -> bool:
        if not _lane_dtype(dt):
            return False
        if not dt.is_bool:
            self.widest = max(self.widest, dt.bits)
        return True

    def index(self, e: E.Expr) -> bool:
        return stride(e, self.x) is not None

    def pred(self, p: E.Pred) -> bool:
        if isinstance(p, E.BoolConst):
            return True
        if isinstance(p, E.Cmp):
            return self.index(p.a) and self.index(p.b)
        if isinstance(p, (E.PAnd, E.POr)):
            return all(self.pred(q) for q in p.items)
        if isinstance(p, E.PNot):
            return self.pred(p.item)
        return False

    def varying(self, x: Any) -> bool:
        """Whether ``x`` depends on the loop variable."""
        return self.name in L.names(x)

    def expr(self, x: Any) -> bool:
        if isinstance(x, L.Const):
            return self.data(x.dtype)
        if isinstance(x, L.Ref):
            return x.var.name != self.name and self.data(x.dtype)
        if isinstance(x, L.IExpr):
            return self.index(x.e)
        if isinstance(x, L.IPred):
            return self.pred(x.p)
        if isinstance(x, L.Load):
            if not self.data(x.dtype) or not isinstance(x.index, L.IExpr):
                return False
            s = stride(x.index.e, self.x)
            if s is None:
                return False
            if x.guard is not None:
                if not (self.expr(x.guard) and x.fill is not None and self.expr(x.fill)):
                    return False
                if s == 0 and self.varying(x.guard):
                    return False  # a uniform read under a lane mask: left scalar
            return True
        if isinstance(x, L.Select):
            return all(self.expr(y) for y in (x.c, x.a, x.b))
        if isinstance(x, L.Fma):
            return x.dtype.name in ("f32", "f64") and all(self.expr(y) for y in (x.a, x.b, x.c))
        if isinstance(x, L.Un):
            dt = x.a.dtype
            # exp on f32, and on f16/bf16 as the f32 function of the widened
            # value rounded once (the scalar rule)
            ops = _FLOAT_UN | ({"exp"} if dt.name != "f64" else frozenset())
            return (dt.name in _ARITH_FLOATS and x.op in ops and x.dtype == dt
                    and self.data(dt) and self.expr(x.a))
        if isinstance(x, L.Bin):
            dt = x.a.dtype
            ops = (_BOOL_BIN if dt.is_bool else _INT_BIN if dt.is_int
                   else _FLOAT_BIN if dt.name in _ARITH_FLOATS else _CMP if dt.is_fp8
                   else frozenset())
            return (x.op in ops and self.data(dt) and self.data(x.dtype)
                    and self.expr(x.a) and self.expr(x.b))
        if isinstance(x, L.Cast):
            src, dst = x.a.dtype, x.dtype
            if (src.is_float and src.bits <= 16) or (dst.is_float and dst.bits <= 16):
                # f16, bf16 and FP8 to and from f32 and each other (exactly
                # through f32), and widened to f64
                ok = src.name in _NARROW_CASTS and dst.name in _NARROW_CASTS | {"f64"}
                return ok and self.data(src) and self.data(dst) and self.expr(x.a)
            ok = (src.is_float and dst.is_float) or (
                (src.is_int or src.is_bool) and not dst.is_bool
                and (dst.is_int or dst.name in ("f32", "f64")))
            return ok and self.data(src) and self.data(dst) and self.expr(x.a)
        return False

    def stmt(self, s: Any) -> bool:
        if isinstance(s, L.Assign):
            return accumulation(s) is not None and self.data(s.var.dtype) and self.expr(
                s.value.b)
        if not isinstance(s, L.Store) or s.mode or not isinstance(s.index, L.IExpr):
            return False
        if stride(s.index.e, self.x) != 1 or not self.data(s.buf.dtype):
            return False
        if s.guard is not None and not self.expr(s.guard):
            return False
        return self.expr(s.value)


def plan(var: L.LVar, body: tuple, vector_bits: int) -> int | None:
    """The lane count ``W`` at which the body of ``for.vector var`` is
    emitted as vector code, or None when it is not (a statement other than a
    unit-stride store or a reduction into a local (:func:`accumulation`)
    beside one, a gather, an operation without a lane-wise form here: the
    loop is then emitted as scalar code). Loads may move by any constant
    number of elements (gathers). A body of reductions alone is left to
    LLVM's loop vectorizer, which interleaves several accumulators -- unless
    it computes a function with a lane-wise form of its own (``exp``,
    :data:`_OWN_VECTOR_FORM`): the loop vectorizer would evaluate the scalar
    formula, range handling and all, in every lane, at about twice the cost
    of that form's common path (a ``sum(exp(x))``, as in a log-sum-exp); or
    it accumulates a 16-bit float, whose rounded steps that pass does not
    see as a reduction (it would run them one after another)."""
    w = width(var, body, vector_bits)
    if w is None:
        return None
    accs = [s.var.name for s in body if isinstance(s, L.Assign)]
    if accs and (len(set(accs)) < len(accs)
                 or any(L.names(x) & set(accs) for s in body for x in _operands(s))):
        return None  # an accumulator read or updated twice
    if accs and len(accs) == len(body) and not any(
            _own_vector_form(y) for s in body for x in _operands(s) for y in L.subexprs(x)
    ) and all(s.var.dtype.bits >= 32 for s in body):
        return None  # only reductions, of values LLVM's vectorizer forms as well
    return w


#: the float dtypes cast lane-wise among themselves (one rounding from the
#: exact f32 value: every f16, bf16 and FP8 value is an f32 value)
_NARROW_CASTS = frozenset({"f16", "bf16", "f32", "f8e4m3fn", "f8e5m2"})

#: unary ops whose vector form here is a function of its own (``MathLib``),
#: not the lane-wise image of the scalar code
_OWN_VECTOR_FORM = frozenset({"exp"})


def _own_vector_form(x: Any) -> bool:
    """Whether ``x`` is a call with a lane-wise form of its own: ``exp`` on
    f32 (and on f16/bf16, through f32)."""
    return isinstance(x, L.Un) and x.op in _OWN_VECTOR_FORM and x.dtype.name != "f64"


def width(var: L.LVar, body: tuple, vector_bits: int) -> int | None:
    """The lane count of ``body``'s vector form if every statement has one
    (:func:`plan` without its rules on reductions), or None."""
    c = _Check(E.Var(var.name), var.name)
    if not body or not all(c.stmt(s) for s in body):
        return None
    return max(2, vector_bits // max(32, c.widest or 32))


#: the reductions a vector loop keeps in one vector accumulator (lane-wise),
#: and the identity its lanes start from (``op(x, identity) == x`` for every
#: ``x``, NaN and signed zeros included)
_ACCUMULATE = {"add": -0.0, "maximum": float("-inf"), "minimum": float("inf")}


def accumulation(s: L.Assign) -> str | None:
    """The op of ``acc = op{reassoc}(acc, value)`` on a float dtype with
    arithmetic here (f16, bf16, f32, f64: each step the dtype's operation,
    rounded as the scalar one), a reduction a vector loop may regroup
    (``reassoc``: any grouping and order of the contributions is the
    contract's), or None."""
    v = s.value
    if (isinstance(v, L.Bin) and v.op in _ACCUMULATE and "reassoc" in v.flags
            and v.a == L.Ref(s.var) and s.var.dtype.name in _ARITH_FLOATS
            and v.dtype == s.var.dtype):
        return v.op
    return None


def _operands(s: Any) -> list:
    """What a statement of a vector body reads besides an accumulator it
    updates: a store's index, value and guard; an accumulation's contribution."""
    return [s.value.b] if isinstance(s, L.Assign) else L.stmt_exprs(s)


class VectorLoops:
    """The vector form of ``for.vector`` loops, mixed into the code generator
    of phase bodies (``codegen.FnGen``): it uses the generator's builder,
    buffers, index evaluation and its scalar operation rules, which are
    written to apply unchanged to vector operands for the operations
    :func:`plan` admits."""

    b: ir.IRBuilder
    math: Any
    cg: Any
    prefetches: dict
    #: loop-variable name -> the argument whose stores may stream (``streaming.Stream``)
    streams: dict
    #: whether some loop of this body has a streaming form (the body then
    #: ends with a store fence)
    streamed: bool = False
    #: in the vector steps of a loop: divisor -> its splat ``(d, y, lo, hi)``
    #: (:meth:`prepare_divisors`), computed once before the steps
    divisor_preps: dict

    def vector_plan(self, var: L.LVar, body: tuple, kind: str, reverse: bool) -> int | None:
        if kind != "vector" or reverse:
            return None
        return plan(var, body, self.cg.vector_bits)

    def vector_loop(self, var: L.LVar, lo: ir.Value, hi: ir.Value, body: tuple, w: int) -> None:
        """``for var in [lo, hi)`` as steps of ``w`` iterations in vector
        code, then the rest (fewer than ``w``) as scalar iterations. A loop
        whose stores may stream (:mod:`.streaming`) has a second form chosen
        at run time."""
        plan = self.streams.get(var.name)
        if plan is None:
            self.steps(var, lo, hi, body, w)
            return
        buf = plan.buf
        from .codegen import mem_type
        from .streaming import MIN_BYTES

        b = self.b
        st = next(s for s in body if isinstance(s, L.Store) and s.buf.name == buf.name)
        elem = max(1, buf.dtype.bits // 8)
        vbytes = w * elem
        b.store(lo, self.var(var))  # the store's address at the first iteration
        at = b.ptrtoint(b.gep(self.ptr[buf.name], [self.idx(st.index.e)], inbounds=True,
                              source_etype=mem_type(buf.dtype)), I64)
        size = b.mul(self.idx(plan.elements), ir.Constant(I64, elem))
        big = b.icmp_signed(">=", size, ir.Constant(I64, MIN_BYTES))
        whole = b.icmp_unsigned("==", b.and_(at, ir.Constant(I64, elem - 1)),
                                ir.Constant(I64, 0))
        with b.if_else(b.and_(big, whole)) as (stream, plain):
            with stream:
                # scalar iterations up to the first vector-aligned address
                head = b.lshr(b.and_(b.sub(ir.Constant(I64, 0), at),
                                     ir.Constant(I64, vbytes - 1)),
                              ir.Constant(I64, elem.bit_length() - 1))
                n = b.sub(hi, lo)
                n = b.select(b.icmp_signed("<", n, ir.Constant(I64, 0)), ir.Constant(I64, 0), n)
                first = b.add(lo, b.select(b.icmp_signed("<", head, n), head, n))
                self.scalar_loop(var, lo, first, body, False)
                self.steps(var, first, hi, body, w, stream=buf.name)
                self.streamed = True
            with plain:
                self.steps(var, lo, hi, body, w)

    def steps(self, var: L.LVar, lo: ir.Value, hi: ir.Value, body: tuple, w: int,
              stream: str | None = None) -> None:
        """Vector steps of ``w`` iterations from ``lo``, then the scalar
        rest; with ``stream``, that buffer's stores are aligned streaming
        stores (the caller made its first address vector-aligned)."""
        from .codegen import const, reg_type

        b = self.b
        n = b.sub(hi, lo)
        n = b.select(b.icmp_signed("<", n, ir.Constant(I64, 0)), ir.Constant(I64, 0), n)
        full = b.mul(b.sdiv(n, ir.Constant(I64, w)), ir.Constant(I64, w), flags=("nsw",))
        mid = b.add(lo, full, flags=("nsw",))
        for s in body:  # each accumulator's lanes start from the op's identity
            if isinstance(s, L.Assign):
                vt = ir.VectorType(reg_type(s.var.dtype), w)
                c = const(_ACCUMULATE[accumulation(s)], s.var.dtype)
                b.store(ir.Constant(vt, [c.constant] * w), self.lanes_slot(s.var, w))
        divisors = self.shared_divisors_of(body)
        if divisors:
            # prepared only when some step runs: a divisor may read memory
            with b.if_then(b.icmp_signed(">", full, ir.Constant(I64, 0))):
                self.divisor_preps = self.prepare_divisors(divisors, w)
                self.counted_loop(var, lo, mid, w, lambda: self.vector_body(var, body, w, stream))
                self.divisor_preps = {}
        else:
            self.counted_loop(var, lo, mid, w, lambda: self.vector_body(var, body, w, stream))
        for s in body:
            if isinstance(s, L.Assign):
                self.fold_lanes(s, w)
        self.scalar_loop(var, mid, hi, body, False)

    def lanes_slot(self, acc: L.LVar, w: int) -> ir.Value:
        """The ``<w x T>`` slot of the lanes of accumulator ``acc`` (in the
        entry block, like every local's slot)."""
        from .codegen import reg_type

        return self.slot(f"{acc.name}.lanes{w}", ir.VectorType(reg_type(acc.dtype), w), acc.dtype)

    def fold_lanes(self, s: L.Assign, w: int) -> None:
        """After the vector steps: the accumulator's lanes combined pairwise
        (a tree), then into the accumulator's own value."""
        from .codegen import reg_type

        b = self.b
        op, dt = accumulation(s), s.var.dtype
        v = b.load(self.lanes_slot(s.var, w), typ=ir.VectorType(reg_type(dt), w))
        parts = [b.extract_element(v, ir.Constant(I32, j)) for j in range(w)]
        while len(parts) > 1:
            parts = [self.binary(op, parts[j], parts[j + 1], dt, s.value.flags)
                     for j in range(0, len(parts), 2)]
        slot = self.var(s.var)
        b.store(self.binary(op, b.load(slot, typ=parts[0].type), parts[0], dt, s.value.flags),
                slot)

    def shared_divisors_of(self, body: tuple) -> list:
        """The divisors of the float divisions in a vector loop's ``body``
        that keep their value over the loop (``lowering.divisors``), in
        order of first appearance."""
        out: list = []
        for s in body:
            for x in L.stmt_exprs(s):
                for y in L.subexprs(x):
                    if (float_division(y) and y.b in self.cg.shared_divisors
                            and y.b not in out):
                        out.append(y.b)
        return out

    def prepare_divisors(self, divisors: list, w: int) -> dict:
        """Each divisor evaluated once (it keeps its value over the loop)
        with its reciprocal and dividend range (``MathLib.fdiv_prep_f32``),
        all four splat to ``w`` lanes."""
        b = self.b
        out = {}
        for d in divisors:
            v = self.to_wide(self.expr(d), d.dtype)
            out[d] = tuple(_splat(b, x, w) for x in (v, *self.math.fdiv_prep_f32(b, v)))
        return out

    def vector_body(self, var: L.LVar, body: tuple, w: int, stream: str | None = None) -> None:
        ev = _Lanes(self, var, w, stream)
        for p in self.prefetches.get(var.name, ()):
            self.prefetch(p.buf, self.idx(p.index))
        for s in body:
            if isinstance(s, L.Assign):
                ev.accumulate(s, self.lanes_slot(s.var, w))
            else:
                ev.store(s)

    def prefetch(self, buf: L.Buffer, index: ir.Value) -> None:
        """A hint to bring ``buf[index]`` into the second-level cache (no
        effect on meaning: see :mod:`.prefetch`)."""
        fn = self.math.intrinsic("llvm.prefetch.p0", ir.VoidType(), [ir.PointerType(), I32, I32, I32])
        self.b.call(fn, [self.addr(buf, index), ir.Constant(I32, 0), ir.Constant(I32, 2),
                         ir.Constant(I32, 1)])


class _Lanes:
    """Evaluates one vector step: the loop variable's slot holds the first
    lane's iteration; ``value(x)`` is ``(llvm value, varying)``."""

    def __init__(self, gen: Any, var: L.LVar, w: int, stream: str | None = None):
        self.g, self.b, self.w = gen, gen.b, w
        self.x = E.Var(var.name)
        self.name = var.name
        #: the buffer whose (vector-aligned) stores are streaming stores
        self.stream = stream

    # -- helpers --------------------------------------------------------------
    def vec(self, t: ir.Type) -> ir.VectorType:
        return ir.VectorType(t, self.w)

    def splat(self, v: ir.Value) -> ir.Value:
        """``v`` in every lane."""
        return _splat(self.b, v, self.w)

    def lanes(self, v: ir.Value, varying: bool) -> ir.Value:
        return v if varying else self.splat(v)

    def iota(self, step: int) -> ir.Constant:
        return ir.Constant(self.vec(I64), [step * j for j in range(self.w)])

    # -- index expressions --------------------------------------------------------
    def index(self, e: E.Expr) -> tuple[ir.Value, bool]:
        s = stride(e, self.x)
        assert s is not None
        base = self.g.idx(e)  # at the first lane (the slot holds its iteration)
        if s == 0:
            return base, False
        return self.b.add(self.splat(base), self.iota(s)), True

    def pred(self, p: E.Pred) -> tuple[ir.Value, bool]:
        b = self.b
        if isinstance(p, E.BoolConst):
            return ir.Constant(I1, int(p.value)), False
        if isinstance(p, E.Cmp):
            (x, vx), (y, vy) = self.index(p.a), self.index(p.b)
            if not (vx or vy):
                return b.icmp_signed(p.op, x, y), False
            return b.icmp_signed(p.op, self.lanes(x, vx), self.lanes(y, vy)), True
        if isinstance(p, E.PNot):
            v, vr = self.pred(p.item)
            return self.bool_not(v, vr), vr
        items = [self.pred(q) for q in p.items]
        varying = any(vr for _, vr in items)
        out = self.lanes(*items[0]) if varying else items[0][0]
        for v, vr in items[1:]:
            v = self.lanes(v, vr) if varying else v
            out = b.and_(out, v) if isinstance(p, E.PAnd) else b.or_(out, v)
        return out, varying

    def bool_not(self, v: ir.Value, varying: bool) -> ir.Value:
        ones = ir.Constant(self.vec(I1), [1] * self.w) if varying else ir.Constant(I1, 1)
        return self.b.xor(v, ones)

    # -- data --------------------------------------------------------------------
    def value(self, x: Any) -> tuple[ir.Value, bool]:
        g, b = self.g, self.b
        if isinstance(x, (L.Const, L.Ref)):
            return g.expr(x), False
        if isinstance(x, L.IExpr):
            return self.index(x.e)
        if isinstance(x, L.IPred):
            return self.pred(x.p)
        if isinstance(x, L.Load):
            return self.load(x)
        if isinstance(x, L.Select):
            (c, vc), (p, vp), (q, vq) = (self.value(y) for y in (x.c, x.a, x.b))
            if not (vc or vp or vq):
                return b.select(c, p, q), False
            return b.select(c, self.lanes(p, vp), self.lanes(q, vq)), True
        if isinstance(x, L.Fma):
            vals = [self.value(y) for y in (x.a, x.b, x.c)]
            varying = any(v for _, v in vals)
            ops = [self.lanes(v, vr) if varying else v for v, vr in vals]
            t = ops[0].type
            fn = g.math.intrinsic(f"llvm.fmuladd.{suffix(t)}", t, [t, t, t])
            return b.call(fn, ops), varying
        if isinstance(x, L.Un):
            v, vr = self.value(x.a)
            if x.op == "exp" and vr:  # f32, or a 16-bit float through f32
                e = b.call(g.math.exp_f32_vec(self.w), [g.to_wide(v, x.a.dtype)])
                return g.from_wide(e, x.dtype), True
            return g.unary(x.op, v, x.a.dtype, x.dtype), vr
        if isinstance(x, L.Bin):
            (p, vp), (q, vq) = self.value(x.a), self.value(x.b)
            varying = vp or vq
            prep = g.divisor_preps.get(x.b) if float_division(x) and vp else None
            if prep is not None:  # a shared divisor: its prepared reciprocal
                q = b.call(g.math.fdiv_by_f32_vec(self.w), [g.to_wide(p, x.a.dtype), *prep])
                return g.from_wide(q, x.dtype), True
            if varying:
                p, q = self.lanes(p, vp), self.lanes(q, vq)
            return g.binary(x.op, p, q, x.a.dtype, x.flags), varying
        if isinstance(x, L.Cast):
            v, vr = self.value(x.a)
            conv = self.cast if vr else g.cast
            return conv(v, x.a.dtype, x.dtype, x.overflow), vr
        raise TypeError(f"no vector form for {x!r}")  # plan() admitted it: a bug here

    def cast(self, v: ir.Value, src: D.DType, dst: D.DType,
             overflow: str | None = None) -> ir.Value:
        """The lane-wise cast of the kinds :func:`plan` admits, with the
        meaning of the scalar ``codegen.FnGen.cast``: between f32 and f64
        exact widening or one rounding; integers (and bool, 0 or 1) by
        register width, truncating or extending by the source's signedness;
        integers to f32/f64 rounded once; f16, bf16 and FP8 widened exactly
        to f32 (and f64), and reached from f32 or from each other (exactly
        through f32) with one rounding (``overflow`` for FP8, ``softfloat``)."""
        from .codegen import reg_type

        b = self.b
        if src == dst:
            return v
        if src.name in _NARROW_CASTS and dst.name in _NARROW_CASTS | {"f64"}:
            return self.g.cast(v, src, dst, overflow)  # its float rules are lane-wise
        rt = self.vec(reg_type(dst))
        if src.is_float:
            return b.fpext(v, rt) if dst.bits > src.bits else b.fptrunc(v, rt)
        if dst.is_float:
            return (b.sitofp if src.is_signed else b.uitofp)(v, rt)
        sw, dw = v.type.element.width, rt.element.width
        if sw == dw:
            return v
        if dw < sw:
            return b.trunc(v, rt)
        return b.sext(v, rt) if src.is_signed else b.zext(v, rt)

    def address(self, buf: L.Buffer, index: L.IExpr) -> ir.Value:
        from .codegen import mem_type

        return self.b.gep(self.g.ptr[buf.name], [self.g.idx(index.e)], inbounds=True,
                          source_etype=mem_type(buf.dtype))

    def load(self, x: L.Load) -> tuple[ir.Value, bool]:
        from .codegen import mem_type

        g, b = self.g, self.b
        assert isinstance(x.index, L.IExpr)
        if stride(x.index.e, self.x) == 0:
            return g.expr(x), False  # uniform (its guard too: plan())
        mt = mem_type(x.buf.dtype)
        ptr = self.address(x.buf, x.index)
        align = max(1, x.buf.dtype.bits // 8)
        vt = self.vec(mt)
        s = stride(x.index.e, self.x)
        if x.guard is None and s == 1:
            v = b.load(ptr, typ=vt, align=align)
        else:
            if x.guard is None:
                mask = ir.Constant(self.vec(I1), [1] * self.w)
                fill = ir.Constant(vt, ir.Undefined)
            else:
                mask = self.lanes(*self.value(x.guard))
                assert x.fill is not None
                fill = self.to_memory(self.lanes(*self.value(x.fill)), x.buf.dtype)
            if s == 1:
                fn = g.math.intrinsic(f"llvm.masked.load.{suffix(vt)}.p0", vt,
                                      [ir.PointerType(), I32, mask.type, vt])
                v = b.call(fn, [ptr, ir.Constant(I32, align), mask, fill])
            else:  # lane j reads element index + j s: a gather
                pv = self.lane_pointers(ptr, s * align)
                fn = g.math.intrinsic(f"llvm.masked.gather.{suffix(vt)}.v{self.w}p0", vt,
                                      [pv.type, I32, mask.type, vt])
                v = b.call(fn, [pv, ir.Constant(I32, align), mask, fill])
        if x.buf.dtype.is_bool:
            v = b.icmp_unsigned("!=", v, ir.Constant(vt, [0] * self.w))
        return v, True

    def lane_pointers(self, ptr: ir.Value, step: int) -> ir.Value:
        """``<W x ptr>``: lane ``j`` points ``j step`` bytes past ``ptr``."""
        b = self.b
        base = self.splat(b.ptrtoint(ptr, I64))
        return b.inttoptr(b.add(base, self.iota(step)), self.vec(ir.PointerType()))

    def to_memory(self, v: ir.Value, dt: D.DType) -> ir.Value:
        """A register value of ``dt`` in its memory form (bool: one byte)."""
        return self.b.zext(v, self.vec(I8)) if dt.is_bool else v

    def accumulate(self, s: L.Assign, slot: ir.Value) -> None:
        """``acc = op(acc, value)`` lane by lane into the lanes in ``slot``."""
        b = self.b
        v = self.lanes(*self.value(s.value.b))
        acc = b.load(slot, typ=v.type)
        b.store(self.g.binary(s.value.op, acc, v, s.var.dtype, s.value.flags), slot)

    def store(self, s: L.Store) -> None:
        from .codegen import mem_type

        g, b = self.g, self.b
        assert isinstance(s.index, L.IExpr)
        val = self.to_memory(self.lanes(*self.value(s.value)), s.buf.dtype)
        ptr = self.address(s.buf, s.index)
        align = max(1, s.buf.dtype.bits // 8)
        if s.guard is None:
            if s.buf.name == self.stream:
                inst = b.store(val, ptr, align=align * self.w)
                inst.set_metadata("nontemporal", g.cg.module.add_metadata([ir.Constant(I32, 1)]))
                return
            b.store(val, ptr, align=align)
            return
        mask = self.lanes(*self.value(s.guard))
        vt = self.vec(mem_type(s.buf.dtype))
        fn = g.math.intrinsic(f"llvm.masked.store.{suffix(vt)}.p0", ir.VoidType(),
                              [vt, ir.PointerType(), I32, mask.type])
        b.call(fn, [val, ptr, ir.Constant(I32, align), mask])


def _splat(b: ir.IRBuilder, v: ir.Value, w: int) -> ir.Value:
    """The scalar ``v`` in each of ``w`` lanes."""
    vt = ir.VectorType(v.type, w)
    one = b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(I32, 0))
    return b.shuffle_vector(one, ir.Constant(vt, ir.Undefined),
                            ir.Constant(ir.VectorType(I32, w), [0] * w))


def suffix(t: ir.Type) -> str:
    """The overload suffix of an intrinsic on values of type ``t``
    (``f32``, ``v16f32``, ``i64``, ``v8i1``...)."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{suffix(t.element)}"
    if isinstance(t, ir.HalfType):
        return "f16"
    if isinstance(t, ir.FloatType):
        return "f32"
    if isinstance(t, ir.DoubleType):
        return "f64"
    return str(t)
