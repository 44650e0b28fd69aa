"""A root with effects besides its top-level ``parallel`` s is cut into phases
(``lowering/phases.py``): each ``parallel`` stays a parallel phase (many
programs, run on several threads by the llvm runtime, many blocks on cuda),
the root's other effects run in ordered phases in program order, values
crossing a cut live in scratch buffers, and a tree-permitted root ``reduce``
runs as per-chunk partials plus a combine. Strict folds are never split."""

from __future__ import annotations

import ctypes
import threading

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.backends.llvm import callplan as CP
from tilenest.lowering import default_schedule, lower_verified, print_kernel
from tilenest.lowering.phases import CHUNK
from tilenest.semantics import expr as E

#: a phase entry: ``void (ptr args, ptr syms, ptr locals, i64 lo, i64 hi, ptr status)``
ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)


@tn.kernel
def row_loss_mean(x: tn.Tensor[f32, "R C"], loss: tn.Tensor[f32, "R"],
                  out: tn.Tensor[f32, "1"]):
    """Per-row sum of squares, then their mean over all rows at the root."""
    rows, cols = x.shape
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        loss(tn.coord(p.index()), tn.shape(1)).store(tn.reduce(row * row, row.dim(1), tn.add))
    every = loss[tn.coord(0), tn.shape(rows)]
    mean = tn.reduce(every, every.dim(0), tn.add) / tn.cast(rows, f32)
    out(tn.coord(0), tn.shape(1)).store(tn.broadcast(mean, tn.shape(tn.axis(out.dim(0), 1))))


def _chunk_total(policy):  # type: ignore[no-untyped-def]
    @tn.kernel
    def chunk_total(x: tn.Tensor[f32, "N"], part: tn.Tensor[f32, "P"],
                    out: tn.Tensor[f32, "1"], *, bs=4):
        """Each program sums ``bs`` elements into ``part``; a root ``reduce``
        region then folds all programs' partials."""
        (n,) = x.shape
        (progs,) = part.shape
        for p in tn.parallel(tn.shape(progs)):
            v = x[tn.coord(p.index() * bs), tn.shape(bs)]
            s = tn.reduce(v, v.dim(0), tn.add, policy=policy)
            part(tn.coord(p.index()), tn.shape(1)).store(
                tn.broadcast(s, tn.shape(tn.axis(part.dim(0), 1))))
        parts = part[tn.coord(0), tn.shape(progs)]
        total = tn.scalar(0.0, f32)
        for r in tn.reduce(parts.domain(parts.dim(0)), policy=policy):
            total = total + parts.at(r)
        out(tn.coord(0), tn.shape(1)).store(tn.broadcast(total, tn.shape(tn.axis(out.dim(0), 1))))

    return chunk_total


chunk_total_tree = _chunk_total(tn.unordered_tree)
chunk_total_left = _chunk_total(tn.fold_left)


@tn.kernel
def scaled_rows(x: tn.Tensor[f32, "R C"], s: tn.Tensor[f32, "1"], y: tn.Tensor[f32, "R C"]):
    """An ordered head (doubles ``s``) whose result every program reads."""
    rows, cols = x.shape
    s(tn.coord(0), tn.shape(1)).store(s[tn.coord(0), tn.shape(1)] * 2.0)
    k = tn.reduce(s[tn.coord(0), tn.shape(1)], s.dim(0), tn.add, policy=tn.fold_left)
    for p in tn.parallel(tn.shape(rows)):
        o = tn.coord(p.index(), 0)
        y(o, tn.shape(1, cols)).store(x[o, tn.shape(1, cols)] * k)


@tn.kernel
def total(x: tn.Tensor[f32, "N"], out: tn.Tensor[f32, "1"]):
    """A global sum: one root ``reduce`` and a scalar store."""
    (n,) = x.shape
    v = x[tn.coord(0), tn.shape(n)]
    out(tn.coord(0), tn.shape(1)).store(
        tn.broadcast(tn.reduce(v, v.dim(0), tn.add), tn.shape(tn.axis(out.dim(0), 1))))


def _phases(kernel, target="llvm"):  # type: ignore[no-untyped-def]
    """The loop IR kernel and whether each of its phases is parallel."""
    k = lower_verified(kernel.program, default_schedule(kernel.program, target))
    return k, [ph.parallel for ph in k.phases]


