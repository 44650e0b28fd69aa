"""The native worker loop: LLVM IR that runs the chunks of a call's phases on
pool threads, with no Python (and no GIL) between a call's start and its end.

One module per process, generated here and compiled by the JIT like a
kernel; it calls only the POSIX thread functions bound in :mod:`.symbols`.
Its functions (:data:`RUN`, :data:`HELPER`, :data:`STOP`, :data:`INIT`):

* ``i32 tn_run(ptr ctrl, ptr call)`` runs every phase of a *call record* in
  order and returns the status code of the first failing program (0: none):
  the first error of the lowest failing chunk of the first failing phase.
  A phase whose record allows no helpers runs its chunks one after another on
  the calling thread (``ctrl`` is not touched: it may be null); another one
  is *posted* to the control block ``ctrl``, the caller takes chunks like
  any helper, then waits until every chunk is done.
* ``void tn_helper(ptr ctrl, i64 slot, i64 seen)`` is a pool thread's whole
  life: wait for a job newer than generation ``seen``, take its chunks, and
  again, until ``tn_stop``. Between jobs it spins (``ctrl``'s spin count of
  pause instructions), so a call made soon after the last finds it awake,
  then sleeps on a condition variable.
* ``void tn_stop(ptr ctrl)`` asks every helper to return;
* ``i32 tn_init(ptr ctrl, i64 spin)`` initializes a zeroed control block
  (:data:`CONTROL_BYTES`): its mutex, its two condition variables and the
  spin count.

**The job word.** The current job's generation (high 32 bits) and the index
of its next unclaimed chunk (low 32 bits) share one 64-bit word. A thread
claims a chunk by a compare-and-swap of that word from the value it read to
the value plus one. The caller posts a job by writing the job fields, then
storing the word with the next generation and index 0 (a release); only the
caller changes the generation, and only after every chunk of the previous
job is done. So a successful swap from ``(g, i)`` proves job ``g`` was
running with chunk ``i`` unclaimed, and that the job fields the thread read
after loading ``(g, i)`` -- before the swap -- were job ``g``'s: they are
rewritten only once job ``g`` is complete, which needs chunk ``i`` done. A
helper that read a later job's fields, or a mix, fails its swap and starts
over. All job fields are read and written atomically (monotonic), so a
stale read is a wrong value, never undefined behaviour.

**Waking and waiting.** A helper going to sleep increments the sleeper count
under the mutex and sleeps while the generation is unchanged; the caller
stores the new word and then reads the sleeper count (both sequentially
consistent), broadcasting under the mutex when there are sleepers: either
the helper sees the new generation or the caller sees the sleeper, so no
wake-up is lost. The caller's wait for the last chunk mirrors it with the
``waiting`` flag and the done count.

**Chunks.** Chunk ``c`` of a phase of ``n`` programs with step ``s`` runs
programs ``[c*s, min(n, c*s + s))``. Its status line (:data:`STATUS_BYTES`
bytes, its own cache line, since generated code writes the word at every
check) holds the status word (i32 at 0), cleared before the chunk runs, and
the slot of the worker that ran it (i32 at 4; slot 0 is the caller), which
tests read. The local buffers of slot ``k`` are the table of pointers at
``locals[k]``.
"""

from __future__ import annotations

from llvmlite import ir

I1, I32, I64 = ir.IntType(1), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()
VOID = ir.VoidType()

RUN, HELPER, STOP, INIT = "tn_run", "tn_helper", "tn_stop", "tn_init"

#: byte offsets in the control block; each shared word has its own cache line
WORD, DONE, JOB, FLAGS, SLEEPERS, WAITING, MUTEX, COND, DONE_COND = (
    0, 64, 128, 256, 320, 384, 512, 640, 768)
#: STOP and SPIN are i64 slots of the FLAGS line
STOP_AT, SPIN_AT = FLAGS, FLAGS + 8
#: bytes reserved for each pthread mutex and condition variable (40 and 48
#: bytes on glibc and musl, 64 and 48 on macOS)
SYNC_BYTES = 128
CONTROL_BYTES = 896

