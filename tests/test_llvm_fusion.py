"""Fusion of consecutive vector loops (``backends/llvm/fusion.py``) and the
vector accumulators it relies on (``backends/llvm/vector.py``).

A row kernel's map loop and the reduction of its result become one loop
when that keeps the order of every conflicting access; the fused loop's
reductions run lane-wise in a vector accumulator. Checked: which loops fuse
and which must not (a shifted read, a local passed between the loops,
aliased parameters), that the fused kernels agree with the reference
bit for bit where the contract is exact and within it where it is not, the
accumulators' identities on NaN, infinities and signed zeros, and that
softmax's exponentials are computed and summed in one vector step."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.backends.llvm import compile_program, fusion, stage_loopir, stage_serial
from tilenest.bench.kernels import kernels
from tilenest.lowering import default_schedule
from tilenest.lowering import loopir as L
from tilenest.semantics import expr as E



def _fused(kernel, bits: int = 512, aliases: frozenset = frozenset()) -> L.Kernel:
    prog = kernel.program
    k = stage_serial(stage_loopir(prog, default_schedule(prog, "llvm")))
    return fusion.fuse_kernel(k, bits, aliases)


def _vector_loops(k: L.Kernel) -> list[L.For]:
    return [s for ph in k.phases for s in L.walk(ph.body)
            if isinstance(s, L.For) and s.kind == "vector"]


def _row_loops(k: L.Kernel) -> list[L.For]:
    """The vector loops over a whole row (``[0, C)``)."""
    return [s for s in _vector_loops(k) if s.hi == E.Sym("C")]


def test_softmax_and_layernorm_lose_a_pass_over_the_row():
    """softmax: max, exp, sum, divide -> max, exp + sum, divide; LayerNorm
    with its centred row ``d`` kept in a buffer: sum, d, sum of squares,
    scale -> sum, d + sum of squares, scale. The fused loop stores the row's
    values and accumulates them. (By default the CPU recomputes ``d`` at its
    two uses, the storage plan's choice: LayerNorm then has the three passes
    without fusing.)"""
    ks = kernels()
    for name, storage, before, after in (("softmax", (), 4, 3),
                                         ("layernorm", (("d", "materialize"),), 4, 3),
                                         ("layernorm", (), 3, 3)):
        prog = ks[name].program
        s = default_schedule(prog, "llvm").with_(storage=storage)
        plain = stage_serial(stage_loopir(prog, s))
        fused_k = fusion.fuse_kernel(plain, 512)
        assert len(_row_loops(fused_k)) == after, name
        assert len([s for ph in plain.phases for s in L.walk(ph.body)
                    if isinstance(s, L.For) and s.kind == "vector"
                    and s.hi == E.Sym("C")]) == before, name
        fused = [lp for lp in _row_loops(fused_k)
                 if any(isinstance(s, L.Assign) for s in lp.body)
                 and any(isinstance(s, L.Store) for s in lp.body)]
        assert len(fused) == (1 if before > after else 0), name


def test_the_fused_softmax_step_computes_and_sums_the_exponentials():
    """In the generated LLVM IR, one basic block (a vector step) calls the
    lane-wise ``exp`` and updates the sum's vector accumulator; without the
    fusion no step holds both (the sum is a loop of its own, without
    accumulator lanes)."""
    import re

    prog = kernels()["softmax"].program
    s = default_schedule(prog, "llvm", vector_bits=512)

    def fused_steps(ir_text: str) -> list[str]:
        blocks = re.split(r"\n(?=[\w.\"-]+:)", ir_text)
        return [bl for bl in blocks if 'call <16 x float> @"tn.exp.v16f32"' in bl
                and re.search(r'store <16 x float> [^\n]*%"acc_s[\w.]*\.lanes16"', bl)]

    assert len(fused_steps(compile_program(prog, s, cache=False).llvm_ir)) == 1
    k = stage_serial(stage_loopir(prog, s))
    from tilenest.backends.llvm.codegen import Codegen

    assert not fused_steps(Codegen(k, 512).text())


def _exp_then_sum(shift: int) -> L.Kernel:
    """``t[i] = exp(a[i])`` over ``[0, N)``, then ``acc += t[i + shift]``
    over ``[0, N)``, then ``b[0] = acc``."""
    i, j = L.LVar("i", L.INDEX), L.LVar("j", L.INDEX)
    a = L.Buffer("a", f32, "global", E.Sym("N"), 0)
    b = L.Buffer("b", f32, "global", E.Const(1), 1)
    t = L.Buffer("t", f32, "local", E.add(E.Sym("N"), 1))
    acc = L.LVar("acc", f32)
    body = (
        L.For(i, E.Const(0), E.Sym("N"), (L.Store(t, L.IExpr(E.Var("i")), L.Un(
            "exp", L.Load(a, L.IExpr(E.Var("i"))), f32)),), "vector"),
        L.Assign(acc, L.Const(-0.0, f32)),
        L.For(j, E.Const(0), E.Sym("N"), (L.Assign(acc, L.Bin(
            "add", L.Ref(acc), L.Load(t, L.IExpr(E.add(E.Var("j"), shift))), f32,
            ("reassoc",))),), "vector"),
        L.Store(b, L.IExpr(E.Const(0)), L.Ref(acc)),
    )
    params = (L.Param("a", "tensor", f32, (E.Sym("N"),)), L.Param("b", "tensor", f32, (1,)))
    ph = L.Phase("p", (E.Const(1),), L.LVar("pid", L.INDEX), body)
    return L.Kernel("k", params, ("N",), (t,), (ph,), globals=(a, b))


def test_a_read_at_another_index_is_not_fused():
    """The sum reading the exponentials one element ahead keeps its own
    loop (fused, iteration ``i`` would read ``t[i + 1]`` before it is
    written); at the same element the loops fuse, the accumulator's first
    value moved before them."""
    assert len(_vector_loops(fusion.fuse_kernel(_exp_then_sum(1), 512))) == 2
    k = fusion.fuse_kernel(_exp_then_sum(0), 512)
    (lp,) = _vector_loops(k)
    assert [type(s) for s in lp.body] == [L.Store, L.Assign]
    assert isinstance(k.phases[0].body[0], L.Assign)  # acc = -0.0, hoisted


def test_fusable_refuses_conflicts():
    """The legality rule on its own: same-index accesses fuse; a shifted
    index, a local passed between, or two aliased buffers do not."""
    i = L.LVar("i", L.INDEX)
    x = E.Var("i")
    a = L.Buffer("a", f32, "global", E.Sym("N"), 0)
    b = L.Buffer("b", f32, "global", E.Sym("N"), 1)
    t = L.Buffer("t", f32, "local", E.Sym("N"))
    acc, tmp = L.LVar("acc", f32), L.LVar("tmp", f32)
    write_t = (L.Store(t, L.IExpr(x), L.Un("exp", L.Load(a, L.IExpr(x)), f32)),)

    def sum_of(buf, at):  # acc += buf[at]
        return (L.Assign(acc, L.Bin("add", L.Ref(acc), L.Load(buf, L.IExpr(at)), f32,
                                    ("reassoc",))),)

    never = lambda p, q: p == q  # noqa: E731
    always = lambda p, q: True  # noqa: E731
    assert fusion.fusable(i, write_t, sum_of(t, x), never)
    assert not fusion.fusable(i, write_t, sum_of(t, E.add(x, 1)), never)
    assert not fusion.fusable(i, write_t, sum_of(t, E.Const(0)), never)  # not injective
    passes = (L.Assign(tmp, L.Load(a, L.IExpr(x))),)
    assert not fusion.fusable(i, passes, (L.Store(b, L.IExpr(x), L.Ref(tmp)),), never)
    # a store into b and a read of a: fine unless a and b may be one array
    copy = (L.Store(b, L.IExpr(x), L.Load(a, L.IExpr(x))),)
    assert fusion.fusable(i, write_t, copy, never)
    assert not fusion.fusable(i, copy, sum_of(a, E.add(x, 1)), always)


def test_aliased_parameters_keep_their_loops_apart():
    """Two rows of one array passed as ``x`` and ``y`` (``aliases``): the
    fusion treats them as one buffer."""
    @tn.kernel
    def scale_then_sum(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"],  # noqa: F821
                       s: tn.Tensor[f32, "N"]):  # noqa: F821
        (n,) = x.shape
        (i,) = x.dims()
        y, s = y.with_dims(i), s.with_dims(i)
        for _p in tn.parallel(tn.shape(1)):
            y(tn.coord(0), tn.shape(n)).store(x[tn.coord(0), tn.shape(n)] * 2.0)
            u = x[tn.coord(0), tn.shape(n)]
            s(tn.coord(0), tn.shape(1)).store(tn.reshape(tn.reduce(u, u.dim(0), tn.add), (1,)))

    fused = lambda k: [lp for lp in _vector_loops(k)  # noqa: E731
                       if any(isinstance(s, L.Assign) for s in lp.body)
                       and any(isinstance(s, L.Store) for s in lp.body)]
    assert fused(_fused(scale_then_sum))  # y and x distinct: one loop
    assert not fused(_fused(scale_then_sum, aliases=frozenset({"x", "y"})))


@tn.kernel
def map_reduce(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"],
               s: tn.Tensor[f32, "R K"]):  # noqa: F821
    """A row's values stored and reduced three ways in one fused loop."""
    rows, cols = x.shape
    r, c = x.dims()
    y = y.with_dims(r, c)
    for p in tn.parallel(tn.shape(rows)):
        o = tn.coord(p.index(), 0)
        t = x[o, tn.shape(1, cols)] * 2.0
        y(o, tn.shape(1, cols)).store(t)
        hi = tn.reduce(t, c, tn.maximum)
        lo = tn.reduce(t, c, tn.minimum)
        total = tn.reduce(t, c, tn.add)
        s(o, tn.shape(1, 1)).store(tn.reshape(hi, (1, 1)))
        s(tn.coord(p.index(), 1), tn.shape(1, 1)).store(tn.reshape(lo, (1, 1)))
        s(tn.coord(p.index(), 2), tn.shape(1, 1)).store(tn.reshape(total, (1, 1)))


