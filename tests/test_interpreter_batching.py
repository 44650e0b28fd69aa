"""Batched reduce regions (interpreter/batching.py) mean exactly what running
their iterations one by one means: the same bits, the same admitted sets, the
same errors and race reports. Each test runs a program both ways."""

from __future__ import annotations

import linecache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tilenest as tn
from tilenest.errors import TilenestError
from tilenest.interpreter import interpret, reference
from tilenest.interpreter.core import Interpreter, Options
from tilenest.interpreter.shadow import SumLeaves
from tilenest.semantics.arrays import host_arguments
from tilenest.semantics import dtypes as D

_N = [0]


def _kernel(src: str, name: str = "k"):
    """Capture a kernel from source text (the frontend reads it back)."""
    _N[0] += 1
    fname = f"<batching-test-{_N[0]}>"
    text = "import tilenest as tn\nfrom tilenest import *\n" + src
    linecache.cache[fname] = (len(text), None, text.splitlines(True), fname)
    ns: dict = {}
    exec(compile(text, fname, "exec"), ns)  # noqa: S102 - the test's own source
    return ns[name]


def _bits(a) -> bytes:
    """The bytes of ``a`` with every NaN made one canonical NaN: a NaN's sign
    and payload are not part of the numerical contract (spec V-14), and
    numpy's own loops pick which operand's NaN an add returns by array size,
    so batched and one-by-one runs may differ there and nowhere else."""
    a = np.asarray(a)
    if a.dtype.kind == "f" or a.dtype.name in ("bfloat16", "float16"):
        a = np.where(np.isnan(a.astype(np.float32)), a.dtype.type(np.nan), a).astype(a.dtype)
    return a.tobytes()


def _outcome(fn):
    """The arrays a run leaves (bytes) or the error it raises (type, message)."""
    try:
        return ("ok", fn())
    except TilenestError as e:
        return ("error", type(e).__name__, str(e))


def _both(prog, args, **kw):
    """Run ``prog`` batched and one by one on copies of ``args``; both outcomes."""
    res = []
    for batch in (True, False):
        work = [a.copy() if isinstance(a, np.ndarray) else a for a in args]

        def go(work=work, batch=batch):
            interpret(prog, *work, batch=batch, **kw)
            return [_bits(w) for w in work if isinstance(w, np.ndarray)]

        res.append(_outcome(go))
    return res


def _admitted(prog, args, **kw):
    out = []
    for batch in (True, False):
        def go(batch=batch):
            r = reference(prog, *args, batch=batch, **kw)
            rs = r if isinstance(r, tuple) else (r,)
            return [tuple(None if x is None else _bits(x)
                          for x in (a.value, a.lo, a.hi, a.nan)) + (a.determined, a.undetermined_at)
                    for a in rs]

        out.append(_outcome(go))
    return out


def _batched_iterations(prog, args, **kw) -> int:
    host = host_arguments(prog, [a.copy() if isinstance(a, np.ndarray) else a for a in args])
    it = Interpreter(prog, host, {}, Options(**kw))
    with np.errstate(all="ignore"):
        it.run()
    return it.batched_iterations


# -- programs: a parallel over rows, each row folding its columns ----------------------

_UPDATES = {
    "s+c": "s = s + c", "c+s": "s = c + s", "s-c": "s = s - c", "c-s": "s = c - s",
    "s*c": "s = s * c", "c*s": "s = c * s", "s/c": "s = s / c",
    "max": "s = tn.maximum(s, c)", "max_r": "s = tn.maximum(c, s)",
    "min": "s = tn.minimum(s, c)", "min_r": "s = tn.minimum(c, s)",
    "and": "s = s & c", "or": "s = s | c", "xor": "s = s ^ c",
    "affine": "s = s * 2 + c",
}
_TREE_OK = {"s+c", "c+s", "s*c", "c*s", "max", "max_r", "min", "min_r", "and", "or", "xor"}
_FLOAT_OK = set(_UPDATES) - {"and", "or", "xor"}
_INT_OK = set(_UPDATES) - {"s/c"}


