"""GPU obligations over the SIMT form of the loop IR: task maps and their
coverage, barrier sufficiency (every example kernel proved; deleted or
misplaced barriers refuted with the two threads and the element), and the
block resources (shared memory, threads, grid, registers) with their launch
preconditions."""

from __future__ import annotations

import importlib
import itertools
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tilenest.errors import TilenestError
from tilenest.lowering import default_schedule, lower_verified
from tilenest.lowering import loopir as L
from tilenest.proofs import formula as Fm
from tilenest.proofs.barriers import KIND, barrier_obligations, check_barriers
from tilenest.proofs.gpu import (
    LaunchError,
    launch_precondition,
    register_limits,
    shared_capacity,
    thread_limits,
)
from tilenest.proofs.obligation import PROVED, REFUTED, UNKNOWN, Obligation, discharge
from tilenest.proofs.taskmap import TaskMapError, repeat, spatial
from tilenest.semantics import dtypes as D
from tilenest.semantics import expr as E

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = [("softmax", "row_softmax"), ("rmsnorm", "rmsnorm"), ("gemm", "gemm"),
            ("ragged", "axpy"), ("two_level", "scale_rows"), ("folds", "folds"),
            ("memory_stage", "transpose_blocks"), ("causal_attention", "causal_attention"),
            ("causal_attention", "causal_attention_blocked")]


def simt(module: str, name: str, threads: int = 64, lanes: int = 1) -> L.Kernel:
    """The SIMT form of an example kernel (one element per thread and step
    unless ``lanes`` says otherwise: the barrier counts below are for that),
    its rows in shared memory (``row_registers=0``; the register split's
    shared part, indexed ``i * max(0, C - K V W)``, is not quasi-affine, and
    tests/test_row_registers.py covers it)."""
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        k = getattr(importlib.import_module(module), name)
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return lower_verified(k.program, default_schedule(k.program, "cuda", block_threads=threads,
                                                      vector_lanes=lanes, row_registers=0))


# ---------------------------------------------------------------------------
# task maps

n = E.Sym("n")


def test_atoms_have_their_shapes():
    s, r = spatial(4, 2), repeat(3, 5)
    assert (s.workers, s.steps, s.tasks) == ((4, 2), (1, 1), (4, 2))
    assert (r.workers, r.steps, r.tasks) == ((1, 1), (3, 5), (3, 5))
    p = r * s
    assert (p.workers, p.steps, p.tasks) == ((4, 2), (3, 5), (12, 10))
    assert p.assign((3, 1), (2, 4)) == (2 * 4 + 3, 4 * 2 + 1)


def test_simt_distribution_is_repeat_times_spatial():
    m = repeat(3) * spatial(8)
    got = {m.assign((t,), (r,)) for t in range(8) for r in range(3)}
    assert got == {(r * 8 + t,) for t in range(8) for r in range(3)}
    # symbolically: the worker is split as (t // 8, t % 8), exact on the worker box
    assert m.assign((E.Var("t"),), (E.Var("r"),)) == (E.Var("r") * 8 + E.Var("t") % 8,)


def test_product_is_associative():
    a, b, c = spatial(2, 3), repeat(2, 1) * spatial(1, 2), repeat(3, 2)
    left, right = (a * b) * c, a * (b * c)
    assert (left.workers, left.steps, left.tasks) == (right.workers, right.steps, right.tasks)
    for w in itertools.product(*(range(x) for x in left.workers)):
        for s in itertools.product(*(range(x) for x in left.steps)):
            assert left.assign(w, s) == right.assign(w, s)
    # and for symbolic extents, as a proved claim
    x, y = spatial(E.Sym("p")), repeat(E.Sym("q"))
    z = spatial(4)
    left, right = (x * y) * z, x * (y * z)
    w, s = (E.Var("w"),), (E.Var("s"),)
    box = Fm.conj(Fm.in_box(w, left.workers), Fm.in_box(s, left.steps))
    ob = Obligation("taskmap.assoc", "associativity", claim=Fm.Claim(
        ("w", "s"), box, Fm.eqs(left.assign(w, s), right.assign(w, s)),
        Fm.conj(Fm.atom(E.Sym("p").ge(1)), Fm.atom(E.Sym("q").ge(1)))))
    discharge([ob])
    assert ob.status == PROVED, ob.reason


