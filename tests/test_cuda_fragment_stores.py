"""Register-tile epilogues store a lane's adjacent columns as one access.

A thread's cells of an ``mma`` accumulator come in pairs of adjacent columns
(``e`` of ``loopir.lane_cell``): the elementwise nest reading them out runs
its innermost loop over the pair with every lane active. Such a lane loop is
widened like a distributed one (``analysis.lane_plan``): its store is one
2-element access when its guard holds at both lanes (the guard is an
interval over the lanes) and the address is aligned; any other pair (a
ragged last column, an odd row length) takes the element stores. Where the
stored values read only registers (an accumulator's epilogue), a pair's
values are computed once, before the test that picks the store form
(``SimtEmitter.values_first``), so an epilogue's code exists once.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import tilenest as tn
from tilenest import bf16
from tilenest.backends import cuda
from tilenest.lowering import default_schedule
from tilenest.workloads import WORKLOADS


def _gemm(dt=bf16, bm=64, bn=64, bk=32):  # type: ignore[no-untyped-def]
    return WORKLOADS["gemm"].kernel(dt, {"bm": bm, "bn": bn, "bk": bk, "loop": "pipeline"})


@pytest.mark.parametrize("dt,unit,tile", [(bf16, "auto", (64, 64, 32)),
                                          (bf16, "wgmma", (128, 128, 64)),
                                          (tn.f16, "tensor", (64, 64, 32))])
def test_an_accumulator_epilogue_stores_column_pairs(dt, unit, tile):
    kern = _gemm(dt, *tile)
    s = default_schedule(kern.program, "cuda", mma_unit=unit)
    text = cuda.stage_source(kern.program, s)[1].text
    body = text[text.rindex("for (v_kk"):]
    assert f"tn_vstore<tn_{dt.name}, 2>(&b_C[" in body
    # the pair's guard: both columns in range, the row length and base aligned
    assert "tn_aligned(b_C, 4) && tn_multiple(S_N, 2)" in body


@pytest.mark.parametrize("M,K,N", [(70, 40, 90), (64, 64, 63), (33, 16, 129), (64, 32, 64)])
def test_column_pairs_validate_emulated(M, K, N):
    """Even and odd row lengths (an odd one misaligns every other row) and a
    ragged last pair: the oracle admits every run."""
    kern = _gemm()
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda"),
                              device="emulated", cache=False)
    assert "tn_vstore<tn_bf16, 2>(&b_C[" in ck.source.text
    rng = np.random.default_rng(M + 3 * N)
    A = rng.standard_normal((M, K)).astype(bf16.np)
    B = rng.standard_normal((K, N)).astype(bf16.np)
    oracle = tn.reference(kern, A, B, np.zeros((M, N), bf16.np))
    for policy, poison in (("in_order", "nan"), ("random", "big")):
        C = np.zeros((M, N), bf16.np)
        ck(A, B, C, policy=policy, poison=poison, seed=5)
        v = oracle.admits(C)
        assert v.ok, f"{policy}/{poison}: {v}"


def _epilogue(text: str) -> str:
    """The emitted code after the K loop (the accumulator's epilogue)."""
    return text[text.rindex("tn_wgmma_wait<0>()" if "tn_wgmma" in text else "for (v_kk"):]


@pytest.mark.parametrize("unit,tile", [("auto", (64, 64, 32)), ("wgmma", (128, 256, 64))])
def test_an_epilogue_computes_each_pair_once(unit, tile):
    """The fused GELU is computed once per pair of cells, into a pack that
    either the 2-element store or the two element stores write: one call
    of the tanh in the epilogue's code, not one per store form."""
    bm, bn, bk = tile
    kern = WORKLOADS["gemm_gelu"].kernel(bf16, {"bm": bm, "bn": bn, "bk": bk,
                                                "loop": "pipeline", "epilogue": "gelu"})
    s = default_schedule(kern.program, "cuda", mma_unit=unit)
    body = _epilogue(cuda.stage_source(kern.program, s)[1].text)
    assert body.count("tn_tanh_approx(") == 1, body
    group = body[body.index("their values once, stored wide or lane by lane"):]
    wide, lanes = group.split("} else {", 1)
    assert "tn_tanh_approx(" in group[:group.index("if (")]  # before the store test
    assert "tn_vstore<tn_bf16, 2>(&b_C[" in wide
    assert "b_C[" in lanes and "= tn_vs_0_" in lanes  # a lane stores its pack element


def test_values_that_read_memory_stay_under_their_store_form():
    """A value read from global memory (a bias row) is not computed for a
    lane whose store does not happen: there the address may lie past the
    array. Such a pair keeps one computation per store form, and a ragged
    run validates with the reads checked."""
    @tn.kernel
    def gemm_bias(A: tn.Tensor[bf16, "M K"], B: tn.Tensor[bf16, "K N"],
                  bias: tn.Tensor[tn.f32, "N"], C: tn.Tensor[bf16, "M N"]):
        M, K = A.shape
        N = B.shape[1]
        m, k = A.dims()
        n = C.dim(1)
        B, C, bias = B.with_dims(k, n), C.with_dims(m, n), bias.with_dims(n)
        for p in tn.parallel(tn.shape(tn.cdiv(M, 64), tn.cdiv(N, 64)), exec=tn.exec.block):
            i, j = p.index(0), p.index(1)
            acc = tn.zeros(tn.f32, tn.shape(64, 64), dims=(m, n))
            for kk in p.pipeline(tn.shape(tn.cdiv(K, 32)), tn.pipeline_policy(window=2)):
                kk.stage("load")
                a = A[tn.coord(i * 64, kk.index() * 32), tn.shape(64, 32)]
                b = B[tn.coord(kk.index() * 32, j * 64), tn.shape(32, 64)]
                kk.stage("mma")
                acc = tn.mma(a, b, acc)
            row = bias[tn.coord(j * 64), tn.shape(64)]
            C(tn.coord(i * 64, j * 64), tn.shape(64, 64)).store(
                tn.cast(acc + tn.broadcast(row, tn.shape(64, 64), dims=(m, n)), bf16))

    ck = cuda.compile_program(gemm_bias.program, default_schedule(gemm_bias.program, "cuda"),
                              device="emulated", cache=False)
    body = _epilogue(ck.source.text)
    assert "their values once" not in body
    rng = np.random.default_rng(7)
    M, K, N = 70, 40, 91
    A = rng.standard_normal((M, K)).astype(bf16.np)
    B = rng.standard_normal((K, N)).astype(bf16.np)
    bias = rng.standard_normal(N).astype(np.float32)
    oracle = tn.reference(gemm_bias, A, B, bias, np.zeros((M, N), bf16.np))
    C = np.zeros((M, N), bf16.np)
    ck(A, B, bias, C, policy="random", poison="nan", seed=3)
    assert oracle.admits(C).ok


@pytest.mark.parametrize("M,K,N", [(70, 40, 90), (33, 16, 129)])
def test_an_epilogue_computed_once_validates_emulated(M, K, N):
    """The GELU epilogue with its values computed before the store test, on
    an even and an odd row length with ragged edges: the lanes past the
    edge compute a value nobody stores, and the oracle admits every run."""
    kern = WORKLOADS["gemm_gelu"].kernel(bf16, {"bm": 64, "bn": 64, "bk": 32,
                                                "loop": "pipeline", "epilogue": "gelu"})
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda"),
                              device="emulated", cache=False)
    assert "their values once, stored wide or lane by lane" in ck.source.text
    rng = np.random.default_rng(M + N)
    A = rng.standard_normal((M, K)).astype(bf16.np)
    B = rng.standard_normal((K, N)).astype(bf16.np)
    oracle = tn.reference(kern, A, B, np.zeros((M, N), bf16.np))
    for policy, poison in (("in_order", "nan"), ("random", "big")):
        C = np.zeros((M, N), bf16.np)
        ck(A, B, C, policy=policy, poison=poison, seed=5)
        v = oracle.admits(C)
        assert v.ok, f"{policy}/{poison}: {v}"


