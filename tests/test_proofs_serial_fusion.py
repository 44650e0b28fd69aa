"""Fusion of sibling serial regions (T-8): ``serial_i(A(i)); serial_j(B(j))``
becomes ``serial_i(A(i); B(i))`` iff every dependence edge ``A(i) -> B(j)``
has ``i <= j`` in iteration order. The transform states ``fusion.order``
(decided for symbolic sizes), ``fusion.state`` and ``rewrite``; a legal fusion
computes what the source computes (checked on the interpreter), and each
refuted one has a real reversed edge."""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.proofs.obligation import EXIT_REFUTED, PROVED, REFUTED
from tilenest.proofs.remap import TransformError
from tilenest.proofs.report import check

N = "N"


@tn.kernel
def pointwise(x: tn.Tensor[f32, N], t: tn.Tensor[f32, N], y: tn.Tensor[f32, N]):
    (n,) = x.shape
    for a in tn.serial(tn.shape(n)):
        t(tn.coord(a.index()), tn.shape(1)).store(x[tn.coord(a.index()), tn.shape(1)] + 1.0)
    for b in tn.serial(tn.shape(n)):
        y(tn.coord(b.index()), tn.shape(1)).store(t[tn.coord(b.index() - 1), tn.shape(1)] * 2.0
                                                  + t[tn.coord(b.index()), tn.shape(1)])


@tn.kernel
def reads_ahead(x: tn.Tensor[f32, N], t: tn.Tensor[f32, N], y: tn.Tensor[f32, N]):
    (n,) = x.shape
    for a in tn.serial(tn.shape(n)):
        t(tn.coord(a.index()), tn.shape(1)).store(x[tn.coord(a.index()), tn.shape(1)] + 1.0)
    for b in tn.serial(tn.shape(n)):      # B(j) reads what A(j + 1) writes: i > j
        y(tn.coord(b.index()), tn.shape(1)).store(t[tn.coord(b.index() + 1), tn.shape(1)])


@tn.kernel
def war_ahead(x: tn.Tensor[f32, N], t: tn.Tensor[f32, N], y: tn.Tensor[f32, N]):
    (n,) = x.shape
    for a in tn.serial(tn.shape(n)):      # A(i) reads t[i + 1] before B(i + 1) writes it
        y(tn.coord(a.index()), tn.shape(1)).store(t[tn.coord(a.index() + 1), tn.shape(1)])
    for b in tn.serial(tn.shape(n)):
        t(tn.coord(b.index()), tn.shape(1)).store(x[tn.coord(b.index()), tn.shape(1)])


@tn.kernel
def war_behind(x: tn.Tensor[f32, N], t: tn.Tensor[f32, N], y: tn.Tensor[f32, N]):
    (n,) = x.shape
    for a in tn.serial(tn.shape(n)):      # A(i) reads t[i - 1], which B(i - 1) overwrites
        y(tn.coord(a.index()), tn.shape(1)).store(t[tn.coord(a.index() - 1), tn.shape(1)])
    for b in tn.serial(tn.shape(n)):
        t(tn.coord(b.index()), tn.shape(1)).store(x[tn.coord(b.index()), tn.shape(1)])


@tn.kernel
def waw_behind(x: tn.Tensor[f32, N], t: tn.Tensor[f32, N], y: tn.Tensor[f32, N]):
    (n,) = x.shape
    for a in tn.serial(tn.shape(n)):      # A(i) writes t[i]; B(i - 1) writes it too
        t(tn.coord(a.index()), tn.shape(1)).store(x[tn.coord(a.index()), tn.shape(1)])
    for b in tn.serial(tn.shape(n)):
        t(tn.coord(b.index() + 1), tn.shape(1)).store(x[tn.coord(b.index()), tn.shape(1)] * 3.0)


