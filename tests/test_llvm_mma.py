"""Register-blocked ``mma`` on the LLVM backend, and threaded phases.

A strict ``mma`` (no reassociation) is bitwise the interpreter for every
register block, tile shape (ragged against the block, tiny) and operand dtype;
a reassociating one stays inside the oracle's envelope. The schedule's
``mma_block`` is data with a host default; the loop IR keeps a micro-tile's
accumulators live across the whole contraction. Phases spread over threads
run every chunk once, give identical outputs, report the first error in
program-id order (``tests/test_llvm_workers.py`` tests the worker pool itself).
"""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import bf16, f16, f32
from tilenest.backends.llvm import compile_program
from tilenest.backends.llvm.workers import chunks
from tilenest.errors import TilenestError
from tilenest.lowering import default_schedule
from tilenest.lowering import loopir as L
from tilenest.lowering.schedule import default_mma_block, host_vector_bits
from tilenest.semantics import expr as E
from tilenest.validation import validate


def gemm_kernel(ta, tb, reassoc: bool):
    """A tiled GEMM with A of dtype ``ta``, B of ``tb`` and an f32 accumulator."""

    @tn.kernel
    def gemm(A: tn.Tensor[ta, "M K"], B: tn.Tensor[tb, "K N"], C: tn.Tensor[f32, "M N"], *,
             bm=16, bn=16, bk=8):
        M, K = A.shape
        N = B.shape[1]
        m, k = A.dims()
        n = C.dim(1)
        B = B.with_dims(k, n)
        C = C.with_dims(m, n)
        for nest in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
            i, j = nest.index(0), nest.index(1)
            acc = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
            for kk in nest.reduce(tn.shape(tn.cdiv(K, bk)), policy=tn.fold_left):
                a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
                b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
                acc = tn.mma(a, b, acc, allow_reassociation=reassoc)
            C(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(acc)

    return gemm


STRICT = gemm_kernel(f32, f32, False)
REASSOC = gemm_kernel(f32, f32, True)


def operands(m: int, k: int, n: int, dta=np.float32, dtb=np.float32, seed: int = 0):
    """Operands whose magnitudes span many binades, so that any other
    summation order changes the rounded result."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)) * np.exp2(rng.integers(-12, 12, (m, k)))
    b = rng.standard_normal((k, n)) * np.exp2(rng.integers(-12, 12, (k, n)))
    return a.astype(dta), b.astype(dtb), np.zeros((m, n), np.float32)


def compiled(kernel, consts: dict, **schedule):
    k = kernel.specialize(**consts) if consts else kernel
    return k, compile_program(k.program, default_schedule(k.program, **schedule))


# tile shapes against register blocks: multiples, ragged in rows and columns,
# tiles smaller than one block, single elements, a block of one row
CASES = [
    (dict(bm=16, bn=32, bk=8), None),
    (dict(bm=13, bn=37, bk=5), (8, 2)),
    (dict(bm=20, bn=70, bk=3), (6, 1)),
    (dict(bm=3, bn=5, bk=4), (8, 2)),
    (dict(bm=1, bn=1, bk=1), None),
    (dict(bm=9, bn=16, bk=7), (1, 1)),
]


@pytest.mark.parametrize("consts,block", CASES)
def test_strict_mma_is_bitwise_the_interpreter(consts, block):
    k, ck = compiled(STRICT, consts, **({"mma_block": block} if block else {}))
    for m, kk, n in ((37, 19, 53), (1, 1, 1), (16, 8, 32)):
        a, b, c = operands(m, kk, n)
        want = k(a, b, c.copy())
        got = ck(a, b, c.copy())
        assert got.tobytes() == want.tobytes(), (consts, block, (m, kk, n))


def test_strict_mma_same_bits_for_every_block_and_thread_count():
    a, b, c = operands(45, 33, 70, seed=3)
    outs = []
    for block in ((8, 2), (1, 1), (5, 3), (16, 1)):
        _, ck = compiled(STRICT, dict(bm=24, bn=48, bk=16), mma_block=block)
        for threads in (1, 2):
            outs.append(ck(a, b, c.copy(), threads=threads).tobytes())
    assert len(set(outs)) == 1


@pytest.mark.parametrize("dta,dtb", [(f16, f16), (bf16, bf16), (f16, f32)])
def test_narrow_operands_accumulate_in_f32_bitwise(dta, dtb):
    kern = gemm_kernel(dta, dtb, False).specialize(bm=11, bn=40, bk=6)
    ck = compile_program(kern.program, default_schedule(kern.program))
    a, b, c = operands(23, 17, 41, dta.np, dtb.np, seed=1)
    assert ck(a, b, c.copy()).tobytes() == kern(a, b, c.copy()).tobytes()


@pytest.mark.parametrize("consts,block", CASES[:4])
def test_reassociating_mma_stays_in_the_envelope(consts, block):
    k, ck = compiled(REASSOC, consts, **({"mma_block": block} if block else {}))
    rep = validate(k, schedule=ck.schedule, inputs=[list(operands(37, 19, 53)),
                                                    list(operands(5, 64, 3, seed=2))])
    assert rep.ok and rep.count("ok") == 2, rep.summary()
    assert "fmuladd" in ck.llvm_ir
    assert "fmuladd" not in compiled(STRICT, consts)[1].llvm_ir


def _micro_tiles(stmts) -> list[L.For]:
    """Loops whose body is only vector loops storing an ``Fma``: the
    contraction loop around one micro-tile."""
    out = []
    for s in stmts:
        if isinstance(s, L.For):
            body = s.body
            if body and all(isinstance(t, L.For) and t.kind == "vector" and len(t.body) == 1
                            and isinstance(t.body[0], L.Store)
                            and isinstance(t.body[0].value, L.Fma) for t in body):
                out.append(s)
            out += _micro_tiles(body)
        elif isinstance(s, L.If):
            out += _micro_tiles(s.then) + _micro_tiles(s.orelse)
    return out


def test_micro_tile_rows_share_the_contraction_loop():
    """bm=bn=32 with an (8, 2) block at 512 bits: every contraction loop
    updates 8 rows of 32 columns (16 vector accumulators); 36 rows give a
    4-row tail band."""
    for bm, rows in ((32, {8}), (36, {8, 4})):
        _, ck = compiled(REASSOC, dict(bm=bm, bn=32, bk=16), mma_block=(8, 2), vector_bits=512)
        tiles = _micro_tiles(ck.kernel.phases[0].body)
        assert {len(t.body) for t in tiles} == rows
        assert all(_full_extent(t.hi) == 16 for t in tiles)
        assert all(v.hi == E.Const(32) for t in tiles for v in t.body)


def _b_strides(ck) -> set[tuple[int, int]]:
    """``(stride along the contraction loop, stride along the columns)`` of
    every read of the packed ``b`` tile inside a micro-tile's contraction."""
    out = set()
    for t in _micro_tiles(ck.kernel.phases[0].body):
        k = E.Var(t.var.name)
        for v in t.body:
            c = E.Var(v.var.name)
            for load in _loads(v.body[0].value):
                if load.buf.name.startswith("%b"):
                    out.add((E.stride(load.index.e, k), E.stride(load.index.e, c)))
    return out


def _loads(x) -> list:
    """The loads of the expression ``x`` (the operands of a micro-kernel's update)."""
    if isinstance(x, L.Load):
        return [x]
    parts = {L.Fma: ("a", "b", "c"), L.Bin: ("a", "b"), L.Cast: ("a",)}.get(type(x), ())
    return [y for f in parts for y in _loads(getattr(x, f))]


@pytest.mark.parametrize("bn", [64, 80, 1000])
def test_b_is_packed_in_column_panels_of_the_micro_tile(bn):
    """At (8, 2) x 16 lanes a micro-tile is 32 columns wide: the packed ``b``
    tile holds them as panels of 32 columns (the last one narrower), so a
    micro-kernel reads 32 consecutive elements a contraction step, whatever
    the tile's width, and the results stay bitwise the interpreter's."""
    tiles = dict(bm=16, bn=bn, bk=8)
    _, ck = compiled(REASSOC, tiles, mma_block=(8, 2), vector_bits=512)
    assert _b_strides(ck) == {(32, 1)} | ({(bn % 32, 1)} if bn % 32 else set())
    k, ck = compiled(STRICT, tiles, mma_block=(8, 2), vector_bits=512)
    a, b, c = operands(37, 19, bn + 13)
    assert ck(a, b, c.copy()).tobytes() == k(a, b, c.copy()).tobytes()


def test_panel_offsets_in_both_forms_place_every_element_once():
    """``handles.panel_offset`` over lines of 3 x 5 and 70 columns in panels
    of 32 (32, 32 and a last one of 6): the general form (floor division,
    for a column it cannot split) and the affine form (a column ``32 j + c``
    with the facts ``0 <= j < 2``, ``0 <= c < 32``, or the last panel's)
    give the same offset of each element, panel ``j`` at ``j 32 15``, a
    line's columns consecutive, every offset once."""
    from tilenest.lowering.facts import Facts
    from tilenest.lowering.handles import panel_offset

    ext = (E.Const(3), E.Const(5), E.Const(70))
    u, v, col, j, c = (E.Var(n) for n in ("u", "v", "col", "j", "c"))
    general = panel_offset(32, ext, [u, v, col])
    assert isinstance(general, E.Expr) and E.leaves(general) >= {u, v, col}
    facts = Facts()
    facts.push([j.ge(0), j.lt(2), c.ge(0), c.lt(32)])
    full = panel_offset(32, ext, [u, v, 32 * j + c], facts)
    facts = Facts()
    facts.push([c.ge(0), c.lt(6)])
    last = panel_offset(32, ext, [u, v, 64 + c], facts)
    assert not any(isinstance(x, (E.FloorDiv, E.Mod)) for x in E.leaves(full) | E.leaves(last))
    seen = set()
    for a in range(3):
        for b in range(5):
            for n in range(70):
                off = E.evaluate(general, {u: a, v: b, col: n})
                q, r = divmod(n, 32)
                w = 32 if q < 2 else 6
                assert off == q * 32 * 15 + (a * 5 + b) * w + r
                affine = full if q < 2 else last
                assert E.evaluate(affine, {u: a, v: b, j: q, c: r if q < 2 else n - 64}) == off
                seen.add(off)
    assert seen == set(range(3 * 5 * 70))


def _full_extent(hi: E.Expr) -> int:
    """A contraction loop's bound where no padding is skipped (every size
    symbol and loop variable of the clamp ``min(bk, max(K - kk*bk, 0))`` at
    a K far beyond the tile, the others at 0)."""
    env = {v: (10 ** 6 if getattr(v, "name", "") == "K" else 0) for v in E.leaves(hi)
           if not isinstance(v, E.Const)}
    return E.evaluate(hi, env)


def test_mma_block_is_schedule_data():
    assert default_mma_block(512) == (8, 2)
    assert default_mma_block(256) == default_mma_block(128) == (6, 2)
    s = default_schedule(STRICT.program)
    assert s.mma_block == default_mma_block(host_vector_bits())
    assert s.key() != s.with_(mma_block=(4, 1)).key()
    with pytest.raises(TilenestError, match="mma_block"):
        compiled(STRICT, {}, mma_block=(0, 2))


# ---------------------------------------------------------------------------
# threads


def test_chunks_cover_the_program_ids_in_order():
    for n, w, c in ((1, 2, None), (7, 2, None), (100, 3, None), (10, 2, 3), (5, 1, None)):
        r = chunks(n, w, c)
        assert r[0][0] == 0 and r[-1][1] == n
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in zip(r, r[1:], strict=False))
    assert len(chunks(5, 1, None)) == 1 and len(chunks(64, 2, None)) == 8


