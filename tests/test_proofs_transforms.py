"""The transform API: every transform kind is proved on symbolic extents, its
rewritten program verifies, and the interpreter gives identical outputs
before and after on random inputs; wrong witnesses are refuted with
counterexamples re-checked against the original maps."""

from __future__ import annotations

import numpy as np
import pytest
from mutations import kernels as K
from mutations import recheck as RC

import tilenest as tn
from tilenest.proofs.obligation import PROVED, REFUTED
from tilenest.semantics import expr as E
from tilenest.semantics.verify import verify

T = tn.transform


def outputs(p, *arrays):
    arrs = [a.copy() for a in arrays]
    tn.interpret(p, *arrs)
    return arrs


def same_on_random(src, dst, shapes, seeds=(0, 1, 2)):
    for shape in shapes:
        for seed in seeds:
            rng = np.random.default_rng(seed)
            args = [rng.standard_normal(s).astype(np.float32) for s in shape]
            a = outputs(src, *args)
            b = outputs(dst, *args)
            for x, y in zip(a, b, strict=True):
                assert x.tobytes() == y.tobytes(), (shape, seed)


# (name, kernel, transform, argument shapes at several sizes)
KINDS = [
    ("split", K.flat, lambda p: T.split(p, 1, 0, 4), [[(10,), (10,)], [(8,), (8,)], [(1,), (1,)]]),
    ("split in place", K.flat, lambda p: T.split(p, 1, 0, 3, nest=False),
     [[(10,), (10,)], [(7,), (7,)]]),
    ("fuse", K.two, lambda p: T.fuse(p, 1), [[(5, 4), (5, 4)], [(1, 4), (1, 4)]]),
    ("fuse (merge levels)", K.two, lambda p: T.fuse(p, 1, linear=False), [[(5, 4), (5, 4)]]),
    ("coalesce", K.grid8, lambda p: T.coalesce(p, 1), [[(3, 8), (3, 8)], [(6, 8), (6, 8)]]),
    ("reshape", K.grid8, lambda p: T.reshape(p, 1, [E.Sym("R") * 2, 4]),
     [[(3, 8), (3, 8)], [(5, 8), (5, 8)]]),
    ("permute", K.grid, lambda p: T.permute(p, 1, [1, 0]), [[(3, 5), (3, 5)]]),
    ("permute across levels", K.mem_owner2, lambda p: T.permute(p, 1, [1, 0, 2]),
     [[(3, 8), (3, 8)]]),
    ("interchange", K.two, lambda p: T.interchange(p, 1), [[(5, 4), (5, 4)]]),
    ("tile", K.grid8, lambda p: T.tile(p, 1, [2, 4]), [[(5, 8), (5, 8)], [(4, 8), (4, 8)]]),
    ("insert_unit", K.flat, lambda p: T.insert_unit(p, 1), [[(6,), (6,)]]),
    ("remove_unit", K.unit, lambda p: T.remove_unit(p, 1), [[(6,), (6,)]]),
    ("compose", K.grid8, lambda p: T.compose(p, [("coalesce", (1,), {}),
                                                 ("split", (1, 0, 16), {}),
                                                 ("insert_unit", (2,), {})]),
     [[(5, 8), (5, 8)], [(2, 8), (2, 8)]]),
    ("split with carried patches", K.owner, lambda p: T.split(p, 2, 0, 2),
     [[(3, 4), (3, 4)], [(1, 4), (1, 4)]]),
    ("fuse with carried patches", K.owner, lambda p: T.fuse(T.split(p, 2, 0, 2), 2),
     [[(3, 4), (3, 4)]]),
]


@pytest.mark.parametrize("name,kernel,fn,shapes", [k for k in KINDS if k[1] is not None],
                         ids=[k[0] for k in KINDS if k[1] is not None])
def test_transform_proved_verifies_and_agrees(name, kernel, fn, shapes):
    t = fn(kernel.program).check(timeout=10)
    bad = [(o.kind, o.status, o.reason) for o in t.obligations if o.status != PROVED]
    assert not bad, bad
    assert t.admitted and t.result is t.program
    verify(t.program)
    same_on_random(kernel.program, t.program, shapes)


