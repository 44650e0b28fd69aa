"""Random well-typed kernels for differential fuzzing of the whole lowering.

A :class:`Spec` describes one kernel: dtype, rank, tile shape, how the tile is
read (bounds zero or fill, shifted second views that hang over both edges),
whether the programs nest a ``parallel`` level, and a list of *steps* applied
to the current tile ``t``:

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
* ``shift``  -- a second read of ``x`` one element up-left (negative
  coordinates fall outside the view);
* ``mma``    -- ``t += mma(t, b, 1)`` (rank 2, floats and ints) with ``b`` a
  reindex of ``u``, with or without reassociation;
* ``mem``    -- a round trip through an explicit Memory with a padded layout.

:func:`render` writes the spec as Python DSL source; :func:`build` captures it
through the real frontend (so fuzzing also exercises capture and the type
rules); :func:`specs` is the hypothesis strategy (shrinking removes steps and
simplifies choices), :func:`random_spec` the same generator driven by a seeded
``random.Random`` for campaigns outside hypothesis. Failures are reported with
the kernel's TileIR.
"""

from __future__ import annotations

import linecache
import random
from dataclasses import dataclass, field
from typing import Any, Callable

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

    @property
    def is_float(self) -> bool:
        return self.dtype.startswith("f")


class Chooser:
    """The draws a generator makes; adapters for hypothesis and ``random``."""

    def __init__(self, choice: Callable[[tuple], Any], integer: Callable[[int, int], int]):
        self.choice = choice
        self.integer = integer


def random_chooser(rng: random.Random) -> Chooser:
    return Chooser(lambda xs: xs[rng.randrange(len(xs))], rng.randint)


def draw_spec(ch: Chooser) -> Spec:
    """A spec from the chooser's draws."""
    dt = ch.choice(("f32", "f32", "f64", "i32"))
    rank = ch.choice((1, 2, 2))
    block = tuple(ch.choice((1, 3, 4, 8, 16)) for _ in range(rank))
    nested = rank == 2 and ch.choice((False, False, True))
    s = Spec(dt, rank, block, ch.choice((False, True)), nested)
    n = ch.integer(0, 5)
    for _ in range(n):
        kind = ch.choice(("un", "binc", "binu", "ite", "cast", "red", "red", "fold", "serial",
                          "shift", "mma", "mem"))
        fl = s.is_float
        if kind == "un":
            # f64 transcendentals are excluded: the oracle judges them bitwise against
            # numpy's own float64 functions, while the contract allows 4 ulp
            ops = (FLOAT_UNARY if dt != "f64" else F64_UNARY) if fl else INT_UNARY
            s.steps.append(("un", ch.choice(ops)))
        elif kind == "binc":
            op = ch.choice(FLOAT_BIN if fl else INT_BIN[:5])
            c = ch.choice((0.5, -2.0, 3.0, 1e30) if fl else (3, -2, 7))
            s.steps.append(("binc", op, c))
        elif kind == "binu":
            s.steps.append(("binu", ch.choice(FLOAT_BIN if fl else INT_BIN)))
        elif kind == "ite":
            s.steps.append(("ite", ch.choice(("lt", "ge", "eq", "ne"))))
        elif kind == "cast":
            s.steps.append(("cast", ch.choice(("i32", "f64") if fl else ("f32", "f64", "i64"))))
        elif kind == "red":
            axis = ch.integer(0, rank - 1)
            s.steps.append(("red", axis, ch.choice(FLOAT_RED if fl else INT_RED),
                            ch.choice(POLICIES), ch.choice(FLOAT_BIN[:2] if fl else ("add",))))
        elif kind == "fold":
            axis = ch.integer(0, rank - 1)
            s.steps.append(("fold", axis, ch.choice(POLICIES[2:]), ch.choice(("a", "b"))))
        elif kind == "serial":
            s.steps.append(("serial", ch.integer(1, 3), ch.choice(("fwd", "rev"))))
        elif kind == "mma":
            if rank == 2:
                s.steps.append(("mma", ch.choice((True, False))))
        elif kind == "mem":
            s.steps.append(("mem", ch.choice((0, 1, 3))))
        else:
            s.steps.append(("shift",))
    return s


def random_spec(seed: int) -> Spec:
    return draw_spec(random_chooser(random.Random(seed)))


def specs() -> Any:
    """The hypothesis strategy of :class:`Spec` s."""
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
    if dt.startswith("f"):
        return repr(float(c))
    return str(int(c))


