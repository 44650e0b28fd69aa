"""Sibling-phase fusion (Dep_AB within the diagonal) and pipeline issue
schedules (dependences, window, buffer versions) on symbolic extents."""

from __future__ import annotations

import numpy as np
import pytest
from mutations import kernels as K
from mutations import recheck as RC

import tilenest as tn
from tilenest.proofs import phases as PH
from tilenest.proofs.model import Model
from tilenest.proofs.obligation import PROVED, REFUTED, discharge

T = tn.transform


def test_pointwise_fusion_proved_and_equivalent():
    t = T.fuse_phases(K.phases_ok.program, 1).check()
    assert t.admitted
    assert len([op for op in t.program.walk() if op.name == "parallel"]) == 1
    rng = np.random.default_rng(0)
    for n in (1, 5, 9):
        x = rng.standard_normal(n).astype(np.float32)
        a = [x.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)]
        b = [x.copy(), np.zeros(n, np.float32), np.zeros(n, np.float32)]
        tn.interpret(K.phases_ok.program, *a)
        tn.interpret(t.program, *b)
        assert all(u.tobytes() == v.tobytes() for u, v in zip(a, b, strict=True))


@pytest.mark.parametrize("bad", [K.rotate_bad, K.war_bad])
def test_cross_instance_dependence_refuted(bad):
    t = T.fuse_phases(bad.program, 1).check()
    dep = [o for o in t.obligations if o.kind == "fusion.dependence"]
    (ob,) = [o for o in dep if o.status == REFUTED]
    assert "A(" in "\n".join(ob.counterexample_lines())
    assert RC.two_accesses(ob, bad.program)
    assert not t.admitted


def test_fused_rotate_would_race():
    """The refuted fusion's candidate indeed changes meaning: the fused program
    races where the original is well defined."""
    t = T.fuse_phases(K.rotate_bad.program, 1)
    x = np.arange(4, dtype=np.float32)
    with pytest.raises(tn.errors.RaceError):
        tn.interpret(t.program, x, np.zeros(4, np.float32), np.zeros(4, np.float32))


def test_fusion_needs_equal_domains_and_adjacency():
    with pytest.raises(tn.errors.TilenestError):
        T.fuse_phases(K.flat.program, 1)


def test_default_schedule_of_the_gemm_pipeline_is_proved():
    import gemm

    obs = discharge(PH.default_pipeline_obligations(Model(gemm.gemm.program)))
    assert {o.kind for o in obs} == {"pipeline.dependence", "pipeline.window",
                                     "pipeline.versions"}
    assert all(o.status == PROVED for o in obs)


def test_stage_graph_edges():
    pipe = PH.pipelines(K.gemv.program)[0]
    stages, edges, live = PH.stage_graph(pipe)
    assert [s.attrs["name"] for s in stages] == ["load", "compute"]
    assert any(e.distance == 1 and e.producer == e.consumer == 1 for e in edges)
    assert set(live) == {s.name for s in stages[0].results}


@pytest.mark.parametrize("kw,kind", [
    (dict(window=3, versions=2, offsets=[0, 2]), "pipeline.versions"),
    (dict(offsets=[0, 0]), "pipeline.dependence"),
    (dict(window=2, offsets=[0, 3]), "pipeline.window"),
])
def test_bad_schedules_refuted_with_the_iteration(kw, kind):
    t = T.schedule_pipeline(K.gemv.program, 0, **kw).check()
    bad = [o for o in t.obligations if o.kind == kind and o.status == REFUTED]
    assert bad
    ob = bad[0]
    assert "i@" in ob.counterexample and "C" in ob.counterexample
    assert RC.schedule(ob)
    assert "iteration" in "\n".join(ob.counterexample_lines())


def test_window_one_serializes():
    t = T.schedule_pipeline(K.gemv.program, 0, window=1, interval=2, versions=1).check()
    assert t.admitted
    t = T.schedule_pipeline(K.gemv.program, 0, window=1, interval=1, versions=1).check()
    assert not t.admitted
