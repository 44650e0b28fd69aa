"""A program's tree reduce split over programs (``Schedule.reduce_splits``,
``lowering/phases.parallel_phases``): the phases it makes, the
:class:`~tilenest.semantics.trees.RunTree` a custom contract commits to, and
validation against the reference on llvm, the emulated CUDA device and the
H200 (split-KV decode attention)."""

from __future__ import annotations

import numpy as np
import pytest

import reducer_law_kernels as K
import tilenest as tn
from tilenest import f32
from tilenest.backends import cuda
from tilenest.errors import RuntimeSemanticError, VerifyError
from tilenest.lowering import default_schedule, lower
from tilenest.semantics import expr as E
from tilenest.semantics.trees import RunTree, tree_from_json
from tilenest.validation.validate import validate
from tilenest.workloads import WORKLOADS


def _rows(seed=0, shape=(3, 1000)):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) * 5).astype(np.float32)
    x[1, 17] = -np.inf  # a masked score
    return x, rng.standard_normal(shape).astype(np.float32)


def test_run_tree_segments_and_json():
    t = RunTree(splits=3)
    assert t.segments(10) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert t.segments(2) == [[0], [1]] and t.segments(0) == []
    assert RunTree(per=4).segments(9) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert t.combine([], lambda a, b: a + b) is None
    assert t.combine(["a", "b", "c"], lambda a, b: f"({a}{b})") == "((ab)c)"
    assert tree_from_json(t.to_json()) == t
    with pytest.raises(ValueError):
        RunTree(splits=0)


def test_a_split_makes_a_partials_and_a_combine_phase():
    p = K.softmax_average.program
    one = lower(p, default_schedule(p, "llvm"))
    assert len(one.phases) == 1 and one.trees == ()
    two = lower(p, default_schedule(p, "llvm", reduce_splits=4))
    assert len(two.phases) == 2
    assert len(two.phases[0].extents) == 2 and len(two.phases[1].extents) == 1
    ((oid, tree),) = two.trees
    assert tree == RunTree(splits=4)
    assert any(o.oid == oid and o.name == "reduce" for o in p.walk())
    ck = cuda.compile_program(p, default_schedule(p, "cuda", reduce_splits=3),
                              device="emulated")
    assert len(ck.launches({"R": 3, "N": 1000}, check=False)) == 2


@pytest.mark.parametrize("target,splits", [("llvm", 4), ("cuda", 3), ("metal", 3)])
def test_a_split_custom_reduction_validates_and_its_oracle_is_bounded(target, splits):
    ck = K.softmax_average.compile(target=target, reduce_splits=splits)
    x, v = _rows()
    out = np.zeros(3, np.float32)
    ck(x, v, out)
    w = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(out, (w * v).sum(axis=1) / w.sum(axis=1), rtol=1e-5)
    adm = tn.reference(K.softmax_average, x, v, np.zeros(3, np.float32), trees=ck.trees)
    assert adm.admits(out)
    assert not adm.unbounded_mask.any()
    assert not adm.admits(out * np.float32(1.001))  # the same tree's value, not any value
    rep = validate(K.softmax_average, target=target, cases=5, compiled=ck)
    assert [r.status for r in rep.results] == ["ok"] * 5


def test_a_fixed_block_tree_with_inexact_contributions_is_bounded():
    # the CUDA block tree of the custom merge (no split): exp makes each
    # contribution inexact; the reference evaluates the same tree with its
    # operations' envelopes instead of admitting every value
    ck = K.softmax_average.compile(target="cuda")
    assert ck.trees
    x, v = _rows(1)
    out = np.zeros(3, np.float32)
    ck(x, v, out)
    adm = tn.reference(K.softmax_average, x, v, np.zeros(3, np.float32), trees=ck.trees)
    assert adm.admits(out) and not adm.unbounded_mask.any()
    assert not adm.admits(out * np.float32(1.001))


@tn.kernel
def row_sums(x: tn.Tensor[f32, "R N"], out: tn.Tensor[f32, "R"]):
    rows, n = x.shape
    out = out.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        xr = x[tn.coord(p.index(), 0), tn.shape(1, n)]
        s = tn.zeros(f32, tn.shape(1), dims=(x.dim(0),))
        for r in p.reduce(xr.domain(xr.dim(1))):
            s = s + xr.at(r)
        out(tn.coord(p.index()), tn.shape(1)).store(s)


