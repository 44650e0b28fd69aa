"""The loop-IR verifier.

Checks, in a fixed order, that a :class:`~tilenest.lowering.loopir.Kernel` is
well formed, so that a backend may translate it without further checks:

1. structure -- phases have a program-id variable; parameters and buffers are
   unique; global/scalar buffers name a parameter position;
2. scoping -- every local is assigned (or bound by a loop / the phase) before
   it is read on every path (conservatively: assignments inside an ``If``
   branch or a loop body do not define a local for the code after it, unless
   it was defined before); index expressions mention only defined
   locals and declared symbols;
3. typing -- both operands of a ``Bin`` share a dtype, comparisons and
   ``and``/``or`` on bools give ``bool``, ``Select`` arms agree and its
   condition is bool, guards and ``If``/``While``/``Check`` conditions are bool,
   stored values have the buffer's dtype, indices are ``i64``,
   ``reassoc``/``contract`` flags only on floating-point adds/muls/max/min;
4. buffers -- every accessed buffer is a declared local or global;
5. threads -- a ``thread`` loop starts at 0, names scope ``block`` and is not
   nested in another; ``Shuffle``/``LaneReduce`` appear only inside one and
   agree in dtype; a ``warp`` barrier only inside one; widths are powers of
   two up to 32; ``shared`` buffers are program buffers, never arguments;
6. tensor cores -- a ``WarpMma`` tile is a multiple of ``MMA_SHAPE``, reads
   two f16 or two bf16 operands into an f32 accumulator, and as a warp
   collective (with a lane) stands inside a thread loop; its accumulator
   may be a lane fragment (``Frag.lane_cols``), in a ``local`` buffer of a
   collective, with the tile's columns, and so may the first operand of one
   warp's collective (16-bit, ``k`` columns); a warpgroup collective
   (``group = 4``, ``wgmma``) has 64 rows, at most 256 columns and row-major
   operands in ``Swizzle128`` buffers; only such a collective on a lane-fragment
   accumulator may be overlapped (``overlap``: completed at a later barrier);
   an opaque one (simdgroup matrices) is one warp's, a multiple of
   ``OPAQUE_SHAPE``, reads two f16 or two f32 operands (bf16 too) into
   f32, with every matrix in memory contiguous along one axis;
7. waits -- an ``MmaWait`` stands outside thread loops, and where overlapped
   mmas are completed by such waits no statement touches a pending one's
   accumulator or writes what it reads (``mma_waits.check_waits``).

A violation raises :class:`~tilenest.errors.VerifyError` naming the statement.
"""

from __future__ import annotations

from ..errors import VerifyError
from ..semantics import dtypes as D
from ..semantics import expr as E
from . import loopir as L

_CMP = {"lt", "le", "gt", "ge", "eq", "ne"}
#: merges a lane reduction may apply
_LANE_OPS = {"add", "mul", "maximum", "minimum", "and", "or", "xor"}


