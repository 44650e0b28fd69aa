"""The ``roles.*`` obligations of warp-specialized rings (``proofs/gpu.py``:
:func:`~tilenest.proofs.gpu.roles_obligations`; ``loopir.Roles``).

They are computed from the ring as it stands -- the permission's fields, the
bulk copies' destination offsets, the consumers' mma operand offsets -- so
the lowering's rings prove, and a ring whose permission or offsets are
mutated is refuted with a counterexample step.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace

import pytest

import tilenest as tn
from tilenest.backends import cuda
from tilenest.errors import TilenestError
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import loopir as L
from tilenest.lowering import warp_roles as WR
from tilenest.proofs import gpu
from tilenest.proofs.obligation import PROVED, REFUTED, discharge
from tilenest.semantics import expr as E
from tilenest.workloads import WORKLOADS
from test_cuda_tma import BGEMM_SOURCE

KINDS = (gpu.ROLES_FULL, gpu.ROLES_VERSIONS, gpu.ROLES_RELEASE, gpu.ROLES_PARITY)


def _kernel(name="gemm", bm=128, bn=256, bk=64, **kw):  # type: ignore[no-untyped-def]
    params = {"bm": bm, "bn": bn, "bk": bk} | ({"loop": "pipeline"} if name != "bmm" else {})
    kern = WORKLOADS[name].kernel(tn.bf16, params)
    s = default_schedule(kern.program, "cuda", **{"mma_unit": "wgmma", "tma": True,
                                                  "warp_roles": True, "stages": 4, **kw})
    return lower_verified(kern.program, s)


@pytest.fixture(scope="module")
def gemm4() -> L.Kernel:
    return _kernel()


def _proofs(k: L.Kernel) -> list:
    return discharge(gpu.roles_obligations(k), timeout=5.0)


def _ring(k: L.Kernel) -> L.For:
    (loop,) = [s for ph in k.phases for s in L.walk(ph.body)
               if isinstance(s, L.For) and s.roles is not None]
    return loop


def _with_ring(k: L.Kernel, f) -> L.Kernel:  # type: ignore[no-untyped-def]
    """``k`` with its ring ``loop`` replaced by ``f(loop)``."""
    def fs(s):  # type: ignore[no-untyped-def]
        return (f(s),) if isinstance(s, L.For) and s.roles is not None else None

    return replace(k, phases=tuple(replace(ph, body=L.map_stmts(ph.body, lambda x: None, fs))
                                   for ph in k.phases))


def _roles(k: L.Kernel, **fields) -> L.Kernel:  # type: ignore[no-untyped-def]
    return _with_ring(k, lambda lp: replace(lp, roles=replace(lp.roles, **fields)))


def _mod3(e: E.Expr) -> E.Expr:
    """``e`` with every ``x % 4`` made ``x % 3`` (a ring one version short)."""
    if isinstance(e, E.Mod) and e.b == E.Const(4):
        return E.mod(_mod3(e.a), 3)
    if isinstance(e, (E.Sym, E.Var, E.Val, E.Const)):
        return e
    return e.rebuild(tuple(_mod3(c) for c in e.children))


def _short(body: tuple) -> tuple:
    return L.map_stmts(body, lambda x: L.IExpr(_mod3(x.e)) if isinstance(x, L.IExpr) else None)


def _refuted(obs: list, kind: str) -> list:
    bad = [o for o in obs if o.kind == kind and o.status == REFUTED]
    for o in bad:  # every refutation carries a re-checked counterexample and its text
        assert o.counterexample and o.checked and o.counterexample_lines()
    return bad


# ------------------------------------------------------------------ proved
@pytest.mark.parametrize("name,tile,kw", [
    ("gemm", (128, 256, 64), {"stages": 4}),
    ("gemm", (128, 128, 64), {"stages": 3}),
    ("gemm", (128, 128, 128), {"stages": 3}),
    ("gemm", (256, 128, 64), {"stages": 4, "block_threads": 512}),
    ("bmm", (128, 128, 64), {"stages": 4}),
], ids=["128x256x64-s4", "128x128x64-s3", "two-panels-s3", "512-threads", "batched"])
def test_the_lowerings_rings_are_proved(name, tile, kw):
    k = _kernel(name, *tile, **kw)
    obs = _proofs(k)
    assert [o.status for o in obs] == [PROVED] * len(obs)
    kinds = [o.kind for o in obs]
    # one mma reads each of the two operand rings; each ring has one copy
    assert kinds.count(gpu.ROLES_FULL) == 2 and kinds.count(gpu.ROLES_VERSIONS) == 2
    assert kinds.count(gpu.ROLES_RELEASE) == 2 and kinds.count(gpu.ROLES_PARITY) == 1


def test_the_claims_read_the_rings_own_offsets(gemm4):
    obs = gpu.roles_obligations(gemm4)
    full = [o.formula for o in obs if o.kind == gpu.ROLES_FULL]
    versions = [o.formula for o in obs if o.kind == gpu.ROLES_VERSIONS]
    # the a operand's offset, its index local (the warpgroup) replaced by its value
    assert re.search(r"8192\*\(\$kk\.\d+ % 4\) <= 8192\*\(\$kk\.\d+ % 4\) .*"
                     r"4096\*\(\$t\.t\d+ // 128\)", full[0])
    assert "8192*($step.j % 4) + 8192 <= 8192*($step.i % 4)" in versions[0]
    assert "16384*($step.j % 4) + 16384 <= 16384*($step.i % 4)" in versions[1]


def test_bulk_copies_of_a_ring_keep_their_placement_obligations(gemm4):
    obs = cuda.tma_obligations(gemm4)
    kinds = [o.kind for o in obs]
    assert kinds.count(gpu.TMA_PLACEMENT) == 2 and gpu.TMA_PHASES not in kinds
    assert sum(k in KINDS for k in kinds) == 7
    assert all(o.status == PROVED for o in obs)


def test_a_kernel_without_a_ring_has_no_roles_obligations():
    kern = WORKLOADS["gemm"].kernel(tn.bf16, {"bm": 128, "bn": 128, "bk": 64,
                                              "loop": "pipeline"})
    k = lower_verified(kern.program, default_schedule(kern.program, "cuda", mma_unit="wgmma",
                                                      tma=True, stages=4, warp_roles=False))
    assert gpu.roles_obligations(k) == []


# ------------------------------------------------------------------ mutations
def test_a_consumer_that_does_not_wait_is_refuted(gemm4):
    obs = _proofs(_roles(gemm4, wait_full=False))
    bad = _refuted(obs, gpu.ROLES_FULL)
    assert len(bad) == 2
    assert all("do not wait for the full slot" in " ".join(o.counterexample_lines())
               for o in bad)
    assert all(o.status == PROVED for o in obs if o.kind != gpu.ROLES_FULL)


def test_a_slot_released_early_is_refuted(gemm4):
    """``release_lag = 0`` with one mma group kept in flight: the step is
    released while its own mmas may still read it."""
    obs = _proofs(_roles(gemm4, release_lag=0))
    (bad,) = _refuted(obs, gpu.ROLES_RELEASE)
    cx = bad.counterexample
    step = next(v for k, v in cx.items() if k.startswith("kk."))
    assert 0 <= step < (cx["K"] + 63) // 64  # a real step of the ring
    assert "release step" in " ".join(bad.counterexample_lines())
    # the producer may then overwrite the version S steps back while it is read
    for o in _refuted(obs, gpu.ROLES_VERSIONS):
        assert o.counterexample["step.j"] - o.counterexample["step.i"] == 4


@pytest.mark.parametrize("stages", [5, 6])
def test_more_slots_than_versions_are_refuted(gemm4, stages):
    """``Roles.stages`` larger than the 4 versions of the buffers: the producer
    runs a step ahead onto a version still read, and the rings outgrow the
    kernel's 8 barriers."""
    obs = _proofs(_roles(gemm4, stages=stages))
    bad = _refuted(obs, gpu.ROLES_VERSIONS)
    assert len(bad) == 2
    for o in bad:
        cx = o.counterexample
        assert cx["step.j"] - cx["step.i"] == 4  # the same version, fewer than S steps apart
        assert "may still read the tile of step" in " ".join(o.counterexample_lines())
    (par,) = _refuted(obs, gpu.ROLES_PARITY)
    assert par.counterexample["step.n"] % stages + stages >= 8