@pytest.mark.parametrize("target", ["llvm", "cuda"])
def test_a_split_builtin_reduction_keeps_its_closed_envelope(target):
    ck = row_sums.compile(target=target, reduce_splits=5)
    assert ck.trees == {}  # float add: the oracle bounds every grouping
    assert len(ck.kernel.phases if target == "llvm" else ck.launches(
        {"R": 4, "N": 9}, check=False)) == 2
    x = np.random.default_rng(2).standard_normal((4, 1003)).astype(np.float32)
    out = np.zeros(4, np.float32)
    ck(x, out)
    assert tn.reference(row_sums, x, np.zeros(4, np.float32)).admits(out)
    rep = validate(row_sums, target=target, cases=5, compiled=ck)
    assert [r.status for r in rep.results] == ["ok"] * 5


def _split_kv(dh=16):
    return WORKLOADS["split_kv_attention"].kernel(tn.bf16, {"bq": 16, "bk": 16, "dh": dh,
                                                            "dv": dh})


def _gqa_decode(dh=16, bk=16):
    return WORKLOADS["gqa_decode_attention"].kernel(tn.bf16, {"bg": 16, "bk": bk, "dh": dh,
                                                              "dv": dh})


@pytest.mark.parametrize("make", [_split_kv, _gqa_decode], ids=["split_kv", "gqa_decode"])
@pytest.mark.parametrize("target,splits", [("llvm", 2), ("cuda", 3)])
def test_decode_attention_validates_with_split_keys(make, target, splits):
    kern = make()
    ck = kern.compile(target=target, reduce_splits=splits)
    laws = [o for o in ck.obligations if o.kind.startswith("reduction.law.")]
    assert laws and all(o.status == "proved" for o in laws)
    assert list(ck.trees.values()) == [RunTree(splits=splits)]
    rep = validate(kern, target=target, cases=4, compiled=ck)
    assert [r.status for r in rep.results] == ["ok"] * 4


def test_gqa_decode_stores_only_its_group_with_products_on_tensor_cores():
    # 3 query heads per key/value head in a 16-row tile: the 13 rows past the
    # group read +0 and their stores are dropped, so the other groups' rows
    # of o keep what the program of their own group wrote
    kern = _gqa_decode()
    ck = kern.compile(target="cuda", device="emulated", reduce_splits=2, block_threads=64)
    # both products on tensor cores (the heads as the rows of their tiles)
    assert ck.source.text.count("// mma on tensor cores: 16x") == 2
    rng = np.random.default_rng(5)
    q = rng.standard_normal((2, 6, 2, 11)).astype(tn.bf16.np)
    k = rng.standard_normal((2, 2, 23, 11)).astype(tn.bf16.np)
    v = rng.standard_normal((2, 2, 23, 11)).astype(tn.bf16.np)
    o0 = np.full((2, 6, 2, 11), np.nan, tn.bf16.np)
    sc = np.float32(1 / np.sqrt(11))
    o = o0.copy()
    ck(q, k, v, o, sc)
    assert not np.isnan(o.astype(np.float32)).any()
    verdict = tn.reference(kern, q, k, v, o0.copy(), sc, trees=ck.trees).admits(o)
    assert verdict.ok, str(verdict)
    # the product of each group reads its own heads: swapping the second
    # group's queries changes only that group's outputs
    q2 = q.copy()
    q2[:, 3:] = q[:, :3]
    o2 = o0.copy()
    ck(q2, k, v, o2, sc)
    np.testing.assert_array_equal(o2[:, :3].astype(np.float32), o[:, :3].astype(np.float32))
    assert (o2[:, 3:] != o[:, 3:]).any()


def test_a_division_by_a_zero_size_is_a_runtime_error_naming_the_site():
    @tn.kernel
    def grouped(x: tn.Tensor[f32, "H N"], heads: tn.Tensor[f32, "G"],
                out: tn.Tensor[f32, "H N"]):
        h, n = x.shape
        g = heads.shape[0]
        out = out.with_dims(*x.dims())
        for p in tn.parallel(tn.shape(h)):
            src = p.index() // (h // g) * (h // g)
            out(tn.coord(p.index(), 0), tn.shape(1, n)).store(
                x[tn.coord(src, 0), tn.shape(1, n)])

    x = np.ones((4, 3), np.float32)
    with pytest.raises(RuntimeSemanticError) as e:
        tn.interpret(grouped, x, np.zeros(0, np.float32), np.zeros((4, 3), np.float32))
    assert "divides by zero" in str(e.value) and "tn.assume" in e.value.hint
    assert e.value.sites and e.value.sites[0].line


