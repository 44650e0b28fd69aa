"""Validation sizes under ``tn.assume``: the generator solves the kernel's
assumptions for sizes, so every tiled dim still reaches three tiles and a
ragged tail (and 0 and 1 where admitted); more cases give more distinct size
sets; a path the assumptions exclude is named in the report and fails the
run unless accepted."""

from __future__ import annotations

import json

import numpy as np

import tilenest as tn
from tilenest import f32
from tilenest.cli import main
from tilenest.validation.inputs import MAX_ELEMENTS, REQUIRED_ELEMENTS, generate
from tilenest.validation.sizes import SizePath, SizeSolver


@tn.kernel
def even_rows(x: tn.Tensor[f32, "D"], y: tn.Tensor[f32, "D"]):  # noqa: F821
    """Doubles ``x`` in 16-wide tiles; callers promise an even length."""
    (d,) = x.shape
    tn.assume(d % 2 == 0)
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(tn.cdiv(d, 16))):
        o = tn.coord(p.index() * 16)
        y(o, tn.shape(16)).store(x[o, tn.shape(16), tn.bounds.zero] * 2.0)


@tn.kernel
def first_half(x: tn.Tensor[f32, "D"], z: tn.Tensor[f32, "E"]):  # noqa: F821
    """Copies the first half of ``x`` (``E * 2 == D``) in 16-wide tiles."""
    (d,) = x.shape
    (e,) = z.shape
    tn.assume(d % 2 == 0)
    tn.assume(e * 2 == d)
    for p in tn.parallel(tn.shape(tn.cdiv(e, 16))):
        o = tn.coord(p.index() * 16)
        z(o, tn.shape(16)).store(x[o, tn.shape(16), tn.bounds.zero])


@tn.kernel
def whole_blocks(x: tn.Tensor[f32, "D"], y: tn.Tensor[f32, "D"]):  # noqa: F821
    """A 64-tiled kernel whose callers promise whole tiles: no ragged tail."""
    (d,) = x.shape
    tn.assume(d % 64 == 0)
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(tn.cdiv(d, 64))):
        o = tn.coord(p.index() * 64)
        y(o, tn.shape(64)).store(x[o, tn.shape(64), tn.bounds.zero] * 2.0)


@tn.kernel
def gqa_decode(q: tn.Tensor[f32, "B HQ D"], k: tn.Tensor[f32, "B HK L D"],  # noqa: F821
               v: tn.Tensor[f32, "B HK L D"], o: tn.Tensor[f32, "B HQ D"], *, bl=16):  # noqa: F821
    """One decode step of grouped-query attention: four query heads share a
    key/value head; each (batch, query head) streams the keys in blocks of
    ``bl`` with an online softmax (running max ``m``, denominator ``den``)."""
    nb, hq, dh = q.shape
    hk, nl = k.shape[1], k.shape[2]
    tn.assume(hq == hk * 4)
    b, h, d = q.dims()
    ld = k.dim(2)
    k = k.with_dims(b, h, ld, d)
    v = v.with_dims(b, h, ld, d)
    o = o.with_dims(b, h, d)
    for p in tn.parallel(tn.shape(nb, hq)):
        z, hh = p.index(0), p.index(1)
        qt = q[tn.coord(z, hh, 0), tn.shape(1, 1, dh)]
        m = tn.full(f32, tn.shape(1, 1), -np.inf, dims=(b, h))
        den = tn.zeros(f32, tn.shape(1, 1), dims=(b, h))
        acc = tn.zeros(f32, tn.shape(1, 1, dh), dims=(b, h, d))
        for kb in p.serial(tn.shape(tn.cdiv(nl, bl))):
            at = tn.coord(z, hh // 4, kb.index() * bl, 0)
            kt = k[at, tn.shape(1, 1, bl, dh), tn.bounds.zero]
            vt = v[at, tn.shape(1, 1, bl, dh), tn.bounds.zero]
            s = tn.reduce(tn.broadcast(qt, kt) * kt, d, tn.add)
            pos = tn.index_tile(tn.shape(tn.axis(b, 1), tn.axis(h, 1), tn.axis(ld, bl)),
                                lambda i, j, c: kb.index() * bl + c)
            s = tn.ite(pos < nl, s, -np.inf)
            m_new = tn.maximum(m, tn.reduce(s, ld, tn.maximum))
            alpha = tn.exp(m - m_new)
            pr = tn.exp(s - m_new)
            den = den * alpha + tn.reduce(pr, ld, tn.add)
            acc = acc * alpha + tn.reduce(tn.broadcast(pr, vt) * vt, ld, tn.add)
            m = m_new
        o(tn.coord(z, hh, 0), tn.shape(1, 1, dh)).store(acc / den)


@tn.kernel
def square_blocks(x: tn.Tensor[f32, "D D"], y: tn.Tensor[f32, "D D"]):  # noqa: F821
    """Doubles a square matrix in 1 x 128 tiles: three tiles and a tail of
    each row need more elements than an ordinary case holds."""
    (d, _) = x.shape
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(d, tn.cdiv(d, 128))):
        o = tn.coord(p.index(0), p.index(1) * 128)
        y(o, tn.shape(1, 128)).store(x[o, tn.shape(1, 128), tn.bounds.zero] * 2.0)


