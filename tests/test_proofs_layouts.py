"""Memory layout obligations (M-12, O-5): the GF(2) procedure for bit-linear
swizzles against brute-force enumeration, the layout deciders, the
compile-time legality gate (refuted: error; unknown: refused unless assumed)
and the interpreter's allocation check at the bound extents."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilenest as tn
from tilenest import f32
from tilenest.errors import TilenestError, VerifyError
from tilenest.lowering import legality
from tilenest.proofs import gf2
from tilenest.proofs.layouts import layout_obligations, obligations_of
from tilenest.proofs.model import Model
from tilenest.proofs.obligation import ASSUMED, PROVED, REFUTED, UNKNOWN, discharge
from tilenest.semantics import expr as E
from tilenest.semantics.layout_facts import first_collision
from tilenest.semantics.maps import MemLayout
from tilenest.semantics.space import Space
from tilenest.semantics.types import MemoryType

I, J = E.Var("0"), E.Var("1")


def swizzle(o: E.Expr, b: int, m: int, s: int) -> E.Expr:
    """CUTLASS ``Swizzle<B, M, S>``: ``o ^ ((o & ((2^B - 1) << (M + S))) >> S)``."""
    return o ^ ((o & (((1 << b) - 1) << (m + s))) >> s)


def brute(off: E.Expr, extents: tuple[int, ...]) -> tuple[np.ndarray, bool]:
    grids = np.meshgrid(*[np.arange(n, dtype=np.int64) for n in extents], indexing="ij")
    env = {E.Var(str(k)): g for k, g in enumerate(grids)}
    vals = np.broadcast_to(np.asarray(E.evaluate(off, env), dtype=np.int64), extents)
    return vals, first_collision(vals) is None


# ---------------------------------------------------------------------------
# the kernel of the issue: an XOR layout over symbolic extents aliases


@tn.kernel
def xor_rows(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    m = tn.memory(f32, tn.layout(tn.shape(rows, cols), offset=lambda i, j: (i * cols) ^ j,
                                 size=rows * cols))
    m.store(x[tn.coord(0, 0), tn.shape(rows, cols)])
    y(tn.coord(0, 0), tn.shape(rows, cols)).store(m.load())


@tn.kernel
def dense_rows(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    m = tn.memory(f32, tn.layout(tn.shape(rows, cols), offset=lambda i, j: i * cols + j,
                                 size=rows * cols))
    m.store(x[tn.coord(0, 0), tn.shape(rows, cols)])
    y(tn.coord(0, 0), tn.shape(rows, cols)).store(m.load())


X23 = np.arange(6, dtype=np.float32).reshape(2, 3)


def test_aliasing_xor_layout_is_an_error_in_the_interpreter():
    """Before: the store silently lost elements and y was [[0,5,4],[3,4,5]]."""
    y = np.full_like(X23, -1)
    with pytest.raises(VerifyError) as ei:
        tn.interpret(xor_rows, X23, y)
    msg = str(ei.value)
    assert "(0, 2) and (1, 1)" in msg and "offset 2" in msg
    assert ei.value.sites and "test_proofs_layouts.py" in str(ei.value.sites[0])
    assert (y == -1).all()  # nothing was stored


def test_aliasing_xor_layout_is_refused_by_the_compile_gate():
    with pytest.raises(VerifyError) as ei:
        xor_rows.compile(target="llvm")
    text = str(ei.value)
    assert "layout.injective" in text and "share offset" in text


def test_dense_layout_gives_the_right_answer_on_both():
    y1, y2 = np.zeros_like(X23), np.zeros_like(X23)
    tn.interpret(dense_rows, X23, y1)
    k = dense_rows.compile(target="llvm")
    k(X23, y2)
    assert y1.tolist() == y2.tolist() == [[0, 1, 2], [3, 4, 5]]
    lay = [o for o in k.obligations if o.kind.startswith("layout.")]
    assert len(lay) == 2 and all(o.status == PROVED for o in lay)


@tn.kernel
def row_xor(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    """``j ^ (i % 4)`` stays in j's aligned block of 4 when 4 divides C: one to
    one, but outside what the engines decide for symbolic C."""
    rows, cols = x.shape
    tn.assume(cols % 4 == 0)
    m = tn.memory(f32, tn.layout(tn.shape(rows, cols),
                                 offset=lambda i, j: i * cols + (j ^ (i % 4)), size=rows * cols))
    m.store(x[tn.coord(0, 0), tn.shape(rows, cols)])
    y(tn.coord(0, 0), tn.shape(rows, cols)).store(m.load())


def test_unknown_layout_is_refused_unless_assumed(monkeypatch):
    # the engines exhaust any budget on this XOR layout: a small one says
    # "unknown" as surely as the gate's own, in a fraction of the time
    monkeypatch.setattr(legality, "TIMEOUT", 0.25)
    obs = discharge(layout_obligations(Model(row_xor.program)), timeout=0.25)
    assert {o.status for o in obs} == {UNKNOWN}
    with pytest.raises(TilenestError) as ei:
        row_xor.compile(target="llvm")
    assert "not proved" in str(ei.value) and "assume=" in (ei.value.hint or "")
    k = row_xor.compile(target="llvm", assume=("layout.",))
    lay = [o for o in k.obligations if o.kind.startswith("layout.")]
    assert lay and all(o.status == ASSUMED and o.assumed_by == "layout." for o in lay)
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    y1, y2 = np.zeros_like(x), np.zeros_like(x)
    k(x, y1)
    tn.interpret(row_xor, x, y2)
    assert (y1 == x).all() and (y2 == x).all()


def test_large_constant_space_is_checked_at_allocation():
    """More than 2^20 points: the verifier does not enumerate, the interpreter
    decides at the allocation."""

    @tn.kernel
    def wide(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
        m = tn.memory(f32, tn.layout(tn.shape(1100, 1000), (999, 1)))   # rows overlap
        m.store(x[tn.coord(0, 0), tn.shape(1100, 1000)])
        y(tn.coord(0, 0), tn.shape(1100, 1000)).store(m.load())

    x = np.zeros((1100, 1000), np.float32)
    with pytest.raises(VerifyError) as ei:
        tn.interpret(wide, x, np.zeros_like(x))
    assert "(0, 999) and (1, 0)" in str(ei.value)
    ob = next(o for o in discharge(layout_obligations(Model(wide.program)), 2.0)
              if o.kind == "layout.injective")
    assert ob.status == REFUTED and ob.checked


# ---------------------------------------------------------------------------
# the deciders


def _kernel_with(offset, extents, size):
    @tn.kernel
    def k(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
        m = tn.memory(f32, tn.layout(tn.shape(*extents), offset=offset, size=size))
        m.store(x[tn.coord(0, 0), tn.shape(*extents)])
        y(tn.coord(0, 0), tn.shape(*extents)).store(m.load())
    return k


def _verdicts(k) -> dict[str, object]:
    obs = discharge(layout_obligations(Model(k.program)), timeout=2.0)
    return {o.kind: o for o in obs}


@pytest.mark.parametrize("rows", [2048, 1000])
def test_cutlass_swizzle_on_four_million_points_is_proved_by_gf2(rows):
    k = _kernel_with(lambda i, j: swizzle(i * 2048 + j, 3, 3, 3), (rows, 2048), rows * 2048)
    v = _verdicts(k)
    assert v["layout.injective"].status == PROVED and v["layout.injective"].engine == "gf2"
    assert v["layout.range"].status == PROVED and v["layout.range"].engine == "gf2"


def test_broken_swizzle_is_refuted_with_a_real_collision():
    # S = 0: the XOR lands on the bits it reads, clearing them
    k = _kernel_with(lambda i, j: swizzle(i * 2048 + j, 3, 3, 0), (2048, 2048), 2048 * 2048)
    ob = _verdicts(k)["layout.injective"]
    assert ob.status == REFUTED and ob.engine == "gf2" and ob.checked
    cx = ob.counterexample
    a, b = (cx["0"], cx["1"]), (cx["0'"], cx["1'"])
    off = swizzle(I * 2048 + J, 3, 3, 0)
    assert a != b and gf2.evaluate(off, ["0", "1"], a) == gf2.evaluate(off, ["0", "1"], b)
    assert "share offset" in "\n".join(ob.counterexample_lines())


def test_small_spaces_without_structure_are_enumerated():
    v = _direct(I * 3 + J, (5, 4), 16)  # rows overlap: (0, 3) and (1, 0)
    assert v["layout.injective"].status == REFUTED
    assert v["layout.injective"].engine == "enumeration"
    assert v["layout.range"].status == PROVED  # the largest offset, 4*3 + 3 = 15, fits
    v = _direct(I * 4 + J, (5, 4), 19)
    assert v["layout.injective"].status == PROVED
    ob = v["layout.range"]
    assert ob.status == REFUTED and (ob.counterexample["0"], ob.counterexample["1"]) == (4, 3)


def _direct(offset: E.Expr, extents: tuple[int, ...], size: int) -> dict[str, object]:
    """The layout obligations of a Memory type built directly (small constant
    spaces are already decided by the verifier at capture)."""
    sp = Space.of(*[(tn.dim(f"m{k}"), n) for k, n in enumerate(extents)])
    mt = MemoryType(f32, sp, MemLayout(tuple(str(k) for k in range(len(extents))), offset, size))
    return {o.kind: o for o in discharge(obligations_of(mt, "%m"), timeout=2.0)}


def test_range_refutation_names_the_element_past_the_size():
    ob = _direct(swizzle(I * 64 + J, 3, 3, 3), (64, 64), 64 * 64 - 1)["layout.range"]
    assert ob.status == REFUTED and ob.engine == "gf2"
    pt = (ob.counterexample["0"], ob.counterexample["1"])
    assert gf2.evaluate(swizzle(I * 64 + J, 3, 3, 3), ["0", "1"], pt) == 64 * 64 - 1


def test_empty_space_has_no_address_events():
    v = _direct(I * 0, (0, 4), 0)
    assert all(o.status == PROVED and o.engine == "structural" for o in v.values())


def test_symbolic_broadcast_is_refuted_by_the_engines():
    @tn.kernel
    def bcast(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
        rows, cols = x.shape
        m = tn.memory(f32, tn.layout(tn.shape(rows, cols), (0, 1)))
        m.store(x[tn.coord(0, 0), tn.shape(rows, cols)])
        y(tn.coord(0, 0), tn.shape(rows, cols)).store(m.load())

    ob = _verdicts(bcast)["layout.injective"]
    assert ob.status == REFUTED and ob.checked
    with pytest.raises(VerifyError):
        bcast.compile(target="llvm")


def test_tilenest_check_proves_a_swizzle(tmp_path):
    from tilenest.proofs.report import check

    k = _kernel_with(lambda i, j: swizzle(i * 128 + j, 3, 4, 3), (128, 128), 128 * 128)
    rep = check(k, timeout=2.0)
    lay = [o for o in rep.obligations if o.kind.startswith("layout.")]
    assert [(o.engine, o.status) for o in lay] == [("gf2", PROVED)] * 2


# ---------------------------------------------------------------------------
# the GF(2) procedure against brute force


def test_every_cutlass_swizzle_of_ten_bits_matches_enumeration():
    rows_bits, cols_bits = 4, 6
    o = I * (1 << cols_bits) + J
    ext = (1 << rows_bits, 1 << cols_bits)
    for b, m, s in itertools.product(range(0, 4), range(0, 4), range(0, 5)):
        if b + m + s > rows_bits + cols_bits:
            continue
        off = swizzle(o, b, m, s)
        bm = gf2.bit_linear(off, ["0", "1"], ext)
        assert bm is not None, (b, m, s)
        vals, inj = brute(off, ext)
        assert (bm.collision(ext) is None) == inj, (b, m, s)
        assert bm.maximum(ext)[0] == vals.max()


def test_non_linear_expressions_are_not_claimed():
    ext = (8, 8)
    for off in (I * J, I * 3 + J, I - J, I + J, E.Sym("N") * I + J, E.minimum(I, J)):
        assert gf2.bit_linear(off, ["0", "1"], ext) is None, off
    # shifts and masks that could reach bit 62 are refused (int64 safety)
    assert gf2.bit_linear(I << 60, ["0"], (64,)) is None
    assert gf2.bit_linear(I << 50, ["0"], (64,)) is not None


def test_more_than_sixty_four_input_bits():
    """Four coordinates of 2^20 each (80 input bits, 2^80 points)."""
    vs = ["0", "1", "2", "3"]
    x = [E.Var(v) for v in vs]
    off = ((x[0] << 40) | (x[1] << 20) | x[2]) ^ (x[3] << 60 >> 60)
    assert gf2.bit_linear(off, vs, (1 << 20,) * 4) is None  # bit 79 would overflow int64
    off = (x[0] * (1 << 40) + x[1] * (1 << 20) + x[2]) ^ x[3]
    bm = gf2.bit_linear(off, vs, (1 << 20,) * 4)
    assert bm is not None and bm.n_inputs == 80 and bm.rank() == 60
    a, b = bm.collision((1 << 20,) * 4)
    assert a != b and gf2.evaluate(off, vs, a) == gf2.evaluate(off, vs, b)


def _leaf(draw) -> E.Expr:
    return draw(st.sampled_from([I, J]))


@st.composite
def bit_exprs(draw, depth: int = 3) -> E.Expr:
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return _leaf(draw)
    kind = draw(st.sampled_from(["xor", "and", "or", "shl", "shr", "mul", "div", "mod",
                                 "add", "xorc"]))
    a = draw(bit_exprs(depth - 1))
    k = draw(st.integers(0, 4))
    c = draw(st.integers(0, 63))
    if kind == "xor":
        return a ^ draw(bit_exprs(depth - 1))
    if kind == "add":
        return a + draw(bit_exprs(depth - 1))
    if kind == "or":
        return E.bitop("|", a, draw(st.one_of(bit_exprs(depth - 1), st.just(E.Const(c)))))
    return {"and": lambda: a & c, "shl": lambda: a << k, "shr": lambda: a >> k,
            "mul": lambda: a * (1 << k), "div": lambda: a // (1 << k),
            "mod": lambda: a % (1 << k), "xorc": lambda: a ^ c}[kind]()


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(bit_exprs(), st.integers(1, 9), st.integers(1, 9))
def test_random_bit_maps_agree_with_enumeration(off, n0, n1):
    ext = (n0, n1)
    bm = gf2.bit_linear(off, ["0", "1"], ext)
    if bm is None:
        return
    vals, inj = brute(off, ext)
    # the matrix is the expression, point by point, on the enclosing power-of-two box
    box = (1 << gf2.width(n0), 1 << gf2.width(n1))
    big, _ = brute(off, box)
    for p in itertools.product(range(box[0]), range(box[1])):
        assert bm(p) == big[p], (off, p)
    pair = bm.collision(ext)
    assert (pair is None) == inj
    if pair is not None:
        a, b = pair
        assert a != b and all(0 <= a[k] < ext[k] and 0 <= b[k] < ext[k] for k in range(2))
        assert vals[a] == vals[b]
    mx, arg = bm.maximum(ext)
    assert mx == vals.max() and vals[arg] == mx