@tn.kernel
def rows_times_matrix(x: tn.Tensor[f32, "R K"], w: tn.Tensor[f32, "K N"],
                      y: tn.Tensor[f32, "R N"]):
    """Whole rows of ``x`` times the whole of ``w``: symbolic tile extents."""
    R, K = x.shape
    N = w.shape[1]
    r, k = x.dims()
    n = y.dim(1)
    w = w.with_dims(k, n)
    y = y.with_dims(r, n)
    for p in tn.parallel(tn.shape(R)):
        a = x[tn.coord(p.index(), 0), tn.shape(1, K)]
        b = w[tn.coord(0, 0), tn.shape(K, N)]
        acc = tn.zeros(f32, tn.shape(1, N), dims=(r, n))
        y(tn.coord(p.index(), 0), tn.shape(1, N)).store(
            tn.mma(a, b, acc, allow_reassociation=False))


def test_symbolic_tile_extents_are_blocked_bitwise():
    # 512-bit vectors: 16 f32 lanes, one vector per block row, on any host
    ck = rows_times_matrix.compile(mma_block=(4, 1), vector_bits=512)
    assert "N // 16" in ck.loopir
    for rows, k, n in ((3, 7, 50), (2, 1, 1), (1, 33, 16), (2, 5, 3)):
        a, b, _ = operands(rows, k, n, seed=k)
        want = rows_times_matrix(a, b, np.zeros((rows, n), np.float32))
        assert ck(a, b, np.zeros((rows, n), np.float32)).tobytes() == want.tobytes()
