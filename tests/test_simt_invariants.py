"""Program-invariant divisions computed once per program (``lowering/invariants.py``).

A GQA attention kernel reads key head ``h // (HQ // HK)``: a division by a
symbol expression, which a GPU runs as tens of integer instructions. Its
key loop's copies evaluated it at every step in every thread; the SIMT
lowering now assigns it to a local at the top of the program and reads that.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest import lowering
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import invariants as I
from tilenest.lowering import loopir as L
from tilenest.semantics import expr as E
from tilenest.workloads.attention import flash_kernel


def _symbolic_divisions(x):  # type: ignore[no-untyped-def]
    """The divisions by non-constants in expression or predicate ``x``."""
    out = []

    def visit(e):  # type: ignore[no-untyped-def]
        if isinstance(e, (E.FloorDiv, E.Mod)) and not isinstance(e.b, E.Const):
            out.append(e)
        for c in getattr(e, "children", ()):
            visit(c)

    if isinstance(x, E.Expr):
        visit(x)
    elif isinstance(x, E.Cmp):
        visit(x.a), visit(x.b)
    elif isinstance(x, (E.PAnd, E.POr)):
        for q in x.items:
            out += _symbolic_divisions(q)
    elif isinstance(x, E.PNot):
        out += _symbolic_divisions(x.item)
    return out


def _in_loops(k):  # type: ignore[no-untyped-def]
    """Divisions by non-constants evaluated inside the key loop (a serial ``For``)."""
    found = []
    for ph in k.phases:
        for st in L.walk(ph.body):
            if isinstance(st, L.For) and st.kind != "thread":
                for x in L.evaluated(st.body):
                    if isinstance(x, L.IExpr):
                        found += _symbolic_divisions(x.e)
                    elif isinstance(x, L.IPred):
                        found += _symbolic_divisions(x.p)
    return found


@pytest.mark.parametrize("target", ["cuda", "metal"])
def test_the_key_head_division_is_computed_once_per_program(target, monkeypatch):
    kern = flash_kernel(tn.bf16 if target == "cuda" else tn.f16).specialize(
        bq=32, bk=32, dh=32, dv=32, causal=True)
    sched = default_schedule(kern.program, target)
    k = lower_verified(kern.program, sched)
    top = [st for ph in k.phases for st in ph.body
           if isinstance(st, L.Assign) and st.var.name.startswith(I.PREFIX + ".")]
    defs = {E.to_str(st.value.e) for st in top}
    assert "HQ // HK" in defs, defs
    assert not _in_loops(k)
    # without the pass the key loop divides by the group size at every step
    monkeypatch.setattr(lowering, "hoist_divisions", lambda k: k)
    assert _in_loops(lower_verified(kern.program, sched))


def test_hoisting_keeps_the_proofs_and_the_results():
    kern = flash_kernel(tn.bf16).specialize(bq=32, bk=32, dh=32, dv=32, causal=True)
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda"),
                              device="emulated", cache=False)
    bar = [o for o in ck.obligations if o.kind == "barrier.sufficiency"]
    assert bar and all(o.status == "proved" for o in bar)
    assert ck.source.index_bits == 32
    # a GQA call (4 query heads on 2 key heads), ragged sizes, validated emulated
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 45, 32)).astype(tn.bf16.np)
    kk, v = (rng.standard_normal((2, 2, 45, 32)).astype(tn.bf16.np) for _ in range(2))
    o = np.zeros((2, 4, 45, 32), tn.bf16.np)
    rep = tn.validate(kern, "cuda", inputs=[q, kk, v, o, np.float32(0.17)], compiled=ck)
    assert rep.ok and rep.count("ok") == 1, rep.summary()


def test_hoisted_locals_take_names_no_other_local_has():
    """A division ``p // (N // 4)`` inside a loop of a hand-built phase that
    already has a local named like the first hoisted one."""
    from tilenest.semantics import dtypes as D

    s = L.Buffer("s", D.f32, "global", E.Const(1024), arg=0)
    pid, taken = L.LVar("pid", D.i64), L.LVar(f"{I.PREFIX}.h0", D.i64)
    i = L.LVar("i", D.i64)
    div = E.floordiv(E.Var("pid"), E.floordiv(E.Sym("N"), 4))
    body = (L.Assign(taken, L.IExpr(E.Const(3))),
            L.For(i, E.Const(0), E.Const(4), (
                L.Store(s, L.IExpr(E.add(div, E.Var(taken.name))), L.Const(1.0, D.f32)),)))
    ph = L.Phase("ph", (E.Const(8),), pid, body)
    out = I.hoist_divisions(L.Kernel("k", (), ("N",), (), (ph,))).phases[0].body
    new = [st.var.name for st in out if isinstance(st, L.Assign) and st.var is not taken]
    assert new == [f"{I.PREFIX}.h1"]  # pid // (N // 4); N // 4 divides by a constant
    loop = next(st for st in out if isinstance(st, L.For))
    assert not _in_loops(L.Kernel("k", (), ("N",), (), (L.Phase("ph", (E.Const(8),), pid,
                                                                  (loop,)),)))
