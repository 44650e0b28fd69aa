"""Instances that diverge: trip counts and tile extents that differ between the
``parallel`` instances the batched interpreter runs together, empty batches
(a ``parallel`` with no instance), and the validation of schedule names.

Every valid program runs in every schedule with the same result; race
detection stays exact when instances are masked or regrouped."""

from __future__ import annotations

import importlib.util
import pathlib

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32, i32, i64
from tilenest.errors import RaceError, TilenestError
from tilenest.interpreter import (CANONICAL, EXHAUSTIVE, REVERSED, Schedule, parse_schedule,
                                  random)

SCHEDULES = [None, CANONICAL, REVERSED, random(3), random(11), EXHAUSTIVE]
IDS = ["batched", "canonical", "reversed", "random3", "random11", "exhaustive"]
ROOT = pathlib.Path(__file__).resolve().parent.parent


def run_all(kernel, args, expect, schedules=SCHEDULES):
    """The kernel's outputs in every schedule equal ``expect`` bitwise, and the
    reference (batched oracle) admits them."""
    for s in schedules:
        work = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        out = tn.interpret(kernel, *work, schedule=s)
        outs = out if isinstance(out, tuple) else (out,)
        for o, e in zip(outs, expect, strict=True):
            np.testing.assert_array_equal(o, e, err_msg=f"schedule {s}")
    ref = tn.reference(kernel, *args)
    refs = ref if isinstance(ref, tuple) else (ref,)
    for r, e in zip(refs, expect, strict=True):
        assert r.admits(e), r.admits(e)


# -- trip counts that depend on the instance ------------------------------------

