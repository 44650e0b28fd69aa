"""The Metal rules of the SIMT emitter core: what a Metal kernel function
takes and how the operations that CUDA evaluates through f64 are computed
without it.

:class:`MetalEmitter` is the core :class:`~..simt.emitter.Emitter` in the
:data:`~.dialect.METAL` spelling. Its parameters are the argument contract
of :mod:`.arguments` (tensors, one ``constant`` struct of scalars and
symbols, the status word), then ``tn_smem`` when the phase uses shared
memory, then the five position builtins (:data:`BUILTINS`). The symbols and
scalars are read from the struct at the function's start. 16-bit floats are
Metal's ``half`` and ``bfloat``, computed in float. Narrow
transcendentals, ``pow``, ``atan2`` and the conversions between floats and
64-bit integers call the float-only functions of ``tn_mathf.h``; a value or
operation of dtype f64 is refused. Lane collectives are ``simd_shuffle_xor``
over a full simdgroup: a shuffle of another mode, a partial lane mask, a
lane offset not below the group's width, or a threadgroup that is not whole
simdgroups is refused (Metal's collectives take no mask: there is nothing
exact to write). A matrix-unit step of a simdgroup (an opaque ``WarpMma``)
is written with 8 x 8 simdgroup matrices (:meth:`MetalEmitter.simdgroup_mma`);
its lone-thread form is the core's reference loop nest, and a tile in
NVIDIA's fragment layout is refused.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from ...errors import NotAvailableError
from ...lowering import loopir as L
from ...semantics import dtypes as D
from ...semantics import expr as E
from ..simt.emitter import Emitter
from . import arguments as ARG
from .dialect import LANES, MEM_FLAGS, METAL, no_f64

#: the position builtins every phase function takes, in this order (name,
#: type, Metal attribute)
BUILTINS = (("uint3", "tn_tgpos", "threadgroup_position_in_grid"),
            ("uint3", "tn_tpos", "thread_position_in_threadgroup"),
            ("uint3", "tn_tgsize", "threads_per_threadgroup"),
            ("uint", "tn_lane", "thread_index_in_simdgroup"),
            ("uint", "tn_simd", "simdgroup_index_in_threadgroup"))
#: the threadgroup memory parameter of a phase that uses shared buffers
SMEM_PARAM = "threadgroup uchar* tn_smem [[threadgroup(0)]]"

#: float operations computed by a float-only function of tn_mathf.h (``tnf_<op>``)
MATHF_UNARY = ("exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tanh", "erf",
               "sigmoid", "rsqrt")
MATHF_BINARY = ("pow", "atan2")


class MetalEmitter(Emitter):
    """MSL for one SIMT-form loop-IR kernel (see the module docstring).
    ``args``: the kernel's argument layout (:func:`.arguments.layout`)."""

    def __init__(self, k: L.Kernel, args: ARG.ArgumentLayout, **kw: Any):
        if kw.get("grid_blocks"):
            raise NotAvailableError("a capped grid (Schedule.grid_blocks) has no metal lowering",
                                    hint="leave grid_blocks unset for the metal target")
        kw.pop("hints", None)  # no cache policies on Metal
        kw.pop("min_blocks", None)
        super().__init__(k, METAL, restrict=False, **kw)
        self.args = args
        #: phase name -> whether its function takes ``tn_smem``
        self.uses_shared: dict[str, bool] = {}
        self._phase: L.Phase | None = None
        # the contract's names are taken: the parameters, the builtins
        taken = {t.name for t in args.tensors} | {ARG.ARGS, ARG.STATUS, "tn_smem"}
        taken |= {n for _, n, _ in BUILTINS}
        self.names.used |= taken
        self._tensor_of = {t.buffer: t for t in args.tensors}
        for b in k.globals:
            if b.space == "scalar":
                self.names(b.name, "tn_s")
            else:
                self.names.map[b.name] = self._tensor_of[b.name].name

    # -- the function's head ---------------------------------------------------------
    def params(self) -> list[tuple[str, str]]:
        """The contract's parameters (:meth:`.arguments.ArgumentLayout.msl_struct`),
        each as one declaration, then the builtins."""
        _, text = self.args.msl_struct()
        out = [(p, "") for p in text.split(", ")]
        return out + [(f"{t} {n} [[{a}]]", "") for t, n, a in BUILTINS]

    def param_list(self, ph: L.Phase, params: list[tuple[str, str]]) -> str:
        decls = [t for t, _ in params]
        if self.uses_shared[ph.name]:
            decls.insert(len(decls) - len(BUILTINS), SMEM_PARAM)
        return ", ".join(decls)

    def phase_layout(self, ph: L.Phase, layout: list) -> list:
        return layout if self.uses_shared[ph.name] else []

    def phase(self, ph: L.Phase, layout: list, total: E.Expr) -> Any:
        self.uses_shared[ph.name] = bool(layout) and bool(L.shared_buffers(ph.body))
        self._phase = ph
        return super().phase(ph, layout, total)

    def phase_head(self, ph: L.Phase) -> list[str]:
        """The symbols and scalars read from the struct (a scalar as a
        one-element array, as the loop IR reads it)."""
        out = []
        for s in self.k.syms:
            m = self.args.member("symbol", s)
            out.append(f"const long {self.names.sym(s)}{'_w' if self.narrow_index else ''} = "
                       f"{ARG.ARGS}.{m.name};")
        for b in sorted(self.k.globals, key=lambda b: b.arg):
            if b.space == "scalar":
                m = self.args.member("scalar", b.name)
                v = f"{ARG.ARGS}.{m.name}"
                if b.dtype.is_bool:
                    v = f"(uchar)({v} ? 1 : 0)"
                out.append(f"const {self.d.mem(b.dtype)} {self.buf(b)}[1] = {{{v}}};")
        return out

    def source(self) -> Any:
        """The core's source with the include first and the argument struct
        before the functions."""
        src = super().source()
        lines = src.text.split("\n")
        i = lines.index(self.d.include)
        lines = [lines[i]] + lines[:i] + lines[i + 1:]
        return dataclasses.replace(src, text="\n".join(lines))

    def preamble(self) -> list[str]:
        struct, _ = self.args.msl_struct()
        return struct.rstrip("\n").split("\n") + [""]

    # -- no f64 ----------------------------------------------------------------------
    def from_f64(self, v: str, dt: D.DType) -> str:  # type: ignore[override]
        raise no_f64("a conversion through f64")

    def to_f64(self, v: str, dt: D.DType) -> str:
        raise no_f64("a conversion through f64")

    def wide(self, v: str, dt: D.DType) -> str:
        """``v`` widened exactly to float (a lane of a pack too: Metal's
        packs hold the elements themselves)."""
        return f"tn_widen({v})" if dt.name in ("f16", "bf16") else v

    def float_unary(self, op: str, v: str, dt: D.DType) -> str:
        if dt.name == "f64":
            raise no_f64(f"op '{op}'")
        if dt.name in ("f16", "bf16") and op in ("neg", "abs", "signbit"):
            bits = f"tn_hbits({v})"
            if op == "signbit":
                return f"(({bits} >> 15) != 0u)"
            t = self.d.reg(dt)
            return f"tn_{t}({bits} ^ 0x8000u)" if op == "neg" else f"tn_{t}({bits} & 0x7fffu)"
        if op in MATHF_UNARY:
            return self.narrow(f"tnf_{op}({self.wide(v, dt)})", dt)
        return super().float_unary(op, v, dt)

    def binary(self, op: str, a: str, b: str, dt: D.DType) -> str:
        if dt.name == "f64":
            raise no_f64(f"op '{op}'")
        if op in MATHF_BINARY:
            return self.narrow(f"tnf_{op}({self.wide(a, dt)}, {self.wide(b, dt)})", dt)
        return super().binary(op, a, b, dt)

    def fma_expr(self, x: L.Fma) -> str:
        if x.dtype.name == "f64":
            raise no_f64("a fused multiply-add")
        return super().fma_expr(x)

    def cast(self, v: str, src: D.DType, dst: D.DType) -> str:
        """Float <-> integer conversions in float alone (``tnf_f2i``,
        ``tnf_i64_to_f32`` / ``tnf_u64_to_f32``: exact; to a 16-bit float
        through the round-to-odd float, then one rounding)."""
        if "f64" in (src.name, dst.name):
            raise no_f64(f"a cast from {src.name} to {dst.name}")
        if src == dst or dst.is_bool:
            return super().cast(v, src, dst)
        if src.is_bool:
            v, src = f"((int)({v} ? 1 : 0))", D.i32
        if src.is_float and dst.is_int:
            info = np.iinfo(dst.np)
            lo, hi = self.d.literal(int(info.min), dst), self.d.literal(int(info.max), dst)
            return f"tnf_f2i<{self.d.reg(dst)}>({self.wide(v, src)}, {lo}, {hi})"
        if src.is_int and dst.is_float:
            if dst.name == "f32" and src.bits <= 32:
                return f"((float)({v}))"  # exact for 24 bits; one rounding otherwise
            odd = dst.name != "f32"
            if src.is_signed:
                f = f"tnf_i64_to_f32((long)({v}), {'true' if odd else 'false'})"
            else:
                f = f"tnf_u64_to_f32((ulong)({v}), {'true' if odd else 'false'})"
            return self.narrow(f, dst)
        return super().cast(v, src, dst)

    def bitcast(self, v: str, src: D.DType, dst: D.DType) -> str:
        if "f64" in (src.name, dst.name):
            raise no_f64(f"a bit cast from {src.name} to {dst.name}")
        return super().bitcast(v, src, dst)

    def const_expr(self, x: L.Const) -> str:
        if x.dtype.name == "f64":
            raise no_f64("a constant")
        return super().const_expr(x)

    # -- collectives -----------------------------------------------------------------
    def _full_simdgroups(self, what: str, mode: str, mask: int, width: int,
                         lane: E.Expr | int) -> None:
        """Refuse a collective Metal cannot do exactly (module docstring)."""
        W = self.threads_of[self._phase.name] if self._phase is not None else 0
        off = lane.value if isinstance(lane, E.Const) else lane
        problem = None
        if mode != "xor":
            problem = f"a '{mode}' shuffle (only xor butterflies are emitted)"
        elif mask != L.FULL_MASK:
            problem = f"a partial lane mask {mask:#x} (Metal's simdgroup functions take no mask)"
        elif width > LANES or width & (width - 1):
            problem = f"a lane group of width {width}"
        elif not isinstance(off, int) or not 0 < off < width:
            problem = "a lane offset that is not a constant below the group's width"
        elif W % LANES:
            problem = (f"{W} threads per threadgroup, not whole simdgroups of {LANES} "
                       "(a partial simdgroup's lanes are inactive)")
        if problem:
            raise NotAvailableError(f"{what}: {problem} has no exact metal lowering",
                                    hint="use a block_threads that is a multiple of 32, or "
                                         "a sequential reduction policy")

    def shuffle_stmt(self, s: L.Shuffle) -> None:
        self._full_simdgroups("a lane shuffle", s.mode, s.mask, s.width, s.lane)
        super().shuffle_stmt(s)

    def lane_reduce(self, s: L.LaneReduce) -> None:
        self._full_simdgroups("a lane reduction", "xor", s.mask, s.width, max(1, s.width // 2))
        super().lane_reduce(s)

    # -- simdgroup matrices ----------------------------------------------------------
    def simdgroup_mma(self, s: L.WarpMma) -> None:
        """An opaque ``WarpMma`` of one simdgroup: its ``m/8 x n/8``
        accumulator matrices are loaded from ``c`` into ``simdgroup_matrix``
        registers, then for each 8-deep step the ``m/8`` matrices of ``a``
        and ``n/8`` of ``b`` are loaded and every accumulator takes one
        ``simdgroup_multiply_accumulate``; the accumulators are stored back
        at the end. Every address is the same in all lanes. A simdgroup
        barrier before and after orders the lanes' own accesses against
        the hidden ones (``WarpMma.opaque``)."""
        if s.lane is None or not self.in_thread:
            self.mma_stmt(s)  # the core rule: its reference loop nest
            return
        if not s.opaque or s.group != 1:
            raise NotAvailableError(f"a {s.m}x{s.n}x{s.k} tensor-core tile in NVIDIA's fragment "
                                    "layout has no metal lowering",
                                    hint="use mma_unit='auto' (simdgroup matrices) or "
                                         "mma_unit='simt'")
        for f in (s.a, s.b, s.c):
            if f.buf.space not in ("shared", "global"):
                raise NotAvailableError(f"a simdgroup matrix of the thread-private buffer "
                                        f"{f.buf.name} (they load from threadgroup or device "
                                        "memory)", hint="use mma_unit='simt'")
        MT, NT, KS = s.m // 8, s.n // 8, s.k // 8
        u = self.names(s.tag, "mma")
        mat = "simdgroup_matrix<{}, 8, 8>"
        fence = f"simdgroup_barrier({MEM_FLAGS});"
        self.w(f"{{  // simdgroup mma {s.m}x{s.n}x{s.k}: {s.c} += {s.a} * {s.b}")
        self.ind += 1
        self.w(fence)
        self.w(f"const {self.it} {u}_oa = {self.idx(s.a.offset)}, {u}_ob = "
               f"{self.idx(s.b.offset)}, {u}_oc = {self.idx(s.c.offset)};")
        self.w(f"{mat.format(self.d.reg(s.c.buf.dtype))} {u}_c[{MT}][{NT}];")
        cells = [(p, q) for p in range(MT) for q in range(NT)]
        for p, q in cells:
            self.w(self.matrix_io("load", f"{u}_c[{p}][{q}]", s.c, f"{u}_oc", str(8 * p),
                                  str(8 * q)))
        self.w(self.d.unroll)
        self.w(f"for (int {u}_k = 0; {u}_k < {KS}; ++{u}_k) {{")
        self.ind += 1
        self.w(f"{mat.format(self.d.reg(s.a.buf.dtype))} {u}_a[{MT}];")
        self.w(f"{mat.format(self.d.reg(s.b.buf.dtype))} {u}_b[{NT}];")
        for p in range(MT):
            self.w(self.matrix_io("load", f"{u}_a[{p}]", s.a, f"{u}_oa", str(8 * p),
                                  f"8 * {u}_k"))
        for q in range(NT):
            self.w(self.matrix_io("load", f"{u}_b[{q}]", s.b, f"{u}_ob", f"8 * {u}_k",
                                  str(8 * q)))
        for p, q in cells:
            c = f"{u}_c[{p}][{q}]"
            self.w(f"simdgroup_multiply_accumulate({c}, {u}_a[{p}], {u}_b[{q}], {c});")
        self.ind -= 1
        self.w("}")
        for p, q in cells:
            self.w(self.matrix_io("store", f"{u}_c[{p}][{q}]", s.c, f"{u}_oc", str(8 * p),
                                  str(8 * q)))
        self.w(fence)
        self.ind -= 1
        self.w("}")

    def matrix_io(self, what: str, mat: str, f: L.Frag, base: str, i0: str, j0: str) -> str:
        """``simdgroup_<what>`` of matrix ``mat`` and the 8 x 8 block of
        ``f`` at ``(i0, j0)``: rows along ``f``'s strided axis, or with the
        transpose flag where ``f`` is contiguous along its first axis."""
        at = f"{base} + ({i0}) * {f.si}{self.sfx} + ({j0}) * {f.sj}{self.sfx}"
        ptr = f"{self.buf(f.buf)} + ({at})"
        if f.sj == 1:
            return f"simdgroup_{what}({mat}, {ptr}, {f.si}ul);"
        return f"simdgroup_{what}({mat}, {ptr}, {f.sj}ul, ulong2(0, 0), true);"


MetalEmitter.STMT_RULES = {**Emitter.STMT_RULES, L.WarpMma: "simdgroup_mma"}
