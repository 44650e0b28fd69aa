"""The LLVM backend: every example and construct kernel compiles and validates;
reduction policies keep (or use) their permissions; vector width; the compile
cache; argument checking; threads; runtime errors; ``tilenest lower``."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32, i32
from tilenest.backends.llvm import STAGES, compile_program, emit
from tilenest.errors import BoundsError, TilenestError, TypeCheckError
from tilenest.lowering import default_schedule, host_vector_bits
from tilenest.validation import validate

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
import kernels_constructs as KC  # noqa: E402

EXAMPLES = ["softmax", "rmsnorm", "folds", "ragged", "gemm", "two_level", "memory_stage"]


def example(name: str):
    spec = importlib.util.spec_from_file_location(f"ex_{name}", ROOT / "examples" / f"{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


@pytest.mark.parametrize("name", EXAMPLES)
def test_examples_compile_and_validate(name):
    m = example(name)
    k = next(v for v in vars(m).values() if isinstance(v, tn.Kernel))
    rep = validate(k, cases=6, seed=11)
    assert rep.ok, rep.summary()
    assert rep.count("ok") >= 5
    # the example's own inputs, and its independent numpy reference
    args = list(m.example_inputs(np.random.default_rng(0)))
    out = k.compile()(*args)
    want = m.numpy_reference(*m.example_inputs(np.random.default_rng(0)))
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5)


SUPPORTED = ["values_zoo", "control_flow", "memory_and_layouts", "gemm_reduce_fold",
             "custom_reducer", "embedding", "misc_constructs", "all_regions",
             "nest_subnest_update", "per_child_patches"]


@pytest.mark.parametrize("name", SUPPORTED)
def test_construct_kernels_validate(name):
    rep = validate(getattr(KC, name), cases=6, seed=3)
    assert rep.ok, rep.summary()
    assert rep.count("ok") + rep.count("rejected") + rep.count("skipped") == 6


def test_every_construct_kernel_is_covered():
    assert set(SUPPORTED) == {k.__name__ for k in KC.ALL}


def test_int64_to_bf16_rounds_once():
    """i64 -> bf16 rounds to odd at f64 first, then once to bf16 (no double
    rounding): compiled results are bitwise the interpreter's."""
    @tn.kernel
    def to_bf16(x: tn.Tensor[tn.i64, "N"], y: tn.Tensor[tn.bf16, "N"]):
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(n)):
            y(tn.coord(p.index()), tn.shape(1)).store(tn.cast(x[tn.coord(p.index()),
                                                                 tn.shape(1)], tn.bf16))

    # 2^62 + 2^54 + 1 lies just above a bf16 midpoint that f64 would round onto
    x = np.array([0, 1, -1, 2**63 - 1, -2**63, 2**62 + 2**54 + 1, -(2**62 + 2**54 + 1),
                  2**53 + 1, 255 * 2**40 + 2**32 + 1], np.int64)
    import ml_dtypes

    y = np.zeros(x.size, ml_dtypes.bfloat16)
    to_bf16.compile()(x, y)
    assert tn.reference(to_bf16, x, np.zeros_like(y)).admits(y)
    assert float(y[5]) == 2.0**62 + 2.0**55


def test_values_zoo_runs_on_valid_indices():
    """values_zoo reads idx with bounds.checked: valid indices give admitted results."""
    k = KC.values_zoo
    n = 48  # a multiple of the block: the checked idx view stays inside
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    idx = (np.arange(n) * 7 % 16).astype(np.int32)
    rep = validate(k, inputs=[x, idx, np.zeros(n, np.float32), 0.25])
    assert rep.ok and rep.count("ok") == 1, rep.summary()


# ---------------------------------------------------------------------------
# reductions under each policy


def _reducer(policy, op):
    @tn.kernel
    def red(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R"]):
        rows, cols = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(tn.cdiv(rows, 4))):
            t = x[tn.coord(p.index() * 4, 0), tn.shape(4, cols)]
            y(tn.coord(p.index() * 4), tn.shape(4)).store(
                tn.reduce(t, t.dim(1), op, policy=policy))
    return red