@pytest.mark.parametrize("bits", [256, 512])
def test_vector_accumulators_keep_nan_infinities_and_signed_zeros(bits):
    """Rows of signed zeros only, with one +0 among -0s (the maximum is +0,
    the minimum -0), with a NaN, with infinities, and ragged lengths (a
    scalar rest after the vector steps): the compiled maximum and minimum
    are the reference's bit for bit and the sum is the reference's where it
    is exact (all terms integers)."""
    cols = 37
    rows = [np.full(cols, -0.0), np.full(cols, 0.0), np.where(np.arange(cols) == 20, 0.0, -0.0),
            np.where(np.arange(cols) == 3, np.nan, 1.0), np.where(np.arange(cols) % 2, np.inf, 2.0),
            np.where(np.arange(cols) == 36, -np.inf, -3.0), np.arange(cols) - 18.0]
    x = np.array(rows, np.float32)
    prog = map_reduce.program
    ck = compile_program(prog, default_schedule(prog, "llvm", vector_bits=bits), cache=False)
    assert any(any(isinstance(s, L.Assign) for s in lp.body) and
               any(isinstance(s, L.Store) for s in lp.body)
               for lp in _vector_loops(fusion.fuse_kernel(stage_serial(stage_loopir(
                   prog, ck.schedule)), bits)))
    y = np.zeros_like(x)
    s = np.zeros((len(rows), 3), np.float32)
    ck(x, y, s)
    ref_y = np.zeros_like(x)
    ref_s = np.zeros_like(s)
    map_reduce(x, ref_y, ref_s)
    assert np.array_equal(y, ref_y, equal_nan=True)
    assert np.array_equal(s.view(np.uint32), ref_s.view(np.uint32)) or (
        np.array_equal(np.isnan(s), np.isnan(ref_s))
        and np.array_equal(s[~np.isnan(s)].view(np.uint32), ref_s[~np.isnan(ref_s)].view(
            np.uint32))), (s, ref_s)
    assert np.signbit(s[2, 0]) == np.False_ and np.signbit(s[2, 1])  # max +0, min -0