def test_a_ring_one_version_short_is_refuted(gemm4):
    """Every ``% 4`` of the ring made ``% 3``: copies and mmas agree, but the
    producer's step ``i + 3`` overwrites the version of step ``i``."""
    k = _with_ring(gemm4, lambda lp: replace(lp, body=_short(lp.body)))
    obs = _proofs(k)
    bad = _refuted(obs, gpu.ROLES_VERSIONS)
    assert len(bad) == 2 and all(o.counterexample["step.j"] - o.counterexample["step.i"] == 3
                                 for o in bad)
    assert all(o.status == PROVED for o in obs if o.kind == gpu.ROLES_FULL)


def test_mmas_reading_another_version_are_refuted(gemm4):
    """Only the consumer's offsets made ``% 3``: from step 3 on its mmas read
    a version the producer did not copy at that step."""
    k = _with_ring(gemm4, lambda lp: replace(lp, body=lp.body[:1] + _short(lp.body[1:])))
    obs = _proofs(k)
    bad = _refuted(obs, gpu.ROLES_FULL)
    assert len(bad) == 2
    for o in bad:
        step = next(v for key, v in o.counterexample.items() if key.startswith("kk."))
        assert step % 3 != step % 4
        assert "outside the tiles the producer copies" in " ".join(o.counterexample_lines())


