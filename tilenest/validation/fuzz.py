"""Random well-typed kernels for differential fuzzing of the whole lowering.

A :class:`Spec` describes one kernel and the schedule it is compiled with
(:data:`SCHEDULES`: vector width, forced storage, sequential reductions,
bindings of nested levels): compute dtype (f32, f64, i32, f16, bf16)
and optionally a narrower *storage* dtype (f16/bf16 tensors computed in f32),
rank, tile shape, how the tile is read (bounds zero or fill, shifted second
views that hang over both edges), whether the programs nest a ``parallel``
level, and a list of *steps* applied to the current tile ``t``:

* ``un``     -- a unary function (exp, sqrt, tanh... on floats; neg/abs on ints);
* ``binc``   -- an arithmetic op with a literal;
* ``binu``   -- an elementwise op with a second input tile ``u``;
* ``ite``    -- a select on a comparison of ``t`` and ``u``;
* ``cast``   -- a round trip through another dtype (saturating float->int);
* ``red``    -- a reduction over one axis under one of the four policies, its
  result broadcast back into ``t``;
* ``fold``   -- a strict fold (left or right) whose update is not a contract
  (``s - x`` or ``x - s/2``): order matters bitwise;
* ``serial`` -- a serial loop carrying a tile;
* ``pipe``   -- a pipeline (with or without ``stage`` cuts) carrying a tile and
  loading a shifted view of ``z`` per iteration;
* ``if``     -- ``if_``/``else`` on a scalar derived from exact data (the maximum
  of ``u``, or a loaded integer);
* ``while``  -- ``while_`` with a constant or a data-dependent trip count;
* ``view``   -- ``u`` read back through a reversing reindex, a ``permute`` or
  a row-major ``reshape`` (undone by a quasi-affine reindex);
* ``gather`` -- ``gather`` of ``u`` along one axis by integers loaded from the
  extra input ``ix`` (in range, or partly out of range giving the fallback);
* ``dyn``    -- a second read of ``x`` whose origin is shifted by a loaded
  integer (a data-dependent coordinate, ``bounds.zero``);
* ``cred``   -- a region ``reduce`` under a custom contract (``tn.reducer``):
  max of abs (lifted), first non-zero (associative, not commutative), or a
  pair state (sum, sum of squares);
* ``shift``  -- a second read of ``x`` one element up-left (negative
  coordinates fall outside the view);
* ``mma``    -- ``t += mma(t, b, 1)`` (rank 2, floats and ints) with ``b`` a
  reindex of ``u``, with or without reassociation;
* ``mem``    -- a round trip through an explicit Memory with a padded layout;
* ``patch``  -- a nested ``parallel`` whose children each rewrite their own
  slice of ``t`` (a ``put`` chain), elementwise, after a reduction or through
  a ``serial`` carry;
* ``lib``    -- library compositions: ``scan`` (fold_left or ordered_tree),
  ``argmax``, a stable ``sort`` (ascending or descending) and its indices;
* ``loop``   -- a ``serial`` region, a ``pipeline`` (a stage cut before each
  inner step), a ``while_`` or an ``if_`` branch whose body is a list of
  further steps; their own regions nest under the loop's handle (under
  ``tn`` inside ``if_``/``while_``, which open no nest level).

Every program is well-typed and race-free by construction: each program (or
warp) stores only its own tile of ``y``, nested children write disjoint
slices through ``put``, and every other region body only loads. The oracle
counts a case it skips (an invalid program on that input, control flow on
inexact values); :func:`check_spec` reports a program whose cases were all
skipped as ``skipped``.

:func:`render` writes the spec as Python DSL source; :func:`build` captures it
through the real frontend (so fuzzing also exercises capture and the type
rules); :func:`specs` is the hypothesis strategy (shrinking removes steps and
simplifies choices), :func:`random_spec` the same generator driven by a seeded
``random.Random`` for campaigns outside hypothesis. Failures are reported with
the kernel's TileIR.
"""

from __future__ import annotations

import json
import linecache
import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

FLOAT_UNARY = ("exp", "neg", "abs", "sqrt", "floor", "tanh", "sigmoid", "round", "log")
F64_UNARY = ("neg", "abs", "sqrt", "floor", "round")
INT_UNARY = ("neg", "abs")
FLOAT_BIN = ("add", "sub", "mul", "div", "maximum", "minimum")
INT_BIN = ("add", "sub", "mul", "maximum", "minimum", "and", "or", "xor")
FLOAT_RED = ("add", "maximum", "minimum")
INT_RED = ("add", "maximum", "minimum", "xor")
POLICIES = ("unordered_tree", "ordered_tree", "fold_left", "fold_right")
_SYM = {"add": "+", "sub": "-", "mul": "*", "div": "/", "and": "&", "or": "|", "xor": "^"}


@dataclass
class Spec:
    """One random kernel (see the module docstring)."""

    dtype: str = "f32"
    rank: int = 2
    block: tuple[int, ...] = (4, 8)
    fill: bool = False
    nested: bool = False
    steps: list[tuple] = field(default_factory=list)
    #: the tensors' dtype when narrower than the compute dtype (f16/bf16 with f32)
    storage: str | None = None
    #: the compile schedule (see :data:`SCHEDULES`)
    sched: str = "default"

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith(("f", "bf"))

    @property
    def sdtype(self) -> str:
        return self.storage or self.dtype

    @property
    def uses_ints(self) -> bool:
        """Whether some step reads the integer input ``ix``."""
        return any(st[0] in ("gather", "dyn") or (st[0] in ("if", "while") and st[-1] == "ix")
                   for st in flat_steps(self.steps))


def flat_steps(steps: list) -> list:
    """``steps`` with the bodies of ``loop`` steps spliced in after them."""
    out = []
    for st in steps:
        out.append(st)
        if st[0] == "loop":
            out.extend(flat_steps(st[3]))
    return out


#: every step kind the generator draws (the coverage test checks this list)
STEP_KINDS = ("un", "binc", "binu", "ite", "cast", "red", "fold", "serial", "pipe", "if",
              "while", "view", "gather", "dyn", "cred", "shift", "mma", "mem", "patch", "lib",
              "loop")
