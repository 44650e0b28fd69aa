"""``mma`` on Metal's simdgroup matrices (an opaque ``loopir.WarpMma``).

On the metal target a reassociating f16 or f32 ``mma`` into f32 with
8-aligned constant tile extents runs in simdgroup tiles of 8 x 8
``simdgroup_multiply_accumulate`` steps (``lowering/mma.tensor_plan``). The
lanes' shares of a matrix are unspecified, so the analyses see lane 0 making
every accumulator access; the emitter orders the simdgroup's lanes with a
simdgroup barrier on each side. The emulator runs the matrices (every lane
holds the whole matrix, every call a rendezvous naming the same memory), so
the interpreter judges the generated MSL itself.
"""

from __future__ import annotations

import copy
import dataclasses
import re

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import metal
from tilenest.backends.metal.check import check_msl, clang_available
from tilenest.backends.simt.emulator import EmulatorError
from tilenest.errors import TilenestError
from tilenest.lowering import default_schedule, lower_verified, print_kernel
from tilenest.lowering import loopir as L
from tilenest.lowering.mma import SIMDGROUP_SIDES, warp_tile
from tilenest.proofs import barriers
from tilenest.semantics import expr as E
from tilenest.workloads import WORKLOADS

from gemm import gemm as example_gemm


def _gemm(dt, bm=32, bn=32, bk=16):  # type: ignore[no-untyped-def]
    return WORKLOADS["gemm"].kernel(dt, {"bm": bm, "bn": bn, "bk": bk, "loop": "pipeline"})