def test_a_step_without_its_copy_is_refuted(gemm4):
    """The producer skips the copies of the last step (its guard ``i + 1 <
    hi``): the consumers read a tile nobody wrote at that step."""
    def drop_last(lp):  # type: ignore[no-untyped-def]
        i = E.Var(lp.var.name)
        head = replace(lp.body[0], cond=L.IPred(E.add(i, 1).lt(lp.hi)))
        return replace(lp, body=(head,) + lp.body[1:])

    obs = _proofs(_with_ring(gemm4, drop_last))
    for o in _refuted(obs, gpu.ROLES_FULL):
        cx = o.counterexample
        step = next(v for key, v in cx.items() if key.startswith("kk."))
        assert step == (cx["K"] + 63) // 64 - 1
    assert len(_refuted(obs, gpu.ROLES_FULL)) == 2


@pytest.mark.parametrize("fields", [{"release_lag": 4}, {"stages": 1}],
                         ids=["lag-S", "one-slot"])
def test_a_release_the_producer_waits_for_forever_is_refuted(gemm4, fields):
    """The release the producer waits for at step ``j`` would come at the
    consumers' step ``j`` or later, whose full wait needs the producer's
    step ``j``: a deadlock."""
    obs = _proofs(_roles(gemm4, **fields))
    (bad,) = _refuted(obs, gpu.ROLES_RELEASE)
    S = fields.get("stages", 4)
    assert bad.counterexample["step.j"] >= S
    assert "deadlock" in " ".join(bad.counterexample_lines())


def test_consumers_fewer_than_the_consumer_threads_are_refuted(gemm4):
    obs = _proofs(_roles(gemm4, consumers=128))
    bad = _refuted(obs, gpu.ROLES_FULL)
    assert len(bad) == 2
    assert all(next(v for k, v in o.counterexample.items() if k.startswith("t.")) >= 128
               for o in bad)


def test_too_few_ring_barriers_are_refuted(gemm4):
    k = replace(gemm4, locals=tuple(replace(b, size=E.Const(6)) if b.name == WR.ROLE_BARRIERS
                                    else b for b in gemm4.locals))
    obs = _proofs(k)
    (bad,) = _refuted(obs, gpu.ROLES_PARITY)
    assert bad.counterexample["step.n"] % 4 + 4 >= 6
    assert all(o.status == PROVED for o in obs if o.kind != gpu.ROLES_PARITY)