DTYPES = ("f32", "f64", "i32", "f16", "bf16")


#: schedule variants; none may change what a program means. ``v128``/``v256``/``v512``:
#: that SIMD width (the host's own width is the default; a wider one is split
#: by LLVM); ``materialize``/``inline``: every lazily computable value
#: stored in a local buffer / recomputed at each use; ``sequential``: every
#: ``reduce`` in its strict left-to-right order; ``vector``/``serial``: nested
#: ``parallel`` levels bound to vector lanes / a serial loop
SCHEDULES = ("default", "v128", "v256", "v512", "materialize", "inline", "sequential", "vector",
             "serial")


def schedule_for(spec: Spec, program: Any, target: str = "llvm") -> Any:
    """The :class:`~tilenest.lowering.Schedule` that ``spec.sched`` names for
    ``target``. On a SIMT target (its profile's ``simt``: ``cuda``) the base
    is the SIMT form with one warp per program (the profile's ``lanes``, the
    fewest threads the form allows, so that the fuzzer's small tiles still
    spread over several rounds per thread), and the SIMD widths (a CPU
    notion) leave it as is."""
    from ..lowering import default_schedule, storage_plan
    from ..targets import profile

    simt = profile(target).simt
    if simt:
        s = default_schedule(program, target, block_threads=profile(target).lanes)
    else:
        s = default_schedule(program, target)
    v = spec.sched
    if v in ("v128", "v256", "v512"):
        return s if simt else s.with_(vector_bits=int(v[1:]))
    if v in ("materialize", "inline"):
        return s.with_(storage=tuple((n, v) for n in sorted(storage_plan(program, s))))
    if v == "sequential":
        return s.with_(reductions=tuple((op.oid, "sequential") for op in program.walk()
                                        if op.name == "reduce"))
    if v in ("vector", "serial"):
        return s.with_(bind=tuple((op.oid, v) for op in program.walk()
                                  if op.name == "parallel" and op.attrs["level"] > 1))
    return s




def fuzz_targets() -> tuple[str, ...]:
    """The targets :func:`check_spec` compiles for: every registered target
    with code generation whose kernels run (``tilenest.targets``)."""
    from ..targets import compiling, row

    return tuple(t for t in compiling() if row(t).runs)


class Chooser:
    """The draws a generator makes; adapters for hypothesis and ``random``."""

    def __init__(self, choice: Callable[[tuple], Any], integer: Callable[[int, int], int]):
        self.choice = choice
        self.integer = integer


def random_chooser(rng: random.Random) -> Chooser:
    return Chooser(lambda xs: xs[rng.randrange(len(xs))], rng.randint)


_KINDS = ("un", "binc", "binu", "ite", "cast", "red", "red", "fold", "serial", "shift", "mma",
          "mem", "pipe", "if", "while", "view", "gather", "dyn", "cred", "patch", "lib",
          "loop")


def draw_spec(ch: Chooser) -> Spec:
    """A spec from the chooser's draws."""
    dt = ch.choice(("f32", "f32", "f64", "i32", "f16", "bf16"))
    storage = ch.choice((None, None, "f16", "bf16")) if dt == "f32" else None
    rank = ch.choice((1, 2, 2))
    sizes = (1, 3, 4, 8, 16) if rank == 2 else (1, 3, 4, 8, 16, 32, 37)
    block = tuple(ch.choice(sizes) for _ in range(rank))
    nested = rank == 2 and ch.choice((False, False, True))
    s = Spec(dt, rank, block, ch.choice((False, True)), nested, storage=storage)
    s.sched = ch.choice(("default",) * 3 + SCHEDULES[1:])
    tile = list(block)
    if nested:
        tile[0] = 1
    n = ch.integer(0, 5)
    for _ in range(n):
        _draw_step(ch, s, tile, ch.choice(_KINDS), s.steps)
    return s


