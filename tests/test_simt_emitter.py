"""The SIMT emitter core (``backends/simt/emitter.py``): rule-table dispatch,
spelling from the dialect table, and NVIDIA's rules kept out of the core."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends.cuda.dialect import CUDA
from tilenest.backends.cuda.emit import emit_cuda
from tilenest.backends.cuda.rules import CudaEmitter
from tilenest.backends.simt.emitter import Emitter
from tilenest.errors import NotAvailableError
from tilenest.lowering import default_schedule, fragments, lower_verified
from tilenest.lowering import loopir as L
from tilenest.semantics import expr as E
from tilenest.workloads import WORKLOADS


def _lowered(name: str, sched: dict, **over):  # type: ignore[no-untyped-def]
    kern = WORKLOADS[name].kernel(tn.bf16, sched)
    return lower_verified(kern.program, default_schedule(kern.program, "cuda", **over))


def test_spelling_comes_from_the_dialect():
    """The same kernel in a dialect with other builtins and barrier words is
    the CUDA text with those words replaced, and none of CUDA's remain."""
    k = _lowered("softmax", {"rp": 1})
    other = replace(CUDA, name="toy", thread_id="tid()", block_id="bid()",
                    barriers={"block": "block_sync();", "warp": "lane_sync();"},
                    shuffle="toy_shuffle_{mode}({value}, {lane}, {width})",
                    kernel_head="kernel void {name}(", include='#include "toy.h"')
    cuda = Emitter(k, CUDA).source().text
    toy = Emitter(k, other).source().text
    for word in ("threadIdx.x", "blockIdx.x", "__syncthreads", "__global__", "tn_shfl_"):
        assert word in cuda and word not in toy
    assert "tid()" in toy and "block_sync();" in toy and "toy_shuffle_" in toy
    assert cuda == emit_cuda(k).text  # the core in CUDA's table is CUDA's text


def test_missing_rule_names_node_and_dialect():
    """A loop-IR node without a rule is refused with the node's class and
    the dialect's name."""

    @dataclass(frozen=True)
    class Mystery:
        pass

    k = _lowered("softmax", {"rp": 1})
    ph = k.phases[0]
    bad = replace(k, phases=(replace(ph, body=(*ph.body, Mystery())),))
    with pytest.raises(NotAvailableError, match="Mystery has no cuda lowering"):
        Emitter(bad, CUDA).source()


def test_tensor_cores_are_cuda_rules_only():
    """The core alone refuses a lanes' warp mma; the CUDA rules emit
    ``mma.sync`` fragments for it."""
    k = _lowered("gemm", {"bm": 64, "bn": 16, "bk": 32, "loop": "pipeline"}, mma_unit="tensor")
    with pytest.raises(NotAvailableError, match="warp mma has no cuda lowering"):
        Emitter(k, CUDA).source()
    assert "tn_mma_bf16(" in CudaEmitter(k).source().text
    assert CudaEmitter.STMT_RULES[L.WarpMma] != Emitter.STMT_RULES[L.WarpMma]


def test_warp_size_comes_from_the_dialect():
    """The warpgroup accumulator's row of a lane divides by the dialect's
    lane width (32 on CUDA: ``>> 5`` and ``& 31``)."""

    def text(ws: int) -> str:
        em = CudaEmitter(k)
        em.d = replace(CUDA, warp_size=ws)
        return em.source().text

    old = fragments.MAX_CELLS
    fragments.MAX_CELLS = 0  # the accumulator in shared memory: copied per lane
    try:
        k = _lowered("gemm", {"bm": 128, "bn": 128, "bk": 64, "loop": "pipeline"},
                     mma_unit="wgmma", stages=3)
    finally:
        fragments.MAX_CELLS = old
    assert "_l >> 5) + ((" in text(32) and "& 31) >> 2)" in text(32)
    assert "_l >> 4) + ((" in text(16) and "& 15) >> 2)" in text(16)


@tn.kernel
def same_names(S: tn.Tensor[tn.f32, "T S"], T: tn.Tensor[tn.f32, "T S"]):
    """Tensors named like their dims: ``S`` of shape ``T x S`` and the
    reverse (the identifiers of the size symbols and of the tensors must
    not collide)."""
    nt, ns = S.shape
    for p in tn.parallel(tn.shape(nt)):
        row = S[tn.coord(p.index(), 0), tn.shape(1, ns)]
        T(tn.coord(p.index(), 0), tn.shape(1, ns)).store(row * 2.0 + tn.cast(ns, tn.f32))


