"""Validation sizes come from the kernel's tiles, and a validation that
compares nothing is a failure: the generator reaches every tiled dim's
multi-tile path (three tiles and a ragged tail), 0 and 1; the report lists
the sizes and schedules it compared; a file's kernels are each reported, a
refused one included."""

from __future__ import annotations

import json

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.cli import main
from tilenest.validation.inputs import (
    MAX_ELEMENTS,
    coverage_targets,
    generate,
    multi_tile_size,
    tile_sizes,
)


@tn.kernel
def online_lse(x: tn.Tensor[f32, "R V"], out: tn.Tensor[f32, "R"], *, bv=256):  # noqa: F821
    """log(sum(exp(x))) of each row, streamed over 256-wide vocabulary blocks
    with a running maximum (the online softmax recurrence)."""
    rows, vocab = x.shape
    r = x.dim(0)
    out = out.with_dims(r)
    for p in tn.parallel(tn.shape(rows)):
        m = tn.full(f32, tn.shape(1), -np.inf, dims=(r,))
        s = tn.zeros(f32, tn.shape(1), dims=(r,))
        for kb in p.serial(tn.shape(tn.cdiv(vocab, bv))):
            t = x[tn.coord(p.index(), kb.index() * bv), tn.shape(1, bv), tn.bounds.fill(-np.inf)]
            m_new = tn.maximum(m, tn.reduce(t, t.dim(1), tn.maximum))
            s = s * tn.exp(m - m_new) + tn.reduce(tn.exp(t - m_new), t.dim(1), tn.add)
            m = m_new
        out(tn.coord(p.index()), tn.shape(1)).store(m + tn.log(s))


