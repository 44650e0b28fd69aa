"""Reducer laws with Z3 (bit-vectors, IEEE floats, reals) and reduction
placement (participants x serial steps): permission and law are separate
evidence."""

from __future__ import annotations

import numpy as np
import pytest
from mutations import kernels as K
from mutations import recheck as RC

import tilenest as tn
from tilenest.proofs import reductions as RD
from tilenest.proofs.obligation import PROVED, REFUTED, discharge, outcome
from tilenest.semantics.dtypes import bool_, f32, i8, i32, u16
from tilenest.semantics.reducers import BUILTINS

T = tn.transform


def laws(dt, name, **kw):
    b = BUILTINS[name]
    return discharge(RD.law_obligations(RD.builtin_merge(b), (b.identity(dt),), dt, 1, name, (),
                                        need_comm=True, **kw), timeout=10)


@pytest.mark.parametrize("dt", [i32, i8, u16])
@pytest.mark.parametrize("name", ["add", "max", "min", "and", "or", "xor"])
def test_integer_laws_proved_exactly(dt, name):
    obs = laws(dt, name)
    assert [o.status for o in obs] == [PROVED] * 3, [(o.kind, o.reason) for o in obs]
    assert all("bit" in o.engine for o in obs)


@pytest.mark.parametrize("name", ["and", "or", "xor", "max", "min"])
def test_bool_laws(name):
    assert all(o.status == PROVED for o in laws(bool_, name))


def test_float_add_associativity_refuted_with_fp_counterexample():
    obs = laws(f32, "add", role="evidence", note="permitted")
    assoc = obs[0]
    assert assoc.kind == "reduction.law.associative" and assoc.status == REFUTED
    assert "float32" in RC.float_assoc(assoc)
    assert obs[1].status == PROVED  # IEEE add is commutative (NaN payloads aside)
    assert obs[2].status == PROVED  # -0.0 is a two-sided identity
    assert outcome(obs) == 0  # evidence never decides the outcome


@pytest.mark.parametrize("dtn", ["f16", "bf16", "f32", "f64"])
@pytest.mark.parametrize("name", ["add", "mul"])
def test_float_associativity_refuted_without_solver_time(dtn, name):
    # the refutation must not depend on how fast the solver runs on a loaded
    # machine: with no time for the solver, the fixed probe points decide it
    from tilenest.semantics import dtypes

    dt = getattr(dtypes, dtn)
    b = BUILTINS[name]
    obs = discharge(RD.law_obligations(RD.builtin_merge(b), (b.identity(dt),), dt, 1, name, (),
                                       need_comm=True, role="evidence"), timeout=0.001)
    assoc = obs[0]
    assert assoc.kind == "reduction.law.associative" and assoc.status == REFUTED
    point = assoc.counterexample
    assert point["lhs"] != point["rhs"]


def test_float_max_is_exact():
    assert all(o.status == PROVED for o in laws(f32, "max"))


def test_softmax_law_and_permission_are_separate():
    import softmax

    r = T.check(softmax.row_softmax.program)
    law = [o for o in r.obligations if o.kind.startswith("reduction.law")]
    ev = [o for o in law if o.role == "evidence"]
    assert ev and any(o.status == REFUTED for o in ev)
    assert all(o.status == PROVED for o in law if o.role == "required")
    assert r.exit_status == 0


def test_custom_reducer_laws_over_reals_and_ieee():
    import kernels_constructs as KC

    from tilenest.proofs.model import Model

    obs = discharge(RD.program_reduction_obligations(Model(KC.custom_reducer.program)))
    req = [o for o in obs if o.role == "required"]
    assert req and all(o.status == PROVED and "reals" in o.engine for o in req)
    assert any(o.status == REFUTED for o in obs if o.role == "evidence")


def test_placement_blocked_and_strided():
    t = T.place_reduction(K.isum.program, 0, 4, "strided").check()
    assert all(o.status == PROVED for o in t.obligations if o.role == "required")
    t = T.place_reduction(K.ordered.program, 0, 4, "blocked").check()
    assert [o.status for o in t.obligations if o.kind == "reduction.order"] == [PROVED]
    t = T.place_reduction(K.ordered.program, 0, 4, "strided").check()
    (o,) = [o for o in t.obligations if o.kind == "reduction.order"]
    assert o.status == REFUTED and RC.placement(o)


def test_fold_policies_admit_no_placement():
    t = T.place_reduction(K.folded.program, 0, 2).check()
    (perm,) = [o for o in t.obligations if o.kind == "reduction.permission"]
    assert perm.status == REFUTED and "fold_left" in perm.reason
    assert not [o for o in t.obligations if o.kind.startswith("reduction.law")]


def test_placement_on_a_non_divisor_and_on_symbolic_participants():
    t = T.place_reduction(K.isum.program, 0, 3, "blocked").check()
    assert all(o.status == PROVED for o in t.obligations if o.role == "required")
    # participants = R (a second symbol): p*S is non-affine; Z3 proves or says unknown
    from tilenest.semantics import expr as E

    t = T.place_reduction(K.isum.program, 0, E.Sym("R"), "strided").check(timeout=3)
    assert all(o.status in (PROVED, "unknown") for o in t.obligations)


def test_float_counterexample_matches_numpy_rounding():
    (a,) = [o for o in laws(f32, "add", role="evidence") if o.kind.endswith("associative")]
    cx = a.counterexample
    x, y, z = (np.float32(cx[k][0]) for k in "abc")
    with np.errstate(all="ignore"):
        sides = {"lhs": (x + y) + z, "rhs": x + (y + z)}
    for k, want in sides.items():
        got = np.float32(cx[k][0])
        # bitwise, but a NaN's sign and payload are not part of IEEE results
        assert (np.isnan(got) and np.isnan(want)) or got.tobytes() == want.tobytes()


def test_strided_placement_of_a_commutative_custom_reducer_needs_no_order():
    """Only a tree that must keep source order (``ordered_tree``, or a merge
    that is not commutative) states ``reduction.order``; a commutative custom
    contract under ``unordered_tree`` is placed strided like a builtin one.
    Its laws are stated once per contract, not once per state it covers."""
    import kernels_constructs as KC

    t = T.place_reduction(KC.custom_reducer.program, 0, 4, "strided").check()
    assert not [o for o in t.obligations if o.kind == "reduction.order"]
    assert all(o.status == PROVED for o in t.obligations
               if o.role == "required" and not o.kind.startswith("reduction.law"))
    kinds = [(o.kind, o.title) for o in t.obligations if o.kind.startswith("reduction.law")]
    assert kinds and len(kinds) == len(set(kinds))