def _row_fold(dt: str, update: str, policy: str, scale: bool) -> str:
    c = "x[tn.coord(p.index(), r.index()), tn.shape(1, 1)]"
    if scale:  # an elementwise function of the loaded value
        c = f"tn.abs({c}) + {c}"
    return f"""
@tn.kernel
def k(x: tn.Tensor[{dt}, 2], y: tn.Tensor[{dt}, 2], z: tn.Tensor[{dt}, 2]):
    rows, cols = x.shape
    y = y.with_dims(*x.dims())
    z = z.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(rows)):
        s = z[tn.coord(p.index(), 0), tn.shape(1, 1)]
        for r in p.reduce(tn.shape(cols), policy=tn.{policy}):
            c = {c}
            {_UPDATES[update]}
        y(tn.coord(p.index(), 0), tn.shape(1, 1)).store(s)
"""


_SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, 3e38, -1.5, 2.0])


def _data(dt: str, rows: int, cols: int, rng: np.random.Generator, special: float):
    npdt = getattr(D, dt).np
    if dt.startswith("f") or dt == "bf16":
        a = rng.standard_normal((rows, cols))
        pick = rng.random((rows, cols)) < special
        a = np.where(pick, rng.choice(_SPECIAL, (rows, cols)), a).astype(npdt)
        if dt == "f32" and special:  # NaNs with distinct payloads and signs
            bits = a.view(np.uint32)
            nan = np.isnan(a)
            bits[nan] = (bits[nan] & np.uint32(0xFFC00000)) | rng.integers(
                1, 1 << 22, nan.sum(), dtype=np.uint32)
        return a
    if dt == "bool":
        return rng.random((rows, cols)) < 0.5
    info = np.iinfo(npdt)
    return rng.integers(info.min, info.max, (rows, cols), dtype=npdt, endpoint=True)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(dt=st.sampled_from(["f32", "f64", "f16", "bf16", "i32", "u8", "i64"]),
       update=st.sampled_from(sorted(_UPDATES)),
       policy=st.sampled_from(["fold_left", "fold_right", "ordered_tree", "unordered_tree"]),
       scale=st.booleans(), rows=st.integers(0, 3), cols=st.integers(0, 40),
       special=st.sampled_from([0.0, 0.2, 0.6]), seed=st.integers(0, 2**16),
       fast=st.booleans())
def test_batched_fold_matches_one_by_one(dt, update, policy, scale, rows, cols, special, seed,
                                         fast):
    is_float = dt.startswith("f") or dt == "bf16"
    if update not in (_FLOAT_OK if is_float else _INT_OK):
        return
    if "tree" in policy and update not in _TREE_OK:
        return
    if scale and not is_float:
        scale = False
    k = _kernel(_row_fold(dt, update, policy, scale))
    rng = np.random.default_rng(seed)
    x = _data(dt, rows, cols, rng, special)
    y = np.zeros((rows, 1), x.dtype)
    z = _data(dt, rows, 1, rng, special)
    prog = k.program
    a, b = _both(prog, (x, y, z), fast=fast)
    if not (fast and "tree" in policy):  # fast trees are admitted, not one value
        assert a == b
    assert _admitted(prog, (x, y, z))[0] == _admitted(prog, (x, y, z))[1]
    if rows and cols:
        assert _batched_iterations(prog, (x, y, z)) == cols


def test_fast_tree_sum_is_admitted():
    k = _kernel(_row_fold("f32", "s+c", "unordered_tree", False))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 5000)).astype(np.float32)
    z = rng.standard_normal((3, 1)).astype(np.float32)
    y = np.zeros((3, 1), np.float32)
    interpret(k.program, x, y, z, fast=True)
    assert reference(k.program, x, np.zeros_like(y), z).admits(y)


# -- random well-typed programs ---------------------------------------------------------

from tilenest.validation import fuzz  # noqa: E402
from tilenest.validation.inputs import generate  # noqa: E402


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(spec=fuzz.specs(), seed=st.integers(0, 1000))
def test_random_programs_batched_and_one_by_one_agree(spec, seed):
    try:
        prog = fuzz.build(spec).program
    except TilenestError:
        return
    for case in generate(prog, 2, seed, 24):
        args = case.args
        a, b = _both(prog, args, params=case.params)
        assert a == b
        a, b = _admitted(prog, args, params=case.params)
        assert a == b


# -- errors and races inside batched regions --------------------------------------------

