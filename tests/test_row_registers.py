"""Thread-private rows kept in registers (``lowering/row_registers.py``,
``Schedule.row_registers``): which buffers qualify, the split into a register
part and a shared remainder, the refusals (an access outside the common
distribution, an access without the in-row test), the generated CUDA (the
register array at constant indices: no stack frame, no spill) and the
schedule field's checks. Emulated validation of the workloads with the
field set is in tests/test_cuda_workloads.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.errors import UsageError
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import loopir as L
from tilenest.lowering.row_registers import MAX_STEPS, keep_rows_in_registers
from tilenest.semantics import expr as E
from tilenest.workloads.softmax import softmax_kernel


def _simt(dt=tn.f32, **over):  # type: ignore[no-untyped-def]
    """The softmax's SIMT form, its rows in shared memory unless ``over`` says
    otherwise (a program with no mma keeps them in registers by default)."""
    k = softmax_kernel(dt, False)
    return lower_verified(k.program, default_schedule(k.program, "cuda",
                                                      **{"row_registers": 0, **over}))


def _bufs(k: L.Kernel) -> dict[str, L.Buffer]:
    return {b.name: b for b in k.locals}


def _accesses(k: L.Kernel, name: str) -> list:
    out = [y for ph in k.phases for y in L.evaluated(ph.body)
           if isinstance(y, L.Load) and y.buf.name == name]
    return out + [s for ph in k.phases for s in L.walk(ph.body)
                  if isinstance(s, L.Store) and s.buf.name == name]


def test_softmax_row_is_split_between_registers_and_shared_memory():
    plain = _simt()
    (row,) = [b for b in plain.locals if b.space == "shared" and b.size == E.Sym("C")]
    k = _simt(row_registers=32)
    bufs = _bufs(k)
    reg = bufs[f"{row.name}.reg"]
    V, W = 4, 256  # f32: 16-byte groups of 4 lanes, 256 threads
    K = 32 // V
    assert reg.space == "local" and reg.size == E.Const(K * V)
    rest = bufs[row.name]
    assert rest.space == "shared"
    assert rest.size == E.maximum(0, E.add(E.Sym("C"), -K * V * W))
    # every access of the row went to one of the parts; the other buffers are untouched
    assert _accesses(k, row.name) and _accesses(k, reg.name)
    others = sorted((b.space, str(b.size)) for b in plain.locals if b.name != row.name)
    assert sorted((b.space, str(b.size)) for b in k.locals
                  if b.name not in (row.name, reg.name, "x.reg")) == others
    # each step loop over the row was split at K: [0, K) for the registers, [K, R) for the rest
    steps = [s for ph in k.phases for s in L.walk(ph.body)
             if isinstance(s, L.For) and s.kind == "serial"
             and any(isinstance(y, L.Load) and y.buf.name in (reg.name, row.name)
                     for y in L.evaluated(s.body))
             or isinstance(s, L.For) and s.kind == "serial"
             and any(isinstance(x, L.Store) and x.buf.name in (reg.name, row.name)
                     for x in L.walk(s.body))]
    regs = [s for s in steps if s.hi == E.Const(K)]
    rests = [s for s in steps if s.lo == E.Const(K)]
    assert regs and len(regs) == len(rests)
    assert all(s.lo == E.Const(0) for s in regs)


def test_steps_in_registers_are_capped():
    k = _simt(row_registers=64, vector_lanes=1)
    reg = next(b for b in k.locals if b.name.endswith(".reg"))
    assert reg.size == E.Const(MAX_STEPS)  # 1 lane per step, at most MAX_STEPS steps


def test_zero_leaves_the_kernel_alone():
    k = _simt()
    assert keep_rows_in_registers(k, 0) is k
    assert not any(b.name.endswith(".reg") for b in k.locals)


def _mutate_one_access(k: L.Kernel, name: str, f) -> L.Kernel:  # type: ignore[no-untyped-def]
    """``k`` with the first load of buffer ``name`` rewritten by ``f``."""
    done = []

    def fe(y):  # type: ignore[no-untyped-def]
        if isinstance(y, L.Load) and y.buf.name == name and not done:
            done.append(y)
            return f(y)
        return None

    phases = tuple(replace(ph, body=L.map_stmts(ph.body, fe)) for ph in k.phases)
    assert done
    return replace(k, phases=phases)


def test_a_load_of_another_threads_element_keeps_the_row_shared():
    """One access one element further along is another thread's element: the
    row is no longer thread-private and must stay in shared memory."""
    k = _simt()
    (row,) = [b for b in k.locals if b.space == "shared" and b.size == E.Sym("C")]
    bad = _mutate_one_access(k, row.name,
                             lambda y: replace(y, index=L.IExpr(E.add(y.index.e, 1))))
    assert f"{row.name}.reg" not in _bufs(keep_rows_in_registers(bad, 32))


def test_an_access_without_the_in_row_test_keeps_the_row_shared():
    """Without the distribution's test that the element lies in the row, an
    offset past the row would name the next row's element through another
    register: refused."""
    k = _simt()
    (row,) = [b for b in k.locals if b.space == "shared" and b.size == E.Sym("C")]

    def unguard(body: tuple) -> tuple:
        def fs(s):  # type: ignore[no-untyped-def]
            if isinstance(s, L.If) and any(isinstance(y, L.Load) and y.buf.name == row.name
                                           for y in L.evaluated(s.then)):
                return s.then
            return None
        return L.map_stmts(body, lambda y: None, fs)

    bad = replace(k, phases=tuple(replace(ph, body=unguard(ph.body)) for ph in k.phases))
    assert f"{row.name}.reg" not in _bufs(keep_rows_in_registers(bad, 32))


def _steps_reading(k: L.Kernel, name: str) -> list[L.For]:
    """The serial step loops (inside a thread loop) whose bodies read ``name``."""
    return [s for ph in k.phases for s in L.walk(ph.body)
            if isinstance(s, L.For) and s.kind == "serial"
            and any(isinstance(x, L.For) and x.kind == "vector" for x in s.body)
            and any(isinstance(y, L.Load) and y.buf.name == name for y in L.evaluated(s.body))]


def test_input_row_read_in_several_passes_is_cached_in_registers():
    """Softmax reads its input ``x`` in two passes (the max, then the
    exponentials): the first pass's register steps store each element they
    read, the second pass's register steps read those registers, and only
    the steps past ``K`` still read global memory."""
    k = _simt(row_registers=32)
    V, K = 4, 8
    reg = _bufs(k)["x.reg"]
    assert reg.space == "local" and reg.size == E.Const(K * V)
    fills = [s for ph in k.phases for s in L.walk(ph.body)
             if isinstance(s, L.Store) and s.buf.name == "x.reg"]
    assert len(fills) == 1 and isinstance(fills[0].value, L.Load)
    assert fills[0].value.buf.name == "x"
    cached = _steps_reading(k, "x.reg")
    assert len(cached) == 2 and all(s.lo == E.Const(0) and s.hi == E.Const(K) for s in cached)
    # no register step reads x itself except through the fill's store
    reads_x = [s for s in _steps_reading(k, "x") if s.hi == E.Const(K)]
    assert len(reads_x) == 1
    assert all(s.lo == E.Const(K) for s in _steps_reading(k, "x") if s not in reads_x)


def test_a_bf16_input_is_cached_widened():
    """Every read of a bf16 softmax's input is converted to f32 at once: the
    registers hold the converted values (exact), so the later pass reads
    them without converting again."""
    k = _simt(tn.bf16, row_registers=32)
    reg = _bufs(k)["x.reg"]
    assert reg.dtype == tn.f32
    (fill,) = [s for ph in k.phases for s in L.walk(ph.body)
               if isinstance(s, L.Store) and s.buf.name == "x.reg"]
    assert isinstance(fill.value, L.Cast) and fill.value.a.buf.name == "x"
    assert not any(isinstance(y, L.Cast) and isinstance(y.a, L.Load) and y.a.buf.name == "x.reg"
                   for ph in k.phases for y in L.evaluated(ph.body))


def _x_cached(k: L.Kernel) -> bool:
    return "x.reg" in _bufs(keep_rows_in_registers(k, 32))


def test_an_input_the_kernel_stores_is_not_cached():
    """A buffer some statement stores is not read-only: a register copy
    could go stale."""
    k = _simt()
    assert _x_cached(k)
    ph = k.phases[0]
    x = next(b for b in k.globals if b.name == "x")
    extra = L.Store(x, L.IExpr(E.Const(0)), L.Const(0.0, x.dtype))
    bad = replace(k, phases=(replace(ph, body=ph.body + (extra,)),) + k.phases[1:])
    assert not _x_cached(bad)


def test_a_fill_under_a_condition_is_not_cached():
    """The first read must run for every element a later read takes from the
    registers: a first pass under a condition of its own is no fill."""
    k = _simt()
    ph = k.phases[0]
    first = next(j for j, s in enumerate(ph.body)
                 if any(isinstance(y, L.Load) and y.buf.name == "x"
                        for y in L.evaluated((s,))))
    cond = L.IPred(E.cmp("<", E.Var(ph.pid.name), E.Sym("R")))
    body = ph.body[:first] + (L.If(cond, (ph.body[first],), ()),) + ph.body[first + 1:]
    assert not _x_cached(replace(k, phases=(replace(ph, body=body),) + k.phases[1:]))


def test_a_guarded_first_read_is_not_cached():
    """A read with its own guard may not happen: it cannot fill a register."""
    k = _simt()
    bad = _mutate_one_access(k, "x", lambda y: replace(
        y, guard=L.IPred(E.cmp("<", E.Var(k.phases[0].pid.name), E.Sym("R"))),
        fill=L.Const(0.0, y.buf.dtype)))
    assert not _x_cached(bad)


@pytest.mark.parametrize("dt", [tn.f32, tn.bf16], ids=["f32", "bf16"])
def test_register_array_compiles_to_registers(dt):
    """The emitter unrolls every step loop over the registers, so the array is
    indexed by constants: no stack frame, no spill, and (for rows of at most
    32 elements per thread) 64 bytes of shared memory at most."""
    k = softmax_kernel(dt, False)
    ck = cuda.compile_program(k.program, default_schedule(k.program, "cuda", row_registers=32),
                              device="emulated")
    (r,) = ck.resources.values()
    assert r.stack_frame_bytes == 0 and r.spill_store_bytes == 0 and r.spill_load_bytes == 0
    assert "_reg[" in ck.source.text
    smem = ck.source.kernels[0].shared_bytes
    assert E.evaluate(smem, {E.Sym("C"): 8192, E.Sym("R"): 4}) <= 64
    assert E.evaluate(smem, {E.Sym("C"): 8192 + 1024, E.Sym("R"): 4}) >= 4 * 1024


@pytest.mark.parametrize("value", [-1, 65, True, 2.0, "32"])
def test_bad_values_are_usage_errors(value):
    k = softmax_kernel(tn.f32, False)
    with pytest.raises(UsageError, match="row_registers"):
        lower_verified(k.program, replace(default_schedule(k.program, "cuda"),
                                          row_registers=value))