def render(s: Spec, name: str = "fz") -> str:
    """The spec as a Python module defining ``@tn.kernel def <name>``."""
    dt = s.dtype
    r = s.rank
    B = s.block
    names = " ".join(f"N{i}" for i in range(r))
    L: list[str] = ["import tilenest as tn", "", "", "@tn.kernel",
                    f"def {name}(x: tn.Tensor[tn.{dt}, \"{names}\"], z: tn.Tensor[tn.{dt}, "
                    f"\"{names}\"], y: tn.Tensor[tn.{dt}, \"{names}\"]):"]
    ind = "    "
    L.append(ind + ", ".join(f"n{i}" for i in range(r)) + (",) = x.shape" if r == 1 else
                                                              " = x.shape"))
    if r == 1:
        L[-1] = ind + "(n0,) = x.shape"
    L.append(ind + "z = z.with_dims(*x.dims())")
    L.append(ind + "y = y.with_dims(*x.dims())")
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
    bx = f"tn.bounds.fill({_lit(2, dt)})" if s.fill else "tn.bounds.zero"
    L.append(ind + f"t = x[o, tn.shape({shp}), {bx}]")
    L.append(ind + f"u = z[o, tn.shape({shp}), tn.bounds.fill({_lit(1, dt)})]")
    cur = dt
    for st in s.steps:
        L.extend(ind + line for line in _step(st, s, h, tile, org, shp))
        cur = dt
    _ = cur
    L.append(ind + f"y(o, tn.shape({shp})).store(t)")
    return "\n".join(L) + "\n"


def _step(st: tuple, s: Spec, h: str, tile: list, org: list, shp: str) -> list[str]:
    dt = s.dtype
    k = st[0]
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
        if s.rank == 1:
            seed = f"sf = tn.scalar({_lit(0, dt)}, tn.{dt})"
        else:
            keep = 1 - axis
            seed = f"sf = tn.zeros(tn.{dt}, tn.shape({tile[keep]}), dims=(t.dim({keep}),))"
        upd = "sf = sf - t.at(rf)" if form == "a" else (
            f"sf = t.at(rf) - sf * {_lit(2, dt)}" if s.is_float else "sf = t.at(rf) - sf * 2")
        return [seed, f"for rf in {h}.reduce(t.domain(t.dim({axis})), policy=tn.{pol}):",
                "    " + upd, "t = t + sf"]
    if k == "serial":
        _, n, order = st
        o = ", order='reverse'" if order == "rev" else ""
        half = _lit(0.5, dt) if s.is_float else "3"
        return ["acc = t", f"for ks in {h}.serial(tn.shape({n}){o}):",
                f"    acc = acc * {half} + u + tn.cast(ks.index(), tn.{dt})", "t = acc"]
    if k == "mma":
        # t (m, k) x b (k, n) + acc (m, n), with b a reindex of u; the result is
        # read back over t's dims
        b0, b1 = tile
        reassoc = "True" if st[1] else "False"
        return [f"bm = tn.reindex(u, tn.shape(tn.axis(t.dim(1), {b1}), {b1}), "
                f"lambda i, j: (j % {b0}, i))",
                f"am = tn.full(tn.{dt}, tn.shape(tn.axis(t.dim(0), {b0}), "
                f"tn.axis(bm.dim(1), {b1})), {_lit(1, dt)})",
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
        return [f"v = x[tn.coord({o2}), tn.shape({shp}), tn.bounds.zero]", "t = t + v"]
    raise ValueError(k)


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
    spec: Spec
    status: str
    message: str = ""
    tileir: str = ""
    source: str = ""


def check_spec(s: Spec, cases: int = 2, seed: int = 0, compile_fn: Any = None) -> FuzzResult:
    """Compile the spec's kernel and validate it on ``cases`` generated cases.
    Status: ``ok``, ``mismatch``, ``unsupported`` (capture or lowering refuses
    the kernel with a tilenest error), or ``error`` (anything else: a bug)."""
    from ..errors import NotAvailableError, TilenestError
    from .validate import validate

    src = render(s)
    try:
        k = build(s)
        prog = k.program
    except TilenestError as e:
        return FuzzResult(s, "unsupported", f"capture: {e.message}", "", src)
    text = str(prog)
    try:
        compiled = compile_fn(prog) if compile_fn is not None else None
        rep = validate(prog, cases=cases, seed=seed, limit=40, compiled=compiled)
    except NotAvailableError as e:
        return FuzzResult(s, "unsupported", e.message, text, src)
    except Exception as e:  # noqa: BLE001 - any other exception is a compiler bug
        return FuzzResult(s, "error", f"{type(e).__name__}: {e}", text, src)
    if not rep.ok:
        f = rep.smallest_failure()
        return FuzzResult(s, "mismatch", f"case {f.label}: {f.message}", text, src)
    return FuzzResult(s, "ok", "", text, src)


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
