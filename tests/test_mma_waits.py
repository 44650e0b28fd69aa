"""Warpgroup mmas complete where their results are first needed
(``lowering/mma_waits.py``): attention issuing the next key block's
``Q K^T`` before its own softmax (``flash_kernel(prefetch=True)``) keeps that
product running through the softmax, one ``wgmma.wait_group 1`` before its
scores are first read; the analysis that places the waits refuses a kernel
in which a wait is missing or too lax."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.errors import CaptureError, VerifyError
from tilenest.lowering import default_schedule, lower_verified, verify_kernel
from tilenest.lowering import loopir as L
from tilenest.workloads.attention import flash_kernel

from test_fragment_rows import _admitted
from test_tensor_mma_dims import _attention_inputs


def _flash(prefetch, causal=True, split=False, d=64, defer_pv=False):  # type: ignore[no-untyped-def]
    return flash_kernel(tn.bf16).specialize(bq=64, bk=64, dh=d, dv=d, causal=causal,
                                            split=split, prefetch=prefetch, defer_pv=defer_pv)


def _sched(kern):  # type: ignore[no-untyped-def]
    return default_schedule(kern.program, "cuda", block_threads=128)


def _loop(k: L.Kernel) -> L.For:
    """The key loop of a one-loop attention kernel."""
    (loop,) = [s for s in k.phases[0].body if isinstance(s, L.For) and s.kind == "serial"]
    return loop


def _mmas(body: tuple) -> list[tuple[int, L.WarpMma]]:
    """``(position, mma)`` of the top-level statements of ``body`` holding one."""
    return [(i, m) for i, s in enumerate(body) for m in L.walk((s,))
            if isinstance(m, L.WarpMma)]


def _same_bits_as_plain(pair):  # type: ignore[no-untyped-def]
    """Ragged GQA (more keys than queries, a cut last key block) on the
    emulator: of ``pair``, two ``(kernel, schedule)``, the second is
    admitted by its oracle, in order and under random interleavings, and
    computes the same bits as the first (the kernel waiting at each
    product, on block barriers)."""
    q, kk, v, o0, sc = _attention_inputs(tn.bf16, HQ=2, HK=1, Q=77, K=150, D=50)
    outs = []
    for i, (kern, sched) in enumerate(pair):
        ck = cuda.compile_program(kern.program, sched, device="emulated")
        if i:
            _admitted(ck, kern, (q, kk, v), (o0,), (sc,), seed=3)
        o = o0.copy()
        ck(q, kk, v, o, sc, policy="in_order", poison="nan", seed=3)
        outs.append(o)
    assert np.array_equal(outs[0].view(np.uint16), outs[1].view(np.uint16))


def _on_gpu(kern, sched):  # type: ignore[no-untyped-def]
    """The benchmark's tiles (64 x 64, D = 128), ragged GQA, on a CUDA GPU."""
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")
    ck = cuda.compile_program(kern.program, sched, device="gpu")
    q, k, v, o0, sc = _attention_inputs(tn.bf16, B=2, Q=130, K=200, D=128)
    _admitted(ck, kern, (q, k, v), (o0,), (sc,), emulated=False)
    return ck


def test_the_next_scores_run_on_through_the_softmax():
    """In the key loop the ahead product (``Q K[j+1]^T``) and ``P V`` are
    issued without waiting; the one wait of the step comes after ``P V``,
    keeping it (``keep = 1``), right before the statement that first reads
    the ahead scores (their copy into the next step's scores). Without the
    pass each product is waited for where it is issued."""
    k = lower_verified(_flash(True).program, _sched(_flash(True)))
    body = _loop(k).body
    (i_s, ahead), (i_pv, pv) = _mmas(body)
    assert ahead.overlap and pv.overlap and i_s < i_pv
    waits = [(i, s.keep) for i, s in enumerate(body) if isinstance(s, L.MmaWait)]
    assert waits == [(i_pv + 1, 1)], waits
    first_read = next(i for i, s in enumerate(body) if i > i_s and any(
        isinstance(y, L.Load) and y.buf.name == ahead.c.buf.name
        for y in L.evaluated((s,))))
    assert first_read == i_pv + 2
    # the statements between the ahead product and its wait: the softmax
    assert any(isinstance(y, L.Un) and y.op == "exp2" for y in L.evaluated(body[i_s + 1:i_pv]))
    src = cuda.compile_program(_flash(True).program, _sched(_flash(True)),
                               device="emulated").source.text
    assert "tn_wgmma_wait<1>();" in src