def test_a_refuted_roles_obligation_refuses_the_compile(monkeypatch):
    """A lowering whose rings release ``S`` steps late (a deadlock) is not
    compiled: the refuted ``roles.release`` is an error naming it."""
    made = L.Roles
    monkeypatch.setattr(L, "Roles", lambda *a, **kw: made(*a, **{**kw, "release_lag": a[0]}))
    kern = WORKLOADS["gemm"].kernel(tn.bf16, {"bm": 128, "bn": 128, "bk": 64,
                                              "loop": "pipeline"})
    s = default_schedule(kern.program, "cuda", mma_unit="wgmma", tma=True, warp_roles=True,
                         stages=4)
    with pytest.raises(TilenestError, match=r"roles\.release"):
        cuda.compile_program(kern.program, s, device="emulated", cache=False)


# ------------------------------------------------------------------ command line
def test_check_reports_the_roles_obligations(tmp_path):
    src = tmp_path / "bgemm.py"
    src.write_text(BGEMM_SOURCE)
    r = subprocess.run([sys.executable, "-m", "tilenest.cli", "check", str(src), "--target",
                        "cuda", "--set", "tma=True", "--set", "warp_roles=True", "--set",
                        "stages=4", "--set", "mma_unit=wgmma"],
                       capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    for kind, n in (("full", 2), ("versions", 2), ("release", 2), ("parity", 1)):
        assert len(re.findall(rf"roles\.{kind} +proved", r.stdout)) == n, r.stdout
    assert len(re.findall(r"tma\.placement +proved", r.stdout)) == 2
    assert not re.search(r"roles\.\w+ +(refuted|unknown)", r.stdout)


def test_an_mma_that_skips_steps_is_refuted(gemm4):
    """The consumer's mma only at even steps: at an odd step the newest mma
    group, kept in flight, is the previous step's, which is released."""
    def even(lp):  # type: ignore[no-untyped-def]
        r = lp.roles
        cond = L.IPred(E.mod(E.Var(lp.var.name), 2).eq(0))
        body = lp.body[:r.split + 1] + (L.If(cond, r.consume(lp)),) + lp.body[-1:]
        return replace(lp, body=body)

    obs = _proofs(_with_ring(gemm4, even))
    bad = _refuted(obs, gpu.ROLES_RELEASE)
    assert len(bad) == 1 and "does not run at every step" in " ".join(
        bad[0].counterexample_lines())


def test_an_index_read_from_data_is_never_refuted_nor_proved(gemm4):
    """An mma offset plus a local assigned a data value: the claim over an
    unknown value is not proved, and its counterexample (any value) is not
    known to be one of the program's, so the verdict is unknown."""
    u = L.LVar("u.9", L.INDEX)

    def shift(s):  # type: ignore[no-untyped-def]
        if not isinstance(s, L.WarpMma):
            return None
        return (L.Assign(u, L.Const(1.5, tn.f32)),
                replace(s, a=replace(s.a, offset=E.add(s.a.offset, E.Var(u.name)))))

    k = _with_ring(gemm4, lambda lp: replace(lp, body=L.map_stmts(lp.body, lambda x: None,
                                                                  shift)))
    obs = _proofs(k)
    (full,) = [o for o in obs if o.kind == gpu.ROLES_FULL and o.status != PROVED]
    assert full.status == "unknown" and "u.9" in full.reason


def test_the_producer_warp_counts_in_the_threads_per_block():
    """1024 consumers and the producer warp are 1056 threads: more than a
    block may have, whatever the sizes (the schedule never launches)."""
    k = _kernel("gemm", 256, 256, 64, stages=3, block_threads=1024)
    obs = discharge(gpu.thread_limits(k))
    widths = {o.title.split(": ")[1].split(" threads")[0]: o.status for o in obs
              if "threads per block" in o.title}
    assert widths == {"1024": PROVED, "1056": REFUTED}
    assert [o.title for o in gpu.never_launchable(obs)] == \
        ["gemm_0: 1056 threads per block (1..1024, a multiple of 32)"]