class _Checker:
    def __init__(self, k: L.Kernel):
        self.k = k
        self.syms = set(k.syms)
        self.buffers = {b.name: b for b in k.locals + k.globals}

    def fail(self, msg: str, where: object) -> VerifyError:
        text = L.expr_str(where) if not isinstance(where, str) else where
        return VerifyError(f"loop IR of {self.k.name}: {msg} (at {text[:200]})")

    def index(self, e: E.Expr | E.Pred, defined: dict[str, D.DType], where: object) -> None:
        for lf in E.leaves(e):
            if isinstance(lf, E.Sym) and lf.name not in self.syms:
                raise self.fail(f"unknown symbol {lf.name}", where)
            if isinstance(lf, (E.Var, E.Val)):
                dt = defined.get(lf.name)
                if dt is None:
                    raise self.fail(f"local {lf.name} used before it is defined", where)
                if not dt.is_int:
                    raise self.fail(f"index uses non-integer local {lf.name}", where)

    def expr(self, x: L.Expr, defined: dict[str, D.DType]) -> D.DType:
        if isinstance(x, L.Const):
            return x.dtype
        if isinstance(x, L.Ref):
            if x.var.name not in defined:
                raise self.fail(f"local {x.var.name} read before it is assigned", x)
            return x.dtype
        if isinstance(x, L.IExpr):
            self.index(x.e, defined, x)
            return D.i64
        if isinstance(x, L.IPred):
            self.index(x.p, defined, x)
            return D.bool_
        if isinstance(x, L.Un):
            self.expr(x.a, defined)
            return x.dtype
        if isinstance(x, L.Bin):
            a, b = self.expr(x.a, defined), self.expr(x.b, defined)
            if a != b:
                raise self.fail(f"'{x.op}' operands have dtypes {a} and {b}", x)
            if x.op in _CMP and x.dtype != D.bool_:
                raise self.fail(f"comparison '{x.op}' must give bool", x)
            if x.flags - {"reassoc", "contract"}:
                raise self.fail(f"unknown flags {sorted(x.flags)}", x)
            if x.flags and (not a.is_float or x.op not in ("add", "mul", "maximum", "minimum")):
                raise self.fail("permission flags on an op other than a float merge", x)
            return x.dtype
        if isinstance(x, L.Fma):
            dts = {self.expr(y, defined) for y in (x.a, x.b, x.c)}
            if len(dts) != 1 or not x.c.dtype.is_float:
                raise self.fail("fma operands must share one float dtype", x)
            return x.dtype
        if isinstance(x, L.Select):
            if self.expr(x.c, defined) != D.bool_:
                raise self.fail("select condition must be bool", x)
            a, b = self.expr(x.a, defined), self.expr(x.b, defined)
            if a != b:
                raise self.fail(f"select arms have dtypes {a} and {b}", x)
            return a
        if isinstance(x, (L.Cast, L.Bitcast)):
            s = self.expr(x.a, defined)
            if isinstance(x, L.Bitcast) and s.bits != x.dtype.bits:
                raise self.fail("bitcast between different widths", x)
            return x.dtype
        if isinstance(x, L.Load):
            self.buffer(x.buf, x)
            if self.expr(x.index, defined) != D.i64:
                raise self.fail("load index must be i64", x)
            if x.guard is not None:
                if self.expr(x.guard, defined) != D.bool_:
                    raise self.fail("load guard must be bool", x)
                if x.fill is None or self.expr(x.fill, defined) != x.buf.dtype:
                    raise self.fail("guarded load needs a fill of the buffer's dtype", x)
            return x.buf.dtype
        raise self.fail("unknown expression node", repr(x))

    def buffer(self, b: L.Buffer, where: object) -> None:
        got = self.buffers.get(b.name)
        if got is None or got != b:
            raise self.fail(f"buffer {b.name} is not declared", where)

    def stmts(self, body: tuple, defined: dict[str, D.DType], threads: int = 0) -> None:
        for s in body:
            if isinstance(s, L.Assign):
                if self.expr(s.value, defined) != s.var.dtype:
                    raise self.fail(f"assignment of {s.value.dtype} to {s.var.dtype} local "
                                    f"{s.var.name}", s.value)
                old = defined.get(s.var.name)
                if old is not None and old != s.var.dtype:
                    raise self.fail(f"local {s.var.name} changes dtype", s.value)
                defined[s.var.name] = s.var.dtype
            elif isinstance(s, L.Store):
                self.buffer(s.buf, s.value)
                if s.buf.space == "scalar":
                    raise self.fail("store to a scalar argument", s.value)
                if self.expr(s.index, defined) != D.i64:
                    raise self.fail("store index must be i64", s.index)
                if self.expr(s.value, defined) != s.buf.dtype:
                    raise self.fail(f"stored value is {s.value.dtype}, buffer {s.buf.name} holds "
                                    f"{s.buf.dtype}", s.value)
                if s.guard is not None and self.expr(s.guard, defined) != D.bool_:
                    raise self.fail("store guard must be bool", s.guard)
            elif isinstance(s, L.For):
                if s.kind not in ("serial", "vector", "parallel", "thread"):
                    raise self.fail(f"unknown loop kind {s.kind}", s.var.name)
                inner_threads = threads
                if s.kind == "thread":
                    if threads:
                        raise self.fail("a thread loop nested in a thread loop", s.var.name)
                    if s.scope != "block" or s.lo != E.Const(0):
                        raise self.fail("a thread loop runs over [0, W) with scope 'block'",
                                        s.var.name)
                    inner_threads = 1
                elif s.scope:
                    raise self.fail(f"a {s.kind} loop has no scope", s.var.name)
                self.index(s.lo, defined, s.var.name)
                self.index(s.hi, defined, s.var.name)
                inner = dict(defined)
                inner[s.var.name] = s.var.dtype
                self.stmts(s.body, inner, inner_threads)
            elif isinstance(s, L.If):
                if self.expr(s.cond, defined) != D.bool_:
                    raise self.fail("if condition must be bool", s.cond)
                t, e = dict(defined), dict(defined)
                self.stmts(s.then, t, threads)
                self.stmts(s.orelse, e, threads)
                defined.update({n: dt for n, dt in t.items() if n in e})
            elif isinstance(s, L.While):
                self.stmts(s.pre, defined, threads)  # the first test always runs
                if self.expr(s.cond, defined) != D.bool_:
                    raise self.fail("while condition must be bool", s.cond)
                self.stmts(s.body, dict(defined), threads)
            elif isinstance(s, (L.Shuffle, L.LaneReduce)):
                what = type(s).__name__
                if not threads:
                    raise self.fail(f"{what} outside a thread loop", s.dst.name)
                if self.expr(s.value, defined) != s.dst.dtype:
                    raise self.fail(f"{what} of a {s.value.dtype} into a {s.dst.dtype} local",
                                    s.dst.name)
                if s.width not in (1, 2, 4, 8, 16, 32) or not 0 < s.mask <= L.FULL_MASK:
                    raise self.fail(f"{what} width {s.width} / mask {s.mask:#x}", s.dst.name)
                if isinstance(s, L.Shuffle):
                    if s.mode not in L.SHUFFLE_MODES:
                        raise self.fail(f"unknown shuffle mode {s.mode}", s.dst.name)
                    self.index(s.lane, defined, s.dst.name)
                elif s.op not in _LANE_OPS:
                    raise self.fail(f"lane_reduce of unknown op {s.op}", s.dst.name)
                defined[s.dst.name] = s.dst.dtype
            elif isinstance(s, L.WarpMma):
                self.warp_mma(s, defined, threads)
            elif isinstance(s, L.Barrier):
                if s.scope not in ("block", "warp", "program"):
                    raise self.fail(f"unknown barrier scope {s.scope}", "barrier")
                if s.scope == "warp" and not threads:
                    raise self.fail("a warp barrier outside a thread loop", "barrier")
                if not isinstance(s.keep, int) or s.keep < 0 or (s.keep and s.scope != "block"):
                    raise self.fail(f"barrier keep={s.keep!r}: a count of async groups, >= 0, "
                                    "on block barriers only", "barrier")
            elif isinstance(s, L.Check):
                if self.expr(s.cond, defined) != D.bool_:
                    raise self.fail("check condition must be bool", s.cond)
                if not any(e.code == s.code for e in self.k.errors):
                    raise self.fail(f"check names unknown error code {s.code}", s.cond)
            elif isinstance(s, L.MmaWait):
                if threads or not isinstance(s.keep, int) or s.keep < 0:
                    raise self.fail(f"mma_wait keep={s.keep!r}: a count of groups, >= 0, "
                                    "outside thread loops", "mma_wait")
            elif not isinstance(s, L.Comment):
                raise self.fail("unknown statement", repr(s))


    def warp_mma(self, s: L.WarpMma, defined: dict[str, D.DType], threads: int) -> None:
        """Rule 6: tensor-core tiles (``loopir.WarpMma``)."""
        what = f"warp_mma {s.tag}"
        if s.lane is not None and not threads:
            raise self.fail("a warp_mma collective outside a thread loop", what)
        M, N, K = s.shape
        if s.fresh and (s.group != 4 or s.opaque):
            # only wgmma's scale-d starts an accumulator at zero (issued
            # asynchronously too: an overlapped ring's mma)
            raise self.fail("a fresh accumulator is a warpgroup mma's", what)
        if s.m <= 0 or s.n <= 0 or s.k <= 0 or s.m % M or s.n % N or s.k % K:
            raise self.fail(f"warp_mma tile {s.m}x{s.n}x{s.k} is not a multiple of "
                            f"{M}x{N}x{K}", what)
        kinds = ("f16", "bf16", "f32") if s.opaque else ("f16", "bf16")
        fp8 = s.a.buf.dtype.is_fp8 and s.b.buf.dtype.is_fp8 and not s.opaque
        if not fp8 and (s.a.buf.dtype != s.b.buf.dtype or s.a.buf.dtype.name not in kinds):
            raise self.fail(f"warp_mma operands {s.a.buf.dtype} x {s.b.buf.dtype}: both of one "
                            f"of {', '.join(kinds)}"
                            + ("" if s.opaque else ", or two FP8 formats"),
                            what)
        if s.opaque and (s.group != 1 or s.overlap or s.c.lane_cols or any(
                1 not in (f.si, f.sj) for f in (s.a, s.b, s.c))):
            raise self.fail("an opaque warp_mma is one warp's, not overlapped, with every "
                            "matrix in memory contiguous along one axis", what)
        if s.c.buf.dtype != D.f32:
            raise self.fail(f"warp_mma accumulates into {s.c.buf.dtype}, not f32", what)
        for f in (s.a, s.b, s.c):
            self.buffer(f.buf, what)
            self.index(f.offset, defined, what)
        if s.lane is not None:
            self.index(s.lane, defined, what)
        if s.b.lane_cols:
            raise self.fail("the second operand of a warp_mma is never a lane fragment", what)
        if s.a.lane_cols and (s.lane is None or s.opaque
                              or s.a.lane_cols != s.k or s.a.buf.space != "local"
                              or s.a.lane_period != 16 * s.group
                              or s.a.buf.dtype.itemsize != 2):
            raise self.fail("a lane-fragment first operand belongs to a warp or warpgroup "
                            "collective (lane given), is 16-bit, has the tile's k columns and "
                            "lives in a local buffer", what)
        if s.c.lane_cols and (s.lane is None or s.c.lane_cols != s.n
                              or s.c.buf.space != "local" or s.c.lane_period != 16 * s.group):
            raise self.fail("a lane-fragment accumulator belongs to a warp collective (lane "
                            "given), has the tile's n columns and lives in a local buffer", what)
        if s.group not in (1, 4):
            raise self.fail(f"a tensor-core collective of {s.group} warps (1 or 4)", what)
        if s.group == 4:
            if s.m != 64 or s.n > 256:
                raise self.fail(f"warpgroup tile {s.m}x{s.n}: 64 rows, at most 256 columns",
                                what)
            # a is read K-major; b MN-major (16-bit only), or K-major (stored
            # N x K: contiguous along k)
            kb = fp8 or s.b.si == 1
            # (a first operand in the lanes' registers has no shared layout)
            for f, (R, C), kmajor in (((s.a, (s.m, s.k), False),) if not s.a.lane_cols
                                      else ()) + ((s.b, (s.n, s.k) if kb else (s.k, s.n), kb),):
                lay = f.buf.layout
                inner, outer = (f.si, f.sj) if kmajor else (f.sj, f.si)
                if (lay is None or inner != 1 or outer != lay.cols or lay.rows < R
                        or lay.cols < C or lay.rows % 8):
                    raise self.fail("warpgroup operands are row-major tiles of a buffer in the "
                                    "swizzle128 layout (a b read along k stored N x K; an FP8 b "
                                    "always)", what)
        if s.overlap and (s.group != 4 or not s.c.lane_cols):
            # its registers are complete only at a later barrier's wait: an
            # accumulator copied out of them at the statement would be stale
            raise self.fail("an overlapped mma is a warpgroup collective on a lane-fragment "
                            "accumulator", what)


def verify_kernel(k: L.Kernel) -> None:
    """Raise VerifyError unless ``k`` is well formed (see the module docstring)."""
    c = _Checker(k)
    names = [p.name for p in k.params]
    if len(set(names)) != len(names):
        raise c.fail("duplicate parameter names", ", ".join(names))
    bnames = [b.name for b in k.locals + k.globals]
    if len(set(bnames)) != len(bnames):
        raise c.fail("duplicate buffer names", ", ".join(bnames))
    for b in k.globals:
        if b.space not in ("global", "scalar") or not 0 <= b.arg < len(k.params):
            raise c.fail(f"argument buffer {b.name} has no parameter position", b.name)
    for b in k.locals:
        if b.space not in ("local", "shared"):
            raise c.fail(f"local buffer {b.name} in space {b.space}", b.name)
        c.index(b.size, {}, b.name)
    for ph in k.phases:
        for x in ph.extents:
            c.index(x, {}, ph.name)
        c.stmts(ph.body, {ph.pid.name: L.INDEX})
    from .mma_waits import check_waits

    check_waits(k)
