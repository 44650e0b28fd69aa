"""Loop IR (SIMT form) -> CUDA C++.

One ``__global__`` function per phase, named ``<kernel>_<phase>``, with the
parameters ``(tensor and scalar buffers in argument order, one long long per
kernel symbol, int* tn_status)``. A parallel phase runs program ``pid =
blockIdx.x`` on one block, or with a cap on the grid (``Schedule.grid_blocks``)
the programs ``blockIdx.x, blockIdx.x + gridDim.x, ...`` one after another
on each block, a block barrier after each; an ordered phase runs its
programs in order on a single block. The block has ``W`` threads, ``W`` the extent of the phase's
thread loops (all equal; 1 for a phase without one).

Program-level code runs on every thread of the block (its locals are equal
in every thread); its stores are done by thread 0 (``if (threadIdx.x ==
0)``). A thread loop ``for.thread t`` is the block itself: ``t =
threadIdx.x``. A block barrier is ``__syncthreads()``; ``Shuffle`` and
``LaneReduce`` are ``__shfl_*_sync`` with their mask and width.

Shared buffers are placed one after another in the dynamic shared memory
``tn_smem``, each at a 16-byte aligned offset; the offsets and the total
(:attr:`CudaKernelInfo.shared_bytes`) are expressions over the kernel's
symbols, evaluated per launch.

Every scalar operation is the prelude's (``prelude/tn_prelude.cuh``)
realization of its ``numerics.py`` meaning, or a C++ operator where that is
the same thing (IEEE float arithmetic with ``--fmad=false``, comparisons).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np

from ...errors import NotAvailableError
from ...lowering import loopir as L
from ...lowering.simt import block_threads
from ...semantics import dtypes as D
from ...semantics import expr as E
from ..simt import analysis as A
from ..simt.analysis import LanePlan
from ..simt.analysis import implies as _implies, in_place as _in_place  # noqa: F401  (names tests import)

#: register types of each dtype
REG = {"bool": "bool", "i8": "signed char", "i16": "short", "i32": "int", "i64": "long long",
       "u8": "unsigned char", "u16": "unsigned short", "u32": "unsigned int",
       "u64": "unsigned long long", "f16": "tn_f16", "bf16": "tn_bf16", "f32": "float",
       "f64": "double"}

#: full vector groups of a thread's strip-mined loop unrolled this many times
#: (that many wide loads in flight per thread)
UNROLL = 4


_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def reg(dt: D.DType) -> str:
    return REG[dt.name]


def mem(dt: D.DType) -> str:
    """The element type of a buffer of ``dt`` (bool occupies a byte)."""
    return "unsigned char" if dt.is_bool else REG[dt.name]


@dataclass(frozen=True)
class CudaKernelInfo:
    """One emitted ``__global__`` function: its name, the phase it runs, the
    C types of its parameters, threads per block, dynamic shared bytes and the
    number of blocks (both over the kernel's symbols), and whether its
    programs run in order on one block."""

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
class CudaSource:
    """The CUDA C++ text of a kernel and its launch facts."""

    text: str
    kernels: tuple[CudaKernelInfo, ...]
    #: the width of the index arithmetic (32 only under ``index``'s precondition)
    index_bits: int = 64
    #: the ``index.width`` obligation of 32-bit code, or why the code is 64-bit
    #: (a verdict about the text, not part of its identity)
    index: Any = field(default=None, compare=False)


def _float_literal(v: float, dt: D.DType) -> str:
    if dt.name == "f64":
        if math.isfinite(v):
            return f"{float(v).hex()}"
        bits = np.array(v, dtype=np.float64).view(np.uint64).item()
        return f"tn_bitsd({bits:#x}ull)"
    if dt.name == "f32":
        if math.isfinite(v):
            return f"{float(v).hex()}f"
        bits = np.array(v, dtype=np.float32).view(np.uint32).item()
        return f"tn_bitsf({bits:#x}u)"
    npdt = np.float16 if dt.name == "f16" else ml_dtypes.bfloat16
    bits = np.array(v, dtype=npdt).view(np.uint16).item()
    return f"tn_mk_{dt.name}({bits:#x})"


def const(value: Any, dt: D.DType) -> str:
    """A C++ expression of the register type of ``dt`` holding ``value``."""
    if dt.is_bool:
        return "true" if value else "false"
    if dt.is_int:
        v = int(value)
        if dt.is_signed:
            if dt.bits == 64 and v == -(1 << 63):
                return "((long long)0x8000000000000000ull)"
            return f"(({reg(dt)}){v}ll)"
        return f"(({reg(dt)}){v}ull)"
    return _float_literal(float(value), dt)


class _Names:
    """C identifiers for loop-IR names (which contain '.', '%'...)."""

    def __init__(self) -> None:
        self.map: dict[str, str] = {}
        self.used: set[str] = set()

    def __call__(self, name: str, stem: str = "v") -> str:
        got = self.map.get(name)
        if got is None:
            base = f"{stem}_" + re.sub(r"[^0-9A-Za-z_]", "_", name)
            got, n = base, 1
            while got in self.used:
                got, n = f"{base}_{n}", n + 1
            self.map[name] = got
            self.used.add(got)
        return got


class Emitter:
    """CUDA C++ for one SIMT-form loop-IR kernel."""

    def __init__(self, k: L.Kernel, restrict: bool = True, aliased: frozenset[str] = frozenset(),
                 narrow: bool = False, min_blocks: int | None = None, hints: bool = False,
                 grid_blocks: int | None = None):
        self.k = k
        #: blocks launched at most for a parallel phase, each looping over
        #: programs (``Schedule.grid_blocks``); None: one block per program
        self.grid_blocks = grid_blocks
        #: L2 policy of each hinted global load (``id`` of the node -> the
        #: node and its prelude function) and whether global stores stream
        #: (``Schedule.cache_hints``, :func:`cache_hints`)
        self.load_hints = {i: (x, f"tn_vload_{p}") for i, (x, p) in A.cache_hints(k).items()
                           } if hints else {}
        self.stream_stores = hints
        #: blocks per multiprocessor the register allocation must allow
        #: (``Schedule.min_blocks``: ``__launch_bounds__``' second argument)
        self.min_blocks = min_blocks
        #: index arithmetic in 32-bit ``int`` (valid only under the
        #: ``index.width`` precondition) instead of ``long long``
        self.narrow_index = narrow
        self.it, self.sfx = ("int", "") if narrow else ("long long", "ll")
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
        self.in_thread = False
        #: WarpMma tag -> what to emit of it ("load", "steps", "store"; else whole)
        self.mma_mode: dict[str, str] = {}
        #: whether some store may be an asynchronous copy (waited for at barriers)
        self.has_async = any(isinstance(s, L.Store) and s.mode == "async"
                             for ph in k.phases for s in L.walk(ph.body))
        #: lane plans by loop (``id`` of the node, kept alive with it): the
        #: hoisting of loop-invariant tests and the loop's emission ask for
        #: the same plan
        self._plans: dict[int, tuple[L.For, "LanePlan | None"]] = {}
        #: divisors worth a reciprocal computed once (:func:`shared_divisors`)
        self.shared_divisors = A.shared_divisors(k, restrict, aliased)
        #: shared reads held in registers across the loop being emitted
        #: (:meth:`invariant_loads`): (buffer name, index) -> register
        self.invariant: dict[tuple[str, E.Expr], str] = {}
        #: lane ``q.e[v]`` of a loaded pack of 16-bit floats -> the same lane
        #: read from its 32-bit word (``tn_lane``), for widening it
        self.word_lanes: dict[str, str] = {}
        #: whether a warpgroup mma (wgmma) reads shared memory
        self.has_group_mma = any(isinstance(s, L.WarpMma) and s.group > 1
                                 for ph in k.phases for s in L.walk(ph.body))
        #: (operand dtype, n) of each wgmma instruction wrapper the source needs
        self.wgmma_shapes: set[tuple[str, int]] = set()
        #: lane loop (by id) -> (its hoisted test's bit, the predicates and
        #: alignment tests that bit stands for) (:meth:`hoist_tests`)
        self.hoisted: dict[int, tuple[str, list, list]] = {}
        #: while a guarded lane group's first pass is emitted, the name of its
        #: flag (:meth:`guarded_lanes`): functions with a common case emit it
        #: alone and fold their test into the flag
        self.lanes_ok: str | None = None
        #: shared buffers whose 32-bit base address the phase being emitted
        #: uses (:meth:`saddr`); declared at the phase's start
        self.shared_bases: set[str] = set()

    # -- output ---------------------------------------------------------------
    def w(self, line: str) -> None:
        self.lines.append("  " * self.ind + line)

    # -- index expressions ------------------------------------------------------
    def idx(self, e: E.Expr) -> str:
        if self._depth == 0:
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
            return self.names(e.name, "S")
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
                u = "unsigned" if self.narrow_index else "unsigned long long"
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
        if isinstance(x, L.Const):
            return const(x.value, x.dtype)
        if isinstance(x, L.Ref):
            return self.names(x.var.name)
        if isinstance(x, L.IExpr):
            return self.idx(x.e)
        if isinstance(x, L.IPred):
            return self.pred(x.p)
        if isinstance(x, L.Load):
            return self.load(x)
        if isinstance(x, L.Select):  # both arms are evaluated (their checks too)
            return f"tn_select({self.expr(x.c)}, {self.expr(x.a)}, {self.expr(x.b)})"
        if isinstance(x, L.Cast):
            return self.cast(self.expr(x.a), x.a.dtype, x.dtype)
        if isinstance(x, L.Bitcast):
            return self.bitcast(self.expr(x.a), x.a.dtype, x.dtype)
        if isinstance(x, L.Un):
            return self.unary(x.op, self.expr(x.a), x.a.dtype)
        if isinstance(x, L.Bin):
            if A.float_division(x) and x.b in self.shared_divisors:
                dt = x.a.dtype
                a, b = (self.wide(self.expr(y), dt) for y in (x.a, x.b))
                if self.lanes_ok:
                    return self.narrow(f"tn_fdiv_by_ok({a}, tn_fdiv_prep({b}), {self.lanes_ok})",
                                       dt)
                return self.narrow(f"tn_fdiv_by({a}, tn_fdiv_prep({b}))", dt)
            return self.binary(x.op, self.expr(x.a), self.expr(x.b), x.a.dtype)
        if isinstance(x, L.Fma):
            dt = x.dtype
            a, b, c = (self.wide(self.expr(y), dt) for y in (x.a, x.b, x.c))
            f = "fma" if dt.name == "f64" else "fmaf"
            return self.narrow(f"{f}({a}, {b}, {c})", dt)
        raise TypeError(f"unknown loop-IR expression {x!r}")

    def buf(self, b: L.Buffer) -> str:
        return self.names(b.name, "b")

    def elem(self, b: L.Buffer, index: "str | E.Expr") -> str:
        """The C lvalue of logical element ``index`` of ``b``."""
        return f"{self.buf(b)}[{self.position(b, index)}]"

    def saddr(self, b: L.Buffer, index: "str | E.Expr") -> str:
        """The 32-bit shared-window address of logical element ``index`` of
        the shared buffer ``b``: its base address (taken once per kernel,
        :meth:`phase`) plus the byte offset of its physical position. The
        same address as ``tn_smem_addr(&elem)``, without converting a generic
        pointer at every use."""
        self.shared_bases.add(b.name)
        isz = max(1, b.dtype.itemsize)
        return f"({self.buf(b)}_s + {isz}u * (unsigned)({self.position(b, index)}))"

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
        if dt.name not in ("f16", "bf16"):
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

    # -- unary ---------------------------------------------------------------------------
    def unary(self, op: str, v: str, dt: D.DType) -> str:
        if dt.is_bool:
            if op == "not":
                return f"(!{v})"
        elif dt.is_int:
            t = reg(dt)
            if op == "neg":
                return f"tn_ineg<{t}>({v})"
            if op == "abs":
                return f"tn_iabs<{t}>({v})" if dt.is_signed else v
            if op == "bitnot":
                return f"(({t})~{v})"
        else:
            return self.float_unary(op, v, dt)
        raise NotAvailableError(f"op '{op}' on {dt} has no cuda lowering")

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
            return f"((({v}).bits >> 15) != 0)" if n in ("f16", "bf16") else f"tn_signbit({v})"
        w = self.wide(v, dt)
        if op in ("isnan", "isinf", "isfinite"):
            return f"tn_{op}({w})"
        if op in ("sqrt", "floor", "ceil", "trunc", "round"):
            fn = {"round": "rint"}.get(op, op) + ("" if n == "f64" else "f")
            return self.narrow(f"{fn}({w})", dt)
        if op == "exp" and n != "f64":  # float arithmetic, as the llvm target
            if self.lanes_ok:
                return self.narrow(f"tn_exp_f32_ok({w}, {self.lanes_ok})", dt)
            return self.narrow(f"tn_exp_f32({w})", dt)
        if op in A.TRANSCENDENTAL:
            return self.from_f64(f"{op}({self.to_f64(v, dt)})", dt)
        if op in ("sigmoid", "rsqrt"):
            return self.from_f64(f"tn_{op}({self.to_f64(v, dt)})", dt)
        raise NotAvailableError(f"op '{op}' on {dt} has no cuda lowering")

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
            raise NotAvailableError(f"op '{op}' on bool has no cuda lowering")
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
            return self.from_f64(f"{op}({self.to_f64(a, dt)}, {self.to_f64(b, dt)})", dt)
        raise NotAvailableError(f"op '{op}' on {n} has no cuda lowering")

    def int_binary(self, op: str, a: str, b: str, dt: D.DType) -> str:
        t = reg(dt)
        if op in ("add", "sub", "mul"):
            return f"tn_i{op}<{t}>({a}, {b})"
        if op in ("and", "or", "xor"):
            sym = {"and": "&", "or": "|", "xor": "^"}[op]
            return f"(({t})({a} {sym} {b}))"
        if op in ("maximum", "minimum"):
            return f"tn_i{op[:3]}<{t}>({a}, {b})"
        if op in ("div", "rem", "floordiv", "mod", "shl", "shr"):
            return f"tn_i{op}<{t}>({a}, {b}, tn_status)"
        raise NotAvailableError(f"op '{op}' on {dt} has no cuda lowering")

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
            return f"tn_f2i<{reg(dst)}>({x}, {float(info.min)!r}, {float(info.max)!r})"
        if dst.is_float:
            if dst.name in ("f32", "f64"):
                return f"(({reg(dst)}){v})"
            if src.bits <= 32:
                return f"tn_round_{dst.name}((double){v})"
            if src.is_signed:
                odd = (f"tn_i64_to_f64_odd(({v}) < 0 ? 0ull - (unsigned long long)({v}) : "
                       f"(unsigned long long)({v}), ({v}) < 0)")
            else:
                odd = f"tn_i64_to_f64_odd((unsigned long long)({v}), false)"
            return f"tn_round_{dst.name}({odd})"
        return f"(({reg(dst)}){v})"

    def bitcast(self, v: str, src: D.DType, dst: D.DType) -> str:
        if dst.is_bool:
            return f"(tn_bitcast<unsigned char>({v}) != 0)"
        if src.is_bool:
            return f"(({reg(dst)})({v} ? 1 : 0))"
        return f"tn_bitcast<{reg(dst)}>({v})"

    # -- statements ------------------------------------------------------------------------
    def stmts(self, body: tuple) -> None:
        for s in body:
            self.stmt(s)

    def stmt(self, s: Any) -> None:
        if isinstance(s, L.Assign):
            self.w(f"{self.names(s.var.name)} = {self.expr(s.value)};")
        elif isinstance(s, L.Store):
            v = self.expr(s.value)
            if s.buf.dtype.is_bool:
                v = f"(unsigned char)({v} ? 1 : 0)"
            ix = s.index.e if isinstance(s.index, L.IExpr) else self.expr(s.index)
            line = f"{self.elem(s.buf, ix)} = {v};"
            cond = []
            if not self.in_thread and s.buf.space != "local":
                cond.append("threadIdx.x == 0")
            if s.guard is not None:
                cond.append(self.expr(s.guard))
            self.w(f"if ({' && '.join(cond)}) {line}" if cond else line)
        elif isinstance(s, L.For):
            self.loop(s)
        elif isinstance(s, L.If):
            self.w(f"if ({self.expr(s.cond)}) {{")
            self.block(s.then)
            if s.orelse:
                self.w("} else {")
                self.block(s.orelse)
            self.w("}")
        elif isinstance(s, L.While):
            self.w("for (;;) {")
            self.ind += 1
            self.stmts(s.pre)
            self.w(f"if (!({self.expr(s.cond)})) break;")
            self.stmts(s.body)
            self.ind -= 1
            self.w("}")
        elif isinstance(s, L.Check):
            self.w(f"if (!({self.expr(s.cond)})) tn_fail(tn_status, {s.code});")
        elif isinstance(s, L.Barrier):
            if s.scope == "block":
                if self.has_async:  # the copies since the last barrier form a group;
                    # all but the newest `keep` groups complete before it (Barrier.keep)
                    self.w(f"tn_cp_async_commit(); tn_cp_async_wait<{s.keep}>();")
                if self.has_group_mma:
                    # overlapped warpgroup mmas: all but the mma_keep newest
                    # groups complete here (Barrier.mma_keep); shared memory
                    # written by this thread (stores, completed copies) is read
                    # next by the tensor cores' async proxy
                    self.w(f"tn_wgmma_wait<{s.mma_keep}>(); tn_fence_proxy_async();")
                self.w("__syncthreads();")
            elif s.scope == "warp":
                self.w("__syncwarp();")
        elif isinstance(s, L.Shuffle):
            lane = f"(int)({self.idx(s.lane)})"
            self.w(f"{self.names(s.dst.name)} = tn_shfl_{s.mode}({s.mask:#x}u, {self.expr(s.value)}, "
                   f"{lane}, {s.width});")
        elif isinstance(s, L.LaneReduce):
            self.lane_reduce(s)
        elif isinstance(s, L.WarpMma):
            self.warp_mma(s)
        elif isinstance(s, L.Comment):
            self.w(f"// {s.text}")
        else:
            raise TypeError(f"unknown loop-IR statement {s!r}")

    def block(self, body: tuple) -> None:
        self.ind += 1
        self.stmts(body)
        self.ind -= 1

    def loop(self, s: L.For) -> None:
        v = self.names(s.var.name)
        if s.kind == "thread":
            if self.in_thread:
                raise NotAvailableError("nested thread loops have no cuda lowering")
            self.w(f"{v} = ({self.it})threadIdx.x;  // thread loop over [0, {E.to_str(s.hi)})")
            self.w("{")
            self.in_thread = True
            self.block(s.body)
            self.in_thread = False
            self.w("}")
            return
        if s.kind == "vector" and self.in_thread and self.lane_loop(s):
            return
        if not self.in_thread:
            self.hoist_tests(s)
        if (self.invariant_loads(s) or self.strip_loop(s) or self.unswitched_loop(s)
                or self.promoted_loop(s) or self.resident_loop(s)):
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
            within = f"(unsigned)({self.idx(e)}) < (unsigned)({self.idx(y.buf.size)})"
            self.w(f"const {REG[y.buf.dtype.name]} {r} = {within} ? {self.elem(y.buf, e)} : "
                   f"{const(0, y.buf.dtype)};")
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

        group = E.cmp("<=", E.add(plan.first, plan.V), plan.n)
        preds = [p for p in [group, *self.needed(plan.conds)] if invariant(p)]
        aligns = [t for t, inv in self.alignment_tests(plan) if inv]
        if n > 32 or not (preds or aligns):
            return
        mask = self.names(f"ok.{lane.var.name}", "tn")
        bit = E.Const(0)
        for st in steps:
            bit = E.add(E.mul(bit, st.hi.value - st.lo.value),
                        E.add(E.Var(st.var.name), E.mul(-1, st.lo)))
        self.w(f"unsigned {mask} = 0u;  // the loop-invariant part of a wide-access test")
        self.w("{")
        self.ind += 1
        self.w(f"{self.names(thread.var.name)} = ({self.it})threadIdx.x;")
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
        if self.unrolled(s):
            self.w("#pragma unroll")
        if s.reverse:
            self.w(f"for ({v} = {hi} - 1; {v} >= {lo}; --{v}) {{")
        else:
            self.w(f"for ({v} = {lo}; {v} < {hi}; ++{v}) {{")
        self.block(s.body)
        self.w("}")

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
        self.w(f"if ({' && '.join(conds)}) {{  // {plan.V} lanes, vector accesses")
        self.block_of(lambda: self.vector_group(plan))
        self.w("} else {")
        self.block_of(lambda: self.scalar_group(s))
        self.w("}")
        return True

    def lane_test(self, s: L.For, plan: "LanePlan") -> list[str]:
        """The conjuncts that send a group of lane loop ``s`` down the wide
        path: in bounds, aligned, its loads' guards true for every lane (the
        invariant part as its hoisted bit, :meth:`hoist_tests`)."""
        got = self.hoisted.get(id(s))
        if got is None:
            return [f"{self.idx(plan.first)} + {plan.V} <= {self.idx(plan.n)}",
                    *self.aligned(plan), *(self.pred(p) for p in self.needed(plan.conds))]
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
        self.w("#pragma unroll")
        self.w(f"for ({v} = {lo}; {v} < {hi}; ++{v})")
        self.w(f"  {ok} = {ok} && {' && '.join(self.lane_test(lane, plan))};")
        self.w(f"if ({ok}) {{")
        self.ind += 1
        self.w("#pragma unroll")
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
        self.w("#pragma unroll")
        self.w(f"for ({vn} = 0; {vn} < {s.hi.value}; ++{vn}) {{")
        self.block(s.body)
        self.w("}")

    def vector_group(self, plan: "LanePlan") -> None:
        """The widened body of one full, aligned group: one ``V``-wide load per
        widened load, the lanes' statements on the loaded packs, one ``V``-wide
        store per widened store."""
        V, s = plan.V, plan.loop
        vn = self.names(s.var.name)
        # an asynchronous store of a widened load unchanged: one cp.async
        # per group, the data never passing through registers
        # (cp.async moves 4, 8 or 16 bytes; a narrower group is stored at once,
        # which an asynchronous store permits)
        direct = {st: st.value for st in plan.stores if st.mode == "async"
                  and isinstance(st.value, L.Load) and st.value in plan.loads
                  and st.value.buf.dtype == st.buf.dtype
                  and max(1, st.buf.dtype.itemsize) * V in (4, 8, 16, 32)}
        for st, ld in direct.items():
            nbytes = max(1, st.buf.dtype.itemsize) * V
            self.w(f"tn_cp_async<{nbytes}>({self.saddr(st.buf, plan.stores[st])}, "
                   f"&{self.elem(ld.buf, plan.loads[ld])});")
        rest = [st for st in plan.stmts if st not in direct]
        if direct and not any(isinstance(st, (L.Store, L.Check)) for st in L.walk(tuple(rest))):
            return  # nothing else has an effect (index locals only)
        used = set(L.evaluated(tuple(rest), nested=False))
        repl: dict = {}
        for k, (node, e0) in enumerate(plan.loads.items()):
            if direct and node not in used:
                continue
            t = mem(node.buf.dtype)
            q = self.names(f"vq.{k}.{vn}", "tn")
            fn = self.load_hints.get(id(node), (None, "tn_vload"))[1]
            self.w(f"const tn_pack<{t}, {V}> {q} = {fn}<{t}, {V}>("
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
            t = mem(node.buf.dtype)
            q = self.names(f"vs.{k}.{vn}", "tn")
            self.w(f"tn_pack<{t}, {V}> {q};")
            marker = L.LVar(f"@vs{k}.{vn}", node.buf.dtype)
            self.names.map[marker.name] = f"{q}.e[{vn}]"
            outs.append((node, e0, q, t))
            repl[node] = marker

        def fe(x: Any) -> Any:
            return repl.get(x) if isinstance(x, L.Load) else None

        wide = tuple(L.Assign(repl[st], L.map_expr(st.value, fe)) if st in plan.stores
                     else L.map_stmts((st,), fe)[0] for st in rest)
        self.guarded_lanes(vn, V, wide)
        for node, e0, q, t in outs:
            fn = ("tn_vstore_stream" if self.stream_stores and node.buf.space == "global"
                  else "tn_vstore")
            self.w(f"{fn}<{t}, {V}>(&{self.elem(node.buf, e0)}, {q});")

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
        if not (carried is not None and any(A.has_common_case(y, self.shared_divisors)
                                            for y in L.evaluated(body, nested=False))):
            self.w("#pragma unroll")
            self.w(f"for ({vn} = 0; {vn} < {V}; ++{vn}) {{")
            self.block(body)
            self.w("}")
            return
        ok = self.names(f"ok.{vn}", "tn")
        keep = {x: self.names(f"keep.{x.name}", "tn") for x in carried}
        self.w(f"bool {ok} = true;  // every call inside its common case")
        for x, kx in keep.items():
            self.w(f"const {reg(x.dtype)} {kx} = {self.names(x.name)};")
        self.w("#pragma unroll")
        self.w(f"for ({vn} = 0; {vn} < {V}; ++{vn}) {{")
        self.lanes_ok = ok
        try:
            self.block(body)
        finally:
            self.lanes_ok = None
        self.w("}")
        self.w(f"if (!{ok}) {{  // again with the whole functions")
        self.ind += 1
        for x, kx in keep.items():
            self.w(f"{self.names(x.name)} = {kx};")
        self.w("#pragma unroll")
        self.w(f"for ({vn} = 0; {vn} < {V}; ++{vn}) {{")
        self.block(body)
        self.w("}")
        self.ind -= 1
        self.w("}")

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
                self.w(f"{REG[buf.dtype.name]} {r} = {self.elem(buf, e)};")

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
        self.w(f"#pragma unroll {1 if heavy else UNROLL}")
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

    def warp_mma(self, s: L.WarpMma) -> None:
        """A ``WarpMma`` on the tensor cores: the lane's accumulator fragments
        (``m/16 x n/8`` blocks of 4 floats, the ``mma.m16n8k16`` layout) are
        loaded into registers, then per 16-deep step every block of ``a`` and
        pair of blocks of ``b`` comes from shared memory by ``ldmatrix.x4``
        (transposed where the buffer is contiguous along the other axis than
        the fragment's register pairs) and each 16 x 8 block is one
        ``mma.sync``; the fragments are stored back at the end. Inside a loop
        that keeps them resident (:meth:`resident_loop`) only the steps are
        emitted, or only the load or the store. The lone-thread form (no
        lane) is its reference loop nest."""
        if s.lane is None or not self.in_thread:
            self.stmts(s.reference())
            return
        if s.group > 1:
            self.group_mma(s)
            return
        mode = self.mma_mode.get(s.tag, "whole")
        MT, NT, KS = s.m // 16, s.n // 8, s.k // 16
        fn = "tn_mma_bf16" if s.a.buf.dtype.name == "bf16" else "tn_mma_f16"
        u = self.names(s.tag, "mma")
        self.w(f"{{  // warp_mma {s.m}x{s.n}x{s.k} ({mode}): {s.c} += {s.a} * {s.b}")
        self.ind += 1
        self.w(f"const int {u}_l = (int)({self.idx(s.lane)});")
        self.w(f"const int {u}_g = {u}_l >> 2, {u}_q = {u}_l & 3, {u}_r = {u}_l & 7, "
               f"{u}_bi = ({u}_l >> 3) & 1, {u}_bj = {u}_l >> 4;")
        self.w(f"const {self.it} {u}_oa = {self.idx(s.a.offset)}, {u}_ob = "
               f"{self.idx(s.b.offset)}, {u}_oc = {self.idx(s.c.offset)};")
        self.w(f"(void){u}_g; (void){u}_q; (void){u}_r; (void){u}_bi; (void){u}_bj; "
               f"(void){u}_oa; (void){u}_ob; (void){u}_oc;")
        frag = bool(s.c.lane_cols)  # the accumulator is the lane's own registers
        if mode == "whole" and not frag:
            self.w(f"float {u}_d[{MT}][{NT}][4];")
        if mode in ("whole", "load") and not frag:
            self.mma_cells(s, u, load=True)
        if mode in ("whole", "steps"):
            self.w("#pragma unroll")
            self.w(f"for (int {u}_k = 0; {u}_k < {KS}; ++{u}_k) {{")
            self.ind += 1
            self.w(f"unsigned {u}_fa[{MT}][4], {u}_fb[{NT}][2], {u}_t[4];")
            for p in range(MT):
                self.w(self.ldsm(s.a, u, f"{u}_fa[{p}]", f"{16 * p}", f"16 * {u}_k", pair="j")
                       + ";")
            for q2 in range(NT // 2):
                self.w(self.ldsm(s.b, u, f"{u}_t", f"16 * {u}_k", f"{16 * q2}", pair="i") + ";")
                for r, (q, h) in enumerate(((2 * q2, 0), (2 * q2, 1), (2 * q2 + 1, 0),
                                            (2 * q2 + 1, 1))):
                    self.w(f"{u}_fb[{q}][{h}] = {u}_t[{r}];")
            for p in range(MT):
                for q in range(NT):
                    d = (f"&{self.buf(s.c.buf)}[{u}_oc + {4 * (p * NT + q)}]" if frag
                         else f"{u}_d[{p}][{q}]")
                    self.w(f"{fn}({d}, {u}_fa[{p}], {u}_fb[{q}]);")
            self.ind -= 1
            self.w("}")
        if mode in ("whole", "store") and not frag:
            self.mma_cells(s, u, load=False)
        self.ind -= 1
        self.w("}")

    def group_mma(self, s: L.WarpMma) -> None:
        """A warpgroup ``WarpMma`` (``group = 4``) on Hopper's tensor cores:
        per 16-deep step one ``wgmma.mma_async`` m64n``n``k16 reading both
        operands from shared memory through matrix descriptors, committed as
        one group; then a wait for all of them, so the statement is complete
        (its shared reads too) when it ends -- unless it is overlapped
        (``WarpMma.overlap``), when the block barriers' waits complete it
        (``tn_wgmma_wait<mma_keep>`` before each ``__syncthreads``).

        Descriptors (PTX ISA, "matrix descriptor"; 128-byte swizzle mode): ``a``
        is K-major -- 8-row groups 1024 bytes apart (the stride offset), a
        16-deep step 32 bytes further in its 128-byte panel row, the next panel
        ``rows x 128`` bytes on; ``b`` is MN-major (``imm-trans-b = 1``) -- its
        64-column panels ``rows x 128`` bytes apart (the leading offset), 8-row
        groups 1024 bytes apart, a step ``16 x 128`` bytes on. Both tiles start
        at a 1024-byte atom (rows a multiple of 8, columns of a panel; the
        lowering's tiles do) of a 1024-byte aligned buffer. The accumulator
        is the thread's ``n/2`` registers in the instruction's order
        (``loopir.lane_cell``): the lane fragment itself, or a copy of the
        thread's cells of ``c``."""
        la, lb = s.a.buf.layout, s.b.buf.layout
        if la is None or lb is None or s.m != 64:
            raise NotAvailableError("a warpgroup mma needs 64-row tiles of swizzled shared "
                                    "operands", hint="use mma_unit='tensor'")
        dt = s.a.buf.dtype.name
        self.wgmma_shapes.add((dt, s.n))
        u = self.names(s.tag, "mma")
        isz = max(1, s.a.buf.dtype.itemsize)
        frag = bool(s.c.lane_cols)
        self.w(f"{{  // group_mma {s.m}x{s.n}x{s.k}: {s.c} += {s.a} * {s.b}")
        self.ind += 1
        self.w(f"const int {u}_l = (int)({self.idx(s.lane)});")
        # one descriptor per operand; a later 16-deep step adds its byte
        # offset / 16 to the address field (tn_wgmma_desc_at)
        self.w(f"const tn_u64 {u}_a = tn_wgmma_desc({self.saddr(s.a.buf, s.a.offset)}, 16u, "
               f"1024u), {u}_b = tn_wgmma_desc({self.saddr(s.b.buf, s.b.offset)}, "
               f"{lb.rows * 128}u, 1024u);")
        if frag:
            d = f"&{self.buf(s.c.buf)}[{self.idx(s.c.offset)}]"
        else:
            d = f"{u}_d"
            self.w(f"const {self.it} {u}_oc = {self.idx(s.c.offset)};")
            self.w(f"float {u}_d[{s.n // 2}];")
            self.group_cells(s, u, load=True)
        self.w("tn_wgmma_fence();")
        for j in range(s.k // 16):
            k0 = 16 * j
            ao = (k0 // la.panel) * la.rows * 128 + (k0 % la.panel) * isz
            bo = k0 * 128
            self.w(f"tn_wgmma_{dt}_n{s.n}({d}, tn_wgmma_desc_at({u}_a, {ao}u), "
                   f"tn_wgmma_desc_at({u}_b, {bo}u));")
        # an overlapped mma completes at a later barrier (Barrier.mma_keep)
        self.w("tn_wgmma_commit();" if s.overlap else "tn_wgmma_commit(); tn_wgmma_wait<0>();")
        if not frag:
            self.group_cells(s, u, load=False)
        self.ind -= 1
        self.w("}")

    def group_cells(self, s: L.WarpMma, u: str, load: bool) -> None:
        """Copy the thread's accumulator cells between ``c`` and the
        registers ``u_d`` of a warpgroup mma (``load``: into the registers)."""
        c = s.c
        for x, n in (("q", s.n // 8), ("h", 2), ("e", 2)):
            self.w("#pragma unroll")
            self.w(f"for (int {u}_{x} = 0; {u}_{x} < {n}; ++{u}_{x})")
        row = f"(16 * ({u}_l >> 5) + (({u}_l & 31) >> 2) + 8 * {u}_h)"
        col = f"(8 * {u}_q + 2 * ({u}_l & 3) + {u}_e)"
        at = self.elem(c.buf, f"{u}_oc + {row} * {c.si}{self.sfx} + {col} * {c.sj}{self.sfx}")
        reg = f"{u}_d[4 * {u}_q + 2 * {u}_h + {u}_e]"
        self.w(f"  {reg} = {at};" if load else f"  {at} = {reg};")

    def mma_cells(self, s: L.WarpMma, u: str, load: bool) -> None:
        """Copy the lane's accumulator elements between ``c`` and its
        fragment registers ``u_d`` (``load``: into the registers)."""
        c, cb = s.c, self.buf(s.c.buf)
        for x, n in (("p", s.m // 16), ("n", s.n // 8), ("h", 2), ("e", 2)):
            self.w("#pragma unroll")
            self.w(f"for (int {u}_{x} = 0; {u}_{x} < {n}; ++{u}_{x})")
        at = (f"{cb}[{u}_oc + (16 * {u}_p + {u}_g + 8 * {u}_h) * {c.si}{self.sfx} + "
              f"(8 * {u}_n + 2 * {u}_q + {u}_e) * {c.sj}{self.sfx}]")
        reg = f"{u}_d[{u}_p][{u}_n][2 * {u}_h + {u}_e]"
        self.w(f"  {reg} = {at};" if load else f"  {at} = {reg};")

    def resident_plan(self, s: L.For) -> "tuple[L.For, L.WarpMma] | None":
        """:func:`analysis.resident_mma` of a program-level loop ``s``."""
        return None if self.in_thread else A.resident_mma(s)

    def resident_loop(self, s: L.For) -> bool:
        """:meth:`resident_plan`'s loop with the accumulator fragments in
        registers: loaded once before the loop, only the ``mma`` steps inside,
        stored once after it. False (nothing emitted) for any other loop."""
        plan = self.resident_plan(s)
        if plan is None:
            return False
        t, w = plan
        u = self.names(w.tag, "mma")
        self.w(f"float {u}_d[{w.m // 16}][{w.n // 8}][4];  // resident across the loop")
        for mode in ("load", None, "store"):
            self.mma_mode[w.tag] = mode or "steps"
            if mode is None:
                self.plain_loop(s)
            else:
                self.stmt(t)
        del self.mma_mode[w.tag]
        return True

    def ldsm(self, f: L.Frag, u: str, regs: str, i0: str, j0: str, pair: str) -> str:
        """The ``ldmatrix.x4`` call loading the four 8 x 8 blocks ``(bi, bj)``
        of the 16 x 16 block of ``f`` at ``(i0, j0)`` (lane ``8 (2 bj + bi) +
        r`` gives row ``r`` of its block along ``f``'s strided axis), so that
        register ``2 bj + bi`` holds pairs along axis ``pair``."""
        contiguous = "j" if f.sj == 1 else "i"
        di = f"8 * {u}_bi" + (f" + {u}_r" if contiguous == "j" else "")
        dj = f"8 * {u}_bj" + (f" + {u}_r" if contiguous == "i" else "")
        fn = "tn_ldsm_x4" if contiguous == pair else "tn_ldsm_x4_t"
        off = f"{u}_o{'a' if pair == 'j' else 'b'}"
        at = (f"{off} + ({i0} + {di}) * {f.si}{self.sfx} + ({j0} + {dj}) * {f.sj}{self.sfx}")
        return f"{fn}({regs}, {self.buf(f.buf)} + ({at}))"

    def lane_reduce(self, s: L.LaneReduce) -> None:
        dt = s.dst.dtype
        v = self.names(s.dst.name)
        self.w(f"{v} = {self.expr(s.value)};")
        o = s.width // 2
        while o >= 1:
            other = f"tn_shfl_xor({s.mask:#x}u, {v}, {o}, {s.width})"
            self.w(f"{v} = {self.binary(s.op, v, other, dt)};")
            o //= 2

    # -- kernels -----------------------------------------------------------------------------
    def params(self) -> list[tuple[str, str]]:
        """``(C type, name)`` of each parameter of every phase's function."""
        out = []
        for b in sorted(self.k.globals, key=lambda b: b.arg):
            if b.space == "scalar":
                out.append((f"const {mem(b.dtype)}*", self.buf(b)))
            else:
                r = " __restrict__" if self.restrict and b.name not in self.aliased else ""
                out.append((f"{mem(b.dtype)}*{r}", self.buf(b)))
        for s in self.k.syms:  # 64-bit in the ABI; narrowed in the body (phase)
            out.append(("long long", self.names(s, "S") + ("_w" if self.narrow_index else "")))
        out.append(("int*", "tn_status"))
        return out

    def shared_layout(self) -> tuple[list[tuple[L.Buffer, E.Expr]], E.Expr]:
        """Each shared buffer with its byte offset, and the total bytes
        (``loopir.shared_arrangement``)."""
        return L.shared_arrangement(self.k)

    def phase(self, ph: L.Phase, layout: list, total: E.Expr) -> CudaKernelInfo:
        W = self.threads_of[ph.name]  # 1 for a phase without thread loops
        name = re.sub(r"[^0-9A-Za-z_]", "_", f"{self.k.name}_{ph.name}")
        params = self.params()
        bounds = f"{W}, {self.min_blocks}" if self.min_blocks else f"{W}"
        self.w(f'extern "C" __global__ void __launch_bounds__({bounds}) {name}(')
        self.w("    " + ", ".join(f"{t} {n}" for t, n in params) + ") {")
        self.ind += 1
        if self.narrow_index:
            for s in self.k.syms:
                S = self.names(s, "S")
                self.w(f"const int {S} = (int){S}_w;")
        if layout:
            self.w("extern __shared__ __align__(16) unsigned char tn_smem[];")
            base = "tn_smem"
            if any(b.layout is not None for b, _ in layout):
                # swizzled tiles need a 1024-byte aligned base (the allocation
                # has that much slack: loopir.shared_arrangement)
                self.w("unsigned char* const tn_sbase = tn_smem + ((0u - tn_smem_addr(tn_smem)) "
                       "& 1023u);")
                base = "tn_sbase"
            for b, off in layout:
                self.w(f"{mem(b.dtype)}* const {self.buf(b)} = ({mem(b.dtype)}*)({base} + "
                       f"{self.idx(off)});")
        self.shared_bases = set()
        at_bases = len(self.lines)
        for b in self.k.locals:
            if b.space == "local":
                if not isinstance(b.size, E.Const):
                    raise NotAvailableError(
                        f"a thread-private buffer of symbolic size ({b.name}) has no cuda "
                        "lowering", hint="use a shared buffer")
                self.w(f"{mem(b.dtype)} {self.buf(b)}[{max(1, int(b.size.value))}];")
        decl: dict[str, L.LVar] = {ph.pid.name: ph.pid}
        decl.update(L.assigned(ph.body))
        for nm, var in decl.items():
            narrow = self.narrow_index and nm in self.index_locals and var.dtype.name == "i64"
            t = "int" if narrow else reg(var.dtype)
            self.w(f"{t} {self.names(nm)};")
        n = f"1{self.sfx}"
        for x in ph.extents:
            n = f"({n} * {self.idx(x)})"
        pid = self.names(ph.pid.name)
        if ph.parallel and self.grid_blocks:
            # grid-stride programs: the barrier orders one program's accesses
            # to shared memory before the next one's, as in an ordered phase
            self.w(f"for ({pid} = ({self.it})blockIdx.x; {pid} < {n}; "
                   f"{pid} += ({self.it})gridDim.x) {{")
            self.block(ph.body)
            self.w("  __syncthreads();")
            self.w("}")
        elif ph.parallel:
            self.w(f"{pid} = ({self.it})blockIdx.x;")
            self.stmts(ph.body)
        else:
            self.w(f"for ({pid} = 0; {pid} < {n}; ++{pid}) {{")
            self.block(ph.body)
            self.w("  __syncthreads();")
            self.w("}")
        # the shared-window base of each buffer the body addresses as such
        # (cp.async destinations, wgmma operands): converted once here
        self.lines[at_bases:at_bases] = [
            f"  const unsigned {self.buf(b)}_s = tn_smem_addr({self.buf(b)});"
            for b, _ in layout if b.name in self.shared_bases]
        self.ind -= 1
        self.w("}")
        self.w("")
        programs: E.Expr = E.Const(1)
        for x in ph.extents:
            programs = E.mul(programs, x)
        return CudaKernelInfo(name, ph.name, tuple(t for t, _ in params), W, total,
                              programs if ph.parallel else E.Const(1), not ph.parallel,
                              self.grid_blocks if ph.parallel else None)

    def source(self) -> CudaSource:
        layout, total = self.shared_layout()
        self.w(f"// tilenest: kernel {self.k.name}")
        self.w('#include "tn_prelude.cuh"')
        self.w("")
        head = len(self.lines)
        infos = tuple(self.phase(ph, layout, total) for ph in self.k.phases)
        wrappers = [line for dt, n in sorted(self.wgmma_shapes) for line in wgmma_wrapper(dt, n)]
        self.lines[head:head] = wrappers
        return CudaSource("\n".join(self.lines) + "\n", infos)


def wgmma_wrapper(dt: str, n: int) -> list[str]:
    """The source lines defining ``tn_wgmma_<dt>_n<n>(d, desc_a, desc_b)``:
    ``d += a * b`` for a 64 x ``n`` x 16 step of a warpgroup, ``d`` the
    thread's ``n/2`` accumulator registers, ``a`` K-major and ``b`` MN-major
    (transposed) in shared memory. On the device one ``wgmma.mma_async``
    (asynchronous: ``tn_wgmma_commit``/``tn_wgmma_wait0`` complete it); in the
    emulator a collective of each warp computing its 16 rows
    (``tn_cuda_shim.h``)."""
    name = f"tn_wgmma_{dt}_n{n}"
    regs = n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    cons = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    bf = "true" if dt == "bf16" else "false"
    return [
        "#ifdef TN_EMULATE",
        f"#define {name}(d, da, db) tn_emu::wgmma_at(__LINE__, {bf}, {n}, (d), (da), (db))",
        "#else",
        f"TN_FN void {name}(float* d, tn_u64 da, tn_u64 db) {{",
        '  asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %' + str(regs + 2) + ', 0;\\n"',
        f'               "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{dt}.{dt} "',
        f'               "{{{outs}}}, "',
        f'               "%{regs}, %{regs + 1}, p, 1, 1, 0, 1;\\n}}\\n"',
        f"               : {cons}",
        '               : "l"(da), "l"(db), "r"(1));',
        "}",
        "#endif",
        "",
    ]


def emit_cuda(k: L.Kernel, aliased: frozenset[str] = frozenset(),
              index_bits: int = 64, min_blocks: int | None = None,
              hints: bool = False, grid_blocks: int | None = None) -> CudaSource:
    """The CUDA C++ source of SIMT-form kernel ``k`` (see the module docstring).

    With ``index_bits=32`` the index arithmetic is 32-bit wherever every index
    expression emitted is bounded by the loop ranges: the source then carries
    the ``index.width`` obligation (:func:`tilenest.proofs.gpu.index_width`),
    whose precondition a launch must meet; otherwise (a data-dependent index,
    or a bound over the limit for every size) the code is 64-bit and
    ``index`` says why. ``hints``: L2 cache policies on the wide global
    accesses (``Schedule.cache_hints``, :func:`cache_hints`); ``grid_blocks``:
    a cap on the blocks of a parallel phase, each looping over programs."""
    from ...proofs import gpu

    kw = {"aliased": aliased, "min_blocks": min_blocks, "hints": hints,
          "grid_blocks": grid_blocks}
    if index_bits == 64:
        return Emitter(k, **kw).source()
    em = Emitter(k, narrow=True, **kw)
    src = em.source()
    ob = gpu.index_width(k, em.roots)
    if isinstance(ob, str):
        return replace(Emitter(k, **kw).source(), index=ob)
    return replace(src, index_bits=32, index=ob)