@pytest.mark.parametrize("policy", ["unordered_tree", "ordered_tree", "fold_left", "fold_right"])
@pytest.mark.parametrize("op", ["add", "maximum", "minimum", "mul"])
def test_reduction_policies(policy, op):
    k = _reducer(getattr(tn, policy), getattr(tn, op))
    rep = validate(k, cases=4, seed=5)
    assert rep.ok, rep.summary()
    ck = k.compile()
    fp = re.findall(r"\b(fadd|fmul|call) (reassoc )?", ck.optimized_ir)
    has_flag = any(flag for _, flag in fp) or "reassoc" in ck.optimized_ir
    if policy.startswith("fold"):
        assert not has_flag  # strict folds never carry reassociation permission
    elif op in ("add", "mul"):
        assert has_flag


def test_tree_sum_vectorizes_and_strict_fold_does_not():
    tree = _reducer(tn.unordered_tree, tn.add).compile()
    fold = _reducer(tn.fold_left, tn.add).compile()
    assert re.search(r"fadd reassoc <\d+ x float>", tree.optimized_ir)
    assert not re.search(r"fadd[^\n]*<\d+ x float>[^\n]*%acc", fold.optimized_ir)
    assert "vector.reduce.fadd" not in fold.optimized_ir


def test_fold_orders_are_bitwise():
    m = example("folds")
    x = np.array([1, 2, 3], np.float32)
    out = m.folds.compile()(x, np.zeros(2, np.float32))
    assert out.tolist() == [-6.0, 2.0]
    x = np.random.default_rng(0).standard_normal(1001).astype(np.float32) * 1e3
    assert validate(m.folds, inputs=[x, np.zeros(2, np.float32)]).count("ok") == 1


@tn.kernel
def seeded_int(x: tn.Tensor[i32, "N"], out: tn.Tensor[i32, "1"]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(1)):
        v = x[tn.coord(0), tn.shape(n)]
        s = tn.full(i32, tn.shape(tn.axis(out.dim(0), 1)), 100)
        for r in p.reduce(v.domain(v.dim(0))):
            s = s + v.at(r)
        out(tn.coord(0), tn.shape(1)).store(s)


def test_integer_tree_reduction_with_seed():
    x = np.arange(10, dtype=np.int32)
    assert seeded_int.compile()(x, np.zeros(1, np.int32)).tolist() == [145]
    assert validate(seeded_int, cases=5).ok


# ---------------------------------------------------------------------------
# code generation properties


def test_vector_width_from_host():
    ck = example("softmax").row_softmax.compile()
    if host_vector_bits() == 512:
        assert "zmm" in ck.asm()
    assert f'"prefer-vector-width"="{ck.schedule.vector_bits}"' in ck.llvm_ir


def test_exp_is_vectorized_inline_not_a_libm_call():
    ck = example("softmax").row_softmax.compile()
    assert not re.search(r"call\s+\S*\bexp\b", ck.asm())
    # f32 exp is f32 arithmetic: its reduction (k by a fused shift) is vectorized
    assert re.search(r"llvm\.fma\.v\d+f32", ck.optimized_ir)


def test_compile_cache():
    k = example("ragged").axpy
    a = k.compile()
    assert k.compile() is a
    other = 128 if host_vector_bits() != 128 else 256  # a schedule that differs on any host
    b = compile_program(k.program, default_schedule(k.program).with_(vector_bits=other))
    assert b is not a and f'"prefer-vector-width"="{other}"' in b.llvm_ir


def test_stages_print():
    p = example("ragged").axpy.program
    for st in STAGES:
        assert emit(p, st).strip()
    assert "define" in emit(p, "ir") and "axpy_0" in emit(p, "asm")
    with pytest.raises(TilenestError, match="unknown stage"):
        emit(p, "ptx")


# ---------------------------------------------------------------------------
# the runtime