@pytest.mark.parametrize("name", ["softmax", "layernorm"])
@pytest.mark.parametrize("cols", [1, 15, 16, 17, 100, 1029])
def test_fused_row_kernels_validate(name, cols):
    """The fused kernels against the reference (its admitted set: the
    reduction's regrouping is within the contract), at row lengths around
    the lane count."""
    rng = np.random.default_rng(cols)
    x = (rng.standard_normal((5, cols)) * 3).astype(np.float32)
    y = np.zeros_like(x)
    k = kernels()[name]
    if name == "softmax":
        args = (x, y)
    else:
        w = rng.standard_normal(cols).astype(np.float32)
        b = rng.standard_normal(cols).astype(np.float32)
        args = (x, w, b, y, np.float32(1e-5))
    report = tn.validate(k, "llvm", inputs=list(args))
    assert report.ok, report


def test_the_fused_stage_is_printed():
    """``tilenest lower --emit fused`` shows the loop IR the code generator
    reads: softmax's exponentials stored and summed in one vector loop."""
    from tilenest.backends.llvm import STAGES, emit

    assert list(STAGES).index("fused") == list(STAGES).index("loopir") + 1
    def fused_loops(stage: str) -> list[str]:
        loops = emit(kernels()["softmax"].program, stage).split("for.vector")[1:]
        return [lp for lp in loops if "= exp(" in lp and "add{reassoc}" in lp]

    assert len(fused_loops("fused")) == 1
    assert not fused_loops("loopir")


def test_a_check_between_the_loops_keeps_them_apart():
    """A check between the two loops cannot move before the first: the
    first error a run meets stays the one it reports, so the loops stay
    two."""
    k = _exp_then_sum(0)
    body = list(k.phases[0].body)
    body.insert(1, L.Check(L.IPred(E.cmp(">", E.Sym("N"), 0)), 1))
    k = replace(k, phases=(replace(k.phases[0], body=tuple(body)),))
    assert len(_vector_loops(fusion.fuse_kernel(k, 512))) == 2
