"""Program obligations: noninterference of ``parallel`` (ISL, parametric),
coverage of claimed outputs, bounds of unguarded accesses, Memory layouts and
ParallelMaps -- proved and refuted on symbolic extents, with counterexamples
re-checked against the original view maps and by running the interpreter at
the counterexample's sizes."""

from __future__ import annotations

import numpy as np
import pytest
from mutations import kernels as K
from mutations import recheck as RC

import tilenest as tn
from tilenest.proofs import program as PO
from tilenest.proofs.model import Model
from tilenest.proofs.obligation import PROVED, REFUTED, UNKNOWN, discharge
from tilenest.proofs.report import program_obligations
from tilenest.semantics import expr as E
from tilenest.semantics.maps import Map


def kinds(k, kind):
    obs = discharge(program_obligations(k.program))
    return [o for o in obs if o.kind == kind]


def test_examples_are_race_free_and_cover_their_outputs():
    import gemm
    import memory_stage
    import ragged
    import softmax
    import two_level

    for k in (gemm.gemm, softmax.row_softmax, two_level.scale_rows, ragged.axpy,
              memory_stage.transpose_blocks):
        obs = discharge(program_obligations(k.program))
        bad = [(o.kind, o.status) for o in obs if o.role == "required" and o.status != PROVED]
        assert not bad, (k.program.name, bad)
        assert {"noninterference", "coverage.cover", "coverage.once"} <= {o.kind for o in obs}


@pytest.mark.parametrize("bad", [K.halves_bad, K.read_back_bad, K.inner_race_bad,
                                 K.serial_race_bad])
def test_race_refuted_with_instances_and_element(bad):
    (ob,) = [o for o in kinds(bad, "noninterference") if o.status == REFUTED][:1]
    text = "\n".join(ob.counterexample_lines())
    assert "instance" in text and ("writes" in text)
    assert RC.two_accesses(ob, bad.program)
    # the interpreter, run at the counterexample's sizes, reports the race
    with pytest.raises(tn.errors.RaceError):
        RC.run_at(bad.program, ob.counterexample)


def test_race_counterexample_is_symbolic_size():
    (ob,) = [o for o in kinds(K.halves_bad, "noninterference")]
    assert ob.status == REFUTED
    # the smallest race needs two instances writing y[0]: N = 2, M >= 1
    assert ob.counterexample["N"] == 2


def test_data_dependent_store_is_unknown_by_contract():
    (ob,) = kinds(K.scatter, "noninterference")
    assert ob.status == UNKNOWN
    assert ob.reason.startswith("holds by the parallel contract, not proved")
    assert "data values" in ob.reason and "%" in ob.reason


def test_bounds_refuted_and_confirmed_by_the_interpreter():
    (ob,) = kinds(K.shift_bad, "bounds")
    assert ob.status == REFUTED and ob.counterexample["N"] >= 1
    assert "outside" in RC.bounds(ob, K.shift_bad.program)
    with pytest.raises(tn.errors.BoundsError):
        RC.run_at(K.shift_bad.program, ob.counterexample)
    (ok,) = kinds(K.shift_ok, "bounds")
    assert ok.status == PROVED


def test_zero_policy_accesses_need_no_bounds_obligation():
    import gemm

    assert not kinds(gemm.gemm, "bounds")


def test_coverage_refuted_element_is_really_unwritten():
    (ob,) = kinds(K.cover_bad, "coverage.cover")
    assert ob.status == REFUTED
    assert "never written" in "\n".join(ob.counterexample_lines())
    assert RC.cover(ob, K.cover_bad.program)
    (ob2,) = kinds(K.twice_bad, "coverage.once")
    assert ob2.status == REFUTED and RC.two_accesses(ob2, K.twice_bad.program)
    assert all(o.status == PROVED for o in kinds(K.once_ok, "coverage.once"))