def test_argument_checks():
    ck = example("ragged").axpy.compile()
    x = np.ones(10, np.float32)
    with pytest.raises(TypeCheckError, match="dtype"):
        ck(np.float32(1), x.astype(np.float64), x, x.copy())
    with pytest.raises(TilenestError, match="C-contiguous"):
        ck(np.float32(1), np.ones(20, np.float32)[::2], x, x.copy())
    buf = np.ones(11, np.float32)
    with pytest.raises(TilenestError, match="overlap"):
        ck(np.float32(1), buf[:10], buf[1:], buf[1:])
    with pytest.raises(TilenestError, match="takes 4 arguments"):
        ck(x, x)
    with pytest.raises(TypeCheckError, match="extent N"):
        ck(np.float32(1), x, np.ones(11, np.float32), x.copy())


def test_threads_give_identical_results():
    m = example("softmax")
    ck = m.row_softmax.compile()
    x = np.random.default_rng(0).standard_normal((203, 77)).astype(np.float32)
    y1, y2 = np.zeros_like(x), np.zeros_like(x)
    ck(x, y1, threads=1)
    ck(x, y2, threads=2)
    assert y1.tobytes() == y2.tobytes()
    sched = default_schedule(m.row_softmax.program).with_(chunk=7)
    y3 = np.zeros_like(x)
    compile_program(m.row_softmax.program, sched)(x, y3, threads=2)
    assert y3.tobytes() == y1.tobytes()


def test_empty_and_single_element_tensors():
    ck = example("ragged").axpy.compile()
    e = np.zeros(0, np.float32)
    ck(np.float32(2), e, e.copy(), e.copy())
    one = np.ones(1, np.float32)
    out = ck(np.float32(2), one, one.copy(), np.zeros(1, np.float32))
    assert out.tolist() == [3.0]


@tn.kernel
def checked_load(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, b=8):
    (n,) = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(tn.cdiv(n, b))):
        o = tn.coord(p.index() * b)
        y(o, tn.shape(b)).store(x[o, tn.shape(b), tn.bounds.checked] * 2.0)


def test_checked_bounds_raise_like_the_interpreter():
    ck = checked_load.compile()
    ok = np.arange(16, dtype=np.float32)
    assert ck(ok, np.zeros(16, np.float32)).tolist() == (ok * 2).tolist()
    with pytest.raises(BoundsError, match="checked"):
        ck(np.arange(13, dtype=np.float32), np.zeros(13, np.float32))
    rep = validate(checked_load, cases=6)
    assert rep.ok and rep.count("rejected") >= 1


@tn.kernel
def scaled(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], k: int, s: tn.Scalar[f32]):
    (n,) = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
        o = tn.coord(p.index() * 4)
        y(o, tn.shape(4)).store(x[o, tn.shape(4)] * s + tn.scalar(k, f32))


def test_symbol_parameters_and_scalar_arguments():
    x = np.arange(10, dtype=np.float32)
    out = scaled.compile()(x, np.zeros(10, np.float32), 0.5, params={"k": 3})
    assert out.tolist() == (x * 0.5 + 3).tolist()
    with pytest.raises(TilenestError, match="no value for parameter 'k'"):
        scaled.compile()(x, np.zeros(10, np.float32), 0.5)


def test_cli_lower_and_validate():
    run = [sys.executable, "-m", "tilenest.cli"]
    r = subprocess.run(run + ["lower", str(ROOT / "examples" / "ragged.py"), "--target", "llvm",
                              "--emit", "loopir"], capture_output=True, text=True)
    assert r.returncode == 0 and "phase axpy_0" in r.stdout
    r = subprocess.run(run + ["lower", str(ROOT / "examples" / "ragged.py"), "--emit", "asm"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "axpy_0:" in r.stdout
    r = subprocess.run(run + ["lower", str(ROOT / "examples" / "ragged.py"), "--emit", "ptx"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "unknown stage" in r.stderr
    r = subprocess.run(run + ["validate", str(ROOT / "examples" / "softmax.py"), "--cases", "3",
                              "--seed", "2"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "row_softmax" in r.stdout and "translation validation" in r.stdout
    r = subprocess.run(run + ["validate", str(ROOT / "tests" / "kernels_constructs.py"),
                              "--kernel", "per_child_patches", "--cases", "2"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "per_child_patches" in r.stdout
