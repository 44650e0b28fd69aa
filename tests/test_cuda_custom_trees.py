"""Custom tree-permitted reducers on the SIMT form: the block tree.

A reduction under a custom contract (Welford's ``(count, mean, M2)``) with a
tree policy is placed like a built-in one: per-thread partial states, merged
across lanes by shuffles of every component and across warps through shared
memory (``lowering/simt_trees.py``), in the fixed tree of
``semantics/trees.py``, which the reference evaluates too. Folds stay in
order."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.backends.simt.emulator import POLICIES
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import loopir as L
from tilenest.semantics.trees import BlockTree


def _merge(na, ma, qa, nb, mb, qb):
    """Welford's merge of two (count, mean, M2) states (Chan et al.)."""
    n = na + nb
    d = mb - ma
    w = tn.ite(n > 0.0, nb / tn.maximum(n, 1.0), 0.0)
    return n, ma + d * w, qa + qb + d * d * na * w


def welford(policy):
    @tn.kernel
    def row_stats(x: tn.Tensor[f32, "R C"], mean: tn.Tensor[f32, "R"],
                  var: tn.Tensor[f32, "R"]):
        rows, cols = x.shape
        mean = mean.with_dims(x.dim(0))
        var = var.with_dims(x.dim(0))
        wf = tn.reducer("welford", identity=(0.0, 0.0, 0.0), merge=_merge,
                        dtype=(f32, f32, f32))
        for p in tn.parallel(tn.shape(rows)):
            row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
            n = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
            m = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
            q = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
            for r in p.reduce(row.domain(row.dim(1)), contract=wf, policy=policy):
                n, m, q = _merge(n, m, q, 1.0, row.at(r), 0.0)   # = merge(s, lift(x))
            mean(tn.coord(p.index()), tn.shape(1)).store(m)
            var(tn.coord(p.index()), tn.shape(1)).store(q / n)

    return row_stats


UNORDERED = welford(tn.unordered_tree)
ORDERED = welford(tn.ordered_tree)
FOLD = welford(tn.fold_left)


def _rows(rows=3, cols=2000, seed=0):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 3 + 100).astype(np.float32)
    return x, np.zeros(rows, np.float32), np.zeros(rows, np.float32)


def _simt(kernel):
    return lower_verified(kernel.program, default_schedule(kernel.program, "cuda"))


def _reads_x(body):
    return any(isinstance(y, L.Load) and y.buf.name == "x"
               for s in L.walk(body) for e in L.stmt_exprs(s) for y in L.subexprs(e))


def _element_loops(k):
    """``(loop, enclosing statements)`` of the innermost loops reading ``x``."""
    out = []
    for ph in k.phases:
        for st, path in L.walk_paths(ph.body):
            if isinstance(st, L.For) and _reads_x(st.body) and not any(
                    isinstance(s, L.For) and _reads_x(s.body) for s in L.walk(st.body)):
                out.append((st, path))
    return out


# ---------------------------------------------------------------------------
# the tree itself


@pytest.mark.parametrize("blocked", [False, True])
@pytest.mark.parametrize("n", [0, 1, 31, 256, 257, 1000])
def test_block_tree_places_every_contribution_once(n, blocked):
    t = BlockTree(64, blocked)
    segs = t.segments(n)
    assert len(segs) == 64
    assert sorted(i for s in segs for i in s) == list(range(n))
    for s in segs:
        assert s == sorted(s)


def test_blocked_tree_keeps_source_order():
    t = BlockTree(64, True)
    leaves = [f"<{i}>" for i in range(300)]
    parts = ["".join(leaves[i] for i in seg) for seg in t.segments(300)]
    assert t.combine(parts, lambda a, b: a + b) == "".join(leaves)
    strided = BlockTree(64, False)
    parts = ["".join(leaves[i] for i in seg) for seg in strided.segments(300)]
    assert strided.combine(parts, lambda a, b: a + b) != "".join(leaves)


def test_block_tree_merges_lanes_pairwise_and_warps_in_order():
    t = BlockTree(64, True)
    got = t.combine([str(i) for i in range(64)], lambda a, b: f"({a} {b})")

    def balanced(lo, hi):  # the pairwise tree over lanes [lo, hi)
        if hi - lo == 1:
            return str(lo)
        mid = (lo + hi) // 2
        return f"({balanced(lo, mid)} {balanced(mid, hi)})"

    assert got == f"({balanced(0, 32)} {balanced(32, 64)})"   # warp 0, then warp 1
    assert BlockTree(96, True).combine([str(i) for i in range(96)],
                                       lambda a, b: f"({a} {b})") == \
        f"(({balanced(0, 32)} {balanced(32, 64)}) {balanced(64, 96)})"   # warps fold left
    with pytest.raises(ValueError):
        BlockTree(48, False)