_RACY = """
@tn.kernel
def k(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(4)):
        x(tn.coord(p.index() * 3 + 1), tn.shape(1)).store(
            tn.full(f32, tn.shape(1), 1.0, dims=x.dims()))
        s = tn.zeros(f32, tn.shape(1), dims=x.dims())
        for r in p.reduce(tn.shape(n)):
            s = s + x[tn.coord(r.index()), tn.shape(1)] * {scale}
        y(tn.coord(p.index()), tn.shape(1)).store(s)
"""

_RACY2 = """
@tn.kernel
def k(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(2)):
        s = tn.zeros(f32, tn.shape(1), dims=x.dims())
        for r in p.reduce(tn.shape(4), policy=tn.fold_left):
            a = x[tn.coord(r.index() * 2 + p.index()), tn.shape(1)]
            b = x[tn.coord(7 - r.index()), tn.shape(1)]
            s = s + a * b
        x(tn.coord(p.index() * 5), tn.shape(1)).store(s)
        y(tn.coord(p.index()), tn.shape(1)).store(s)
"""


@pytest.mark.parametrize("schedule", [None, "canonical", "reversed"])
@pytest.mark.parametrize("src", [_RACY.format(scale="2.0"), _RACY2])
def test_races_in_batched_regions_are_reported_alike(src, schedule):
    k = _kernel(src)
    x = np.arange(8, dtype=np.float32)
    y = np.zeros(8, np.float32)
    a, b = _both(k.program, (x, y), schedule=schedule)
    assert a[0] == "error" and a[1] == "RaceError"
    assert a == b


def test_a_race_found_after_the_region_names_the_last_reader():
    # the reads are logged in one-by-one order, so a later write that conflicts
    # with them names the same reader op both ways
    k = _kernel(_RACY2.replace("x(tn.coord(p.index() * 5)", "x(tn.coord(1 - p.index())"))
    x = np.arange(8, dtype=np.float32)
    y = np.zeros(8, np.float32)
    for sched in (None, "canonical"):
        a, b = _both(k.program, (x, y), schedule=sched)
        assert a[0] == "error" and a == b


def test_uninitialized_and_out_of_bounds_reads_are_reported_alike():
    src = """
@tn.kernel
def k(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], o: tn.Tensor[f32, 1]):
    (n,) = x.shape
    y = y.with_dims(*x.dims())
    o = o.with_dims(*x.dims())
    s = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_left):
        s = s + x[tn.coord(r.index() * 2), tn.shape(1), tn.bounds.checked]
    o(tn.coord(0), tn.shape(1)).store(s)
"""
    k = _kernel(src)
    x = np.arange(8, dtype=np.float32)
    a, b = _both(k.program, (x, np.zeros(8, np.float32), np.zeros(8, np.float32)))
    assert a[0] == "error" and a[1] == "BoundsError" and a == b


def test_reduce_over_many_points_is_batched():
    src = """
@tn.kernel
def k(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    y = y.with_dims(*x.dims())
    s = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n)):
        s = s + x[tn.coord(r.index()), tn.shape(1)]
    y(tn.coord(0), tn.shape(1)).store(s)
"""
    k = _kernel(src)
    x = np.random.default_rng(0).standard_normal(300_000).astype(np.float32)
    y = np.zeros(1, np.float32)
    assert _batched_iterations(k.program, (x, y)) == x.size
    interpret(k.program, x, y)
    # the canonical value is the sequential left fold
    assert y[0] == np.add.accumulate(np.concatenate([[np.float32(0)], x]))[-1]
    assert reference(k.program, x, np.zeros(1, np.float32)).admits(y)


def test_sum_leaves_many_is_the_same_as_one_at_a_time():
    rng = np.random.default_rng(1)
    lo = rng.standard_normal((50, 3)) * 1e3
    hi = lo + np.abs(rng.standard_normal((50, 3)))
    nan = rng.random((50, 3)) < 0.1
    point = rng.random((50, 3)) < 0.5
    canon = np.where(point, lo, np.nan)
    one, many = SumLeaves(), SumLeaves()
    for i in range(50):
        one.add(lo[i], hi[i], nan[i], point[i], canon[i], D.f32)
    many.add(lo[0], hi[0], nan[0], point[0], canon[0], D.f32)
    many.add_many(lo[1:], hi[1:], nan[1:], point[1:], canon[1:], D.f32)
    for a, b in zip(one.envelope(D.f32), many.envelope(D.f32), strict=True):
        assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


