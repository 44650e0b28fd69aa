"""32-bit index arithmetic on cuda (``Schedule.index_bits``, the
``index.width`` obligation of ``proofs/gpu.py``): the generated code does its
index arithmetic in ``int`` where every index value is bounded by the loop
ranges, each call's sizes are checked against the bound, and a call that
breaks it runs the kernel's 64-bit variant."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import bf16, f32
from tilenest.backends import cuda
from tilenest.lowering import default_schedule
from tilenest.proofs import gpu
from tilenest.proofs.obligation import PROVED, UNKNOWN


@tn.kernel
def axpb(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(tn.cdiv(n, 64))):
        o = tn.coord(p.index() * 64)
        t = x[o, tn.shape(64), tn.bounds.zero]
        y(o, tn.shape(64)).store(t * 3.0 + 1.0)


@tn.kernel
def axpb_fixed(x: tn.Tensor[f32, "1000"], y: tn.Tensor[f32, "1000"]):
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(16)):
        o = tn.coord(p.index() * 64)
        t = x[o, tn.shape(64), tn.bounds.zero]
        y(o, tn.shape(64)).store(t * 3.0 + 1.0)


def _gemm(dt=bf16, tile=64):
    from tilenest.workloads import WORKLOADS

    return WORKLOADS["gemm"].kernel(dt, {"bm": tile, "bn": tile, "bk": 32, "loop": "pipeline"})


def test_gemm_index_arithmetic_is_32_bit_and_checked_per_call():
    k = _gemm()
    ck = cuda.compile_program(k.program, device="emulated", cache=False)
    text = ck.source.text
    assert ck.source.index_bits == 32
    assert "const int S_K = (int)S_K_w;" in text and "long long S_K_w" in text
    assert "long long v_" not in text and "ll)" not in text
    ob = [o for o in ck.obligations if o.kind == gpu.INDEX]
    assert len(ob) == 1 and ob[0].status == UNKNOWN and ob[0].role == "evidence"
    fits = ck.index_fits
    assert fits({"M": 4096, "K": 4096, "N": 4096}) and fits({"M": 32768, "K": 32768, "N": 64})
    # A is M x K: its last element's offset passes 2**31 - 2**20 here
    assert not fits({"M": 46341, "K": 46341, "N": 64})
    assert not fits({"M": 64, "K": 64, "N": 2**31})
    rng = np.random.default_rng(1)
    a = rng.standard_normal((70, 96)).astype(bf16.np)
    b = rng.standard_normal((96, 40)).astype(bf16.np)
    oracle = tn.reference(k, a, b, np.zeros((70, 40), bf16.np))
    c = np.zeros((70, 40), bf16.np)
    ck(a, b, c)
    assert oracle.admits(c).ok


def test_interval_bounds_follow_the_program_id_decomposition():
    """``p0 = pid // nN`` with ``pid < nM nN`` is below ``nM``: the bound of
    ``p0 * 128 * K`` is about ``M K``, not ``M N K`` (a bound over the symbols
    alone would refuse 32 bits at 4096^3)."""
    k = _gemm(tile=128)
    _, src = cuda.stage_source(k.program, default_schedule(k.program, "cuda", stages=3))
    pc = src.index.witness["precondition"]
    assert pc.holds({"M": 4096, "K": 4096, "N": 4096})
    assert pc.holds({"M": 8192, "K": 8192, "N": 8192})
    assert not pc.holds({"M": 65536, "K": 65536, "N": 128})


def test_a_call_the_bound_excludes_runs_the_64_bit_variant(monkeypatch):
    monkeypatch.setattr(gpu, "INDEX_LIMIT", 5000)
    ck = cuda.compile_program(axpb.program, device="emulated", cache=False)
    assert ck.source.index_bits == 32
    used = []
    real = type(ck).variant

    def spy(self, aliases, strided=(), index_bits=None, tma=None):
        v = real(self, aliases, strided, index_bits, tma)
        used.append(v.source.index_bits)
        return v

    monkeypatch.setattr(type(ck), "variant", spy)
    for n, want in ((1000, []), (7000, [64])):
        x = np.arange(n, dtype=np.float32)
        y = np.zeros(n, np.float32)
        ck(x, y)
        assert np.array_equal(y, x * 3 + 1)
        assert used == want
    assert "long long" in ck.variant((), (), 64).source.text.split("{", 1)[1]


def test_sizes_known_at_compile_time_are_proved_or_kept_64_bit(monkeypatch):
    ck = cuda.compile_program(axpb_fixed.program, device="emulated", cache=False)
    assert ck.source.index_bits == 32 and ck.index_precondition is None
    assert [o.status for o in ck.obligations if o.kind == gpu.INDEX] == [PROVED]
    monkeypatch.setattr(gpu, "INDEX_LIMIT", 100)
    _, src = cuda.stage_source(axpb_fixed.program, default_schedule(axpb_fixed.program, "cuda"))
    assert src.index_bits == 64 and "exceeds" in src.index


def test_data_dependent_indices_keep_64_bit_code():
    from kernels_constructs import embedding

    _, src = cuda.stage_source(embedding.program, default_schedule(embedding.program, "cuda"))
    assert src.index_bits == 64 and "depends on data" in src.index


def test_index_bits_is_validated():
    from tilenest.errors import UsageError

    with pytest.raises(UsageError, match="index_bits=48"):
        cuda.stage_source(axpb.program, default_schedule(axpb.program, "cuda", index_bits=48))
    _, src = cuda.stage_source(axpb.program, default_schedule(axpb.program, "cuda",
                                                               index_bits=64))
    assert src.index_bits == 64 and src.index is None


def test_expr_interval_bounds_signed_products_pinned_divisors_and_partial_sums():
    from tilenest.semantics import expr as E

    i, n = E.Var("i"), E.Sym("N")
    ranges = {i: (-3, 5), n: (7, 7)}
    assert E.interval(E.mul(i, E.Var("j")), {**ranges, E.Var("j"): (-2, 4)}) == (-12, 20)
    # a divisor pinned to one positive value bounds the quotient and remainder
    assert E.interval(E.floordiv(E.add(i, 20), n), ranges) == (2, 3)
    assert E.interval(E.mod(E.add(i, 3), n), ranges) == (0, 7 - 1)
    assert E.interval(E.mod(E.add(i, 3), 9), ranges) == (0, 8)  # within [0, 9): itself
    assert E.interval(E.floordiv(i, E.Var("j")), {**ranges, E.Var("j"): (1, 2)}) == (None, None)
    seen = []
    E.interval(E.add(E.add(E.mul(1000, i), E.mul(-1000, E.Var("k"))), 1), {**ranges,
               E.Var("k"): (0, 1)}, seen.append)
    assert (-4000, 5000) in seen  # the partial sum 1000 i - 1000 k, before the + 1


def test_narrowed_replaces_the_divisions_the_ranges_decide():
    """``expr.narrowed``: a floor division or modulo by a positive constant
    whose dividend stays within one multiple of it over the ranges becomes
    that multiple's index and the offset within it; anything else stays,
    and the value is the same at every point of the ranges."""
    from tilenest.semantics import expr as E

    t, r, j = E.Var("t"), E.Var("r"), E.Var("j")
    ranges = {t: (0, 127), r: (0, 0), j: (256, 383)}
    assert E.narrowed(E.add(r, E.floordiv(t, 128)), ranges) == r
    assert E.narrowed(E.mod(t, 128), ranges) == t
    assert E.narrowed(E.floordiv(j, 128), ranges) == E.Const(2)
    assert E.narrowed(E.mod(j, 128), ranges) == E.add(j, -256)
    # a dividend that crosses a multiple, or an unbounded one, keeps its division
    kept = (E.floordiv(t, 64), E.mod(E.add(t, 1), 128), E.floordiv(E.Var("u"), 128),
            E.mod(t, E.Sym("N")))
    for x in kept:
        assert E.narrowed(x, ranges) == x
    # nested: the inner modulo goes, the outer division it fed follows
    x = E.add(E.mul(16, E.floordiv(E.mod(t, 128), 32)), E.floordiv(E.mod(j, 128), 4))
    y = E.narrowed(x, ranges)
    for tv in range(0, 128, 7):
        for jv in range(256, 384, 5):
            env = {t: tv, r: 0, j: jv}
            assert E.evaluate(y, env) == E.evaluate(x, env)


def test_a_warpgroup_tile_index_takes_no_division_its_ranges_decide():
    """On a block of one warpgroup (128 threads) a warpgroup tile's index
    ``r + t // 128`` is ``r``, and a lane's ``t % 128`` is ``t``: the emitted
    code computes neither division (fewer registers and instructions)."""
    from tilenest.workloads.attention import flash_kernel

    kern = flash_kernel(tn.bf16).specialize(bq=64, bk=64, dh=64, dv=64, causal=True)
    text = cuda.stage_source(kern.program, default_schedule(kern.program, "cuda"))[1].text
    assert "/ 128u" not in text and "% 128u" not in text


def test_a_loop_bound_by_the_least_of_two_index_values_keeps_32_bit_code():
    """Causal attention's key loop runs to ``minimum(K, (qb + 1) bq + K -
    Q)``: the least of two index expressions is one, so its trip count stays
    index arithmetic the width proof bounds (held in a local as a data value
    it made the whole kernel 64-bit)."""
    from tilenest.workloads.attention import flash_kernel

    kern = flash_kernel(bf16).specialize(bq=32, bk=32, dh=32, dv=32, causal=True)
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda"),
                              device="emulated", cache=False)
    assert ck.source.index_bits == 32, ck.source.index
    assert "long long v_" not in ck.source.text
    assert "tn_imin" in ck.source.text or "min(" in ck.source.text
    assert ck.index_fits({"B": 4, "HQ": 16, "Q": 2048, "D": 32, "HK": 4, "K": 2048, "DV": 32})
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, n, 32)).astype(bf16.np) for n in (70, 45, 45))
    o = np.zeros((1, 2, 70, 32), bf16.np)
    rep = tn.validate(kern, "cuda", inputs=[q, k, v, o, np.float32(0.125)], compiled=ck)
    assert rep.ok and rep.count("ok") == 1, rep.summary()


def test_index_sums_and_literals_stay_index_arithmetic():
    """The split causal key loops (``flash_attention`` with ``split=True``)
    count ``maximum(0, minimum(K // bk, ...))`` whole blocks, then the
    difference to the causal bound, and address key block ``whole + kb``:
    an i64 literal, a sum, a difference and a product of index expressions
    are index expressions, so the kernel keeps 32-bit code (each of them
    held in a local as a data value made it 64-bit)."""
    from types import SimpleNamespace

    from tilenest.lowering import loopir as L
    from tilenest.lowering import values as V
    from tilenest.semantics import expr as E
    from tilenest.workloads.attention import flash_kernel

    def _scalar(name):  # type: ignore[no-untyped-def]  # an i64 op as scalar_op reads it
        return SimpleNamespace(name=name, attrs={},
                               results=(SimpleNamespace(type=SimpleNamespace(dtype=L.INDEX)),))

    kern = flash_kernel(bf16).specialize(bq=32, bk=32, dh=32, dv=32, causal=True, split=True)
    ck = cuda.compile_program(kern.program, default_schedule(kern.program, "cuda"),
                              device="emulated", cache=False)
    assert ck.source.index_bits == 32, ck.source.index
    assert "long long v_" not in ck.source.text
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((1, 2, n, 32)).astype(bf16.np) for n in (70, 100, 100))
    o = np.zeros((1, 2, 70, 32), bf16.np)
    rep = tn.validate(kern, "cuda", inputs=[q, k, v, o, np.float32(0.125)], compiled=ck)
    assert rep.ok and rep.count("ok") == 1, rep.summary()
    # the rule itself: i64 operands that are index expressions or literals
    x = E.Sym("K")
    for name, want in (("maximum", E.maximum(0, x)), ("sub", E.add(E.Const(0), -1 * x)),
                       ("mul", E.mul(0, x)), ("add", E.add(0, x))):
        got = V.scalar_op(_scalar(name), [L.Const(0, L.INDEX), L.IExpr(x)], frozenset())
        assert got == L.IExpr(want), (name, got)
    # a float or a data operand keeps its arithmetic
    assert isinstance(V.scalar_op(_scalar("add"), [L.Const(0, L.INDEX),
                                                    L.Ref(L.LVar("d", L.INDEX))],
                                  frozenset()), L.Bin)
