"""Elementwise results stored in place of their operand (``lowering/inplace.py``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import loopir as L
from tilenest.lowering.inplace import reuse_in_place
from tilenest.proofs.barriers import check_barriers
from tilenest.proofs.obligation import REFUTED
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E
from tilenest.workloads import WORKLOADS

W = 64
C = E.Sym("C")
f32 = D.f32


def test_staged_softmax_keeps_one_row():
    """The exponentials take the staged row's place: one row of shared
    memory per block instead of two, the proof holds, and the update is one
    vector load and one vector store per group."""
    k = WORKLOADS["softmax"].kernel(tn.f32, {"rp": 1})
    s = default_schedule(k.program, "cuda", stage_loads=True)
    low = lower_verified(k.program, s)
    rows = [b for b in low.locals if b.space == "shared" and b.size == C]
    assert len(rows) == 1
    assert all(o.status != REFUTED for o in check_barriers(low))
    ck = cuda.compile_program(k.program, s, device="emulated")
    nbytes = E.evaluate(ck.source.kernels[0].shared_bytes, {C: 8192})
    assert 4 * 8192 <= nbytes < 4 * 8192 + 1024  # one f32 row (and the reductions' words)
    text = ck.source.text
    row = rows[0]
    line = next(x for x in text.splitlines() if "tn_exp_f32" in x and "tn_vq" in x)
    assert "tn_vs_" in line
    name = "b_" + row.name.replace("%", "_").replace(".", "_")
    V = s.vector_lanes
    assert f"tn_vstore<float, {V}>(&{name}[" in text and f"tn_vload<float, {V}>(&{name}[" in text


def _kernel(body, dt_e=f32) -> L.Kernel:  # type: ignore[no-untyped-def]
    x = L.Buffer("%x", f32, "shared", E.Const(W))
    e = L.Buffer("%e", dt_e, "shared", E.Const(W))
    out = L.Buffer("out", f32, "global", E.mul(C, W), arg=0)
    pid = L.LVar("pid", D.i64)
    ph = L.Phase("ph", (C,), pid, tuple(body(x, e, out, E.Var("pid"))))
    return L.Kernel("hand", (L.Param("out", "tensor", f32, (C, E.Const(W))),), ("C",), (x, e),
                    (ph,))


def _tloop(name: str, body) -> L.For:  # type: ignore[no-untyped-def]
    t = L.LVar(name, D.i64)
    return L.For(t, E.Const(0), E.Const(W), tuple(body(E.Var(name))), "thread", scope="block")


def _fill(x):  # type: ignore[no-untyped-def]
    return _tloop("a", lambda t: [L.Store(x, L.IExpr(t), L.Const(2.0, f32))])


def _update(x, e, shift=0):  # type: ignore[no-untyped-def]
    return _tloop("b", lambda t: [L.Store(e, L.IExpr(t), L.Un(
        "neg", L.Load(x, L.IExpr(E.mod(t + shift, W) if shift else t)), f32))])


def _use(src, out, pid):  # type: ignore[no-untyped-def]
    return _tloop("c", lambda t: [L.Store(out, L.IExpr(E.add(E.mul(pid, W), t)),
                                          L.Load(src, L.IExpr(E.mod(t + 1, W))))])


def test_update_in_place_merges():
    k = _kernel(lambda x, e, out, pid: [_fill(x), L.Barrier("block"), _update(x, e),
                                        L.Barrier("block"), _use(e, out, pid)])
    got = reuse_in_place(k)
    assert [b.name for b in got.locals] == ["%x"]
    assert all(o.status != REFUTED for o in check_barriers(got))


@pytest.mark.parametrize("case", ["x_read_later", "other_element", "e_used_before",
                                  "other_dtype", "program_level", "twice", "inner_loop",
                                  "reader_without_barrier"])
def test_no_merge(case):
    """Each case breaks one condition: the operand is read after the update,
    the update reads another element, the result is touched before it, the
    dtypes differ, the update is thread 0's (not a thread loop), it runs
    twice on each element (a program-level loop of two iterations around it,
    or a serial loop inside its thread loop: merged, the second run would
    read its own result), another thread reads the operand just before it
    with no barrier between."""
    def body(x, e, out, pid):  # type: ignore[no-untyped-def]
        upd = _update(x, e, 1 if case == "other_element" else 0)
        if case == "program_level":
            upd = L.Store(e, L.IExpr(E.Const(0)), L.Load(x, L.IExpr(E.Const(0))))
        if case == "twice":
            upd = L.For(L.LVar("j", D.i64), E.Const(0), E.Const(2), (upd,))
        if case == "inner_loop":
            upd = _tloop("b", lambda t: [L.For(L.LVar("j", D.i64), E.Const(0), E.Const(2), (
                L.Store(e, L.IExpr(t), L.Un("neg", L.Load(x, L.IExpr(t)), f32)),))])
        pre = [_use(e, out, pid), L.Barrier("block")] if case == "e_used_before" else []
        mid = [_use(x, out, pid)] if case == "reader_without_barrier" else []
        post = [L.Barrier("block"), _use(x, out, pid)] if case == "x_read_later" else []
        return [*pre, _fill(x), L.Barrier("block"), *mid, upd, L.Barrier("block"),
                _use(e, out, pid), *post]

    got = reuse_in_place(_kernel(body, D.i32 if case == "other_dtype" else f32))
    assert [b.name for b in got.locals] == ["%x", "%e"]


def test_serialized_simt_form_validates_on_the_cpu():
    """The same rewrite on the CPU's serialized SIMT form (llvm with
    ``block_threads``): RMSNorm's per-row scale takes its sum of squares'
    place, and the kernel still validates."""
    k = WORKLOADS["rmsnorm"].kernel(tn.f32, {"rp": 1})
    s = default_schedule(k.program, "llvm").with_(block_threads=64, vector_lanes=4)
    low = lower_verified(k.program, s)
    assert not any("scale" in b.name for b in low.locals)  # merged into the sum of squares
    rep = tn.validate(k, "llvm", cases=4, seed=3, compile_schedule=s)
    assert rep.ok, rep.summary()


def test_emitter_widens_an_update_only_when_read_before_written():
    """The emitter loads a widened group before its lanes run and stores it
    after: a buffer read after its in-place store (the new value) must keep
    element accesses."""
    from tilenest.backends.cuda.emit import _in_place

    x = L.Buffer("%x", f32, "shared", E.Const(W))
    out = L.Buffer("out", f32, "global", E.Const(W), arg=0)
    i = L.IExpr(E.Var("i"))
    upd = L.Store(x, i, L.Un("neg", L.Load(x, i), f32))
    assert _in_place((upd,), "%x")
    assert not _in_place((upd, L.Store(out, i, L.Load(x, i))), "%x")
    assert not _in_place((L.Store(out, i, L.Load(x, i)), upd), "%x")  # read outside its value
    assert not _in_place((replace(upd, guard=L.IPred(E.cmp("<", E.Var("i"), 3))),), "%x")


def _rescale_update_copy(middle_reads_x):  # type: ignore[no-untyped-def]
    """``e = x * 2`` over an 8 x 4 tile, ``e += 1`` (the update), ``x = e``."""
    from tilenest.semantics import dtypes as D
    from tilenest.semantics import expr as E

    x = L.Buffer("x", D.f32, "shared", E.Const(32))
    e = L.Buffer("e", D.f32, "shared", E.Const(32))
    y = L.Buffer("y", D.f32, "shared", E.Const(32))

    def nest(tag, body):  # type: ignore[no-untyped-def]
        i, j = L.LVar(f"i{tag}", D.i64), L.LVar(f"j{tag}", D.i64)
        ix = L.IExpr(E.add(E.mul(4, E.Var(i.name)), E.Var(j.name)))
        return L.For(i, E.Const(0), E.Const(8), (
            L.For(j, E.Const(0), E.Const(4), body(ix), "vector"),), "vector")

    first = nest("a", lambda ix: (L.Store(e, ix, L.Bin("mul", L.Load(x, ix),
                                                      L.Const(2.0, D.f32), D.f32)),))
    src = x if middle_reads_x else e
    middle = nest("b", lambda ix: (L.Store(e, ix, L.Bin("add", L.Load(src, ix),
                                                       L.Const(1.0, D.f32), D.f32)),))
    back = nest("c", lambda ix: (L.Store(x, ix, L.Load(e, ix)),))
    after = nest("d", lambda ix: (L.Store(y, ix, L.Load(x, ix)),))
    return (first, middle, back, after)


def test_a_copy_back_is_absorbed_into_the_tile_it_copies_to():
    """``acc = mma(p, v, acc * alpha)``'s shape: the temporary becomes the
    tile itself and the copy back is gone; a middle statement reading the
    tile's old value keeps them apart."""
    from tilenest.lowering.inplace import absorb_copies_back
    from tilenest.lowering.simt import _nest

    (body,), gone = absorb_copies_back([_rescale_update_copy(False)], _nest)
    assert gone == {"e"} and len(body) == 3
    assert {s.buf.name for s in L.walk(body) if isinstance(s, L.Store)} == {"x", "y"}
    kept = _rescale_update_copy(True)
    (same,), gone = absorb_copies_back([kept], _nest)
    assert same == kept and not gone