def test_product_is_not_commutative():
    a, b = spatial(2), repeat(3)
    assert (a * b).tasks == (b * a).tasks == (6,)
    # worker 1 at step 0 runs task 3 of spatial * repeat but task 1 of repeat * spatial
    assert (a * b).assign((1,), (0,)) == (3,)
    assert (b * a).assign((1,), (0,)) == (1,)


def test_rank_mismatch_is_an_error():
    with pytest.raises(TaskMapError, match="equal ranks") as e:
        _ = spatial(4) * repeat(2, 3)
    assert isinstance(e.value, TilenestError)
    with pytest.raises(TaskMapError):
        spatial(4).coverage([n, n])


@pytest.mark.parametrize("W", [32, 256])
def test_coverage_of_the_simt_map_is_proved(W):
    ob = (repeat(E.cdiv(n, W)) * spatial(W)).coverage([n])
    discharge([ob])
    assert ob.status == PROVED, ob.reason


def test_coverage_2d_with_symbolic_extents():
    m = E.Sym("m")
    ob = (repeat(E.cdiv(m, 4), 1) * spatial(4, 8)).coverage([m, 8])
    discharge([ob])
    assert ob.status == PROVED, ob.reason


def test_coverage_that_misses_points_is_refuted():
    ob = (repeat(n // 32) * spatial(32)).coverage([n])
    discharge([ob])
    assert ob.status == REFUTED and ob.checked
    cx = ob.counterexample
    assert cx["n"] % 32 != 0 and 0 <= cx["x0"] < cx["n"]
    assert any("never covered" in line for line in ob.counterexample_lines())


def test_coverage_of_a_short_spatial_map_is_refuted():
    ob = spatial(32).coverage([n])
    discharge([ob])
    assert ob.status == REFUTED
    assert ob.counterexample["n"] > 32 and ob.counterexample["x0"] >= 32


# ---------------------------------------------------------------------------
# barrier sufficiency: the example kernels


@pytest.mark.parametrize("module,name", EXAMPLES)
def test_example_barriers_are_proved(module, name):
    k = simt(module, name)
    # provability, not speed: a budget a loaded 2-core machine meets
    obs = check_barriers(k, timeout=60.0)
    assert all(o.kind == KIND for o in obs)
    bad = [(o.status, o.title, o.reason, o.counterexample_lines()) for o in obs
           if o.status != PROVED]
    assert not bad


def _assert_linear(obs: list[Obligation]) -> None:
    """Every statement of ``obs`` that reads no data is quasi-affine (isl's)."""
    assert obs
    for o in obs:
        cs = o.claim.counterexample_set()
        assert o.decider is not None or Fm.is_affine(cs), (o.title, Fm.non_affine_terms(cs))


def test_program_coordinates_keep_gemm_obligations_affine():
    # gemm's programs form a 2-D grid of symbolic extents; stated over the
    # linear program id, its C store divided pid by ceil(N / 32) (a
    # nonlinear query z3 gave up on under load); over the grid's coordinates
    # every pair is quasi-affine, so isl decides it exactly
    k = simt("gemm", "gemm")
    obs = barrier_obligations(k)
    assert [o for o in obs if o.witness["buffer"] == "C"]
    assert all(o.decider is None for o in obs)  # no pair reads data
    _assert_linear(obs)
    assert not any(k.phases[0].pid.name in Fm.free_vars(o.claim.counterexample_set())
                   for o in obs)


@pytest.mark.parametrize("module,name", EXAMPLES)
def test_examples_barrier_statements_are_linear(module, name):
    # a row-major element `i*C + 64*r + t` splits into its row `i` and column
    # `64*r + t` when the guards bound the column by C: its lower bound 0
    # follows from its form (loop variables from 0, thread ids); attention's
    # flat offset `(l // E)*E + l % E` is `l` again: every statement of the
    # examples is linear, and isl decides it
    _assert_linear(barrier_obligations(simt(module, name)))


def test_nonnegative_by_form_only_where_it_is():
    from tilenest.proofs.barriers import _nonneg

    r, t, u, C = E.Var("r"), E.Var("t"), E.Var("u"), E.Sym("C")
    ok = frozenset({"r", "t"})
    assert _nonneg(64 * r + t, ok) and _nonneg(r * C + (t // 4) + t % 8 + 3, ok)
    assert not _nonneg(64 * r - t, ok)          # a negative coefficient
    assert not _nonneg(r + u, ok)               # u may be negative
    assert not _nonneg(r + t - 1, ok)           # a negative constant
    assert not _nonneg(r // E.Sym("S"), ok)     # a quotient by a symbol (maybe 0)


def test_a_column_bounded_by_its_loop_range_splits():
    # scan_fold's element `(256*r + t)*C + scan`: the column is a loop
    # variable whose range [0, C) bounds it, no guard needed
    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS["scan_fold"]
    k = wl.kernel(D.f32, dict(wl.schedules[0]))
    _assert_linear(barrier_obligations(lower_verified(k.program,
                                                      default_schedule(k.program, "cuda"))))


def test_recompose_only_where_the_identity_applies():
    from tilenest.proofs.barriers import _recompose

    r, t, S = E.Var("r"), E.Var("t"), E.Sym("S")
    a = 64 * r + t
    split = E.add(E.mul(E.floordiv(a, S), S), E.mod(a, S))
    assert _recompose(split) == a
    assert _recompose(E.add(E.mul(3, split), 5 * r)) == E.add(3 * a, 5 * r)
    lopsided = E.add(E.mul(E.floordiv(a, S), S), E.mul(2, E.mod(a, S)))
    assert _recompose(lopsided) == lopsided   # not the identity: left alone
    other = E.add(E.mul(E.floordiv(a, S), E.Sym("T")), E.mod(a, S))
    assert _recompose(other) == other


def test_a_race_between_programs_coordinates_names_the_program():
    # drop every barrier of gemm: the refutation names the program by its
    # linear id, recomputed from the grid coordinates of the counterexample
    k = simt("gemm", "gemm")
    ph = k.phases[0]
    strip = L.map_stmts(ph.body, lambda x: None,
                        lambda s: () if isinstance(s, L.Barrier) else None)
    bad = replace(k, phases=(replace(ph, body=strip),))
    obs = [o for o in check_barriers(bad) if o.status != PROVED]
    assert obs and any(o.status == REFUTED for o in obs)
    o = next(o for o in obs if o.status == REFUTED)
    pt, p = o.counterexample, ph.pid.name
    cols = -(-pt["N"] // 32)
    pid = pt[f"{p}[0]"] * cols + pt[f"{p}[1]"]
    assert 0 <= pt[f"{p}[1]"] < cols and 0 <= pid < -(-pt["M"] // 32) * cols
    assert any(line.startswith(f"program {p}={pid}: threads")
               for line in o.counterexample_lines())


def test_a_program_id_used_directly_is_tied_to_its_coordinates():
    # the grid hypothesis with pid itself in the statement: on a small grid
    # its points are exactly (pid, delinearized pid) for pid in the grid
    from tilenest.proofs.barriers import _program

    ph = L.Phase("p", (E.Const(3), E.Sym("n")), L.LVar("$pid", L.INDEX), ())
    f = _program(ph, {"$pid"})
    for n in range(1, 4):
        sols = {(p, c0, c1) for p in range(-2, 3 * n + 3) for c0 in range(-1, 4)
                for c1 in range(-1, n + 2)
                if Fm.evaluate(f, Fm.env_of({"$pid": p, "$pid[0]": c0, "$pid[1]": c1, "n": n},
                                            ["n"]))}
        assert sols == {(p, p // n, p % n) for p in range(3 * n)}
    # without pid, the box alone (delinearization is a bijection onto it)
    g = _program(ph, set())
    assert "$pid" not in Fm.free_vars(g) and Fm.is_affine(g)


def test_examples_state_obligations():
    # the proofs above are not vacuous: the reduction scratch and the row
    # buffer of softmax each give pairs
    obs = barrier_obligations(simt("softmax", "row_softmax"))
    bufs = {o.witness["buffer"] for o in obs}
    assert any(b.startswith("red_") for b in bufs)
    assert "%e.7" in bufs and "y" in bufs


def _drop_barrier(body: tuple, which: int) -> tuple:
    count = itertools.count()

    def fs(s):
        if isinstance(s, L.Barrier) and s.scope == "block" and next(count) == which:
            return ()
        return None

    return L.map_stmts(body, lambda x: None, fs)


def test_deleting_a_barrier_of_softmax_is_refuted():
    k = simt("softmax", "row_softmax")
    ph = k.phases[0]
    # the first barrier at phase level separates the store of the row max
    # (program level: thread 0) from the thread loop that reads it
    top = [i for i, s in enumerate(ph.body) if isinstance(s, L.Barrier)]
    assert top
    body = ph.body[:top[0]] + ph.body[top[0] + 1:]
    bad = replace(k, phases=(replace(ph, body=body),))
    obs = [o for o in check_barriers(bad) if o.status != PROVED]
    assert obs and all(o.status == REFUTED and o.checked for o in obs)
    o = obs[0]
    assert "%m.3" in o.title and "store %m.3" in o.title and "load %m.3" in o.title
    text = "\n".join(o.counterexample_lines())
    assert "threads 0 and" in text and "%m.3[0]" in text and "C = " in text


def test_every_deleted_softmax_barrier_is_checked():
    k = simt("softmax", "row_softmax")
    ph = k.phases[0]
    nb = sum(isinstance(s, L.Barrier) for s in L.walk(ph.body))
    verdicts = []
    for j in range(nb):
        bad = replace(k, phases=(replace(ph, body=_drop_barrier(ph.body, j)),))
        verdicts.append({o.status for o in check_barriers(bad)})
    # all but one are needed; the barrier between writing the exponentials and
    # reading them back is not (each thread reads the elements it wrote)
    assert sum(REFUTED in v for v in verdicts) == nb - 1
    assert all(UNKNOWN not in v for v in verdicts)


# ---------------------------------------------------------------------------
# barrier sufficiency: hand-built placements

W = 64
C = E.Sym("C")
f32 = D.f32


def _kernel(body, shared_size: int = W) -> L.Kernel:
    s = L.Buffer("s", f32, "shared", E.Const(shared_size))
    out = L.Buffer("out", f32, "global", E.mul(C, W), arg=0)
    pid = L.LVar("pid", D.i64)
    ph = L.Phase("ph", (C,), pid, body(s, out))
    return L.Kernel("hand", (L.Param("out", "tensor", f32, (C, E.Const(W))),), ("C",), (s,),
                    (ph,))


def _tloop(name: str, body) -> L.For:
    t = L.LVar(name, D.i64)
    return L.For(t, E.Const(0), E.Const(W), tuple(body(E.Var(name))), "thread", scope="block")


def _write_then_read(barrier: bool, inner: str = "none"):
    def body(s, out):
        def write(t):
            return [L.Store(s, L.IExpr(t), L.Const(1.0, f32))]

        def read(t):
            return [L.Store(out, L.IExpr(E.add(E.mul(E.Var("pid"), W), t)),
                            L.Load(s, L.IExpr(E.mod(t + 1, W))))]

        if inner == "none":
            return ((_tloop("t1", write),) + ((L.Barrier("block"),) if barrier else ())
                    + (_tloop("t2", read),))
        # one thread loop with the barrier inside it
        tv = E.Var("t")
        bar: tuple = (L.Barrier("block"),)
        if inner == "divergent":
            bar = (L.If(L.IPred(tv.eq(0)), bar),)
        return (_tloop("t", lambda t: write(t) + list(bar) + read(t)),)

    return _kernel(body)


def test_neighbour_read_without_barrier_is_refuted():
    obs = check_barriers(_write_then_read(barrier=False))
    bad = [o for o in obs if o.status == REFUTED]
    assert len(bad) == 1 and bad[0].checked
    cx = bad[0].counterexample
    t_w, t_r = cx["t1#1"], cx["t2#2"]
    assert t_w == (t_r + 1) % W and t_w != t_r
    text = "\n".join(bad[0].counterexample_lines())
    assert f"threads {t_w} and {t_r}" in text and f"s[{t_w}]" in text
    assert "store s[[$t1]]" in bad[0].title and "load s[[($t2 + 1) % 64]]" in bad[0].title


def test_neighbour_read_with_barrier_is_proved():
    obs = check_barriers(_write_then_read(barrier=True))
    assert obs and all(o.status == PROVED for o in obs)
    # the separated pair states no obligation; the self-pairs remain
    assert not any("load s" in o.title for o in obs)


def test_barrier_inside_a_thread_loop():
    obs = check_barriers(_write_then_read(barrier=False, inner="uniform"))
    assert all(o.status == PROVED for o in obs) and not any("load s" in o.title for o in obs)
    # under `if t == 0` the barrier is divergent: it separates nothing
    obs = check_barriers(_write_then_read(barrier=False, inner="divergent"))
    assert any(o.status == REFUTED and "load s" in o.title for o in obs)


def _in_loop(barriers: tuple[bool, bool]):
    """``for i in [0, 4): [barrier]; write s[t]; barrier?; read s[t+1 mod W]``."""
    def body(s, out):
        w = _tloop("t1", lambda t: [L.Store(s, L.IExpr(t), L.Const(1.0, f32))])
        r = _tloop("t2", lambda t: [L.Store(out, L.IExpr(E.add(E.mul(E.Var("pid"), W), t)),
                                            L.Load(s, L.IExpr(E.mod(t + 1, W))))])
        inner = ((L.Barrier("block"),) if barriers[0] else ()) + (w, L.Barrier("block"), r)
        return (L.For(L.LVar("i", D.i64), E.Const(0), E.Const(4), inner, "serial"),)

    return _kernel(body)


def test_loop_carried_conflict_needs_a_barrier_at_the_loop_start():
    obs = check_barriers(_in_loop((False, True)))
    bad = [o for o in obs if o.status == REFUTED]
    assert len(bad) == 1
    cx = bad[0].counterexample
    # the read of iteration i races with the write of iteration i + 1
    assert cx["i#1"] == cx["i#2"] + 1
    obs = check_barriers(_in_loop((True, True)))
    assert all(o.status == PROVED for o in obs)


def _stride_loop(reverse: bool, ahead: int):
    """``for i in [1, 7) (reverse?): write s[i] (thread 0); barrier; read
    s[i + ahead] (thread 1)``: the read of one iteration and the write of
    the next in run order share an interval."""
    def body(s, out):
        iv = E.Var("i")
        w = _tloop("t1", lambda t: [L.If(L.IPred(t.eq(0)), (
            L.Store(s, L.IExpr(iv), L.Const(1.0, f32)),))])
        r = _tloop("t2", lambda t: [L.If(L.IPred(t.eq(1)), (
            L.Store(out, L.IExpr(E.add(E.mul(E.Var("pid"), W), t)),
                    L.Load(s, L.IExpr(E.add(iv, ahead)))),))])
        return (L.For(L.LVar("i", D.i64), E.Const(1), E.Const(7), (w, L.Barrier("block"), r),
                      "serial", reverse),)

    return _kernel(body)


@pytest.mark.parametrize("reverse", [False, True], ids=["ascending", "descending"])
def test_loop_carried_conflict_follows_the_run_order(reverse):
    """The next iteration of a descending loop is ``i - 1``: a read of
    ``s[i - 1]`` races with the next iteration's write there (refuted), a
    read of ``s[i + 1]`` does not (proved) -- and the other way round for an
    ascending loop; only the next iteration counts (one barrier per
    iteration), so a read two ahead is proved either way."""
    racy, safe = (-1, 1) if reverse else (1, -1)
    bad = [o for o in check_barriers(_stride_loop(reverse, racy)) if o.status == REFUTED]
    assert len(bad) == 1 and "load s" in bad[0].title
    cx = bad[0].counterexample
    step = -1 if reverse else 1
    assert cx["i#1"] + step == cx["i#2"] or cx["i#2"] + step == cx["i#1"]
    for ahead in (safe, 2 * racy):
        obs = check_barriers(_stride_loop(reverse, ahead))
        assert not [o for o in obs if o.status == REFUTED], ahead


def test_program_level_store_races_with_thread_loop_read():
    def body(s, out):
        st = L.Store(s, L.IExpr(E.Const(0)), L.Const(2.0, f32))
        rd = _tloop("t", lambda t: [L.Store(out, L.IExpr(E.add(E.mul(E.Var("pid"), W), t)),
                                            L.Load(s, L.IExpr(E.Const(0))))])
        return (st, rd)

    obs = check_barriers(_kernel(body))
    bad = [o for o in obs if o.status == REFUTED]
    assert len(bad) == 1
    text = "\n".join(bad[0].counterexample_lines())
    assert "threads 0 and" in text and "s[0]" in text


def test_data_dependent_index_is_unknown():
    def body(s, out):
        j = L.LVar("j", D.i64)
        return (_tloop("t", lambda t: [
            L.Assign(j, L.Cast(L.Load(out, L.IExpr(t)), D.i64)),
            L.Store(s, L.IExpr(E.Var("j")), L.Const(1.0, f32))]),)

    obs = check_barriers(_kernel(body))
    assert obs and all(o.status == UNKNOWN for o in obs)
    assert any("reads data (j)" in o.reason for o in obs)


# ---------------------------------------------------------------------------
# resources


def test_shared_capacity_of_a_row_buffer_is_refuted_with_a_size():
    k = simt("softmax", "row_softmax")
    ob = shared_capacity(k)
    discharge([ob])
    assert ob.status == REFUTED and ob.checked
    c = ob.counterexample["C"]
    assert 4 * c > 232448 - 64
    pc = launch_precondition([ob])
    assert pc.holds({"R": 7, "C": 1000}) and not pc.holds({"R": 7, "C": c})
    with pytest.raises(LaunchError, match="shared memory"):
        pc.check({"R": 7, "C": c})


def test_shared_capacity_of_fixed_tiles_is_proved():
    ob = shared_capacity(simt("gemm", "gemm"))
    discharge([ob])
    assert ob.status == PROVED
    assert launch_precondition([ob]).trivial
    # the same tiles with a smaller limit: refuted (no symbols to name)
    ob = shared_capacity(simt("gemm", "gemm"), limit_bytes=8192)
    discharge([ob])
    assert ob.status == REFUTED


def test_alignment_rounds_each_buffer():
    k = _kernel(lambda s, out: (), shared_size=3)  # 12 bytes -> 16
    ob = shared_capacity(k, limit_bytes=15)
    discharge([ob])
    assert ob.status == REFUTED
    ob = shared_capacity(k, limit_bytes=16)
    discharge([ob])
    assert ob.status == PROVED


def test_thread_and_grid_limits():
    obs = discharge(thread_limits(simt("softmax", "row_softmax")))
    threads = [o for o in obs if "threads per block" in o.title]
    grid = [o for o in obs if "grid" in o.title]
    assert threads and all(o.status == PROVED for o in threads)
    assert grid and grid[0].status == REFUTED
    assert grid[0].counterexample["R"] > 2**31 - 1
    pc = launch_precondition(obs)
    assert pc.holds({"R": 10**6, "C": 5}) and not pc.holds({"R": 2**31, "C": 5})


def test_a_failing_launch_names_only_the_limits_it_breaks():
    obs = discharge([shared_capacity(simt("softmax", "row_softmax"))]
                    + thread_limits(simt("softmax", "row_softmax")))
    pc = launch_precondition(obs)
    assert len(pc.parts) == 2  # shared memory (C) and grid size (R)
    with pytest.raises(LaunchError) as e:
        pc.check({"R": 7, "C": 10**6})
    assert "shared memory per block" in str(e.value) and "grid size" not in str(e.value)
    with pytest.raises(LaunchError) as e:
        pc.check({"R": 2**31, "C": 5})
    assert "grid size" in str(e.value) and "shared memory" not in str(e.value)


def test_a_schedule_that_fits_no_size_is_refused_at_compile_time():
    from tilenest.backends import cuda
    from tilenest.backends.cuda.nvrtc import nvrtc_available

    if not nvrtc_available():
        pytest.skip("no NVRTC")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    gemm = importlib.import_module("gemm")
    k = gemm.gemm.specialize(bm=256, bn=256, bk=128)
    # 256 x 256 f32 accumulator and 8 versions of each 256 x 128 operand tile:
    # 2.4 MB of shared memory whatever M, N and K are
    with pytest.raises(TilenestError, match="does not fit the GPU: shared.capacity") as e:
        cuda.compile_program(k.program, device="emulated", stages=8, cache=False)
    err = e.value
    assert any("bytes of shared memory per block exceed 232448" in n for n in err.notes)
    assert "stages" in (err.hint or "")
    assert err.sites and "gemm.py" in str(err.sites[0])
    # the same tiles with the default versions fit: compiled, and no launch check of them
    ok = cuda.compile_program(gemm.gemm.specialize(bm=64, bn=64, bk=32).program,
                              device="emulated", cache=False)
    assert not any(p.what.endswith("shared memory per block") for p in ok.precondition.parts)


@pytest.mark.parametrize("width,ok", [(32, True), (1024, True), (48, False), (2048, False)])
def test_threads_per_block_must_be_warps_within_the_limit(width, ok):
    def body(s, out):
        t = L.LVar("t", D.i64)
        return (L.For(t, E.Const(0), E.Const(width), (L.Store(s, L.IExpr(E.Const(0)),
                                                              L.Const(1.0, f32)),),
                      "thread", scope="block"),)

    obs = discharge(thread_limits(_kernel(body)))
    th = [o for o in obs if "threads per block" in o.title]
    assert len(th) == 1 and th[0].status == (PROVED if ok else REFUTED)


def test_register_limit():
    k = simt("softmax", "row_softmax", threads=576)
    name = k.phases[0].name
    ok, = discharge(register_limits(k, {name: 113}))
    assert ok.status == PROVED  # 113 * 576 = 65088
    # allocated in units of 8 per thread: 120 * 576 = 69120
    bad, = discharge(register_limits(k, {name: 113}, unit=8))
    assert bad.status == REFUTED and bad.counterexample["needed"] == 120 * 576
    bad, = discharge(register_limits(k, {name: 300}))
    assert bad.status == REFUTED and "172800" in bad.counterexample_lines()[0]
    with pytest.raises(TilenestError, match="no register count"):
        register_limits(k, {})


def test_gather_through_loaded_indices_is_unknown_not_a_crash():
    """An access whose element is computed from loaded data (a gather in a
    nested parallel) gives an ``unknown`` barrier obligation, never a crash."""
    from tilenest.validation.fuzz import Spec, check_spec

    rec = check_spec(Spec("f32", 2, (1, 8), False, True, [("gather", 1, "raw")]), 2,
                     target="cuda")
    assert rec.status == "ok" and rec.compared > 0, rec.message


def test_row_major_offsets_split_into_coordinates_only_within_their_row():
    """``i * N + j`` and ``i' * N + j'`` are equal iff ``(i, j) = (i', j')``
    when the guards keep ``j, j'`` in ``[0, N)`` -- the barrier proof
    compares those (linear) coordinates instead of the (nonlinear) offsets;
    without the bound it keeps the offsets (``0 * N + N = 1 * N + 0``)."""
    from tilenest.proofs.barriers import coordinates

    i, j, i2, j2, N = E.Var("i"), E.Var("j"), E.Var("i2"), E.Var("j2"), E.Sym("N")
    ea, eb = E.add(E.mul(i, N), E.add(j, 4)), E.add(E.mul(i2, N), j2)
    ga = [E.pand(E.add(j, 4).ge(0), E.add(j, 4).lt(N))]
    gb = [j2.ge(0), j2.lt(N)]
    assert coordinates(ea, eb, ga, gb) == [(i, i2), (E.add(j, 4), j2)]
    assert coordinates(ea, eb, ga, [j2.ge(0)]) == [(ea, eb)]
    # three dimensions: (i * N + j) * K + l
    K, l = E.Sym("K"), E.Var("l")
    e3 = E.add(E.mul(E.add(E.mul(i, N), j), K), l)
    g3 = [j.ge(0), j.lt(N), l.ge(0), l.lt(K)]
    assert coordinates(e3, e3, g3, g3) == [(i, i), (j, j), (l, l)]
