"""Prefetch of the next program's row (``backends/llvm/prefetch.py``).

Row kernels read a row from memory in a first pass and again from the cache
in later ones; the last such pass asks for the next program's row. A
prefetch cannot change results, so these tests check where the hints go
(only rows read in two passes or more, in the last of them, at the element
of program ``pid + 1``) and that the code carries them.
"""

from __future__ import annotations

import numpy as np

from tilenest.backends.llvm import prefetch as PF
from tilenest.backends.llvm import stage_serial
from tilenest.bench.kernels import kernels
from tilenest.lowering import default_schedule, lower_verified
from tilenest.semantics import expr as E

from test_llvm_vector import assembly


def _plan(name: str) -> tuple:
    prog = kernels()[name].program
    k = stage_serial(lower_verified(prog, default_schedule(prog, "llvm")))
    (ph,) = k.phases
    return ph, PF.plan(ph, frozenset(b.name for b in k.globals))


def _at(e: E.Expr, env: dict[str, int]) -> int:
    """``e`` with the named variables set (others 0), ``C = 100``."""
    vals = {v: env.get(v.name, 0) for v in E.leaves(e) if isinstance(v, E.Var)}
    return int(E.evaluate(e, {**vals, E.Sym("C"): 100}))


def test_softmax_prefetches_the_next_row_in_its_last_pass_over_x():
    ph, plan = _plan("softmax")
    (var, ps), = plan.items()
    (p,) = ps
    assert p.buf.name == "x"
    # the exp pass is the last loop reading x: the prefetch sits there
    loops = [s for s in _walk(ph.body) if getattr(s, "kind", None) == "vector"]
    reading = [f for f in loops if "x" in {ld.buf.name for ld in PF.loads(f.body)}]
    assert reading[-1].var.name == var and len(reading) == 2
    # and it addresses row pid + 1 at the same column
    (held,) = [s.var.name for s in ph.body if getattr(s, "var", None) is not None
               and getattr(s, "value", None) is not None
               and getattr(s.value, "e", None) == E.Var(ph.pid.name)]
    for pid, col in ((0, 0), (3, 17)):
        assert _at(p.index, {held: pid, var: col}) == (pid + 1) * 100 + col


def test_single_pass_rows_are_left_to_the_hardware():
    assert _plan("add")[1] == {}
    assert _plan("copy")[1] == {}


def test_rmsnorm_code_carries_the_hint():
    asm = assembly(kernels()["rmsnorm"], "x86-64-v4")
    assert "prefetcht1" in asm
    assert "prefetch" not in assembly(kernels()["add"], "x86-64-v4")


def test_results_unchanged_at_the_last_row():
    """The last program prefetches past the end of ``x``: a hint, no access."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 333)).astype(np.float32)
    y = np.empty_like(x)
    kernels()["softmax"].compile()(x, y)
    want = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(y, want / want.sum(1, keepdims=True), rtol=1e-6)


def _walk(body: tuple):
    for s in body:
        yield s
        for f in ("body", "then", "orelse", "pre"):
            yield from _walk(getattr(s, f, ()) or ())