@pytest.mark.device
@pytest.mark.parametrize("D,Q,K,splits", [(64, 1, 1000, 5), (128, 1, 4099, 9),
                                          (128, 3, 515, 4), (64, 1, 77, 1)])
def test_split_kv_attention_validates_on_gpu(D, Q, K, splits):
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    kern = WORKLOADS["split_kv_attention"].kernel(tn.bf16, {"bq": 16, "bk": 64, "dh": D,
                                                            "dv": D})
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                             reduce_splits=splits),
                              device="gpu")
    rng = np.random.default_rng(K)
    q = rng.standard_normal((2, 8, Q, D - 3)).astype(tn.bf16.np)
    k = rng.standard_normal((2, 2, K, D - 3)).astype(tn.bf16.np)
    v = rng.standard_normal((2, 2, K, D - 3)).astype(tn.bf16.np)
    o0 = np.zeros((2, 8, Q, D - 3), tn.bf16.np)
    sc = np.float32(1 / np.sqrt(D - 3))
    o = o0.copy()
    ck(q, k, v, o, sc)
    verdict = tn.reference(kern, q, k, v, o0.copy(), sc, trees=ck.trees).admits(o)
    assert verdict.ok, str(verdict)


@pytest.fixture(scope="module")
def decode_split4():
    """The GQA decode kernel (D = 64, 64-key blocks) and its emulated cuda
    compile split four ways on 128 threads."""
    kern = _gqa_decode(dh=64, bk=64)
    return kern, kern.compile(target="cuda", device="emulated", reduce_splits=4,
                              block_threads=128)


def test_each_phase_allocates_only_its_own_shared_buffers(decode_split4):
    # the combine phase of a split reduce is a launch of its own: it places
    # only the shared tiles it uses, and the partials phase none of its tiles
    from tilenest.lowering import loopir as L

    kern, ck = decode_split4
    k = ck.kernel
    assert len(k.phases) == 2
    every = L.shared_arrangement(k)[1]
    sizes = dict(B=1, HQ=8, HK=2, Q=1, K=1000, D=64, DV=64)
    env = {E.Sym(n): v for n, v in sizes.items()}
    per = [int(E.evaluate(L.shared_arrangement(k, ph)[1], env)) for ph in k.phases]
    launched = [smem for _, _, smem in ck.launches(sizes)]
    assert launched == per
    assert max(per) < int(E.evaluate(every, env))
    assert int(E.evaluate(L.shared_bytes(k), env)) == max(per)
    for ph in k.phases:
        placed = {b.name for b, _ in L.shared_arrangement(k, ph)[0]}
        assert placed == L.shared_buffers(ph.body)
    # the emulated launches run with exactly these sizes and agree with the oracle
    rep = validate(kern, target="cuda", cases=2, compiled=ck)
    assert [r.status for r in rep.results] == ["ok"] * 2


def test_the_combine_folds_runs_outermost_and_runs_only_what_it_merges():
    # GQA decode split four ways, lowered for llvm (the loop IR every target
    # shares): the combine phase loads no query (the ops before the reduce
    # only fed its body, which the partials ran), its runs loop holds the
    # nests over the state's elements (one step merges every element, so a
    # thread's elements overlap their loads) instead of one runs loop per
    # element, the merge's new maximum and each rescaling factor are
    # computed once, not at every use, and the factors (functions of the row
    # maxima alone) once a row per run, not at each of the row's elements
    from collections import Counter

    from tilenest.lowering import loopir as L

    p = _gqa_decode(dh=64, bk=64).program
    k = lower(p, default_schedule(p, "llvm", reduce_splits=4))
    partials, combine = k.phases
    loaded = {x.buf.name for x in L.evaluated(combine.body) if isinstance(x, L.Load)}
    assert "q" in {x.buf.name for x in L.evaluated(partials.body) if isinstance(x, L.Load)}
    assert "q" not in loaded and not any(n.startswith("%qt") for n in loaded)
    runs = [s for s in L.walk(combine.body)
            if isinstance(s, L.For) and s.kind == "serial" and not isinstance(s.hi, E.Const)]
    assert len(runs) == 1 and any(isinstance(s, L.For) for s in L.walk(runs[0].body))
    for st in L.walk(combine.body):
        ops = Counter(x.op for e in L.stmt_exprs(st) for x in L.subexprs(e)
                      if isinstance(x, (L.Bin, L.Un)))
        assert ops["maximum"] <= 1 and ops["exp"] <= 1, L.expr_str(L.stmt_exprs(st)[0])
    trips = []
    for st, path in L.walk_paths(runs[0].body):
        if any(isinstance(x, L.Un) and x.op == "exp" for e in L.stmt_exprs(st)
               for x in L.subexprs(e)):
            n = 1
            for f in path:
                if isinstance(f, L.For):
                    n *= E.evaluate(E.add(f.hi, E.mul(-1, f.lo)), {})
            trips.append(n)
    assert trips == [16, 16]  # the two factors, once for each of the 16 rows


