"""Static semantics: nest, contexts, anchors, frontiers, Active, owners,
collective ancestor updates and reducer-contract inference."""

from __future__ import annotations

import kernels_constructs as K
import tilenest as tn
from tilenest import f32
from tilenest.semantics import expr as E
from tilenest.semantics.policies import ReductionPolicy


def ops(p, name):
    return [op for op in p.walk() if op.name == name]


def test_mma_anchor_nest_frontier_subnest():
    """acc declared in nest, updated inside subnest -> pipeline: anchor(mma) = nest,
    frontier(mma) = subnest; the update is one collective op per nest."""
    p = K.nest_subnest_update.program
    an = p.analysis
    (mma,) = ops(p, "mma")
    nest_l, sub_l = (op.attrs["level"] for op in ops(p, "parallel"))
    assert an.anchor[mma.oid] == nest_l
    assert an.frontier[mma.oid] == sub_l
    assert an.nest.levels[sub_l].parent == nest_l
    sub = ops(p, "parallel")[1]
    assert an.ancestor_updates[sub.oid] == ("collective",)
    # the pipeline is temporal: it does not change the frontier
    (pipe,) = ops(p, "pipeline")
    assert an.context[mma.oid].T[-1] == pipe.oid
    assert an.context[mma.oid].P == (0, nest_l, sub_l)


def test_per_child_patch_update_and_exec_layout():
    p = K.per_child_patches.program
    an = p.analysis
    outer, inner = ops(p, "parallel")
    assert an.ancestor_updates[inner.oid] == ("per-child",)
    ex = inner.attrs["exec"]
    assert ex.scope == "thread"
    assert ex.layout.outputs == (3 - E.Var(inner.attrs["vars"][0]),)


def test_per_forces_deeper_anchor():
    @tn.kernel
    def k(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
        for p in tn.parallel(tn.shape(2)):
            for q in p.parallel(tn.shape(2)):
                c = tn.scalar(1.0, f32)
                d = tn.per(q, c)
                y(tn.coord(p.index() * 2 + q.index()), tn.shape(1)).store(
                    tn.broadcast(d, tn.shape(tn.axis(y.dim(0), 1))))

    p = k.program
    an = p.analysis
    (const,) = ops(p, "const")
    (per,) = ops(p, "per")
    q_level = ops(p, "parallel")[1].attrs["level"]
    assert an.anchor[const.oid] == 0
    assert an.anchor[per.oid] == q_level


def test_active_is_prefix_indexset():
    p = K.nest_subnest_update.program
    an = p.analysis
    (mma,) = ops(p, "mma")
    act = an.active(mma.oid)
    assert act.rank == 3  # two nest coordinates and one subnest coordinate
    assert [str(v) for v in act.vars] == [*ops(p, "parallel")[0].attrs["vars"],
                                           *ops(p, "parallel")[1].attrs["vars"]]


def test_memory_owner_is_nearest_parallel():
    p = K.memory_and_layouts.program
    an = p.analysis
    (par,) = ops(p, "parallel")
    assert set(an.owner.values()) == {par.attrs["level"]}
    assert len(an.owner) == 3
    allocs = ops(p, "memory.alloc")
    assert [a.results[0].type.resource for a in allocs] == ["shared", "private", "auto"]


def test_reduce_contracts_inferred_and_policies_kept():
    p = K.all_regions.program
    (red,) = [op for op in ops(p, "reduce") if op.attrs["policy"] is ReductionPolicy.unordered_tree
              and op.attrs["contracts"] == ("add",)][:1]
    assert red.attrs["contracts"] == ("add",)
    g = K.gemm_reduce_fold.program
    (r,) = ops(g, "reduce")
    assert r.attrs["policy"] is ReductionPolicy.fold_left
    assert r.attrs["contracts"] == (None,)
    (mma,) = ops(g, "mma")
    assert mma.attrs["allow_reassociation"] is False
    c = K.custom_reducer.program
    (r,) = ops(c, "reduce")
    assert r.attrs["contracts"] == ("@sum_and_count", "@sum_and_count")
    assert c.reducers[0].name == "sum_and_count"


def test_eight_parts_are_inspectable():
    p = K.all_regions.program
    assert set(p.E.levels) == {0, 1, 2}
    assert {op.name for op in p.R} >= {"parallel", "serial", "pipeline", "reduce", "stage"}
    assert len(p.G) > 5
    assert p.M == ()
    assert any(k.endswith(".map") for k in p.L)
    assert list(p.A.values())[0][0] is ReductionPolicy.unordered_tree
    (pol,) = p.Pi.values()
    assert (pol.window, pol.interval) == (2, 1)
    assert "assumptions" in p.C and p.C["exec"]
    m = K.memory_and_layouts.program
    assert len(m.M) == 3 and any(k.endswith("mem.layout") for k in m.L)


def test_assumptions_and_symbolic_extents():
    p = K.values_zoo.program
    assert p.assumptions == (E.Sym("N").ge(1),)
    assert "N" in p.syms
    (par,) = [op for op in ops(p, "parallel")]
    ext = par.attrs["domain"].space.extents[0]
    assert ext == E.cdiv(E.Sym("N"), 16)
