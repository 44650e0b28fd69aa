"""The SIMT emitter core: loop IR (SIMT form) -> source text of a C-family GPU language.

One kernel function per phase, named ``<kernel>_<phase>``, with the
parameters ``(tensor and scalar buffers in argument order, one 64-bit
integer per kernel symbol, the status word)``. A parallel phase runs program
``pid`` = the block index on one block, or with a cap on the grid
(``Schedule.grid_blocks``) the programs ``b, b + blocks, ...`` one after
another on each block, a block barrier after each; an ordered phase runs its
programs in order on a single block. The block has ``W`` threads, ``W`` the
extent of the phase's thread loops (all equal; 1 for a phase without one).

Program-level code runs on every thread of the block (its locals are equal in
every thread); its stores are done by thread 0. A thread loop ``for.thread
t`` is the block itself: ``t`` = the thread index. Barriers have a scope;
``Shuffle`` and ``LaneReduce`` are the dialect's lane shuffles with their
mask and width.

Each phase places the shared buffers it uses one after another in the
dynamic shared memory ``tn_smem``, each at a 16-byte aligned offset
(``loopir.shared_arrangement``; a phase is a launch of its own, so phases
share nothing there); the offsets and the total
(:attr:`KernelInfo.shared_bytes`) are expressions over the kernel's symbols,
evaluated per launch.

Every scalar operation is the prelude's realization of its ``numerics.py``
meaning, or a C operator where that is the same thing (IEEE float arithmetic
without contraction, comparisons).

What the core decides (loop forms, wide accesses, registers) it asks of
:mod:`.analysis`; how anything is written it asks of a
:class:`~.dialect.Dialect`. Statements and expressions are emitted by rule
tables keyed by loop-IR node class (:attr:`Emitter.STMT_RULES`,
:attr:`Emitter.EXPR_RULES`); a dialect's vendor-only instructions (tensor
cores, asynchronous copies, cache policies) are a subclass adding rules and
filling the hooks.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np

from ...errors import NotAvailableError
from ...lowering import loopir as L
from ...lowering.divisors import float_division, shared_divisors
from ...lowering.simt import block_threads
from ...semantics import dtypes as D
from ...semantics import expr as E
from ...semantics import numerics as N
from . import analysis as A
from .analysis import LanePlan
from .dialect import Dialect

#: full vector groups of a thread's strip-mined loop unrolled this many times
#: (that many wide loads in flight per thread)
UNROLL = 4
#: iterations whose wide-access tests one hoisted mask holds (its bits)
MASK_BITS = 32
#: copies of a call that fully unrolled loops make from which a function
#: evaluated in double is called out of line (:meth:`Emitter.via_f64`)
OUTLINE_COPIES = 16

_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


@dataclass(frozen=True)
class KernelInfo:
    """One emitted kernel function: its name, the phase it runs, the types of
    its parameters, threads per block, dynamic shared bytes and the number of
    blocks (both over the kernel's symbols), and whether its programs run in
    order on one block."""

    name: str
    phase: str
    params: tuple[str, ...]
    threads: int
    shared_bytes: E.Expr
    programs: E.Expr
    ordered: bool
    #: at most this many blocks are launched, each running programs
    #: ``b, b + blocks, ...`` (``Schedule.grid_blocks``); None: one per program
    grid_cap: int | None = None


@dataclass(frozen=True)
class Source:
    """The source text of a kernel and its launch facts."""

    text: str
    kernels: tuple[KernelInfo, ...]
    #: the width of the index arithmetic (32 only under ``index``'s precondition)
    index_bits: int = 64
    #: the ``index.width`` obligation of 32-bit code, or why the code is 64-bit
    #: (a verdict about the text, not part of its identity)
    index: Any = field(default=None, compare=False)


class _Names:
    """C identifiers for loop-IR names (which contain '.', '%'...). Buffers,
    locals and loop variables share one namespace of loop-IR names; the
    kernel's size symbols are another (a tensor and a dim may both be
    called ``S``): :meth:`sym` names those."""

    def __init__(self) -> None:
        self.map: dict[Any, str] = {}
        self.used: set[str] = set()

    def __call__(self, name: str, stem: str = "v", key: Any = None) -> str:
        key = name if key is None else key
        got = self.map.get(key)
        if got is None:
            base = f"{stem}_" + re.sub(r"[^0-9A-Za-z_]", "_", name)
            got, n = base, 1
            while got in self.used:
                got, n = f"{base}_{n}", n + 1
            self.map[key] = got
            self.used.add(got)
        return got

    def sym(self, name: str) -> str:
        """The identifier of size symbol ``name``."""
        return self(name, "S", ("symbol", name))


class Emitter:
    """Source text of one SIMT-form loop-IR kernel in the language of ``dialect``
    (see the module docstring). Statements and expressions are emitted by the
    rules of :attr:`STMT_RULES` and :attr:`EXPR_RULES`; a dialect's vendor
    rules are a subclass that adds entries and fills the hooks (the methods
    under "hooks" below, which add nothing here)."""

    #: loop-IR statement class -> the name of the method emitting it
    STMT_RULES: ClassVar[dict[type, str]] = {}
    #: loop-IR expression class -> the name of the method spelling it
    EXPR_RULES: ClassVar[dict[type, str]] = {}
    #: loop forms tried in order on a loop (method names, each emitting the
    #: loop and returning True, or emitting nothing and returning False)
    #: before the plain loop
    LOOP_FORMS: ClassVar[tuple[str, ...]] = (
        "invariant_loads", "strip_loop", "unswitched_loop", "promoted_loop")

    def __init__(self, k: L.Kernel, dialect: Dialect, restrict: bool = True,
                 aliased: frozenset[str] = frozenset(), narrow: bool = False,
                 min_blocks: int | None = None, hints: bool = False,
                 grid_blocks: int | None = None):
        self.k = k
        self.d = dialect
        #: blocks launched at most for a parallel phase, each looping over
        #: programs (``Schedule.grid_blocks``); None: one block per program
        self.grid_blocks = grid_blocks
        #: cache policy of each hinted global load (``id`` of the node -> the
        #: node and ``"keep"``/``"last"``) and whether global stores stream
        #: (``Schedule.cache_hints``, :func:`analysis.cache_hints`); a dialect
        #: spells them in :meth:`wide_load_fn` / :meth:`wide_store_fn`
        self.load_hints = A.cache_hints(k) if hints else {}
        self.stream_stores = hints
        #: blocks per multiprocessor the register allocation must allow
        #: (``Schedule.min_blocks``: ``__launch_bounds__``' second argument)
        self.min_blocks = min_blocks
        #: index arithmetic in 32-bit ``int`` (valid only under the
        #: ``index.width`` precondition) instead of ``long long``
        self.narrow_index = narrow
        self.it, self.sfx, self.ut = dialect.index_types[32 if narrow else 64]
        #: every index expression emitted (the roots of ``idx`` calls)
        self.roots: list[E.Expr] = []
        self._depth = 0
        #: locals holding only index values (loop variables, index assignments)
        #: and which symbols are tensor extents, which index locals never negative
        self.facts = A.IndexFacts.of(k)
        self.index_locals = self.facts.index_locals
        self.restrict = restrict
        self.aliased = aliased
        self.names = _Names()
        self.lines: list[str] = []
        self.ind = 0
        self.threads_of = block_threads(k)
        #: threads per block of the phase being emitted
        self.block_w = 1
        self.in_thread = False
        #: lane plans by loop (``id`` of the node, kept alive with it): the
        #: hoisting of loop-invariant tests and the loop's emission ask for
        #: the same plan
        self._plans: dict[int, tuple[L.For, "LanePlan | None"]] = {}
        #: divisors worth a reciprocal computed once (:func:`shared_divisors`)
        self.shared_divisors = shared_divisors(k, restrict, aliased)
        #: shared reads held in registers across the loop being emitted
        #: (:meth:`invariant_loads`): (buffer name, index) -> register
        self.invariant: dict[tuple[str, E.Expr], str] = {}
        #: the ranges of the loop variables in scope (:meth:`loop`, :meth:`decided`)
        self.ranges: dict[E.Expr, E.Interval] = {}
        #: lane ``q.e[v]`` of a loaded pack of 16-bit floats -> the same lane
        #: read from its 32-bit word (``tn_lane``), for widening it
        self.word_lanes: dict[str, str] = {}
        #: lane loop (by id) -> (its hoisted test's bit, the predicates and
        #: alignment tests that bit stands for) (:meth:`hoist_tests`)
        self.hoisted: dict[int, tuple[str, list, list]] = {}
        #: while a guarded lane group's first pass is emitted, the name of its
        #: flag (:meth:`guarded_lanes`): functions with a common case emit it
        #: alone and fold their test into the flag
        self.lanes_ok: str | None = None
        #: inside the second, whole run of a guarded nest: no flag of its own
        self.whole_run = False
        #: copies of the statement being emitted that fully unrolled loops
        #: around it make (the product of their trip counts)
        self.copies = 1
        #: helper functions kept out of line (:meth:`outlined`): name -> definition
        self.helpers: dict[str, str] = {}

    # -- output ---------------------------------------------------------------
    def w(self, line: str) -> None:
        self.lines.append("  " * self.ind + line)

    # -- index expressions ------------------------------------------------------
    def idx(self, e: E.Expr) -> str:
        """C text of index expression ``e``; at the top, ``e`` first narrowed
        by the enclosing loops' ranges (``expr.narrowed``: a floor division
        or modulo those ranges decide is not computed), and recorded among
        :attr:`roots`."""
        if self._depth == 0:
            e = E.narrowed(e, self.ranges)
            self.roots.append(e)
        self._depth += 1
        try:
            return self._idx(e)
        finally:
            self._depth -= 1

    def _idx(self, e: E.Expr) -> str:
        if isinstance(e, E.Const):
            return f"{int(e.value)}{self.sfx}"
        if isinstance(e, E.Sym):
            return self.names.sym(e.name)
        if isinstance(e, (E.Var, E.Val)):
            return f"(({self.it}){self.names(e.name)})"
        if isinstance(e, E.Add):
            return "(" + " + ".join(self.idx(t) for t in e.terms) + ")"
        if isinstance(e, E.Mul):
            return "(" + " * ".join(self.idx(t) for t in e.factors) + ")"
        if isinstance(e, (E.FloorDiv, E.Mod)):
            if isinstance(e.b, E.Const) and e.b.value > 0 and self.nonneg(e.a):
                # floor and truncation agree on a non-negative dividend: plain
                # unsigned arithmetic (a shift or a mask for a power of two)
                u = self.ut
                op = "/" if isinstance(e, E.FloorDiv) else "%"
                return f"(({self.it})(({u}){self.idx(e.a)} {op} {int(e.b.value)}u))"
            f = "tn_xfloordiv" if isinstance(e, E.FloorDiv) else "tn_xmod"
            return f"{f}({self.idx(e.a)}, {self.idx(e.b)})"
        if isinstance(e, E.MinMax):
            return f"tn_x{e.op}({self.idx(e.a)}, {self.idx(e.b)})"
        if isinstance(e, E.BitOp):
            return f"({self.idx(e.a)} {e.op} {self.idx(e.b)})"
        raise TypeError(f"cannot emit index expression {e!r}")

    def nonneg(self, e: E.Expr) -> bool:
        """Whether ``e`` is never negative (:meth:`analysis.IndexFacts.nonneg`)."""
        return self.facts.nonneg(e)

    def pred(self, p: E.Pred) -> str:
        if isinstance(p, E.BoolConst):
            return "true" if p.value else "false"
        if isinstance(p, E.Cmp):
            return f"({self.idx(p.a)} {p.op} {self.idx(p.b)})"
        if isinstance(p, E.PAnd):
            return "(" + " && ".join(self.pred(q) for q in p.items) + ")"
        if isinstance(p, E.POr):
            return "(" + " || ".join(self.pred(q) for q in p.items) + ")"
        if isinstance(p, E.PNot):
            return f"(!{self.pred(p.item)})"
        raise TypeError(f"cannot emit predicate {p!r}")

    # -- expressions --------------------------------------------------------------
    def expr(self, x: Any) -> str:
        """The text of loop-IR expression ``x``, by its rule (:attr:`EXPR_RULES`)."""
        rule = self.EXPR_RULES.get(type(x))
        if rule is None:
            raise NotAvailableError(f"loop-IR expression {type(x).__name__} has no "
                                    f"{self.d.name} lowering")
        return getattr(self, rule)(x)

    def const_expr(self, x: L.Const) -> str:
        return self.d.literal(x.value, x.dtype)

    def ref_expr(self, x: L.Ref) -> str:
        return self.names(x.var.name)

    def iexpr_expr(self, x: L.IExpr) -> str:
        return self.idx(x.e)

    def ipred_expr(self, x: L.IPred) -> str:
        return self.pred(x.p)

    def select_expr(self, x: L.Select) -> str:
        """Both arms are evaluated (their checks too). An ``i64`` select takes
        both arms at the 64-bit type: under 32-bit index arithmetic an index
        local is narrower than an ``i64`` element loaded from a buffer, and the
        arms of ``tn_select`` must have one type."""
        a, b = self.expr(x.a), self.expr(x.b)
        if x.dtype == D.i64 and self.it != self.d.types["i64"]:
            t = self.d.types["i64"]
            a, b = f"(({t})({a}))", f"(({t})({b}))"
        return f"tn_select({self.expr(x.c)}, {a}, {b})"

    def cast_expr(self, x: L.Cast) -> str:
        if x.dtype.is_fp8:  # one rounding, then the cast's overflow policy (V-24)
            v = self.f32_odd(self.expr(x.a), x.a.dtype)
            return f"tn_narrow_{x.dtype.name}_{x.overflow}({v})"
        return self.cast(self.expr(x.a), x.a.dtype, x.dtype)

    def bitcast_expr(self, x: L.Bitcast) -> str:
        return self.bitcast(self.expr(x.a), x.a.dtype, x.dtype)

    def un_expr(self, x: L.Un) -> str:
        fn = self.approx(x)
        if fn is not None:
            return f"{fn}({self.expr(x.a)})"
        return self.unary(x.op, self.expr(x.a), x.a.dtype)

    def approx(self, x: L.Un) -> str | None:
        """The dialect's cheaper function computing ``x`` where the bound the
        program declared admits it (:attr:`Dialect.approx`), else None."""
        if x.ulp is None:
            return None
        return next((fn for fn, bound in self.d.approx.get((x.op, x.a.dtype.name), ())
                     if x.ulp >= bound), None)

    def common_case(self, x: Any) -> bool:
        """Whether ``x`` is a call with a cheap common case and a whole
        fallback (``analysis.has_common_case``) that this dialect computes so,
        not by an approximation admitted by a declared bound (:meth:`approx`)."""
        return A.has_common_case(x, self.shared_divisors) and not (
            isinstance(x, L.Un) and self.approx(x) is not None)

    def bin_expr(self, x: L.Bin) -> str:
        """A float division by a shared divisor (:func:`divisors.shared_divisors`)
        goes through the divisor's prepared reciprocal; the rest by operator."""
        if float_division(x) and x.b in self.shared_divisors:
            dt = x.a.dtype
            a, b = (self.wide(self.expr(y), dt) for y in (x.a, x.b))
            if self.lanes_ok:
                return self.narrow(f"tn_fdiv_by_ok({a}, tn_fdiv_prep({b}), {self.lanes_ok})",
                                   dt)
            return self.narrow(f"tn_fdiv_by({a}, tn_fdiv_prep({b}))", dt)
        return self.binary(x.op, self.expr(x.a), self.expr(x.b), x.a.dtype)

    def fma_expr(self, x: L.Fma) -> str:
        dt = x.dtype
        a, b, c = (self.wide(self.expr(y), dt) for y in (x.a, x.b, x.c))
        f = self.d.math_fn(self.d.fma, dt.name == "f64")
        return self.narrow(f"{f}({a}, {b}, {c})", dt)

    def buf(self, b: L.Buffer) -> str:
        return self.names(b.name, "b")

    def elem(self, b: L.Buffer, index: "str | E.Expr") -> str:
        """The C lvalue of logical element ``index`` of ``b``."""
        return f"{self.buf(b)}[{self.position(b, index)}]"

    def position(self, b: L.Buffer, index: "str | E.Expr") -> str:
        """The physical position of logical element ``index`` of ``b`` under
        the buffer's layout (``loopir.Swizzle128``: ``tn_swz128``), else the
        index itself. The layout repeats every ``rows x cols`` elements, so
        terms of an index expression that are multiples of that period (a
        ring's version offset) are added outside the call when the rest is
        never negative: the call then depends only on the position in the
        tile, which stays put from step to step."""
        lay = b.layout
        if lay is None:
            return index if isinstance(index, str) else self.idx(index)
        fn = f"tn_swz128<{lay.rows}, {lay.cols}, {lay.panel}, {lay.chunk}>"
        if isinstance(index, str):
            return f"{fn}({index})"
        period = lay.rows * lay.cols
        terms = list(index.terms) if isinstance(index, E.Add) else [index]
        whole = [t for t in terms if A.divisor(t) and A.divisor(t) % period == 0]
        rest = E.Const(0)
        for t in terms:
            if t not in whole:
                rest = E.add(rest, t)
        if not whole or not self.nonneg(rest):
            return f"{fn}({self.idx(index)})"
        outer = " + ".join(self.idx(t) for t in whole)
        return f"{outer} + {fn}({self.idx(rest)})"

    def load(self, x: L.Load) -> str:
        if x.guard is None and isinstance(x.index, L.IExpr):
            r = self.invariant.get((x.buf.name, x.index.e))
            if r is not None:
                return r
        at = self.elem(x.buf, x.index.e if isinstance(x.index, L.IExpr) else self.expr(x.index))
        if x.buf.dtype.is_bool:
            at = f"({at} != 0)"
        if x.guard is None:
            return at
        return f"({self.expr(x.guard)} ? {at} : {self.expr(x.fill)})"

    # -- float helpers ----------------------------------------------------------------
    def wide(self, v: str, dt: D.DType) -> str:
        """``v`` of float dtype ``dt`` widened exactly to float (f16/bf16) or
        as is; a lane of a loaded 16-bit pack is widened from its 32-bit word."""
        if dt.name not in ("f16", "bf16") and not dt.is_fp8:
            return v
        return f"tn_widen({self.word_lanes.get(v, v)})"

    @staticmethod
    def narrow(v: str, dt: D.DType) -> str:
        """A wide value (float for f16/bf16/f32) rounded once to ``dt``."""
        return f"tn_narrow_{dt.name}({v})" if dt.name in ("f16", "bf16") else v

    @staticmethod
    def from_f64(v: str, dt: D.DType) -> str:
        return v if dt.name == "f64" else f"tn_round_{dt.name}({v})"

    def to_f64(self, v: str, dt: D.DType) -> str:
        return v if dt.name == "f64" else f"((double){self.wide(v, dt)})"

    def f32_odd(self, v: str, src: D.DType) -> str:
        """``v`` (any number) as a float holding its value exactly or rounded
        to odd, so that one more rounding to a narrower format is the only
        one that counts."""
        if src.is_float:
            return f"tn_f64_to_f32_odd({v})" if src.name == "f64" else self.wide(v, src)
        if src.is_bool:
            return f"({v} ? 1.0f : 0.0f)"
        if src.bits <= 32:
            return f"tn_f64_to_f32_odd((double){v})"
        return f"tn_f64_to_f32_odd({self.i64_odd(v, src)})"

    def i64_odd(self, v: str, src: D.DType) -> str:
        """The 64-bit integer ``v`` as a double rounded to odd (so that one
        more rounding to a narrower format is the only one that counts)."""
        u64 = self.d.types["u64"]
        if src.is_signed:
            return (f"tn_i64_to_f64_odd(({v}) < 0 ? 0ull - ({u64})({v}) : ({u64})({v}), "
                    f"({v}) < 0)")
        return f"tn_i64_to_f64_odd(({u64})({v}), false)"

    # -- unary ---------------------------------------------------------------------------
    def unary(self, op: str, v: str, dt: D.DType) -> str:
        if dt.is_bool:
            if op == "not":
                return f"(!{v})"
        elif dt.is_int:
            t = self.d.reg(dt)
            if op == "neg":
                return f"tn_ineg<{t}>({v})"
            if op == "abs":
                return f"tn_iabs<{t}>({v})" if dt.is_signed else v
            if op == "bitnot":
                return f"(({t})~{v})"
        else:
            return self.float_unary(op, v, dt)
        raise NotAvailableError(f"op '{op}' on {dt} has no {self.d.name} lowering")

    def float_unary(self, op: str, v: str, dt: D.DType) -> str:
        n = dt.name
        if op in ("neg", "abs"):
            if n in ("f16", "bf16"):
                bits = f"(({v}).bits ^ 0x8000)" if op == "neg" else f"(({v}).bits & 0x7fff)"
                return f"tn_mk_{n}({bits})"
            if op == "neg":
                return f"(-{v})"
            return f"tn_copysign({v}, {'0.0' if n == 'f64' else '0.0f'})"
        if op == "signbit":
            if dt.is_fp8:
                return f"((({v}).bits >> 7) != 0)"
            return f"((({v}).bits >> 15) != 0)" if n in ("f16", "bf16") else f"tn_signbit({v})"
        w = self.wide(v, dt)
        if op in ("isnan", "isinf", "isfinite"):
            return f"tn_{op}({w})"
        if op in ("sqrt", "floor", "ceil", "trunc", "round"):
            return self.narrow(f"{self.d.math_fn(op, n == 'f64')}({w})", dt)
        if op == "exp" and n != "f64":  # float arithmetic, as the llvm target
            if self.lanes_ok:
                return self.narrow(f"tn_exp_f32_ok({w}, {self.lanes_ok})", dt)
            return self.narrow(f"tn_exp_f32({w})", dt)
        if op in A.TRANSCENDENTAL:
            return self.via_f64(op, [v], dt)
        if op in ("sigmoid", "rsqrt"):
            return self.via_f64(f"tn_{op}", [v], dt)
        raise NotAvailableError(f"op '{op}' on {dt} has no {self.d.name} lowering")

    def via_f64(self, fn: str, args: list[str], dt: D.DType) -> str:
        """``fn`` (a double function) of ``args`` (values of ``dt``), each
        widened exactly to double, its result rounded once to ``dt``. Where
        unrolled loops would copy the call :data:`OUTLINE_COPIES` times or
        more, a narrow dtype's call goes through one out-of-line helper
        (:meth:`outlined`) computing exactly the same value: a double
        function's body is long (hundreds of instructions in a GPU's double
        arithmetic), and a copy per unrolled cell would multiply the code."""
        if self.copies < OUTLINE_COPIES or dt.name == "f64" or self.d.outline is None:
            return self.from_f64(f"{fn}({', '.join(self.to_f64(a, dt) for a in args)})", dt)
        params = [f"x{i}" for i in range(len(args))]
        body = self.from_f64(f"{fn}({', '.join(f'(double){p}' for p in params)})", dt)
        name = self.outlined(f"tn_ol_{fn.removeprefix('tn_')}_{dt.name}", self.d.reg(dt),
                             [("float", p) for p in params], body)
        return f"{name}({', '.join(self.wide(a, dt) for a in args)})"

    def outlined(self, name: str, ret: str, params: list[tuple[str, str]], value: str) -> str:
        """``name``, a helper returning ``value`` of ``params``, defined once
        before the kernel's functions (:meth:`source`) with the dialect's
        out-of-line qualifiers (:attr:`Dialect.outline`)."""
        if name not in self.helpers:
            ps = ", ".join(f"{t} {p}" for t, p in params)
            self.helpers[name] = f"{self.d.outline} {ret} {name}({ps}) {{ return {value}; }}"
        return name

    # -- binary ---------------------------------------------------------------------------
    def binary(self, op: str, a: str, b: str, dt: D.DType) -> str:
        if op in _CMP and not dt.is_float:
            return f"({a} {_CMP[op]} {b})"
        if dt.is_bool:
            if op in ("and", "minimum"):
                return f"({a} && {b})"
            if op in ("or", "maximum"):
                return f"({a} || {b})"
            if op == "xor":
                return f"({a} != {b})"
            raise NotAvailableError(f"op '{op}' on bool has no {self.d.name} lowering")
        if dt.is_int:
            return self.int_binary(op, a, b, dt)
        n = dt.name
        wa, wb = self.wide(a, dt), self.wide(b, dt)
        if op in _CMP:
            return f"({wa} {_CMP[op]} {wb})"
        if op in ("add", "sub", "mul", "div"):
            sym = {"add": "+", "sub": "-", "mul": "*", "div": "/"}[op]
            return self.narrow(f"({wa} {sym} {wb})", dt)
        if op == "rem":
            return self.narrow(f"tn_frem({wa}, {wb})", dt)
        if op in ("maximum", "minimum"):
            return self.narrow(f"tn_fextreme({wa}, {wb}, {'true' if op == 'maximum' else 'false'})",
                               dt)
        if op in ("floordiv", "mod"):
            return self.narrow(f"tn_f{op}({wa}, {wb})", dt)
        if op in ("pow", "atan2"):
            return self.via_f64(op, [a, b], dt)
        raise NotAvailableError(f"op '{op}' on {n} has no {self.d.name} lowering")

    def int_binary(self, op: str, a: str, b: str, dt: D.DType) -> str:
        t = self.d.reg(dt)
        if op in ("add", "sub", "mul"):
            return f"tn_i{op}<{t}>({a}, {b})"
        if op in ("and", "or", "xor"):
            sym = {"and": "&", "or": "|", "xor": "^"}[op]
            return f"(({t})({a} {sym} {b}))"
        if op in ("maximum", "minimum"):
            return f"tn_i{op[:3]}<{t}>({a}, {b})"
        if op in ("div", "rem", "floordiv", "mod", "shl", "shr"):
            return f"tn_i{op}<{t}>({a}, {b}, tn_status)"
        raise NotAvailableError(f"op '{op}' on {dt} has no {self.d.name} lowering")

    # -- conversions ----------------------------------------------------------------------
    def cast(self, v: str, src: D.DType, dst: D.DType) -> str:
        if src == dst:
            return v
        if dst.is_bool:
            if src.is_float:
                return f"({self.wide(v, src)} != 0)"
            return f"({v} != 0)"
        if src.is_bool:
            v, src = f"((int)({v} ? 1 : 0))", D.i32
        if src.is_float and dst.is_float:
            if src.name == "f64":
                return self.from_f64(v, dst)
            w = self.wide(v, src)
            return f"((double){w})" if dst.name == "f64" else self.narrow(w, dst)
        if src.is_float:
            x = self.to_f64(v, src)
            if dst.bits == 64:
                return f"tn_f2i64({x})" if dst.is_signed else f"tn_f2u64({x})"
            info = np.iinfo(dst.np)
            return f"tn_f2i<{self.d.reg(dst)}>({x}, {float(info.min)!r}, {float(info.max)!r})"
        if dst.is_float:
            if dst.name in ("f32", "f64"):
                return f"(({self.d.reg(dst)}){v})"
            if src.bits <= 32:
                return f"tn_round_{dst.name}((double){v})"
            return f"tn_round_{dst.name}({self.i64_odd(v, src)})"
        return f"(({self.d.reg(dst)}){v})"

    def bitcast(self, v: str, src: D.DType, dst: D.DType) -> str:
        if dst.is_bool:
            return f"(tn_bitcast<{self.d.byte}>({v}) != 0)"
        if src.is_bool:
            return f"(({self.d.reg(dst)})({v} ? 1 : 0))"
        return f"tn_bitcast<{self.d.reg(dst)}>({v})"

    # -- statements ------------------------------------------------------------------------
    def stmts(self, body: tuple) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, s: Any) -> None:
        """Emit loop-IR statement ``s`` by its rule (:attr:`STMT_RULES`)."""
        rule = self.STMT_RULES.get(type(s))
        if rule is None:
            raise NotAvailableError(f"loop-IR statement {type(s).__name__} has no "
                                    f"{self.d.name} lowering")
        getattr(self, rule)(s)

    def assign_stmt(self, s: L.Assign) -> None:
        self.w(f"{self.names(s.var.name)} = {self.expr(s.value)};")

    def store_stmt(self, s: L.Store) -> None:
        """A store; outside a thread loop (program-level code, run by every
        thread) only thread 0 stores to memory other than its own registers.
        An asynchronous store outside a wide group is stored at once, which
        its meaning permits."""
        v = self.expr(s.value)
        if s.buf.dtype.is_bool:
            v = f"({self.d.byte})({v} ? 1 : 0)"
        ix = s.index.e if isinstance(s.index, L.IExpr) else self.expr(s.index)
        line = f"{self.elem(s.buf, ix)} = {v};"
        cond = []
        if not self.in_thread and s.buf.space != "local":
            cond.append(f"{self.d.thread_id} == 0")
        if s.guard is not None:
            cond.append(self.expr(s.guard))
        self.w(f"if ({' && '.join(cond)}) {line}" if cond else line)

    def if_stmt(self, s: L.If) -> None:
        known = self.decided(s.cond.p) if isinstance(s.cond, L.IPred) else None
        if known is not None:  # the enclosing loops' ranges decide it
            taken = s.then if known else s.orelse
            if taken:
                self.w("{  // " + ("true" if known else "false") +
                       f" in every iteration: {E.pred_to_str(s.cond.p)}")
                self.block(taken)
                self.w("}")
            return
        self.w(f"if ({self.expr(s.cond)}) {{")
        self.block(s.then)
        if s.orelse:
            self.w("} else {")
            self.block(s.orelse)
        self.w("}")

    def while_stmt(self, s: L.While) -> None:
        self.w("for (;;) {")
        self.ind += 1
        self.stmts(s.pre)
        self.w(f"if (!({self.expr(s.cond)})) break;")
        self.stmts(s.body)
        self.ind -= 1
        self.w("}")

    def check_stmt(self, s: L.Check) -> None:
        self.w(f"if (!({self.expr(s.cond)})) tn_fail(tn_status, {s.code});")

    def barrier_stmt(self, s: L.Barrier) -> None:
        """A barrier of its scope; before a block barrier, what the dialect's
        asynchronous operations must complete by then (:meth:`barrier_waits`)."""
        if s.scope == "block":
            for line in self.barrier_waits(s):
                self.w(line)
        spelled = self.d.barriers.get(s.scope)
        if spelled is not None:
            self.w(spelled)

    def shuffle_stmt(self, s: L.Shuffle) -> None:
        lane = f"(int)({self.idx(s.lane)})"
        call = self.d.shuffle.format(mode=s.mode, mask=s.mask, value=self.expr(s.value),
                                     lane=lane, width=s.width)
        self.w(f"{self.names(s.dst.name)} = {call};")

    def mma_stmt(self, s: L.WarpMma) -> None:
        """A matrix-unit step: its lone-thread form (no lane) is its reference
        loop nest; the lanes' form needs a dialect rule."""
        if s.lane is None or not self.in_thread:
            self.stmts(s.reference())
            return
        raise NotAvailableError(f"a {s.m}x{s.n}x{s.k} warp mma has no {self.d.name} lowering",
                                hint="use mma_unit='simt'")

    def mma_wait_stmt(self, s: L.MmaWait) -> None:
        """A wait for overlapped warpgroup mmas: a dialect rule (only a
        target with such mmas gets one)."""
        raise NotAvailableError(f"a warpgroup mma wait has no {self.d.name} lowering",
                                hint="use mma_unit='tensor'")

    def comment_stmt(self, s: L.Comment) -> None:
        self.w(f"// {s.text}")

    def block(self, body: tuple) -> None:
        self.ind += 1
        self.stmts(body)
        self.ind -= 1

    def decided(self, p: E.Pred) -> bool | None:
        """The value of index predicate ``p`` wherever it is evaluated, when
        the ranges of the enclosing loops' variables (:attr:`ranges`) decide
        it by interval bounds (``expr.decided``), else None: a thread loop's
        tile guard ``r + t // 128 < 1`` on a block of 128 threads is true."""
        return E.decided(p, self.ranges)

    def loop(self, s: L.For) -> None:
        """Loop ``s`` in one of its forms, its variable's range known to
        :meth:`decided` inside it: a thread loop's ``[0, threads)`` (and
        below its bound), a constant loop's ``[lo, hi)``."""
        key = E.Var(s.var.name)
        old = self.ranges.get(key)
        if s.kind == "thread":
            top = self.block_w if not isinstance(s.hi, E.Const) else min(self.block_w, s.hi.value)
            self.ranges[key] = (0, top - 1)
        elif isinstance(s.lo, E.Const) and isinstance(s.hi, E.Const) and s.hi.value > s.lo.value:
            self.ranges[key] = (s.lo.value, s.hi.value - 1)
        else:
            self.ranges.pop(key, None)
        try:
            self.loop_forms(s)
        finally:
            if old is None:
                self.ranges.pop(key, None)
            else:
                self.ranges[key] = old

    def loop_forms(self, s: L.For) -> None:
        v = self.names(s.var.name)
        if s.kind == "thread":
            if self.in_thread:
                raise NotAvailableError(f"nested thread loops have no {self.d.name} lowering")
            self.w(f"{v} = ({self.it}){self.d.thread_id};  // thread loop over [0, {E.to_str(s.hi)})")
            # a block wider than the loop (a warp-specialized ring's producer
            # warp, loopir.Roles): the threads past it skip it
            narrow = isinstance(s.hi, E.Const) and s.hi.value < self.block_w
            self.w(f"if ({v} < {self.idx(s.hi)}) {{" if narrow else "{")
            self.in_thread = True
            self.block(s.body)
            self.in_thread = False
            self.w("}")
            return
        if s.kind == "vector" and self.in_thread and (self.guarded_nest(s) or self.lane_loop(s)):
            return
        if not self.in_thread:
            self.hoist_tests(s)
        if any(getattr(self, form)(s) for form in self.LOOP_FORMS):
            return
        self.plain_loop(s)

    def invariant_loads(self, s: L.For) -> bool:
        """Loop-invariant code motion of shared-memory reads: in a thread's
        serial loop whose body only computes, assigns, stores and branches
        (no barrier, collective or asynchronous copy), an unguarded read of
        a ``shared`` buffer the loop never stores to, at an index independent
        of the loop and of everything the body assigns, is read once into a
        register before the loop (when it runs). The body holds no barrier,
        so no other thread may write that element while the loop runs (the
        barrier-sufficiency obligation); the buffer is live through the loop
        (it is read there), so nothing the loop stores shares its storage:
        every iteration reads the value read before it. The read may sit
        under a condition of the body (a tail mask) that is false in every
        iteration; so the hoisted read tests the index against the buffer's
        size and is 0 outside it -- a value no iteration uses, since the
        program reads no element out of bounds. CUDA cannot move the read
        itself: every shared buffer is a pointer into one array, so any store
        in the loop may alias it. False (nothing emitted) when nothing
        qualifies."""
        if not (self.in_thread and s.kind == "serial"):
            return False
        found = A.invariant_shared_reads(s, self.invariant)
        if not found:
            return False
        self.w(f"if ({self.idx(s.lo)} < {self.idx(s.hi)}) {{  // shared reads the loop "
               "does not change, read once")
        self.ind += 1
        for (name, e), y in found.items():
            r = self.names(f"inv.{name}.{len(self.invariant)}", "tn")
            u32 = self.d.index_types[32][2]
            within = f"({u32})({self.idx(e)}) < ({u32})({self.idx(y.buf.size)})"
            self.w(f"const {self.d.reg(y.buf.dtype)} {r} = {within} ? {self.elem(y.buf, e)} : "
                   f"{self.d.literal(0, y.buf.dtype)};")
            self.invariant[(name, e)] = r
        self.loop(s)
        for key in found:
            del self.invariant[key]
        self.ind -= 1
        self.w("}")
        return True

    def hoist_tests(self, s: L.For) -> None:
        """Loop-invariant code motion of the wide-access tests
        (:meth:`lane_loop`) of a program-level loop ``s``: for each lane loop
        inside it -- under ``if``s, one thread loop and constant-trip loops of
        at most 32 iterations in all -- the conjuncts of its test that read
        nothing ``s`` changes (the group's extent, load guards over symbols,
        the program's position and the thread, alignments from symbol
        divisibilities) are evaluated once per thread before ``s``, one bit
        per iteration of those loops; inside, the lane loop tests that bit
        and only the rest. The same conjuncts, evaluated at the same values
        of everything they read, so the same groups take the wide path."""
        if s.kind not in ("serial", "vector"):
            return
        changed = {s.var.name} | set(L.assigned(s.body))

        def visit(body: tuple, thread: "L.For | None", steps: list) -> None:
            for t in body:
                if isinstance(t, L.If):
                    visit(t.then, thread, steps)
                    visit(t.orelse, thread, steps)
                elif isinstance(t, L.For) and t.kind == "thread" and thread is None:
                    visit(t.body, t, [])
                elif isinstance(t, L.For) and thread is not None:
                    plan = self.lane_plan(t) if t.kind == "vector" else None
                    if plan is not None:
                        self.hoist_one(t, plan, thread, steps, changed)
                    elif (isinstance(t.lo, E.Const) and isinstance(t.hi, E.Const)
                          and t.hi.value > t.lo.value):
                        visit(t.body, thread, steps + [t])

        visit(s.body, None, [])

    def hoist_one(self, lane: L.For, plan: "LanePlan", thread: L.For, steps: list,
                  changed: set[str]) -> None:
        """:meth:`hoist_tests` for one lane loop (``steps``: the constant
        loops between its thread loop and it)."""
        n = 1
        for st in steps:
            n *= st.hi.value - st.lo.value
        mine = {thread.var.name} | {st.var.name for st in steps}
        free = (changed - mine) | {lane.var.name}

        def invariant(p: E.Pred | E.Expr) -> bool:
            return not any(isinstance(lf, (E.Var, E.Val)) and lf.name in free
                           for lf in E.leaves(p))

        group = [E.cmp("<=", E.add(plan.first, plan.V), plan.n)] if plan.bounded else []
        preds = [p for p in [*group, *self.needed(plan.conds)] if invariant(p)]
        aligns = [t for t, inv in self.alignment_tests(plan) if inv]
        if n > MASK_BITS or not (preds or aligns):
            return
        mask = self.names(f"ok.{lane.var.name}", "tn")
        bit = E.Const(0)
        for st in steps:
            bit = E.add(E.mul(bit, st.hi.value - st.lo.value),
                        E.add(E.Var(st.var.name), E.mul(-1, st.lo)))
        self.w(f"{self.d.index_types[32][2]} {mask} = 0u;  // the loop-invariant part of a wide-access test")
        self.w("{")
        self.ind += 1
        self.w(f"{self.names(thread.var.name)} = ({self.it}){self.d.thread_id};")
        for st in steps:
            v = self.names(st.var.name)
            self.w(f"for ({v} = {self.idx(st.lo)}; {v} < {self.idx(st.hi)}; ++{v})")
        test = " && ".join([self.pred(p) for p in preds] + aligns)
        self.w(f"  if ({test}) {mask} |= 1u << ({self.idx(bit)});")
        self.ind -= 1
        self.w("}")
        self.hoisted[id(lane)] = (f"(({mask} >> ({self.idx(bit)})) & 1u)", preds, aligns)

    def plain_loop(self, s: L.For) -> None:
        v = self.names(s.var.name)
        lo, hi = self.idx(s.lo), self.idx(s.hi)
        unrolled = self.unrolled(s)
        if unrolled:
            self.w(self.d.unroll)
        if s.reverse:
            self.w(f"for ({v} = {hi} - 1; {v} >= {lo}; --{v}) {{")
        else:
            self.w(f"for ({v} = {lo}; {v} < {hi}; ++{v}) {{")
        self.copied_block(s.body, int(s.hi.value - s.lo.value) if unrolled else 1)
        self.w("}")

    def copied_block(self, body: tuple, n: int) -> None:
        """``body`` as the body of a fully unrolled loop of ``n`` iterations:
        each statement in it is copied ``n`` more times (:attr:`copies`)."""
        copies = self.copies
        self.copies *= n
        try:
            self.block(body)
        finally:
            self.copies = copies

    def unrolled(self, s: L.For) -> bool:
        """Whether loop ``s`` is emitted fully unrolled (:func:`analysis.unrolled`)."""
        return A.unrolled(s, self.in_thread)

    def lane_plan(self, s: L.For) -> "LanePlan | None":
        """:func:`analysis.lane_plan` of ``s``, computed once per loop. A lane
        loop indexing a thread's register row (``local``) has a plan even with
        nothing to widen: its full groups run their lanes without the
        per-element bounds test (and group their common-case calls)."""
        got = self._plans.get(id(s))
        if got is None or got[0] is not s:
            got = (s, A.lane_plan(s, bounds_only=A.indexes_local(s)))
            self._plans[id(s)] = got
        return got[1]

    def needed(self, conds: "tuple[E.Pred, ...] | list[E.Pred]") -> list[E.Pred]:
        """The conjuncts of ``conds`` a run-time test must check (:func:`analysis.needed`)."""
        return A.needed(conds, self.facts)

    def aligned(self, plan: "LanePlan", at: dict | None = None) -> list[str]:
        """Run-time tests that every widened access of ``plan`` is aligned to
        its group's size (:meth:`alignment_tests`)."""
        return [t for t, _ in self.alignment_tests(plan, at)]

    def alignment_tests(self, plan: "LanePlan", at: dict | None = None
                        ) -> list[tuple[str, bool]]:
        """``(test, invariant)`` for every widened access of ``plan`` (group
        start indices substituted by ``at``): where the index is a sum of
        terms each a multiple of the group's elements given only symbol
        divisibilities (:func:`analysis.divisible`), the tests are those and the base
        pointer's alignment (none for shared memory, whose buffers start at
        16-byte offsets of an aligned block), all invariant in the loops;
        otherwise the address itself (not invariant)."""
        out: list[tuple[str, bool]] = []
        for node, e0 in plan.accesses():
            e, gb, b = E.subst(e0, at or {}), plan.group_bytes(node), node.buf
            conds = A.divisible(e, gb // max(1, b.dtype.itemsize)) if gb <= 16 else None
            if conds is None:
                out.append((f"tn_aligned(&{self.elem(b, e)}, {gb})", False))
                continue
            if b.space != "shared":
                out.append((f"tn_aligned({self.buf(b)}, {gb})", True))
            out += [(f"tn_multiple({self.idx(x)}, {d})", True) for x, d in conds]
        return list(dict.fromkeys(out))

    def lane_loop(self, s: L.For) -> bool:
        """``s`` with vector accesses (:meth:`lane_plan`): a group in bounds
        whose addresses are aligned (both checked per group at run time) runs
        the widened body, any other group the scalar loop. False (nothing
        emitted) when ``s`` has nothing to widen."""
        plan = self.lane_plan(s)
        if plan is None:
            return False
        conds = self.lane_test(s, plan)
        if not conds:  # every lane runs, nothing to check: always the wide group
            self.w(f"{{  // {plan.V} lanes, vector accesses")
            self.block_of(lambda: self.vector_group(plan))
            self.w("}")
            return True
        if self.values_first(plan):
            self.w(f"{{  // {plan.V} lanes: their values once, stored wide or lane by lane")
            self.block_of(lambda: self.stored_once(s, plan, conds))
            self.w("}")
            return True
        self.w(f"if ({' && '.join(conds)}) {{  // {plan.V} lanes, vector accesses")
        self.block_of(lambda: self.vector_group(plan))
        self.w("} else {")
        self.block_of(lambda: self.scalar_group(s))
        self.w("}")
        return True

    def values_first(self, plan: "LanePlan") -> bool:
        """Whether a lane group's stored values may be computed for every lane
        before the test that picks the wide or the per-lane stores
        (:meth:`stored_once`): the group loads nothing wide, its statements
        are index locals and the widened stores, and their values read only
        scalars, constants and arrays of a fixed size at indices the
        enclosing loops' ranges keep inside them (the thread's ``local``
        arrays, the block's ``shared`` ones; never a tensor, whose extent the
        lane past the edge may overrun), with no integer division, so a lane
        whose store does not happen computes a value harmlessly. Then the
        values' code exists once, not once per path (a fused epilogue's 128
        cells a thread, say)."""
        if plan.loads or not plan.stores or self.group_copies(plan):
            return False
        if not all(st in plan.stores or (isinstance(st, L.Assign)
                                          and isinstance(st.value, L.IExpr))
                   for st in plan.stmts):
            return False
        ranges = {**self.ranges, E.Var(plan.loop.var.name): (0, plan.V - 1)}
        for y in (x for st in plan.stores for x in L.subexprs(st.value)):
            if isinstance(y, L.Bin) and y.a.dtype.is_int and y.op in N.INT_DIVISIONS:
                return False
            if isinstance(y, L.Load):
                b = y.buf
                if not (b.space in ("local", "shared") and y.guard is None
                        and isinstance(y.index, L.IExpr) and isinstance(b.size, E.Const)):
                    return False
                lo, hi = E.interval(y.index.e, ranges)
                if lo is None or hi is None or lo < 0 or hi >= b.size.value:
                    return False
        return True

    def stored_once(self, s: L.For, plan: "LanePlan", conds: list[str]) -> None:
        """Lane group ``s`` (:meth:`values_first`): the lanes' values into
        packs, then one branch -- the wide stores of the packs when ``conds``
        hold, else each lane's own guarded store of its pack element."""
        outs = self.group_values(plan)
        self.w(f"if ({' && '.join(conds)}) {{  // vector accesses")
        self.block_of(lambda: self.group_stores(plan, outs))
        self.w("} else {")
        marker = {node: m for node, _, _, _, m in outs}

        def fs(t: Any) -> Any:
            return (replace(t, value=L.Ref(marker[t])),) if t in marker else None

        self.block_of(lambda: self.scalar_group(
            replace(s, body=L.map_stmts(s.body, lambda _: None, fs))))
        self.w("}")

    def lane_test(self, s: L.For, plan: "LanePlan") -> list[str]:
        """The conjuncts that send a group of lane loop ``s`` down the wide
        path: in bounds, aligned, its loads' guards true for every lane (the
        invariant part as its hoisted bit, :meth:`hoist_tests`)."""
        got = self.hoisted.get(id(s))
        if got is None:
            group = [f"{self.idx(plan.first)} + {plan.V} <= {self.idx(plan.n)}"] \
                if plan.bounded else []
            return [*group, *self.aligned(plan), *(self.pred(p) for p in self.needed(plan.conds))]
        bit, done, aligns = got  # tested before the enclosing loop
        return [bit, *(c for c in self.aligned(plan) if c not in aligns),
                *(self.pred(p) for p in self.needed(plan.conds) if p not in done)]

    def unswitched_loop(self, s: L.For) -> bool:
        """A thread's unrolled step loop whose body is one lane loop with
        per-group tests (a tile copy): the tests of all its steps first, one
        branch, then every group wide without a test when all pass, else the
        steps as :meth:`lane_loop` emits them. The same groups take the wide
        path either way; a thread whose groups are all full (every tile of a
        large GEMM) runs its copies straight through. False (nothing
        emitted) for another loop, and for lanes that compute a
        transcendental (three unrolled copies of one cost NVRTC time)."""
        if not (self.in_thread and s.kind == "serial" and not s.reverse and self.unrolled(s)
                and len(s.body) == 1 and isinstance(s.body[0], L.For)
                and s.body[0].kind == "vector"):
            return False
        lane = s.body[0]
        plan = self.lane_plan(lane)
        if plan is None or A.transcendental(plan):
            return False
        v, lo, hi = self.names(s.var.name), self.idx(s.lo), self.idx(s.hi)
        ok = self.names(f"all.{lane.var.name}", "tn")
        self.w(f"bool {ok} = true;  // every group of the thread's steps full and aligned")
        self.w(self.d.unroll)
        self.w(f"for ({v} = {lo}; {v} < {hi}; ++{v})")
        self.w(f"  {ok} = {ok} && {' && '.join(self.lane_test(lane, plan))};")
        self.w(f"if ({ok}) {{")
        self.ind += 1
        self.w(self.d.unroll)
        self.w(f"for ({v} = {lo}; {v} < {hi}; ++{v}) {{")
        self.block_of(lambda: self.vector_group(plan))
        self.w("}")
        self.ind -= 1
        self.w("} else {")
        self.block_of(lambda: self.plain_loop(s))
        self.w("}")
        return True

    def block_of(self, emit: Callable[[], None]) -> None:
        self.ind += 1
        emit()
        self.ind -= 1

    def scalar_group(self, s: L.For) -> None:
        vn = self.names(s.var.name)
        self.w(self.d.unroll)
        self.w(f"for ({vn} = 0; {vn} < {s.hi.value}; ++{vn}) {{")
        self.copied_block(s.body, int(s.hi.value))
        self.w("}")

    def vector_group(self, plan: "LanePlan") -> None:
        """The widened body of one full, aligned group: one ``V``-wide load per
        widened load, the lanes' statements on the loaded packs, one ``V``-wide
        store per widened store."""
        self.group_stores(plan, self.group_values(plan))

    def group_values(self, plan: "LanePlan") -> list:
        """A group's widened loads and lanes (:meth:`vector_group`), each
        widened store's value assigned to its lane of a pack: ``(store,
        index at lane 0, pack, element type, lane marker)`` per widened store
        (none when the dialect's direct copies were all the group does)."""
        V, s = plan.V, plan.loop
        vn = self.names(s.var.name)
        direct = self.group_copies(plan)  # the dialect's direct copies, emitted
        rest = [st for st in plan.stmts if st not in direct]
        if direct and not any(isinstance(st, (L.Store, L.Check)) for st in L.walk(tuple(rest))):
            return []  # nothing else has an effect (index locals only)
        used = set(L.evaluated(tuple(rest), nested=False))
        repl: dict = {}
        for k, (node, e0) in enumerate(plan.loads.items()):
            if direct and node not in used:
                continue
            t = self.d.mem(node.buf.dtype)
            q = self.names(f"vq.{k}.{vn}", "tn")
            fn = self.wide_load_fn(node)
            self.w(f"const {self.d.pack.format(t=t, n=V)} {q} = {fn}<{t}, {V}>("
                   f"&{self.elem(node.buf, e0)});")
            marker = L.LVar(f"@vq{k}.{vn}", node.buf.dtype)
            self.names.map[marker.name] = lane = f"{q}.e[{vn}]"
            if node.buf.dtype.name in ("f16", "bf16") and V % 2 == 0:
                self.word_lanes[lane] = f"tn_lane({q}, {vn})"
            repl[node] = L.Ref(marker)
        outs = []
        for k, (node, e0) in enumerate(plan.stores.items()):
            if node in direct:
                continue
            t = self.d.mem(node.buf.dtype)
            q = self.names(f"vs.{k}.{vn}", "tn")
            self.w(f"{self.d.pack.format(t=t, n=V)} {q};")
            marker = L.LVar(f"@vs{k}.{vn}", node.buf.dtype)
            self.names.map[marker.name] = f"{q}.e[{vn}]"
            outs.append((node, e0, q, t, marker))
            repl[node] = marker

        def fe(x: Any) -> Any:
            return repl.get(x) if isinstance(x, L.Load) else None

        wide = tuple(L.Assign(repl[st], L.map_expr(st.value, fe)) if st in plan.stores
                     else L.map_stmts((st,), fe)[0] for st in rest)
        self.guarded_lanes(vn, V, wide)
        return outs

    def group_stores(self, plan: "LanePlan", outs: list) -> None:
        """The ``V``-wide stores of a group's packs (:meth:`group_values`)."""
        for node, e0, q, t, _ in outs:
            fn = self.wide_store_fn(node)
            self.w(f"{fn}<{t}, {plan.V}>(&{self.elem(node.buf, e0)}, {q});")

    def guarded_nest(self, s: L.For) -> bool:
        """A thread's fully unrolled nest of ``vector`` loops (a register
        tile's cells) whose straight-line body calls a function with a common
        case (:meth:`guarded_lanes`'s conditions, over the whole nest): every
        cell first runs the common cases alone, folding their tests into one
        flag, and the nest runs again, whole, only if some input was outside
        them. The calls of different cells then share no branch, so their
        arithmetic interleaves. False (nothing emitted) for any other loop,
        and inside a group that already folds its tests into a flag."""
        if self.lanes_ok is not None or self.whole_run:
            return False
        loops, inner = [s], s.body
        while len(inner) == 1 and isinstance(inner[0], L.For) and inner[0].kind == "vector":
            loops.append(inner[0])
            inner = inner[0].body
        if len(loops) < 2 or not all(self.unrolled(lp) and not lp.reverse for lp in loops):
            return False
        carried = A.carried_locals(inner)
        if carried is None or not any(self.common_case(y)
                                      for y in L.evaluated(inner, nested=False)):
            return False
        self.common_cases_first(s.var.name, "of the nest ", carried, lambda: self.plain_loop(s))
        return True

    def common_cases_first(self, label: str, what: str, carried: list,
                           emit: Callable[[], None]) -> None:
        """``emit()`` with every call that has a common case running that
        case alone and folding its test into one flag, then ``emit()`` again
        with the whole functions only when the flag ended false, the
        ``carried`` locals (read before assigned) first restored to their
        values before the first run (:meth:`guarded_lanes`,
        :meth:`guarded_nest`)."""
        ok = self.names(f"ok.{label}", "tn")
        keep = {x: self.names(f"keep.{x.name}", "tn") for x in carried}
        self.w(f"bool {ok} = true;  // every call {what}inside its common case")
        for x, kx in keep.items():
            self.w(f"const {self.d.reg(x.dtype)} {kx} = {self.names(x.name)};")
        self.lanes_ok = ok
        try:
            emit()
        finally:
            self.lanes_ok = None
        self.w(f"if (!{ok}) {{  // again with the whole functions")
        self.ind += 1
        for x, kx in keep.items():
            self.w(f"{self.names(x.name)} = {kx};")
        self.whole_run = True
        try:
            emit()
        finally:
            self.whole_run = False
        self.ind -= 1
        self.w("}")

    def guarded_lanes(self, vn: str, V: int, body: tuple) -> None:
        """The lanes ``for vn in [0, V): body`` of a wide group. When the body
        only assigns locals (the widened stores assign the lanes of packs,
        stored after the group) and calls a function with a common case
        (``exp`` in float arithmetic, a division by a shared divisor), every
        lane first runs the common cases alone, folding their tests into one
        flag, and the group runs again, whole, only if some input was outside
        them: one branch per group instead of one per call. The locals the
        body reads before it assigns them (an accumulator, say) are kept and
        restored for the second run, so it starts from the same state; what
        it reads from memory is unchanged in between (the body stores
        nothing). Either way the group's values are those of the whole
        functions (``tn_prelude.cuh``, guarded lane groups)."""
        carried = A.carried_locals(body)
        if self.lanes_ok is not None or self.whole_run or not (
                carried is not None and any(self.common_case(y)
                                            for y in L.evaluated(body, nested=False))):
            # (inside a guarded nest its calls fold into the nest's flag)
            self.w(self.d.unroll)
            self.w(f"for ({vn} = 0; {vn} < {V}; ++{vn}) {{")
            self.copied_block(body, V)
            self.w("}")
            return
        def lanes() -> None:
            self.w(self.d.unroll)
            self.w(f"for ({vn} = 0; {vn} < {V}; ++{vn}) {{")
            self.block(body)
            self.w("}")

        self.common_cases_first(vn, "", carried, lanes)

    def promoted_loop(self, s: L.For) -> bool:
        """Scalar replacement: a thread's serial loop whose straight-line body
        reads and writes fixed elements of a buffer (every access unguarded,
        its index independent of the loop and of everything the body assigns,
        the indices of one buffer equal or a nonzero constant apart, so
        distinct elements) keeps those elements in registers: loaded once
        before the loop, stored once after it (only when it runs). No other
        thread touches them until the next barrier (the barrier-sufficiency
        obligation), and the body has no barrier, so the loop computes the
        same values. False (nothing emitted) when nothing qualifies."""
        if not (self.in_thread and s.kind in ("serial", "vector")):
            return False
        chosen = A.promotable(s)
        if not chosen:
            return False
        regs: dict = {}
        self.w(f"if ({self.idx(s.lo)} < {self.idx(s.hi)}) {{  // registers across the loop")
        self.ind += 1
        for buf, idx in chosen.values():
            for e in idx:
                r = self.names(f"rg.{buf.name}.{len(regs)}", "tn")
                marker = L.LVar(f"@rg{len(regs)}.{r}", buf.dtype)
                self.names.map[marker.name] = r
                regs[(buf.name, e)] = marker
                self.w(f"{self.d.reg(buf.dtype)} {r} = {self.elem(buf, e)};")

        def fe(x: Any) -> Any:
            if isinstance(x, L.Load) and x.buf.name in chosen:
                return L.Ref(regs[(x.buf.name, x.index.e)])
            return None

        def fs(t: Any) -> Any:
            if isinstance(t, L.Store) and t.buf.name in chosen:
                return (L.Assign(regs[(t.buf.name, t.index.e)], L.map_expr(t.value, fe)),)
            return None

        body = L.map_stmts(s.body, fe, fs)
        self.loop(replace(s, body=body))
        for (name, e), marker in regs.items():
            self.w(f"{self.elem(chosen[name][0], e)} = {self.names(marker.name)};")
        self.ind -= 1
        self.w("}")
        return True

    def strip_loop(self, s: L.For) -> bool:
        """A thread's serial loop over groups whose body is one lane loop
        (:meth:`lane_plan`), ``l0 = c r + a0`` with a constant stride ``c >
        0``: split into the full groups, ``r < nf`` with ``nf`` the first
        ``r`` where ``c r + a0 + V > n`` (``nf = floor((n - V - a0) / c) +
        1``, clamped to the loop's range), then the rest. When every widened
        address is aligned at ``r = lo`` and its stride in ``r`` is a multiple
        of the group's size (so aligned at every ``r``; tested once, at run
        time), the full groups run widened, unrolled by ``UNROLL`` with no
        per-group test (several loads in flight per thread), and the rest
        scalar; otherwise every group runs scalar. Lanes that compute a
        transcendental are bound by their arithmetic, not their loads: their
        full groups are not unrolled. Iterations keep their order. A loop
        not starting at 0 first tests that it runs at all. False (nothing
        emitted) for any other loop."""
        if not (self.in_thread and s.kind == "serial" and not s.reverse and len(s.body) == 1
                and isinstance(s.body[0], L.For) and s.body[0].kind == "vector"):
            return False
        if A.indexes_local(s):  # its steps must stay unrolled: registers at constant indices
            return False
        plan = self.lane_plan(s.body[0])
        if plan is None or plan.conds:
            return False
        # lanes computing a transcendental (a libm call in double, or the exp
        # formula): not unrolled (their copies -- wide, tail, misaligned --
        # unrolled cost NVRTC minutes), but still split, so the full groups
        # take no per-group test
        heavy = A.transcendental(plan)
        c = A.strip_stride(s, plan)
        if c is None:
            return False
        r = E.Var(s.var.name)
        rn, lo, hi = self.names(s.var.name), self.idx(s.lo), self.idx(s.hi)
        a0 = E.subst(plan.first, {r: 0})
        full = E.add(E.floordiv(E.add(plan.n, E.add(E.mul(-1, a0), -plan.V)), c), 1)
        nf = self.names(f"nf.{rn}", "tn")
        # a loop from a later step (the rest after a thread's register steps)
        # is often empty: one test before its bounds are computed
        self.w("{" if s.lo == E.Const(0) else f"if ({lo} < {hi}) {{  // steps past the registers")
        self.ind += 1
        self.w(f"const {self.it} {nf} = tn_clamp({self.idx(full)}, {lo}, {hi});")
        at = {r: s.lo}
        self.w(f"if ({' && '.join(self.aligned(plan, at)) or 'true'}) {{  // full groups: "
               f"{plan.V} lanes, vector accesses")
        self.ind += 1
        self.w(self.d.unroll_n.format(n=1 if heavy else UNROLL))
        self.w(f"for ({rn} = {lo}; {rn} < {nf}; ++{rn}) {{")
        self.block_of(lambda: self.vector_group(plan))
        self.w("}")
        self.w(f"for ({rn} = {nf}; {rn} < {hi}; ++{rn}) {{")
        self.block_of(lambda: self.scalar_group(s.body[0]))
        self.w("}")
        self.ind -= 1
        self.w("} else {")
        self.ind += 1
        self.w(f"for ({rn} = {lo}; {rn} < {hi}; ++{rn}) {{")
        self.block_of(lambda: self.scalar_group(s.body[0]))
        self.w("}")
        self.ind -= 1
        self.w("}")
        self.ind -= 1
        self.w("}")
        return True

    def lane_reduce(self, s: L.LaneReduce) -> None:
        dt = s.dst.dtype
        v = self.names(s.dst.name)
        self.w(f"{v} = {self.expr(s.value)};")
        o = s.width // 2
        while o >= 1:
            other = self.d.shuffle.format(mode="xor", mask=s.mask, value=v, lane=o, width=s.width)
            self.w(f"{v} = {self.binary(s.op, v, other, dt)};")
            o //= 2

    # -- hooks: a dialect's vendor rules fill these; the core adds nothing ----------------
    def barrier_waits(self, s: L.Barrier) -> list[str]:
        """Statements before block barrier ``s`` completing the dialect's
        asynchronous operations the barrier orders."""
        return []

    def group_copies(self, plan: LanePlan) -> dict:
        """The widened stores of a full group the dialect emits itself, as
        direct memory-to-memory copies (store -> the widened load it copies),
        their lines already written; empty: every store goes through
        registers."""
        return {}

    def wide_load_fn(self, node: L.Load) -> str:
        """The function loading a wide group of ``node`` (a cache policy may
        choose another)."""
        return self.d.vload

    def wide_store_fn(self, node: L.Store) -> str:
        """The function storing a wide group of ``node``."""
        return self.d.vstore

    def phase_decls(self, layout: list) -> list[str]:
        """Declarations at a phase function's start that the body, once
        emitted, turned out to need (``layout``: the shared buffers and their
        offsets)."""
        return []

    def phase_head(self, ph: L.Phase) -> list[str]:
        """Statements opening phase ``ph``'s function, before anything the
        core declares (a dialect that passes the symbols otherwise than as
        parameters defines them here)."""
        return []

    def phase_layout(self, ph: L.Phase, layout: list) -> list:
        """The shared buffers (with their offsets) phase ``ph`` declares."""
        return layout

    def param_list(self, ph: L.Phase, params: list[tuple[str, str]]) -> str:
        """The text of phase ``ph``'s parameter list (without parentheses)."""
        return ", ".join(f"{t} {n}" for t, n in params)

    def preamble(self) -> list[str]:
        """Definitions before the first function that the emitted functions
        turned out to need."""
        return []

    # -- kernels -----------------------------------------------------------------------------
    def params(self) -> list[tuple[str, str]]:
        """``(C type, name)`` of each parameter of every phase's function."""
        out = []
        sp = self.d.spaces
        for b in sorted(self.k.globals, key=lambda b: b.arg):
            if b.space == "scalar":
                out.append((f"{sp['constant']}{self.d.mem(b.dtype)}*", self.buf(b)))
            else:
                r = self.d.restrict if self.restrict and b.name not in self.aliased else ""
                out.append((f"{sp['global']}{self.d.mem(b.dtype)}*{r}", self.buf(b)))
        for s in self.k.syms:  # 64-bit in the ABI; narrowed in the body (phase)
            out.append((self.d.sym_param, self.names.sym(s) + ("_w" if self.narrow_index else "")))
        out.append((self.d.status_param, "tn_status"))
        return out

    def scalar_args(self, ph: L.Phase) -> None:
        """Each scalar argument phase ``ph`` reads, read once into a register
        at its start (:attr:`invariant`; the program never writes one): a read
        through the argument's pointer could not be moved by the compiler past
        the asynchronous operations' memory clobbers, nor shared by two uses
        on either side of one."""
        read = {y.buf.name for y in L.evaluated(ph.body)
                if isinstance(y, L.Load) and y.buf.space == "scalar"}
        for b in sorted((b for b in self.k.globals if b.space == "scalar"), key=lambda b: b.arg):
            self.invariant.pop((b.name, E.Const(0)), None)  # an earlier phase's
            if b.name in read:
                r = self.names(f"arg.{b.name}", "tn")
                self.w(f"const {self.d.reg(b.dtype)} {r} = {self.load(L.Load(b, L.IExpr(E.Const(0))))};")
                self.invariant[(b.name, E.Const(0))] = r

    def phase(self, ph: L.Phase, layout: list, total: E.Expr) -> KernelInfo:
        """One phase's kernel function (see the module docstring)."""
        d = self.d
        W = self.threads_of[ph.name]  # 1 for a phase without thread loops
        self.block_w = W
        name = re.sub(r"[^0-9A-Za-z_]", "_", f"{self.k.name}_{ph.name}")
        params = self.params()
        bounds = (d.launch_bounds_min.format(threads=W, min_blocks=self.min_blocks)
                  if self.min_blocks else d.launch_bounds.format(threads=W))
        self.w(d.kernel_head.format(bounds=bounds, name=name))
        self.w("    " + self.param_list(ph, params) + ") {")
        self.ind += 1
        for line in self.phase_head(ph):
            self.w(line)
        layout = self.phase_layout(ph, layout)
        it32 = d.index_types[32][0]
        if self.narrow_index:
            for s in self.k.syms:
                S = self.names.sym(s)
                self.w(f"const {it32} {S} = ({it32}){S}_w;")
        if layout:
            if d.shared_array:
                self.w(d.shared_array)
            base = "tn_smem"
            if any(b.layout is not None for b, _ in layout):
                # swizzled tiles need a 1024-byte aligned base (the allocation
                # has that much slack: loopir.shared_arrangement)
                if d.shared_realign is None:
                    raise NotAvailableError(f"swizzled shared tiles have no {d.name} lowering")
                self.w(d.shared_realign)
                base = "tn_sbase"
            for b, off in layout:
                t = f"{d.spaces['shared']}{d.mem(b.dtype)}*"
                self.w(f"{t} const {self.buf(b)} = ({t})({base} + {self.idx(off)});")
        at_decls = len(self.lines)
        for b in self.k.locals:
            if b.space == "local":
                if not isinstance(b.size, E.Const):
                    raise NotAvailableError(
                        f"a thread-private buffer of symbolic size ({b.name}) has no {d.name} "
                        "lowering", hint="use a shared buffer")
                self.w(f"{d.spaces['local']}{d.mem(b.dtype)} {self.buf(b)}"
                       f"[{max(1, int(b.size.value))}];")
        self.scalar_args(ph)
        decl: dict[str, L.LVar] = {ph.pid.name: ph.pid}
        decl.update(L.assigned(ph.body))
        for nm, var in decl.items():
            narrow = self.narrow_index and nm in self.index_locals and var.dtype.name == "i64"
            t = it32 if narrow else d.reg(var.dtype)
            self.w(f"{t} {self.names(nm)};")
        n = f"1{self.sfx}"
        for x in ph.extents:
            n = f"({n} * {self.idx(x)})"
        pid = self.names(ph.pid.name)
        if ph.parallel and self.grid_blocks:
            # grid-stride programs: the barrier orders one program's accesses
            # to shared memory before the next one's, as in an ordered phase
            self.w(f"for ({pid} = ({self.it}){d.block_id}; {pid} < {n}; "
                   f"{pid} += ({self.it}){d.grid_blocks}) {{")
            self.block(ph.body)
            self.w("  " + d.barriers["block"])
            self.w("}")
        elif ph.parallel:
            self.w(f"{pid} = ({self.it}){d.block_id};")
            self.stmts(ph.body)
        else:
            self.w(f"for ({pid} = 0; {pid} < {n}; ++{pid}) {{")
            self.block(ph.body)
            self.w("  " + d.barriers["block"])
            self.w("}")
        self.lines[at_decls:at_decls] = ["  " + line for line in self.phase_decls(layout)]
        self.ind -= 1
        self.w("}")
        self.w("")
        programs: E.Expr = E.Const(1)
        for x in ph.extents:
            programs = E.mul(programs, x)
        return KernelInfo(name, ph.name, tuple(t for t, _ in params), W, total,
                          programs if ph.parallel else E.Const(1), not ph.parallel,
                          self.grid_blocks if ph.parallel else None)

    def source(self) -> Source:
        """The kernel's source text: the prelude, then the dialect's
        :meth:`preamble`, then one function per phase."""
        self.w(f"// tilenest: kernel {self.k.name}")
        self.w(self.d.include)
        self.w("")
        head = len(self.lines)
        # each phase its own shared arrangement: nothing outlives a launch
        placed = L.phase_arrangements(self.k)
        infos = tuple(self.phase(ph, *placed[ph.name]) for ph in self.k.phases)
        self.lines[head:head] = self.preamble() + list(self.helpers.values())
        return Source("\n".join(self.lines) + "\n", infos)


Emitter.STMT_RULES = {
    L.Assign: "assign_stmt", L.Store: "store_stmt", L.For: "loop", L.If: "if_stmt",
    L.While: "while_stmt", L.Check: "check_stmt", L.Barrier: "barrier_stmt",
    L.Shuffle: "shuffle_stmt", L.LaneReduce: "lane_reduce", L.WarpMma: "mma_stmt",
    L.MmaWait: "mma_wait_stmt", L.Comment: "comment_stmt"}
Emitter.EXPR_RULES = {
    L.Const: "const_expr", L.Ref: "ref_expr", L.IExpr: "iexpr_expr", L.IPred: "ipred_expr",
    L.Load: "load", L.Select: "select_expr", L.Cast: "cast_expr", L.Bitcast: "bitcast_expr",
    L.Un: "un_expr", L.Bin: "bin_expr", L.Fma: "fma_expr"}
