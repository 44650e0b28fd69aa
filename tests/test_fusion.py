"""Loop fusion (``tilenest/lowering/fusion.py``): adjacent loops over one
range fuse only when every dependence between them stays within an
iteration; a tile produced by one loop and read by the next at the same
element is forwarded through a local."""

from __future__ import annotations

import numpy as np

from tilenest.lowering import default_schedule, lower
from tilenest.lowering import loopir as L
from tilenest.lowering.fusion import fuse_loops
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E
from tilenest.workloads import WORKLOADS

F32 = D.f32


def _vector_loops(body: tuple) -> list[L.For]:
    return [s for s in L.walk(body) if isinstance(s, L.For) and s.kind == "vector"]


def test_softmax_sum_fuses_with_the_exponentials_it_adds():
    wl = WORKLOADS["softmax"]
    k = wl.kernel(D.f32, {"rp": 1})
    before = lower(k.program, default_schedule(k.program, "cuda"))
    after = fuse_loops(before)
    assert len(_vector_loops(before.phases[0].body)) == 4  # max, exp, sum, divide
    loops = _vector_loops(after.phases[0].body)
    assert len(loops) == 3  # the max needs the whole row first, the division the sum
    fused = loops[1]
    stores = [s for s in fused.body if isinstance(s, L.Store)]
    merge = [s for s in fused.body if isinstance(s, L.Assign) and isinstance(s.value, L.Bin)
             and "reassoc" in s.value.flags]
    assert len(stores) == 1 and len(merge) == 1
    # the sum reads the stored exponential from a local, not from the tile
    assert not any(isinstance(y, L.Load) and y.buf.name == stores[0].buf.name
                   for y in L.subexprs(merge[0].value))
    assert isinstance(stores[0].value, L.Ref)
    assert stores[0].value in set(L.subexprs(merge[0].value))


def _kernel(body: tuple, bufs: list[L.Buffer]) -> L.Kernel:
    return L.Kernel("k", (), ("N",), tuple(bufs),
                    (L.Phase("k_0", (E.Const(1),), L.LVar("pid", D.i64), body),))


def _loop(name: str, n: E.Expr, body: tuple, kind: str = "vector") -> L.For:
    return L.For(L.LVar(name, D.i64), E.Const(0), n, body, kind)


def _ld(b: L.Buffer, e: E.Expr) -> L.Load:
    return L.Load(b, L.IExpr(e))


N = E.Sym("N")
X, Y, Z = (L.Buffer(n, F32, "shared", N) for n in ("x", "y", "z"))


def _two(shift: int, kind: str = "vector") -> L.Kernel:
    """``y[i] = x[i] + 1`` then ``z[j] = 2 y[j + shift]`` (``shift`` 0: the same element)."""
    i, j = E.Var("i"), E.Var("j")
    one = L.Const(1.0, F32)
    a = _loop("i", N, (L.Store(Y, L.IExpr(i), L.Bin("add", _ld(X, i), one, F32)),), kind)
    b = _loop("j", N, (L.Store(Z, L.IExpr(j), L.Bin("mul", L.Const(2.0, F32),
                                                    _ld(Y, E.add(j, shift)), F32)),), kind)
    return _kernel((a, b), [X, Y, Z])


def test_same_element_fuses_and_forwards():
    body = fuse_loops(_two(0)).phases[0].body
    assert len(body) == 1 and isinstance(body[0], L.For)
    loads = [y for y in L.evaluated(body) if isinstance(y, L.Load)]
    assert [y.buf.name for y in loads] == ["x"]  # y[i] forwarded


def test_a_neighbour_element_or_another_kind_blocks_fusion():
    # z[j] = y[j + 1] reads an element the first loop writes in a later iteration
    assert len(fuse_loops(_two(1)).phases[0].body) == 2
    assert len(fuse_loops(_two(-1)).phases[0].body) == 2
    serial_then_vector = _two(0).phases[0].body
    mixed = _kernel((serial_then_vector[0], L.For(**{**serial_then_vector[1].__dict__,
                                                      "kind": "serial"})), [X, Y, Z])
    assert len(fuse_loops(mixed).phases[0].body) == 2


def test_a_reduction_read_by_the_next_loop_blocks_fusion():
    """``s = sum(x)`` then ``z[j] = x[j] / s``: the second loop needs the
    finished sum, a local the first assigns."""
    s = L.LVar("s", F32)
    i, j = E.Var("i"), E.Var("j")
    a = _loop("i", N, (L.Assign(s, L.Bin("add", L.Ref(s), _ld(X, i), F32,
                                         frozenset({"reassoc"}))),))
    b = _loop("j", N, (L.Store(Z, L.IExpr(j), L.Bin("div", _ld(X, j), L.Ref(s), F32)),))
    k = _kernel((L.Assign(s, L.Const(0.0, F32)), a, b), [X, Z])
    assert len(fuse_loops(k).phases[0].body) == 3


def test_fused_softmax_matches_numpy_on_the_emulated_device():
    from tilenest.backends import cuda

    wl = WORKLOADS["softmax"]
    k = wl.kernel(D.f32, {"rp": 1})
    ck = cuda.compile_program(k.program, device="emulated")
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((7, 300)) * 3).astype(np.float32)
    y = np.full_like(x, np.nan)
    ck(x, np.ones(x.shape, bool), y)
    e = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(1, keepdims=True), rtol=2e-6, atol=1e-30)


def test_a_staging_copy_is_left_to_the_asynchronous_copy():
    """With ``stage_loads`` the row's copy into shared memory stays a loop of
    its own (``cp.async`` on cuda); the exponentials still fuse with their sum."""
    from tilenest.backends import cuda

    wl = WORKLOADS["softmax"]
    k = wl.kernel(D.f32, {"rp": 1})
    s = default_schedule(k.program, "cuda", stage_loads=True)
    loops = _vector_loops(fuse_loops(lower(k.program, s)).phases[0].body)
    assert len(loops) == 4  # copy, max, exp with sum, divide
    assert all(isinstance(t, L.Store) and isinstance(t.value, L.Load) for t in loops[0].body)
    assert "tn_cp_async<" in cuda.compile_program(k.program, s, device="gpu").source.text