@pytest.mark.device
@pytest.mark.parametrize("unit,tile", [("auto", (64, 64, 32)), ("wgmma", (128, 256, 64))])
@pytest.mark.parametrize("M,K,N", [(512, 256, 512), (300, 200, 777), (129, 72, 4099)])
def test_column_pairs_on_the_gpu(unit, tile, M, K, N):
    """The same on the device: square, ragged with an odd row length, and a
    long odd row."""
    kern = _gemm(bf16, *tile)
    ck = cuda.compile_program(kern.program,
                              default_schedule(kern.program, "cuda", mma_unit=unit), device="gpu")
    assert "tn_vstore<tn_bf16, 2>(&b_C[" in ck.source.text
    rng = np.random.default_rng(M + 3 * N)
    A = rng.standard_normal((M, K)).astype(bf16.np)
    B = rng.standard_normal((K, N)).astype(bf16.np)
    C = np.zeros((M, N), bf16.np)
    ck(A, B, C)
    v = tn.reference(kern, A, B, np.zeros((M, N), bf16.np)).admits(C)
    assert v.ok, v


def _values_once_reads(text: str) -> list[set[str]]:
    """For each lane group whose values are computed before its store test,
    the kernel's tensors (parameters) that code reads."""
    params = set(re.findall(r"\b(b_\w+)(?=[,)])", text[:text.index("{")]))
    out = []
    for m in re.finditer("their values once, stored wide or lane by lane", text):
        head = text[m.end():text.index("if (", m.end())]
        out.append(set(re.findall(r"\b(b_\w+)\[", head)) & params)
    return out


