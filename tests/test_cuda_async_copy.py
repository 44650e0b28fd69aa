"""Asynchronous staging copies (``lowering/async_copy.py``), the emitter's
shared-window addresses and dominated bounds, and ``Schedule.min_blocks``."""

from __future__ import annotations

from dataclasses import replace

import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.backends.cuda.emit import _implies
from tilenest.errors import UsageError
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import loopir as L
from tilenest.lowering.async_copy import async_staging
from tilenest.proofs.barriers import check_barriers
from tilenest.proofs.obligation import REFUTED
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E
from tilenest.workloads import WORKLOADS

W = 64
C = E.Sym("C")
f32 = D.f32


def _staged(name: str, dt=tn.f32, **over):  # type: ignore[no-untyped-def]
    k = WORKLOADS[name].kernel(dt, {"rp": 1})
    return k, default_schedule(k.program, "cuda", stage_loads=True, **over)


def _stores(k: L.Kernel) -> list[L.Store]:
    return [s for ph in k.phases for s in L.walk(ph.body)
            if isinstance(s, L.Store) and s.buf.space == "shared"]


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm"])
def test_staging_stores_become_async(name):
    """The row staged into shared memory is copied by ``cp.async``: every
    store of it loads the tensor unchanged, and the barrier proof holds with
    the copies in flight until the next barrier."""
    k, s = _staged(name)
    low = lower_verified(k.program, s)
    staged = [st for st in _stores(low) if isinstance(st.value, L.Load)
              and st.value.buf.space == "global"]
    assert staged and all(st.mode == "async" for st in staged)
    # every other shared store (reduction results, exponentials) stays plain
    assert all(st.mode == "" for st in _stores(low) if st not in staged)
    assert all(o.status != REFUTED for o in check_barriers(low))
    ck = cuda.compile_program(k.program, s, device="emulated")
    assert "tn_cp_async<" in ck.source.text and "tn_cp_async_wait<0>();" in ck.source.text


def test_without_staging_nothing_is_async():
    k = WORKLOADS["softmax"].kernel(tn.f32, {"rp": 1})
    low = lower_verified(k.program, default_schedule(k.program, "cuda"))
    assert all(st.mode == "" for st in _stores(low))


def _kernel(body) -> L.Kernel:  # type: ignore[no-untyped-def]
    s = L.Buffer("s", f32, "shared", E.Const(W))
    x = L.Buffer("x", f32, "global", E.mul(C, W), arg=0)
    out = L.Buffer("out", f32, "global", E.mul(C, W), arg=1)
    pid = L.LVar("pid", D.i64)
    ph = L.Phase("ph", (C,), pid, tuple(body(s, x, out, E.Var("pid"))))
    return L.Kernel("hand", (L.Param("x", "tensor", f32, (C, E.Const(W))),
                             L.Param("out", "tensor", f32, (C, E.Const(W)))), ("C",), (s,),
                    (ph,))


def _tloop(name: str, body) -> L.For:  # type: ignore[no-untyped-def]
    t = L.LVar(name, D.i64)
    return L.For(t, E.Const(0), E.Const(W), tuple(body(E.Var(name))), "thread", scope="block")


def _copy(s, x, pid, t):  # type: ignore[no-untyped-def]
    return L.Store(s, L.IExpr(t), L.Load(x, L.IExpr(E.add(E.mul(pid, W), t))))


def _read(s, out, pid, t, shift=1):  # type: ignore[no-untyped-def]
    return L.Store(out, L.IExpr(E.add(E.mul(pid, W), t)),
                   L.Load(s, L.IExpr(E.mod(t + shift, W))))


def test_copy_closed_by_a_barrier_becomes_async():
    k = _kernel(lambda s, x, out, pid: [
        _tloop("t", lambda t: [_copy(s, x, pid, t)]),
        L.Barrier("block"),
        _tloop("u", lambda t: [_read(s, out, pid, t)])])
    got = async_staging(k)
    assert [st.mode for st in _stores(got)] == ["async"]
    assert all(o.status != REFUTED for o in check_barriers(got))


@pytest.mark.parametrize("case", ["read_before_barrier", "no_barrier", "keep", "computed",
                                  "outside_thread_loop", "twice", "global_store"])
def test_copies_that_must_stay_plain(case):
    """Each case breaks one condition: the buffer is read before the closing
    barrier (by the same thread loop), no barrier closes the segment, the
    barrier lets groups run on (``keep``), the stored value is computed, the
    store is thread 0's, each element is copied twice (a program-level loop
    around the copy: two copies in flight land in either order), the segment
    stores to global memory (a copy may read its source until the barrier)."""
    def body(s, x, out, pid):  # type: ignore[no-untyped-def]
        if case == "read_before_barrier":
            first = _tloop("t", lambda t: [_copy(s, x, pid, t), _read(s, out, pid, t, 0)])
        elif case == "computed":
            first = _tloop("t", lambda t: [L.Store(s, L.IExpr(t), L.Un(
                "neg", L.Load(x, L.IExpr(E.add(E.mul(pid, W), t))), f32))])
        elif case == "outside_thread_loop":
            first = _copy(s, x, pid, E.Const(0))
        else:
            first = _tloop("t", lambda t: [_copy(s, x, pid, t)])
        if case == "twice":
            first = L.For(L.LVar("j", D.i64), E.Const(0), E.Const(2), (first,))
        if case == "global_store":
            first = _tloop("t", lambda t: [_copy(s, x, pid, t),
                                           L.Store(x, L.IExpr(E.add(E.mul(pid, W), t)),
                                                   L.Const(0.0, f32))])
        if case == "no_barrier":
            return [first]
        bar = L.Barrier("block", keep=1) if case == "keep" else L.Barrier("block")
        return [first, bar, _tloop("u", lambda t: [_read(s, out, pid, t)])]

    got = async_staging(_kernel(body))
    assert all(st.mode == "" for st in _stores(got))