@tn.kernel
def blocked_gemm(A: tn.Tensor[f32, "M K"], B: tn.Tensor[f32, "K N"], C: tn.Tensor[f32, "M N"],
                 *, bm=16, bn=8, bk=4):
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
            acc = tn.mma(a, b, acc)
        C(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(acc)


@tn.kernel
def never_sized(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    tn.assume(n > 100000)
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


def _multi_tile(v: int, t: int) -> bool:
    return v >= 3 * t and v % t != 0


# ---------------------------------------------------------------------------
# the generator


def test_tile_sizes_are_read_from_divisions_steps_and_tile_extents():
    assert tile_sizes(online_lse.program) == {"R": set(), "V": {256}}
    assert tile_sizes(blocked_gemm.program) == {"M": {16}, "K": {4}, "N": {8}}


def test_online_softmax_blocks_get_multi_block_sizes_0_and_1():
    cases = generate(online_lse.program, 20, seed=0)
    assert len(cases) == 20
    vs = {c.syms["V"] for c in cases}
    rs = {c.syms["R"] for c in cases}
    # the old pool stopped at 200: no case ever ran a second vocabulary block
    assert max(vs) > 512 and any(_multi_tile(v, 256) for v in vs), vs
    assert {0, 1, 255, 257}.issubset(vs), vs
    assert {0, 1}.issubset(rs), rs


def test_every_tiled_dim_reaches_three_tiles_and_a_ragged_tail():
    p = blocked_gemm.program
    cases = generate(p, 20, seed=5)
    for sym, t in (("M", 16), ("N", 8), ("K", 4)):
        vals = {c.syms[sym] for c in cases}
        assert any(_multi_tile(v, t) for v in vals), (sym, vals)
        assert {0, 1, t - 1, t + 1}.issubset(vals), (sym, vals)


def test_cases_stay_bounded_and_combinations_are_sampled():
    p = blocked_gemm.program
    cases = generate(p, 40, seed=1)
    assert all(c.size <= MAX_ELEMENTS for c in cases)
    # no case puts every symbol at its multi-tile size unless it fits the budget,
    # and the combinations differ (sampled, not one fixed product)
    assert len({tuple(sorted(c.syms.items())) for c in cases}) > 30


def test_coverage_targets_come_first_and_a_limit_caps_them():
    p = online_lse.program
    assert coverage_targets(p)[0] == {"V": multi_tile_size(256)}
    capped = generate(p, 10, seed=0, limit=100)
    assert all(c.syms["V"] <= 100 and c.syms["R"] <= 100 for c in capped)


# ---------------------------------------------------------------------------
# the report


def test_online_softmax_validates_on_multi_block_sizes():
    rep = tn.validate(online_lse, cases=8, seed=0)
    assert rep.ok, rep.summary()
    assert max(rep.sizes()["V"]) > 512
    assert "sizes compared: R in {" in rep.summary()
    assert "reference batched" in rep.summary()


def test_nothing_compared_is_not_ok():
    rep = tn.validate(never_sized, cases=5)
    assert rep.results == [] and rep.compared == 0
    assert not rep.ok and rep.status == "nothing compared"
    assert "assumptions reject every size" in rep.summary()
    rep0 = tn.validate(online_lse, cases=0)
    assert not rep0.ok and rep0.status == "nothing compared"


def test_reference_schedule_passes_through(monkeypatch):
    import tilenest.interpreter as interp

    seen = []
    real = interp.reference

    def spy(*a, **kw):
        seen.append(kw.get("schedule"))
        return real(*a, **kw)

    monkeypatch.setattr(interp, "reference", spy)
    rep = tn.validate(blocked_gemm, cases=2, schedule="canonical")
    assert rep.ok and rep.reference_schedule == "canonical", rep.summary()
    assert seen == ["canonical", "canonical"]
    rep = tn.validate(blocked_gemm, cases=1, schedule=tn.interpreter.random(3))
    assert rep.reference_schedule == "random:3" and seen[-1].kind == "random"


# ---------------------------------------------------------------------------
# the command line

TWO_KERNELS = '''\
import tilenest as tn
from tilenest import f32


@tn.kernel
def racy(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(0), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])


@tn.kernel
def double(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(tn.cdiv(n, 8))):
        o = tn.coord(p.index() * 8)
        y(o, tn.shape(8)).store(x[o, tn.shape(8), tn.bounds.zero] * 2.0)


@tn.kernel
def never_sized(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    tn.assume(n > 100000)
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])
'''


def test_cli_reports_every_kernel_of_a_file(tmp_path, capsys):
    f = tmp_path / "three.py"
    f.write_text(TWO_KERNELS)
    rc = main(["validate", str(f), "--cases", "4"])
    out = capsys.readouterr().out
    assert rc == 1
    # the refused kernel (a refuted race) does not hide the others
    assert "refused racy: race" in out, out
    assert "validated double: 4 case(s) compared" in out, out
    assert "sizes: N in {" in out and "schedules: compiled" in out
    assert "NOTHING COMPARED never_sized" in out
    rc = main(["validate", str(f), "--cases", "4", "--kernel", "double", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 0
    (r,) = d["reports"]
    assert r["status"] == "ok" and r["compared"] == 4
    assert any(v >= 3 * 8 and v % 8 for v in r["sizes"]["N"]), r["sizes"]
    assert r["schedules"]["reference"] == "batched"


def test_cli_nothing_compared_exits_1(tmp_path, capsys):
    f = tmp_path / "k.py"
    f.write_text(TWO_KERNELS)
    rc = main(["validate", str(f), "--kernel", "never_sized"])
    out = capsys.readouterr().out
    assert rc == 1 and "NOTHING COMPARED" in out and "assumptions" in out


@pytest.mark.parametrize("argv", [["--cases", "0"], ["--cases", "-1"], ["--limit", "0"]])
def test_cli_counts_that_compare_nothing_are_usage_errors(tmp_path, capsys, argv):
    f = tmp_path / "k.py"
    f.write_text(TWO_KERNELS)
    rc = main(["validate", str(f), "--kernel", "double", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and argv[0] in err and "Traceback" not in err


def test_a_tilenest_bug_while_compiling_is_exit_70_with_the_report_hint(capsys):
    """A compile that hits a bug of tilenest is not an ordinary refusal: the
    verdict line keeps the error's hint (asking for a report) and the status is
    the CLI's internal-error status, whatever the other kernels did."""
    from types import SimpleNamespace

    from tilenest.errors import InternalError
    from tilenest.validation.report import run_cli

    def broken_schedule(a, p):
        raise InternalError("the lowering met an impossible case", None,
                            "this is a bug of tilenest; please report it")

    a = SimpleNamespace(json=False, cases=1, target="llvm", seed=0, limit=None)
    assert run_cli([("k", object())], a, broken_schedule) == 70
    out = capsys.readouterr().out
    assert "refused k: internal error" in out and "please report it" in out