@tn.kernel
def carried(x: tn.Tensor[f32, N], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
    (n,) = x.shape
    d = x.dim(0)
    s = tn.zeros(f32, tn.shape(1), dims=(d,))
    r = tn.full(f32, tn.shape(1), 1.0, dims=(d,))
    for a in tn.serial(tn.shape(n)):
        s = s + x[tn.coord(a.index()), tn.shape(1)]
    for b in tn.serial(tn.shape(n)):
        r = r * 0.5 + x[tn.coord(b.index()), tn.shape(1)]
    y(tn.coord(0), tn.shape(1)).store(s)
    z(tn.coord(0), tn.shape(1)).store(r)


@tn.kernel
def uses_final(x: tn.Tensor[f32, N], y: tn.Tensor[f32, N]):
    (n,) = x.shape
    d = x.dim(0)
    s = tn.zeros(f32, tn.shape(1), dims=(d,))
    for a in tn.serial(tn.shape(n)):
        s = s + x[tn.coord(a.index()), tn.shape(1)]
    for b in tn.serial(tn.shape(n)):      # every B(j) needs the total of all A(i)
        y(tn.coord(b.index()), tn.shape(1)).store(x[tn.coord(b.index()), tn.shape(1)] / s)


@tn.kernel
def rev_ok(x: tn.Tensor[f32, N], t: tn.Tensor[f32, N], y: tn.Tensor[f32, N]):
    (n,) = x.shape
    for a in tn.serial(tn.shape(n), order="reverse"):
        t(tn.coord(a.index()), tn.shape(1)).store(x[tn.coord(a.index()), tn.shape(1)] + 1.0)
    for b in tn.serial(tn.shape(n), order="reverse"):   # A(j + 1) runs before B(j)
        y(tn.coord(b.index()), tn.shape(1)).store(t[tn.coord(b.index() + 1), tn.shape(1)])


@tn.kernel
def rev_bad(x: tn.Tensor[f32, N], t: tn.Tensor[f32, N], y: tn.Tensor[f32, N]):
    (n,) = x.shape
    for a in tn.serial(tn.shape(n), order="reverse"):
        t(tn.coord(a.index()), tn.shape(1)).store(x[tn.coord(a.index()), tn.shape(1)] + 1.0)
    for b in tn.serial(tn.shape(n), order="reverse"):
        y(tn.coord(b.index()), tn.shape(1)).store(t[tn.coord(b.index() - 1), tn.shape(1)])


@tn.kernel
def grid_bad(x: tn.Tensor[f32, "R C"], t: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    for a in tn.serial(tn.shape(rows, cols)):
        c = tn.coord(a.index(0), a.index(1))
        t(c, tn.shape(1, 1)).store(x[c, tn.shape(1, 1)] + 1.0)
    for b in tn.serial(tn.shape(rows, cols)):   # (i, j + 1) comes after (i, j)
        y(tn.coord(b.index(0), b.index(1)), tn.shape(1, 1)).store(
            t[tn.coord(b.index(0), b.index(1) + 1), tn.shape(1, 1)])


@tn.kernel
def grid_ok(x: tn.Tensor[f32, "R C"], t: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    for a in tn.serial(tn.shape(rows, cols)):
        c = tn.coord(a.index(0), a.index(1))
        t(c, tn.shape(1, 1)).store(x[c, tn.shape(1, 1)] + 1.0)
    for b in tn.serial(tn.shape(rows, cols)):   # the previous row is complete
        y(tn.coord(b.index(0), b.index(1)), tn.shape(1, 1)).store(
            t[tn.coord(b.index(0) - 1, b.index(1) + 1), tn.shape(1, 1)])


@tn.kernel
def memory_chain(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    m = tn.memory(f32, tn.shape(2))
    for a in tn.serial(tn.shape(1)):
        m.store(x[tn.coord(0), tn.shape(2)])
    for b in tn.serial(tn.shape(1)):
        m.store(m.load() * 3.0)
    y(tn.coord(0), tn.shape(2)).store(m.load())


@tn.kernel
def memory_chain_bad(x: tn.Tensor[f32, N], y: tn.Tensor[f32, N]):
    (n,) = x.shape
    tn.assume(n >= 1)
    m = tn.memory(f32, tn.shape(1))
    for a in tn.serial(tn.shape(n)):
        m.store(x[tn.coord(a.index()), tn.shape(1)])
    for b in tn.serial(tn.shape(n)):     # every B(j) must see A's last store
        y(tn.coord(b.index()), tn.shape(1)).store(m.load())


def _fused(k, index=0):
    t = tn.transform.fuse_serial(k, index).check(timeout=5.0)
    return t, {o.kind: o for o in t.obligations if o.status != PROVED}


def _run(prog, *arrays):
    arrs = [a.copy() for a in arrays]
    tn.interpret(prog, *arrs)
    return arrs


def _inputs(n, *shape_of):
    rng = np.random.default_rng(n)
    return [rng.standard_normal(s).astype(np.float32) for s in shape_of]


@pytest.mark.parametrize("k", [pointwise, war_ahead, carried, rev_ok, grid_ok, memory_chain],
                         ids=lambda k: k.fn.__name__)
def test_legal_fusion_is_proved_and_keeps_the_result(k):
    t, bad = _fused(k)
    assert not bad, {o.kind: (o.status, o.reason) for o in bad.values()}
    assert t.admitted and t.result is t.program
    fused = t.program
    assert sum(1 for o in fused.walk() if o.name == "serial") == \
        sum(1 for o in k.program.walk() if o.name == "serial") - 1
    for n in (0, 1, 2, 5, 9):
        if k in (grid_ok,):
            args = _inputs(n, (n, 3), (n, 3), (n, 3))
        elif k is carried:
            args = _inputs(n, (n,), (1,), (1,))
        elif k is memory_chain:
            args = _inputs(n, (2,), (2,))
        else:
            args = _inputs(n, (n,), (n,), (n,))
        want = _run(k.program, *args)
        got = _run(fused, *args)
        for w, g in zip(want, got, strict=True):
            assert np.array_equal(w, g, equal_nan=True), (k.fn.__name__, n)


@pytest.mark.parametrize("k", [reads_ahead, war_behind, waw_behind, rev_bad, grid_bad],
                         ids=lambda k: k.fn.__name__)
def test_reversed_edge_is_refuted_with_i_after_j(k):
    t, bad = _fused(k)
    ob = bad["fusion.order"]
    assert ob.status == REFUTED and ob.checked
    assert not t.admitted and t.result is k.program
    cx = ob.counterexample
    a = tuple(cx[v] for v in next(o for o in k.program.walk() if o.name == "serial")
              .attrs["vars"])
    b = tuple(cx[v + "'"] for v in [o for o in k.program.walk() if o.name == "serial"][1]
              .attrs["vars"])
    reverse = next(o for o in k.program.walk() if o.name == "serial").attrs["order"] == "reverse"
    assert (a < b) if reverse else (b < a), (a, b)
    text = "\n".join(ob.counterexample_lines())
    assert "would run before" in text
    # the refutation is real: at the counterexample's sizes the fused program differs
    params = {p: cx[p] for p in k.program.syms if p in cx}
    n = max(2, max(params.values(), default=2))
    shapes = {reads_ahead: [(n,)] * 3, war_behind: [(n,)] * 3, waw_behind: [(n,)] * 3,
              rev_bad: [(n,)] * 3, grid_bad: [(2, n), (2, n), (2, n)]}[k]
    args = _inputs(n, *shapes)
    want, got = _run(k.program, *args), _run(t.program, *args)
    assert any(not np.array_equal(w, g) for w, g in zip(want, got, strict=True))


def test_a_final_carried_value_blocks_fusion():
    t, bad = _fused(uses_final)
    ob = bad["fusion.state"]
    assert ob.status == REFUTED and "last iteration" in ob.reason
    assert t.program is None and t.result is uses_final.program


def test_a_memory_read_after_the_first_region_blocks_fusion():
    """B loads the state A's last store leaves: refuted twice over (the element
    edge A(i) -> B(j) for j < i, and the final state used by B)."""
    t, bad = _fused(memory_chain_bad)
    assert bad["fusion.order"].status == REFUTED and bad["fusion.order"].checked
    assert bad["fusion.state"].status == REFUTED
    assert "Memory %" in "\n".join(bad["fusion.order"].counterexample_lines())


def test_check_accepts_the_transform_spec():
    ok = check(pointwise, ["fuse_serial(0)"], timeout=5.0, include_program=False)
    assert ok.exit_status == 0 and any("fuse_serial" in s for s in ok.steps)
    bad = check(reads_ahead, ["fuse_serial(0)"], timeout=5.0, include_program=False)
    assert bad.exit_status == EXIT_REFUTED
    assert any(o.kind == "fusion.order" and o.status == REFUTED for o in bad.obligations)


def test_misuse_is_a_located_error():
    with pytest.raises(TransformError, match="no serial 5"):
        tn.transform.fuse_serial(pointwise, 5)
    with pytest.raises(TransformError, match="not directly followed"):
        tn.transform.fuse_serial(pointwise, 1)

    @tn.kernel
    def ragged(x: tn.Tensor[f32, N], y: tn.Tensor[f32, N]):
        (n,) = x.shape
        for a in tn.serial(tn.shape(n)):
            y(tn.coord(a.index()), tn.shape(1)).store(x[tn.coord(a.index()), tn.shape(1)])
        for b in tn.serial(tn.shape(n - 1)):
            y(tn.coord(b.index()), tn.shape(1)).store(x[tn.coord(b.index()), tn.shape(1)])

    with pytest.raises(TransformError, match="different domains") as ei:
        tn.transform.fuse_serial(ragged, 0)
    assert ei.value.sites


def test_compiled_schedule_applies_the_fusion_only_when_proved():
    x = np.arange(7, dtype=np.float32)
    k = pointwise.compile(target="llvm", transforms=("fuse_serial(0)",))
    want = _run(pointwise.program, x, np.zeros(7, np.float32), np.zeros(7, np.float32))
    t, y = np.zeros(7, np.float32), np.zeros(7, np.float32)
    k(x, t, y)
    assert np.array_equal(y, want[2]) and np.array_equal(t, want[1])
    with pytest.raises(tn.errors.TilenestError, match="fusion.order"):
        reads_ahead.compile(target="llvm", transforms=("fuse_serial(0)",))
