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

#: register types of each dtype
REG = {"bool": "bool", "i8": "signed char", "i16": "short", "i32": "int", "i64": "long long",
       "u8": "unsigned char", "u16": "unsigned short", "u32": "unsigned int",
       "u64": "unsigned long long", "f16": "tn_f16", "bf16": "tn_bf16", "f32": "float",
       "f64": "double"}

_TRANSCENDENTAL = ("exp", "exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tanh", "erf")
#: full vector groups of a thread's strip-mined loop unrolled this many times
#: (that many wide loads in flight per thread)
UNROLL = 4


@dataclass(frozen=True)
class LanePlan:
    """The widenable accesses of one lane loop (``Emitter.lane_plan``):
    ``loop`` the ``for.vector v in [0, V)``, its lanes in bounds while
    ``first + v < n``; ``stmts`` the guarded body; ``loads``/``stores`` map
    each widened access to its index at ``v = 0``."""

    loop: Any
    V: int
    first: E.Expr
    n: E.Expr
    stmts: tuple
    loads: dict
    stores: dict
    #: tests that make the widened guarded loads' guards true for every lane
    conds: tuple = ()

    def accesses(self) -> list[tuple[Any, E.Expr]]:
        return [*self.loads.items(), *self.stores.items()]

    def group_bytes(self, node: Any) -> int:
        """The alignment one ``V``-wide access of ``node`` needs (at most 16)."""
        return min(16, max(1, node.buf.dtype.itemsize) * self.V)


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
        self.load_hints = cache_hints(k) if hints else {}
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
        defs, data = L.index_definitions(k)
        self.index_locals = set(defs) - data
        #: symbols that are tensor extents, and index locals never negative
        self.extents = {x.name for p in k.params for x in p.shape if isinstance(x, E.Sym)}
        self.nonneg_vars = _nonneg_vars(defs, data, self.extents)
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
        self.shared_divisors = shared_divisors(k, restrict, aliased)
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
        """Whether ``e`` is never negative (:func:`_nonneg`)."""
        return _nonneg(e, self.extents, self.nonneg_vars)

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
            if _float_division(x) and x.b in self.shared_divisors:
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
        whole = [t for t in terms if _divisor(t) and _divisor(t) % period == 0]
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
        if op in _TRANSCENDENTAL:
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
        plain = (L.For, L.If, L.Assign, L.Store, L.Check, L.Comment)
        if any(not isinstance(t, plain) or (isinstance(t, L.Store) and t.mode)
               for t in L.walk(s.body)):
            return False
        varying = {s.var.name} | set(L.assigned(s.body))
        stored = {t.buf.name for t in L.walk(s.body) if isinstance(t, L.Store)}
        found: dict = {}
        for y in L.evaluated(s.body):
            if (isinstance(y, L.Load) and y.buf.space == "shared" and y.guard is None
                    and y.buf.layout is None
                    and isinstance(y.index, L.IExpr) and not y.buf.dtype.is_bool
                    and y.buf.name not in stored and not (L.names(y.index) & varying)
                    and (y.buf.name, y.index.e) not in self.invariant):
                found.setdefault((y.buf.name, y.index.e), y)
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
        """Whether loop ``s`` is emitted fully unrolled: a constant trip count
        of at most 8 -- a ``vector`` loop, or a thread's own step loop (its
        iterations then see constant offsets, and what does not depend on
        them moves out of enclosing loops) -- or of at most 64 for a
        ``vector`` loop indexing a thread's register array (``local``) by its
        variable, which must stay constant for the array to stay in
        registers."""
        if not (isinstance(s.lo, E.Const) and isinstance(s.hi, E.Const)):
            return False
        n = s.hi.value - s.lo.value
        if n <= 8 and (s.kind == "vector" or (self.in_thread and s.kind == "serial")):
            return True
        if s.kind != "vector" or n > 64:
            return False
        return _indexes_local(s)

    def lane_plan(self, s: L.For) -> "LanePlan | None":
        """:meth:`_lane_plan` of ``s``, computed once per loop. A lane loop
        indexing a thread's register row (``local``) has a plan even with
        nothing to widen: its full groups run their lanes without the
        per-element bounds test (and group their common-case calls)."""
        got = self._plans.get(id(s))
        if got is None or got[0] is not s:
            got = (s, self._lane_plan(s, bounds_only=_indexes_local(s)))
            self._plans[id(s)] = got
        return got[1]

    def _lane_plan(self, s: L.For, bounds_only: bool = False) -> "LanePlan | None":
        """The vector accesses of a thread's ``V`` consecutive elements, or None.

        ``s`` must be ``for.vector v in [0, V): if l < n: body`` with ``l = l0
        + v`` (as ``simt.py`` distributes). Every unguarded load or store of the
        top-level body whose index is ``e0 + v`` in a global or shared buffer
        can become one ``V``-wide access when the whole group is in bounds
        (``l0 + V <= n``) and each address is aligned to the group's size.
        Buffers the body both loads and stores keep scalar accesses (the
        lanes' order matters for them), except one updated in place
        (:func:`_in_place`). None when the loop has another shape or nothing
        to widen, unless ``bounds_only``: then a plan with nothing widened, whose
        full group runs its lanes without the bounds test."""
        if not (isinstance(s.lo, E.Const) and s.lo.value == 0 and isinstance(s.hi, E.Const)
                and s.hi.value in (2, 4, 8) and len(s.body) == 1
                and isinstance(s.body[0], L.If) and not s.body[0].orelse
                and isinstance(s.body[0].cond, L.IPred)):
            return None
        V = int(s.hi.value)
        cond = s.body[0].cond.p
        if not (isinstance(cond, E.Cmp) and cond.op == "<"):
            return None
        stmts = s.body[0].then
        v = E.Var(s.var.name)
        sub: dict = {}
        for st in stmts:
            if isinstance(st, L.Assign) and isinstance(st.value, L.IExpr):
                sub[E.Var(st.var.name)] = E.subst(st.value.e, sub)

        def at(e: E.Expr, k: int) -> E.Expr:
            return E.subst(E.subst(e, sub), {v: k})

        def unit(e: E.Expr) -> bool:
            e0 = at(e, 0)
            return all(E.add(at(e, k), E.mul(-1, e0)) == E.Const(k) for k in range(1, V))

        if not unit(cond.a):
            return None

        def affine(e: E.Expr) -> bool:
            d = E.add(at(e, 1), E.mul(-1, at(e, 0)))
            return isinstance(d, E.Const) and all(
                E.add(at(e, k), E.mul(-1, at(e, 0))) == E.Const(k * d.value) for k in range(2, V))

        def convex(g: Any) -> list[E.Pred] | None:
            """A load guard whose truth over the lanes is an interval (a
            conjunction of comparisons of affine sides): true for the whole
            group when true at its first and last lane -- those two tests."""
            if not isinstance(g, L.IPred):
                return None
            items = g.p.items if isinstance(g.p, E.PAnd) else (g.p,)
            if not all(isinstance(c, E.Cmp) and affine(c.a) and affine(c.b) for c in items):
                return None
            return [E.subst(E.subst(g.p, sub), {v: 0}), E.subst(E.subst(g.p, sub), {v: V - 1})]

        touched_w = {st.buf.name for st in L.walk(stmts) if isinstance(st, L.Store)}
        # a buffer read only at the element its one top-level store writes
        # (updated in place): each lane reads and then writes its own
        # element, so all of a group's loads may precede all its stores
        in_place = {n for n in touched_w if _in_place(stmts, n)}
        loads: dict = {}
        conds: list[E.Pred] = []
        for st in stmts:  # top level only: these run for every lane of a full group
            for x in L.stmt_exprs(st):
                for y in L.subexprs(x):
                    if not (isinstance(y, L.Load) and isinstance(y.index, L.IExpr)
                            and y.buf.space in ("global", "shared")
                            and (y.buf.name not in touched_w or y.buf.name in in_place)
                            and unit(y.index.e)
                            and self.contiguous(y.buf, V)):
                        continue
                    ends = [] if y.guard is None else convex(y.guard)
                    if ends is not None and y not in loads:
                        loads[y] = at(y.index.e, 0)
                        conds += [c for c in ends if c not in conds]
        read = {y.buf.name for y in L.evaluated(stmts) if isinstance(y, L.Load)}
        stores: dict = {}
        for st in stmts:
            if (isinstance(st, L.Store) and st.guard is None and isinstance(st.index, L.IExpr)
                    and st.buf.space in ("global", "shared")
                    and (st.buf.name not in read or st.buf.name in in_place)
                    and unit(st.index.e) and self.contiguous(st.buf, V)
                    and sum(isinstance(o, L.Store) and o.buf.name == st.buf.name
                            for o in L.walk(stmts)) == 1):
                stores[st] = at(st.index.e, 0)
        if not loads and not stores and not bounds_only:
            return None
        return LanePlan(s, V, at(cond.a, 0), cond.b, stmts, loads, stores, tuple(conds))

    def needed(self, conds: "tuple[E.Pred, ...] | list[E.Pred]") -> list[E.Pred]:
        """The conjuncts of ``conds`` a run-time test must check: each once,
        not ``e >= 0`` (or ``0 <= e``) for an ``e`` never negative
        (:meth:`nonneg`), and not ``a < b`` where another conjunct is
        ``a + c < b`` (or ``<=``) with a constant ``c >= 0``, which implies
        it (a group's first and last element against one bound)."""
        out: list[E.Pred] = []
        for c in conds:
            for p in (c.items if isinstance(c, E.PAnd) else (c,)):
                trivial = isinstance(p, E.Cmp) and (
                    (p.op == ">=" and p.b == E.Const(0) and self.nonneg(p.a))
                    or (p.op == "<=" and p.a == E.Const(0) and self.nonneg(p.b)))
                if not trivial and p not in out:
                    out.append(p)
        return [p for p in out if not any(q is not p and _implies(q, p) for q in out)]

    @staticmethod
    def contiguous(b: L.Buffer, V: int) -> bool:
        """Whether ``V`` logically consecutive elements of ``b`` starting at a
        multiple of ``V`` are physically consecutive: always without a
        layout; under ``Swizzle128`` when they fit one 16-byte chunk."""
        return b.layout is None or V * max(1, b.dtype.itemsize) <= 16

    def aligned(self, plan: "LanePlan", at: dict | None = None) -> list[str]:
        """Run-time tests that every widened access of ``plan`` is aligned to
        its group's size (:meth:`alignment_tests`)."""
        return [t for t, _ in self.alignment_tests(plan, at)]

    def alignment_tests(self, plan: "LanePlan", at: dict | None = None
                        ) -> list[tuple[str, bool]]:
        """``(test, invariant)`` for every widened access of ``plan`` (group
        start indices substituted by ``at``): where the index is a sum of
        terms each a multiple of the group's elements given only symbol
        divisibilities (:func:`_divisible`), the tests are those and the base
        pointer's alignment (none for shared memory, whose buffers start at
        16-byte offsets of an aligned block), all invariant in the loops;
        otherwise the address itself (not invariant)."""
        out: list[tuple[str, bool]] = []
        for node, e0 in plan.accesses():
            e, gb, b = E.subst(e0, at or {}), plan.group_bytes(node), node.buf
            conds = _divisible(e, gb // max(1, b.dtype.itemsize)) if gb <= 16 else None
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
        if plan is None or _transcendental(plan):
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
        carried = _carried_locals(body)
        if not (carried is not None and any(_has_common_case(y, self.shared_divisors)
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
        if not (self.in_thread and s.kind in ("serial", "vector")
                and all(isinstance(t, (L.Store, L.Assign)) for t in s.body)):
            return False
        varying = {s.var.name} | set(L.assigned(s.body))
        acc: dict[str, list] = {}
        blocked: set[str] = set()
        for t in s.body:
            nodes = [y for y in L.evaluated((t,), nested=False) if isinstance(y, L.Load)]
            if isinstance(t, L.Store):
                nodes.append(t)
            for y in nodes:
                ok = (y.guard is None and isinstance(y.index, L.IExpr)
                      and not y.buf.dtype.is_bool
                      and not (L.names(y.index) & varying))
                if ok:
                    acc.setdefault(y.buf.name, []).append(y)
                else:
                    blocked.add(y.buf.name)
        chosen: dict = {}
        for name, ys in acc.items():
            if name in blocked or not any(isinstance(y, L.Store) for y in ys):
                continue
            idx = list(dict.fromkeys(y.index.e for y in ys))
            if all(isinstance(d := E.add(a, E.mul(-1, b)), E.Const) and d.value != 0
                   for i, a in enumerate(idx) for b in idx[i + 1:]):
                chosen[name] = (ys[0].buf, idx)
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
        if _indexes_local(s):  # its steps must stay unrolled: registers at constant indices
            return False
        plan = self.lane_plan(s.body[0])
        if plan is None or plan.conds:
            return False
        # lanes computing a transcendental (a libm call in double, or the exp
        # formula): not unrolled (their copies -- wide, tail, misaligned --
        # unrolled cost NVRTC minutes), but still split, so the full groups
        # take no per-group test
        heavy = _transcendental(plan)
        r = E.Var(s.var.name)

        def stride(e: E.Expr) -> E.Expr:
            return E.add(E.subst(e, {r: 1}), E.mul(-1, E.subst(e, {r: 0})))

        c = stride(plan.first)
        if not (isinstance(c, E.Const) and c.value > 0
                and E.add(E.subst(plan.first, {r: 2}), E.mul(-2, c)) == E.subst(plan.first, {r: 0})):
            return False
        for node, e0 in plan.accesses():
            k = stride(e0)
            if not (isinstance(k, E.Const) and (k.value * node.buf.dtype.itemsize)
                    % plan.group_bytes(node) == 0):
                return False
        rn, lo, hi = self.names(s.var.name), self.idx(s.lo), self.idx(s.hi)
        a0 = E.subst(plan.first, {r: 0})
        full = E.add(E.floordiv(E.add(plan.n, E.add(E.mul(-1, a0), -plan.V)), c.value), 1)
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
        """A program-level serial loop whose only access to a ``WarpMma``'s
        accumulator is that ``WarpMma``, standing in a thread loop of the
        loop's body in the shape the SIMT form gives one warp tile per warp
        (``for.thread t: for r in [0, 1): if c: index assigns; WarpMma``) with
        nothing in that path depending on the loop: ``(thread loop, WarpMma)``,
        else None. Each lane then owns the same accumulator elements in every
        iteration and no other statement of the loop touches them, so they
        may stay in the lane's registers for the whole loop."""
        if self.in_thread or s.kind not in ("serial", "vector"):
            return None
        found = [(t, w) for t in s.body if isinstance(t, L.For) and t.kind == "thread"
                 for w in L.walk(t.body) if isinstance(w, L.WarpMma)]
        mmas = [w for w in L.walk(s.body) if isinstance(w, L.WarpMma)]
        if len(found) != 1 or len(mmas) != 1 or found[0][1].lane is None or \
                found[0][1].c.lane_cols or found[0][1].group > 1:
            return None
        t, w = found[0]
        if not (len(t.body) == 1 and isinstance(t.body[0], L.For) and t.body[0].hi == E.Const(1)
                and t.body[0].lo == E.Const(0) and len(t.body[0].body) == 1
                and isinstance(t.body[0].body[0], L.If) and not t.body[0].body[0].orelse):
            return None
        r, br = t.body[0], t.body[0].body[0]
        if br.then[-1] is not w or not all(isinstance(x, L.Assign) for x in br.then[:-1]):
            return None
        local = {t.var.name, r.var.name} | {x.var.name for x in br.then[:-1]}
        # the accumulator's cells must not move (the operands' offsets may)
        reads = L.names(br.cond) | {n for x in br.then[:-1] for n in L.names(x.value)}
        reads |= L.names(L.IExpr(w.c.offset)) | L.names(L.IExpr(w.lane))
        if (reads - local) & (set(L.assigned(s.body)) | {s.var.name}):
            return None
        c = w.c.buf.name
        if c in (w.a.buf.name, w.b.buf.name):
            return None
        for st in L.walk(s.body):
            touched = [y.buf.name for y in L.evaluated((st,), nested=False)
                       if isinstance(y, L.Load)]
            if isinstance(st, L.Store):
                touched.append(st.buf.name)
            if c in touched:
                return None
        return t, w

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


def _divisor(e: E.Expr) -> int:
    """A number that divides the value of ``e`` for every value of its
    leaves (0: ``e`` is 0)."""
    if isinstance(e, E.Const):
        return abs(int(e.value))
    if isinstance(e, E.Add):
        return math.gcd(*(_divisor(t) for t in e.terms))
    if isinstance(e, E.Mul):
        return math.prod(_divisor(f) for f in e.factors)
    if isinstance(e, E.Mod) and isinstance(e.b, E.Const):
        return math.gcd(_divisor(e.a), abs(int(e.b.value)))
    return 1


def _in_place(stmts: tuple, name: str) -> bool:
    """Whether buffer ``name`` is stored by exactly one statement, at the top
    level of ``stmts``, and read only by that store's value, at its element
    (no guard): each lane reads its element before it writes it, and nothing
    reads it after."""
    sts = [s for s in L.walk(stmts) if isinstance(s, L.Store) and s.buf.name == name]
    if len(sts) != 1 or sts[0] not in stmts or sts[0].guard is not None:
        return False
    st = sts[0]
    mine = [y for y in L.subexprs(st.value) if isinstance(y, L.Load) and y.buf.name == name]
    every = [y for y in L.evaluated(stmts) if isinstance(y, L.Load) and y.buf.name == name]
    return len(mine) == len(every) and all(y.index == st.index and y.guard is None
                                           for y in mine)


def _implies(q: E.Pred, p: E.Pred) -> bool:
    """Whether ``q`` implies ``p`` because both bound one expression from
    above by the same ``b``: ``p`` is ``a < b`` (``a <= b``) and ``q`` is
    ``a + c < b`` (``a + c <= b``, or ``<`` against ``<=``) for a constant
    ``c``; ``c > 0``, or ``c = 0`` with ``q`` the strict one (so two equal
    conjuncts never remove each other)."""
    if not (isinstance(q, E.Cmp) and isinstance(p, E.Cmp) and q.b == p.b
            and q.op in ("<", "<=") and p.op in ("<", "<=")):
        return False
    d = E.add(q.a, E.mul(-1, p.a))
    if not isinstance(d, E.Const):
        return False
    c = int(d.value)
    # q: a + c < b gives a < b - c; p needs a < b (or a <= b)
    return c > 0 or (c == 0 and q.op == "<" and p.op == "<=")


def _divisible(e: E.Expr, m: int) -> list[tuple[E.Sym, int]] | None:
    """Conditions ``(S, d)``, "``S`` is a multiple of ``d``", under which ``e``
    is a multiple of ``m``: each term of the sum ``e`` is, statically
    (:func:`_divisor`) or because a symbol factor of it is a multiple of what
    its other factors leave; None when a term has neither."""
    conds: list[tuple[E.Sym, int]] = []
    for t in (e.terms if isinstance(e, E.Add) else (e,)):
        d = _divisor(t)
        if d % m == 0:
            continue
        fs = t.factors if isinstance(t, E.Mul) else (t,)
        syms = [f for f in fs if isinstance(f, E.Sym)]
        if not syms:
            return None
        rest = math.prod(_divisor(f) for f in fs if f is not syms[0])
        conds.append((syms[0], m // math.gcd(m, rest)))
    return list(dict.fromkeys(conds))


def _nonneg(e: E.Expr, extents: set[str], vars_: set[str]) -> bool:
    """Whether ``e`` is never negative: constants, tensor extents and the
    variables of ``vars_`` are not, and neither are sums, products, floor
    quotients, minima of such, maxima with one, and remainders by a positive
    constant."""
    if isinstance(e, E.Const):
        return e.value >= 0
    if isinstance(e, E.Sym):
        return e.name in extents
    if isinstance(e, E.Var):
        return e.name in vars_
    if isinstance(e, E.Add):
        return all(_nonneg(t, extents, vars_) for t in e.terms)
    if isinstance(e, E.Mul):
        return all(_nonneg(f, extents, vars_) for f in e.factors)
    if isinstance(e, E.Mod):
        return (isinstance(e.b, E.Const) and e.b.value > 0) or (
            _nonneg(e.a, extents, vars_) and _nonneg(e.b, extents, vars_))
    if isinstance(e, E.FloorDiv):
        return _nonneg(e.a, extents, vars_) and _nonneg(e.b, extents, vars_)
    if isinstance(e, E.MinMax):
        f = all if e.op == "min" else any
        return f(_nonneg(x, extents, vars_) for x in (e.a, e.b))
    return False


def _indexes_local(s: L.For) -> bool:
    """Whether ``s``'s body indexes a thread's register array (a ``local``
    buffer) by ``s``'s variable: the loop must then be unrolled whole, so that
    every index is a constant and the array stays in registers."""
    x = E.Var(s.var.name)
    nodes = [y for y in L.evaluated(s.body) if isinstance(y, L.Load)]
    nodes += [st for st in L.walk(s.body) if isinstance(st, L.Store)]
    return any(y.buf.space == "local" and isinstance(y.index, L.IExpr)
               and x in E.leaves(y.index.e) for y in nodes)


def _transcendental(plan: "LanePlan") -> bool:
    """Whether a lane group computes a transcendental (a libm call in double,
    or the exp formula): bound by its arithmetic, not its accesses."""
    return any(isinstance(y, L.Un) and y.op in _TRANSCENDENTAL
               for y in L.evaluated(plan.stmts, nested=False))


def shared_divisors(k: L.Kernel, restrict: bool = True,
                    aliased: frozenset[str] = frozenset()) -> frozenset:
    """Divisors of float divisions (f32, f16, bf16: computed in float) that
    keep their value over the iterations of the innermost loop around every
    division they divide: emitted as ``tn_fdiv_by(a, tn_fdiv_prep(b))``, the
    IEEE quotient from a reciprocal of ``b`` (L-6), whose preparation the CUDA
    compiler computes once per loop since it depends on ``b`` alone. The
    choice is one of speed only: ``tn_fdiv_by`` is the IEEE division for
    every divisor. A divisor counts as invariant in a ``serial`` or
    ``vector`` loop when the loop assigns none of the locals it reads and,
    where it reads memory, stores to no buffer that may be one it reads (the
    same buffer; with ``restrict`` off or both among ``aliased``, any other
    parameter too) and holds no barrier and no tensor-core step; a division
    directly under a thread, parallel or while loop (one iteration per thread,
    or unknown) does not count."""
    params = {p.name for p in k.params}

    def may_alias(a: str, b: str) -> bool:
        if a == b:
            return True
        both = a in params and b in params
        return both and (not restrict or (a in aliased and b in aliased))

    known: dict[int, _LoopFacts] = {}  # by id: every loop lives as long as k

    def facts(loop: L.For) -> _LoopFacts:
        if id(loop) not in known:
            known[id(loop)] = _LoopFacts(loop)
        return known[id(loop)]

    good: set = set()
    bad: set = set()
    for ph in k.phases:
        for s, path in L.walk_paths(ph.body):
            divs = [y for x in L.stmt_exprs(s) for y in L.subexprs(x) if _float_division(y)]
            if not divs:
                continue
            loops = [p for p in path if isinstance(p, (L.For, L.While))]
            loop = loops[-1] if loops else None
            for d in divs:
                ok = (isinstance(loop, L.For) and loop.kind in ("serial", "vector")
                      and _invariant(d.b, facts(loop), may_alias))
                (good if ok else bad).add(d.b)
    return frozenset(good - bad)


def _carried_locals(body: tuple) -> "list[L.LVar] | None":
    """The locals a straight-line body of assignments, run repeatedly, reads
    before it assigns them (in an earlier run: an accumulator), in order of
    first assignment; None when the body has another statement. Stores to a
    thread's register array (``local``) count as assignments when the body
    reads no register array it stores to (a second run then writes the same
    elements again, from the same inputs)."""
    stored = {st.buf.name for st in body if isinstance(st, L.Store)}
    if not all(isinstance(st, L.Assign) or (isinstance(st, L.Store) and st.buf.space == "local"
                                            and st.guard is None and not st.mode)
               for st in body):
        return None
    if any(isinstance(y, L.Load) and y.buf.name in stored for y in L.evaluated(body)):
        return None
    out: dict[str, L.LVar] = {}
    seen: set[str] = set()
    for st in body:
        seen |= {y.var.name for x in L.stmt_exprs(st) for y in L.subexprs(x)
                 if isinstance(y, L.Ref)}
        if isinstance(st, L.Assign) and st.var.name in seen:
            out.setdefault(st.var.name, st.var)
    return list(out.values())


def _has_common_case(x: Any, shared: "set | frozenset") -> bool:
    """Whether expression node ``x`` is emitted as a function with a common
    case (:meth:`Emitter.guarded_lanes`): ``exp`` in float arithmetic, a
    float division by a shared divisor."""
    if isinstance(x, L.Un):
        return x.op == "exp" and x.a.dtype.is_float and x.a.dtype.name != "f64"
    return _float_division(x) and x.b in shared


def _float_division(x: Any) -> bool:
    """Whether ``x`` is a division computed in float (f32, f16, bf16)."""
    return (isinstance(x, L.Bin) and x.op == "div" and x.a.dtype.is_float
            and x.a.dtype.name != "f64")


class _LoopFacts:
    """What :func:`_invariant` asks of a loop, gathered once: the locals it
    assigns (its variable included), the buffers it stores, and whether it
    holds a barrier or a tensor-core step."""

    def __init__(self, loop: L.For):
        inner = list(L.walk(loop.body))
        self.assigned = set(L.assigned(loop.body)) | {loop.var.name}
        self.stored = {st.buf.name for st in inner if isinstance(st, L.Store)}
        self.syncs = any(isinstance(st, (L.Barrier, L.WarpMma)) for st in inner)


def _invariant(x: Any, loop: _LoopFacts, may_alias: Callable[[str, str], bool]) -> bool:
    """Whether expression ``x`` has the same value in every iteration of the
    loop ``loop`` describes (conservatively: see :func:`shared_divisors`;
    ``may_alias(a, b)``: whether buffers ``a`` and ``b`` may share memory)."""
    if L.names(x) & loop.assigned:
        return False
    reads = {y.buf.name for y in L.subexprs(x) if isinstance(y, L.Load)}
    return not reads or not (loop.syncs or any(may_alias(r, w) for r in reads
                                               for w in loop.stored))


def _nonneg_vars(defs: dict[str, list[tuple]], data: set[str], extents: set[str]) -> set[str]:
    """Index locals (``defs`` of :func:`loopir.index_definitions`, less the
    ``data`` ones) that are never negative: program ids, loop variables from
    a non-negative start, and variables every assignment of which is
    non-negative given the others (the least fixed point: a variable defined
    from itself is not included)."""
    out: set[str] = set()
    grew = True
    while grew:
        grew = False
        for v, ds in defs.items():
            if v not in out and v not in data and all(_nonneg(d[1], extents, out) for d in ds):
                out.add(v)
                grew = True
    return out


def cache_hints(k: L.Kernel) -> dict[int, tuple[Any, str]]:
    """The L2 policy of the global loads of ``k`` (``Schedule.cache_hints``):
    ``id`` of a :class:`~tilenest.lowering.loopir.Load` node -> (the node,
    the prelude function that loads a wide group with that policy).

    A tensor read at more than one site of the program, in program order
    (phases in order, statements in pre-order): every site but the last
    keeps the lines in the L2 (``tn_vload_keep``, ``evict_last``) for a site
    that reads them again, the last site streams (``tn_vload_last``: no later
    use); a tensor read at one site keeps the default. A hint changes
    which lines the L2 evicts first, never a value, so a site order that is
    not the execution order (loops around several sites) costs at most
    speed."""
    sites: dict[str, list] = {}
    for ph in k.phases:
        for x in L.evaluated(ph.body):
            if isinstance(x, L.Load) and x.buf.space == "global":
                group = sites.setdefault(x.buf.name, [])
                if all(y is not x for y in group):
                    group.append(x)
    out: dict[int, tuple[Any, str]] = {}
    for group in sites.values():
        if len(group) > 1:
            for x in group[:-1]:
                out[id(x)] = (x, "tn_vload_keep")
            out[id(group[-1])] = (group[-1], "tn_vload_last")
    return out


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