def _programs(k, syms):  # type: ignore[no-untyped-def]
    from tilenest.semantics import expr as E

    env = {E.Sym(s): v for s, v in syms.items()}
    return [int(np.prod([E.evaluate(x, env) for x in ph.extents])) for ph in k.phases]


class Spy:
    """Records, per phase the llvm runtime launches, its program count, the
    workers it asked for and the threads that ran its chunks (each phase's
    entry is wrapped in a callback that the native worker threads call).
    The first two threads to run a chunk of a phase wait for each other (up
    to a timeout), so a phase given two workers shows both whatever the
    machine's load."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.phases: list[tuple[int, int, set[int]]] = []
        self.callbacks: list = []  # kept alive while the launches live
        spy, real = self, CP.Launch

        class Spying(real):  # type: ignore[misc, valid-type]
            def __init__(self, phases, argv, symv, sizes, chunk):  # type: ignore[no-untyped-def]
                super().__init__([(spy.wrap(a, n, w), n, w) for a, n, w in phases if n > 0],
                                 argv, symv, sizes, chunk)

        monkeypatch.setattr(CP, "Launch", Spying)

    @property
    def seen(self) -> list[tuple[int, int, int]]:
        return [(n, w, len(ids)) for n, w, ids in self.phases]

    def wrap(self, address: int, n: int, workers: int) -> int:
        real = ENTRY(address)
        idents: set[int] = set()
        meet = threading.Barrier(2, timeout=20) if min(workers, n) > 1 else None

        def entry(a, s, loc, lo, hi, st):  # type: ignore[no-untyped-def]
            me = threading.get_ident()
            first = me not in idents
            idents.add(me)
            if meet is not None and first:
                try:
                    meet.wait()
                except threading.BrokenBarrierError:
                    pass
            real(a, s, loc, lo, hi, st)

        cb = ENTRY(entry)
        self.callbacks.append(cb)
        self.phases.append((n, workers, idents))
        return int(ctypes.cast(cb, ctypes.c_void_p).value or 0)


def test_row_loss_then_mean_keeps_the_rows_parallel(monkeypatch):
    k, par = _phases(row_loss_mean)
    # rows; snapshot of loss; partials of the mean; combine and store
    assert par == [True, False, True, False]
    assert _programs(k, {"R": 64, "C": 5})[0] == 64
    rng = np.random.default_rng(1)
    x = rng.standard_normal((64, 5)).astype(np.float32)
    loss, out = np.zeros(64, np.float32), np.zeros(1, np.float32)
    ck = row_loss_mean.compile(target="llvm")
    spy = Spy(monkeypatch)
    ck(x, loss, out, threads=2)
    assert spy.seen[0][:2] == (64, 2) and spy.seen[0][2] >= 2  # rows on two threads
    assert all(w == 1 for _, w, _ in spy.seen[1::2])  # the ordered phases: one program
    np.testing.assert_allclose(loss, (x.astype(np.float64) ** 2).sum(1), rtol=1e-5)
    want = (x.astype(np.float64) ** 2).sum() / 64
    assert out[0] == pytest.approx(want, rel=1e-5)
    assert tn.validate(row_loss_mean, "llvm").ok


def test_row_loss_then_mean_on_cuda_launches_a_block_per_row():
    ck = row_loss_mean.compile(target="cuda")
    launches = ck.launches({"R": 300, "C": 7})
    assert [n for _, n, _ in launches] == [300, 1, 1, 1]
    assert launches[0][0].threads > 1
    assert tn.validate(row_loss_mean, "cuda").ok


def test_reduce_region_over_programs_partials_runs_as_a_tree():
    k, par = _phases(chunk_total_tree)
    assert par == [True, False, True, False]
    progs = _programs(k, {"N": 4 * 40000, "P": 40000})
    assert progs[0] == 40000 and progs[2] == -(-40000 // CHUNK) > 1
    assert tn.validate(chunk_total_tree, "llvm").ok
    assert tn.validate(chunk_total_tree, "cuda").ok
    cu = chunk_total_tree.compile(target="cuda").launches({"N": 4 * 40000, "P": 40000})
    assert [n for _, n, _ in cu] == progs


def test_fold_left_root_reduce_stays_one_ordered_fold_bitwise():
    k, par = _phases(chunk_total_left)
    assert par == [True, False]  # the programs, then the fold in one program
    fold = print_kernel(k).split("phase chunk_total_1")[1]
    assert "reassoc" not in fold and "lane_reduce" not in fold
    # cancellation makes any regrouping visible in the bits
    x = np.array([1e8, 1.0, -1e8, 3.0, 1e-3, 2.0, 7.0, -1.0] * 6, np.float32)
    part, out = np.zeros(12, np.float32), np.zeros(1, np.float32)
    want = chunk_total_left(x.copy(), part.copy(), out.copy())[1]
    for target in ("llvm", "cuda"):
        got = chunk_total_left.compile(target=target)(x.copy(), np.zeros(12, np.float32),
                                                      np.zeros(1, np.float32))[1]
        assert got.tobytes() == want.tobytes(), target
    assert tn.validate(chunk_total_left, "llvm").ok
    assert tn.validate(chunk_total_left, "cuda").ok


def test_sequential_schedule_keeps_a_tree_reduce_whole():
    p = total.program
    red = next(op for op in p.body.ops if op.name == "reduce")
    s = default_schedule(p, "llvm").with_(reductions=((red.oid, "sequential"),))
    k = lower_verified(p, s)
    assert [ph.parallel for ph in k.phases] == [False]


def test_ordered_head_feeds_every_program_through_scratch(monkeypatch):
    k, par = _phases(scaled_rows)
    assert par == [False, True]
    assert [p.kind for p in k.params].count("scratch") == 1
    rng = np.random.default_rng(2)
    x = rng.standard_normal((40, 3)).astype(np.float32)
    s, y = np.array([1.5], np.float32), np.zeros((40, 3), np.float32)
    spy = Spy(monkeypatch)
    scaled_rows.compile(target="llvm")(x, s, y, threads=2)
    assert s[0] == 3.0
    np.testing.assert_array_equal(y, x * np.float32(3.0))
    assert [w for _, w, _ in spy.seen] == [1, 2] and spy.seen[1][2] >= 2
    assert tn.validate(scaled_rows, "llvm").ok
    assert tn.validate(scaled_rows, "cuda").ok


def test_global_sum_runs_partials_on_several_threads(monkeypatch):
    k, par = _phases(total)
    assert par == [True, False]
    n = 3 * CHUNK + 5
    assert _programs(k, {"N": n}) == [4, 1]
    x = np.random.default_rng(3).random(n, dtype=np.float32)
    out = np.zeros(1, np.float32)
    spy = Spy(monkeypatch)
    total.compile(target="llvm")(x, out, threads=2)
    assert spy.seen[0][:2] == (4, 2) and spy.seen[0][2] >= 2
    exact = x.astype(np.float64).sum()
    assert abs(out[0] - exact) <= n * 2**-24 * np.abs(x).astype(np.float64).sum()
    assert tn.validate(total, "llvm").ok
    assert tn.validate(total, "cuda").ok


@tn.kernel
def root_memory(x: tn.Tensor[f32, "R 4"], y: tn.Tensor[f32, "R 4"]):
    """A root ``Memory`` stored at the root and read by every program: its
    state has no scratch form, so the root stays one ordered phase."""
    rows, cols = x.shape
    buf = tn.memory(f32, tn.shape(1, 4))
    buf.store(x[tn.coord(0, 0), tn.shape(1, 4)])
    for p in tn.parallel(tn.shape(rows)):
        y(tn.coord(p.index(), 0), tn.shape(1, 4)).store(buf.load() + 1.0)


def test_a_memory_state_crossing_a_cut_keeps_one_ordered_phase():
    k, par = _phases(root_memory)
    assert par == [False]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y = np.zeros_like(x)
    root_memory.compile(target="llvm")(x, y)
    np.testing.assert_array_equal(y, np.broadcast_to(x[0] + 1, (3, 4)))
    assert tn.validate(root_memory, "llvm").ok


# -- root reduce regions with tile-valued states -----------------------------


def _chunk_sum(policy, merge, contract):  # type: ignore[no-untyped-def]
    @tn.kernel
    def chunk_sum(x: tn.Tensor[f32, "N"], total: tn.Tensor[f32, "1"], *, chunk=64):
        """A global reduction as users write it: a root ``reduce`` region over
        chunks whose state is a one-element tile."""
        (n,) = x.shape
        (e,) = x.dims()
        total = total.with_dims(e)
        s = tn.zeros(f32, tn.shape(1), dims=(e,))
        for c in tn.reduce(tn.shape(tn.cdiv(n, chunk)), contract=contract, policy=policy):
            part = x[tn.coord(c.index() * chunk), tn.shape(chunk), tn.bounds.zero]
            s = merge(s, tn.reduce(part, e, merge, policy=policy))
        total(tn.coord(0), tn.shape(1)).store(s)

    return chunk_sum


chunk_sum = _chunk_sum(tn.unordered_tree, tn.add, tn.add)
chunk_max = _chunk_sum(tn.ordered_tree, tn.maximum, tn.maximum)
chunk_sum_left = _chunk_sum(tn.fold_left, tn.add, None)


@tn.kernel
def col_means(x: tn.Tensor[f32, "R C"], out: tn.Tensor[f32, "1 C"], *, rb=8):
    """Per-column means: a root ``reduce`` over row blocks with a ``(1, C)``
    state, ``C`` a symbol."""
    rows, cols = x.shape
    r, c = x.dims()
    out = out.with_dims(r, c)
    s = tn.zeros(f32, tn.shape(1, cols), dims=(r, c))
    for b in tn.reduce(tn.shape(tn.cdiv(rows, rb)), contract=tn.add):
        blk = x[tn.coord(b.index() * rb, 0), tn.shape(rb, cols), tn.bounds.zero]
        s = s + tn.reduce(blk, r, tn.add)
    out(tn.coord(0, 0), tn.shape(1, cols)).store(s / tn.cast(rows, f32))


@tn.kernel
def col_sums6(x: tn.Tensor[f32, "R 6"], out: tn.Tensor[f32, "1 6"], *, rb=8):
    """Per-column sums with a constant ``(1, 6)`` state."""
    rows, cols = x.shape
    r, c = x.dims()
    out = out.with_dims(r, c)
    s = tn.zeros(f32, tn.shape(1, cols), dims=(r, c))
    for b in tn.reduce(tn.shape(tn.cdiv(rows, rb)), contract=tn.add):
        blk = x[tn.coord(b.index() * rb, 0), tn.shape(rb, cols), tn.bounds.zero]
        s = s + tn.reduce(blk, r, tn.add)
    out(tn.coord(0, 0), tn.shape(1, cols)).store(s)


@tn.kernel
def block_sum(x: tn.Tensor[f32, "R C"], out: tn.Tensor[f32, "1"], *, bs=16):
    """A sum over a two-axis domain of ``bs x bs`` blocks."""
    rows, cols = x.shape
    r, c = x.dims()
    (o,) = out.dims()
    s = tn.zeros(f32, tn.shape(1), dims=(o,))
    for b in tn.reduce(tn.shape(tn.cdiv(rows, bs), tn.cdiv(cols, bs)), contract=tn.add):
        blk = x[tn.coord(b.index(0) * bs, b.index(1) * bs), tn.shape(bs, bs), tn.bounds.zero]
        s = s + tn.reduce(tn.reduce(blk, c, tn.add), r, tn.add)
    out(tn.coord(0), tn.shape(1)).store(s)


@tn.kernel
def cell_sum(x: tn.Tensor[f32, "A B"], out: tn.Tensor[f32, "1"]):
    """A sum over every cell of a two-axis domain, read with ``at``."""
    a, b = x.shape
    (o,) = out.dims()
    xs = x[tn.coord(0, 0), tn.shape(a, b)]
    s = tn.zeros(f32, tn.shape(1), dims=(o,))
    for p in tn.reduce(xs.domain(xs.dim(0), xs.dim(1)), contract=tn.add):
        s = s + xs.at(p)
    out(tn.coord(0), tn.shape(1)).store(s)


@tn.kernel
def peeking_sum(x: tn.Tensor[f32, "N"], total: tn.Tensor[f32, "1"], *, chunk=64):
    """Besides its merge, the body reads the state (an index checked against
    it, then unused): partials starting from the identity would see other
    values there, so nothing is split."""
    (n,) = x.shape
    (e,) = x.dims()
    total = total.with_dims(e)
    s = tn.zeros(f32, tn.shape(1), dims=(e,))
    for c in tn.reduce(tn.shape(tn.cdiv(n, chunk)), contract=tn.add):
        part = x[tn.coord(c.index() * chunk), tn.shape(chunk), tn.bounds.zero]
        peek = s * 2.0  # noqa: F841  (read, never used)
        s = s + tn.reduce(part, e, tn.add)
    total(tn.coord(0), tn.shape(1)).store(s)


def test_tile_state_partials_scale_with_the_work_of_a_domain_point():
    from tilenest.lowering.phases import points_per_program

    def red(kernel):  # type: ignore[no-untyped-def]
        return next(op for op in kernel.program.body.ops if op.name == "reduce")

    assert points_per_program(red(chunk_sum)) == CHUNK // 64  # a 64-element load per point
    assert points_per_program(red(total)) == CHUNK  # one element per point
    assert points_per_program(red(block_sum)) == CHUNK // 256


def test_chunk_sum_with_a_tile_state_runs_partials_on_several_threads(monkeypatch):
    k, par = _phases(chunk_sum)
    assert par == [True, False]  # partials, then the combine and the store
    n = 64 * (CHUNK // 64) * 3 + 5  # ragged: the last chunk and the last program are short
    assert _programs(k, {"N": n}) == [4, 1]
    assert [p.kind for p in k.params].count("scratch") == 1
    # the sum of a chunk is range-restricted: away from the ragged end its
    # loads carry no guard (the loop vectorizes without masks)
    sums = [ln for ln in print_kernel(k).splitlines() if "add{reassoc}(acc" in ln and "x[[" in ln]
    assert any(" if [" not in ln for ln in sums) and any(" if [" in ln for ln in sums)
    x = np.random.default_rng(4).random(n, dtype=np.float32)
    out = np.zeros(1, np.float32)
    spy = Spy(monkeypatch)
    chunk_sum.compile(target="llvm")(x, out, threads=2)
    assert spy.seen[0][:2] == (4, 2) and spy.seen[0][2] >= 2
    assert spy.seen[1][:2] == (1, 1)
    exact = x.astype(np.float64).sum()
    assert abs(out[0] - exact) <= n * 2**-24 * exact
    cu = chunk_sum.compile(target="cuda").launches({"N": n})
    assert [b for _, b, _ in cu] == [4, 1]
    for target in ("llvm", "cuda"):
        assert tn.validate(chunk_sum, target, cases=8).ok
        assert tn.validate(chunk_sum, target, inputs=[x, np.zeros(1, np.float32)]).ok


def _total(fn, x):  # type: ignore[no-untyped-def]
    """The one written output of a call of ``fn`` (the interpreter or a
    compiled kernel) on ``x`` and a fresh ``total``."""
    res = fn(x.copy(), np.zeros(1, np.float32))
    return res[-1] if isinstance(res, tuple) else res


def test_nan_and_inf_propagate_through_partials_and_combine():
    n = 64 * (CHUNK // 64) * 2 + 9  # three partials programs
    base = np.random.default_rng(5).random(n, dtype=np.float32)
    cases = []
    for where, vals in (((n // 2,), (np.nan,)), ((7,), (np.inf,)),
                        ((3, n - 2), (np.inf, -np.inf)), ((n - 1,), (np.nan,))):
        x = base.copy()
        x[list(where)] = vals
        cases.append(x)
    for kernel in (chunk_sum, chunk_max):
        assert _phases(kernel)[1] == [True, False]
        for i, x in enumerate(cases):
            want = _total(kernel, x)
            # the emulated device on a NaN and an inf - inf case (its C++ is slow)
            for target in ("llvm", "cuda") if i in (0, 2) else ("llvm",):
                got = _total(kernel.compile(target=target), x)
                np.testing.assert_array_equal(got, want, err_msg=f"{target}")
            assert tn.validate(kernel, "llvm", inputs=[x, np.zeros(1, np.float32)]).ok
    assert np.isnan(_total(chunk_sum, cases[2])[0])  # inf + -inf
    assert _total(chunk_max, cases[1])[0] == np.inf
    assert np.isnan(_total(chunk_max, cases[0])[0]) and np.isnan(_total(chunk_max, cases[3])[0])


def test_column_means_over_row_blocks_split_with_a_symbolic_tile_state(monkeypatch):
    k, par = _phases(col_means)
    assert par == [True, False]
    rows = 8 * 32 * 3 + 3  # 97 row blocks of 8, 32 per program (C counted as 64)
    assert _programs(k, {"R": rows, "C": 5}) == [4, 1]
    x = np.random.default_rng(6).standard_normal((rows, 5)).astype(np.float32)
    out = np.zeros((1, 5), np.float32)
    spy = Spy(monkeypatch)
    col_means.compile(target="llvm")(x, out, threads=2)
    assert spy.seen[0][:2] == (4, 2) and spy.seen[0][2] >= 2
    np.testing.assert_allclose(out[0], x.astype(np.float64).mean(0), rtol=1e-4, atol=1e-6)
    cu = col_means.compile(target="cuda").launches({"R": rows, "C": 5})
    assert [b for _, b, _ in cu] == [4, 1]
    for target in ("llvm", "cuda"):
        assert tn.validate(col_means, target, cases=8).ok
        assert tn.validate(col_means, target, inputs=[x, np.zeros((1, 5), np.float32)]).ok


def test_column_sums_with_a_constant_tile_state():
    k, par = _phases(col_sums6)
    assert par == [True, False]
    per = CHUNK // 48  # row blocks of 8 x 6 elements
    rows = 8 * per * 2 + 5
    assert _programs(k, {"R": rows}) == [3, 1]
    x = np.random.default_rng(7).standard_normal((rows, 6)).astype(np.float32)
    for target in ("llvm", "cuda"):
        assert tn.validate(col_sums6, target, inputs=[x, np.zeros((1, 6), np.float32)]).ok
        assert tn.validate(col_sums6, target, cases=8 if target == "llvm" else 4).ok


def test_two_axis_domain_is_chunked_in_lexicographic_order(monkeypatch):
    k, par = _phases(block_sum)
    assert par == [True, False]
    # 13 x 13 blocks, 64 per program: chunks cross rows of the domain
    assert _programs(k, {"R": 200, "C": 199}) == [3, 1]
    x = np.random.default_rng(8).random((200, 199), dtype=np.float32)
    out = np.zeros(1, np.float32)
    spy = Spy(monkeypatch)
    block_sum.compile(target="llvm")(x, out, threads=2)
    assert spy.seen[0][:2] == (3, 2) and spy.seen[0][2] >= 2
    assert out[0] == pytest.approx(x.astype(np.float64).sum(), rel=1e-5)
    assert [b for _, b, _ in block_sum.compile(target="cuda").launches({"R": 200, "C": 199})] \
        == [3, 1]
    for target in ("llvm", "cuda"):
        assert tn.validate(block_sum, target, inputs=[x, np.zeros(1, np.float32)]).ok
        assert tn.validate(block_sum, target, cases=8 if target == "llvm" else 4).ok


def test_fold_left_tile_state_stays_one_ordered_fold_bitwise():
    k, par = _phases(chunk_sum_left)
    assert par == [False]
    assert "reassoc" not in print_kernel(k)
    # chunk sums 1e8, 598 x 1.0, -1e8: the left fold gives 0 (each 1.0 is
    # absorbed), partials of 256 chunks would give 344
    x = np.zeros(600 * 64, np.float32)
    x[64::64] = 1.0
    x[0], x[-64] = 1e8, -1e8
    want = _total(chunk_sum_left, x)
    assert want[0] == 0.0
    for target in ("llvm", "cuda"):
        got = _total(chunk_sum_left.compile(target=target), x)
        assert got.tobytes() == want.tobytes(), target
    assert _total(chunk_sum.compile(target="llvm"), x)[0] == 344.0  # the tree version splits


def test_tile_state_stays_whole_when_the_schedule_asks_sequential():
    p = chunk_sum.program
    red = next(op for op in p.body.ops if op.name == "reduce")
    s = default_schedule(p, "llvm").with_(reductions=((red.oid, "sequential"),))
    assert [ph.parallel for ph in lower_verified(p, s).phases] == [False]


def test_a_state_read_besides_its_merge_is_not_split():
    body = next(op for op in peeking_sum.program.body.ops if op.name == "reduce").regions[0]
    assert any(o.name == "mul" for o in body.ops)  # the extra read is in the program
    assert _phases(peeking_sum)[1] == [False]
    assert tn.validate(peeking_sum, "llvm", cases=4).ok


def test_cells_read_with_at_are_not_copied_per_program():
    k, par = _phases(cell_sum)
    assert par == [True, False]
    assert _programs(k, {"A": 300, "B": 120}) == [3, 1]  # one element per point
    assert not k.locals or all(isinstance(b.size, E.Const) for b in k.locals)
    x = np.random.default_rng(9).random((300, 120), dtype=np.float32)
    out = cell_sum.compile(target="llvm")(x, np.zeros(1, np.float32))
    out = out[-1] if isinstance(out, tuple) else out
    assert out[0] == pytest.approx(x.astype(np.float64).sum(), rel=1e-5)
    for target in ("llvm", "cuda"):
        assert tn.validate(cell_sum, target, cases=6).ok