@tn.kernel
def cube_blocks(x: tn.Tensor[f32, "D D D"], y: tn.Tensor[f32, "D D D"]):  # noqa: F821
    """Doubles a cube in 1 x 1 x 64 tiles: three tiles and a tail of each row
    need millions of elements."""
    (d, _, _) = x.shape
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(d, d, tn.cdiv(d, 64))):
        o = tn.coord(p.index(0), p.index(1), p.index(2) * 64)
        y(o, tn.shape(1, 1, 64)).store(x[o, tn.shape(1, 1, 64), tn.bounds.zero] * 2.0)


def _multi(v: int, t: int) -> bool:
    return v >= 3 * t and v % t != 0


def _values(cases, sym: str) -> set[int]:
    return {c.syms[sym] for c in cases}


def _distinct(cases) -> int:
    return len({tuple(sorted(c.syms.items())) for c in cases})


# ---------------------------------------------------------------------------
# the generator solves the assumptions


def test_an_even_length_still_gets_three_tiles_a_ragged_tail_0_and_partial_tiles():
    cases = generate(even_rows.program, 20, seed=0)
    ds = _values(cases, "D")
    assert all(d % 2 == 0 for d in ds), ds
    assert any(_multi(d, 16) for d in ds), ds
    assert 0 in ds and any(0 < d < 16 for d in ds) and any(16 < d < 32 for d in ds), ds


def test_a_length_tied_to_another_reaches_both_multi_tile_paths():
    cases = generate(first_half.program, 20, seed=0)
    assert all(c.syms["D"] == 2 * c.syms["E"] for c in cases)
    assert any(_multi(e, 16) for e in _values(cases, "E")), _values(cases, "E")
    assert any(_multi(d, 16) for d in _values(cases, "D")), _values(cases, "D")
    assert len(_values(cases, "D")) > 5


def test_more_cases_give_more_distinct_size_sets_when_they_exist():
    for p in (even_rows.program, first_half.program, gqa_decode.program):
        few, many = generate(p, 20, seed=1), generate(p, 60, seed=1)
        assert len(many) == 60
        assert _distinct(many) > _distinct(few) >= 15, p.name
        assert _distinct(many) >= 55, p.name


def test_gqa_decode_keys_span_several_key_blocks():
    cases = generate(gqa_decode.program, 20, seed=0)
    assert all(c.syms["HQ"] == 4 * c.syms["HK"] for c in cases)
    ls = _values(cases, "L")
    assert any(_multi(n, 16) for n in ls), ls
    assert {0, 1}.issubset(ls) and len(_values(cases, "HK")) > 2, cases