# ---------------------------------------------------------------------------
# placement in the SIMT loop IR


def test_custom_tree_element_loop_is_distributed_without_barriers():
    k = _simt(UNORDERED)
    loops = _element_loops(k)
    assert loops, "no loop reads x"
    for loop, path in loops:
        # the loop over the row's elements runs inside a loop of 256 threads
        threads = [s for s in path if isinstance(s, L.For) and s.kind == "thread"]
        assert [int(s.hi.value) for s in threads] == [256]
        assert not any(isinstance(s, L.Barrier) for s in L.walk(loop.body))
    # every state component is exchanged by the 5 lane steps of a warp
    shuffles = [s for ph in k.phases for s in L.walk(ph.body) if isinstance(s, L.Shuffle)]
    assert len(shuffles) == 3 * 5 and {s.mode for s in shuffles} == {"xor"}


def test_fold_policy_stays_in_order():
    k = _simt(FOLD)
    for loop, path in _element_loops(k):
        assert not any(isinstance(s, L.For) and s.kind == "thread" for s in path)
        assert loop.kind == "serial" and loop.tree is None
    assert not any(isinstance(s, L.Shuffle) for ph in k.phases for s in L.walk(ph.body))
    ck = FOLD.compile(target="cuda", device="emulated")
    assert ck.trees == {}
    x, m, v = _rows(cols=300)
    ck(x, m, v)
    adm = tn.reference(FOLD, *_rows(cols=300))
    assert all(a.admits(o) for a, o in zip(adm, (m, v)))   # bitwise: the fold's order


def test_tree_placement_obligations():
    for kernel, order in ((UNORDERED, "strided"), (ORDERED, "blocked")):
        ck = kernel.compile(target="cuda", device="emulated")
        (tree,) = ck.trees.values()
        assert tree.blocked == (order == "blocked")
        kinds = {(o.kind, o.status) for o in ck.obligations
                 if o.kind.startswith("reduction.") and o.role == "required"}
        assert ("reduction.cover", "proved") in kinds
        assert ("reduction.permission", "proved") in kinds
        assert (("reduction.order", "proved") in kinds) == (order == "blocked")
        covers = [o.title for o in ck.obligations if o.kind == "taskmap.coverage"]
        want = "spatial(256) * repeat((C + 255) // 256)" if order == "blocked" else \
            "repeat((C + 255) // 256) * spatial(256)"
        assert any(want in c for c in covers), covers


# ---------------------------------------------------------------------------
# validation on the emulator


@pytest.mark.parametrize("kernel", [UNORDERED, ORDERED], ids=["unordered", "ordered"])
def test_welford_row_statistics_under_every_interleaving(kernel):
    ck = kernel.compile(target="cuda", device="emulated")
    x, m0, v0 = _rows()
    adm = tn.reference(kernel, x, m0, v0, trees=ck.trees)
    ref64 = x.astype(np.float64)
    for policy in POLICIES:
        m, v = m0.copy(), v0.copy()
        ck(x, m, v, policy=policy, seed=7)
        assert adm[0].admits(m) and adm[1].admits(v), policy
        np.testing.assert_allclose(m, ref64.mean(1), rtol=1e-6)
        np.testing.assert_allclose(v, ref64.var(1), rtol=1e-4)
    rep = tn.validate(kernel, "cuda", cases=4)
    assert rep.ok, rep


def test_reference_without_the_tree_rejects_the_tree_result():
    """The tree's value differs from the canonical fold's: validation is
    judged against the kernel's own tree, not a tolerance."""
    ck = UNORDERED.compile(target="cuda", device="emulated")
    x, m, v = _rows()
    ck(x, m, v)
    canonical = tn.reference(UNORDERED, *_rows())
    assert not (canonical[0].admits(m) and canonical[1].admits(v))
    bare = tn.validate(UNORDERED, "cuda", inputs=list(_rows()),
                       compiled=lambda *a, **kw: ck(*a, **kw))
    assert bare.status == "mismatch"
    assert tn.validate(UNORDERED, "cuda", inputs=list(_rows()), compiled=ck).ok