@tn.kernel
def abt(A: tn.Tensor[tn.f16, "M K"], B: tn.Tensor[tn.f16, "N K"],
        C: tn.Tensor[tn.f32, "M N"], *, bm=16, bn=16, bk=16):
    """C = A @ B^T with B stored [N, K]: the b operand is contiguous along
    the contraction, so its matrices load with the transpose flag."""
    M, K = A.shape
    N = B.shape[0]
    m, k = A.dims()
    n = C.dim(1)
    B = B.with_dims(n, k)
    C = C.with_dims(m, n)
    for nest in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
        i, j = nest.index(0), nest.index(1)
        acc = tn.zeros(tn.f32, tn.shape(bm, bn), dims=(m, n))
        for kk in nest.serial(tn.shape(tn.cdiv(K, bk))):
            a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
            b = B[tn.coord(j * bn, kk.index() * bk), tn.shape(bn, bk), tn.bounds.zero]
            acc = tn.mma(a, b, acc, allow_reassociation=True)
        C(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(acc)


def _mmas(kern, **sched):  # type: ignore[no-untyped-def]
    k = lower_verified(kern.program, default_schedule(kern.program, "metal", **sched))
    return k, [s for ph in k.phases for s in L.walk(ph.body) if isinstance(s, L.WarpMma)]


@pytest.mark.parametrize("dt,mat", [(tn.f16, "half"), (tn.f32, "float")])
def test_gemm_runs_on_simdgroup_matrices(dt, mat):
    kern = _gemm(dt)
    k, mmas = _mmas(kern)
    assert mmas and all(w.opaque and w.lane is not None for w in mmas)
    assert "mma on simdgroup matrices: 32x32x16" in print_kernel(k)
    # no per-thread multiply nest is left for the contraction
    assert not any(isinstance(x, L.Fma) for ph in k.phases for s in L.walk(ph.body)
                   for e in L.stmt_exprs(s) for x in L.subexprs(e))
    text = metal.emit(kern.program, "msl")
    assert f"simdgroup_matrix<{mat}, 8, 8>" in text
    assert "simdgroup_matrix<float, 8, 8>" in text  # the accumulators
    assert text.count("simdgroup_multiply_accumulate(") >= 1
    assert text.count("simdgroup_barrier(") >= 2
    if clang_available():
        check_msl(metal.standalone(text))
    rep = tn.validate(kern, "metal", cases=4, seed=3)
    assert rep.ok and rep.count("ok") == 4, rep


def test_a_transposed_operand_loads_with_the_transpose_flag():
    k, mmas = _mmas(abt)
    (w,) = mmas
    assert w.opaque and (w.b.si, w.b.sj) == (1, 16)
    text = metal.emit(abt.program, "msl")
    assert re.search(r"simdgroup_load\(\w+_b\[0\], .*, 16ul, ulong2\(0, 0\), true\);", text)
    if clang_available():
        check_msl(metal.standalone(text))
    rep = tn.validate(abt, "metal", cases=4, seed=5)
    assert rep.ok and rep.count("ok") == 4, rep


def test_bf16_stays_on_simt_and_names_msl_3_1():
    kern = _gemm(tn.bf16)
    k, mmas = _mmas(kern)
    assert not mmas and "MSL 3.1" in print_kernel(k)
    with pytest.raises(TilenestError, match="MSL 3.1") as e:
        _mmas(kern, mma_unit="tensor")
    assert "mma_unit" in (e.value.hint or "")


def test_refusals_name_the_reason():
    with pytest.raises(TilenestError, match="simdgroup_matrix, not wgmma"):
        _mmas(_gemm(tn.f16), mma_unit="wgmma")
    with pytest.raises(TilenestError, match="multiples of 8"):
        _mmas(_gemm(tn.f16, 12, 32, 16), mma_unit="tensor")
    # an in-order mma keeps the exact SIMT nest
    k, mmas = _mmas(example_gemm.specialize(reassoc=False))
    assert not mmas
    k, mmas = _mmas(example_gemm)
    assert mmas


@pytest.mark.parametrize("rows,cols,warps,want", [
    (32, 32, 8, (16, 8)), (64, 64, 8, (32, 16)), (16, 16, 8, (8, 8)), (32, 32, 2, (32, 16)),
    (8, 8, 4, (8, 8))])
def test_simdgroup_tiles(rows, cols, warps, want):
    assert warp_tile(rows, cols, warps, SIMDGROUP_SIDES) == want


def test_lane_zero_stands_for_the_simdgroup():
    """The analyses' view of an opaque tile: every lane may read all of
    ``a`` and ``b``; the accumulator is read and written by lane 0 alone,
    every element of it."""
    _, (w,) = _mmas(_gemm(tn.f16))
    foot = w.footprint()
    guarded = [s for s in foot if isinstance(s, L.If)]
    assert len(guarded) == 1 and len(foot) == 3
    assert guarded[0].cond == L.IPred(E.cmp("==", w.lane, E.Const(0)))
    stores = [s for s in L.walk(guarded[0].then) if isinstance(s, L.Store)]
    assert stores and all(s.buf.name == w.c.buf.name for s in stores)
    loops = [s for s in L.walk(guarded[0].then) if isinstance(s, L.For)]
    assert [E.to_str(lp.hi) for lp in loops] == [str(w.m), str(w.n)]


def test_the_barrier_proof_needs_the_barrier_after_the_tile():
    """Lane 0's accumulator writes conflict with the other threads' reads of
    the result: dropping the block barrier between them is refused."""
    kern = _gemm(tn.f16)
    k = lower_verified(kern.program, default_schedule(kern.program, "metal"))
    good = barriers.check_barriers(k)  # the lowering's own placement is proved
    assert not [o for o in good if o.status == "refuted"]
    assert any(o.status == "proved" and "%acc" in o.title for o in good)

    def drop_after_mma(body: tuple) -> tuple:
        out, after = [], False
        for s in body:
            if after and L.is_block_barrier(s):
                after = False
                continue
            if isinstance(s, L.For):
                s = dataclasses.replace(s, body=drop_after_mma(s.body))
            after = after or any(isinstance(t, L.WarpMma) for t in L.walk((s,)))
            out.append(s)
        return tuple(out)

    cut = dataclasses.replace(k, phases=tuple(dataclasses.replace(ph, body=drop_after_mma(
        ph.body)) for ph in k.phases))
    assert cut != k
    refuted = [o for o in barriers.check_barriers(cut) if o.status == "refuted"]
    assert any("%acc" in o.title for o in refuted), [o.title for o in refuted]


@pytest.fixture(scope="module")
def f16_gemm():
    kern = _gemm(tn.f16)
    ck = metal.compile_program(kern.program, None, device="emulated")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((40, 24)).astype(np.float16)
    b = rng.standard_normal((24, 36)).astype(np.float16)
    return kern, ck, (a, b)


def _admitted(kern, ck, ab) -> bool:  # type: ignore[no-untyped-def]
    a, b = ab
    c = np.zeros((a.shape[0], b.shape[1]), np.float16)
    ck(a, b, c)
    return tn.reference(kern, a, b, np.zeros_like(c)).admits(c)


def _mutant(ck, text: str):  # type: ignore[no-untyped-def]
    m = copy.copy(ck)
    m.source = dataclasses.replace(ck.source, text=text)
    m._emu = None
    return m


def test_mutated_matrix_calls_are_caught(f16_gemm):
    kern, ck, ab = f16_gemm
    assert _admitted(kern, ck, ab)
    text = ck.source.text
    # a b matrix read transposed
    load_b = re.search(r"(simdgroup_load\(\w+_b\[0\], [^;]*), (\d+)ul\);", text)
    assert load_b
    wrong = text.replace(load_b.group(0),
                         f"{load_b.group(1)}, {load_b.group(2)}ul, ulong2(0, 0), true);")
    assert not _admitted(kern, _mutant(ck, wrong), ab)
    # operands swapped in the product
    mac = re.search(r"simdgroup_multiply_accumulate\((\w+\[0\]\[0\]), (\w+\[0\]), (\w+\[0\]), ",
                    text)
    assert mac
    swapped = text.replace(mac.group(0), f"simdgroup_multiply_accumulate({mac.group(1)}, "
                                         f"{mac.group(3)}, {mac.group(2)}, ")
    assert not _admitted(kern, _mutant(ck, swapped), ab)
    # a lane-dependent address: the rendezvous names another memory per lane
    store = re.search(r"simdgroup_store\((\w+\[0\]\[0\]), (\w+) \+ \(", text)
    assert store
    lanes = text.replace(store.group(0), f"simdgroup_store({store.group(1)}, {store.group(2)} "
                                         "+ (tn_lane % 2) + (")
    with pytest.raises(EmulatorError, match="another address"):
        _admitted(kern, _mutant(ck, lanes), ab)