def test_dominated_bounds():
    a, b = E.Var("a"), E.Sym("K")

    def lt(c: int, op: str = "<") -> E.Pred:
        return E.cmp(op, E.add(a, c), b)

    assert _implies(lt(7), lt(0)) and not _implies(lt(0), lt(7))
    assert _implies(lt(0), E.cmp("<=", a, b)) and not _implies(E.cmp("<=", a, b), lt(0))
    assert _implies(lt(1, "<="), lt(0))  # a + 1 <= K gives a < K
    assert not _implies(lt(0), lt(0))  # equal conjuncts never remove each other
    assert not _implies(E.cmp("<", E.add(a, E.Var("c")), b), lt(0))  # not a constant apart
    assert not _implies(E.cmp("<", E.add(a, 3), E.Sym("N")), lt(0))  # another bound


def test_gemm_copy_tests_drop_the_dominated_bound():
    """A group's last element against ``K`` implies its first: one test."""
    k = WORKLOADS["gemm"].kernel(tn.bf16, {"bm": 128, "bn": 128, "bk": 64, "loop": "pipeline"})
    # the element copies (bulk tensor copies, the default, issue none)
    s = default_schedule(k.program, "cuda", mma_unit="wgmma", stages=3, tma=False)
    text = cuda.compile_program(k.program, s, device="emulated").source.text
    # the main loop's tests of a copy group of A (its hoisted bit, then K)
    tests = [x for x in text.splitlines() if "(tn_ok_" in x and "S_K" in x and "v_kk" in x]
    assert tests and all(x.count("< S_K") == 1 for x in tests), tests


def test_copy_steps_unswitched():
    """A thread's unrolled copy steps test all their groups first: when all
    are full and aligned the copies run without a test, else per group."""
    k = WORKLOADS["gemm"].kernel(tn.bf16, {"bm": 128, "bn": 128, "bk": 64, "loop": "pipeline"})
    # the element copies (bulk tensor copies, the default, issue none)
    s = default_schedule(k.program, "cuda", mma_unit="wgmma", stages=3, tma=False)
    text = cuda.compile_program(k.program, s, device="emulated").source.text
    lines = text.splitlines()
    heads = [i for i, x in enumerate(lines) if x.strip().startswith("if (tn_all_")]
    assert heads
    for i in heads:  # the fast branch: the step loop, straight to cp.async, no test
        fast = lines[i + 1:i + 5]
        assert any("tn_cp_async<16>" in x for x in fast) and not any("if (" in x for x in fast)


def test_shared_bases_taken_once():
    """cp.async destinations and wgmma descriptors use each buffer's 32-bit
    shared-window base, converted once at the kernel's start."""
    k = WORKLOADS["gemm"].kernel(tn.bf16, {"bm": 128, "bn": 128, "bk": 64, "loop": "pipeline"})
    # the element copies (bulk tensor copies, the default, issue none)
    s = default_schedule(k.program, "cuda", mma_unit="wgmma", stages=3, tma=False)
    text = cuda.compile_program(k.program, s, device="emulated").source.text
    bases = [x.strip() for x in text.splitlines() if "_s = tn_smem_addr(" in x]
    assert len(bases) == 2
    assert text.count("tn_smem_addr(") == 3  # the two bases and the 1024-byte alignment


def test_min_blocks_reaches_launch_bounds_and_is_checked():
    k, s = _staged("rmsnorm")
    ck = cuda.compile_program(k.program, s.with_(min_blocks=8), device="emulated")
    assert "__launch_bounds__(256, 8)" in ck.source.text
    assert "__launch_bounds__(256)" in cuda.compile_program(
        k.program, s, device="emulated").source.text
    for bad in (0, -1, True, 2.5):
        with pytest.raises(UsageError, match="min_blocks"):
            lower_verified(k.program, s.with_(min_blocks=bad))


def test_barrier_proof_orders_an_async_store_with_its_own_thread():
    """An asynchronous store is unordered with its own thread's accesses
    until the barrier that completes it, also where every ``keep`` is 0: a
    read of the copied element by the same thread before the barrier is
    refuted."""
    def body(s, x, out, pid):  # type: ignore[no-untyped-def]
        return [_tloop("t", lambda t: [replace(_copy(s, x, pid, t), mode="async"),
                                       _read(s, out, pid, t, 0)]), L.Barrier("block")]

    assert any(o.status == REFUTED for o in check_barriers(_kernel(body)))
    plain = _kernel(lambda s, x, out, pid: [_tloop("t", lambda t: [
        _copy(s, x, pid, t), _read(s, out, pid, t, 0)]), L.Barrier("block")])
    assert all(o.status != REFUTED for o in check_barriers(plain))