@tn.kernel
def prefix_sums(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    """y[i] = x[0] + ... + x[i]: row i's loop runs i + 1 times."""
    (n,) = x.shape
    d = x.dim(0)
    y = y.with_dims(d)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        acc = tn.zeros(f32, tn.shape(1), dims=(d,))
        for s in p.serial(tn.shape(i + 1)):
            acc = acc + x[tn.coord(s.index()), tn.shape(1)]
        y(tn.coord(i), tn.shape(1)).store(acc)


def _serial_cumsum(x):
    out, acc = np.zeros_like(x), np.float32(0)
    for i, v in enumerate(x):
        acc = np.float32(acc + v)
        out[i] = acc
    return out


@pytest.mark.parametrize("n", [1, 2, 5])
def test_instance_dependent_trip_count(n):
    x = (np.arange(n, dtype=np.float32) + 0.1).astype(np.float32)
    run_all(prefix_sums, [x, np.zeros(n, np.float32)], [_serial_cumsum(x)])


def test_instance_dependent_trip_count_large_batch():
    x = np.random.default_rng(0).standard_normal(40).astype(np.float32)
    run_all(prefix_sums, [x, np.zeros(40, np.float32)], [_serial_cumsum(x)],
            schedules=[None, CANONICAL, random(1)])


@tn.kernel
def reversed_suffix(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    """y[i] = fold of x[i], x[i-1], ..., x[0] (reversed serial over i + 1 points,
    a non-commutative update): the per-instance order is what is checked."""
    (n,) = x.shape
    d = x.dim(0)
    y = y.with_dims(d)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        acc = tn.zeros(f32, tn.shape(1), dims=(d,))
        for s in p.serial(tn.shape(i + 1), order="reverse"):
            acc = acc * 0.5 + x[tn.coord(s.index()), tn.shape(1)]
        y(tn.coord(i), tn.shape(1)).store(acc)


def test_reversed_instance_dependent_trip_count():
    x = np.array([1, 2, 4, 8, 16], np.float32)
    want = np.zeros(5, np.float32)
    for i in range(5):
        acc = np.float32(0)
        for s in range(i, -1, -1):
            acc = np.float32(acc * np.float32(0.5) + x[s])
        want[i] = acc
    run_all(reversed_suffix, [x, np.zeros(5, np.float32)], [want])


@tn.kernel
def counted(lens: tn.Tensor[i32, "N"], x: tn.Tensor[f32, "M"], y: tn.Tensor[f32, "N"]):
    """A trip count read from data: y[i] = x[0] + ... + x[lens[i] - 1]."""
    (n,) = lens.shape
    a = lens.dim(0)
    x = x.with_dims(a)
    y = y.with_dims(a)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        c = tn.cast(tn.reduce(lens[tn.coord(i), tn.shape(1)], a, tn.maximum), i64)
        acc = tn.zeros(f32, tn.shape(1), dims=(a,))
        for s in p.serial(tn.shape(c)):
            acc = acc + x[tn.coord(s.index()), tn.shape(1)]
        y(tn.coord(i), tn.shape(1)).store(acc)


def test_data_dependent_trip_count():
    lens = np.array([3, 0, 5, 1, -2], np.int32)  # a negative count is an empty loop
    x = np.array([1, 2, 4, 8, 16], np.float32)
    want = np.array([7, 0, 31, 1, 0], np.float32)
    run_all(counted, [lens, x, np.zeros(5, np.float32)], [want])


def test_data_dependent_trip_count_single_instance():
    run_all(counted, [np.array([4], np.int32), np.array([1, 2, 4, 8, 16], np.float32),
                      np.zeros(1, np.float32)], [np.array([15], np.float32)])


@pytest.mark.parametrize("policy", [tn.fold_left, tn.fold_right, tn.unordered_tree,
                                    tn.ordered_tree], ids=str)
def test_reduce_over_an_instance_dependent_domain(policy):
    @tn.kernel
    def tri(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        d = x.dim(0)
        y = y.with_dims(d)
        for p in tn.parallel(tn.shape(n)):
            i = p.index()
            acc = tn.zeros(f32, tn.shape(1), dims=(d,))
            for r in p.reduce(tn.shape(i + 1), policy=policy):
                acc = acc + x[tn.coord(r.index()), tn.shape(1)]
            y(tn.coord(i), tn.shape(1)).store(acc)

    x = np.array([1, 2, 4, 8, 16, 32], np.float32)
    want = np.cumsum(x).astype(np.float32)  # exact in every order
    run_all(tri, [x, np.zeros(6, np.float32)], [want])
    for fast in (False, True):
        out = tn.interpret(tri, x, np.zeros(6, np.float32), fast=fast)
        np.testing.assert_array_equal(out, want)
    # the admitted set is bounded (never "anything goes") and tight for these inputs
    r = tn.reference(tri, x + np.float32(0.1), np.zeros(6, np.float32))
    if r.lo is not None:
        assert not np.any(np.isnan(r.lo)) and not np.any(np.isnan(r.hi))
        assert np.all(r.hi - r.lo < 1e-4)
        assert not r.admits(r.value + np.float32(1.0))


@tn.kernel
def pipelined_prefix(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    (n,) = x.shape
    d = x.dim(0)
    y = y.with_dims(d)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        acc = tn.zeros(f32, tn.shape(1), dims=(d,))
        for s in p.pipeline(tn.shape(i + 1), tn.pipeline_policy(window=2)):
            s.stage("load")
            t = x[tn.coord(s.index()), tn.shape(1)]
            s.stage("add")
            acc = acc + t
        y(tn.coord(i), tn.shape(1)).store(acc)


def test_pipeline_over_an_instance_dependent_domain():
    x = np.array([1, 2, 4, 8, 16], np.float32)
    run_all(pipelined_prefix, [x, np.zeros(5, np.float32)], [np.cumsum(x).astype(np.float32)])
    out = tn.interpret(pipelined_prefix, x, np.zeros(5, np.float32), check_pipelines=False)
    np.testing.assert_array_equal(out, np.cumsum(x))


@tn.kernel
def triangle(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N N"]):
    """A nested parallel whose domain depends on the outer instance: y[i, j] =
    x[j] * (i + 1) for j <= i, nothing written above the diagonal."""
    (n,) = x.shape
    a, b = y.dims()
    x = x.with_dims(b)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        for c in p.parallel(tn.shape(i + 1)):
            j = c.index()
            v = x[tn.coord(j), tn.shape(1)] * tn.cast(tn.index_tile(
                tn.shape(tn.axis(b, 1)), lambda u: i + 1), f32)
            y(tn.coord(i, j), tn.shape(1, 1)).store(tn.broadcast(v, tn.shape(tn.axis(a, 1),
                                                                             tn.axis(b, 1))))


def test_nested_parallel_with_an_instance_dependent_domain():
    x = np.array([1, 2, 3, 4], np.float32)
    want = np.full((4, 4), -1, np.float32)
    for i in range(4):
        want[i, :i + 1] = x[:i + 1] * (i + 1)
    run_all(triangle, [x, np.full((4, 4), -1, np.float32)], [want],
            schedules=[None, CANONICAL, REVERSED, random(3)])


# -- tile extents that differ between instances -----------------------------------

@tn.kernel
def ragged_rows(x: tn.Tensor[f32, "N M"], y: tn.Tensor[f32, "N M"], z: tn.Tensor[f32, "N"]):
    """Row i works on a tile of extent i + 1: a view, elementwise math, a reduce
    over the ragged dim, a Memory of that extent, and stores of both."""
    n, m = x.shape
    a, b = x.dims()
    y = y.with_dims(a, b)
    z = z.with_dims(a)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        t = x[tn.coord(i, 0), tn.shape(1, i + 1)]
        mem = tn.memory(f32, tn.shape(1, i + 1), dims=(a, b))
        mem.store(t * 2.0)
        y(tn.coord(i, 0), tn.shape(1, i + 1)).store(mem.load())
        z(tn.coord(i), tn.shape(1)).store(tn.reduce(t, b, tn.add))


def test_per_instance_tile_extents():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)
    y = np.full((4, 4), -1, np.float32)
    want_y = np.where(np.tril(np.ones((4, 4), bool)), 2 * x, -1).astype(np.float32)
    want_z = np.array([x[i, :i + 1].sum() for i in range(4)], np.float32)
    run_all(ragged_rows, [x, y, np.zeros(4, np.float32)], [want_y, want_z])


@tn.kernel
def ragged_branch(x: tn.Tensor[f32, "N M"], y: tn.Tensor[f32, "N M"]):
    """An if_ whose result has the instance's extent i + 1 and is first made
    inside the branches (instances take different branches)."""
    n, m = x.shape
    a, b = x.dims()
    y = y.with_dims(a, b)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        s = tn.reduce(x[tn.coord(i, 0), tn.shape(1, 1)], b, tn.add)
        s = tn.reduce(s, a, tn.add)
        if tn.if_(s > 5.0):
            w = tn.full(f32, tn.shape(tn.axis(a, 1), tn.axis(b, i + 1)), 1.0)
        else:
            w = tn.full(f32, tn.shape(tn.axis(a, 1), tn.axis(b, i + 1)), 2.0)
        y(tn.coord(i, 0), tn.shape(1, i + 1)).store(w)


def test_per_instance_extents_in_branch_results():
    x = np.arange(16, dtype=np.float32).reshape(4, 4)  # row sums of x[:, :1]: 0 4 8 12
    want = np.full((4, 4), -1, np.float32)
    for i in range(4):
        want[i, :i + 1] = 1.0 if x[i, 0] > 5 else 2.0
    run_all(ragged_branch, [x, np.full((4, 4), -1, np.float32)], [want])


@tn.kernel
def ragged_patches(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
    """Children put patches of extent c + 1 at offset c (c + 1) / 2 into one
    ancestor tile: disjoint footprints of different shapes, joined."""
    (n,) = x.shape
    d = x.dim(0)
    y = y.with_dims(d)
    for p in tn.parallel(tn.shape(1)):
        acc = tn.zeros(f32, tn.shape(10), dims=(d,))
        for c in p.parallel(tn.shape(4)):
            k = c.index()
            part = x[tn.coord(k * (k + 1) // 2), tn.shape(k + 1)]
            acc = tn.put(acc, (k * (k + 1) // 2,), part * 2.0)
        y(tn.coord(0), tn.shape(10)).store(acc)


def test_ancestor_update_with_per_instance_patch_extents():
    x = np.arange(10, dtype=np.float32) + 1
    run_all(ragged_patches, [x, np.zeros(10, np.float32)], [2 * x])


def test_races_are_exact_under_regrouping():
    @tn.kernel
    def overlap(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(n)):
            i = p.index()
            y(tn.coord(0), tn.shape(i + 1)).store(x[tn.coord(0), tn.shape(i + 1)])

    for s in (None, CANONICAL, REVERSED, random(2)):
        with pytest.raises(RaceError, match="race"):
            tn.interpret(overlap, np.ones(4, np.float32), np.zeros(4, np.float32), schedule=s)

    @tn.kernel
    def ragged_reads(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        """instance i reads x[0:i+1] and writes x[i]: instance 0 writes what the
        others read."""
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(n)):
            i = p.index()
            s = tn.reduce(x[tn.coord(0), tn.shape(i + 1)], x.dim(0), tn.add)
            x(tn.coord(i), tn.shape(1)).store(tn.broadcast(s, tn.shape(tn.axis(x.dim(0), 1))))

    for s in (None, CANONICAL, REVERSED):
        with pytest.raises(RaceError, match="race"):
            tn.interpret(ragged_reads, np.ones(3, np.float32), np.zeros(3, np.float32),
                         schedule=s)


def test_carried_ragged_tile_in_a_serial_loop():
    @tn.kernel
    def grow(x: tn.Tensor[f32, "N M"], y: tn.Tensor[f32, "N M"]):
        n, m = x.shape
        a, b = x.dims()
        y = y.with_dims(a, b)
        for p in tn.parallel(tn.shape(n)):
            i = p.index()
            t = tn.zeros(f32, tn.shape(tn.axis(a, 1), tn.axis(b, i + 1)))
            for s in p.serial(tn.shape(3)):
                t = t + x[tn.coord(i, 0), tn.shape(1, i + 1)]
            y(tn.coord(i, 0), tn.shape(1, i + 1)).store(t)

    x = np.arange(9, dtype=np.float32).reshape(3, 3)
    want = np.where(np.tril(np.ones((3, 3), bool)), 3 * x, 0).astype(np.float32)
    run_all(grow, [x, np.zeros((3, 3), np.float32)], [want])


# -- parallel regions without instances ---------------------------------------------

@tn.kernel
def empty_zoo(x: tn.Tensor[f32, "N"], idx: tn.Tensor[i32, "N"], y: tn.Tensor[f32, "M"],
              z: tn.Tensor[f32, "N"]):
    """A parallel over M instances (M may be 0) whose body has a load shared by
    all instances, reductions, an if_, a while_, a serial loop, a gather, a
    Memory, an mma and a nested parallel; a second parallel has an inner one
    over zero instances."""
    (n,) = x.shape
    (m,) = y.shape
    d = x.dim(0)
    e = y.dim(0)
    idx = idx.with_dims(d)
    z = z.with_dims(d)
    for p in tn.parallel(tn.shape(m)):
        shared = x[tn.coord(0), tn.shape(n)]                     # the same for every instance
        s = tn.reduce(shared, d, tn.add)
        own = tn.broadcast(s, tn.shape(tn.axis(e, 1)))
        if tn.if_(s > 0.0):
            own = own * 2.0
        it = tn.scalar(0, i32)
        while tn.while_(it < 2):
            own = own + 1.0
            it = it + 1
        for r in p.serial(tn.shape(2)):
            own = own + tn.reduce(tn.gather(shared, tn.cast(idx[tn.coord(0), tn.shape(n)], i64),
                                            0, 0.0), d, tn.maximum)
        mem = tn.memory(f32, tn.shape(tn.axis(e, 1)))
        mem.store(own)
        u, w = tn.dims("u", "w")
        sq = tn.mma(tn.reshape(shared, tn.shape(tn.axis(u, 1), tn.axis(d, n))),
                    tn.reshape(shared, tn.shape(tn.axis(d, n), tn.axis(w, 1))),
                    tn.zeros(f32, tn.shape(tn.axis(u, 1), tn.axis(w, 1))))
        for c in p.parallel(tn.shape(1)):
            y(tn.coord(p.index()), tn.shape(1)).store(mem.load() + tn.reduce(tn.reduce(
                sq, sq.dim(1), tn.add), sq.dim(0), tn.add))
    for q in tn.parallel(tn.shape(1)):
        for c in q.parallel(tn.shape(m)):
            t = x[tn.coord(0), tn.shape(n)]
            z(tn.coord(0), tn.shape(n)).store(t + 1.0)


@pytest.mark.parametrize("sched", SCHEDULES, ids=IDS)
def test_parallel_without_instances(sched):
    x = np.array([1, 2, 3], np.float32)
    idx = np.array([2, 0, 1], np.int32)
    y = np.zeros(0, np.float32)
    z = np.full(3, 7, np.float32)
    tn.interpret(empty_zoo, x, idx, y, z, schedule=sched)
    assert z.tolist() == [7, 7, 7]  # the inner parallel over zero instances stores nothing
    r = tn.reference(empty_zoo, x, idx, y, np.full(3, 7, np.float32), schedule=sched)
    assert r[0].value.shape == (0,) and r[1].value.tolist() == [7, 7, 7]


def test_parallel_with_instances_runs_the_same_body():
    x = np.array([1, 2, 3], np.float32)
    idx = np.array([2, 0, 1], np.int32)
    # own = ((6*2)+1+1) + 3 + 3 = 20, plus x.x = 14
    for s in (None, CANONICAL):
        y = np.zeros(1, np.float32)
        z = np.zeros(3, np.float32)
        tn.interpret(empty_zoo, x, idx, y, z, schedule=s)
        assert y.tolist() == [34.0] and z.tolist() == [2, 3, 4]


def test_shared_load_in_a_parallel_without_instances():
    @tn.kernel
    def bcast(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "M"]):
        (m,) = y.shape
        for p in tn.parallel(tn.shape(m)):
            s = x[tn.coord(0), tn.shape(1)]
            y(tn.coord(p.index()), tn.shape(1)).store(tn.reindex(
                s, tn.shape(tn.axis(y.dim(0), 1)), lambda j: (j,)))

    for s in SCHEDULES:
        out = tn.interpret(bcast, np.ones(3, np.float32), np.zeros(0, np.float32), schedule=s)
        assert out.shape == (0,)
    out = tn.interpret(bcast, np.ones(3, np.float32), np.zeros(2, np.float32))
    assert out.tolist() == [1.0, 1.0]


# -- schedules are validated -------------------------------------------------------

@pytest.mark.parametrize("bad", ["bogus", "Canonical", "random:x", "random:-1", "canonical:3",
                                 "", 42, 1.5, ("random", 1)])
def test_invalid_schedules_are_errors(bad):
    x = np.ones(2, np.float32)
    for fn in (tn.interpret, tn.reference):
        with pytest.raises(TilenestError) as e:
            fn(prefix_sums, x, np.zeros(2, np.float32), schedule=bad)
        msg = str(e.value)
        assert "schedule" in msg and "hint:" in msg
        if not (isinstance(bad, str) and bad.startswith("random:")):
            for name in ("batched", "canonical", "reversed", "random:SEED", "exhaustive"):
                assert name in msg
    with pytest.raises(TilenestError):
        parse_schedule(bad)


def test_schedule_objects_are_checked():
    with pytest.raises(TilenestError, match="unknown schedule 'bogus'"):
        Schedule("bogus")
    with pytest.raises(TilenestError, match="seed"):
        random(-1)
    with pytest.raises(TilenestError, match="seed"):
        Schedule("random", "7")


def test_parse_schedule_spellings():
    assert parse_schedule(None).kind == "batched"
    for name in ("batched", "canonical", "reversed", "exhaustive"):
        assert parse_schedule(name) == Schedule(name)
        assert str(parse_schedule(name)) == name
    assert parse_schedule("random") == random(0)
    assert parse_schedule("random:17") == random(17)
    assert str(random(17)) == "random:17" and parse_schedule(str(random(17))) == random(17)
    assert parse_schedule(REVERSED) is REVERSED


def test_reference_takes_a_schedule():
    x = np.array([1, 2, 4, 8], np.float32)
    for s in SCHEDULES:
        r = tn.reference(prefix_sums, x, np.zeros(4, np.float32), schedule=s)
        assert r.admits(np.cumsum(x).astype(np.float32))

    @tn.kernel
    def order_dependent(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(n)):
            y(tn.coord(0), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])

    for s in (None, CANONICAL, EXHAUSTIVE):
        with pytest.raises(RaceError):
            tn.reference(order_dependent, x, np.zeros(4, np.float32), schedule=s)


# -- causal attention: the example -----------------------------------------------------

def _example(name):
    spec = importlib.util.spec_from_file_location(f"ex_{name}", ROOT / "examples" / f"{name}.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


@pytest.mark.parametrize("name", ["causal_attention", "causal_attention_blocked"])
def test_causal_attention_runs_on_the_interpreter(name):
    m = _example("causal_attention")
    kernel = getattr(m, name)
    args = m.example_inputs(np.random.default_rng(0))
    want = m.numpy_reference(*args)
    outs = []
    for s in (None, CANONICAL, REVERSED, random(5)):
        work = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        outs.append(tn.interpret(kernel, *work, schedule=s))
        np.testing.assert_allclose(outs[-1], want, rtol=1e-5, atol=1e-6)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])
    r = tn.reference(kernel, *args)
    assert r.admits(outs[0])
    small = [a[:3, :] if isinstance(a, np.ndarray) else a for a in args]
    tn.interpret(kernel, *small, schedule=EXHAUSTIVE)


@pytest.mark.parametrize("name", ["causal_attention", "causal_attention_blocked"])
def test_causal_attention_validates_on_llvm(name):
    m = _example("causal_attention")
    kernel = getattr(m, name)
    rep = tn.validate(kernel, "llvm", cases=6, seed=11)
    assert rep.ok, rep.summary()
    assert rep.count("ok") >= 5
    args = m.example_inputs(np.random.default_rng(0))
    out = kernel.compile()(*args)
    np.testing.assert_allclose(out, m.numpy_reference(*args), rtol=2e-5, atol=2e-5)


# -- tuple-state reducers under the random schedule ----------------------------------

@tn.kernel
def sum_and_count(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "2"]):
    (n,) = x.shape
    red = tn.reducer("sum_and_count", identity=(0.0, 0.0),
                     merge=lambda a0, a1, b0, b1: (a0 + b0, a1 + b1), dtype=(f32, f32))
    for p in tn.parallel(tn.shape(1)):
        v = x[tn.coord(0), tn.shape(n)]
        s = tn.scalar(0.0, f32)
        c = tn.scalar(0.0, f32)
        for r in p.reduce(v.domain(v.dim(0)), contract=red):
            s = s + v.at(r)
            c = c + 1.0
        y(tn.coord(0), tn.shape(1)).store(tn.broadcast(s, tn.shape(tn.axis(y.dim(0), 1))))
        y(tn.coord(1), tn.shape(1)).store(tn.broadcast(c, tn.shape(tn.axis(y.dim(0), 1))))


def test_tuple_state_reducer_in_every_schedule():
    """A custom contract over two states merges them jointly in a random tree
    (it used to be refused under schedule=random)."""
    x = np.array([1, 2, 4, 8, 16], np.float32)
    run_all(sum_and_count, [x, np.zeros(2, np.float32)], [np.array([31, 5], np.float32)],
            schedules=SCHEDULES[:-1] + [random(s) for s in range(20, 26)])


# -- masking keeps effects exact ---------------------------------------------------------

@tn.kernel
def lower_triangle(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N N"]):
    """Instance i stores y[i, s] for s <= i inside its serial loop: an instance
    masked out of iteration s must neither store nor be logged."""
    (n,) = x.shape
    a, b = y.dims()
    x = x.with_dims(b)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        for s in p.serial(tn.shape(i + 1)):
            v = x[tn.coord(s.index()), tn.shape(1)]
            y(tn.coord(i, s.index()), tn.shape(1, 1)).store(
                tn.broadcast(v, tn.shape(tn.axis(a, 1), tn.axis(b, 1))))


def test_masked_iterations_store_nothing():
    x = np.array([1, 2, 3, 4], np.float32)
    want = np.where(np.tril(np.ones((4, 4), bool)), x[None, :], -1).astype(np.float32)
    run_all(lower_triangle, [x, np.full((4, 4), -1, np.float32)], [want])


def test_races_inside_instance_dependent_loops_are_found():
    @tn.kernel
    def all_write_first(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        """every instance's iteration s stores y[s]: instances 0 and 1 both write y[0]"""
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(n)):
            i = p.index()
            for s in p.serial(tn.shape(i + 1)):
                y(tn.coord(s.index()), tn.shape(1)).store(x[tn.coord(i), tn.shape(1)])

    for s in (None, CANONICAL, REVERSED, random(4)):
        with pytest.raises(RaceError, match=r"instance \(\d,\) writes y\[0\]"):
            tn.interpret(all_write_first, np.ones(3, np.float32), np.zeros(3, np.float32),
                         schedule=s)
    # one instance: nothing to race with
    out = tn.interpret(all_write_first, np.full(1, 5, np.float32), np.zeros(1, np.float32))
    assert out.tolist() == [5.0]


@tn.kernel
def data_extents(lens: tn.Tensor[i32, "N"], x: tn.Tensor[f32, "M"], y: tn.Tensor[f32, "N"]):
    """A tile whose extent is read from data: y[i] = sum of x[0:lens[i]]."""
    (n,) = lens.shape
    a = lens.dim(0)
    e = x.dim(0)
    y = y.with_dims(a)
    for p in tn.parallel(tn.shape(n)):
        i = p.index()
        c = tn.cast(tn.reduce(lens[tn.coord(i), tn.shape(1)], a, tn.maximum), i64)
        t = x[tn.coord(0), tn.shape(c)]
        y(tn.coord(i), tn.shape(1)).store(tn.broadcast(tn.reduce(t, e, tn.add),
                                                      tn.shape(tn.axis(a, 1))))


def test_data_dependent_tile_extents():
    lens = np.array([3, 0, 5, 3, 1], np.int32)
    x = np.array([1, 2, 4, 8, 16], np.float32)
    run_all(data_extents, [lens, x, np.zeros(5, np.float32)],
            [np.array([7, -0.0, 31, 7, 1], np.float32)])  # an empty sum is -0.0


def test_exhaustive_schedule_on_a_large_region():
    """More children than the exhaustive schedule can permute: it samples orders
    (row-major, reversed, seeded shuffles) instead of refusing the program."""
    x = np.arange(9, dtype=np.float32)
    out = tn.interpret(prefix_sums, x, np.zeros(9, np.float32), schedule=EXHAUSTIVE)
    np.testing.assert_array_equal(out, _serial_cumsum(x))

    @tn.kernel
    def last_wins(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(n)):
            y(tn.coord(0), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])

    with pytest.raises(RaceError):
        tn.interpret(last_wins, x, np.zeros(9, np.float32), schedule=EXHAUSTIVE)
