"""ExecBinding obligations: the containment partial order of CUDA-like, Metal,
CPU and custom target catalogues, commuting prefix projections, uniqueness
when levels share a scope, and resource limits -- on symbolic extents."""

from __future__ import annotations

import pytest
from mutations import kernels as K
from mutations import recheck as RC
from mutations.cases import collapse_map, skew_map

import tilenest as tn
from tilenest.proofs.bindings import CPU, CUDA, METAL, Target
from tilenest.proofs.obligation import PROVED, REFUTED

T = tn.transform


def verdicts(t, kind):
    t.check()
    return [o for o in t.obligations if o.kind == kind]


def test_catalogues_are_partial_orders_not_name_orders():
    assert CUDA.contains("cluster", "thread") and CUDA.contains("block", "warp")
    assert not CUDA.contains("warp", "block") and not CUDA.contains("block", "block")
    assert METAL.canon("threadgroup") == "block" and METAL.canon("simdgroup") == "warp"
    assert METAL.canon("cluster") is None
    assert CPU.contains("core", "vector") and not CPU.contains("vector", "core")
    acc = Target.custom("npu", ("chip", "dma", "tensor_core", "lane"),
                        [("chip", "dma"), ("chip", "tensor_core"), ("tensor_core", "lane")])
    assert acc.contains("chip", "lane")
    assert not acc.contains("dma", "tensor_core") and not acc.contains("tensor_core", "dma")


def test_warp_to_block_rejected_citing_both_sites_and_the_relation():
    (ob,) = verdicts(T.bind(K.two.program, "cuda", {1: "warp", 2: "block"}),
                     "binding.containment")
    assert ob.status == REFUTED and ob.engine == "catalogue"
    text = "\n".join(ob.counterexample_lines())
    outer, inner = (s.line for s in ob.sites)
    assert f":{outer}:" in text and f":{inner}:" in text and outer != inner
    assert "contains(warp, block)" in text


def test_incomparable_custom_scopes_cannot_nest():
    acc = Target.custom("npu", ("chip", "dma", "tensor_core"),
                        [("chip", "dma"), ("chip", "tensor_core")],
                        {("chip", "tensor_core"): 8})
    (ob,) = verdicts(T.bind(K.two.program, acc, {1: "dma", 2: "tensor_core"}),
                     "binding.containment")
    assert ob.status == REFUTED and "incomparable" in ob.reason
    t = T.bind(K.two.program, acc, {1: "chip", 2: "tensor_core"}).check()
    assert t.admitted


def test_gemm_split_bound_to_cuda_is_admitted():
    import gemm

    t = T.bind(T.split(gemm.gemm.program, 1, 0, 2), "cuda").check()
    assert t.admitted, [(o.kind, o.status, o.reason) for o in t.obligations]
    kinds = {o.kind for o in t.obligations}
    assert {"binding.scope", "binding.containment", "binding.projection", "binding.unique",
            "binding.limit"} <= kinds
    # the scopes are recorded in the bound program's exec policies
    scopes = [op.attrs["exec"].scope for op in t.program.walk() if op.name == "parallel"]
    assert scopes == ["block", "warp"]


def test_default_binding_uses_exec_constraints():
    import two_level

    t = T.bind(two_level.scale_rows.program, "metal").check()
    assert t.admitted
    assert "level 1 -> block" in t.steps[-1] and "level 2 -> warp" in t.steps[-1]


def test_thread_limit_is_symbolic():
    (ob,) = verdicts(T.bind(K.rowcol.program, "cuda", {1: "block", 2: "thread"}),
                     "binding.limit")
    assert ob.status == REFUTED and ob.counterexample["C"] == 1025
    assert RC.binding(ob, K.rowcol.program)


def test_shared_scope_cardinality_and_uniqueness():
    p = T.split(K.flat.program, 1, 0, 64).program
    t = T.bind(p, "cuda", {1: "thread", 2: "thread"})
    (c,) = verdicts(t, "binding.containment")
    assert c.status == PROVED and c.reason == "one shared scope"
    assert all(o.status == PROVED for o in verdicts(t, "binding.unique"))


@pytest.mark.parametrize("mk,kind", [(collapse_map, "binding.unique"),
                                     (skew_map, "binding.projection")])
def test_custom_maps_refuted_with_instances(mk, kind):
    p = K.two.program
    (ob,) = [o for o in verdicts(T.bind(p, "cuda", {1: "block", 2: "thread"}, mk(p)), kind)]
    assert ob.status == REFUTED
    assert RC.binding(ob, p)


def test_unknown_target_is_a_user_error():
    with pytest.raises(tn.errors.TilenestError):
        T.bind(K.two.program, "tpu")
    with pytest.raises(tn.errors.TilenestError):
        T.bind(K.two.program, "cuda", {9: "block"})