@pytest.mark.device
@pytest.mark.parametrize("D,Q,K,group,splits", [(128, 1, 8192, 4, 8), (128, 1, 4099, 8, 9),
                                                (64, 3, 515, 3, 4), (64, 1, 77, 16, 1)])
def test_gqa_decode_validates_on_gpu(D, Q, K, group, splits):
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    kern = _gqa_decode(dh=D, bk=64)
    ck = cuda.compile_program(kern.program, default_schedule(
        kern.program, "cuda", reduce_splits=splits, block_threads=128), device="gpu")
    rng = np.random.default_rng(K)
    q = rng.standard_normal((2, 2 * group, Q, D - 3)).astype(tn.bf16.np)
    k = rng.standard_normal((2, 2, K, D - 3)).astype(tn.bf16.np)
    v = rng.standard_normal((2, 2, K, D - 3)).astype(tn.bf16.np)
    o0 = np.zeros((2, 2 * group, Q, D - 3), tn.bf16.np)
    sc = np.float32(1 / np.sqrt(D - 3))
    o = o0.copy()
    ck(q, k, v, o, sc)
    verdict = tn.reference(kern, q, k, v, o0.copy(), sc, trees=ck.trees).admits(o)
    assert verdict.ok, str(verdict)


def _row_softmax_average(merge, update=None):
    """Per row block, sum_j softmax(x)_j v_j for 4 rows at once: the running
    max and sum per row (dims (r,)) and the weighted values per row and
    column (dims (r, e)), one reducer group of differently shaped states."""

    @tn.kernel
    def avg(x: tn.Tensor[f32, "R N"], v: tn.Tensor[f32, "N E"], out: tn.Tensor[f32, "R E"]):
        rows, n = x.shape
        e = v.shape[1]
        r_, k_ = x.dims()
        v = v.with_dims(k_, v.dim(1))
        out = out.with_dims(r_, v.dim(1))
        osm = tn.reducer("osm_rows", identity=(-np.inf, 0.0, 0.0), merge=merge,
                         dtype=(f32, f32, f32))
        for p in tn.parallel(tn.shape(tn.cdiv(rows, 4))):
            m = tn.full(f32, tn.shape(4), -np.inf, dims=(r_,))
            s = tn.zeros(f32, tn.shape(4), dims=(r_,))
            a = tn.zeros(f32, tn.shape(4, 4), dims=(r_, v.dim(1)))
            for c in p.reduce(tn.shape(n), contract=osm):
                xc = tn.reduce(x[tn.coord(p.index() * 4, c.index()), tn.shape(4, 1)], k_,
                               tn.maximum)
                vc = tn.reduce(v[tn.coord(c.index(), 0), tn.shape(1, 4)], k_, tn.add)
                m, s, a = (update or merge)(m, s, a, xc, 1.0, tn.broadcast(vc, a))
            out(tn.coord(p.index() * 4, 0), tn.shape(4, 4)).store(a / s)

    return avg


