"""The CPU backend's coverage matrix: every dtype x every region kind x every
reduction policy x ragged tails, compiled for LLVM and validated.

For each dtype the interpreter supports, one kernel nests ``parallel`` ->
``parallel(warp)`` -> ``serial`` (reversed) and ``pipeline`` (with stage
cuts) and reduces its tile under every reduction policy, both in expression
form (``tn.reduce(t, dim, op, policy=...)``) and in region form (``for r in
w.reduce(..., policy=...)``). Tiles are loaded with ``bounds.zero`` /
``bounds.fill`` over ragged extents, so tails are exercised by the generated
sizes. ``test_matrix_covers_everything`` asserts that the matrix (and the
fuzzer's generator) name every dtype, region kind and policy the semantics
define, so adding one without covering it fails."""

from __future__ import annotations

import linecache

import numpy as np
import pytest

import tilenest as tn
from tilenest.semantics import dtypes as D
from tilenest.semantics.ir import NEST_OPS
from tilenest.semantics.policies import ReductionPolicy
from tilenest.validation import fuzz, validate

POLICIES = [p.value for p in ReductionPolicy]
MATRIX_DTYPES = ["bool", "i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "f16", "bf16",
                 "f32", "f64"]
ROWS, COLS, WARP = 4, 8, 2

_SRC = '''import tilenest as tn


@tn.kernel
def cov_{dt}(x: tn.Tensor[tn.{tdt}, "R C"], z: tn.Tensor[tn.{tdt}, "R C"],
             y: tn.Tensor[tn.{tdt}, "R C"]):
    rows, cols = x.shape
    z = z.with_dims(*x.dims())
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(tn.cdiv(rows, {R}), tn.cdiv(cols, {C}))):
        for w in p.parallel(tn.shape({W}), exec=tn.exec.warp):
            r0 = p.index(0) * {R} + w.index() * {H}
            o = tn.coord(r0, p.index(1) * {C})
            t = x[o, tn.shape({H}, {C}), tn.bounds.zero]
            u = z[o, tn.shape({H}, {C}), tn.bounds.fill({one})]
            for ks in w.serial(tn.shape(2), order="reverse"):
                t = t {comb} u
            for kp in w.pipeline(tn.shape(2), tn.pipeline_policy(2, 1)):
                kp.stage("load")
                v = z[tn.coord(r0 + kp.index(), p.index(1) * {C}), tn.shape({H}, {C}),
                      tn.bounds.zero]
                kp.stage("use")
                u = u {comb2} v
{reds}
            y(o, tn.shape({H}, {C})).store({final})
'''


def matrix_kernel(dt: str) -> tn.Kernel:
    """The coverage kernel for dtype ``dt`` (see the module docstring)."""
    if dt == "bool":
        one, comb, comb2, red = "True", "^", "|", "'xor'"
    else:
        one = "1.0" if dt.startswith(("f", "bf")) else "1"
        comb, comb2, red = "+", "+", "tn.add"
    reds, names = [], []
    for i, pol in enumerate(POLICIES):
        reds.append(f"            e{i} = tn.reduce(t, t.dim(1), {red}, policy=tn.{pol})")
        reds.append(f"            s{i} = tn.zeros(tn.{_t(dt)}, tn.shape({ROWS // WARP}), "
                    f"dims=(t.dim(0),))")
        reds.append(f"            for rr in w.reduce(t.domain(t.dim(1)), policy=tn.{pol}):")
        reds.append(f"                s{i} = s{i} {comb} t.at(rr)")
        names += [f"e{i}", f"s{i}"]
    src = _SRC.format(dt=dt, tdt=_t(dt), one=one, comb=comb, comb2=comb2, reds="\n".join(reds),
                      final=f" {comb} ".join(["t", "u"] + names), R=ROWS, C=COLS, W=WARP,
                      H=ROWS // WARP)
    fname = f"<coverage-{dt}>"
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
    ns: dict = {}
    exec(compile(src, fname, "exec"), ns)  # noqa: S102 - our own source
    return ns[f"cov_{dt}"]


def _t(dt: str) -> str:
    return "bool_" if dt == "bool" else dt


#: (rows, cols): whole tiles, tails in both dims, a single element, a partial tile
SHAPES = [(8, 16), (7, 13), (1, 1), (3, 21)]


def _values(dt: str, shape: tuple, rng: np.random.Generator) -> np.ndarray:
    npdt = D.parse(dt).np
    if dt == "bool":
        return rng.integers(0, 2, shape).astype(bool)
    if dt.startswith(("f", "bf")):
        return (rng.standard_normal(shape) * 4).astype(np.float32).astype(npdt)
    info = np.iinfo(npdt)
    return rng.integers(info.min, info.max, shape, dtype=npdt, endpoint=True)


@pytest.mark.parametrize("dt", MATRIX_DTYPES)
def test_every_dtype_region_and_policy_validates_with_tails(dt):
    k = matrix_kernel(dt)
    rng = np.random.default_rng(7)
    npdt = D.parse(dt).np
    inputs = [[_values(dt, sh, rng), _values(dt, sh, rng), np.zeros(sh, npdt)] for sh in SHAPES]
    assert any(r % ROWS and c % COLS for r, c in SHAPES)
    rep = validate(k, inputs=inputs)
    assert rep.ok, rep.summary()
    assert rep.count("ok") == len(SHAPES), rep.summary()
    # and generated cases (special values, more sizes)
    rep = validate(k, cases=3, seed=2, limit=40)
    assert rep.ok and rep.count("ok") == 3, rep.summary()


def _policies(program) -> set[str]:  # type: ignore[no-untyped-def]
    out = set()
    for op in program.walk():
        for v in getattr(op, "attrs", {}).values():
            if isinstance(v, ReductionPolicy):
                out.add(v.value)
    return out


def test_matrix_covers_everything():
    """Every dtype of the semantics, every region kind (NEST_OPS), every
    reduction policy; and the fuzzer draws every step kind and dtype, and its
    step kinds reach every region kind and policy."""
    # the FP8 formats have no arithmetic, which this kernel does (V-24); their
    # conversions, comparisons and mma operands are swept in tests/llvm_sweep.py
    assert set(MATRIX_DTYPES) == {d.name for d in D.ALL if not d.is_fp8}
    prog = matrix_kernel("f32").program
    names = {op.name for op in prog.walk()}
    assert set(NEST_OPS) <= names, names
    assert _policies(prog) == set(POLICIES)
    # the fuzzer: every step kind and dtype is drawn, and its programs reach
    # every region kind and policy
    drawn = [fuzz.random_spec(i) for i in range(600)]
    kinds = {st[0] for s in drawn for st in fuzz.flat_steps(s.steps)}
    assert kinds == set(fuzz.STEP_KINDS), set(fuzz.STEP_KINDS) - kinds
    assert {s.dtype for s in drawn} == set(fuzz.DTYPES)
    assert {s.storage for s in drawn} == {None, "f16", "bf16"}
    assert {s.sched for s in drawn} == set(fuzz.SCHEDULES)
    s = fuzz.Spec("f32", 2, (4, 8), False, False, [
        ("serial", 2, "fwd"), ("pipe", 2, 1, True), ("fold", 1, "fold_left", "a"),
        ("fold", 0, "fold_right", "b"), ("red", 1, "add", "unordered_tree", "add"),
        ("red", 0, "add", "ordered_tree", "sub")])
    p = fuzz.build(s).program
    assert set(NEST_OPS) <= {op.name for op in p.walk()}
    assert _policies(p) == set(POLICIES)
