"""Regressions of the checker: obligations over per-instance Memory sizes, a
crash of the checker reported as a bug (never as a verdict), reducer contracts
whose arity does not match the states they cover, and transform arguments
checked against the transform's signature at every entry point."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import tilenest as tn
from tilenest import cli, f32, i32
from tilenest.errors import InternalError, TilenestError, VerifyError
from tilenest.lowering import default_schedule
from tilenest.lowering import legality as LG
from tilenest.lowering.schedule import apply_transforms
from tilenest.proofs import layouts as LY
from tilenest.proofs import report as RP
from tilenest.proofs.layouts import layout_obligations
from tilenest.proofs.model import Model
from tilenest.proofs.obligation import PROVED, REFUTED, UNKNOWN, Obligation, discharge
from tilenest.proofs.remap import TransformError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests"))

import kernels_constructs as KC
from gemm import gemm


@pytest.fixture(autouse=True)
def _fresh_gate():
    LG.clear_cache()
    yield
    LG.clear_cache()


# -- Memory objects whose size depends on the instance -------------------------------

@tn.kernel
def ragged_memory(x: tn.Tensor[f32, "N M"], y: tn.Tensor[f32, "N M"]):
    """Instance i owns a Memory of extent i + 1 (a dense, one-to-one layout)."""
    n, _ = x.shape
    a, b = x.dims()
    y = y.with_dims(a, b)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        t = x[tn.coord(i, 0), tn.shape(1, i + 1)]
        mem = tn.memory(f32, tn.shape(1, i + 1), dims=(a, b))
        mem.store(t * 2.0)
        y(tn.coord(i, 0), tn.shape(1, i + 1)).store(mem.load())


@tn.kernel
def ragged_aliasing(x: tn.Tensor[f32, "N M"], y: tn.Tensor[f32, "N M"]):
    """Instance i owns a 2 x (i + 1) Memory with strides (1, 1): elements (1, 0)
    and (0, 1) share offset 1 in every instance with i >= 1."""
    n, _ = x.shape
    a, b = x.dims()
    y = y.with_dims(a, b)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        mem = tn.memory(f32, tn.layout(tn.shape(2, i + 1), strides=(1, 1)), dims=(a, b))
        mem.store(x[tn.coord(0, 0), tn.shape(2, i + 1)])
        y(tn.coord(i, 0), tn.shape(1, 1)).store(x[tn.coord(i, 0), tn.shape(1, 1)])


def test_layout_of_a_memory_sized_per_instance_is_proved():
    """The owner coordinate is a bound variable of the layout claims (it was a
    free variable: 'claim has unlisted free variables', and the compile was
    refused)."""
    obs = discharge(layout_obligations(Model(ragged_memory.program)), timeout=2.0)
    assert {o.kind for o in obs} == {"layout.range", "layout.injective"}
    for o in obs:
        assert o.status == PROVED, (o.kind, o.reason)
        assert "p" in o.claim.vars
    gate = LG.legality(ragged_memory.program, default_schedule(ragged_memory.program))
    assert gate and all(o.status == PROVED for o in gate if o.role == "required")


def test_memory_sized_per_instance_runs():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.full((3, 4), -1, np.float32)
    tn.interpret(ragged_memory, x, y)
    want = np.where(np.tril(np.ones((3, 4), bool)), 2 * x, -1).astype(np.float32)
    np.testing.assert_array_equal(y, want)


def test_aliasing_layout_of_a_memory_sized_per_instance_is_refuted():
    obs = discharge(layout_obligations(Model(ragged_aliasing.program)), timeout=2.0)
    (inj,) = [o for o in obs if o.kind == "layout.injective"]
    assert inj.status == REFUTED and inj.checked
    cx = inj.counterexample
    assert cx["p"] >= 1 and cx["N"] > cx["p"]  # an instance that exists and aliases
    text = "\n".join(inj.counterexample_lines())
    assert "owner instance" in text and "share offset" in text
    with pytest.raises(VerifyError, match="distinct elements get distinct offsets"):
        LG.legality(ragged_aliasing.program, default_schedule(ragged_aliasing.program))


@tn.kernel
def aliasing_under_data_if(x: tn.Tensor[f32, "N M"], y: tn.Tensor[f32, "N M"]):
    """The aliasing per-instance Memory of ``ragged_aliasing``, allocated only
    when a data value is positive."""
    n, _ = x.shape
    a, b = x.dims()
    y = y.with_dims(a, b)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        s = tn.reduce(tn.reduce(x[tn.coord(i, 0), tn.shape(1, 1)], b, tn.add), a, tn.add)
        if tn.if_(s > 0.0):
            mem = tn.memory(f32, tn.layout(tn.shape(2, i + 1), strides=(1, 1)), dims=(a, b))
            mem.store(x[tn.coord(0, 0), tn.shape(2, i + 1)])
            y(tn.coord(i, 0), tn.shape(1, 1)).store(x[tn.coord(i, 0), tn.shape(1, 1)])


def test_a_collision_in_an_over_approximated_owner_domain_is_not_a_refutation():
    """Whether an instance allocates the Memory depends on data: the collision
    found is reported as unknown (no input is known to reach it), not refuted."""
    obs = discharge(layout_obligations(Model(aliasing_under_data_if.program)), timeout=2.0)
    (inj,) = [o for o in obs if o.kind == "layout.injective"]
    assert inj.status == UNKNOWN and "over-approximation" in inj.reason
    assert "data-dependent if" in inj.reason


# -- a crash of the checker is a bug, not a verdict --------------------------------------

def test_a_crashing_decision_procedure_is_an_internal_error(monkeypatch):
    def broken(ob, timeout, mt, kind):
        raise RuntimeError("boom in the layout decider")

    monkeypatch.setattr(LY, "decide_layout", broken)
    p = ragged_memory.program
    with pytest.raises(InternalError) as ei:
        LG.legality(p, default_schedule(p))
    e = ei.value
    assert "boom in the layout decider" in e.message and "layout." in e.message
    assert "bug in tilenest" in e.hint
    assert e.sites and e.sites[0].file.startswith("tilenest/")  # the innermost frame of tilenest
    assert any("concerns" in n for n in e.notes)


def test_a_crash_while_stating_the_gate_is_an_internal_error(monkeypatch):
    import tilenest.proofs.races as RC

    def broken(m):
        raise KeyError("no such value")

    monkeypatch.setattr(RC, "race_obligations", broken)
    p = ragged_memory.program
    with pytest.raises(InternalError, match="stating the program's obligations"):
        LG.legality(p, default_schedule(p))


def test_discharge_reraises_checker_crashes_and_keeps_user_errors():
    ob = Obligation("demo", "a demo obligation")
    ob.decider = lambda o, t: list(o.sites)[1]
    with pytest.raises(InternalError, match="IndexError"):
        discharge([ob])
    ob2 = Obligation("demo", "a demo obligation")

    def user(o, t):
        raise TransformError("the program has no parallel level 7")

    ob2.decider = user
    with pytest.raises(TransformError):
        discharge([ob2])
    ob3 = Obligation("demo", "nothing to decide it with")
    assert discharge([ob3])[0].status == UNKNOWN


# -- reducer contracts: state arity = merge arity = identity arity ----------------------

def test_a_reducer_covering_fewer_states_than_its_components_is_rejected():
    @tn.kernel
    def one_state(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "2"]):
        (n,) = x.shape
        red = tn.reducer("pair", identity=(0.0, 0.0),
                         merge=lambda a0, a1, b0, b1: (a0 + b0, a1 + b1), dtype=(f32, f32))
        for p in tn.parallel(tn.shape(1)):
            v = x[tn.coord(0), tn.shape(n)]
            s = tn.scalar(0.0, f32)
            for r in p.reduce(v.domain(v.dim(0)), contract=red):
                s = s + v.at(r)
            y(tn.coord(0), tn.shape(1)).store(tn.broadcast(s, tn.shape(tn.axis(y.dim(0), 1))))

    with pytest.raises(VerifyError) as ei:
        _ = one_state.program
    e = ei.value
    assert "2 state component(s)" in e.message and "covers 1" in e.message
    assert e.sites and e.sites[0].line > 0 and "test_checker_regressions.py" in str(e.sites[0])
    assert e.hint


def test_the_construct_kernel_updates_both_components():
    (r,) = [op for op in KC.custom_reducer.program.walk() if op.name == "reduce"]
    assert r.attrs["contracts"] == ("@sum_and_count", "@sum_and_count")
    x = np.array([1, 2, 3], np.float32)
    y = np.zeros(2, np.float32)
    tn.interpret(KC.custom_reducer, x, y)
    np.testing.assert_array_equal(y, [14.0, 3.0])


def _text_with(old: str, new: str) -> str:
    text = str(KC.custom_reducer.program)
    tn.parse(text)  # well formed as printed
    out = re.sub(old, new, text, count=1)
    assert out != text
    return out


def test_tileir_text_merge_of_the_wrong_arity_is_located():
    """A merge that yields one value for a two-component state, read from
    text: a located VerifyError (it used to be accepted)."""
    text = _text_with(r"yield (%\w+), %\w+", r"yield \1")
    with pytest.raises(VerifyError) as ei:
        tn.parse(text)
    assert "yields 1 value(s)" in ei.value.message and "2 component(s)" in ei.value.message
    assert ei.value.sites


def test_tileir_text_merge_arguments_and_state_dtypes_are_checked():
    text = _text_with(r"%a3: f32\)", "%a3: i32)")
    with pytest.raises(TilenestError, match="merge of reducer @sum_and_count takes"):
        tn.parse(text)
    text = _text_with(r"state = \[f32, f32\], identity = \[0.0, 0.0\]",
                      "state = [f32, i32], identity = [0.0, 0]")
    with pytest.raises(TilenestError, match="reducer @sum_and_count"):
        tn.parse(text)


def test_tileir_text_reduce_state_dtype_must_match_the_component():
    @tn.kernel
    def istate(x: tn.Tensor[i32, "N"], y: tn.Tensor[i32, "2"]):
        (n,) = x.shape
        red = tn.reducer("ipair", identity=(0, 0),
                         merge=lambda a0, a1, b0, b1: (a0 + b0, a1 + b1), dtype=(i32, i32))
        for p in tn.parallel(tn.shape(1)):
            v = x[tn.coord(0), tn.shape(n)]
            s = tn.scalar(0, i32)
            c = tn.scalar(0, i32)
            for r in p.reduce(v.domain(v.dim(0)), contract=red):
                s = s + v.at(r)
                c = c + 1
            y(tn.coord(0), tn.shape(1)).store(tn.broadcast(s, tn.shape(tn.axis(y.dim(0), 1))))
            y(tn.coord(1), tn.shape(1)).store(tn.broadcast(c, tn.shape(tn.axis(y.dim(0), 1))))

    text = str(istate.program)
    tn.parse(text)  # well formed as printed
    bad = text.replace("state = [i32, i32], identity = [0, 0]",
                       "state = [i32, i64], identity = [0, 0]", 1)
    assert bad != text
    with pytest.raises(TilenestError, match="reducer @ipair"):
        tn.parse(bad)


# -- transform arguments: one check, every entry point ----------------------------------

BAD_CALLS = [
    ("split", (1,), {}, "missing a required argument: 'axis'"),
    ("split", (1, 0, "x"), {}, "argument 'factor' must be int | Expr"),
    ("split", ("a", 0, 2), {}, "argument 'level' must be int"),
    ("split", (1, 0, 2), {"nest": "yes"}, "argument 'nest' must be bool"),
    ("split", (1, 0, 2, 5), {}, "too many positional arguments"),
    ("tile", (1, 2), {}, "argument 'factors' must be Sequence"),
    ("permute", (1, 5), {}, "argument 'perm' must be Sequence[int]"),
    ("fuse", (1,), {"lineer": True}, "unexpected keyword argument 'lineer'"),
    ("bind", (5,), {}, "argument 'tgt' must be str | Target"),
    ("fuse_serial", ("x",), {}, "argument 'index' must be int"),
    ("place_reduction", (0, "many"), {}, "argument 'participants' must be int | Expr"),
]


@pytest.mark.parametrize("name,args,kw,msg", BAD_CALLS, ids=[c[0] + str(i)
                                                              for i, c in enumerate(BAD_CALLS)])
def test_python_transform_calls_check_their_arguments(name, args, kw, msg):
    from tilenest.proofs.report import STEPS

    fn = getattr(tn.transform, name, None) or STEPS[name]
    with pytest.raises(TransformError) as ei:
        fn(gemm, *args, **kw)
    assert msg in ei.value.message
    assert ei.value.hint.startswith(f"signature: {name}(")


def test_check_and_schedule_transforms_give_the_same_error():
    with pytest.raises(TransformError) as a:
        tn.transform.check(gemm, ["split(1)"])
    with pytest.raises(TransformError) as b:
        tn.transform.check(gemm, [("split", (1,), {})])
    assert a.value.message == b.value.message and a.value.hint == b.value.hint
    p = gemm.program
    with pytest.raises(TransformError) as c:
        apply_transforms(p, default_schedule(p).with_(transforms=(("tile", (1, 2), {}),)))
    assert "argument 'factors'" in c.value.message and "signature: tile(" in c.value.hint
    with pytest.raises(TransformError, match="not \\('split',\\)"):
        RP.validate_spec(("split",))


def test_cli_transform_specs_use_the_same_check(capsys):
    with pytest.raises(TransformError) as py:
        RP.validate_spec("split(1)")
    status = cli.main(["check", str(ROOT / "examples" / "gemm.py"), "--transform", "split(1)"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert py.value.message in err and py.value.hint in err
    assert err.startswith("transform error: --transform 'split(1)'")
    status = cli.main(["check", str(ROOT / "examples" / "gemm.py"), "--transform",
                       "split(1, 0, two)"])
    err = capsys.readouterr().err
    assert status == 2 and "argument 'factor' must be int | Expr, got 'two'" in err


def test_spec_booleans_and_good_steps():
    assert RP.parse_spec("fuse(1, linear=false)") == ("fuse", (1,), {"linear": False})
    assert RP.parse_spec("split(1, 0, 2, nest=True)") == ("split", (1, 0, 2), {"nest": True})
    assert RP.validate_spec("split(1, 0, 2)") == ("split", (1, 0, 2), {})
    r = tn.transform.check(gemm, ["split(1, 0, 2)"], timeout=2.0)
    assert r.exit_status == 0


def test_a_missing_level_names_the_levels():
    """``Model.level_op`` raises the TransformError itself (the transforms'
    own ``except KeyError`` wrappers were dead code)."""
    for fn, args in ((tn.transform.split, (9, 0, 2)), (tn.transform.interchange, (9,)),
                     (tn.transform.remove_unit, (9,))):
        with pytest.raises(TransformError, match="no parallel level 9") as ei:
            fn(gemm, *args)
        assert "its parallel levels: 1" in ei.value.hint


def test_a_crashing_rewrite_is_an_internal_error_not_a_refutation(monkeypatch):
    """A rewriter crash used to become a refuted 'rewrite' obligation ("rewrite
    failed: KeyError ..."): a verdict on a program nothing was wrong with."""
    import tilenest.proofs.remap as RM

    def broken(p, m, r):
        raise KeyError("lost op")

    monkeypatch.setattr(RM, "build", broken)
    with pytest.raises(InternalError, match="rewriting the program for split") as ei:
        tn.transform.split(gemm, 1, 0, 2)
    assert "bug in tilenest" in ei.value.hint