def test_a_group_of_row_and_tile_states_splits_and_validates():
    # m and l per row, acc per row and column, with as many rows as columns:
    # aligned by dims, not by numpy's trailing axes (which would transpose m)
    from tilenest.workloads.attention import softmax_merge

    kern = _row_softmax_average(softmax_merge)
    x = np.random.default_rng(3).standard_normal((8, 50)).astype(np.float32) * 3
    v = np.random.default_rng(4).standard_normal((50, 4)).astype(np.float32)
    w = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    want = (w @ v) / w.sum(axis=1, keepdims=True)
    for target, splits in (("llvm", 3), ("cuda", 4)):
        ck = kern.compile(target=target, reduce_splits=splits)
        out = np.zeros((8, 4), np.float32)
        ck(x, v, out)
        np.testing.assert_allclose(out, want, rtol=1e-5)
        adm = tn.reference(kern, x, v, np.zeros((8, 4), np.float32), trees=ck.trees)
        assert adm.admits(out) and not adm.admits(out * np.float32(1.001))


def test_a_narrow_state_merged_from_a_wider_one_is_refused():
    # the body's update is well typed; the declared merge, which a tree
    # evaluates, computes the row max from the per-column values
    from tilenest.workloads.attention import softmax_merge

    def leaky(ma, la, aa, mb, lb, ab):
        m = tn.maximum(tn.maximum(ma, mb), aa)
        return m, la + lb, aa + ab

    with pytest.raises(VerifyError) as e:
        _row_softmax_average(leaky, update=softmax_merge).program
    assert "fewer dims than component 3" in str(e.value)
    assert "narrower state" in e.value.hint


def test_the_combine_keeps_the_next_run_in_flight_while_it_merges_one(decode_split4):
    # the combine's runs loop copies run c's partial states into shared
    # staging tiles before merging them. That loop lies inside the test for
    # a first run, and still gets the two-version ring of double_buffer.py:
    # run c + 1's copies are in flight while run c merges. On cuda each copy
    # is a cp.async, the row statistics' single floats included, so no
    # thread waits out a load before the barrier that orders the copies.
    # (The emulator runs this compile against the reference in
    # test_each_phase_allocates_only_its_own_shared_buffers, where the
    # copies land only at the waits that order them.)
    from tilenest.lowering import loopir as L

    _, ck = decode_split4
    combine = ck.kernel.phases[1]
    copies = [s for s in L.walk(combine.body) if isinstance(s, L.Store) and s.mode == "async"]
    staged = {s.buf.name for s in copies}
    assert len(staged) == 3  # the maxima, the sums and the accumulators
    assert {x.value.buf.name for x in copies} == {b.name for b in ck.kernel.params
                                                  if b.name.startswith("%part")}
    # two versions of each: 16 rows of a statistic, 16 x 64 accumulators
    sizes = sorted(b.size.value for b in ck.kernel.locals if b.name in staged)
    assert sizes == [2 * 16, 2 * 16, 2 * 16 * 64]
    text = ck.source.text[ck.source.text.index("gqa_decode_attention_1("):]
    assert "2-stage ring" in text
    assert text.count("tn_cp_async<4>(") >= 2 and "tn_cp_async<32>(" in text


def test_the_combine_steps_take_turns_on_two_versions_of_the_state(decode_split4):
    # the running state of the combine lives in two versions, the steps of
    # the runs loop taking turns (one read, the other written), so no pass
    # copies the merged state back: a step has two block barriers (the
    # staged run's arrival, the row factors' hand-over), not three. The two
    # versions are apart by a whole tile, which lets the accumulator's
    # reads and writes stay vector accesses. (Emulated and checked against
    # the reference in test_each_phase_allocates_only_its_own_shared_buffers.)
    from tilenest.lowering import loopir as L

    _, ck = decode_split4
    combine = ck.kernel.phases[1]
    runs = [s for s in L.walk(combine.body) if isinstance(s, L.For) and s.var.name.startswith("c.")]
    assert len(runs) == 1
    assert sum(isinstance(s, L.Barrier) for s in L.walk(runs[0].body)) == 2
    state = {b.name: b.size.value for b in ck.kernel.locals if b.name.startswith("%runs")}
    assert sorted(state.values()) == [2 * 16, 2 * 16, 2 * 16 * 64]
    # every store into the state is a merge, none a copy of another tile
    for s in L.walk(runs[0].body):
        if isinstance(s, L.Store) and s.buf.name in state:
            assert not isinstance(s.value, L.Load)
    text = ck.source.text[ck.source.text.index("gqa_decode_attention_1("):]
    acc = max(state, key=state.get)
    name = "b_" + acc.replace("%", "_").replace(".", "_")
    assert f"tn_vstore<float, 8>(&{name}[" in text and f"tn_vload<float, 8>(&{name}[" in text
