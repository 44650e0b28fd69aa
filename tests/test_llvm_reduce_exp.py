"""A loop made only of reductions whose contributions call ``exp`` (a row's
log-sum-exp, a cross-entropy's normalizer) is explicit vector code with the
vector ``exp`` (``backends/llvm/vector.plan``), not left to LLVM's loop
vectorizer, which would evaluate the scalar formula with all its range
handling in every lane."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.backends.llvm import compile_program
from tilenest.backends.llvm import vector as V
from tilenest.lowering import default_schedule
from tilenest.lowering import loopir as L
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E


@tn.kernel
def logsumexp(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R K"]):  # noqa: F821
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        m = tn.reduce(row, row.dim(1), tn.maximum)
        s = tn.reduce(tn.exp(row - m), row.dim(1), tn.add)
        y(tn.coord(p.index(), 0), tn.shape(1, 1)).store(tn.reshape(m + tn.log(s), (1, 1)))


def _ir(bits: int) -> str:
    prog = logsumexp.program
    return compile_program(prog, default_schedule(prog, "llvm", vector_bits=bits),
                           cache=False).llvm_ir


def _calls_vector_exp(ir_text: str, w: int) -> bool:
    """Whether the kernel calls the ``w``-lane ``exp``: its only loop over a
    row's exponentials is the sum, which stores nothing, so a call means that
    loop is vector code."""
    return f'call <{w} x float> @"tn.exp.v{w}f32"' in ir_text


@pytest.mark.parametrize("bits", [256, 512])
def test_a_sum_of_exponentials_is_vector_code(bits):
    assert _calls_vector_exp(_ir(bits), bits // 32), "the sum of exp(x - m) is not vector code"


def test_the_check_fails_when_such_loops_are_left_to_llvm(monkeypatch):
    monkeypatch.setattr(V, "_own_vector_form", lambda x: False)
    assert not _calls_vector_exp(_ir(512), 16)


def test_plan_takes_reductions_of_exp_and_leaves_plain_ones_to_llvm():
    i, x = L.LVar("i", L.INDEX), E.Var("i")
    src = L.Buffer("a", D.f32, "global", E.Sym("N"), 0)
    acc = L.LVar("acc", D.f32)
    load = L.Load(src, L.IExpr(x))

    def red(v):
        return L.Assign(acc, L.Bin("add", L.Ref(acc), v, D.f32, ("reassoc",)))

    assert V.plan(i, (red(load),), 512) is None  # LLVM interleaves plain sums
    assert V.plan(i, (red(L.Un("exp", load, D.f32)),), 512) == 16
    assert V.plan(i, (red(L.Un("exp", load, D.f32)),), 256) == 8


@pytest.mark.parametrize("cols", [1, 15, 16, 17, 100, 1029])
def test_log_sum_exp_validates(cols):
    """Against the reference's admitted set (the sum regroups), at row lengths
    around the lane count, with rows whose exponentials leave the common
    range (underflow to subnormals and zero), an infinity and a NaN."""
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((6, cols)) * 3).astype(np.float32)
    x[1] = np.linspace(-120.0, 0.0, cols, dtype=np.float32)  # exp(x - m) down to 0
    x[2, cols // 2] = -np.inf
    x[3, cols - 1] = np.nan
    x[4] = np.float32(3e38) if cols > 1 else x[4]
    y = np.zeros((6, 1), np.float32)
    report = tn.validate(logsumexp, "llvm", inputs=[x, y])
    assert report.ok, report