def _draw_step(ch: Chooser, s: Spec, tile: list, kind: str, out: list) -> None:
    """Append one step of ``kind`` (if it applies to ``s``) to ``out``."""
    dt, rank = s.dtype, s.rank
    if kind == "loop":
        # a region (or while_) whose body is a list of further steps acting on t
        inner: list = []
        form = ch.choice(("serial", "pipeline", "while", "if"))
        for _ in range(ch.integer(1, 3)):
            _draw_step(ch, s, tile, ch.choice(_KINDS[:-1]), inner)
        # (an mma draw adds no step to a rank-1 spec; a body is never empty)
        out.append(("loop", form, ch.integer(1, 3), inner or [("binu", "add")]))
        return
    fl = s.is_float
    if kind == "un":
        # f64 transcendentals are excluded: the oracle judges them bitwise against
        # numpy's own float64 functions, while the contract allows 4 ulp
        ops = (FLOAT_UNARY if dt != "f64" else F64_UNARY) if fl else INT_UNARY
        out.append(("un", ch.choice(ops)))
    elif kind == "binc":
        op = ch.choice(FLOAT_BIN if fl else INT_BIN[:5])
        big = 1e30 if dt in ("f32", "f64", "bf16") else 6e4
        c = ch.choice((0.5, -2.0, 3.0, big) if fl else (3, -2, 7))
        out.append(("binc", op, c))
    elif kind == "binu":
        out.append(("binu", ch.choice(FLOAT_BIN if fl else INT_BIN)))
    elif kind == "ite":
        out.append(("ite", ch.choice(("lt", "ge", "eq", "ne"))))
    elif kind == "cast":
        out.append(("cast", ch.choice(("i32", "f64") if fl else ("f32", "f64", "i64"))))
    elif kind == "red":
        axis = ch.integer(0, rank - 1)
        out.append(("red", axis, ch.choice(FLOAT_RED if fl else INT_RED),
                    ch.choice(POLICIES), ch.choice(FLOAT_BIN[:2] if fl else ("add",))))
    elif kind == "fold":
        axis = ch.integer(0, rank - 1)
        out.append(("fold", axis, ch.choice(POLICIES[2:]), ch.choice(("a", "b"))))
    elif kind == "serial":
        out.append(("serial", ch.integer(1, 3), ch.choice(("fwd", "rev"))))
    elif kind == "pipe":
        out.append(("pipe", ch.integer(1, 3), ch.choice((0, 1, 2)), ch.choice((True, False))))
    elif kind == "if":
        out.append(("if", ch.choice(("lt", "gt", "ne")), ch.choice(("u", "ix"))))
    elif kind == "while":
        out.append(("while", ch.integer(0, 3), ch.choice(("const", "ix"))))
    elif kind == "view":
        views = ("rev", "perm", "reshape") if rank == 2 else ("rev", "split")
        v = ch.choice(views)
        if v == "split" and tile[0] % 2:
            v = "rev"
        out.append(("view", v))
    elif kind == "gather":
        out.append(("gather", ch.integer(0, rank - 1), ch.choice(("mod", "raw"))))
    elif kind == "dyn":
        out.append(("dyn", ch.choice(("mod", "raw"))))
    elif kind == "cred":
        axis = ch.integer(0, rank - 1)
        form = ch.choice(("maxabs", "first", "pair"))
        pols = POLICIES[1:] if form == "first" else POLICIES
        out.append(("cred", axis, form, ch.choice(pols)))
    elif kind == "patch":
        axis = ch.integer(0, rank - 1)
        k = ch.choice(tuple(d for d in (1, 2, 3, 4) if tile[axis] % d == 0))
        out.append(("patch", axis, k, ch.choice(("affine", "red", "serial")),
                    ch.choice(("warp", "thread", "none"))))
    elif kind == "lib":
        fn = ch.choice(("scan", "scan", "argmax", "sort", "sort_desc"))
        out.append(("lib", fn, ch.integer(0, rank - 1),
                    ch.choice(("fold_left", "ordered_tree")) if fn == "scan" else None))
    elif kind == "mma":
        if rank == 2:
            out.append(("mma", ch.choice((True, False))))
    elif kind == "mem":
        out.append(("mem", ch.choice((0, 1, 3))))
    else:
        out.append(("shift",))


def random_spec(seed: int) -> Spec:
    """The random :class:`Spec` that ``seed`` draws (the generator of
    :func:`specs`, driven by ``random.Random(seed)``): the same spec for the
    same seed, on every machine."""
    return draw_spec(random_chooser(random.Random(seed)))


def specs() -> Any:
    """A hypothesis strategy drawing :class:`Spec` objects: random
    well-typed kernels with their compile schedules, shrinking towards
    fewer steps and simpler choices. Use it with ``@given(specs())``;
    :func:`check_spec` compiles and validates a drawn spec."""
    from hypothesis import strategies as st

    @st.composite
    def strat(draw: Any) -> Spec:
        ch = Chooser(lambda xs: draw(st.sampled_from(xs)),
                     lambda lo, hi: draw(st.integers(lo, hi)))
        return draw_spec(ch)

    return strat()


# ---------------------------------------------------------------------------
# rendering


def _lit(c: Any, dt: str) -> str:
    if dt.startswith(("f", "bf")):
        return repr(float(c))
    return str(int(c))


def _load(s: Spec, tensor: str, origin: str, shp: str, bounds: str) -> str:
    """A tile of ``tensor`` in the compute dtype (widened from narrow storage)."""
    e = f"{tensor}[{origin}, tn.shape({shp}), {bounds}]"
    return f"tn.cast({e}, tn.{s.dtype})" if s.storage else e


def render(s: Spec, name: str = "fz") -> str:
    """The spec as a Python module defining ``@tn.kernel def <name>``."""
    sdt = s.sdtype
    r = s.rank
    B = s.block
    _NAMES[0] = 0
    names = " ".join(f"N{i}" for i in range(r))
    ints = f", ix: tn.Tensor[tn.i32, \"{names}\"]" if s.uses_ints else ""
    L: list[str] = ["import tilenest as tn", "", "", "@tn.kernel",
                    (f"def {name}(x: tn.Tensor[tn.{sdt}, \"{names}\"], z: tn.Tensor[tn.{sdt}, "
                    f"\"{names}\"], y: tn.Tensor[tn.{sdt}, \"{names}\"]{ints}):")]
    ind = "    "
    L.append(ind + ", ".join(f"n{i}" for i in range(r)) + " = x.shape")
    if r == 1:
        L[-1] = ind + "(n0,) = x.shape"
    L.append(ind + "z = z.with_dims(*x.dims())")
    L.append(ind + "y = y.with_dims(*x.dims())")
    if s.uses_ints:
        L.append(ind + "ix = ix.with_dims(*x.dims())")
    grid = ", ".join(f"tn.cdiv(n{i}, {B[i]})" for i in range(r))
    L.append(ind + f"for p in tn.parallel(tn.shape({grid})):")
    ind += "    "
    h = "p"
    tile = list(B)
    if s.nested:
        L.append(ind + f"for w in p.parallel(tn.shape({B[0]}), exec=tn.exec.warp):")
        ind += "    "
        h = "w"
        tile[0] = 1
        org = [f"p.index(0) * {B[0]} + w.index()"] + [f"p.index({i}) * {B[i]}"
                                                       for i in range(1, r)]
    else:
        org = [f"p.index({i}) * {B[i]}" for i in range(r)]
    shp = ", ".join(str(t) for t in tile)
    L.append(ind + f"o = tn.coord({', '.join(org)})")
    bx = f"tn.bounds.fill({_lit(2, sdt)})" if s.fill else "tn.bounds.zero"
    L.append(ind + f"t = {_load(s, 'x', 'o', shp, bx)}")
    L.append(ind + f"u = {_load(s, 'z', 'o', shp, f'tn.bounds.fill({_lit(1, sdt)})')}")
    for st in s.steps:
        L.extend(ind + line for line in _step(st, s, h, tile, org, shp))
    out = f"tn.cast(t, tn.{sdt})" if s.storage else "t"
    L.append(ind + f"y(o, tn.shape({shp})).store({out})")
    src = "\n".join(L) + "\n"
    # one name per declared reducer contract
    count = iter(range(1 << 30))
    return re.sub(r"'fz_", lambda _: f"'fz{next(count)}_", src)