def test_parallel_maps():
    assert [o.status for o in kinds(K.layout_ok, "parallel-map.injective")] == [PROVED]
    assert [o.status for o in kinds(K.layout_ok, "parallel-map.preserve")] == [PROVED]
    (inj,) = kinds(K.layout_bad, "parallel-map.injective")
    assert inj.status == REFUTED
    cx = inj.counterexample
    raw = [v for v in cx if v.startswith("c")]
    a, b = (cx[v] for v in sorted(raw))
    assert a != b and a // 2 == b // 2  # the layout q // 2 evaluated at both raw children
    (into,) = kinds(K.layout_out_bad, "parallel-map.into")
    assert into.status == REFUTED and into.counterexample[[v for v in into.counterexample
                                                          if v.startswith("c")][0]] == 3


def test_parallel_map_preservation_refuted_for_a_map_that_moves_the_parent():
    pm = Map(("p", "i"), (E.Var("p") + E.Var("i") // 4, E.Var("i") % 4))
    (ob,) = discharge([PO.preserve_obligation(None, pm, 1)])
    assert ob.status == REFUTED
    p, i = ob.counterexample["p"], ob.counterexample["i"]
    assert pm.evaluate({E.Var("p"): p, E.Var("i"): i})[0] != p
    good = Map(("p", "i"), (E.Var("p"), E.Var("i") % 4))
    assert discharge([PO.preserve_obligation(None, good, 1)])[0].status == PROVED


def test_memory_layouts():
    import memory_stage

    obs = kinds(memory_stage.transpose_blocks, "layout.injective")
    assert obs and all(o.status == PROVED for o in obs)


def test_inexact_control_flow_never_proves_a_refutation(tmp_path):
    """A data-dependent if over-approximates the instances: a conflict found in the
    approximation is unknown, not refuted."""
    src = tmp_path / "k.py"
    src.write_text(
        "import tilenest as tn\nfrom tilenest import f32\n"
        "@tn.kernel\n"
        "def k(x: tn.Tensor[f32, 'N'], y: tn.Tensor[f32, 'M']):\n"
        "    (n,) = x.shape\n"
        "    for p in tn.parallel(tn.shape(n)):\n"
        "        v = x[tn.coord(p.index()), tn.shape(1)]\n"
        "        if tn.if_(tn.reduce(v, v.dim(0), tn.add) > 0.0):\n"
        "            y(tn.coord(0), tn.shape(1)).store(v)\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("k_inexact", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (ob,) = [o for o in discharge(program_obligations(mod.k.program))
             if o.kind == "noninterference"]
    assert ob.status == UNKNOWN and "over-approximation" in ob.reason


def test_model_instances_decode_index_guards(tmp_path):
    src = tmp_path / "g.py"
    src.write_text(
        "import tilenest as tn\nfrom tilenest import f32\n"
        "@tn.kernel\n"
        "def g(x: tn.Tensor[f32, 'N'], y: tn.Tensor[f32, 'N']):\n"
        "    (n,) = x.shape\n"
        "    for q in tn.parallel(tn.shape(tn.cdiv(n, 4))):\n"
        "        for r in q.parallel(tn.shape(4)):\n"
        "            i = q.index() * 4 + r.index()\n"
        "            if tn.if_(i < n):\n"
        "                y(tn.coord(i), tn.shape(1)).store(\n"
        "                    x[tn.coord(i), tn.shape(1), tn.bounds.checked])\n")
    import importlib.util
    spec = importlib.util.spec_from_file_location("g_guard", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    m = Model(mod.g.program)
    (st,) = m.ops("tensor.store")
    assert m.instance(st).exact
    obs = discharge(program_obligations(mod.g.program))
    assert all(o.status == PROVED for o in obs if o.role == "required"), \
        [(o.kind, o.status) for o in obs]
    x = np.arange(10, dtype=np.float32)
    y = np.zeros(10, np.float32)
    tn.interpret(mod.g.program, x, y)
    assert (y == x).all()
