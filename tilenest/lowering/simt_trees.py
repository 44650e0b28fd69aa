"""SIMT placement of reductions under custom contracts (a ``TreeFold`` loop).

A ``serial`` loop marked with a :class:`~tilenest.lowering.loopir.TreeFold`
folds its states with a tree-permitted reducer whose merge is an arbitrary
scalar function of (tuple) states. :func:`distribute_tree` runs it on the
``W`` threads of a program as the :class:`~tilenest.semantics.trees.BlockTree`
(its docstring fixes the tree)::

    for.thread t in [0, W):
      p = identity                                  -- one local per component
      for r in [0, S):                              -- S = cdiv(n, W)
        if l < n:  i = lo + l;  body[states := p]   -- l = r W + t (strided)
                                                    --   or t S + r (blocked)
      for o in 1, 2, 4, 8, 16:                      -- lanes, pairwise in order
        q = shuffle.xor(p, o)                       -- every component
        p = merge(lower lane's, upper lane's)       -- by bit o of the lane
      if t % 32 == 0:  red[t / 32] = p              -- shared, one slot per warp
    barrier
    tot = red[0];  tot = merge(tot, red[j]) for j = 1 .. W/32 - 1   (uniform)
    states = merge(states, tot)

``blocked`` (each thread a contiguous run, partials in source order) is used
when the tree must keep source order (``ordered_tree``, or a merge that is
not commutative); ``strided`` (consecutive threads on consecutive elements:
coalesced loads) otherwise. The lane step pairs lanes by the xor butterfly,
and both lanes of a pair compute ``merge(lower, upper)`` -- the same value --
so after step ``o`` every lane holds the ordered tree of its aligned group of
``2 o`` lanes. The loop's task map is recorded as a :class:`TreePlacement`:
its exact coverage is an obligation (``taskmap.coverage``) and the
reduction's placement is stated against the program
(``proofs/reductions.py``: ``reduction.cover``, ``reduction.permission``,
``reduction.order`` for ``blocked``). Strict folds never carry a
``TreeFold``, so they are never regrouped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..semantics import dtypes as D
from ..semantics import expr as E
from ..semantics.trees import BlockTree
from . import loopir as L
from . import simt as S


@dataclass(frozen=True)
class TreePlacement:
    """A ``TreeFold`` loop of ``n`` iterations placed as ``tree`` (reduce op
    ``oid``); an entry of ``simt_kernel``'s ``maps``."""

    oid: int
    tree: BlockTree
    n: E.Expr

    def taskmap(self) -> Any:
        """The loop's task map (``simt.distribution``)."""
        return S.distribution(self.tree.threads, 1, self.n, self.tree.blocked)


_UNSAFE = (L.Store, L.Barrier, L.Shuffle, L.LaneReduce, L.WarpMma, L.While)


def distribute_tree(ph: Any, s: L.For, defined: set[str]) -> list | None:
    """The program-level steps running ``s`` (a ``TreeFold`` loop, at program
    level in phase rewrite ``ph``) as a block tree; None when its body does
    more than update the states (a store, a collective, another carried
    local, a nested loop of threads), which keeps it in order."""
    tf: L.TreeFold = s.tree
    names = [v.name for v in tf.states]
    inner = s.body
    if sorted(S._carried(inner, defined)) != sorted(names):
        return None
    if any(isinstance(t, _UNSAFE) or (isinstance(t, L.For) and t.kind != "serial")
           for t in L.walk(inner)):
        return None
    W = ph.W
    tree = BlockTree(W, tf.ordered, S.WARP)
    n = E.add(s.hi, E.mul(-1, s.lo))
    ph.maps.append(TreePlacement(tf.oid, tree, n))
    t, r = S._fresh("t", D.i64), S._fresh("r", D.i64)
    tv, rv = E.Var(t.name), E.Var(r.name)
    steps = E.cdiv(n, W)
    lin = E.add(E.mul(tv, steps), rv) if tree.blocked else E.add(E.mul(rv, W), tv)
    part = [S._fresh(f"part_{v.name.split('.')[0]}", v.dtype) for v in tf.states]
    ren = {v.name: p for v, p in zip(tf.states, part, strict=True)}

    def fe(x: Any) -> Any:
        if isinstance(x, L.Ref) and x.var.name in ren:
            return L.Ref(ren[x.var.name])
        return None

    def fs(st: Any) -> Any:
        if isinstance(st, L.Assign) and st.var.name in ren:
            return (L.Assign(ren[st.var.name], st.value),)
        return None

    work = (L.Assign(s.var, L.IExpr(E.add(s.lo, lin))),) + L.map_stmts(inner, fe, fs)
    body: list = [L.Assign(p, c) for p, c in zip(part, tf.identity, strict=True)]
    body.append(L.For(r, E.Const(0), steps, (L.If(L.IPred(E.cmp("<", lin, n)), work),),
                      "serial"))
    news = [S._fresh(f"m_{v.name.split('.')[0]}", v.dtype) for v in tf.states]
    # lanes: the xor butterfly, the lower lane's state on the left of every merge
    o = 1
    while o < S.WARP:
        got = [S._fresh(f"sh_{v.name.split('.')[0]}", v.dtype) for v in tf.states]
        body += [L.Shuffle(g, L.Ref(p), E.Const(o), "xor", S.WARP)
                 for g, p in zip(got, part, strict=True)]
        low = L.IPred(E.cmp("==", E.mod(E.floordiv(tv, o), 2), 0))
        body += merge(tf, [L.Select(low, L.Ref(p), L.Ref(g)) for p, g in zip(part, got)],
                      [L.Select(low, L.Ref(g), L.Ref(p)) for p, g in zip(part, got)],
                      part, news)
        o *= 2
    bufs = [ph.scratch_for(v.dtype, k) for k, v in enumerate(tf.states)]
    body.append(L.If(L.IPred(E.cmp("==", E.mod(tv, S.WARP), 0)),
                     tuple(L.Store(b, L.IExpr(E.floordiv(tv, S.WARP)), L.Ref(p))
                           for b, p in zip(bufs, part, strict=True))))
    loop = L.For(t, E.Const(0), E.Const(W), tuple(body), "thread", scope="block")
    # warps in order, then the seed on the left (uniform)
    tot = [S._fresh(f"tot_{v.name.split('.')[0]}", v.dtype) for v in tf.states]
    fold: list = [L.Assign(x, L.Load(b, L.IExpr(E.Const(0)))) for x, b in zip(tot, bufs)]
    for j in range(1, W // S.WARP):
        fold += merge(tf, [L.Ref(x) for x in tot],
                      [L.Load(b, L.IExpr(E.Const(j))) for b in bufs], tot, news)
    fold += merge(tf, [L.Ref(v) for v in tf.states], [L.Ref(x) for x in tot],
                  list(tf.states), news)
    return [((loop,), S.accesses((loop,), True)), (tuple(fold), S.accesses(tuple(fold), False))]


def merge(tf: L.TreeFold, left: list, right: list, dst: list, tmp: list) -> list:
    """Statements setting the locals ``dst`` to ``merge(left, right)`` (the
    contract's merge of ``tf`` on two states given as expressions; ``tmp``
    holds the results while ``dst`` may still be read)."""
    out: list = [L.Assign(a, x) for a, x in zip(tf.a, left, strict=True)]
    out += [L.Assign(b, x) for b, x in zip(tf.b, right, strict=True)]
    out += list(tf.body)
    out += [L.Assign(m, x) for m, x in zip(tmp, tf.out, strict=True)]
    out += [L.Assign(d, L.Ref(m)) for d, m in zip(dst, tmp, strict=True)]
    return out