def test_values_read_from_a_tensor_are_computed_under_the_store_test():
    """The inclusive prefix sum of the conformance suite (R-14) stores each
    step's column with lanes past the last row: their values, ``x[i, s]``
    added to the carried sum, read the tensor at rows it does not have. They
    are computed under each store form's own bounds test, not once for every
    lane before it (on the GPU those reads ran kilobytes past ``x``)."""
    from tilenest.conformance import load_program

    root = Path(__file__).resolve().parent.parent / "spec" / "conformance" / "cases"
    prog = load_program(root / "reductions" / "R14-cumsum-fold.tile")
    text = cuda.stage_source(prog, default_schedule(prog, "cuda"))[1].text
    assert "b_x[" in text and "their values once" not in text


def _corpus():  # type: ignore[no-untyped-def]
    """(name, program) of the conformance suite's programs and of every
    workload (its first dtype, every schedule it lists)."""
    from tilenest.conformance import load_program
    from tilenest.errors import TilenestError

    root = Path(__file__).resolve().parent.parent / "spec" / "conformance" / "cases"
    for f in sorted(root.rglob("*.tile")):
        if not f.name.endswith(".wrong.tile"):
            try:
                yield f.name, load_program(f)
            except TilenestError:  # a case whose verdict is the verifier's refusal
                continue
    for name, wl in WORKLOADS.items():
        for i, sched in enumerate(wl.schedules):
            yield f"{name}[{i}]", wl.kernel(wl.dtypes[0], dict(sched), wl.size("small")).program


def test_no_value_computed_for_every_lane_reads_a_tensor():
    """Over the conformance suite's programs and the workloads (each compiled
    for the GPU with its default schedule), no lane group computed before
    its store test reads a tensor: only registers, shared arrays in range,
    scalars."""
    from tilenest.errors import TilenestError

    groups, bad = 0, []
    for name, prog in _corpus():
        try:
            text = cuda.stage_source(prog, default_schedule(prog, "cuda"))[1].text
        except TilenestError:  # refused for the GPU (that verdict is tested elsewhere)
            continue
        for reads in _values_once_reads(text):
            groups += 1
            if reads:
                bad.append((name, sorted(reads)))
    assert groups > 10 and not bad, (groups, bad)