def test_gqa_decode_validates_across_key_blocks():
    rep = tn.validate(gqa_decode, cases=10, seed=0)
    assert rep.ok and not rep.unreached, rep.summary()
    assert any(_multi(n, 16) for n in rep.sizes()["L"]), rep.summary()


def test_the_solver_respects_the_assumptions_and_avoids_used_points():
    s = SizeSolver(first_half.program)
    path = SizePath("E", "multi", 16)
    first = s.solve(path, {"D": 10})
    assert first is not None and path.holds(first) and first["D"] == 2 * first["E"]
    second = s.solve(path, {"D": 10}, avoid=[first])
    assert second is not None and second != first and path.holds(second)
    assert s.solve(SizePath("D", "one"), {}) is None  # D = 1 is odd


# ---------------------------------------------------------------------------
# a path the assumptions exclude


def test_an_excluded_ragged_tail_is_reported_and_fails_unless_accepted():
    rep = tn.validate(whole_blocks, cases=8, seed=0)
    assert rep.compared == 8 and rep.status == "unreached" and not rep.ok, rep.summary()
    (u,) = rep.unreached
    assert (u.path.sym, u.path.kind, u.path.tile, u.cause) == ("D", "multi", 64, "assumptions")
    assert "not reached: D at three 64-tiles and a ragged tail" in rep.summary()
    assert "no ragged tail" in rep.summary()
    ok = tn.validate(whole_blocks, cases=8, seed=0, accept_unreached=True)
    assert ok.ok and ok.status == "ok"
    assert "not reached (accepted): D at three 64-tiles" in ok.summary()


def test_too_few_cases_and_a_limit_are_notes_not_failures():
    rep = tn.validate(even_rows, cases=1, seed=0)
    assert rep.ok and [u.cause for u in rep.unreached] == ["cases"], rep.summary()
    assert "note: not reached: D at three 16-tiles" in rep.summary()
    rep = tn.validate(even_rows, cases=4, seed=0, limit=40)
    assert rep.ok and [u.cause for u in rep.unreached] == ["limit"], rep.summary()


KERNEL_FILE = '''\
import tilenest as tn
from tilenest import f32


@tn.kernel
def whole_blocks(x: tn.Tensor[f32, "D"], y: tn.Tensor[f32, "D"]):
    (d,) = x.shape
    tn.assume(d % 64 == 0)
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(tn.cdiv(d, 64))):
        o = tn.coord(p.index() * 64)
        y(o, tn.shape(64)).store(x[o, tn.shape(64), tn.bounds.zero] * 2.0)
'''


def test_cli_exits_nonzero_on_an_unreached_path_and_zero_when_accepted(tmp_path, capsys):
    f = tmp_path / "k.py"
    f.write_text(KERNEL_FILE)
    rc = main(["validate", str(f), "--cases", "6"])
    out = capsys.readouterr().out
    assert rc == 1, out
    assert "UNREACHED whole_blocks" in out and "--accept-unreached" in out, out
    rc = main(["validate", str(f), "--cases", "6", "--accept-unreached", "--json"])
    (r,) = json.loads(capsys.readouterr().out)["reports"]
    assert rc == 0 and r["status"] == "ok"
    (u,) = r["unreached"]
    assert u["symbol"] == "D" and u["cause"] == "assumptions" and u["accepted"]


def test_a_required_path_may_take_a_larger_case_and_is_reported_when_none_fits():
    cases = generate(square_blocks.program, 6, seed=0)
    big = [c.size for c in cases if _multi(c.syms["D"], 128)]
    small = [c.size for c in cases if not _multi(c.syms["D"], 128)]
    assert big and all(MAX_ELEMENTS < n <= REQUIRED_ELEMENTS for n in big), big
    assert all(n <= MAX_ELEMENTS for n in small), small
    rep = tn.validate(cube_blocks, cases=4, seed=0)
    assert rep.status == "unreached" and not rep.ok, rep.summary()
    (u,) = rep.unreached
    assert u.cause == "budget" and str(REQUIRED_ELEMENTS) in u.why, rep.summary()
