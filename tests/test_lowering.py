"""The lowering: schedules, storage plans, facts/range restriction, the loop IR,
its printer (golden files) and verifier, reduction realizations, transforms."""

from __future__ import annotations

import importlib.util
import os
import pathlib

import numpy as np
import pytest

import tilenest as tn
from tilenest.errors import NotAvailableError, TilenestError, VerifyError
from tilenest.lowering import (
    default_schedule,
    lower,
    lower_verified,
    print_kernel,
    storage_plan,
    verify_kernel,
)
from tilenest.lowering import loopir as L
from tilenest.lowering.facts import Facts, split_range
from tilenest.lowering.reductions import merge_ops, pointwise
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E

ROOT = pathlib.Path(__file__).resolve().parent.parent
GOLDEN = pathlib.Path(__file__).resolve().parent / "golden" / "lowering"
EXAMPLES = ["softmax", "rmsnorm", "folds", "ragged", "gemm", "two_level", "memory_stage"]


def example(name: str) -> tn.Kernel:
    spec = importlib.util.spec_from_file_location(f"ex_{name}", ROOT / "examples" / f"{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return next(v for v in vars(m).values() if isinstance(v, tn.Kernel))


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_lower_and_verify(name):
    k = lower_verified(example(name).program)
    text = print_kernel(k)
    assert text == print_kernel(lower(example(name).program))  # deterministic
    assert k.phases and all(ph.body for ph in k.phases)


@pytest.mark.parametrize("name", ["softmax", "ragged", "folds"])
def test_golden_loopir(name):
    """Printed loop IR of small examples; TILENEST_UPDATE_GOLDEN=1 rewrites the files."""
    text = print_kernel(lower_verified(example(name).program))
    path = GOLDEN / f"{name}.loopir"
    if os.environ.get("TILENEST_UPDATE_GOLDEN") or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text()


def test_storage_plan_inlines_single_use_chains():
    p = example("softmax").program
    plan = storage_plan(p)
    defs = {op.results[0].name: op.name for op in p.walk() if len(op.results) == 1}
    assert plan["row"] == "inline"        # two reads of whole rows: re-read, not copied
    assert plan["e"] == "materialize"    # exp, used twice
    assert plan["4"] == "inline"          # row - m, consumed once by exp
    assert defs["9"] == "div" and plan["9"] == "inline"  # fused into the store


def test_storage_plan_materializes_broadcast_compute_only_at_the_top():
    plan = storage_plan(example("rmsnorm").program)
    assert plan["scale"] == "materialize"  # broadcast over the row: computed once per row
    assert plan["ms"] == "inline" and plan["8"] == "inline"
    assert plan["10"] == "inline"  # the w read is re-read from memory, not copied


@tn.kernel
def _centred(x: tn.Tensor[tn.f32, "R C"], y: tn.Tensor[tn.f32, "R C"],
             z: tn.Tensor[tn.f32, "R C"]):
    """LayerNorm's shape: a centred row ``d`` read by a reduction and a store
    (two uses), and ``e`` read by four stores."""
    rows, cols = x.shape
    c = x.dim(1)
    for p in tn.parallel(tn.shape(rows)):
        o = tn.coord(p.index(), 0)
        t = x[o, tn.shape(1, cols)]
        d = t - tn.reduce(t, c, tn.add) / tn.cast(cols, tn.f32)
        e = t * 3.0
        var = tn.reduce(d * d, c, tn.add)
        y(o, tn.shape(1, cols)).store(d * var)
        z(o, tn.shape(1, cols)).store(e + e + e + e)


def test_cheap_ops_are_recomputed_at_a_few_uses_on_the_cpu():
    """A subtraction used twice is recomputed on the CPU (no row buffer for
    it in the loop IR); a product used four times, more than
    ``CPU_RECOMPUTE_USES``, is kept in a row buffer; on cuda both are
    recomputed."""
    from tilenest.lowering import schedule as S

    p = _centred.program
    defs = {op.results[0].name: op.name for op in p.walk() if len(op.results) == 1}
    d = next(n for n, o in defs.items() if o == "sub")
    e = next(n for n, o in defs.items() if o == "mul" and n != d
             and any(u.name == "add" for u in p.walk() if any(v.name == n for v in u.operands)))
    assert S.CPU_RECOMPUTE_USES < 4
    plan = storage_plan(p, default_schedule(p, "llvm"))
    assert plan[d] == "inline" and plan[e] == "materialize"
    gpu = storage_plan(p, default_schedule(p, "cuda"))
    assert gpu[d] == "inline" and gpu[e] == "inline"
    text = print_kernel(lower_verified(p, default_schedule(p, "llvm")))
    assert text.count("sub(") == 3  # the variance's two operands and the store's
    x = np.random.default_rng(0).standard_normal((5, 37)).astype(np.float32)
    assert tn.validate(_centred, "llvm", inputs=[x, np.zeros_like(x), np.zeros_like(x)]).ok


def test_storage_plan_packs_mma_operands():
    plan = storage_plan(example("gemm").program)
    assert plan["a"] == plan["b"] == "materialize"


def test_schedule_overrides_storage():
    p = example("softmax").program
    s = default_schedule(p).with_(storage=(("e", "inline"),))
    assert storage_plan(p, s)["e"] == "inline"
    text = print_kernel(lower_verified(p, s))
    assert "%e." not in text  # exp recomputed at its two uses
    assert text.count("exp(") == 2


def test_default_schedule_and_unknown_target():
    p = example("ragged").program
    s = default_schedule(p)
    assert s.target == "llvm" and s.vector_bits in (128, 256, 512) and s.threads >= 1
    with pytest.raises(NotAvailableError, match="tpu"):
        default_schedule(p, "tpu")
    g = default_schedule(p, "cuda")
    assert g.target == "cuda" and g.block_threads == 256


def test_facts_implication_and_sums():
    f = Facts()
    i, p, R = E.Var("i"), E.Var("p"), E.Sym("R")
    f.push([i.ge(0), i.lt(1), p.ge(0), p.lt(R)])
    assert f.implied(i.lt(2)) and f.implied(p.le(R - 1))
    assert f.implied((i + p).ge(0))            # a sum of two facts
    assert f.implied((i + p).lt(R))            # i < 1 and p < R
    assert not f.implied(p.lt(R - 1))
    g = Facts()
    g.push([i.ge(0), i.lt(4), p.ge(0), p.lt(R)])
    assert not g.implied((i + p).lt(R))        # the row tail: needs a guard


def test_split_range_unit_coefficients():
    j, p, N = E.Var("j"), E.Var("p"), E.Sym("N")
    g = [(j + 128 * p).ge(0), (j + 128 * p).lt(N), p.lt(N)]
    lo, hi, used, outer = split_range(g, "j", E.Const(128), set())
    assert len(used) == 2 and outer == [p.lt(N)]
    env = {p: 1, N: 200}
    assert E.evaluate(lo, env) == 0 and E.evaluate(hi, env) == 72


def test_tail_guards_become_loop_bounds():
    text = print_kernel(lower_verified(example("ragged").program))
    assert " if " not in text  # the store and both loads are unguarded in the main range
    assert "min(-128*$p" in text


@tn.kernel
def _row_cumsum(x: tn.Tensor[tn.f32, "R C"], y: tn.Tensor[tn.f32, "R C"], *, bc=64):
    """A row's running sum over blocks of ``bc`` columns, the carry across
    blocks a one-element tile of the row's dim."""
    R, C = x.shape
    for p in tn.parallel(tn.shape(R)):
        carry = tn.zeros(tn.f32, tn.shape(1), dims=(x.dim(0),))
        for s in tn.serial(tn.shape(tn.cdiv(C, bc))):
            t = x[tn.coord(p.index(), s.index() * bc), tn.shape(1, bc), tn.bounds.zero]
            out = tn.cumsum(t, t.dim(1)) + carry
            y(tn.coord(p.index(), s.index() * bc), tn.shape(1, bc)).store(out)
            carry = tn.reindex(out, tn.shape(1), lambda r: (r, bc - 1), dims=(x.dim(0),))


def test_a_guard_true_over_the_whole_loop_splits_nothing():
    # the row of program p (0 <= p < R) read with bounds.zero: its in-bounds
    # test 0 <= i + p < R holds for every i of the one-row loop, so the loop
    # keeps its constant range [0, 1) instead of three ranges bounded by p,
    # and the scan's running state stays in fixed elements a compiler keeps
    # in registers (a loop over a range bounded by p indexes them by a
    # variable). The column tail is still guarded.
    k = lower_verified(_row_cumsum.program)
    pid = {s.var.name for s in L.walk(k.phases[0].body)
           if isinstance(s, L.Assign) and s.var.name.startswith("p.")}
    assert len(pid) == 1
    loops = [s for s in L.walk(k.phases[0].body) if isinstance(s, L.For)]
    bounded = [s for s in loops
               if any(isinstance(v, E.Var) and v.name in pid for b in (s.lo, s.hi)
                      for v in E.leaves(b))]
    assert not bounded, print_kernel(k)
    assert any(isinstance(s, L.If) for s in L.walk(k.phases[0].body))  # the column tail
    x = np.random.default_rng(3).standard_normal((5, 150)).astype(np.float32)
    y = np.zeros_like(x)
    _row_cumsum.compile(target="llvm")(x, y)
    assert tn.reference(_row_cumsum, x, np.zeros_like(x)).admits(y)


def test_reduce_realizations():
    sm = example("softmax").program
    reds = [op for op in sm.walk() if op.name == "reduce"]
    assert all(pointwise(op) for op in reds)
    assert all(merge_ops(op) for op in reds)
    folds = example("folds").program
    assert all(pointwise(op) for op in folds.walk() if op.name == "reduce")
    text = print_kernel(lower_verified(folds))
    assert "reassoc" not in text and "reversed" in text  # strict folds keep their order
    assert "reassoc" in print_kernel(lower_verified(sm))


def test_sequential_reduction_schedule_drops_permission():
    p = example("softmax").program
    s = default_schedule(p).with_(reductions=tuple((op.oid, "sequential") for op in p.walk()
                                                   if op.name == "reduce"))
    assert "reassoc" not in print_kernel(lower_verified(p, s))


def test_missing_rule_names_op_and_target(monkeypatch):
    from tilenest.lowering import core

    monkeypatch.delitem(core.RULES, "exp")
    with pytest.raises(NotAvailableError) as e:
        lower(example("softmax").program)
    assert "'exp'" in e.value.message and "'llvm'" in e.value.message
    assert e.value.sites  # the op's source location


def test_every_registered_op_has_a_rule():
    from tilenest.lowering import core
    from tilenest.semantics.ops import REGISTRY

    assert set(REGISTRY) - set(core.RULES) == {"yield"}


def _constructs():
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    try:
        import kernels_constructs
    finally:
        sys.path.pop(0)
    return kernels_constructs


def test_parallel_updates_are_classified():
    from tilenest.lowering.core import Lowerer
    from tilenest.lowering.regions import classify_updates

    KC = _constructs()
    for kern, want in ((KC.per_child_patches, "patch"), (KC.nest_subnest_update, "collective"),
                       (KC.all_regions, "collective")):
        p = kern.program
        lw = Lowerer(p, default_schedule(p))
        ops = [op for op in p.walk() if op.name == "parallel" and op.operands]
        assert [k for k, _ in classify_updates(lw, ops[0])] == [want]
    text = print_kernel(lower_verified(KC.per_child_patches.program))
    assert "%acc_3." in text and "check" in text  # patches go straight into the result


def test_transforms_through_the_proofs_layer():
    p = example("softmax").program
    s = default_schedule(p).with_(transforms=("split(1, 0, 4)",))
    text = print_kernel(lower_verified(p, s))
    assert "(R + 3) // 4" in text and "for p_i" in text
    with pytest.raises(TilenestError, match="unknown transform"):
        lower(p, default_schedule(p).with_(transforms=("frobnicate(1)",)))


# ---------------------------------------------------------------------------
# the verifier


def _kernel(body: tuple, locals_: tuple = (), globals_: tuple = ()) -> L.Kernel:
    pid = L.LVar("pid", L.INDEX)
    return L.Kernel("k", (L.Param("x", "tensor", D.f32, (E.Sym("N"),)),), ("N",), locals_,
                    (L.Phase("k_0", (E.Sym("N"),), pid, body),), (), globals_)


X = L.Buffer("x", D.f32, "global", E.Const(0), 0)


def test_verifier_accepts_a_small_kernel():
    v = L.LVar("v", D.f32)
    body = (L.Assign(v, L.Load(X, L.IExpr(E.Var("pid")))),
            L.Store(X, L.IExpr(E.Var("pid")), L.Bin("add", L.Ref(v), L.Const(1.0, D.f32),
                                                   D.f32)))
    verify_kernel(_kernel(body, globals_=(X,)))


@pytest.mark.parametrize("bad, msg", [
    ((L.Store(X, L.IExpr(E.Var("q")), L.Const(1.0, D.f32)),), "before it is defined"),
    ((L.Store(X, L.IExpr(E.Var("pid")), L.Const(1, D.i32)),), "holds f32"),
    ((L.Assign(L.LVar("v", D.f32), L.Bin("add", L.Const(1.0, D.f32), L.Const(1, D.i32),
                                          D.f32)),), "dtypes"),
    ((L.Assign(L.LVar("v", D.i32), L.Bin("add", L.Const(1, D.i32), L.Const(1, D.i32), D.i32,
                                          frozenset({"reassoc"}))),), "float merge"),
    ((L.Assign(L.LVar("v", D.f32), L.Ref(L.LVar("w", D.f32))),), "before it is assigned"),
    ((L.If(L.Const(1, D.i32), ()),), "must be bool"),
    ((L.Check(L.IPred(E.TRUE), 7),), "unknown error code"),
    ((L.Assign(L.LVar("v", D.f32), L.Load(L.Buffer("y", D.f32, "local"), L.IExpr(E.Const(0)))),),
     "not declared"),
])
def test_verifier_rejects(bad, msg):
    with pytest.raises(VerifyError, match=msg):
        verify_kernel(_kernel(bad, globals_=(X,)))


def test_if_defines_only_what_both_branches_define():
    v = L.LVar("v", D.f32)
    one = L.Const(1.0, D.f32)
    both = (L.If(L.IPred(E.TRUE), (L.Assign(v, one),), (L.Assign(v, one),)),
            L.Store(X, L.IExpr(E.Var("pid")), L.Ref(v)))
    verify_kernel(_kernel(both, globals_=(X,)))
    one_side = (L.If(L.IPred(E.TRUE), (L.Assign(v, one),)),
                L.Store(X, L.IExpr(E.Var("pid")), L.Ref(v)))
    with pytest.raises(VerifyError):
        verify_kernel(_kernel(one_side, globals_=(X,)))


def test_schedule_transform_arguments_are_checked_like_the_cli():
    """A schedule's transform steps go through the one spec validator: wrong
    arity is the TransformError naming the transform's signature."""
    from tilenest.proofs.remap import TransformError

    from tilenest.lowering.schedule import apply_transforms

    p = example("softmax").program
    with pytest.raises(TransformError, match="signature: split"):
        apply_transforms(p, default_schedule(p).with_(transforms=("split(1)",)))
