"""Race obligations (E-10 storage, E-11 ancestor-value joins, P-7 pipeline
overlap): every race the interpreter reports in the conformance suite is
refuted statically with a counterexample naming both instances and both ops,
and no race-free program of the project (conformance cases with another
verdict, examples, every workload schedule, the construct kernels) gets a
refuted race obligation."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

import tilenest as tn
from tilenest.conformance import load_program, load_suite
from tilenest.errors import TilenestError
from tilenest.proofs.model import Model
from tilenest.proofs.obligation import PROVED, REFUTED, UNKNOWN, discharge
from tilenest.proofs.races import JOIN, PIPELINE, RACE_KINDS, race_obligations, unordered_distances
from tilenest.semantics.parser import parse_program

ROOT = Path(__file__).resolve().parent.parent
#: race cases whose cause lies outside the program text (argument aliasing)
DYNAMIC_ONLY = ("M08-",)


def races(p) -> list:
    return discharge(race_obligations(Model(p)), timeout=2.0)


def refuted(p) -> list:
    return [o for o in races(p) if o.status == REFUTED]


def _cases(race: bool) -> list:
    out = []
    for c in load_suite():
        if (c.verdict == "race") != race or c.name.startswith(DYNAMIC_ONLY):
            continue
        out.append(pytest.param(c, id=c.name))
    return out


@pytest.mark.parametrize("case", _cases(True))
def test_every_static_race_case_is_refuted(case):
    bad = refuted(load_program(case.program))
    assert bad, f"{case.name}: no race obligation refuted"
    for o in bad:
        assert o.kind in RACE_KINDS and o.checked
        lines = o.counterexample_lines()
        actors = [ln for ln in lines if ln.startswith(("instance", "stage", "the collective"))]
        assert len(actors) == 2, lines  # both instances, each with its op
        w = o.witness
        ops = [p.op for p in w["pieces"]] if o.kind == JOIN else [w["a"].op, w["b"].op]
        assert all(op.name in ln for op, ln in zip(ops, actors, strict=True)), lines


def test_no_false_refutation_in_the_conformance_suite():
    bad = []
    for c in load_suite():
        if c.verdict == "race":
            continue
        try:
            p = load_program(c.program)
        except TilenestError:
            continue  # the case rejects the program before it runs
        bad += [(c.name, o.kind, o.counterexample_lines()) for o in refuted(p)]
    assert not bad, bad


def _example_kernels() -> list:
    sys.path.insert(0, str(ROOT / "examples"))
    out = []
    for f in sorted((ROOT / "examples").glob("*.py")):
        mod = importlib.import_module(f.stem)
        out += [(f"{f.stem}.{n}", k) for n, k in vars(mod).items() if isinstance(k, tn.Kernel)]
    return out


def test_no_false_refutation_in_examples_and_constructs():
    import kernels_constructs as KC

    kernels = _example_kernels() + [(k.program.name, k) for k in KC.ALL]
    assert len(kernels) > 10
    bad = [(n, o.kind, o.counterexample_lines()) for n, k in kernels for o in refuted(k.program)]
    assert not bad, bad


def test_no_false_refutation_in_any_workload_schedule():
    from tilenest.workloads import WORKLOADS

    bad, n = [], 0
    for name, wl in WORKLOADS.items():
        sz = wl.size("small")
        for i, sched in enumerate(wl.schedules):
            k = wl.kernel(tn.f32, dict(sched), sz)
            n += 1
            bad += [(name, i, o.kind, o.counterexample_lines()) for o in refuted(k.program)]
    assert n > 20 and not bad, bad


# ---------------------------------------------------------------------------
# the individual obligations

def test_join_obligation_names_both_children_and_ops():
    from tilenest.conformance import default_suite

    p = load_program(default_suite() / "cases" / "execution" / "E11-overlapping-patches.tile")
    (ob,) = [o for o in races(p) if o.kind == JOIN]
    assert ob.status == REFUTED
    text = "\n".join(ob.counterexample_lines())
    assert "p0=0" in text and "p0'=1" in text and "= put" in text and "%acc" in text


def test_disjoint_patches_and_collective_updates_are_proved():
    import kernels_constructs as KC

    obs = [o for o in races(KC.per_child_patches.program) if o.kind == JOIN]
    assert obs and all(o.status == PROVED for o in obs)

    @tn.kernel
    def once(y: tn.Tensor[tn.f32, 1]):
        acc = tn.zeros(tn.f32, tn.shape(4))
        for q in tn.parallel(tn.shape(4)):
            acc = acc + 1.0  # collective: one update
        y(tn.coord(0), tn.shape(4)).store(acc)

    assert not [o for o in races(once.program) if o.kind == JOIN]

    @tn.kernel
    def collective_put(x: tn.Tensor[tn.f32, 1], y: tn.Tensor[tn.f32, 1]):
        d = x.dim(0)
        acc = tn.full(tn.f32, tn.shape(8), -1.0, dims=(d,))
        for p in tn.parallel(tn.shape(3)):
            acc = tn.put(acc, tn.coord(2), x[tn.coord(0), tn.shape(2)])  # anchored above p
        y(tn.coord(0), tn.shape(8)).store(acc)

    assert not [o for o in races(collective_put.program) if o.kind == JOIN]
    import numpy as np

    from tilenest.interpreter import interpret

    x, y = np.arange(8, dtype=np.float32), np.zeros(8, np.float32)
    interpret(collective_put, x, y)  # E-11 item 2: one update, no race
    assert y.tolist() == [-1, -1, 0, 1, -1, -1, -1, -1]
    z = np.zeros(8, np.float32)
    collective_put.compile()(x, z)
    assert (z == y).all()


def test_data_dependent_updates_are_unknown_not_refuted():
    @tn.kernel
    def maybe(x: tn.Tensor[tn.f32, 1], y: tn.Tensor[tn.f32, 1]):
        acc = tn.zeros(tn.f32, tn.shape(4))
        for q in tn.parallel(tn.shape(4)):
            v = x[tn.coord(q.index()), tn.shape(1)]
            if tn.if_(tn.reduce(v, v.dim(0), tn.add) > 0.0):
                acc = acc + 1.0
        y(tn.coord(0), tn.shape(4)).store(acc)

    (ob,) = [o for o in races(maybe.program) if o.kind == JOIN]
    assert ob.status == UNKNOWN and "data-dependent" in ob.reason


PIPE = """
kernel @w(%x: tensor<f32, [#x_0:x_0]>, %y: tensor<f32, [#y_0:y_0]>)
    syms [x_0, y_0] assume [] dims [#x_0 = "x.0", #y_0 = "y.0", #k0 = "k0"] {
  pipeline {vars = ($k), domain = {($k) in [#k0:x_0 - DIST]}, policy = pipeline(window = WIN, interval = 1)} {
  ^():
    %prev_1 = stage {name = "read", ordinal = 0} : tile<f32, [#y_0:1]> {
    ^():
      %prev = tensor.load %y {vars = ($0), map = ($0 + $k), valid = true, bounds = zero} : tile<f32, [#y_0:1]>
      yield %prev
    }
    stage {name = "write", ordinal = 1} {
    ^():
      %0 = tensor.load %x {vars = ($0), map = ($0 + $k + DIST), valid = true, bounds = zero} : tile<f32, [#y_0:1]>
      %1 = add %prev_1, %0 : tile<f32, [#y_0:1]>
      tensor.store %y, %1 {vars = ($0), map = ($0 + $k + DIST), valid = true, bounds = zero}
      yield
    }
    yield
  }
}
"""


@pytest.mark.parametrize("dist,win,race", [(1, 1, False), (1, 2, True), (1, 0, True),
                                           (3, 4, True), (3, 3, False), (2, 3, True),
                                           (3, 2, False), (2, 0, True)])
def test_pipeline_conflicts_follow_the_window(dist, win, race):
    """P-6/P-7: iterations ``window`` or more apart are ordered; closer ones are
    ordered only by carried values. The interpreter agrees on every size."""
    import numpy as np

    p = parse_program(PIPE.replace("DIST", str(dist)).replace("WIN", str(win)), "pipe.tile")
    obs = [o for o in races(p) if o.kind == PIPELINE]
    assert any(o.status == REFUTED for o in obs) == race
    assert all(o.status in (PROVED, REFUTED) for o in obs)
    x = np.arange(1, 11, dtype=np.float32)
    from tilenest.interpreter import interpret

    try:
        interpret(p, x, x.copy())
        dynamic = False
    except tn.errors.RaceError:
        dynamic = True
    assert dynamic == race


def test_unordered_distances_with_carried_edges():
    # no carried edge, window 0: every distance is unordered
    assert unordered_distances(1, 0, 2, set(), 0) == ([], 1)
    # a carried edge from the last stage to the first orders everything after it
    assert unordered_distances(1, 0, 2, {(1, 0)}, 0) == ([], None)
    # an edge 1 -> 1 orders stage 1 with later stage 1, not stage 1 with stage 0
    assert unordered_distances(1, 1, 2, {(1, 1)}, 0) == ([], None)
    assert unordered_distances(1, 0, 2, {(1, 1)}, 0) == ([], 1)
    # window 3 leaves distances 1 and 2
    assert unordered_distances(1, 0, 2, set(), 3) == ([1, 2], None)


def test_a_pipeline_without_stages_is_ordered_by_its_memory_state():
    """P-9: a Memory declared outside a pipeline is ordered across iterations by
    its states, also when the body has no stage cuts (the body is one stage)."""
    import numpy as np

    from tilenest.interpreter import interpret

    @tn.kernel
    def acc_mem(x: tn.Tensor[tn.f32, 2], y: tn.Tensor[tn.f32, 2]):
        rows, _cols = x.shape
        total = tn.memory(tn.f32, tn.shape(1, 4), dims=x.dims())
        total.store(tn.zeros(tn.f32, tn.shape(1, 4)))
        for k in tn.pipeline(tn.shape(rows), tn.pipeline_policy(window=2, interval=1)):
            total.store(total.load() + x[tn.coord(k.index(), 0), tn.shape(1, 4)])
        y(tn.coord(0, 0), tn.shape(1, 4)).store(total.load())

    assert not refuted(acc_mem.program)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.zeros((1, 4), np.float32)
    interpret(acc_mem, x, y)
    assert (y[0] == x.sum(axis=0)).all()