#: i64 fields of the posted job, at JOB
J_ENTRY, J_ARGS, J_SYMS, J_LOCALS, J_STATUS, J_N, J_STEP, J_NCHUNKS, J_HELPERS = range(9)

#: i64 fields of a call record: a header, then PHASE_FIELDS per phase
C_NPHASES, C_ARGS, C_SYMS, C_LOCALS, C_STATUS = range(5)
C_HEADER = 5
P_ENTRY, P_N, P_STEP, P_NCHUNKS, P_HELPERS = range(5)
PHASE_FIELDS = 5

#: bytes of one chunk's status line
STATUS_BYTES = 64

_ENTRY_TYPE = ir.FunctionType(VOID, [PTR, PTR, PTR, I64, I64, PTR])
_LOW = (1 << 32) - 1


class _Callee:
    """A pointer to a function of a known type, as ``IRBuilder.call`` takes a
    callee (it reads ``function_type``, which an opaque pointer value does not
    carry)."""

    def __init__(self, v: ir.Value, fnty: ir.FunctionType):
        self.v, self.type, self.function_type = v, v.type, fnty

    def get_reference(self) -> str:
        return self.v.get_reference()


class _Gen:
    """Builds the module (one instance per module)."""

    def __init__(self, triple: str):
        self.m = ir.Module(name="tilenest_workloop")
        self.m.triple = triple
        fn = lambda name, ret, *args: ir.Function(self.m, ir.FunctionType(ret, list(args)), name)
        self.lock = fn("pthread_mutex_lock", I32, PTR)
        self.unlock = fn("pthread_mutex_unlock", I32, PTR)
        self.wait = fn("pthread_cond_wait", I32, PTR, PTR)
        self.broadcast = fn("pthread_cond_broadcast", I32, PTR)
        self.mutex_init = fn("pthread_mutex_init", I32, PTR, PTR)
        self.cond_init = fn("pthread_cond_init", I32, PTR, PTR)
        arch = triple.split("-")[0]
        if arch in ("x86_64", "i386", "i686"):
            self.pause_fn, self.pause_args = fn("llvm.x86.sse2.pause", VOID), []
        elif arch in ("aarch64", "arm64"):
            self.pause_fn, self.pause_args = fn("llvm.aarch64.hint", VOID, I32), [
                ir.Constant(I32, 1)]  # YIELD
        else:
            self.pause_fn, self.pause_args = None, []
        self.run_chunk = self._run_chunk()
        self.claim = self._claim()
        self._run()
        self._helper()
        self._stop()
        self._init()

    # -- helpers for the builders --------------------------------------------------
    @staticmethod
    def at(b: ir.IRBuilder, base: ir.Value, offset: int) -> ir.Value:
        return b.gep(base, [ir.Constant(I64, offset)], source_etype=ir.IntType(8))

    def field(self, b: ir.IRBuilder, base: ir.Value, offset: int, index: int) -> ir.Value:
        return self.at(b, base, offset + 8 * index)

    @staticmethod
    def get(b: ir.IRBuilder, p: ir.Value, order: str = "monotonic") -> ir.Value:
        return b.load_atomic(p, order, 8, typ=I64)

    @staticmethod
    def put(b: ir.IRBuilder, v: ir.Value, p: ir.Value, order: str = "monotonic") -> None:
        # the instruction itself: IRBuilder.store_atomic checks a typed pointee
        b._insert(ir.instructions.StoreAtomicInstr(b.block, v, p, order, 8))

    def pause(self, b: ir.IRBuilder) -> None:
        if self.pause_fn is not None:
            b.call(self.pause_fn, self.pause_args)

    def signal(self, b: ir.IRBuilder, ctrl: ir.Value, cond: int) -> None:
        """Broadcast the condition variable at ``cond`` under the mutex."""
        mutex = self.at(b, ctrl, MUTEX)
        b.call(self.lock, [mutex])
        b.call(self.broadcast, [self.at(b, ctrl, cond)])
        b.call(self.unlock, [mutex])

    def function(self, name: str, ret: ir.Type, args: list[ir.Type],
                 internal: bool = False) -> tuple[ir.Function, ir.IRBuilder]:
        f = ir.Function(self.m, ir.FunctionType(ret, args), name)
        if internal:
            f.linkage = "internal"
        return f, ir.IRBuilder(f.append_basic_block("entry"))

    # -- functions ---------------------------------------------------------------------
    def _run_chunk(self) -> ir.Function:
        """``run_chunk(entry, args, syms, locals, n, step, status, c, slot)``:
        clear chunk ``c``'s status line, mark the slot, run its programs."""
        f, b = self.function("run_chunk", VOID, [PTR, PTR, PTR, PTR, I64, I64, PTR, I64, I64],
                             internal=True)
        entry, args, syms, locs, n, step, status, c, slot = f.args
        lo = b.mul(c, step)
        end = b.add(lo, step)
        hi = b.select(b.icmp_signed("<", end, n), end, n)
        line = b.gep(status, [b.mul(c, ir.Constant(I64, STATUS_BYTES))],
                     source_etype=ir.IntType(8))
        b.store(ir.Constant(I32, 0), line)
        b.store(b.trunc(slot, I32), self.at(b, line, 4))
        b.call(_Callee(entry, _ENTRY_TYPE),  # type: ignore[arg-type]
               [args, syms, locs, lo, hi, line])
        b.ret_void()
        return f

    def _claim(self) -> ir.Function:
        """``i64 claim(ctrl, w, slot)``: take and run chunks of the job of
        word ``w``'s generation until none is left (returns 1) or the
        generation changes (returns 0)."""
        f, b = self.function("claim", I64, [PTR, I64, I64], internal=True)
        ctrl, w0, slot = f.args
        gen = b.lshr(w0, ir.Constant(I64, 32))
        word, done = self.at(b, ctrl, WORD), self.at(b, ctrl, DONE)
        w_slot = b.alloca(I64)
        b.store(w0, w_slot)
        loop, swap, retry, run, wake, next_, left, changed = (
            f.append_basic_block(n) for n in
            ("loop", "swap", "retry", "run", "wake", "next", "left", "changed"))
        b.branch(loop)

        b.position_at_end(loop)
        w = b.load(w_slot, typ=I64)
        job = [self.get(b, self.field(b, ctrl, JOB, i)) for i in range(9)]
        nchunks = job[J_NCHUNKS]
        idx = b.and_(w, ir.Constant(I64, _LOW))
        b.cbranch(b.icmp_unsigned(">=", idx, nchunks), left, swap)

        b.position_at_end(swap)
        pair = b.cmpxchg(word, w, b.add(w, ir.Constant(I64, 1)), "acq_rel", "acquire")
        old, ok = b.extract_value(pair, 0), b.extract_value(pair, 1)
        b.store(old, w_slot)
        b.cbranch(ok, run, retry)

        b.position_at_end(retry)
        b.cbranch(b.icmp_unsigned("==", b.lshr(old, ir.Constant(I64, 32)), gen), loop, changed)

        b.position_at_end(run)
        tables = b.inttoptr(job[J_LOCALS], PTR)
        locs = b.load(b.gep(tables, [slot], source_etype=PTR), typ=PTR)
        b.call(self.run_chunk, [b.inttoptr(job[J_ENTRY], PTR), b.inttoptr(job[J_ARGS], PTR),
                                b.inttoptr(job[J_SYMS], PTR), locs, job[J_N], job[J_STEP],
                                b.inttoptr(job[J_STATUS], PTR), idx, slot])
        before = b.atomic_rmw("add", done, ir.Constant(I64, 1), "seq_cst")
        last = b.icmp_unsigned("==", b.add(before, ir.Constant(I64, 1)), nchunks)
        waiting = self.get(b, self.at(b, ctrl, WAITING), "seq_cst")
        b.cbranch(b.and_(last, b.icmp_unsigned("!=", waiting, ir.Constant(I64, 0))), wake,
                  next_)

        b.position_at_end(wake)
        self.signal(b, ctrl, DONE_COND)
        b.branch(next_)

        b.position_at_end(next_)
        w2 = self.get(b, word, "acquire")
        b.store(w2, w_slot)
        b.cbranch(b.icmp_unsigned("==", b.lshr(w2, ir.Constant(I64, 32)), gen), loop, changed)

        b.position_at_end(left)
        b.ret(ir.Constant(I64, 1))
        b.position_at_end(changed)
        b.ret(ir.Constant(I64, 0))
        return f

    def _run(self) -> None:
        f, b = self.function(RUN, I32, [PTR, PTR])
        ctrl, call = f.args
        rec = lambda i: self.get(b, self.field(b, call, 0, i))  # noqa: E731
        nphases, args, syms = rec(C_NPHASES), rec(C_ARGS), rec(C_SYMS)
        tables, status = rec(C_LOCALS), rec(C_STATUS)
        i_slot, c_slot, spin_slot = b.alloca(I64), b.alloca(I64), b.alloca(I64)
        b.store(ir.Constant(I64, 0), i_slot)
        names = ("phase", "body", "serial", "serial_body", "post", "wake", "work", "spin",
                 "spin_more", "sleep", "sleep_loop", "sleep_wait", "woken", "scan", "scan_body",
                 "failed", "next_phase", "ok")
        bb = {n: f.append_basic_block(n) for n in names}
        b.branch(bb["phase"])

        b.position_at_end(bb["phase"])
        i = b.load(i_slot, typ=I64)
        b.cbranch(b.icmp_unsigned("<", i, nphases), bb["body"], bb["ok"])

        b.position_at_end(bb["body"])
        base = b.add(ir.Constant(I64, C_HEADER), b.mul(i, ir.Constant(I64, PHASE_FIELDS)))
        ph = b.gep(call, [base], source_etype=I64)
        pf = lambda k: self.get(b, self.field(b, ph, 0, k))  # noqa: E731
        entry, n, step, nchunks, helpers = (pf(P_ENTRY), pf(P_N), pf(P_STEP), pf(P_NCHUNKS),
                                            pf(P_HELPERS))
        zero = ir.Constant(I64, 0)
        b.store(zero, c_slot)
        alone = b.or_(b.icmp_unsigned("==", helpers, zero),
                      b.icmp_unsigned("<=", nchunks, ir.Constant(I64, 1)))
        b.cbranch(alone, bb["serial"], bb["post"])

        # one chunk after another on this thread, slot 0
        b.position_at_end(bb["serial"])
        c = b.load(c_slot, typ=I64)
        b.cbranch(b.icmp_unsigned("<", c, nchunks), bb["serial_body"], bb["scan"])
        b.position_at_end(bb["serial_body"])
        locs0 = b.load(b.inttoptr(tables, PTR), typ=PTR)
        b.call(self.run_chunk, [b.inttoptr(entry, PTR), b.inttoptr(args, PTR),
                                b.inttoptr(syms, PTR), locs0, n, step, b.inttoptr(status, PTR),
                                c, zero])
        b.store(b.add(c, ir.Constant(I64, 1)), c_slot)
        b.branch(bb["serial"])

        # post the job, wake sleepers, work as slot 0
        b.position_at_end(bb["post"])
        for k, v in ((J_ENTRY, entry), (J_ARGS, args), (J_SYMS, syms), (J_LOCALS, tables),
                     (J_STATUS, status), (J_N, n), (J_STEP, step), (J_NCHUNKS, nchunks),
                     (J_HELPERS, helpers)):
            self.put(b, v, self.field(b, ctrl, JOB, k))
        self.put(b, zero, self.at(b, ctrl, DONE))
        word = self.at(b, ctrl, WORD)
        old = self.get(b, word)
        new = b.shl(b.add(b.lshr(old, ir.Constant(I64, 32)), ir.Constant(I64, 1)),
                    ir.Constant(I64, 32))
        self.put(b, new, word, "seq_cst")
        sleepers = self.get(b, self.at(b, ctrl, SLEEPERS), "seq_cst")
        b.cbranch(b.icmp_unsigned("!=", sleepers, zero), bb["wake"], bb["work"])
        b.position_at_end(bb["wake"])
        self.signal(b, ctrl, COND)
        b.branch(bb["work"])
        b.position_at_end(bb["work"])
        b.call(self.claim, [ctrl, new, zero])
        b.store(zero, spin_slot)
        b.branch(bb["spin"])

        # wait for the chunks helpers took: spin, then sleep
        b.position_at_end(bb["spin"])
        done = self.at(b, ctrl, DONE)
        finished = b.icmp_unsigned("==", self.get(b, done, "acquire"), nchunks)
        b.cbranch(finished, bb["scan"], bb["spin_more"])
        b.position_at_end(bb["spin_more"])
        s = b.load(spin_slot, typ=I64)
        b.store(b.add(s, ir.Constant(I64, 1)), spin_slot)
        self.pause(b)
        limit = self.get(b, self.at(b, ctrl, SPIN_AT))
        b.cbranch(b.icmp_unsigned("<", s, limit), bb["spin"], bb["sleep"])
        b.position_at_end(bb["sleep"])
        mutex = self.at(b, ctrl, MUTEX)
        b.call(self.lock, [mutex])
        self.put(b, ir.Constant(I64, 1), self.at(b, ctrl, WAITING), "seq_cst")
        b.branch(bb["sleep_loop"])
        b.position_at_end(bb["sleep_loop"])
        finished = b.icmp_unsigned("==", self.get(b, self.at(b, ctrl, DONE), "seq_cst"),
                                   nchunks)
        b.cbranch(finished, bb["woken"], bb["sleep_wait"])
        b.position_at_end(bb["sleep_wait"])
        b.call(self.wait, [self.at(b, ctrl, DONE_COND), mutex])
        b.branch(bb["sleep_loop"])
        b.position_at_end(bb["woken"])
        self.put(b, zero, self.at(b, ctrl, WAITING), "seq_cst")
        b.call(self.unlock, [mutex])
        b.branch(bb["scan"])

        # the first failing chunk's status word
        b.position_at_end(bb["scan"])
        b.store(zero, c_slot)
        b.branch(bb["scan_body"])
        b.position_at_end(bb["scan_body"])
        c = b.load(c_slot, typ=I64)
        check, next_bb = f.append_basic_block("check"), bb["next_phase"]
        b.cbranch(b.icmp_unsigned("<", c, nchunks), check, next_bb)
        b.position_at_end(check)
        line = b.gep(b.inttoptr(status, PTR), [b.mul(c, ir.Constant(I64, STATUS_BYTES))],
                     source_etype=ir.IntType(8))
        code = b.load(line, typ=I32)
        b.store(b.add(c, ir.Constant(I64, 1)), c_slot)
        b.cbranch(b.icmp_unsigned("!=", code, ir.Constant(I32, 0)), bb["failed"],
                  bb["scan_body"])
        b.position_at_end(bb["failed"])
        b.ret(code)
        b.position_at_end(next_bb)
        b.store(b.add(i, ir.Constant(I64, 1)), i_slot)
        b.branch(bb["phase"])
        b.position_at_end(bb["ok"])
        b.ret(ir.Constant(I32, 0))

    def _helper(self) -> None:
        f, b = self.function(HELPER, VOID, [PTR, I64, I64])
        ctrl, slot, seen0 = f.args
        seen_slot, spins_slot = b.alloca(I64), b.alloca(I64)
        b.store(seen0, seen_slot)
        zero = ir.Constant(I64, 0)
        b.store(zero, spins_slot)
        names = ("loop", "look", "idle", "spin", "sleep", "sleep_loop", "sleep_check",
                 "sleep_wait", "woken", "job", "skip", "claim", "out")
        bb = {n: f.append_basic_block(n) for n in names}
        word, stop = self.at(b, ctrl, WORD), self.at(b, ctrl, STOP_AT)
        b.branch(bb["loop"])

        b.position_at_end(bb["loop"])
        b.cbranch(b.icmp_unsigned("!=", self.get(b, stop), zero), bb["out"], bb["look"])
        b.position_at_end(bb["look"])
        w = self.get(b, word, "acquire")
        g = b.lshr(w, ir.Constant(I64, 32))
        seen = b.load(seen_slot, typ=I64)
        b.cbranch(b.icmp_unsigned("==", g, seen), bb["idle"], bb["job"])

        b.position_at_end(bb["idle"])
        s = b.load(spins_slot, typ=I64)
        limit = self.get(b, self.at(b, ctrl, SPIN_AT))
        b.cbranch(b.icmp_unsigned("<", s, limit), bb["spin"], bb["sleep"])
        b.position_at_end(bb["spin"])
        b.store(b.add(s, ir.Constant(I64, 1)), spins_slot)
        self.pause(b)
        b.branch(bb["loop"])

        b.position_at_end(bb["sleep"])
        mutex = self.at(b, ctrl, MUTEX)
        b.call(self.lock, [mutex])
        sleepers = self.at(b, ctrl, SLEEPERS)
        b.atomic_rmw("add", sleepers, ir.Constant(I64, 1), "seq_cst")
        b.branch(bb["sleep_loop"])
        b.position_at_end(bb["sleep_loop"])
        same = b.icmp_unsigned("==", b.lshr(self.get(b, word, "seq_cst"),
                                            ir.Constant(I64, 32)), seen)
        b.cbranch(same, bb["sleep_check"], bb["woken"])
        b.position_at_end(bb["sleep_check"])
        b.cbranch(b.icmp_unsigned("!=", self.get(b, stop, "seq_cst"), zero), bb["woken"],
                  bb["sleep_wait"])
        b.position_at_end(bb["sleep_wait"])
        b.call(self.wait, [self.at(b, ctrl, COND), mutex])
        b.branch(bb["sleep_loop"])
        b.position_at_end(bb["woken"])
        b.atomic_rmw("sub", sleepers, ir.Constant(I64, 1), "seq_cst")
        b.call(self.unlock, [mutex])
        b.store(zero, spins_slot)
        b.branch(bb["loop"])

        b.position_at_end(bb["job"])
        b.store(zero, spins_slot)
        helpers = self.get(b, self.field(b, ctrl, JOB, J_HELPERS))
        b.cbranch(b.icmp_unsigned(">", slot, helpers), bb["skip"], bb["claim"])
        b.position_at_end(bb["skip"])
        b.store(g, seen_slot)
        b.branch(bb["loop"])
        b.position_at_end(bb["claim"])
        finished = b.call(self.claim, [ctrl, w, slot])
        b.store(b.select(b.icmp_unsigned("!=", finished, zero), g, seen), seen_slot)
        b.branch(bb["loop"])

        b.position_at_end(bb["out"])
        b.ret_void()

    def _stop(self) -> None:
        f, b = self.function(STOP, VOID, [PTR])
        ctrl, = f.args
        self.put(b, ir.Constant(I64, 1), self.at(b, ctrl, STOP_AT), "seq_cst")
        self.signal(b, ctrl, COND)
        b.ret_void()

    def _init(self) -> None:
        """``i32 tn_init(ctrl, spin)``: initialize the mutex and condition
        variables of a zeroed control block and set the spin count."""
        f, b = self.function(INIT, I32, [PTR, I64])
        ctrl, spin = f.args
        null = ir.Constant(PTR, None)
        r1 = b.call(self.mutex_init, [self.at(b, ctrl, MUTEX), null])
        r2 = b.call(self.cond_init, [self.at(b, ctrl, COND), null])
        r3 = b.call(self.cond_init, [self.at(b, ctrl, DONE_COND), null])
        self.put(b, spin, self.at(b, ctrl, SPIN_AT))
        b.ret(b.or_(b.or_(r1, r2), r3))



def module_text(triple: str) -> str:
    """The worker-loop module's LLVM IR for a host of ``triple``."""
    return str(_Gen(triple).m)
