"""Row folds fused with the row statements after them (``lowering/fusion.py``).

In the SIMT form's sequential input, a nest folding each row of a tile and
the nests over the same rows that use its result (attention's ``m_new``,
``alpha`` and the running maximum's update) become one nest: the thread (or
quad) that finished a row goes on with that row, with no barrier between.
Only a nest reading and writing each row at that row's own index is fused.
"""

from __future__ import annotations

import tilenest as tn
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import loopir as L
from tilenest.lowering.fusion import fuse_row_nests
from tilenest.lowering.simt import _nest
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E
from tilenest.workloads.attention import flash_kernel


def _fold_then(read_at):  # type: ignore[no-untyped-def]
    """``s[i] = sum_j x[i, j]`` over 8 rows, then ``y[i] = s[read_at(i)] * 2``."""
    x = L.Buffer("x", D.f32, "shared", E.Const(64))
    s = L.Buffer("s", D.f32, "shared", E.Const(8))
    y = L.Buffer("y", D.f32, "shared", E.Const(8))
    i, j, k = (L.LVar(n, D.i64) for n in ("i", "j", "k"))
    acc = L.LVar("acc", D.f32)
    iv, jv, kv = (E.Var(v.name) for v in (i, j, k))
    fold = L.For(i, E.Const(0), E.Const(8), (
        L.Assign(acc, L.Const(-0.0, D.f32)),
        L.For(j, E.Const(0), E.Const(8), (L.Assign(acc, L.Bin(
            "add", L.Ref(acc), L.Load(x, L.IExpr(E.add(E.mul(8, iv), jv))), D.f32,
            frozenset({"reassoc"}))),), "serial"),
        L.Store(s, L.IExpr(iv), L.Ref(acc))), "vector")
    use = L.For(k, E.Const(0), E.Const(8), (
        L.Store(y, L.IExpr(read_at(kv)), L.Bin("mul", L.Load(s, L.IExpr(read_at(kv))),
                                               L.Const(2.0, D.f32), D.f32)),), "vector")
    return (fold, use)


def test_a_row_nest_reading_its_own_row_joins_the_fold():
    out = fuse_row_nests(_fold_then(lambda k: k), _nest)
    assert len(out) == 1
    stores = [s.buf.name for s in L.walk(out) if isinstance(s, L.Store)]
    assert stores == ["s", "y"]


def test_a_row_nest_reading_another_row_stays_apart():
    """``y[k] = 2 s[7 - k]`` reads a row another iteration of the fold
    writes: fused, iteration 0 would read ``s[7]`` before it is folded."""
    body = _fold_then(lambda k: E.add(7, E.mul(-1, k)))
    assert fuse_row_nests(body, _nest) == body


def test_attention_updates_its_row_state_where_the_row_is_folded():
    """The new maximum, the rescale factor and the running maximum's update
    are stored by one thread loop (the fold's), and the loop over key
    blocks has at most five barriers: the ring's, two after the row folds'
    partials, one after the row state and one before ``P V``."""
    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=64, dh=64, dv=64)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda", block_threads=256))
    (loop,) = [s for ph in k.phases for s in ph.body if isinstance(s, L.For)
               and s.kind == "serial"]
    owners = {}
    for t in loop.body:
        for st in L.walk((t,)):
            if isinstance(st, L.Store):
                owners.setdefault(st.buf.name.split(".")[0], set()).add(id(t))
    assert len(owners["%m_new"] | owners["%alpha"] | owners["%m_2"]) == 1
    assert sum(1 for t in loop.body if L.is_block_barrier(t)) <= 5


def test_decode_scores_fold_in_registers_however_few_their_rows():
    """Decode's 16-row score tile (fewer rows than a quarter of the block)
    still takes the one-fold-per-row shape, since its rows fold in the
    tensor-core result's registers: the scores, their mask and exponentials
    leave shared memory and the key loop keeps at most 5 barriers."""
    from tilenest.workloads.attention import split_kv_kernel

    kern = split_kv_kernel(tn.bf16).specialize(bq=16, bk=64, dh=64, dv=64)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda"))
    assert not [b for b in k.locals if b.space == "shared" and b.dtype == tn.f32
                and b.size.value >= 16 * 64]
    assert len([b for b in k.locals if ".frag" in b.name]) >= 4
    (loop,) = [s for ph in k.phases for s in ph.body if isinstance(s, L.For)
               and s.kind == "serial"]
    assert sum(1 for t in loop.body if L.is_block_barrier(t)) <= 5