@pytest.mark.parametrize("target", ["cuda", "metal", "llvm"])
def test_tensors_named_like_their_dims(target):
    x = np.arange(35, dtype=np.float32).reshape(5, 7)
    rep = tn.validate(same_names, target, inputs=[x, np.zeros_like(x)])
    assert rep.ok and rep.count("ok") == 1, rep


def test_a_register_nest_of_exponentials_shares_one_common_case_flag():
    """Attention's probabilities, ``exp`` over the cells of a register tile:
    the unrolled nest runs every cell's common case with one flag and runs
    again whole only when some input left it (no branch per cell, so the
    cells' arithmetic interleaves). A body that reads a register array it
    writes could not run twice from the same state, so it is not guarded.
    The emulated kernel validates with masked (``-inf``) scores, which take
    the whole run. (The kernel here keeps natural units and
    ``exp``'s own bound; with a declared one the cuda row computes it
    approximately, with no common case: tests/test_approx_exp.py.)"""
    from tilenest.backends.simt import analysis as A
    from tilenest.backends import cuda
    from tilenest.workloads.attention import flash_kernel
    from test_fragment_rows import _admitted
    from test_tensor_mma_dims import _attention_inputs

    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=32, dh=32, dv=32, causal=True,
                                            exp_ulp=1.0, log2=False)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda", block_threads=128))
    text = emit_cuda(k).text
    flags = [ln for ln in text.splitlines() if "every call of the nest inside" in ln]
    assert len(flags) == 1
    ok = flags[0].split()[1]
    nest = text.split(flags[0])[1].split(f"if (!{ok})")[0]
    assert nest.count("tn_exp_f32_ok(") == 1 and "tn_exp_f32(" not in nest
    assert "pr_" in nest  # the probabilities' register tile
    acc = L.Buffer("acc", tn.f32, "local", E.Const(4))
    x = L.Buffer("x", tn.f32, "local", E.Const(4))
    at = L.IExpr(E.Const(0))
    fresh = (L.Store(acc, at, L.Un("exp", L.Load(x, at), tn.f32)),)
    again = (L.Store(acc, at, L.Un("exp", L.Load(acc, at), tn.f32)),)
    assert A.carried_locals(fresh) == [] and A.carried_locals(again) is None
    whole = text.split(f"if (!{ok})")[1]
    assert "tn_exp_f32(" in whole.split("tn_exp_f32_ok")[0]
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda",
                                                             block_threads=128),
                              device="emulated")
    q, kk, v, o0, sc = _attention_inputs(tn.bf16, HQ=2, HK=1, Q=77, K=90, D=30)
    _admitted(ck, kern, (q, kk, v), (o0,), (sc,), seed=6)


def test_scalar_arguments_are_read_once_and_decided_guards_are_not_emitted():
    """A scalar argument is read into a register at the phase's start and
    every use reads that register (the compiler may then share ``s * scale``
    between the row maximum and the exponentials; the kernel here scales it
    by log2e once per program); a guard the enclosing
    loops' ranges decide (a warpgroup tile's ``r + t // 128 < 1`` on 128
    threads) is replaced by its branch, while guards that depend on the
    sizes stay."""
    from tilenest.workloads.attention import flash_kernel

    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=64, dh=64, dv=64, causal=True)
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda"))
    text = emit_cuda(k).text
    assert text.count("b_scale[") == 1  # the one read (the parameter is a pointer)
    assert "const float tn_arg_scale = b_scale[0" in text and "(tn_arg_scale * " in text
    assert "true in every iteration: $r.t" in text
    assert not [ln for ln in text.splitlines() if ln.strip().startswith("if (")
                and "128" in ln and "< 1" in ln]
    assert [ln for ln in text.splitlines() if ln.strip().startswith("if (") and "S_Q" in ln]
    guards = [s for ph in k.phases for s in L.walk(ph.body) if isinstance(s, L.If)]
    assert any("// 128 < 1" in E.pred_to_str(g.cond.p) for g in guards
               if isinstance(g.cond, L.IPred))