def _scalar_of(tile_expr: str, rank: int, op: str, name: str) -> list[str]:
    """Lines binding ``name`` to the ``op``-reduction of a tile over all its dims."""
    lines = [f"{name} = {tile_expr}"]
    for ax in reversed(range(rank)):
        lines.append(f"{name} = tn.reduce({name}, {name}.dim({ax}), tn.{op})")
    return lines


def _int_scalar(org: list, rank: int) -> list[str]:
    """``si``: the i64 value of ``ix`` at the tile's origin (0 outside)."""
    one = ", ".join("1" for _ in range(rank))
    return _scalar_of(f"ix[tn.coord({', '.join(org)}), tn.shape({one}), tn.bounds.zero]", rank,
                      "maximum", "si") + ["si = tn.cast(si, tn.i64)"]


#: the temporaries steps bind; each step's get a suffix of their own, so that a
#: step inside a loop never rebinds (with another type) an earlier step's variable
_TEMPS = re.compile(r"\b(sr|sf|rf|acc|ks|kp|pv|si|cm|it|ru|gi|sv|cr|sc|sq|rc|bm|am|mm|pc|part|q|"
                    r"sp|kc)\b")
_NAMES = [0]


def _step(st: tuple, s: Spec, h: str, tile: list, org: list, shp: str) -> list[str]:
    lines = _step_lines(st, s, h, tile, org, shp)
    _NAMES[0] += 1
    n = _NAMES[0]
    return [_TEMPS.sub(lambda m: f"{m.group(1)}{n}", line) for line in lines]


