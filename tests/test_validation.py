"""Translation validation: input generation, verdicts, the oracle repairs, and
deliberately miscompiled lowerings that validation must catch."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.backends.llvm import compile_program
from tilenest.validation import generate, validate
from tilenest.validation.inputs import size_pool
from tilenest.validation.mutants import MUTATIONS, OutOfBoundsWrite, compile_mutant, mutate, padded
from tilenest.validation.report import table, to_json
from tilenest.validation.validate import with_reference

ROOT = pathlib.Path(__file__).resolve().parent.parent


def example(name: str) -> tn.Kernel:
    spec = importlib.util.spec_from_file_location(f"ex_{name}", ROOT / "examples" / f"{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return next(v for v in vars(m).values() if isinstance(v, tn.Kernel))


# ---------------------------------------------------------------------------
# inputs


def test_size_pool_has_ragged_sizes():
    pool = size_pool(example("ragged").program)
    assert {1, 127, 128, 129, 2, 3, 7, 13}.issubset(pool)
    pool = size_pool(example("gemm").program)
    assert {31, 32, 33}.issubset(pool)


def test_generated_cases_have_specials_and_poisoned_outputs():
    p = example("softmax").program
    cases = generate(p, 9, seed=4)
    assert len(cases) == 9
    xs = [c.args[0] for c in cases]
    ys = [c.args[1] for c in cases]
    assert all(np.isnan(y).all() for y in ys)  # y is only stored: poisoned
    allx = np.concatenate([x.ravel() for x in xs])
    assert np.isnan(allx).any() and np.isinf(allx).any()
    assert (np.signbit(allx) & (allx == 0)).any()  # -0.0
    tiny = np.finfo(np.float32).tiny
    assert ((np.abs(allx) < tiny) & (allx != 0)).any()  # subnormals
    assert not np.isnan(xs[0]).any()  # the first case is clean
    rows = {c.syms["R"] for c in cases} | {c.syms["C"] for c in cases}
    assert len(rows) > 3


def test_integer_inputs_and_assumptions():
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    from kernels_constructs import values_zoo

    sys.path.pop(0)
    for c in generate(values_zoo.program, 6, seed=1):
        assert c.syms["N"] >= 1  # tn.assume(n >= 1)
        assert c.args[1].dtype == np.int32


# ---------------------------------------------------------------------------
# verdicts


def test_report_summary_table_and_json():
    rep = validate(example("ragged"), cases=4, seed=2)
    assert rep.ok and rep.count("ok") == 4
    assert "4 ok" in rep.summary()
    assert table([rep]).row_count == 1
    assert to_json(rep)["counts"]["ok"] == 4


def test_given_inputs_are_used_as_is():
    k = example("ragged")
    x = np.arange(5, dtype=np.float32)
    rep = validate(k, inputs=[np.float32(2), x, x.copy(), np.zeros(5, np.float32)])
    assert rep.count("ok") == 1 and rep.results[0].label.startswith("given")


def test_reference_value_is_always_admitted():
    """An envelope that excludes the canonical value (intermediate overflow) is
    widened to contain it; a NaN reference makes the element unbounded."""
    from tilenest.interpreter.oracle import Admitted

    a = Admitted("y", tn.f32, np.array([np.inf, np.nan, 1.0], np.float32),
                 np.array([1e38, 1e38, 0.5]), np.array([2e38, 2e38, 1.5]))
    assert not a.admits(a.value)
    b = with_reference(a)
    assert b.admits(a.value)
    assert b.admits(np.array([np.inf, 7.0, 1.25], np.float32))
    assert not b.admits(np.array([np.inf, 7.0, 2.0], np.float32))


def test_a_wrong_compiled_function_is_reported_with_its_element():
    k = example("ragged")

    def wrong(a, x, y, out, params=None):
        out[...] = a * x + y
        if out.size:  # generated cases include N = 0
            out[-1] += 1.0

    rep = validate(k, cases=3, compiled=wrong)
    assert not rep.ok
    f = rep.smallest_failure()
    assert f.output == "out" and f.element is not None and "bitwise" in f.message


def test_unwritten_outputs_are_caught_by_poison():
    k = example("ragged")

    def lazy(a, x, y, out, params=None):
        out[:-1] = a * x[:-1] + y[:-1]

    rep = validate(k, cases=3, compiled=lazy)
    assert not rep.ok and "nan" in rep.smallest_failure().message.lower()


# ---------------------------------------------------------------------------
# deliberately miscompiled lowerings


@tn.kernel
def seeded_sum(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R"]):
    rows, cols = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(rows)):
        t = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        s = tn.full(f32, tn.shape(tn.axis(t.dim(0), 1)), 100.0)
        for r in p.reduce(t.domain(t.dim(1)), policy=tn.fold_left):
            s = s + t.at(r)
        y(tn.coord(p.index()), tn.shape(1)).store(s)


CAUGHT = [
    ("ragged", "flip_index"), ("gemm", "flip_index"), ("rmsnorm", "flip_index"),
    ("ragged", "drop_tail_guard"), ("gemm", "drop_tail_guard"), ("rmsnorm", "drop_tail_guard"),
    ("folds", "reorder_fold"), ("seeded_sum", "reorder_fold"), ("seeded_sum", "drop_reduce_seed"),
]


def _kernel(name: str) -> tn.Kernel:
    return seeded_sum if name == "seeded_sum" else example(name)


@pytest.mark.parametrize("name, kind", CAUGHT)
def test_miscompiled_lowering_is_caught(name, kind):
    k = _kernel(name)
    rep = validate(k, cases=6, seed=7, compiled=compile_mutant(k.program, kind))
    assert not rep.ok, f"{kind} on {name} was not caught"


@pytest.mark.parametrize("name", ["ragged", "gemm", "rmsnorm", "folds", "seeded_sum"])
def test_unmutated_control_passes_the_same_harness(name):
    k = _kernel(name)
    rep = validate(k, cases=6, seed=7, compiled=padded(compile_program(k.program)))
    assert rep.ok, rep.summary()


def test_mutations_that_do_not_apply_are_refused():
    from tilenest.lowering import lower_verified

    kern = lower_verified(example("ragged").program)
    with pytest.raises(ValueError, match="does not apply"):
        mutate(kern, "reorder_fold")
    with pytest.raises(ValueError, match="unknown"):
        mutate(kern, "nonsense")
    assert set(MUTATIONS) == {k for _, k in CAUGHT}


def test_padded_reports_writes_outside_the_arrays():
    def overrun(x, params=None):
        base = x.base if x.base is not None else x
        np.asarray(base).reshape(-1)[-1] = 1  # the last slack element

    with pytest.raises(OutOfBoundsWrite):
        padded(overrun)(np.zeros(4, np.float32))


def test_public_entry_point():
    rep = tn.validate(example("ragged"), "llvm", cases=2)
    assert rep.ok and rep.target == "llvm"
    rep = tn.validate(example("ragged"), "metal", cases=1)  # the emulated device
    assert rep.ok and rep.target == "metal"
    with pytest.raises(tn.errors.NotAvailableError):
        tn.validate(example("ragged"), "nope", cases=1)