def _without(k: L.Kernel, drop) -> L.Kernel:  # type: ignore[no-untyped-def]
    """``k`` with every ``MmaWait`` for which ``drop(w)`` holds replaced by
    ``drop(w)`` (None: removed)."""
    def fs(s):  # type: ignore[no-untyped-def]
        if isinstance(s, L.MmaWait):
            got = drop(s)
            return () if got is None else (got,)
        return None

    return replace(k, phases=tuple(replace(ph, body=L.map_stmts(ph.body, lambda x: None, fs))
                                   for ph in k.phases))


@pytest.mark.parametrize("mutation", ["missing", "too lax"])
def test_a_missing_or_too_lax_wait_is_refused(mutation):
    """Removing the key loop's wait, or letting it keep two groups in flight
    (the ahead product would still be pending when its scores are copied),
    fails verification naming the product."""
    kern = _flash(True)
    k = lower_verified(kern.program, _sched(kern))
    verify_kernel(k)
    bad = _without(k, (lambda w: None) if mutation == "missing" else
                   (lambda w: L.MmaWait(w.keep + 1)))
    with pytest.raises(VerifyError, match="overlapped warpgroup mma"):
        verify_kernel(bad)


def test_a_phase_ending_with_a_pending_mma_is_refused():
    """The phase cut after its key loop (the barrier that completes the last
    ``P V`` dropped): the threads would leave with it pending."""
    kern = _flash(True)
    k = lower_verified(kern.program, _sched(kern))
    body = k.phases[0].body
    last = max(i for i, s in enumerate(body) if isinstance(s, L.For) and s.kind == "serial")
    cut = replace(k, phases=(replace(k.phases[0], body=body[:last + 1]),) + k.phases[1:])
    with pytest.raises(VerifyError, match="not complete"):
        verify_kernel(cut)


#: the default run takes causal with split spans (a masked and an unmasked
#: key loop); -m slow adds one masked loop and the non-causal kernel
SPANS = [pytest.param(True, False, marks=pytest.mark.slow), (True, True),
         pytest.param(False, False, marks=pytest.mark.slow)]


@pytest.mark.parametrize("causal,split", SPANS)
def test_prefetched_scores_validate_emulated_and_match_bit_for_bit(causal, split):
    """The emulator's warpgroup mmas run only when a wait retires them
    (reading their operands then): the prefetching kernel is admitted and
    computes the same bits as the kernel waiting at each product."""
    plain, ahead = _flash(False, causal, split), _flash(True, causal, split)
    _same_bits_as_plain([(plain, _sched(plain)), (ahead, _sched(ahead))])


@pytest.mark.device
@pytest.mark.parametrize("causal,split", [(True, False), (True, True), (False, False)])
def test_prefetched_scores_validate_on_gpu(causal, split):
    kern = _flash(True, causal, split, d=128)
    _on_gpu(kern, default_schedule(kern.program, "cuda"))