def _step_lines(st: tuple, s: Spec, h: str, tile: list, org: list, shp: str) -> list[str]:
    dt = s.dtype
    k = st[0]
    if k == "loop":
        _, form, n, inner = st
        _NAMES[0] += 1
        q = _NAMES[0]
        body: list[str] = []
        if form == "while":
            # if_/while_ bodies are not nest levels (E-15): their regions open
            # from the enclosing region's handle
            hd = h
            head = [f"itq{q} = tn.scalar(0, tn.i64)", f"while tn.while_(itq{q} < {n}):"]
        elif form == "if":
            hd = h
            head = _scalar_of("u", s.rank, "minimum", f"clq{q}") + [
                f"if tn.if_(clq{q} < {_lit(n - 2, dt)}):"]
        elif form == "serial":
            hd = f"lq{q}"
            head = [f"for lq{q} in {h}.serial(tn.shape({n})):"]
        else:
            hd = f"lq{q}"
            head = [f"for lq{q} in {h}.pipeline(tn.shape({n}), tn.pipeline_policy(2, 1)):"]
        for j, sub in enumerate(inner):
            if form == "pipeline":
                body.append(f"lq{q}.stage('s{j}')")
            body.extend(_step(sub, s, hd, tile, org, shp))
        if form == "while":
            body.append(f"itq{q} = itq{q} + 1")
        tail = ["else:", "    t = t - u"] if form == "if" else []
        return head + ["    " + line for line in body] + tail
    if k == "un":
        return [f"t = tn.{st[1]}(t)"]
    if k == "binc":
        op, c = st[1], _lit(st[2], dt)
        if op in _SYM:
            return [f"t = t {_SYM[op]} {c}"]
        return [f"t = tn.{op}(t, tn.scalar({c}, tn.{dt}))"]
    if k == "binu":
        op = st[1]
        return [f"t = t {_SYM[op]} u" if op in _SYM else f"t = tn.{op}(t, u)"]
    if k == "ite":
        cmp = {"lt": "<", "ge": ">=", "eq": "==", "ne": "!="}[st[1]]
        return [f"t = tn.ite(t {cmp} u, t, u * {_lit(2, dt)})"]
    if k == "cast":
        return [f"t = tn.cast(tn.cast(t, tn.{st[1]}), tn.{dt})"]
    if k == "red":
        _, axis, op, pol, comb = st
        red = {"add": "tn.add", "maximum": "tn.maximum", "minimum": "tn.minimum",
               "xor": "tn.bitwise_xor"}.get(op, f"tn.{op}")
        if op == "xor":
            red = "'xor'"
        line = f"sr = tn.reduce(t, t.dim({axis}), {red}, policy=tn.{pol})"
        return [line, f"t = t {_SYM[comb]} sr"]
    if k == "fold":
        _, axis, pol, form = st
        upd = "sf = sf - t.at(rf)" if form == "a" else (
            f"sf = t.at(rf) - sf * {_lit(2, dt)}" if s.is_float else "sf = t.at(rf) - sf * 2")
        return [_seed(s, tile, axis, "sf", 0),
                f"for rf in {h}.reduce(t.domain(t.dim({axis})), policy=tn.{pol}):",
                "    " + upd, "t = t + sf"]
    if k == "serial":
        _, n, order = st
        o = ", order='reverse'" if order == "rev" else ""
        half = _lit(0.5, dt) if s.is_float else "3"
        return ["acc = t", f"for ks in {h}.serial(tn.shape({n}){o}):",
                f"    acc = acc * {half} + u + {_icast('ks.index()', dt)}", "t = acc"]
    if k == "pipe":
        _, n, window, staged = st
        half = _lit(0.5, dt) if s.is_float else "3"
        o2 = ", ".join([f"{org[0]} + kp.index()"] + org[1:])
        body = [f"    pv = {_load(s, 'z', f'tn.coord({o2})', shp, 'tn.bounds.zero')}",
                f"    acc = acc * {half} + pv"]
        if staged:
            body = ["    kp.stage('load')", body[0], "    kp.stage('use')", body[1]]
        return (["acc = t",
                 f"for kp in {h}.pipeline(tn.shape({n}), tn.pipeline_policy({window}, 1)):"]
                + body + ["t = acc"])
    if k == "if":
        _, cmp, src = st
        c = {"lt": "<", "gt": ">", "ne": "!="}[cmp]
        if src == "ix":
            lines = _int_scalar(org, s.rank) + [f"if tn.if_((si & 3) {c} 1):"]
        else:
            lines = _scalar_of("u", s.rank, "maximum", "cm") + [
                f"if tn.if_(cm {c} {_lit(0, dt)}):"]
        return lines + [f"    t = t * {_lit(2, dt)}", "else:", "    t = t - u"]
    if k == "while":
        _, n, src = st
        half = _lit(0.5, dt) if s.is_float else "3"
        lines = ["it = tn.scalar(0, tn.i64)"]
        if src == "ix":
            lines = _int_scalar(org, s.rank) + lines + ["while tn.while_(it < (si & 3)):"]
        else:
            lines.append(f"while tn.while_(it < {n}):")
        return lines + [f"    t = t * {half} + u", "    it = it + 1"]
    if k == "view":
        v = st[1]
        if v == "rev":
            src = ", ".join([f"{tile[0] - 1} - i"] + (["j"] if s.rank == 2 else []))
            lam = "lambda i, j:" if s.rank == 2 else "lambda i:"
            return [f"t = t + tn.reindex(u, t.shape(), {lam} ({src},))"]
        if v == "perm":
            return ["t = t + tn.reindex(tn.permute(u, (1, 0)), t.shape(), lambda i, j: (j, i))"]
        if v == "reshape":
            a, b = tile
            return [f"ru = tn.reshape(u, tn.shape({b}, {a}))",
                    (f"t = t + tn.reindex(ru, t.shape(), lambda i, j: "
                    f"((i * {b} + j) // {a}, (i * {b} + j) % {a}))")]
        half = tile[0] // 2
        return [f"ru = tn.reshape(u, tn.shape(2, {half}))",
                f"t = t + tn.reindex(ru, t.shape(), lambda i: (i // {half}, i % {half}))"]
    if k == "gather":
        _, axis, mode = st
        idx = f"gi % {tile[axis] + 2}" if mode == "mod" else "gi"
        return [f"gi = ix[o, tn.shape({shp}), tn.bounds.zero]",
                f"t = t + tn.gather(u, {idx}, {axis}, {_lit(3, dt)})"]
    if k == "dyn":
        off = "si % 5" if st[1] == "mod" else "si"
        o2 = ", ".join([f"{org[0]} + {off}"] + org[1:])
        return _int_scalar(org, s.rank) + [
            f"t = t + {_load(s, 'x', f'tn.coord({o2})', shp, 'tn.bounds.zero')}"]
    if k == "cred":
        _, axis, form, pol = st
        zero = _lit(0, dt)
        if form == "maxabs":
            # the identity is the least state: 0 for floats (abs is never
            # below it), the dtype's minimum for integers, where abs wraps at
            # the minimum and the least state is that minimum itself
            least = zero if s.is_float else _lit(-(1 << (int(dt[1:]) - 1)), dt)
            return [(f"cr = tn.reducer('fz_maxabs', identity={least}, merge=lambda a, b: "
                    f"tn.maximum(a, b), lift=lambda a: tn.abs(a), dtype=tn.{dt})"),
                    _seed(s, tile, axis, "sc", 0),
                    (f"for rc in {h}.reduce(t.domain(t.dim({axis})), contract=cr, "
                    f"policy=tn.{pol}):"),
                    "    sc = tn.maximum(sc, tn.abs(t.at(rc)))", "t = t - sc"]
        if form == "first":
            return [(f"cr = tn.reducer('fz_first', identity={zero}, merge=lambda a, b: "
                    f"tn.ite(a != {zero}, a, b), dtype=tn.{dt}, commutative=False)"),
                    _seed(s, tile, axis, "sc", 0),
                    (f"for rc in {h}.reduce(t.domain(t.dim({axis})), contract=cr, "
                    f"policy=tn.{pol}):"),
                    f"    sc = tn.ite(sc != {zero}, sc, t.at(rc))", "t = t + sc"]
        return [(f"cr = tn.reducer('fz_pair', identity=({zero}, {zero}), merge=lambda a0, a1, "
                f"b0, b1: (a0 + b0, a1 + b1), dtype=(tn.{dt}, tn.{dt}))"),
                _seed(s, tile, axis, "sc", 0), _seed(s, tile, axis, "sq", 0),
                f"for rc in {h}.reduce(t.domain(t.dim({axis})), contract=cr, policy=tn.{pol}):",
                "    sc = sc + t.at(rc)", "    sq = sq + t.at(rc) * t.at(rc)",
                "t = t + sc - sq"]
    if k == "patch":
        # K parallel children each rewrite their own slice of t along ``axis``
        # (a put chain: disjoint footprints, so no race)
        _, axis, kk, form, ex = st
        w = tile[axis] // kk
        if ex == "warp" and s.nested:
            ex = "thread"
        exe = "" if ex == "none" else f", exec=tn.exec.{ex}"
        ext = [str(w) if a == axis else str(tile[a]) for a in range(s.rank)]
        sh = ", ".join(f"tn.axis(t.dim({a}), {ext[a]})" for a in range(s.rank))
        iv = ", ".join("ij"[:s.rank])
        src = ", ".join(f"pc.index() * {w} + {v}" if a == axis else v
                        for a, v in enumerate("ij"[:s.rank]))
        qsrc = ", ".join(f"{tile[axis] - w} - pc.index() * {w} + {v}" if a == axis else v
                         for a, v in enumerate("ij"[:s.rank]))
        org2 = ", ".join(f"pc.index() * {w}" if a == axis else "0" for a in range(s.rank))
        half = _lit(0.5, dt) if s.is_float else "3"
        lines = [f"for pc in {h}.parallel(tn.shape({kk}){exe}):",
                 f"    part = tn.reindex(t, tn.shape({sh}), lambda {iv}: ({src},))",
                 f"    q = tn.reindex(u, tn.shape({sh}), lambda {iv}: ({qsrc},))"]
        if form == "affine":
            lines.append(f"    part = part * {_lit(2, dt)} + q")
        elif form == "red":
            lines += [f"    sp = tn.reduce(part, part.dim({axis}), tn.maximum)",
                      "    part = part - sp + q"]
        else:
            lines += ["    for kc in pc.serial(tn.shape(2)):",
                      f"        part = part * {half} + q"]
        return lines + [f"    t = tn.put(t, ({org2},), part)"]
    if k == "lib":
        _, fn, axis, pol = st
        lam = "lambda i, j: (i, j)" if s.rank == 2 else "lambda i: (i,)"
        if fn == "scan":
            op = "tn.add" if s.is_float else "'xor'"
            return [f"t = t - tn.scan(t, t.dim({axis}), {op}, policy=tn.{pol})"]
        if fn == "argmax":
            return [f"t = t + {_icast(f'tn.argmax(t, t.dim({axis}))', dt)}"]
        desc = ", descending=True" if fn == "sort_desc" else ""
        return [f"sv, si = tn.sort(t, t.dim({axis}){desc})",
                f"t = t * {_lit(2, dt)} + tn.reindex(sv, t.shape(), {lam})",
                f"t = t + tn.reindex({_icast('si', dt)}, t.shape(), {lam})"]
    if k == "mma":
        # t (m, k) x b (k, n) + acc (m, n), with b a reindex of u; the result is
        # read back over t's dims
        b0, b1 = tile
        reassoc = "True" if st[1] else "False"
        return [(f"bm = tn.reindex(u, tn.shape(tn.axis(t.dim(1), {b1}), {b1}), "
                f"lambda i, j: (j % {b0}, i))"),
                (f"am = tn.full(tn.{dt}, tn.shape(tn.axis(t.dim(0), {b0}), "
                f"tn.axis(bm.dim(1), {b1})), {_lit(1, dt)})"),
                f"cm = tn.mma(t, bm, am, allow_reassociation={reassoc})",
                "t = t + tn.reindex(cm, t.shape(), lambda i, j: (i, j))"]
    if k == "mem":
        pad = st[1]
        if s.rank == 1:
            lay = f"tn.layout(t.shape(), strides=(1 + {pad},))"
        else:
            lay = f"tn.layout(t.shape(), strides=({tile[1]} + {pad}, 1))"
        return [f"mm = tn.memory(tn.{dt}, {lay})", "mm.store(t)",
                "t = t + tn.reindex(mm.load(), t.shape(), " +
                ("lambda i: (i,))" if s.rank == 1 else "lambda i, j: (i, j))")]
    if k == "shift":
        o2 = ", ".join(f"{x} - 1" for x in org)
        return [f"sv = {_load(s, 'x', f'tn.coord({o2})', shp, 'tn.bounds.zero')}", "t = t + sv"]
    raise ValueError(k)


