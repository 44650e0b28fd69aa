"""Loop IR -> LLVM IR (llvmlite.ir).

Each phase becomes ``void @<phase>(ptr args, ptr syms, ptr locals, i64 lo,
i64 hi, ptr status)``: ``args`` holds one data pointer per kernel parameter
(tensors, and scalars passed by reference), ``syms`` the kernel symbols (i64),
``locals`` one pointer per local buffer (private to the calling worker), and
the function runs the phase body for program ids ``lo <= pid < hi``. It loads
the pointers and calls ``@<phase>.body`` (always inlined), whose buffer
parameters are ``noalias``: distinct buffers never overlap (the runtime checks
this for tensors that are written), except the members of the schedule's alias
groups (one array passed for several parameters).

Scalar semantics follow ``semantics/numerics.py`` exactly:

* ``bool`` is ``i1`` in registers and one byte (0/1) in memory (so its
  register width, not ``DType.bits``, decides whether a conversion extends);
  ``bf16`` is an ``i16`` bit pattern, widened exactly to ``float`` for
  arithmetic and rounded back to nearest-even (NaN stays a quiet NaN); the
  FP8 formats are ``i8`` bit patterns, widened exactly to ``float`` and
  reached by casts alone, with the cast's overflow policy; ``f16``
  is LLVM ``half`` computed in ``float`` and rounded once. Narrowing from f64
  (or a 64-bit integer) to f16/bf16 rounds to odd at f32 (f64) first, so the
  result is rounded once (``softfloat``). Conversions the host has no
  instruction for become calls of tilenest's own helpers (``symbols``).
* no fast-math flags except the permissions the loop IR grants (``reassoc``
  on tree-permitted merges; fused multiply-add only through ``Fma``), so LLVM
  never contracts or reorders anything else;
* integer division/remainder by zero and negative shift counts record the
  reserved status codes :data:`DIV_ZERO` / :data:`NEG_SHIFT` and use a safe
  operand; ``MIN / -1`` wraps; shifts by ``>= bits`` give 0 (or the sign fill);
* float -> int casts saturate with NaN -> 0 (``llvm.fpto[su]i.sat``);
* transcendentals meet their accuracy contract (``numerics.TRANSCENDENTAL_ULP``)
  rather than the interpreter's bits: see ``mathlib``.

Index arithmetic (``IExpr``) is i64 with ``nsw``: index expressions are assumed
not to overflow 64 bits (the interpreter computes them exactly).
"""

from __future__ import annotations

import math
import platform
from typing import Any

import numpy as np
from llvmlite import ir

from ...errors import NotAvailableError
from ...lowering import loopir as L
from ...lowering.divisors import shared_divisors
from ...semantics import dtypes as D
from ...semantics import expr as E
from . import prefetch as PF
from . import streaming as ST
from . import softfloat as SF
from .mathlib import MathLib
from .transpose import TransposedCopies
from .vector import VectorLoops, suffix

DIV_ZERO, NEG_SHIFT = L.DIV_ZERO, L.NEG_SHIFT

I1, I8, I16, I32, I64 = (ir.IntType(n) for n in (1, 8, 16, 32, 64))
F16, F32, F64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()
PTR = ir.PointerType()

_TRANSCENDENTAL = ("exp", "exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tanh", "erf",
                   "sigmoid", "rsqrt")
_FCMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=="}
_ICMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def reg_type(dt: D.DType) -> ir.Type:
    """The LLVM type of a value of ``dt`` in registers."""
    if dt.is_bool:
        return I1
    if dt.is_int:
        return ir.IntType(dt.bits)
    return {"f8e4m3fn": I8, "f8e5m2": I8, "f16": F16, "bf16": I16, "f32": F32,
            "f64": F64}[dt.name]


def mem_type(dt: D.DType) -> ir.Type:
    """The LLVM type of a value of ``dt`` in memory (bool is one byte)."""
    return I8 if dt.is_bool else reg_type(dt)