# -- progress of long regions -------------------------------------------------------------

_LONG_FOLD = """
@tn.kernel
def k(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    y = y.with_dims(*x.dims())
    s = tn.zeros(f32, tn.shape(1), dims=x.dims())
    for r in tn.reduce(tn.shape(n), policy=tn.fold_left):
        s = x[tn.coord(r.index()), tn.shape(1)] - s
    y(tn.coord(0), tn.shape(1)).store(s)
"""


@pytest.mark.parametrize("batch", [True, False])
def test_a_long_region_shows_progress_at_a_terminal(monkeypatch, batch):
    import sys

    from tilenest.interpreter.core import PROGRESS_MIN

    class Terminal:
        def __init__(self):
            self.text = []

        def write(self, s):
            self.text.append(s)

        def flush(self):
            pass

        def isatty(self):
            return True

    k = _kernel(_LONG_FOLD)
    for n, shown in ((PROGRESS_MIN, True), (PROGRESS_MIN - 1, False)):
        term = Terminal()
        monkeypatch.setenv("TILENEST_PROGRESS", "1")
        monkeypatch.setattr(sys, "stderr", term)
        interpret(k.program, np.ones(n, np.float32), np.zeros(1, np.float32), batch=batch)
        monkeypatch.undo()
        assert ("interpreting reduce" in "".join(term.text)) == shown


# -- fast f32 transcendentals ---------------------------------------------------------------

@pytest.mark.parametrize("op", ["exp", "exp2", "log", "log2", "sigmoid"])
def test_fast_transcendentals_are_the_reference_bits(op):
    from tilenest.interpreter import fastmath
    from tilenest.semantics import numerics as N

    rng = np.random.default_rng(7)
    x = np.concatenate([
        (rng.standard_normal(200_000) * 40).astype(np.float32),
        np.exp(rng.standard_normal(100_000) * 10).astype(np.float32),
        rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        np.array([np.nan, -np.inf, np.inf, 0.0, -0.0, 1e-45, 88.72, 88.73, -103.9, 1.0],
                 np.float32)])
    with np.errstate(all="ignore"):
        assert fastmath.unary(op, x, D.f32).tobytes() == N.unary(op, x, D.f32).tobytes()


def test_fast_exp_recomputes_values_near_a_rounding_midpoint(monkeypatch):
    """With numpy's float64 ``exp`` made 2^8 to 2^9 float64 ulps too large
    (within fastmath.MARGIN), rounding its value to f32 misses the reference
    on some inputs of [1, 1.5); those lie near an f32 rounding midpoint, so
    the fast path must recompute them and still give the reference bits."""
    from tilenest.interpreter import fastmath
    from tilenest.semantics import numerics as N

    def too_large(y, out=None):
        return np.multiply(np.exp(y, out=out), 1 + 2.0 ** -44, out=out)

    x = (np.float32(1.0).view(np.uint32) + np.arange(1 << 22, dtype=np.uint32)).view(np.float32)
    ref = N.unary("exp", x, D.f32)
    missed = too_large(x.astype(np.float64)).astype(np.float32) != ref
    assert missed.any()  # the perturbation does cross a midpoint somewhere
    monkeypatch.setitem(fastmath.FAST64, "exp", too_large)
    assert fastmath.unary("exp", x, D.f32).tobytes() == ref.tobytes()


@pytest.mark.parametrize("op", ["exp", "exp2", "sigmoid"])
def test_fast_transcendentals_at_the_edges_of_the_f32_normal_range(op):
    """Results around the smallest normal f32 (2^-126), into the subnormals, and
    around the largest f32 and overflow: every input in dense sweeps."""
    from tilenest.interpreter import fastmath
    from tilenest.semantics import numerics as N

    def sweep(centre):
        c = np.float32(centre)
        up = np.nextafter(c, np.float32(np.inf)) - c
        return c + up * np.arange(-20000, 20000, dtype=np.float32)

    edges = {"exp": (-87.336544, 88.72283), "exp2": (-126.0, 128.0),
             "sigmoid": (-87.336544, 0.0)}[op]
    x = np.concatenate([sweep(e) for e in edges] + [sweep(-103.5 if op != "exp2" else -149.0)])
    with np.errstate(all="ignore"):
        assert fastmath.unary(op, x, D.f32).tobytes() == N.unary(op, x, D.f32).tobytes()