def _icast(e: str, dt: str) -> str:
    """The i64 expression ``e`` cast to ``dt``; i64 -> f16/bf16 has no lowering
    (see "Known gaps" in spec/lowering.md), so those go through i32."""
    if dt in ("f16", "bf16"):
        return f"tn.cast(tn.cast({e}, tn.i32), tn.{dt})"
    return f"tn.cast({e}, tn.{dt})"


def _seed(s: Spec, tile: list, axis: int, name: str, value: Any) -> str:
    """A state over the dims of ``t`` other than ``axis``, all ``value``."""
    dt = s.dtype
    if s.rank == 1:
        return f"{name} = tn.scalar({_lit(value, dt)}, tn.{dt})"
    keep = 1 - axis
    return f"{name} = tn.full(tn.{dt}, tn.shape({tile[keep]}), {_lit(value, dt)}, " \
           f"dims=(t.dim({keep}),))"


_COUNTER = [0]


def build(s: Spec, name: str = "fz") -> Any:
    """Capture the spec's kernel through the DSL frontend; returns the Kernel."""
    src = render(s, name)
    _COUNTER[0] += 1
    fname = f"<tilenest-fuzz-{_COUNTER[0]}>"
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
    ns: dict[str, Any] = {"__name__": f"tilenest_fuzz_{_COUNTER[0]}"}
    exec(compile(src, fname, "exec"), ns)  # noqa: S102 - our own generated source
    return ns[name]


@dataclass
class FuzzResult:
    """The outcome of :func:`check_spec` on one spec: its ``status``, a
    ``message`` saying why (for anything but ``ok``), the kernel's TileIR and
    DSL source, and how many generated cases were compared and skipped."""

    spec: Spec
    status: str
    message: str = ""
    tileir: str = ""
    source: str = ""
    #: how many cases were compared (``ok`` or rejected by both) and skipped
    compared: int = 0
    skipped: int = 0


def check_spec(s: Spec, cases: int = 2, seed: int = 0, compile_fn: Any = None,
               target: str = "llvm") -> FuzzResult:
    """Compile the spec's kernel for ``target`` (:func:`fuzz_targets`; a target
    with a device runs here as its row's ``host_run`` options say: ``cuda``
    on the host emulator, whose successive calls rotate the thread
    interleaving and the shared-memory poison) and validate it on ``cases``
    generated cases.
    Status: ``ok`` (some case compared, none mismatched), ``skipped`` (the
    oracle skipped every case: the program is invalid on them or its control
    flow depends on inexact values), ``mismatch``, ``unsupported`` (capture or
    lowering refuses the kernel with a tilenest error), or ``error`` (anything
    else: a bug)."""
    from ..errors import NotAvailableError, TilenestError
    from .validate import validate

    if target not in fuzz_targets():
        raise TilenestError(f"the fuzzer has no target '{target}'",
                            hint="targets: " + ", ".join(fuzz_targets()))
    src = render(s)
    try:
        k = build(s)
        prog = k.program
    except TilenestError as e:
        return FuzzResult(s, "unsupported", f"capture: {e.message}", "", src)
    except Exception as e:  # noqa: BLE001 - capture crashed: a frontend bug
        return FuzzResult(s, "error", f"capture crashed: {type(e).__name__}: {e}", "", src)
    text = str(prog)
    try:
        if compile_fn is not None:
            compiled = compile_fn(prog)
        else:
            # uncached: a long campaign would otherwise keep every kernel alive
            from ..targets import compiler

            row = compiler(target)
            compiled = row.compile(prog, schedule_for(s, prog, target), cache=False,
                                   **row.host_run)
        rep = validate(prog, cases=cases, seed=seed, limit=40, compiled=compiled)
    except NotAvailableError as e:
        return FuzzResult(s, "unsupported", e.message, text, src)
    except Exception as e:  # noqa: BLE001 - any other exception is a compiler bug
        return FuzzResult(s, "error", f"{type(e).__name__}: {e}", text, src)
    compared = rep.count("ok") + rep.count("rejected")
    skipped = rep.count("skipped")
    if rep.mismatches:
        f = rep.smallest_failure()
        assert f is not None
        return FuzzResult(s, "mismatch", f"case {f.label}: {f.message}", text, src, compared,
                          skipped)
    if compared == 0:
        why = next((r.message for r in rep.results if r.status == "skipped"), "")
        return FuzzResult(s, "skipped", why, text, src, compared, skipped)
    return FuzzResult(s, "ok", "", text, src, compared, skipped)