class FnGen(VectorLoops, TransposedCopies):
    """Generates one phase body function (``for.vector`` loops as vector code
    where :mod:`.vector` can: :class:`.vector.VectorLoops`)."""

    def __init__(self, cg: "Codegen", ph: L.Phase):
        self.cg = cg
        self.k = cg.k
        self.math = cg.math
        bufs = list(self.k.globals) + list(self.k.locals)
        self.bufs = bufs
        args = [PTR] * len(bufs) + [I64] * len(self.k.syms) + [I64, I64, PTR]
        self.fn = ir.Function(cg.module, ir.FunctionType(ir.VoidType(), args),
                              name=f"{ph.name}.body")
        self.fn.linkage = "internal"
        self.fn.attributes.add("alwaysinline")
        self.fn.attributes.add("nounwind")
        for i, b in enumerate(bufs):
            if b.name not in cg.may_alias:
                self.fn.args[i].add_attribute("noalias")
        self.ptr = {b.name: self.fn.args[i] for i, b in enumerate(bufs)}
        self.prefetches = PF.plan(ph, frozenset(b.name for b in self.k.globals))
        self.streams = ST.plan(self.k, ph, cg.may_alias) if cg.x86 else {}
        self.divisor_preps = {}
        self.streamed = False
        ns = len(bufs)
        self.syms = {s: self.fn.args[ns + i] for i, s in enumerate(self.k.syms)}
        lo, hi, status = self.fn.args[ns + len(self.k.syms):]
        self.status = status
        self.entry = self.fn.append_basic_block("entry")
        self.b = ir.IRBuilder(self.entry)
        self.vars: dict[str, tuple[ir.Value, D.DType]] = {}
        self.alloca_builder = ir.IRBuilder(self.entry)
        start = self.fn.append_basic_block("start")
        self.b.position_at_end(start)
        self.loop(ph.pid, lo, hi, ph.body, "parallel", False)
        if self.streamed:  # streaming stores are weakly ordered: fence them
            self.b.call(self.math.intrinsic("llvm.x86.sse.sfence", ir.VoidType(), []), [])
        self.b.ret_void()
        self.alloca_builder.position_at_end(self.entry)
        self.alloca_builder.branch(start)

    # -- locals ---------------------------------------------------------------
    def var(self, v: L.LVar) -> ir.Value:
        return self.slot(v.name, reg_type(v.dtype), v.dtype)

    def slot(self, name: str, typ: ir.Type, dtype: D.DType) -> ir.Value:
        """The stack slot ``name`` of type ``typ`` holding values of ``dtype``,
        allocated once in the entry block (where LLVM promotes it to
        registers)."""
        got = self.vars.get(name)
        if got is None:
            with self.alloca_builder.goto_entry_block():
                self.alloca_builder.position_at_start(self.entry)
                slot = self.alloca_builder.alloca(typ, name=name)
            got = (slot, dtype)
            self.vars[name] = got
        return got[0]

    def read_var(self, name: str) -> tuple[ir.Value, D.DType]:
        slot, dt = self.vars[name]
        return self.b.load(slot, typ=reg_type(dt)), dt

    # -- statements -------------------------------------------------------------
    def stmts(self, body: tuple) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, s: Any) -> None:
        b = self.b
        if isinstance(s, L.Assign):
            val = self.expr(s.value)
            b.store(val, self.var(s.var))
        elif isinstance(s, L.Store):
            if s.guard is None:
                self.store(s.buf, self.expr(s.index), self.expr(s.value))
            else:
                g = self.expr(s.guard)
                with b.if_then(g):
                    self.store(s.buf, self.expr(s.index), self.expr(s.value))
        elif isinstance(s, L.For):
            if not self.transposed_copy(s):
                self.loop(s.var, self.idx(s.lo), self.idx(s.hi), s.body, s.kind, s.reverse)
        elif isinstance(s, L.If):
            c = self.expr(s.cond)
            if s.orelse:
                with b.if_else(c) as (then, other):
                    with then:
                        self.stmts(s.then)
                    with other:
                        self.stmts(s.orelse)
            else:
                with b.if_then(c):
                    self.stmts(s.then)
        elif isinstance(s, L.While):
            head = self.fn.append_basic_block("while.head")
            body = self.fn.append_basic_block("while.body")
            done = self.fn.append_basic_block("while.done")
            b.branch(head)
            b.position_at_end(head)
            self.stmts(s.pre)
            b.cbranch(self.expr(s.cond), body, done)
            b.position_at_end(body)
            self.stmts(s.body)
            b.branch(head)
            b.position_at_end(done)
        elif isinstance(s, L.Check):
            self.fail_unless(self.expr(s.cond), s.code)
        elif isinstance(s, (L.Barrier, L.Comment)):
            pass
        else:
            raise TypeError(f"unknown loop-IR statement {s!r}")

    def loop(self, var: L.LVar, lo: ir.Value, hi: ir.Value, body: tuple, kind: str,
             reverse: bool) -> None:
        w = self.vector_plan(var, body, kind, reverse)
        if w is not None:
            self.vector_loop(var, lo, hi, body, w)
        else:
            self.scalar_loop(var, lo, hi, body, reverse)

    def scalar_loop(self, var: L.LVar, lo: ir.Value, hi: ir.Value, body: tuple,
                    reverse: bool) -> None:
        """``for var in [lo, hi)`` one iteration at a time (descending with
        ``reverse``)."""
        if reverse:
            self.counted_loop(var, lo, hi, -1, lambda: self.stmts(body))
        else:
            self.counted_loop(var, lo, hi, 1, lambda: self.stmts(body))

    def counted_loop(self, var: L.LVar, lo: ir.Value, hi: ir.Value, step: int,
                     body: Any) -> None:
        """A loop whose variable ``var`` takes ``lo, lo + step, ...`` while
        below ``hi`` (``step > 0``), or ``hi - 1, hi - 2, ...`` while at least
        ``lo`` (``step == -1``), running ``body()`` for each value."""
        b = self.b
        slot = self.var(var)
        head = self.fn.append_basic_block(f"{var.name}.head")
        blk = self.fn.append_basic_block(f"{var.name}.body")
        done = self.fn.append_basic_block(f"{var.name}.done")
        reverse = step < 0
        b.store(b.sub(hi, ir.Constant(I64, 1)) if reverse else lo, slot)
        b.branch(head)
        b.position_at_end(head)
        i = b.load(slot, typ=I64)
        b.cbranch(b.icmp_signed(">=", i, lo) if reverse else b.icmp_signed("<", i, hi), blk, done)
        b.position_at_end(blk)
        body()
        i = b.load(slot, typ=I64)
        b.store(b.add(i, ir.Constant(I64, step), flags=("nsw",)), slot)
        b.branch(head)
        b.position_at_end(done)

    def fail_unless(self, ok: ir.Value, code: int) -> None:
        b = self.b
        cur = b.load(self.status, typ=I32)
        first = b.icmp_unsigned("==", cur, ir.Constant(I32, 0))
        bad = b.and_(b.not_(ok), first)
        b.store(b.select(bad, ir.Constant(I32, code), cur), self.status)

    # -- memory -----------------------------------------------------------------
    def addr(self, buf: L.Buffer, index: ir.Value) -> ir.Value:
        return self.b.gep(self.ptr[buf.name], [index], inbounds=True,
                          source_etype=mem_type(buf.dtype))

    def load(self, buf: L.Buffer, index: ir.Value) -> ir.Value:
        v = self.b.load(self.addr(buf, index), typ=mem_type(buf.dtype))
        return self.b.icmp_unsigned("!=", v, ir.Constant(I8, 0)) if buf.dtype.is_bool else v

    def store(self, buf: L.Buffer, index: ir.Value, v: ir.Value) -> None:
        if buf.dtype.is_bool:
            v = self.b.zext(v, I8)
        self.b.store(v, self.addr(buf, index))

    # -- index expressions --------------------------------------------------------
    def idx(self, e: E.Expr) -> ir.Value:
        b = self.b
        if isinstance(e, E.Const):
            return ir.Constant(I64, e.value)
        if isinstance(e, E.Sym):
            return self.syms[e.name]
        if isinstance(e, (E.Var, E.Val)):
            v, dt = self.read_var(e.name)
            if v.type.width < 64:  # by register width (bool is i1)
                v = b.sext(v, I64) if dt.is_signed else b.zext(v, I64)
            return v
        if isinstance(e, E.Add):
            out = self.idx(e.terms[0])
            for t in e.terms[1:]:
                out = b.add(out, self.idx(t), flags=("nsw",))
            return out
        if isinstance(e, E.Mul):
            out = self.idx(e.factors[0])
            for t in e.factors[1:]:
                out = b.mul(out, self.idx(t), flags=("nsw",))
            return out
        if isinstance(e, (E.FloorDiv, E.Mod)):
            return self.floor_divmod(self.idx(e.a), self.idx(e.b), True, isinstance(e, E.Mod),
                                     nonzero=isinstance(e.b, E.Const))
        if isinstance(e, E.MinMax):
            x, y = self.idx(e.a), self.idx(e.b)
            c = b.icmp_signed("<" if e.op == "min" else ">", x, y)
            return b.select(c, x, y)
        if isinstance(e, E.BitOp):
            x, y = self.idx(e.a), self.idx(e.b)
            return {"^": b.xor, "&": b.and_, "|": b.or_, "<<": b.shl, ">>": b.ashr}[e.op](x, y)
        raise TypeError(f"cannot generate index expression {e!r}")

    def pred(self, p: E.Pred) -> ir.Value:
        b = self.b
        if isinstance(p, E.BoolConst):
            return ir.Constant(I1, int(p.value))
        if isinstance(p, E.Cmp):
            return b.icmp_signed(p.op, self.idx(p.a), self.idx(p.b))
        if isinstance(p, E.PAnd):
            out = self.pred(p.items[0])
            for q in p.items[1:]:
                out = b.and_(out, self.pred(q))
            return out
        if isinstance(p, E.POr):
            out = self.pred(p.items[0])
            for q in p.items[1:]:
                out = b.or_(out, self.pred(q))
            return out
        if isinstance(p, E.PNot):
            return b.not_(self.pred(p.item))
        raise TypeError(f"cannot generate predicate {p!r}")

    def floor_divmod(self, a: ir.Value, d: ir.Value, signed: bool, want_mod: bool,
                     nonzero: bool = False) -> ir.Value:
        """Python floor division / modulo (the divisor made safe: 0 -> 1, and for
        signed -1 -> 1 with the result fixed up)."""
        b = self.b
        t = a.type
        zero, one, m1 = ir.Constant(t, 0), ir.Constant(t, 1), ir.Constant(t, -1)
        if not signed:
            dd = d if nonzero else b.select(b.icmp_unsigned("==", d, zero), one, d)
            return b.urem(a, dd) if want_mod else b.udiv(a, dd)
        isneg1 = b.icmp_signed("==", d, m1)
        bad = isneg1 if nonzero else b.or_(isneg1, b.icmp_signed("==", d, zero))
        dd = b.select(bad, one, d)
        q = b.sdiv(a, dd)
        r = b.srem(a, dd)
        adjust = b.and_(b.icmp_signed("!=", r, zero),
                        b.icmp_signed("<", b.xor(r, dd), zero))
        if want_mod:
            res = b.select(adjust, b.add(r, dd), r)
            return b.select(isneg1, zero, res)
        res = b.select(adjust, b.sub(q, one), q)
        return b.select(isneg1, b.sub(zero, a), res)

    # -- expressions ----------------------------------------------------------------
    def expr(self, x: Any) -> ir.Value:
        b = self.b
        if isinstance(x, L.Const):
            return const(x.value, x.dtype)
        if isinstance(x, L.Ref):
            return self.read_var(x.var.name)[0]
        if isinstance(x, L.IExpr):
            return self.idx(x.e)
        if isinstance(x, L.IPred):
            return self.pred(x.p)
        if isinstance(x, L.Load):
            if x.guard is None:
                return self.load(x.buf, self.expr(x.index))
            g = self.expr(x.guard)
            i = b.select(g, self.expr(x.index), ir.Constant(I64, 0))
            return b.select(g, self.load(x.buf, i), self.expr(x.fill))
        if isinstance(x, L.Select):
            return b.select(self.expr(x.c), self.expr(x.a), self.expr(x.b))
        if isinstance(x, L.Cast):
            return self.cast(self.expr(x.a), x.a.dtype, x.dtype, x.overflow)
        if isinstance(x, L.Bitcast):
            return self.bitcast(self.expr(x.a), x.a.dtype, x.dtype)
        if isinstance(x, L.Un):
            return self.unary(x.op, self.expr(x.a), x.a.dtype, x.dtype)
        if isinstance(x, L.Bin):
            return self.binary(x.op, self.expr(x.a), self.expr(x.b), x.a.dtype, x.flags)
        if isinstance(x, L.Fma):
            dt = x.dtype
            a, bb, c = (self.to_wide(self.expr(y), dt) for y in (x.a, x.b, x.c))
            w = self.wide_type(dt)
            fn = self.math.intrinsic(f"llvm.fmuladd.{_suffix(w)}", w, [w, w, w])
            return self.from_wide(b.call(fn, [a, bb, c]), dt)
        raise TypeError(f"unknown loop-IR expression {x!r}")

    # -- float helpers ------------------------------------------------------------------
    @staticmethod
    def wide_type(dt: D.DType) -> ir.Type:
        """The type arithmetic of ``dt`` happens in (f16/bf16 in float)."""
        return F64 if dt.name == "f64" else F32

    def to_wide(self, v: ir.Value, dt: D.DType) -> ir.Value:
        """A value of ``dt`` widened exactly to :meth:`wide_type` (lane-wise for
        a vector)."""
        if dt.name == "f16":
            return self.b.fpext(v, SF.like(v, F32))
        if dt.name == "bf16":
            return SF.bf16_bits_to_f32(self.b, v)
        if dt.is_fp8:
            return SF.fp8_bits_to_f32(self.b, v, dt.name)
        return v

    def from_wide(self, v: ir.Value, dt: D.DType) -> ir.Value:
        """A float (f32) rounded once to ``dt`` (f16/bf16), or unchanged
        (lane-wise for a vector)."""
        if dt.name == "f16":
            return self.b.fptrunc(v, SF.like(v, F16))
        if dt.name == "bf16":
            return SF.f32_to_bf16_bits(self.b, v)
        if dt.is_fp8:  # arithmetic never yields FP8 (V-24); casts go through to_fp8
            raise NotAvailableError(f"internal: an arithmetic result of dtype {dt}")
        return v

    def from_f64(self, v: ir.Value, dt: D.DType) -> ir.Value:
        """A float64 rounded once to float dtype ``dt``. For f16 and bf16 the
        value is rounded to odd at f32 first (``softfloat.f64_to_f32_odd``), so
        the second rounding is the only one that counts; no f64 -> f16
        instruction (absent on x86-64) is needed."""
        b = self.b
        if dt.name == "f64":
            return v
        if dt.name == "f32":
            return b.fptrunc(v, F32)
        return self.from_wide(SF.f64_to_f32_odd(b, v), dt)

    def to_f64(self, v: ir.Value, dt: D.DType) -> ir.Value:
        return v if dt.name == "f64" else self.b.fpext(self.to_wide(v, dt), F64)

    def fintr(self, name: str, v: ir.Value, *more: ir.Value, flags: tuple = ()) -> ir.Value:
        t = v.type
        fn = self.math.intrinsic(f"llvm.{name}.{_suffix(t)}", t, [t] * (1 + len(more)))
        return self.b.call(fn, [v, *more], fastmath=flags)

    # -- unary ---------------------------------------------------------------------------
    def unary(self, op: str, v: ir.Value, dt: D.DType, rt: D.DType) -> ir.Value:
        b = self.b
        if dt.is_bool:
            if op == "not":
                return b.not_(v)
            raise NotAvailableError(f"op '{op}' on bool has no llvm lowering")
        if dt.is_int:
            t = v.type
            if op == "neg":
                return b.sub(ir.Constant(t, 0), v)
            if op == "abs":
                if not dt.is_signed:
                    return v
                return b.select(b.icmp_signed("<", v, ir.Constant(t, 0)),
                                b.sub(ir.Constant(t, 0), v), v)
            if op == "bitnot":
                return b.not_(v)
            raise NotAvailableError(f"op '{op}' on {dt} has no llvm lowering")
        if op == "neg":
            if dt.name == "bf16":
                return b.xor(v, SF.const_of(v, 0x8000))
            return b.fneg(v)
        if op == "abs":
            if dt.name == "bf16":
                return b.and_(v, SF.const_of(v, 0x7FFF))
            return self.fintr("fabs", v)
        if op == "signbit":
            bits = v if isinstance(v.type, ir.IntType) else b.bitcast(v, ir.IntType(dt.bits))
            return b.icmp_signed("<", bits, ir.Constant(bits.type, 0))
        w = self.to_wide(v, dt)
        if op == "isnan":
            return b.fcmp_unordered("uno", w, w)
        if op in ("isinf", "isfinite"):
            a = self.fintr("fabs", w)
            inf = ir.Constant(w.type, math.inf)
            return b.fcmp_ordered("==" if op == "isinf" else "<", a, inf)
        if op in ("sqrt", "floor", "ceil", "trunc", "round"):
            name = {"round": "roundeven"}.get(op, op)
            return self.from_wide(self.fintr(name, w), dt)
        if op == "exp" and dt.name != "f64":
            return self.from_wide(b.call(self.math.exp_f32(), [w]), dt)
        if op in _TRANSCENDENTAL:
            return self.from_f64(self.transcendental(op, self.to_f64(v, dt), dt), dt)
        raise NotAvailableError(f"op '{op}' on {dt} has no llvm lowering")

    def transcendental(self, op: str, x: ir.Value, dt: D.DType) -> ir.Value:
        """``op`` on a float64 value, per the mathlib contract: the vectorizable
        narrow-dtype evaluations (``mathlib.MathLib.narrow``), else the C library."""
        b = self.b
        one = ir.Constant(F64, 1.0)
        if op == "rsqrt":
            return b.fdiv(one, self.fintr("sqrt", x))
        if dt.name != "f64" and op in self.math.NARROW:
            return b.call(self.math.narrow(op), [x])
        if op == "sigmoid":
            return b.fdiv(one, b.fadd(one, b.call(self.math.libm("exp"), [b.fneg(x)])))
        return b.call(self.math.libm(op), [x])

    # -- binary ----------------------------------------------------------------------------
    def binary(self, op: str, x: ir.Value, y: ir.Value, dt: D.DType, flags: frozenset) -> ir.Value:
        b = self.b
        if op in _ICMP and (dt.is_int or dt.is_bool):
            if dt.is_signed:
                return b.icmp_signed(_ICMP[op], x, y)
            return b.icmp_unsigned(_ICMP[op], x, y)
        if dt.is_bool:
            if op in ("and", "minimum"):
                return b.and_(x, y)
            if op in ("or", "maximum"):
                return b.or_(x, y)
            if op == "xor":
                return b.xor(x, y)
            raise NotAvailableError(f"op '{op}' on bool has no llvm lowering")
        if dt.is_int:
            return self.int_binary(op, x, y, dt)
        fl = ("reassoc",) if "reassoc" in flags and dt.bits >= 32 else ()
        wx, wy = self.to_wide(x, dt), self.to_wide(y, dt)
        if op in _FCMP:
            return b.fcmp_ordered(_FCMP[op], wx, wy)
        if op == "ne":
            return b.fcmp_unordered("!=", wx, wy)
        if op in ("add", "sub", "mul", "div", "rem"):
            f = {"add": b.fadd, "sub": b.fsub, "mul": b.fmul, "div": b.fdiv, "rem": b.frem}[op]
            return self.from_wide(f(wx, wy, flags=fl), dt)
        if op in ("maximum", "minimum"):
            return self.from_wide(self.fintr(op, wx, wy, flags=fl), dt)
        if op in ("floordiv", "mod"):
            return self.from_wide(self.float_floor_divmod(wx, wy, op == "mod"), dt)
        if op in ("pow", "atan2"):
            r = b.call(self.math.libm(op), [self.to_f64(x, dt), self.to_f64(y, dt)])
            return self.from_f64(r, dt)
        raise NotAvailableError(f"op '{op}' on {dt} has no llvm lowering")

    def float_floor_divmod(self, a: ir.Value, d: ir.Value, want_mod: bool) -> ir.Value:
        """numpy's ``floor_divide`` / ``remainder`` on floats (npy_divmod)."""
        b = self.b
        t = a.type
        zero = ir.Constant(t, 0.0)
        mod = b.frem(a, d)
        dz = b.fcmp_ordered("==", d, zero)
        modnz = b.fcmp_unordered("!=", mod, zero)
        sign_differs = b.xor(b.fcmp_ordered("<", d, zero), b.fcmp_ordered("<", mod, zero))
        fix = b.and_(modnz, sign_differs)
        div = b.fdiv(b.fsub(a, mod), d)
        mod2 = b.select(fix, b.fadd(mod, d), mod)
        div2 = b.select(fix, b.fsub(div, ir.Constant(t, 1.0)), div)
        csign = self.fintr("copysign", zero, d)
        mod3 = b.select(modnz, mod2, csign)
        if want_mod:
            # remainder: fmod when d == 0 (NaN), else the adjusted modulus
            return b.select(dz, mod, mod3)
        fl = self.fintr("floor", div2)
        fl = b.select(b.fcmp_ordered(">", b.fsub(div2, fl), ir.Constant(t, 0.5)),
                      b.fadd(fl, ir.Constant(t, 1.0)), fl)
        divnz = b.fcmp_unordered("!=", div2, zero)
        res = b.select(divnz, fl, self.fintr("copysign", zero, b.fdiv(a, d)))
        return b.select(dz, b.fdiv(a, d), res)

    def int_binary(self, op: str, x: ir.Value, y: ir.Value, dt: D.DType) -> ir.Value:
        b = self.b
        t = x.type
        s = dt.is_signed
        if op in ("add", "sub", "mul"):
            return {"add": b.add, "sub": b.sub, "mul": b.mul}[op](x, y)
        if op in ("and", "or", "xor"):
            return {"and": b.and_, "or": b.or_, "xor": b.xor}[op](x, y)
        if op in ("maximum", "minimum"):
            c = (b.icmp_signed if s else b.icmp_unsigned)(">" if op == "maximum" else "<", x, y)
            return b.select(c, x, y)
        if op in ("div", "rem", "floordiv", "mod"):
            self.fail_unless(b.icmp_unsigned("!=", y, ir.Constant(t, 0)), DIV_ZERO)
            if op in ("floordiv", "mod"):
                return self.floor_divmod(x, y, s, op == "mod")
            zero, one = ir.Constant(t, 0), ir.Constant(t, 1)
            if not s:
                dd = b.select(b.icmp_unsigned("==", y, zero), one, y)
                return b.udiv(x, dd) if op == "div" else b.urem(x, dd)
            m1 = b.icmp_signed("==", y, ir.Constant(t, -1))
            dd = b.select(b.or_(m1, b.icmp_signed("==", y, zero)), one, y)
            if op == "div":
                return b.select(m1, b.sub(zero, x), b.sdiv(x, dd))
            return b.select(m1, zero, b.srem(x, dd))
        if op in ("shl", "shr"):
            bits = ir.Constant(t, dt.bits)
            if s:
                self.fail_unless(b.icmp_signed(">=", y, ir.Constant(t, 0)), NEG_SHIFT)
            big = b.icmp_unsigned(">=", y, bits)
            cnt = b.select(big, ir.Constant(t, 0), y)
            if op == "shl":
                return b.select(big, ir.Constant(t, 0), b.shl(x, cnt))
            if s:
                return b.ashr(x, b.select(big, ir.Constant(t, dt.bits - 1), cnt))
            return b.select(big, ir.Constant(t, 0), b.lshr(x, cnt))
        raise NotAvailableError(f"op '{op}' on {dt} has no llvm lowering")

    # -- conversions --------------------------------------------------------------------------
    def cast(self, v: ir.Value, src: D.DType, dst: D.DType,
             overflow: str | None = None) -> ir.Value:
        b = self.b
        if src == dst:
            return v
        if dst.is_fp8:
            return SF.f32_to_fp8_bits(b, self.to_f32_odd(v, src), dst.name, overflow)
        if dst.is_bool:
            if src.is_float:
                w = self.to_wide(v, src)
                return b.fcmp_unordered("!=", w, ir.Constant(w.type, 0.0))
            return b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        if src.is_float and dst.is_float:
            if src.name == "f64":
                return self.from_f64(v, dst)
            w = self.to_wide(v, src)  # exact
            if dst.name == "f64":
                return b.fpext(w, SF.like(w, F64))
            return self.from_wide(w, dst)
        if src.is_float:  # saturating, NaN -> 0
            w = self.to_wide(v, src)
            name = "fptosi" if dst.is_signed else "fptoui"
            rt = reg_type(dst)
            fn = self.math.intrinsic(f"llvm.{name}.sat.i{dst.bits}.{_suffix(w.type)}", rt,
                                     [w.type])
            return b.call(fn, [w])
        if dst.is_float:
            conv = b.sitofp if src.is_signed else b.uitofp
            if dst.name in ("f32", "f64"):
                return conv(v, reg_type(dst))
            if v.type.width <= 32:
                return self.from_f64(conv(v, F64), dst)  # exact in f64, then one rounding
            return self.from_wide(SF.f64_to_f32_odd(b, self.int64_to_f64_odd(v, src)), dst)
        # integer (or bool) -> integer: by the register widths (bool is i1 in
        # registers although it occupies a byte), truncating or extending; bool
        # is 0 or 1, so it zero-extends
        rt = reg_type(dst)
        sw, dw = v.type.width, rt.width
        if sw == dw:
            return v
        if dw < sw:
            return b.trunc(v, rt)
        return b.sext(v, rt) if src.is_signed else b.zext(v, rt)

    def int64_to_f64_odd(self, v: ir.Value, src: D.DType) -> ir.Value:
        """The 64-bit integer ``v`` rounded to odd at f64 (as numerics'
        ``_int64_to_f64``): the magnitude ``m = hi 2^32 + lo`` is the sum of
        two exact halves, rounded once; the exact error ``lo - (y - big)``
        (Fast2Sum, ``big >= lo`` or ``big = 0``) says whether ``y`` is inexact
        and on which side. Rounding the result once more to at most 51 bits
        equals rounding ``v`` once."""
        b = self.b
        zero = ir.Constant(I64, 0)
        neg = b.icmp_signed("<", v, zero) if src.is_signed else ir.Constant(I1, 0)
        m = b.select(neg, b.sub(zero, v), v)
        big = b.fmul(b.uitofp(b.lshr(m, ir.Constant(I64, 32)), F64), ir.Constant(F64, 2.0 ** 32))
        lo = b.uitofp(b.and_(m, ir.Constant(I64, 0xFFFF_FFFF)), F64)
        y = b.fadd(big, lo)
        err = b.fsub(lo, b.fsub(y, big))
        ybits = b.bitcast(y, I64)
        tz = b.select(b.fcmp_ordered("<", err, ir.Constant(F64, 0.0)),
                      b.sub(ybits, ir.Constant(I64, 1)), ybits)
        odd = b.select(b.fcmp_ordered("!=", err, ir.Constant(F64, 0.0)),
                       b.or_(tz, ir.Constant(I64, 1)), ybits)
        y = b.bitcast(odd, F64)
        return b.select(neg, b.fneg(y), y)

    def to_f32_odd(self, v: ir.Value, src: D.DType) -> ir.Value:
        """The value of ``v`` (any number) as an f32, exact or rounded to odd
        (``softfloat.f64_to_f32_odd``), so that one rounding to a narrower
        format afterwards is the only one that counts."""
        b = self.b
        if src.is_float:
            return SF.f64_to_f32_odd(b, v) if src.name == "f64" else self.to_wide(v, src)
        if src.is_bool:
            return b.uitofp(v, F32)
        if v.type.width <= 32:
            conv = b.sitofp if src.is_signed else b.uitofp
            return SF.f64_to_f32_odd(b, conv(v, F64))  # exact in f64
        return SF.f64_to_f32_odd(b, self.int64_to_f64_odd(v, src))

    def bitcast(self, v: ir.Value, src: D.DType, dst: D.DType) -> ir.Value:
        b = self.b
        if dst.is_bool:
            bits = v if isinstance(v.type, ir.IntType) else b.bitcast(v, I8)
            return b.icmp_unsigned("!=", bits, ir.Constant(bits.type, 0))
        if src.is_bool:
            return b.zext(v, I8)
        st, dt_ = reg_type(src), reg_type(dst)
        return v if st == dt_ else b.bitcast(v, dt_)