@pytest.mark.parametrize("how", ["split", "tile", "split+bind"])
def test_gemm_transforms_agree_on_ragged_sizes(how):
    import gemm

    p = gemm.gemm
    t = {"split": lambda: T.split(p, 1, 0, 2),
         "tile": lambda: T.tile(p, 1, [2, 2]),
         "split+bind": lambda: T.bind(T.split(p, 1, 0, 2), "cuda")}[how]().check()
    assert t.admitted, [(o.kind, o.status, o.reason) for o in t.obligations]
    rng = np.random.default_rng(3)
    for m, k, n in ((70, 40, 50), (33, 1, 65), (96, 64, 32)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        c1, c2 = np.zeros((m, n), np.float32), np.zeros((m, n), np.float32)
        tn.interpret(p.program, a, b, c1)
        tn.interpret(t.program, a, b, c2)
        assert c1.tobytes() == c2.tobytes()


def test_split_levels_and_rho():
    t = T.split(K.two.program, 2, 0, 2)
    lv = t.program.analysis.nest.levels
    assert set(lv) == {0, 1, 2, 3} and lv[3].parent == 2 and lv[2].parent == 1
    assert t.level_map == {2: 3}
    assert "tau(" in t.steps[0]


def test_refused_transform_keeps_source():
    t = T.remove_unit(K.flat.program, 1).check()
    assert not t.admitted and t.result is t.source
    (cov,) = [o for o in t.obligations if o.kind == "tau.cover"]
    assert cov.status == REFUTED
    assert "old point" in " ".join(cov.counterexample_lines())
    RC.remap(cov)


def test_split_tail_counterexample_rechecked_symbolically():
    """Without the guard some new point lands outside [0, N): the counterexample
    names N and the new coordinates; tau evaluated there is out of range."""
    t = T.split(K.flat.program, 1, 0, 4, guard=False).check()
    (f,) = [o for o in t.obligations if o.kind == "tau.function"]
    assert f.status == REFUTED
    cx = f.counterexample
    n = cx["N"]
    q, r = (cx[v] for v in cx if v.endswith("_o'")), (cx[v] for v in cx if v.endswith("_i'"))
    i = next(q) * 4 + next(r)
    assert not 0 <= i < n
    assert RC.remap(f)


def test_fuse_identity_cut_refuted_with_two_prefixes():
    t = T.fuse(K.owner.program, 1).check()
    ids = [o for o in t.obligations if o.kind == "cut.identity"]
    assert ids and ids[0].status == REFUTED
    assert "claim one old identity" in "\n".join(ids[0].counterexample_lines())
    RC.remap(ids[0])
    assert not t.admitted


def test_interchange_memory_owner_refuted_and_no_candidate():
    t = T.interchange(K.mem_owner.program, 1).check()
    f = [o for o in t.obligations if o.kind == "cut.factor"]
    assert f and f[0].status == REFUTED
    text = "\n".join(f[0].counterexample_lines())
    assert "sharing" in text and "different old ancestors" in text
    assert t.program is None and not t.admitted


def test_symbolic_inner_extent_is_unknown_not_proved():
    """Coalescing (R, C) needs f div C: outside Presburger arithmetic; the checker
    may prove it with Z3 or say unknown, but never reports an unproved claim."""
    t = T.coalesce(K.grid.program, 1).check(timeout=2)
    for o in t.obligations:
        assert o.status in (PROVED, "unknown"), (o.kind, o.status)
        if o.status == "unknown":
            assert o.reason


def test_transform_errors_are_user_errors():
    with pytest.raises(tn.errors.TilenestError):
        T.split(K.flat.program, 7, 0, 2)
    with pytest.raises(tn.errors.TilenestError):
        T.split(K.flat.program, 1, 3, 2)
    with pytest.raises(tn.errors.TilenestError):
        T.split(K.flat.program, 1, 0, 0)
    with pytest.raises(tn.errors.TilenestError):
        T.fuse(K.flat.program, 1)
    with pytest.raises(tn.errors.TilenestError):
        T.tile(K.flat.program, 1, [1])


def test_debug_mode_rechecks_after_every_rewrite():
    r = T.check(K.grid8.program, ["coalesce(1)", "split(1, 0, 4)"], debug=True)
    after = [o for o in r.obligations if o.title.startswith("[after")]
    assert {o.title.split("]")[0] for o in after} == {"[after coalesce", "[after split"}
    assert r.exit_status == 0