def campaign(n: int, seed: int = 0, cases: int = 2,
             progress: Callable[[int, FuzzResult], None] | None = None) -> list[FuzzResult]:
    """Check ``n`` random specs drawn from ``seed``; returns every result."""
    out = []
    for i in range(n):
        r = check_spec(random_spec(seed * 1_000_003 + i), cases, seed + i)
        out.append(r)
        if progress is not None:
            progress(i, r)
    return out


def summarize(results: list[FuzzResult]) -> dict[str, int]:
    """Counts of each status, plus the number of cases compared and skipped."""
    out: dict[str, int] = {}
    for r in results:
        out[r.status] = out.get(r.status, 0) + 1
    out["cases_compared"] = sum(r.compared for r in results)
    out["cases_skipped"] = sum(r.skipped for r in results)
    return out


#: a campaign's targets: (target, k) runs the target on every k-th item
#: (items 0, k, 2k, ...); the first target runs on every item
Plan = tuple[tuple[str, int], ...]


def parse_targets(text: str) -> Plan:
    """``llvm,cuda:50`` -> ``(("llvm", 1), ("cuda", 50))``: targets of
    :func:`fuzz_targets`, each optionally ``:K`` (every K-th item only). The first
    must run on every item, so that each item has a verdict."""
    from ..errors import TilenestError

    plan: list[tuple[str, int]] = []
    for part in text.split(","):
        name, _, every = part.strip().partition(":")
        if name not in fuzz_targets():
            raise TilenestError(f"--targets {text!r}: no fuzz target '{name}'",
                                hint="targets: " + ", ".join(fuzz_targets()) +
                                     " (e.g. llvm,cuda:50: cuda on every 50th program)")
        if every and (not every.isdigit() or int(every) < 1):
            raise TilenestError(f"--targets {text!r}: '{part}' is not TARGET or TARGET:K "
                                "with K >= 1", hint="e.g. llvm,cuda:50")
        if any(t == name for t, _ in plan):
            raise TilenestError(f"--targets {text!r}: '{name}' is given twice")
        plan.append((name, int(every) if every else 1))
    if plan[0][1] != 1:
        raise TilenestError(f"--targets {text!r}: the first target runs on every program",
                            hint=f"e.g. llvm,{plan[0][0]}:{plan[0][1]}")
    return tuple(plan)


def plan_name(plan: Plan, cases: int = 2, mutant: str | None = None) -> str:
    """The campaign name a state file records for this plan: ``fuzz-llvm``
    for the LLVM campaign (as ``python -m tilenest.validation.fuzz`` writes
    it), ``fuzz-llvm+cuda:50``..., with the cases and an injected mutant when
    they are not the defaults (resuming under another plan is refused)."""
    name = "fuzz-" + "+".join(t if k == 1 else f"{t}:{k}" for t, k in plan)
    if cases != 2:
        name += f"-cases{cases}"
    if mutant:
        name += f"-mutant:{mutant}"
    return name


def init_worker(targets: Plan = (("llvm", 1),)) -> None:
    """Set up a process that checks programs, once: the compilers and runtimes
    of every target of the plan are loaded and used by validating the empty
    spec on each (LLVM's initialisation, NVRTC's library, the emulator's host
    compiler), so that no campaign item pays for them. A target that fails
    here fails again, and is reported, in the items themselves."""
    for t, _ in targets:
        check_spec(Spec(), 1, 0, target=t)


def _compile_with_mutant(s: Spec, mutant: str) -> Callable[[Any], Any]:
    """An LLVM compile that injects the bug ``mutant`` (tilenest.validation.mutants)
    where it applies and compiles correctly elsewhere: a deliberately broken
    target, to show that a campaign finds and shrinks what it should."""
    def compile_fn(prog: Any) -> Any:
        from ..backends.llvm import compile_program
        from .mutants import compile_mutant

        try:
            return compile_mutant(prog, mutant, schedule_for(s, prog))
        except ValueError:  # the mutation does not apply to this kernel
            return compile_program(prog, schedule_for(s, prog), cache=False)
    return compile_fn


def _on_target(s: Spec, cases: int, seed: int, target: str, mutant: str | None) -> FuzzResult:
    from .mutants import TARGET as MUTATED

    fn = _compile_with_mutant(s, mutant) if mutant and target == MUTATED else None
    return check_spec(s, cases, seed, compile_fn=fn, target=target)


def _same_failure(r: FuzzResult, want: FuzzResult) -> bool:
    """Does ``r`` fail as ``want`` does: the same status, and for an ``error``
    the same kind (the text before the first colon: an exception type, or
    ``capture crashed``)?"""
    if r.status != want.status:
        return False
    return want.status != "error" or r.message.split(":")[0] == want.message.split(":")[0]