def test_the_previous_blocks_pv_runs_through_this_blocks_softmax():
    """``defer_pv``: in the key loop ``Q K^T`` and the previous block's ``P
    V`` are issued back to back; the scores are waited for keeping ``P V``
    in flight (``keep = 1``) and ``P V`` only before the accumulator is
    rescaled, after the exponentials. ``P`` and the accumulator stay in
    registers (``P V`` takes ``P`` from them, in the loop and after it)."""
    kern = _flash(False, defer_pv=True)
    k = lower_verified(kern.program, _sched(kern))
    body = _loop(k).body
    (i_s, s_mma), (i_pv, pv) = _mmas(body)
    assert s_mma.overlap and pv.overlap and i_s < i_pv
    waits = [(i, s.keep) for i, s in enumerate(body) if isinstance(s, L.MmaWait)]
    assert [w[1] for w in waits] == [1, 0], waits
    (i_w1, _), (i_w0, _) = waits
    assert i_pv < i_w1 < i_w0
    assert any(isinstance(y, L.Un) and y.op == "exp2" for y in L.evaluated(body[i_w1:i_w0]))
    pvs = [m for ph in k.phases for m in L.walk(ph.body)
           if isinstance(m, L.WarpMma) and m.c.buf.name == pv.c.buf.name]
    assert len(pvs) == 2 and all(m.a.lane_cols and m.c.lane_cols for m in pvs)
    src = cuda.compile_program(kern.program, _sched(kern), device="emulated").source.text
    assert "tn_wgmma_wait<1>();" in src and "tn_wgmma_bf16_n64_ra" in src


@pytest.mark.parametrize("causal,split", SPANS)
def test_deferred_pv_validates_emulated_and_matches_bit_for_bit(causal, split):
    """The kernel issuing each block's ``P V`` one step late (the value block
    ``-1`` of the first step all zeros, the last product after the loop) is
    admitted by its oracle and computes the same bits as the kernel issuing
    ``P V`` in its own step."""
    plain, late = _flash(False, causal, split), _flash(False, causal, split, defer_pv=True)
    _same_bits_as_plain([(plain, _sched(plain)), (late, _sched(late))])


@pytest.mark.device
@pytest.mark.parametrize("causal,split", [(True, False), (True, True), (False, False)])
def test_deferred_pv_validates_on_gpu(causal, split):
    kern = _flash(False, causal, split, d=128, defer_pv=True)
    _on_gpu(kern, default_schedule(kern.program, "cuda"))


def test_prefetch_and_defer_pv_together_are_refused_by_name():
    """The two ways of overlapping a product with the softmax exclude each
    other; asking for both says so at the kernel's line (it used to fail on
    an undefined name inside the kernel)."""
    with pytest.raises(CaptureError, match="prefetch and defer_pv") as e:
        _ = _flash(True, defer_pv=True).program
    assert "attention.py" in str(e.value)


def _roles_sched(kern):  # type: ignore[no-untyped-def]
    return default_schedule(kern.program, "cuda", block_threads=128, stages=2, warp_roles=True)


@pytest.mark.parametrize("causal,split,defer", [
    pytest.param(True, False, False, marks=pytest.mark.slow), (True, True, False),
    (False, False, True)])
def test_warp_specialized_attention_validates_emulated(causal, split, defer):
    """``warp_roles=True, stages=2``: a producer warp copies the key and
    value tiles on completion barriers while the consumer warpgroup runs its
    softmax between its mmas (waited for within the step, each step's slot
    released after them); admitted by its oracle, and the same bits as the
    kernel on block barriers."""
    kern = _flash(False, causal, split, defer_pv=defer)
    roles = _roles_sched(kern)
    assert "warp-specialized ring" in cuda.compile_program(
        kern.program, roles, device="emulated").source.text
    _same_bits_as_plain([(kern, _sched(kern)), (kern, roles)])


@pytest.mark.device
@pytest.mark.parametrize("causal,split,defer", [(True, True, False), (False, False, True)])
def test_warp_specialized_attention_on_gpu(causal, split, defer):
    """A consumer warpgroup and a producer warp."""
    kern = _flash(False, causal, split, d=128, defer_pv=defer)
    ck = _on_gpu(kern, _roles_sched(kern))
    assert "warp-specialized ring" in ck.source.text
