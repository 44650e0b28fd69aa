"""NVIDIA's extension rules of the SIMT emitter core: tensor cores (``mma.sync``
with ``ldmatrix``, Hopper's ``wgmma``), asynchronous copies (``cp.async``) and
L2 cache policies.

:class:`CudaEmitter` is the core :class:`~..simt.emitter.Emitter` in the
:data:`~.dialect.CUDA` spelling, with these rules added: the ``WarpMma``
statement rule for the lanes' form, the loop form keeping tensor-core
accumulators resident in registers, and the hooks the core calls at fixed
points (waits before a block barrier, direct shared-memory copies of a wide
group, hinted wide loads and streaming stores, the shared-window addresses a
phase needs, the ``wgmma`` wrappers a source needs). Everything here is an
instruction other SIMT targets lack; what they share stays in the core.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ...errors import NotAvailableError
from ...lowering import loopir as L
from ...semantics import expr as E
from ..simt import analysis as A
from ..simt.analysis import LanePlan
from ...lowering.bulk_copy import BARRIERS, standing
from ...lowering.warp_roles import ROLE_BARRIERS, in_roles
from ..simt.emitter import Emitter
from .dialect import CUDA
from .tensormaps import MapSpec


class CudaEmitter(Emitter):
    """CUDA C++ for one SIMT-form loop-IR kernel: the core's rules in the CUDA
    spelling plus NVIDIA's (see the module docstring)."""

    LOOP_FORMS: ClassVar[tuple[str, ...]] = (*Emitter.LOOP_FORMS, "resident_loop")

    def __init__(self, k: L.Kernel, **kw: Any):
        super().__init__(k, CUDA, **kw)
        #: WarpMma tag -> what to emit of it ("load", "steps", "store"; else whole)
        self.mma_mode: dict[str, str] = {}
        #: whether some store may be a ``cp.async`` copy (waited for at
        #: barriers); those of bulk copies are not
        bulk = {id(x) for ph in k.phases for s in L.walk(ph.body) if standing(s)
                for x in L.walk(s.body)}
        self.has_async = any(isinstance(s, L.Store) and s.mode == "async" and id(s) not in bulk
                             for ph in k.phases for s in L.walk(ph.body))
        #: whether a warpgroup mma (wgmma) reads shared memory
        self.has_group_mma = any(isinstance(s, L.WarpMma) and s.group > 1
                                 for ph in k.phases for s in L.walk(ph.body))
        #: (operand dtype, n, b K-major, a in registers) of each wgmma
        #: instruction wrapper the source needs
        self.wgmma_shapes: set[tuple[str, int, bool, bool]] = set()
        #: arrays the phase being emitted declares at its start, by name: the
        #: A registers of register-A wgmmas, which the instructions may read
        #: until the wait that completes them (for an overlapped one, after
        #: the statement's own block)
        self.phase_arrays: dict[str, str] = {}
        #: shared buffers whose 32-bit base address the phase being emitted
        #: uses (:meth:`saddr`); declared at the phase's start (:meth:`phase_decls`)
        self.shared_bases: set[str] = set()
        #: bulk tensor copies (lowering/bulk_copy.py): the tensor maps the
        #: kernel takes, the completion barriers' buffer and count, the
        #: phases that issue copies and whether the one being emitted does
        self.tensor_maps: list[MapSpec] = []
        self.tma_bars = next((b for b in k.locals if b.name == BARRIERS), None)
        self.tma_phases: set[str] = set()
        self.phase_now: str = ""
        #: warp-specialized rings (lowering/warp_roles.py): their completion
        #: barriers, the phases holding one, and the barrier (address text)
        #: the bulk copies being emitted signal (None: the block-barrier
        #: groups of tma_barriers, issued by thread 0)
        self.role_bars = next((b for b in k.locals if b.name == ROLE_BARRIERS), None)
        self.role_phases: dict[str, "L.Roles"] = {}
        self.role_signal: "str | None" = None
        inside = in_roles(k)
        for ph in k.phases:
            for s in L.walk(ph.body):
                if standing(s):
                    if id(s) not in inside:
                        self.tma_phases.add(ph.name)
                    spec = map_spec(s.bulk)
                    if spec not in self.tensor_maps:
                        self.tensor_maps.append(spec)
                if isinstance(s, L.For) and s.roles is not None:
                    if self.role_phases.setdefault(ph.name, s.roles).stages != s.roles.stages:
                        raise NotAvailableError("internal: specialized rings of one phase "
                                                "with different stages")
        if self.tma_phases and self.tma_bars is None:
            raise NotAvailableError("internal: bulk copies without completion barriers")
        if self.role_phases and self.role_bars is None:
            raise NotAvailableError("internal: specialized rings without completion barriers")

    # -- hooks ------------------------------------------------------------------------------
    def barrier_waits(self, s: L.Barrier) -> list[str]:
        """Before a block barrier: the ``cp.async`` groups and overlapped
        ``wgmma`` groups the barrier's ``keep`` / ``mma_keep`` say must be
        complete."""
        out = []
        if self.phase_now in self.tma_phases:  # bulk copies: the same groups, on
            # completion barriers (lowering/bulk_copy.py)
            M, bars = self.tma_barriers()
            out.append(f"tn_tma_commit_wait<{s.keep}, {M}>({bars}, tn_tma_issued, "
                       "tn_tma_done);")
        if self.has_async:  # the copies since the last barrier form a group;
            # all but the newest `keep` groups complete before it (Barrier.keep)
            out.append(f"tn_cp_async_commit(); tn_cp_async_wait<{s.keep}>();")
        if self.has_group_mma:
            # overlapped warpgroup mmas: all but the mma_keep newest
            # groups complete here (Barrier.mma_keep); shared memory
            # written by this thread (stores, completed copies) is read
            # next by the tensor cores' async proxy
            out.append(f"{self.in_warpgroups(f'tn_wgmma_wait<{s.mma_keep}>();')} "
                       "tn_fence_proxy_async();")
        return out

    def in_warpgroups(self, stmt: str) -> str:
        """``stmt`` (a warpgroup instruction) for the threads of the block's
        whole warpgroups: threads past the last (a specialized ring's
        producer warp) run no warpgroup instruction."""
        whole = self.block_w // 128 * 128
        return stmt if whole >= self.block_w else f"if ({self.d.thread_id} < {whole}u) {stmt}"

    def mma_wait_stmt(self, s: L.MmaWait) -> None:
        """``wgmma.wait_group keep``: the thread's overlapped warpgroup mmas
        but its ``keep`` newest groups complete."""
        self.w(self.in_warpgroups(f"tn_wgmma_wait<{s.keep}>();"))

    def params(self) -> list[tuple[str, str]]:
        """The core's parameters, then one tensor map per :attr:`tensor_maps`."""
        return super().params() + [("const __grid_constant__ tn_tmap", f"tn_map{i}")
                                   for i in range(len(self.tensor_maps))]

    def phase_head(self, ph: L.Phase) -> list[str]:
        self.phase_now = ph.name
        return super().phase_head(ph)

    def loop(self, s: L.For) -> None:
        """A thread loop with a standing bulk-copy permission becomes the
        copy's bulk tensor copies, issued by thread 0 (:meth:`bulk_loop`); a
        ring with a ``Roles`` permission runs warp-specialized
        (:meth:`roles_loop`)."""
        if not self.in_thread and standing(s):
            self.bulk_loop(s)
            return
        if not self.in_thread and s.roles is not None:
            self.roles_loop(s)
            return
        super().loop(s)

    def roles_loop(self, s: L.For) -> None:
        """The ring ``s`` warp-specialized (``loopir.Roles``; its fields are the
        handshake the ``roles.*`` obligations discharge). Step counters run on
        across every execution of the phase's rings (``tn_ring_p`` for the
        producer, ``tn_ring_c`` for each consumer), so step ``n`` of the phase
        uses slot ``n % S`` of the ``full`` and ``empty`` barriers in phase
        ``n / S`` however often a ring runs. The producer warp's first lane
        waits for the release of the slot, announces the step's bytes, issues
        its copies and arrives on ``full``; each consumer thread waits for
        ``full``, issues the step's mmas, completes all but the
        ``release_keep`` newest mma groups and releases the step
        ``release_lag`` back on ``empty``. After the loop the consumers
        complete every mma group and release what they have not, and the
        producer waits for the release of its last steps, so nothing is in
        flight when the roles meet again at the block barrier that follows the
        ring."""
        r = s.roles
        body = s.body
        if not (len(body) >= r.split + 2 and L.is_block_barrier(body[r.split])
                and L.is_block_barrier(body[-1])):
            raise NotAvailableError("internal: a specialized ring without its two barriers")
        S, T = r.stages, r.consumers
        full, empty = self.role_barriers()
        v = self.names(s.var.name)
        lo, hi = self.idx(s.lo), self.idx(s.hi)
        tid = self.d.thread_id
        self.w(f"{{  // warp-specialized ring: {r}")
        self.ind += 1
        self.w(f"if ({tid} >= {T}u) {{  // the producer warp")
        self.ind += 1
        self.w(f"if ({tid} == {T}u) {{")
        self.ind += 1
        self.w(f"for ({v} = {lo}; {v} < {hi}; ++{v}, ++tn_ring_p) {{")
        self.ind += 1
        self.w(f"const unsigned tn_slot = tn_ring_p % {S}u;")
        self.w(f"if (tn_ring_p >= {S}u) tn_mbar_wait({empty} + 8u * tn_slot, "
               f"((tn_ring_p / {S}u) + 1u) & 1u);  // released by step n - {S}")
        self.w(f"const unsigned tn_full = {full} + 8u * tn_slot;")
        self.role_signal = "tn_full"
        self.stmts(r.produce(s))
        self.role_signal = None
        self.w("tn_mbar_arrive(tn_full);")
        self.ind -= 1
        self.w("}")
        self.w(f"for (unsigned tn_n = tn_ring_p > {S}u ? tn_ring_p - {S}u : 0u; tn_n < tn_ring_p; "
               "++tn_n)")
        self.w(f"  tn_mbar_wait({empty} + 8u * (tn_n % {S}u), (tn_n / {S}u) & 1u);")
        self.ind -= 1
        self.w("}")
        # the warp reconverges before the aligned instructions after the ring
        self.w("__syncwarp(0xffffffffu);")
        self.ind -= 1
        self.w("} else {  // the consumers")
        self.ind += 1
        self.w("const unsigned tn_first = tn_ring_c;")
        self.w(f"for ({v} = {lo}; {v} < {hi}; ++{v}, ++tn_ring_c) {{")
        self.ind += 1
        if r.wait_full:
            self.w(f"tn_mbar_wait({full} + 8u * (tn_ring_c % {S}u), (tn_ring_c / {S}u) & 1u);")
        self.stmts(r.consume(s))
        self.w(f"tn_wgmma_wait<{r.release_keep}>();")
        lag = r.release_lag
        self.w(f"if (tn_ring_c >= tn_first + {lag}u) tn_mbar_arrive({empty} + 8u * "
               f"((tn_ring_c - {lag}u) % {S}u));")
        self.ind -= 1
        self.w("}")
        self.w("tn_wgmma_wait<0>();")
        self.w(f"for (unsigned tn_n = tn_ring_c > tn_first + {lag}u ? tn_ring_c - {lag}u : "
               "tn_first; tn_n < tn_ring_c; ++tn_n)")
        self.w(f"  tn_mbar_arrive({empty} + 8u * (tn_n % {S}u));")
        self.ind -= 1
        self.w("}")
        self.ind -= 1
        self.w("}")

    def role_barriers(self) -> tuple[str, str]:
        """The shared-window addresses of the specialized rings' ``full`` and
        ``empty`` completion barriers."""
        S = int(self.role_bars.size.value) // 2
        return (self.saddr(self.role_bars, E.Const(0)), self.saddr(self.role_bars, E.Const(S)))

    def bulk_loop(self, s: L.For) -> None:
        """``s``'s box (:class:`~tilenest.lowering.loopir.BulkCopy`) as one
        ``cp.async.bulk.tensor`` per 128-byte panel, issued by thread 0 on
        the completion barrier of the group being formed, after announcing
        the group's bytes (``tn_mbar_expect``); in a specialized ring's
        producer, by the thread running it, on the ring's ``full`` slot
        (:attr:`role_signal`)."""
        bc = s.bulk
        lay = bc.layout
        n = self.tensor_maps.index(map_spec(bc))
        last = len(bc.shape) - 1
        if self.role_signal is not None:
            self.w(f"{{  // {bc}")
            self.w(f"  const unsigned tn_bar = {self.role_signal};")
        else:
            M, bars = self.tma_barriers()
            self.w(f"if ({self.d.thread_id} == 0) {{  // {bc}")
            self.w(f"  const unsigned tn_bar = {bars} + 8u * (tn_tma_issued % {M}u);")
        self.w(f"  const tn_tmap* const tn_m = &tn_map{n};")
        self.w(f"  tn_mbar_expect(tn_bar, {lay.rows * lay.cols * lay.itemsize}u);")
        for p in range(lay.cols // lay.panel):
            coords = [E.add(o, p * lay.panel) if d == last else o
                      for d, o in enumerate(bc.origin)]
            cs = ", ".join(f"(int)({self.idx(c)})" for c in reversed(coords))
            dst = self.saddr(bc.dst, E.add(bc.at, p * lay.panel))
            self.w(f"  {{ const unsigned tn_dst = {dst}; TN_TMA_LOAD({len(coords)}, {cs}); }}")
        self.w("}")

    def tma_barriers(self) -> tuple[int, str]:
        """The number of completion barriers and their shared-window address."""
        return int(self.tma_bars.size.value), self.saddr(self.tma_bars, E.Const(0))

    def group_copies(self, plan: LanePlan) -> dict:
        """The asynchronous stores of a wide group that copy a widened load
        unchanged: one ``cp.async`` each."""
        V = plan.V
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
        return direct

    def store_stmt(self, s: L.Store) -> None:
        """An asynchronous store in a thread loop that copies one element of
        4, 8 or 16 bytes unchanged from global memory into a shared buffer is
        one ``cp.async`` (the element's load then waits on nothing in the
        thread, as a wide group's copies do, :meth:`group_copies`); any other
        store as the SIMT emitter stores it."""
        ld = s.value
        if not (s.mode == "async" and self.in_thread and s.guard is None
                and s.buf.space == "shared" and isinstance(s.index, L.IExpr)
                and isinstance(ld, L.Load) and ld.buf.space == "global" and ld.guard is None
                and isinstance(ld.index, L.IExpr) and ld.buf.dtype == s.buf.dtype
                and s.buf.dtype.itemsize in (4, 8, 16)):
            super().store_stmt(s)
            return
        self.w(f"tn_cp_async<{s.buf.dtype.itemsize}>({self.saddr(s.buf, s.index.e)}, "
               f"&{self.elem(ld.buf, ld.index.e)});")

    def wide_load_fn(self, node: L.Load) -> str:
        """A hinted global load (:func:`analysis.cache_hints`) keeps its lines
        in the L2 (``tn_vload_keep``) or streams them (``tn_vload_last``)."""
        hint = self.load_hints.get(id(node))
        return f"tn_vload_{hint[1]}" if hint is not None else self.d.vload

    def wide_store_fn(self, node: L.Store) -> str:
        """Global stores stream past the L2 under ``Schedule.cache_hints``."""
        if self.stream_stores and node.buf.space == "global":
            return "tn_vstore_stream"
        return self.d.vstore

    def phase_decls(self, layout: list) -> list[str]:
        """The shared-window base of each buffer the phase addresses as such
        (``cp.async`` destinations, ``wgmma`` operands), converted once; the
        arrays of :attr:`phase_arrays`."""
        out = [f"const unsigned {self.buf(b)}_s = tn_smem_addr({self.buf(b)});"
               for b, _ in layout if b.name in self.shared_bases]
        self.shared_bases = set()
        out += self.phase_arrays.values()
        self.phase_arrays = {}
        inits = []
        if self.phase_now in self.tma_phases:
            # the completion barriers, one arrival per phase, before any copy
            # (their base is declared above: the body addressed them)
            M, bars = int(self.tma_bars.size.value), f"{self.buf(self.tma_bars)}_s"
            out.append("unsigned tn_tma_issued = 0u, tn_tma_done = 0u;")
            inits.append(f"  for (unsigned i = 0; i < {M}u; ++i) tn_mbar_init({bars} + 8u * i, 1u);")
        r = self.role_phases.get(self.phase_now)
        if r is not None:
            # a specialized ring's full slots (the producer's one arrival and
            # the copies' bytes) and empty slots (one arrival per consumer)
            bars = f"{self.buf(self.role_bars)}_s"
            S = int(self.role_bars.size.value) // 2
            out.append("unsigned tn_ring_p = 0u, tn_ring_c = 0u;  // steps of the rings so far")
            inits.append(f"  for (unsigned i = 0; i < {S}u; ++i) {{ tn_mbar_init({bars} + 8u * i, "
                         f"1u); tn_mbar_init({bars} + 8u * ({S}u + i), {r.consumers}u); }}")
        if inits:
            out += [f"if ({self.d.thread_id} == 0) {{", *inits, "  tn_mbar_init_fence();", "}",
                    self.d.barriers["block"]]
        return out

    def preamble(self) -> list[str]:
        """The ``wgmma`` instruction wrappers of the shapes the source uses."""
        return [line for dt, n, kb, ra in sorted(self.wgmma_shapes)
                for line in wgmma_wrapper(dt, n, kb, ra)]

    # -- tensor cores -----------------------------------------------------------------------
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

    def tensor_mma(self, s: L.WarpMma) -> None:
        """A ``WarpMma`` on the tensor cores: the lane's accumulator fragments
        (``m/16 x n/8`` blocks of 4 floats, the ``mma.m16n8k16`` layout, which
        ``m16n8k32`` shares) are loaded into registers, then per step (16
        deep, 32 for FP8 operands: 16 bytes of each fragment row) every block
        of ``a`` and pair of blocks of ``b`` comes from shared memory by
        ``ldmatrix.x4``
        (transposed where the buffer is contiguous along the other axis than
        the fragment's register pairs) and each 16 x 8 block is one
        ``mma.sync``; the fragments are stored back at the end. Inside a loop
        that keeps them resident (:meth:`resident_loop`) only the steps are
        emitted, or only the load or the store. The lone-thread form (no
        lane) is its reference loop nest."""
        if s.lane is None or not self.in_thread:
            self.mma_stmt(s)  # the core rule: its reference loop nest
            return
        if s.group > 1:
            self.group_mma(s)
            return
        mode = self.mma_mode.get(s.tag, "whole")
        ta, tb = s.a.buf.dtype, s.b.buf.dtype
        # a step is 16 bytes of contraction per fragment row: 16 deep for 16-bit
        # operands (m16n8k16), 32 for FP8 (m16n8k32, "tn_mma_<a>_<b>")
        ks = 32 if ta.is_fp8 else 16
        MT, NT, KS = s.m // 16, s.n // 8, s.k // ks
        fn = f"tn_mma_{operand_kind(ta, tb)}"
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
            self.w(self.d.unroll)
            self.w(f"for (int {u}_k = 0; {u}_k < {KS}; ++{u}_k) {{")
            self.ind += 1
            self.w(f"unsigned {u}_fa[{MT}][4], {u}_fb[{NT}][2], {u}_t[4];")
            for p in range(MT):
                if s.a.lane_cols:  # the lane's own cells of column blocks 2 kk, 2 kk + 1
                    a, first = self.buf(s.a.buf), f"{u}_oa + {4 * p * (s.k // 8)} + 8 * {u}_k"
                    for j in range(4):
                        self.w(f"{u}_fa[{p}][{j}] = (unsigned)tn_get16({a}[{first} + {2 * j}]) "
                               f"| ((unsigned)tn_get16({a}[{first} + {2 * j + 1}]) << 16);")
                    continue
                self.w(self.ldsm(s.a, u, f"{u}_fa[{p}]", f"{16 * p}", f"{ks} * {u}_k", pair="j")
                       + ";")
            for q2 in range(NT // 2):
                self.w(self.ldsm(s.b, u, f"{u}_t", f"{ks} * {u}_k", f"{16 * q2}", pair="i") + ";")
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
        per 16-deep step (32-deep for FP8) one ``wgmma.mma_async``
        m64n``n``k16 (k32) reading both operands from shared memory through
        matrix descriptors, committed as one group; then a wait for all of
        them, so the statement is complete (its shared reads too) when it
        ends -- unless it is overlapped
        (``WarpMma.overlap``), when the block barriers' waits complete it
        (``tn_wgmma_wait<mma_keep>`` before each ``__syncthreads``).

        Descriptors (PTX ISA, "matrix descriptor"; 128-byte swizzle mode): ``a``
        is K-major -- 8-row groups 1024 bytes apart (the stride offset), a
        16-deep step 32 bytes further in its 128-byte panel row, the next panel
        ``rows x 128`` bytes on; ``b`` is MN-major (``imm-trans-b = 1``) -- its
        64-column panels ``rows x 128`` bytes apart (the leading offset), 8-row
        groups 1024 bytes apart, a step ``16 x 128`` bytes on; an FP8 ``b``
        is K-major like ``a`` (stored ``n x k``; the 8-bit instruction has no
        transpose), and an FP8 step is 32 deep, 32 bytes on in the panel row
        of both. Both tiles start at a 1024-byte atom (rows a multiple of 8,
        columns of a panel; the lowering's tiles do) of a 1024-byte aligned
        buffer. The accumulator
        is the thread's ``n/2`` registers in the instruction's order
        (``loopir.lane_cell``): the lane fragment itself, or a copy of the
        thread's cells of ``c``.

        A 16-bit ``a`` that is a lane fragment (``a.lane_cols``: the thread's
        ``local`` cells of the ``64 x k`` tile) is read from registers (the
        register-A form, ``tn_wgmma_<dt>_n<n>_ra``): step ``kk``'s four A
        registers are the thread's cells of column blocks ``2 kk`` and ``2 kk
        + 1``, ``offset + 8 kk`` on, two to a register, the first in the low
        half (the ``mma.sync`` order); ``a`` then has no descriptor and no
        shared layout. All steps' registers are packed before the fence (a
        register written between the fence and its wgmma makes ptxas insert
        another fence there), into an array of the phase (:attr:`phase_arrays`:
        the instruction may read it, like the accumulator, until the wait
        that completes it). An overlapped one must therefore be complete
        before the statement runs again, which packs the registers anew (the
        emulator reports a write of them before the wait)."""
        la, lb = s.a.buf.layout, s.b.buf.layout
        ra = bool(s.a.lane_cols)  # a in the thread's registers
        if lb is None or s.m != 64 or (la is None and not ra):
            raise NotAvailableError("a warpgroup mma needs 64-row tiles of swizzled shared "
                                    "operands", hint="use mma_unit='tensor'")
        fp8 = s.a.buf.dtype.is_fp8
        if ra and fp8:
            raise NotAvailableError("a warpgroup mma of FP8 operands reads a from swizzled "
                                    "shared memory only, not from the threads' registers",
                                    hint="stage the FP8 a tile in shared memory, or use "
                                    "mma_unit='tensor'")
        dt = operand_kind(s.a.buf.dtype, s.b.buf.dtype)
        kb = fp8 or s.b.si == 1  # b K-major: stored n x k (FP8 always)
        self.wgmma_shapes.add((dt, s.n, kb, ra))
        fn = wgmma_name(dt, s.n, kb, ra)
        u = self.names(s.tag, "mma")
        isz = max(1, s.a.buf.dtype.itemsize)
        step = 32 if fp8 else 16  # the instruction's depth: 32 bytes of a row either way
        frag = bool(s.c.lane_cols)
        self.w(f"{{  // group_mma {s.m}x{s.n}x{s.k}: {s.c} += {s.a} * {s.b}")
        self.ind += 1
        self.w(f"const int {u}_l = (int)({self.idx(s.lane)});")
        # one descriptor per shared operand; a later step adds its byte offset
        # / 16 to the address field (tn_wgmma_desc_at). A K-major b is laid
        # out as a.
        blead = 16 if kb else lb.rows * 128
        bdesc = f"tn_wgmma_desc({self.saddr(s.b.buf, s.b.offset)}, {blead}u, 1024u)"
        if ra:
            self.w(f"const tn_u64 {u}_b = {bdesc};")
            self.w(f"const {self.it} {u}_oa = {self.idx(s.a.offset)};")
            # register i of the steps (step i / 4, register i % 4): cells 2 i, 2 i + 1
            regs, a = 4 * (s.k // step), self.buf(s.a.buf)
            self.phase_arrays[f"{u}_ra"] = f"unsigned {u}_ra[{regs // 4}][4];"
            self.w(self.d.unroll)
            self.w(f"for (int {u}_i = 0; {u}_i < {regs}; ++{u}_i)")
            self.w(f"  {u}_ra[{u}_i / 4][{u}_i % 4] = (unsigned)tn_get16({a}[{u}_oa + 2 * {u}_i]) "
                   f"| ((unsigned)tn_get16({a}[{u}_oa + 2 * {u}_i + 1]) << 16);")
        else:
            self.w(f"const tn_u64 {u}_a = tn_wgmma_desc({self.saddr(s.a.buf, s.a.offset)}, "
                   f"16u, 1024u), {u}_b = {bdesc};")
        if frag:
            d = f"&{self.buf(s.c.buf)}[{self.idx(s.c.offset)}]"
        else:
            d = f"{u}_d"
            self.w(f"const {self.it} {u}_oc = {self.idx(s.c.offset)};")
            self.w(f"float {u}_d[{s.n // 2}];")
            if not s.fresh:
                self.group_cells(s, u, load=True)
        # the fence orders the earlier writes of the registers the steps read
        # (the accumulator, a's) before them
        self.w("tn_wgmma_fence();")
        for j in range(s.k // step):
            k0 = step * j
            bo = (k0 // lb.panel) * lb.rows * 128 + (k0 % lb.panel) * isz if kb else k0 * 128
            sd = 0 if s.fresh and j == 0 else 1  # scale-d: a fresh accumulator's first step
            if ra:
                self.w(f"{fn}({d}, {u}_ra[{j}], tn_wgmma_desc_at({u}_b, {bo}u), {sd});")
                continue
            ao = (k0 // la.panel) * la.rows * 128 + (k0 % la.panel) * isz
            self.w(f"{fn}({d}, tn_wgmma_desc_at({u}_a, {ao}u), "
                   f"tn_wgmma_desc_at({u}_b, {bo}u), {sd});")
        # an overlapped mma completes at a later barrier (Barrier.mma_keep)
        # or wait (MmaWait)
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
            self.w(self.d.unroll)
            self.w(f"for (int {u}_{x} = 0; {u}_{x} < {n}; ++{u}_{x})")
        ws = self.d.warp_size  # each warp of the group holds 16 rows
        row = f"(16 * ({u}_l >> {ws.bit_length() - 1}) + (({u}_l & {ws - 1}) >> 2) + 8 * {u}_h)"
        col = f"(8 * {u}_q + 2 * ({u}_l & 3) + {u}_e)"
        at = self.elem(c.buf, f"{u}_oc + {row} * {c.si}{self.sfx} + {col} * {c.sj}{self.sfx}")
        reg = f"{u}_d[4 * {u}_q + 2 * {u}_h + {u}_e]"
        self.w(f"  {reg} = {at};" if load else f"  {at} = {reg};")

    def mma_cells(self, s: L.WarpMma, u: str, load: bool) -> None:
        """Copy the lane's accumulator elements between ``c`` and its
        fragment registers ``u_d`` (``load``: into the registers)."""
        c, cb = s.c, self.buf(s.c.buf)
        for x, n in (("p", s.m // 16), ("n", s.n // 8), ("h", 2), ("e", 2)):
            self.w(self.d.unroll)
            self.w(f"for (int {u}_{x} = 0; {u}_{x} < {n}; ++{u}_{x})")
        at = (f"{cb}[{u}_oc + (16 * {u}_p + {u}_g + 8 * {u}_h) * {c.si}{self.sfx} + "
              f"(8 * {u}_n + 2 * {u}_q + {u}_e) * {c.sj}{self.sfx}]")
        reg = f"{u}_d[{u}_p][{u}_n][2 * {u}_h + {u}_e]"
        self.w(f"  {reg} = {at};" if load else f"  {at} = {reg};")

    def ldsm(self, f: L.Frag, u: str, regs: str, i0: str, j0: str, pair: str) -> str:
        """The ``ldmatrix.x4`` call loading the four 8 x 8 blocks ``(bi, bj)``
        of 16-bit units of the block of ``f`` at ``(i0, j0)`` (lane ``8 (2 bj +
        bi) + r`` gives row ``r`` of its block along ``f``'s strided axis), so
        that register ``2 bj + bi`` holds pairs along axis ``pair``. A block
        is 16 x 16 elements of a 16-bit type, 16 x 32 of an 8-bit one (a row
        of 8 units is 16 elements along the contiguous axis; FP8 operands are
        never transposed, :func:`~tilenest.lowering.mma.tensor_plan`)."""
        contiguous = "j" if f.sj == 1 else "i"
        wide = 16 // max(1, f.buf.dtype.itemsize)  # elements in 8 units (16 bytes)
        di = f"{8 if contiguous == 'j' else wide} * {u}_bi" + (
            f" + {u}_r" if contiguous == "j" else "")
        dj = f"{8 if contiguous == 'i' else wide} * {u}_bj" + (
            f" + {u}_r" if contiguous == "i" else "")
        fn = "tn_ldsm_x4" if contiguous == pair else "tn_ldsm_x4_t"
        off = f"{u}_o{'a' if pair == 'j' else 'b'}"
        at = (f"{off} + ({i0} + {di}) * {f.si}{self.sfx} + ({j0} + {dj}) * {f.sj}{self.sfx}")
        return f"{fn}({regs}, {self.buf(f.buf)} + ({at}))"

    def saddr(self, b: L.Buffer, index: "str | E.Expr") -> str:
        """The 32-bit shared-window address of logical element ``index`` of
        the shared buffer ``b``: its base address (taken once per kernel,
        :meth:`phase`) plus the byte offset of its physical position. The
        same address as ``tn_smem_addr(&elem)``, without converting a generic
        pointer at every use."""
        self.shared_bases.add(b.name)
        isz = max(1, b.dtype.itemsize)
        return f"({self.buf(b)}_s + {isz}u * (unsigned)({self.position(b, index)}))"



def map_spec(bc: L.BulkCopy) -> MapSpec:
    """The tensor map bulk copy ``bc`` reads through."""
    return MapSpec(bc.src.arg, bc.src.name, bc.shape, bc.box(), bc.dst.dtype.itemsize)


#: the PTX names of the FP8 formats (``mma.sync`` and ``wgmma`` operand types)
_PTX_FP8 = {"f8e4m3fn": "e4m3", "f8e5m2": "e5m2"}

CudaEmitter.STMT_RULES = {**Emitter.STMT_RULES, L.WarpMma: "tensor_mma"}


def operand_kind(a: Any, b: Any) -> str:
    """The operand kind of a tensor-core mma (``mma.sync`` or ``wgmma``) on
    dtypes ``a`` and ``b``, as its prelude function or wrapper names it:
    ``f16``, ``bf16``, or the two FP8 formats' PTX names joined
    (``e4m3_e5m2``)."""
    return f"{_PTX_FP8[a.name]}_{_PTX_FP8[b.name]}" if a.is_fp8 else a.name


def wgmma_name(dt: str, n: int, kb: bool, ra: bool = False) -> str:
    """The wrapper of :func:`wgmma_wrapper` for these operands (``_ra``: a
    16-bit ``a`` in registers; ``_kb``: a 16-bit ``b`` read K-major)."""
    return (f"tn_wgmma_{dt}_n{n}" + ("_ra" if ra else "")
            + ("_kb" if kb and "_" not in dt else ""))


def wgmma_wrapper(dt: str, n: int, kb: bool = False, ra: bool = False) -> list[str]:
    """The source lines defining ``tn_wgmma_<dt>_n<n>[_kb](d, desc_a, desc_b, sd)``:
    ``d = a * b + (sd ? d : 0)`` for one step of a warpgroup (64 x ``n`` x 16 for 16-bit
    operands, ``dt`` ``f16`` or ``bf16``; 64 x ``n`` x 32 for FP8, ``dt`` the
    two formats as :func:`operand_kind` names them), ``d`` the thread's ``n/2``
    accumulator registers, ``a`` K-major and ``b`` MN-major (transposed) or,
    with ``kb``, K-major (stored ``n x k``; FP8 always, the instruction takes
    no transpose for 8-bit types) in shared memory. On the device one
    ``wgmma.mma_async`` (asynchronous: ``tn_wgmma_commit``/``tn_wgmma_wait0``
    complete it); in the emulator a collective of each warp computing its 16
    rows (``tn_cuda_shim.h``; kind bit 8: a 16-bit ``b`` read K-major).

    With ``ra`` (16-bit operands only) it is the register-A form
    ``tn_wgmma_<dt>_n<n>_ra[_kb](d, a, desc_b, sd)``: ``a`` the thread's four A
    registers of the step (``unsigned[4]``, each two 16-bit elements, the
    first in the low half; the PTX fragment of ``a`` is per warp
    ``mma.m16n8k16``'s, warp ``w`` of the group holding rows ``16 w ..
    16 w + 15``); the instruction has no ``imm-trans-a`` operand then. The
    emulator's entry is ``tn_emu::wgmma_ra_at`` (kind bit 16)."""
    if ra and "_" in dt:
        raise NotAvailableError("a warpgroup mma of FP8 operands reads a from swizzled shared "
                                "memory only", hint="stage the FP8 a tile in shared memory")
    name = wgmma_name(dt, n, kb, ra)
    regs = n // 2
    outs = ", ".join(f"%{i}" for i in range(regs))
    cons = ", ".join(f'"+f"(d[{i}])' for i in range(regs))
    if "_" in dt:  # FP8: kind code 2 + (a e5m2) + 2 (b e5m2) for the emulator
        fa, fb = dt.split("_")
        kind = 2 + (fa == "e5m2") + 2 * (fb == "e5m2")
        shape, types, imms = f"m64n{n}k32", f"{fa}.{fb}", "p, 1, 1"
    else:
        kind = (1 if dt == "bf16" else 0) | (8 if kb else 0)
        shape, types = f"m64n{n}k16", f"{dt}.{dt}"
        # scale-d, imm-scale-a, imm-scale-b, [imm-trans-a,] imm-trans-b
        imms = f"p, 1, 1, {0 if kb else 1}" if ra else f"p, 1, 1, 0, {0 if kb else 1}"
    # the emulator's collective adds into d: scale-d 0 zeroes the thread's
    # registers first
    zero = f"if (!(sd)) for (int tn_z = 0; tn_z < {regs}; ++tn_z) (d)[tn_z] = 0.0f;"
    if ra:
        # operands: d (regs), the four A registers, desc_b, the scale-d flag
        ins = ", ".join(f"%{regs + j}" for j in range(4))
        emulated = f"tn_emu::wgmma_ra_at(__LINE__, {kind}, {n}, (d), (a), (db))"
        return [
            "#ifdef TN_EMULATE",
            f"#define {name}(d, a, db, sd) do {{ {zero} {emulated}; }} while (0)",
            "#else",
            f"TN_FN void {name}(float* d, const unsigned* a, tn_u64 db, int sd) {{",
            '  asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %' + str(regs + 5) + ', 0;\\n"',
            f'               "wgmma.mma_async.sync.aligned.{shape}.f32.{types} "',
            f'               "{{{outs}}}, "',
            f'               "{{{ins}}}, %{regs + 4}, {imms};\\n}}\\n"',
            f"               : {cons}",
            '               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(sd));',
            "}",
            "#endif",
            "",
        ]
    return [
        "#ifdef TN_EMULATE",
        f"#define {name}(d, da, db, sd) do {{ {zero} "
        f"tn_emu::wgmma_at(__LINE__, {kind}, {n}, (d), (da), (db)); }} while (0)",
        "#else",
        f"TN_FN void {name}(float* d, tn_u64 da, tn_u64 db, int sd) {{",
        '  asm volatile("{\\n.reg .pred p;\\nsetp.ne.b32 p, %' + str(regs + 2) + ', 0;\\n"',
        f'               "wgmma.mma_async.sync.aligned.{shape}.f32.{types} "',
        f'               "{{{outs}}}, "',
        f'               "%{regs}, %{regs + 1}, {imms};\\n}}\\n"',
        f"               : {cons}",
        '               : "l"(da), "l"(db), "r"(sd));',
        "}",
        "#endif",
        "",
    ]
