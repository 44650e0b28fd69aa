"""Regressions where compiling or running a kernel on the LLVM target killed the
process instead of raising an error or computing the right answer.

A crash takes the test process with it, so such a kernel is compiled and run
in a subprocess that prints ``ok`` only when the result is correct.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends.llvm import compile_program, jit
from tilenest.errors import TilenestError

# A carried tile read again after a nested ``parallel`` that rewrites it with
# ``put`` from a ``serial`` carry, then a second ``serial`` carry. After full
# unrolling, LLVM 22's SLP vectorizer emitted a load after the shuffle that
# uses it; instruction selection then aborted on that malformed IR (SIGABRT,
# "Already set a value for this node!"). Found by the random-program campaign
# (seed 20264, item 6425).
SLP_KERNEL = '''
import tilenest as tn


@tn.kernel
def fz(x: tn.Tensor[tn.f32, "N"], z: tn.Tensor[tn.f32, "N"], y: tn.Tensor[tn.f32, "N"]):
    (n,) = x.shape
    z = z.with_dims(*x.dims())
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(tn.cdiv(n, 8))):
        o = tn.coord(p.index() * 8)
        t = x[o, tn.shape(8), tn.bounds.zero]
        u = z[o, tn.shape(8), tn.bounds.zero]
        for s0 in p.serial(tn.shape(1)):
            t = t * 0.5 + u
        for c in p.parallel(tn.shape(1)):
            part = t
            for k in c.serial(tn.shape(2)):
                part = part * 0.5 + u
            t = tn.put(t, (0,), part)
        for s in p.serial(tn.shape(2)):
            t = t * 0.5 + u + tn.cast(s.index(), tn.f32)
        y(o, tn.shape(8)).store(t)
'''

# Inputs are small integers, so every intermediate is exact (fused or not).
SLP_DRIVER = '''
import importlib.util
import sys

import numpy as np

spec = importlib.util.spec_from_file_location("slp_kernel", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
from tilenest.backends.llvm import compile_program

ck = compile_program(m.fz.program, cache=False)
rng = np.random.default_rng(0)
for n in (8, 20):
    x = rng.integers(-8, 8, n).astype(np.float32)
    z = rng.integers(-8, 8, n).astype(np.float32)
    y = np.zeros(n, np.float32)
    ck(x, z, y)
    t = x * 0.5 + z
    for _ in range(2):
        t = t * 0.5 + z
    for s in range(2):
        t = t * 0.5 + z + s
    assert y.tobytes() == t.astype(np.float32).tobytes(), (n, y, t)
print("ok")
'''


def test_slp_vectorizer_malformed_ir_does_not_abort(tmp_path):
    src = tmp_path / "slp_kernel.py"
    src.write_text(SLP_KERNEL)
    drv = tmp_path / "driver.py"
    drv.write_text(SLP_DRIVER)
    p = subprocess.run([sys.executable, str(drv), str(src)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and p.stdout.strip().endswith("ok"), \
        f"rc={p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}"


@tn.kernel
def _axpy(x: tn.Tensor[tn.f32, "N"], y: tn.Tensor[tn.f32, "N"]):
    (n,) = x.shape
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(tn.cdiv(n, 8))):
        o = tn.coord(p.index() * 8)
        t = x[o, tn.shape(8), tn.bounds.zero]
        y(o, tn.shape(8)).store(t * 2.0 + 1.0)


def test_optimizer_falls_back_when_its_output_does_not_verify(monkeypatch):
    """The first (full) pipeline's result is reported malformed: the module is
    optimized again under a fallback pipeline, replaced in place, and runs."""
    real = jit._verify_error
    calls = []

    def first_fails(mod):
        calls.append(mod)
        return "injected: does not verify" if len(calls) == 1 else real(mod)

    monkeypatch.setattr(jit, "_verify_error", first_fails)
    ck = compile_program(_axpy.program, cache=False)
    assert len(calls) == 2
    x = np.arange(13, dtype=np.float32)
    y = np.zeros(13, np.float32)
    ck(x, y)
    assert y.tolist() == (x * 2 + 1).tolist()


def test_optimizer_refuses_when_no_pipeline_verifies(monkeypatch):
    monkeypatch.setattr(jit, "_verify_error", lambda mod: "injected: does not verify")
    with pytest.raises(TilenestError, match="optimizer made module .* malformed"):
        compile_program(_axpy.program, cache=False)


def test_optimize_keeps_a_well_formed_module_verified():
    h = jit.host()
    tm = jit.target_machine(h)
    mod = jit.parse(textwrap.dedent("""
        define float @f(ptr %p) {
          %v = load float, ptr %p
          %w = fadd float %v, 1.0
          ret float %w
        }
        """), h)
    mod = jit.optimize(mod, tm)
    mod.verify()
    assert "fadd" in str(mod)


# A strict right fold over a 32-element tile (fully unrolled by LLVM), then two
# tree sums of the tile plus the fold, then a pipeline reading another tensor.
# LLVM 22's SLP vectorizer turned the unrolled sums into a wrong shuffle
# reduction: every output was off by a small integer (here 3), no error, no
# crash. Found by the random-program campaign (seed 20265, item 17760) and
# reduced by hand; the SLP vectorizer is now off (``jit.SLP_VECTORIZE``).
@tn.kernel
def _fold_then_tree_sums(x: tn.Tensor[tn.i32, "N"], z: tn.Tensor[tn.i32, "N"],
                         y: tn.Tensor[tn.i32, "N"]):
    (n,) = x.shape
    z = z.with_dims(*x.dims())
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(tn.cdiv(n, 32))):
        o = tn.coord(p.index(0) * 32)
        t = x[o, tn.shape(32), tn.bounds.fill(2)]
        s = tn.scalar(0, tn.i32)
        for r in p.reduce(t.domain(t.dim(0)), policy=tn.fold_right):
            s = t.at(r) - s * 2
        t = t + s
        t = t + tn.reduce(t, t.dim(0), tn.add, policy=tn.unordered_tree)
        t = t + tn.reduce(t, t.dim(0), tn.add, policy=tn.unordered_tree)
        acc = t
        for k in p.pipeline(tn.shape(1), tn.pipeline_policy(0, 1)):
            k.stage("load")
            v = z[tn.coord(p.index(0) * 32), tn.shape(32), tn.bounds.zero]
            k.stage("use")
            acc = acc + v
        y(o, tn.shape(32)).store(acc)


@pytest.mark.parametrize("n", [13, 32, 45])
def test_unrolled_fold_then_tree_sums_is_not_miscompiled(n):
    x = (np.arange(n) % 3).astype(np.int32)
    z = np.ones(n, np.int32)
    y = np.zeros(n, np.int32)
    compile_program(_fold_then_tree_sums.program, cache=False)(x, z, y)
    verdict = tn.reference(_fold_then_tree_sums, x, z, np.zeros(n, np.int32)).admits(y)
    assert verdict.ok, str(verdict)


# A second kernel of the same defect, from the same campaign (seed 20265,
# item 42715): a right fold with a custom first-nonzero reducer over a tile,
# a strict sum, a nested parallel of put chains and a data-dependent while
# loop; with the SLP vectorizer every output was wrong (10 of 10 inputs).
SECOND_SLP_KERNEL = """
import tilenest as tn