_suffix = suffix


def const(value: Any, dt: D.DType) -> ir.Constant:
    """An LLVM constant holding ``value`` (already representable in ``dt``)."""
    t = reg_type(dt)
    if dt.is_bool:
        return ir.Constant(I1, int(bool(value)))
    if dt.is_int:
        v = int(value)
        if v >= 1 << (dt.bits - 1):
            v -= 1 << dt.bits
        return ir.Constant(t, v)
    if dt.name == "bf16" or dt.is_fp8:  # bit patterns
        bits = int(np.array(value, dtype=dt.np).view(f"u{dt.itemsize}").item())
        return ir.Constant(t, bits - (1 << dt.bits) if bits >= 1 << (dt.bits - 1) else bits)
    return ir.Constant(t, float(value))


class Codegen:
    """One LLVM module for a loop-IR kernel: a body and an entry per phase."""

    def __init__(self, k: L.Kernel, vector_bits: int, cpu: str = "", features: str = "",
                 may_alias: frozenset[str] = frozenset()):
        self.k = k
        #: buffers that may share storage with another (aliased parameters)
        self.may_alias = may_alias
        self.module = ir.Module(name=k.name)
        self.math = MathLib(self.module)
        self.vector_bits = vector_bits
        #: divisors worth a reciprocal prepared once per vector loop
        #: (``lowering.divisors``; used by :mod:`.vector`)
        self.shared_divisors = shared_divisors(k, True, may_alias)
        #: code for an x86 host: streaming stores and their fence exist (:mod:`.streaming`)
        self.x86 = platform.machine().lower() in ("x86_64", "amd64")
        self.entries: list[str] = []
        for ph in k.phases:
            body = FnGen(self, ph).fn
            self.entries.append(self.entry(ph, body))
        self.cpu, self.features = cpu, features

    def entry(self, ph: L.Phase, body: ir.Function) -> str:
        """``void @ph(ptr args, ptr syms, ptr locals, i64 lo, i64 hi, ptr status)``."""
        fn = ir.Function(self.module, ir.FunctionType(ir.VoidType(), [PTR, PTR, PTR, I64, I64,
                                                                     PTR]), name=ph.name)
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        args, syms, locs, lo, hi, status = fn.args
        vals = []
        for g in self.k.globals:
            vals.append(b.load(b.gep(args, [ir.Constant(I64, g.arg)], source_etype=PTR), typ=PTR))
        for i, _ in enumerate(self.k.locals):
            vals.append(b.load(b.gep(locs, [ir.Constant(I64, i)], source_etype=PTR), typ=PTR))
        for i, _ in enumerate(self.k.syms):
            vals.append(b.load(b.gep(syms, [ir.Constant(I64, i)], source_etype=I64), typ=I64))
        b.call(body, vals + [lo, hi, status])
        b.ret_void()
        return ph.name

    def text(self) -> str:
        """The module as LLVM assembly, with the target attributes every
        function carries (vector width preference, CPU and features)."""
        s = str(self.module)
        attrs = [f'"prefer-vector-width"="{self.vector_bits}"',
                 f'"min-legal-vector-width"="{self.vector_bits}"']
        if self.cpu:
            attrs.append(f'"target-cpu"="{self.cpu}"')
        if self.features:
            attrs.append(f'"target-features"="{self.features}"')
        lines = []
        for line in s.splitlines():
            if line.startswith("define "):
                line = line + " #0"
            lines.append(line)
        lines.append("attributes #0 = { " + " ".join(attrs) + " }")
        return "\n".join(lines) + "\n"
