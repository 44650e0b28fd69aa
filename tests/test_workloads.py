"""The workload library: real kernels checked against their own FP64 formulas
with derived per-element bounds, and against the interpreter's oracle.

Every workload runs at every small/medium size in f32 and at its small size
in f16/bf16 storage; every workload is run under at least two tile schedules
and three interpreter schedules with identical admitted results; large sizes
are marked slow. Tie order, signed zeros and invalid embedding ids are tested
explicitly at the end."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.workloads import WORKLOADS, admitted, check, reference, run
from tilenest.workloads import bounds as B
from tilenest.workloads.selection import first_max

F32_SIZES = [(n, s) for n, w in WORKLOADS.items() for s in w.sizes if s != "large"]
NARROW = [(n, dt) for n, w in WORKLOADS.items() for dt in w.dtypes if dt != f32]
LARGE = [n for n, w in WORKLOADS.items() if "large" in w.sizes]


def _assert_correct(r) -> None:  # type: ignore[no-untyped-def]
    for c in check(r):
        assert c, f"{r.workload.name} {r.size} {r.dtype} {r.schedule}: {c}"
    for name, v in admitted(r):
        assert v, f"{r.workload.name} {r.size} {r.dtype} {r.schedule}: oracle ({name}): {v}"


def test_library_covers_the_issue():
    families = {w.family for w in WORKLOADS.values()}
    assert families == {"gemm", "elementwise", "rows", "softmax", "norms", "losses",
                        "attention", "scans", "selection", "embedding"}
    for name in ("gemm", "gemv", "bmm", "gemm_relu", "gemm_gelu", "add", "row_sum", "row_max",
                 "softmax", "masked_softmax", "rmsnorm", "layernorm", "residual_layernorm",
                 "cross_entropy", "residual_gelu", "swiglu", "rope", "attention_gqa",
                 "attention_mha", "scan_fold", "scan_tree", "argmax", "sort", "topk",
                 "embedding"):
        assert name in WORKLOADS
    for w in WORKLOADS.values():
        assert {"small", "medium", "large"} <= set(w.sizes), w.name
        assert len(w.schedules) >= 2, w.name
    assert {"tall", "wide", "ragged"} <= set(WORKLOADS["gemm"].sizes)


@pytest.mark.parametrize("name,size", F32_SIZES, ids=[f"{n}-{s}" for n, s in F32_SIZES])
def test_f32_within_fp64_bound_and_admitted(name, size):
    _assert_correct(run(WORKLOADS[name], size, f32))


@pytest.mark.parametrize("name,dt", NARROW, ids=[f"{n}-{d}" for n, d in NARROW])
def test_narrow_storage_f32_accumulation(name, dt):
    _assert_correct(run(WORKLOADS[name], "small", dt))


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_schedules_give_identical_admitted_results(name):
    """Every tile schedule is correct; the first two admit each other's results;
    one-at-a-time interpreter orders reproduce the lockstep result bit for bit,
    and a random tree order and the fast (BLAS/pairwise) paths stay admitted."""
    wl = WORKLOADS[name]
    runs = [run(wl, "small", f32, s) for s in wl.schedules]
    for r in runs:
        _assert_correct(r)
    refs = [reference(r) for r in runs[:2]]
    for mine, other in ((0, 1), (1, 0)):
        for a in refs[other]:
            v = a.admits(runs[mine].outputs[a.name])
            assert v, f"schedule {wl.schedules[mine]} vs {wl.schedules[other]}: {v}"
    base = runs[0]
    for interp in ("canonical", "reversed"):
        again = run(wl, "small", f32, interp=interp)
        for k, out in base.outputs.items():
            assert B.same_bits(k, again.outputs[k], out), (interp, k)
    for variant in (run(wl, "small", f32, interp=tn.interpreter.random(5)),
                    run(wl, "small", f32, fast=True)):
        for a in refs[0]:
            assert a.admits(variant.outputs[a.name])
        for c in check(variant):
            assert c, c


@pytest.mark.slow
@pytest.mark.parametrize("name", LARGE)
def test_large(name):
    _assert_correct(run(WORKLOADS[name], "large", f32))


# ------------------------------------------------------------------ the bounds bite
@pytest.mark.parametrize("name", ["gemm", "softmax", "layernorm", "attention_gqa", "scan_tree"])
def test_fp64_bound_rejects_an_output_just_outside_it(name):
    r = run(WORKLOADS[name], "small", f32)
    want = r.workload.formula(r.args, r.size, f32)
    out = next(iter(r.outputs))
    w = want[out] if isinstance(want[out], B.Approx) else want[out][0]
    got = r.outputs[out].copy()
    k = np.unravel_index(int(np.argmax(w.e)), got.shape)
    got[k] = np.float32(w.v[k] + 1.5 * w.e[k] + abs(w.v[k]) * 2.0 ** -22)
    c = B.within(out, got, w)
    assert not c and c.index == tuple(int(i) for i in k)


def test_fp64_formula_catches_a_wrong_coefficient():
    """A GELU kernel whose tanh coefficient is off in the 5th digit is outside
    the derived bound (the bound is not a tuned tolerance)."""
    from tilenest.workloads import elementwise as ew

    @tn.kernel
    def bad_gelu(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"], out: tn.Tensor[f32, "R C"]):
        rows, cols = x.shape
        out = out.with_dims(*x.dims())
        t = x[tn.coord(0, 0), tn.shape(rows, cols)]
        inner = t + ew.GELU_A * (t * t * t)
        out(tn.coord(0, 0), tn.shape(rows, cols)).store(
            0.5 * t * (1.0 + tn.tanh(0.79789 * inner)))

    wl = WORKLOADS["gelu"]
    a = wl.args("small")
    out = a["out"].copy()
    bad_gelu(a["x"], a["y"], out)
    assert not B.within("out", out, wl.formula(a, wl.size("small"), f32)["out"])


def test_fold_left_scan_is_bitwise_and_reversed_order_is_not():
    r = run(WORKLOADS["scan_fold"], "medium", f32)
    x = r.args["x"]
    rev = np.flip(np.add.accumulate(np.flip(x, 1), 1, dtype=np.float32), 1)
    seq = np.add.accumulate(x, 1, dtype=np.float32)
    assert B.same_bits("y", r.outputs["y"], seq)
    (adm,) = reference(r)
    assert adm.exact_mask.all()
    tail = np.array(seq)
    tail[:, 1:] = seq[:, -1:] - rev[:, 1:]   # the same prefixes, summed from the other end
    assert not adm.admits(tail)


# ----------------------------------------------------------- ties and signed zeros
def _selection_call(name, x, k=None):  # type: ignore[no-untyped-def]
    wl = WORKLOADS[name]
    rows, cols = x.shape
    size = {"R": rows, "C": cols} | ({"K": k} if k is not None else {})
    kern = wl.kernel(f32, wl.schedules[0], size)
    n = cols if k is None else k
    if name == "argmax":
        val, idx = np.full(rows, np.nan, np.float32), np.zeros(rows, np.int64)
    else:
        val, idx = np.full((rows, n), np.nan, np.float32), np.zeros((rows, n), np.int64)
    tn.interpret(kern, x, val, idx)
    return val, idx


def _bits(a):  # type: ignore[no-untyped-def]
    return np.asarray(a, np.float32).view(np.uint32)


def test_argmax_first_index_ties_and_signed_zero_bits():
    x = np.array([[-0.0, 0.0, -0.0], [0.0, -0.0, 0.0], [1.0, 3.0, 3.0], [2.0, np.nan, np.nan],
                  [-np.inf, -np.inf, -np.inf]], np.float32)
    val, idx = _selection_call("argmax", x)
    assert idx.tolist() == [0, 0, 1, 1, 0]
    assert _bits(val[0]) == _bits(-0.0) and _bits(val[1]) == _bits(0.0)
    assert val[2] == 3 and np.isnan(val[3]) and val[4] == -np.inf
    assert [first_max(r.astype(np.float64)) for r in x] == idx.tolist()


def test_sort_is_stable_with_signed_zeros_tied_and_nan_last():
    x = np.array([[0.5, -0.0, 0.0, np.nan, -0.0, 0.5, -1.0]], np.float32)
    val, idx = _selection_call("sort", x)
    assert idx[0].tolist() == [6, 1, 2, 4, 0, 5, 3]
    assert _bits(val[0, 1:4]).tolist() == _bits([-0.0, 0.0, -0.0]).tolist()
    assert np.isnan(val[0, 6])
    val, idx = _selection_call("sort_desc", x)
    assert idx[0].tolist() == [0, 5, 1, 2, 4, 6, 3]


def test_topk_original_index_ties_k1_and_k_equal_n():
    x = np.array([[2.0, 7.0, 7.0, -1.0, 7.0, np.nan], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]], np.float32)
    _, idx = _selection_call("topk", x, k=1)
    assert idx[:, 0].tolist() == [1, 0]
    val, idx = _selection_call("topk", x, k=3)
    assert idx.tolist() == [[1, 2, 4], [0, 1, 2]]
    val, idx = _selection_call("topk", x, k=6)
    assert idx[0].tolist() == [1, 2, 4, 0, 3, 5] and np.isnan(val[0, 5])   # NaN last
    assert idx[1].tolist() == list(range(6))


def test_topk_width_1025_matches_stable_order():
    r = run(WORKLOADS["topk"], "wide", f32)
    _assert_correct(r)
    assert r.outputs["idx"].shape == (2, 32)


# ------------------------------------------------------------ invalid embedding ids
@pytest.mark.parametrize("bad", [-1, 11, 2 ** 40])
@pytest.mark.parametrize("sched", [0, 1])
def test_invalid_embedding_id_is_rejected_before_any_store(bad, sched):
    wl = WORKLOADS["embedding"]
    a = wl.args("small")
    a["ids"][3] = bad
    out = a["out"].copy()
    k = wl.kernel(f32, wl.schedules[sched])
    for interp in (None, "canonical"):
        with pytest.raises(tn.errors.BoundsError) as ei:
            tn.interpret(k, a["table"], a["ids"], out, schedule=interp)
        assert f"table[{bad}, 0]" in str(ei.value)
        assert np.isnan(out).all()   # nothing was stored


def test_command_line_table(capsys):
    from tilenest.workloads.__main__ import main

    assert main(["add", "argmax", "--size", "small", "--all-schedules"]) == 0
    out = capsys.readouterr().out
    assert "argmax" in out and "rp=4 width=0" in out
    assert main(["nope"]) == 1