@tn.kernel
def fz(x: tn.Tensor[tn.i32, "N0"], z: tn.Tensor[tn.i32, "N0"], y: tn.Tensor[tn.i32, "N0"], ix: tn.Tensor[tn.i32, "N0"]):
    (n0,) = x.shape
    z = z.with_dims(*x.dims())
    y = y.with_dims(*x.dims())
    ix = ix.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(tn.cdiv(n0, 32))):
        o = tn.coord(p.index(0) * 32)
        t = x[o, tn.shape(32), tn.bounds.fill(2)]
        u = z[o, tn.shape(32), tn.bounds.fill(1)]
        cr1 = tn.reducer('fz0_first', identity=0, merge=lambda a, b: tn.ite(a != 0, a, b), dtype=tn.i32, commutative=False)
        sc1 = tn.scalar(0, tn.i32)
        for rc1 in p.reduce(t.domain(t.dim(0)), contract=cr1, policy=tn.fold_right):
            sc1 = tn.ite(sc1 != 0, sc1, t.at(rc1))
        t = t + sc1
        sr2 = tn.reduce(t, t.dim(0), tn.add, policy=tn.fold_left)
        t = t + sr2
        for pc3 in p.parallel(tn.shape(4), exec=tn.exec.thread):
            part3 = tn.reindex(t, tn.shape(tn.axis(t.dim(0), 8)), lambda i: (pc3.index() * 8 + i,))
            q3 = tn.reindex(u, tn.shape(tn.axis(t.dim(0), 8)), lambda i: (24 - pc3.index() * 8 + i,))
            for kc3 in pc3.serial(tn.shape(2)):
                part3 = part3 * 3 + q3
            t = tn.put(t, (pc3.index() * 8,), part3)
        si4 = ix[tn.coord(p.index(0) * 32), tn.shape(1), tn.bounds.zero]
        si4 = tn.reduce(si4, si4.dim(0), tn.maximum)
        si4 = tn.cast(si4, tn.i64)
        it4 = tn.scalar(0, tn.i64)
        while tn.while_(it4 < (si4 & 3)):
            t = t * 3 + u
            it4 = it4 + 1
        y(o, tn.shape(32)).store(t)
"""


def test_second_campaign_miscompile_is_fixed(tmp_path):
    import importlib.util

    path = tmp_path / "second_slp_kernel.py"
    path.write_text(SECOND_SLP_KERNEL)
    spec = importlib.util.spec_from_file_location("second_slp_kernel", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    k = mod.fz
    rng = np.random.default_rng(3)
    ck = compile_program(k.program, cache=False)
    for _ in range(3):
        arrs = [rng.integers(-50, 50, 24).astype(np.int32) for _ in k.program.args]
        outs = [a.copy() for a in arrs]
        ck(*outs)
        refs = tn.reference(k, *arrs)
        refs = refs if isinstance(refs, tuple) else (refs,)
        stored = [i for i, v in enumerate(k.program.args) if v.name in ck.stored]
        for r, i in zip(refs, stored, strict=True):
            verdict = r.admits(outs[i])
            assert verdict.ok, str(verdict)