def check_item(seed: int, i: int, cases: int = 2, targets: Plan = (("llvm", 1),),
               mutant: str | None = None, shrink_secs: float = 0.0) -> dict[str, Any]:
    """Campaign item ``i`` of ``seed``: the random spec ``seed * 1_000_003 + i``
    (the same stream :func:`campaign` draws) validated on ``cases`` cases on
    each target of the plan that runs on item ``i``.

    The record's ``targets`` maps each target run to its status, cases
    compared and skipped (and message); its own ``status`` is the first
    ``mismatch`` or ``error`` among them in plan order, else the first
    target's. A failure keeps its TileIR and DSL source, and with
    ``shrink_secs > 0`` it is shrunk here, in the process that found it
    (:func:`tilenest.validation.shrink.shrink_spec`, at most that many
    processor seconds): ``shrunk`` holds the smallest spec on which the same
    target still fails the same way, its source, TileIR and message, and
    where it was shrunk (host and process id). ``mutant`` compiles the LLVM
    target with that deliberate bug (:mod:`tilenest.validation.mutants`)."""
    s = random_spec(seed * 1_000_003 + i)
    results: dict[str, FuzzResult] = {}
    for t, every in targets:
        if i % every == 0:
            results[t] = _on_target(s, cases, seed + i, t, mutant)
    per = {t: {"status": r.status, "compared": r.compared, "skipped": r.skipped,
               **({"message": r.message} if r.status != "ok" else {})}
           for t, r in results.items()}
    bad = next((t for t, r in results.items() if r.status in ("mismatch", "error")), None)
    head = results[bad if bad is not None else targets[0][0]]
    rec: dict[str, Any] = {"status": head.status,
                           "compared": sum(r.compared for r in results.values()),
                           "skipped": sum(r.skipped for r in results.values()),
                           "targets": per}
    if head.status != "ok":
        rec["message"] = head.message
    if bad is not None:
        rec["target"] = bad
        rec["tileir"] = head.tileir
        rec["source"] = head.source
        if shrink_secs > 0:
            rec["shrunk"] = _shrink(head, cases, seed + i, bad, mutant, shrink_secs)
    return rec


def _shrink(found: FuzzResult, cases: int, seed: int, target: str, mutant: str | None,
            budget: float) -> dict[str, Any]:
    """Shrink a failure on ``target``; the record of the result."""
    import os
    import socket

    from .shrink import flat_size, shrink_spec

    last: dict[str, FuzzResult] = {}

    def fails(c: Spec) -> bool:
        r = _on_target(c, cases, seed, target, mutant)
        if _same_failure(r, found):
            last["r"] = r
            return True
        return False

    out = shrink_spec(found.spec, fails, budget)
    r = last.get("r", found)
    return {"spec": repr(out.value), "source": r.source, "tileir": r.tileir,
            "status": r.status, "message": r.message, "steps": flat_size(out.value.steps),
            "from_steps": flat_size(found.spec.steps), "tries": out.tries, "kept": out.kept,
            "cpu_secs": out.secs, "stopped": out.stopped, "host": socket.gethostname(),
            "pid": os.getpid()}


def main(argv: list[str] | None = None) -> int:
    """``python -m tilenest.validation.fuzz [N] [SEED] [--count N] [--seed S]
    [--state FILE] [--workers W]``: a seeded differential campaign of N random
    programs on the LLVM target (N and SEED may be given by position or by
    flag, as for ``tilenest.validation.fuzz_text``). With ``--state`` it is
    resumable (rerun the same command to continue). Prints every failure
    (TileIR and DSL source) and a summary; exit status 1 on any mismatch,
    error, crash or timeout."""
    import argparse
    import sys
    import time
    from pathlib import Path

    from .campaign import is_bug, run_campaign

    ap = argparse.ArgumentParser(prog="python -m tilenest.validation.fuzz",
                                 description=main.__doc__.split("\n\n")[0])
    ap.add_argument("n", nargs="?", type=int, metavar="N", help="programs (same as --count)")
    ap.add_argument("s", nargs="?", type=int, metavar="SEED", help="seed (same as --seed)")
    ap.add_argument("--count", type=int, help="programs in the campaign (default 5000)")
    ap.add_argument("--seed", type=int, help="campaign seed (default 20260)")
    ap.add_argument("--state", type=Path, metavar="FILE",
                    help="JSON-lines state file (resumable)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=120.0,
                    help="CPU seconds one program may take before it counts as a timeout")
    a = ap.parse_args(sys.argv[1:] if argv is None else argv)
    for pos, flag, name, default in ((a.n, a.count, "count", 5000),
                                     (a.s, a.seed, "seed", 20260)):
        if pos is not None and flag is not None and pos != flag:
            ap.error(f"the {name} is given twice, as {pos} and as --{name} {flag}")
        setattr(a, name, next((v for v in (flag, pos) if v is not None), default))
    if a.count < 1 or a.workers < 1:
        ap.error("count and --workers must be at least 1")
    t0 = time.perf_counter()
    n0 = [0]

    def progress(st: Any, rec: dict[str, Any]) -> None:
        n0[0] += 1
        if is_bug(rec):
            print(f"#{rec['i']} {rec['status']}: {rec.get('message', '')}\n--- TileIR ---\n"
                  f"{rec.get('tileir', '')}\n--- DSL ---\n{rec.get('source', '')}", flush=True)
        elif rec["status"] in ("unsupported", "skipped"):
            msg = rec.get("message", "")
            print(f"#{rec['i']} {rec['status']}: {msg.splitlines()[0] if msg else ''}",
                  flush=True)
        if n0[0] % 250 == 0:
            print(f"... {len(st.records)}/{a.count} programs, "
                  f"{time.perf_counter() - t0:.0f} s", flush=True)

    st = run_campaign("fuzz-llvm", check_item, a.count, a.seed, state=a.state,
                      workers=a.workers, time_limit=a.time_limit, progress=progress)
    summ = st.summary()
    summ["cases_compared"] = sum(r.get("compared", 0) for r in st.records.values())
    summ["cases_skipped"] = sum(r.get("skipped", 0) for r in st.records.values())
    summ["wall_secs_this_run"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(summ))
    return 1 if summ["bugs"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
