"""The compile-time legality gate of the LLVM backend: a compiled kernel cannot
observe a race while it runs, so ``compile`` refuses a program whose race
obligations are refuted (with the interpreter's error class, the sites and a
hint), refuses an illegal schedule decision, accepts ``unknown`` obligations
and records every verdict on the compiled kernel."""

from __future__ import annotations


import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.conformance import Backend, load_suite
from tilenest.errors import RaceError, TilenestError
from tilenest.lowering import default_schedule
from tilenest.lowering import legality as LG
from tilenest.proofs.obligation import PROVED, REFUTED, UNKNOWN, Obligation


@tn.kernel
def halves(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(4)):
        y(tn.coord(p.index() // 2), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


@tn.kernel
def patches(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, step=2):
    d = x.dim(0)
    acc = tn.full(f32, tn.shape(8), -1.0, dims=(d,))
    for p in tn.parallel(tn.shape(3)):
        piece = x[tn.coord(step * p.index()), tn.shape(2)]
        acc = tn.put(acc, tn.coord(step * p.index()), piece)
    y(tn.coord(0), tn.shape(8)).store(acc)


@tn.kernel
def through_y(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], *, window=2):
    (n,) = x.shape
    x = x.with_dims(y.dim(0))
    for k in tn.pipeline(tn.shape(n - 1), tn.pipeline_policy(window=window, interval=1)):
        k.stage("read")
        prev = y[tn.coord(k.index()), tn.shape(1)]
        k.stage("write")
        y(tn.coord(k.index() + 1), tn.shape(1)).store(prev + x[tn.coord(k.index() + 1),
                                                                tn.shape(1)])


@tn.kernel
def scatter(x: tn.Tensor[f32, 1], idx: tn.Tensor[tn.i32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        j = idx[tn.coord(p.index()), tn.shape(1)]
        t = tn.reduce(j, j.dim(0), tn.add)
        y(tn.coord(t), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


@tn.kernel
def isum(x: tn.Tensor[tn.i32, 2], y: tn.Tensor[tn.i32, 1]):
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        s = tn.reduce(row, row.dim(1), tn.add)
        y(tn.coord(p.index()), tn.shape(1)).store(s)


def test_storage_race_is_refused_with_sites_and_hint():
    with pytest.raises(RaceError) as ei:
        halves.compile(target="llvm")
    e = ei.value
    text = e.render()
    assert e.kind == "race" and "refuted statically" in text and "hint:" in text
    assert len(e.sites) >= 2 and all("test_compile_gate.py" in str(s) for s in e.sites)
    assert "instance (p0=" in text and "tensor.store at" in text


def test_overlapping_patches_are_refused_disjoint_ones_compile():
    with pytest.raises(RaceError, match="noninterference.join"):
        patches.specialize(step=1).compile()
    ck = patches.compile()
    joins = [o for o in ck.obligations if o.kind == "noninterference.join"]
    assert joins and all(o.status == PROVED for o in joins)
    x, y = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    ck(x, y)
    assert y.tolist() == [0, 1, 2, 3, 4, 5, -1, -1]


def test_pipeline_overlap_is_refused_window_one_compiles():
    with pytest.raises(RaceError, match="noninterference.pipeline") as ei:
        through_y.compile()
    assert "iteration" in ei.value.render()
    ck = through_y.specialize(window=1).compile()
    x = np.array([1, 2, 3, 4], np.float32)
    y = x.copy()
    ck(x, y)
    assert y.tolist() == [1, 3, 6, 10]


def test_unknown_obligations_compile_and_are_recorded():
    ck = scatter.compile()
    unk = [o for o in ck.obligations if o.status == UNKNOWN]
    assert unk and unk[0].kind == "noninterference"
    text = LG.summary(ck.obligations)
    assert "unknown: noninterference" in text
    from tilenest.backends.llvm import emit

    assert "legality:" in emit(scatter.program, "schedule")


def test_schedule_obligations_binding_and_reassociation():
    ck = isum.compile()
    kinds = {o.kind: o.status for o in ck.obligations}
    assert kinds.get("binding.scope") == PROVED
    assert kinds.get("reduction.permission") == PROVED
    assert kinds.get("reduction.law.associative") == PROVED
    # a sequential realization needs no permission
    s = default_schedule(isum.program).with_(
        reductions=tuple((o.oid, "sequential") for o in isum.program.walk()
                         if o.name == "reduce"))
    obs = LG.schedule_obligations(isum.program, s)
    assert not [o for o in obs if o.kind.startswith("reduction.")]


def test_refuted_schedule_obligation_is_a_schedule_error_not_a_race():
    ob = Obligation("binding.scope", "level 1 binds to a scope the target has")
    ob.set(REFUTED, "catalogue", "no scope 'warp' on cpu")
    with pytest.raises(TilenestError, match="the schedule is illegal") as ei:
        LG._refuse([ob])
    assert not isinstance(ei.value, RaceError)


def test_verdicts_are_cached():
    LG.clear_cache()
    p = patches.program
    s = default_schedule(p)
    first = LG.legality(p, s)
    again = LG.legality(p, s)
    # the very obligation objects come back: nothing was stated or decided again
    # (a timing comparison here was flaky on a loaded machine)
    assert first and all(a is b for a, b in zip(again, first, strict=True))
    LG.clear_cache()
    assert all(a is not b for a, b in zip(LG.legality(p, s), first, strict=True))


RACES = [pytest.param(c, id=c.name) for c in load_suite()
         if c.verdict == "race" and not c.name.startswith("M08-")]


@pytest.mark.parametrize("case", RACES)
def test_compiled_backend_reproduces_every_race_verdict(case):
    out = Backend("llvm").run(case)
    assert out.error == "race", out.message
