"""The op x dtype sweep of the LLVM backend, derived from the semantics.

Every combination the semantics admits is compiled, run and judged by the
oracle (``tn.reference``; the compiled output must be admitted):

* each unary, binary and comparison op of ``semantics/ops/values.py`` on
  every dtype of ``dtypes.ALL`` its type rule accepts (the type rules decide,
  not a list here), ``ite`` and ``map`` on every dtype;
* ``cast`` between every ordered pair of dtypes, ``bitcast`` between every
  pair of equal width;
* ``reduce`` with each built-in reducer (``reducers.BUILTINS``) on every dtype
  it accepts and whose merge op is defined on it, under every reduction policy;
* ``mma`` for every input x accumulator dtype pair the ``mma`` type rule
  accepts whose accumulator has ``add`` and ``mul`` (:func:`mma_pair`).

Run as a script (``python -I tests/llvm_sweep.py OUT.json [INDEX COUNT [PART]]``)
it does all of that (or one shard of it; of the groups of ``PART``, see
:func:`in_part`) in the current process and writes one
JSON record per combination (``{"key": {"ok": bool, "detail": str}}``) plus
the list of top-level modules loaded. Kernels are batched: one kernel per
group (up to six unary ops on f16, say; one ``mma`` pair), each combination
storing to its own rows of the group's outputs, so the oracle's verdict is
read per combination.
When a group fails to compile or run, each of its combinations is retried
alone so the failure is attributed. Progress goes to stderr (a crash names the group in flight).
"""

from __future__ import annotations

import json
import linecache
import sys
import time
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

import tilenest as tn
from tilenest.backends.llvm import symbols
from tilenest.errors import TilenestError, TypeCheckError
from tilenest.interpreter.oracle import Admitted
from tilenest.semantics import dtypes as D
from tilenest.semantics.ops import values as V
from tilenest.semantics.policies import ReductionPolicy
from tilenest.semantics.reducers import BUILTINS
from tilenest.semantics.space import Space
from tilenest.semantics.types import TileType

DTYPES = [d.name for d in D.ALL]
#: the overflow policies a cast into an FP8 format is swept with (V-24)
FP8_POLICIES = ("saturate", "nonfinite")
POLICIES = [p.value for p in ReductionPolicy]
#: integer ops whose right operand must be nonzero / a shift count in range
#: (a zero divisor or negative count is an error in both the interpreter and
#: compiled code, checked elsewhere; here every combination must produce values)
DIVISOR_OPS = ("div", "rem", "floordiv", "mod")
SHIFT_OPS = ("shl", "shr")
#: ops of the ``values`` family that are structural (they move or index
#: values and do not depend on the dtype's arithmetic) and are exercised by
#: the other LLVM tests; every other op of the registry must be swept
STRUCTURAL = ("const", "index", "reindex", "gather", "broadcast", "reshape", "permute", "put",
              "per")


def _tdt(name: str) -> str:
    return "bool_" if name == "bool" else name


def _accepts(rule, *dts: str) -> bool:  # type: ignore[no-untyped-def]
    try:
        rule(*(TileType(D.parse(d), Space()) for d in dts))
    except TypeCheckError:
        return False
    return True


@dataclass(frozen=True)
class Combo:
    """One combination: ``kind`` (unary, binary, ite, map, cast, bitcast, reduce,
    mma), the op (reducer and policy for reduce), operand and result dtypes."""

    kind: str
    op: str
    dtype: str
    result: str

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.op}:{self.dtype}->{self.result}"


def combos() -> list[Combo]:
    """Every combination, from the semantics' own tables and type rules."""
    out = []
    for dt in DTYPES:
        for op in V.UNARY:
            if _accepts(lambda t, op=op: V.check_unary(op, t), dt):
                out.append(Combo("unary", op, dt, str(V.check_unary(
                    op, TileType(D.parse(dt), Space())).dtype)))
        for op in V.BINARY + V.COMPARE:
            if _accepts(lambda a, b, op=op: V.check_binary(op, a, b), dt, dt):
                t = TileType(D.parse(dt), Space())
                out.append(Combo("binary", op, dt, str(V.check_binary(op, t, t).dtype)))
        out.append(Combo("ite", "ite", dt, dt))
        if _accepts(lambda a, b: V.check_binary("maximum", a, b), dt, dt):  # the map's body
            out.append(Combo("map", "map", dt, dt))
        for dst in DTYPES:
            if D.parse(dst).is_fp8 and dst != dt:  # a cast into FP8 states its policy
                out += [Combo("cast", f"cast/{pol}", dt, dst) for pol in FP8_POLICIES]
            else:
                out.append(Combo("cast", "cast", dt, dst))
            if D.parse(dst).bits == D.parse(dt).bits:
                out.append(Combo("bitcast", "bitcast", dt, dst))
        for r in BUILTINS.values():  # the reducer accepts dt and its merge op types
            if r.accepts(D.parse(dt)) and _accepts(
                    lambda a, b, op=r.op: V.check_binary(op, a, b), dt, dt):
                for pol in POLICIES:
                    out.append(Combo("reduce", f"{r.name}/{pol}", dt, dt))
    for src in DTYPES:
        for acc in DTYPES:
            if mma_pair(src, acc):
                out.append(Combo("mma", "mma", src, acc))
    return out


def mma_pair(src: str, acc: str) -> bool:
    """Whether ``mma`` is defined for inputs ``src`` into accumulator ``acc``:
    the type rule's exact widening, and ``add``/``mul`` defined on ``acc``
    (``acc + sum a*b`` needs both; bool has neither)."""
    return V.widens(D.parse(src), D.parse(acc)) and all(
        _accepts(lambda a, b, op=op: V.check_binary(op, a, b), acc, acc) for op in ("add", "mul"))


# ---------------------------------------------------------------------------
# input values


def values(dt: str, n: int, rng: np.random.Generator, exhaustive: bool = False) -> np.ndarray:
    """``n`` values of ``dt``: special values first (zeros, +-1, extremes, inf,
    NaN, subnormals), then random bit patterns and moderate values; every bit
    pattern (repeated) when ``exhaustive`` and the dtype has at most 16 bits."""
    d = D.parse(dt)
    npdt = d.np
    if dt == "bool":
        return (np.arange(n) % 3 == 1) ^ rng.integers(0, 2, n).astype(bool)
    ui = np.dtype(f"u{d.itemsize}")
    if exhaustive and d.bits <= 16:
        return (np.arange(n) % (1 << d.bits)).astype(ui).view(npdt)
    if d.is_int:
        info = np.iinfo(npdt)
        special = [0, 1, info.max, info.min, 2, 3, 7, info.max - 1, info.min + 1]
        if d.is_signed:
            special += [-1, -2, -7]
        rand = rng.integers(info.min, info.max, n, dtype=npdt, endpoint=True)
        small = rng.integers(max(info.min, -100), 100, n, dtype=npdt)
        x = np.where(rng.random(n) < 0.5, rand, small).astype(npdt)
    else:
        fi = ml_dtypes.finfo(npdt)
        special = [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, np.inf, -np.inf, np.nan, float(fi.max),
                   -float(fi.max), float(fi.tiny), float(fi.smallest_subnormal),
                   -float(fi.smallest_subnormal), 1e-3, 100.0, 7.5]
        bits = rng.integers(0, 1 << d.bits, n, dtype=np.uint64).astype(ui).view(npdt)
        moderate = (rng.standard_normal(n) * 4).astype(npdt)
        x = np.where(rng.random(n) < 0.3, bits, moderate).astype(npdt)
    s = np.array(special, dtype=np.float64 if d.is_float else object)
    s = s.astype(npdt) if d.is_float else np.array([int(v) for v in s], dtype=npdt)
    x[: min(len(s), n)] = s[:n]
    return x


# ---------------------------------------------------------------------------
# kernel groups


@dataclass
class Group:
    """One kernel: ``inputs`` (param name, dtype, shape letters, values maker),
    ``outputs`` (param name -> dtype, shape letters, rows per block), and per
    combination its body lines and (output, block index). ``kind`` and
    ``dtype`` name the family the group belongs to (a family larger than
    :data:`CHUNK` allows is several groups)."""

    name: str
    kind: str = ""
    dtype: str = ""
    inputs: list[tuple[str, str, str]] = field(default_factory=list)
    outputs: dict[str, tuple[str, str]] = field(default_factory=dict)
    blocks: dict[str, int] = field(default_factory=dict)
    members: list[tuple[Combo, str, int]] = field(default_factory=list)
    lines: dict[str, list[str]] = field(default_factory=dict)
    header: list[str] = field(default_factory=list)
    rows: int = 8
    cols: int = 512

    def block(self, out: str) -> int:
        i = self.blocks.get(out, 0)
        self.blocks[out] = i + 1
        return i


R_ELT, C_ELT = 8, 512  # elementwise groups: 4096 values per input
R_EXH, C_EXH = 64, 1024  # 16-bit unary and cast groups: every bit pattern
R_RED, C_RED = 6, 37  # reductions: rows of 37 (a ragged tree)
MMA_M, MMA_K, MMA_N = 5, 12, 7


def _elementwise_group(name: str, dt: str, members: list[Combo], exhaustive: bool) -> Group:
    g = Group(name)
    if exhaustive:
        g.rows, g.cols = R_EXH, C_EXH
    g.inputs = [("x", dt, "x"), ("y", dt, "y"), ("ynz", dt, "nonzero"), ("ysh", dt, "shift"),
                ("c", "bool", "y")]
    g.header = [f"a = x[o, tn.shape(1, cols)]"] + [
        f"{v} = {p}.with_dims(*x.dims())[o, tn.shape(1, cols)]"
        for v, p in (("b", "y"), ("bnz", "ynz"), ("bsh", "ysh"), ("cc", "c"))]
    for cb in members:
        if cb.kind == "unary":
            e = f"_un({cb.op!r}, a)"
        elif cb.kind == "binary":
            rhs = "bnz" if cb.op in DIVISOR_OPS and cb.dtype != "bool" and D.parse(
                cb.dtype).is_int else "bsh" if cb.op in SHIFT_OPS else "b"
            e = f"_bin({cb.op!r}, a, {rhs})"
        elif cb.kind == "ite":
            e = "tn.ite(cc, a, b)"
        elif cb.kind == "map":
            e = "tn.map(a, b, lambda u, v: tn.ite(u == v, u, tn.maximum(u, v)))"
        elif cb.kind == "cast":
            pol = cb.op.partition("/")[2]
            e = f"tn.cast(a, tn.{_tdt(cb.result)}" + (f", overflow={pol!r})" if pol else ")")
        else:
            e = f"tn.bitcast(a, tn.{_tdt(cb.result)})"
        out = f"out_{cb.result}"
        g.outputs.setdefault(out, (cb.result, "2d"))
        i = g.block(out)
        g.members.append((cb, out, i))
        g.lines[cb.key] = [f"{out}(tn.coord({i} * rows + p.index(), 0), "
                           f"tn.shape(1, cols)).store({e})"]
    return g


def _reduce_group(name: str, dt: str, members: list[Combo]) -> Group:
    g = Group(name)
    g.rows, g.cols = R_RED, C_RED
    g.inputs = [("x", dt, "x")]
    g.header = ["a = x[o, tn.shape(1, cols)]"]
    out = f"out_{dt}"
    g.outputs[out] = (dt, "1d")
    for cb in members:
        red, pol = cb.op.split("/")
        i = g.block(out)
        g.members.append((cb, out, i))
        g.lines[cb.key] = [f"{out}(tn.coord({i} * rows + p.index()), tn.shape(1)).store("
                           f"tn.reduce(a, a.dim(1), {red!r}, policy=tn.{pol}))"]
    return g


def _mma_group(name: str, acc: str, members: list[Combo]) -> Group:
    g = Group(name)
    g.inputs = [("cin", acc, "mma")]
    out = f"out_{acc}"
    g.outputs[out] = (acc, "mma")
    for cb in members:
        a, b = f"a_{cb.dtype}", f"b_{cb.dtype}"
        g.inputs += [(a, cb.dtype, "mma_a"), (b, cb.dtype, "mma_b")]
        i = g.block(out)
        g.members.append((cb, out, i))
        g.lines[cb.key] = [
            f"A = {a}.with_dims(m, kk)[tn.coord(0, 0), tn.shape(M, K)]",
            f"B = {b}.with_dims(kk, n)[tn.coord(0, 0), tn.shape(K, N)]",
            f"{out}(tn.coord({i} * M, 0), tn.shape(M, N)).store(tn.mma(A, B, C0))"]
    return g


#: members per kernel, by family kind (others: ``CHUNK_DEFAULT``). LLVM's
#: optimization time grows faster than the size of a function: one kernel of
#: all ten f32 ``mma`` pairs takes twice as long as ten kernels of one, and
#: one kernel of a 28-member reduce family half as long again as five of six.
CHUNK = {"mma": 1}
CHUNK_DEFAULT = 6


def groups(cs: list[Combo] | None = None) -> list[Group]:
    """The kernels covering ``cs`` (default: every combination): one family
    per kind of lowering and dtype, in kernels of at most ``CHUNK`` members
    (named ``KIND-DTYPE``, or ``KIND-DTYPE.J`` for the J-th of several)."""
    cs = combos() if cs is None else cs
    by: dict[tuple, list[Combo]] = {}
    for cb in cs:
        if cb.kind in ("unary", "cast", "bitcast"):
            k = ("conv" if cb.kind != "unary" else "unary", cb.dtype)
        elif cb.kind in ("binary", "ite", "map"):
            k = ("binary", cb.dtype)
        elif cb.kind == "reduce":
            k = ("reduce", cb.dtype)
        else:
            k = ("mma", cb.result)
        by.setdefault(k, []).append(cb)
    out = []
    for (kind, dt), family in by.items():
        n = CHUNK.get(kind, CHUNK_DEFAULT)
        parts = [family[i:i + n] for i in range(0, len(family), n)]
        for j, ms in enumerate(parts):
            name = f"{kind}-{dt}" + (f".{j}" if len(parts) > 1 else "")
            if kind == "reduce":
                g = _reduce_group(name, dt, ms)
            elif kind == "mma":
                g = _mma_group(name, dt, ms)
            else:
                g = _elementwise_group(name, dt, ms,
                                       kind != "binary" and D.parse(dt).bits <= 16)
            g.kind, g.dtype = kind, dt
            out.append(g)
    return out


def source(g: Group, only: list[Combo] | None = None) -> str:
    """The kernel text of group ``g`` (restricted to ``only``)."""
    keep = {c.key for c in (only or [cb for cb, _, _ in g.members])}
    members = [(cb, o, i) for cb, o, i in g.members if cb.key in keep]
    is_mma = g.outputs[next(iter(g.outputs))][1] == "mma"
    used_in = ({"cin"} | {f"{p}_{cb.dtype}" for cb, _, _ in members for p in ("a", "b")}
               if is_mma else {n for n, _, _ in g.inputs})
    params = []
    for n, dt, kind in g.inputs:
        if n in used_in:
            shape = {"mma_a": "M K", "mma_b": "K N", "mma": "M N"}.get(kind, "R C")
            params.append(f"{n}: tn.Tensor[tn.{_tdt(dt)}, {shape!r}]")
    outs = {o for _, o, _ in members}
    for o, (dt, form) in g.outputs.items():
        if o in outs:
            shape = {"2d": f"{o}_K C", "1d": f"{o}_K", "mma": f"{o}_K N"}[form]
            params.append(f"{o}: tn.Tensor[tn.{_tdt(dt)}, {shape!r}]")
    lines = ["import tilenest as tn", "from tilenest.frontend.dsl import _binary as _bin",
             "from tilenest.frontend.dsl import _unary as _un", "", "",
             "@tn.kernel", f"def sweep({', '.join(params)}):"]
    if is_mma:
        lines += ["    m, n = cin.dims()", "    M, N = cin.shape"]
        first = next(f"a_{cb.dtype}" for cb, _, _ in members)
        lines += [f"    K = {first}.shape[1]", f"    kk = {first}.dim(1)",
                  "    for p in tn.parallel(tn.shape(1)):",
                  "        C0 = cin.with_dims(m, n)[tn.coord(0, 0), tn.shape(M, N)]"]
    else:
        lines += ["    rows, cols = x.shape", "    for p in tn.parallel(tn.shape(rows)):",
                  "        o = tn.coord(p.index(), 0)"]
        lines += [f"        {h}" for h in g.header
                  if h.split(" = ")[1].split(".")[0].split("[")[0] in used_in]
    for cb, _, _ in members:
        lines += [f"        {ln}" for ln in g.lines[cb.key]]
    return "\n".join(lines) + "\n"


def kernel(g: Group, only: list[Combo] | None = None) -> tn.Kernel:
    src = source(g, only)
    fname = f"<sweep-{g.name}{'-' + only[0].key if only else ''}>"
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
    ns: dict = {}
    exec(compile(src, fname, "exec"), ns)  # noqa: S102 - generated here
    return ns["sweep"]


def arrays(g: Group, k: tn.Kernel, seed: int = 0) -> list[np.ndarray]:
    """Arguments for kernel ``k`` of group ``g``, in parameter order."""
    rng = np.random.default_rng(seed)
    kinds = {n: (dt, kind) for n, dt, kind in g.inputs}
    nblocks = dict(g.blocks)
    out = []
    for v in k.program.args:
        name = v.name
        if name in kinds:
            dt, kind = kinds[name]
            d = D.parse(dt)
            if kind.startswith("mma"):
                shape = {"mma_a": (MMA_M, MMA_K), "mma_b": (MMA_K, MMA_N),
                         "mma": (MMA_M, MMA_N)}[kind]
                x = values(dt, shape[0] * shape[1], rng).reshape(shape)
                if d.is_float:  # moderate values: sums of specials say little
                    x = np.where(np.isfinite(x.astype(np.float64)), x, d.np.type(1.5))
                out.append(np.ascontiguousarray(x))
                continue
            n = g.rows * g.cols
            x = values(dt, n, rng, exhaustive=(kind == "x" and g.rows == R_EXH))
            if kind == "nonzero" and d.is_int:
                x = np.where(x == 0, d.np.type(3), x)
            elif kind == "shift" and d.is_int:
                x = (np.abs(x.astype(np.int64)) % (d.bits + 3)).astype(d.np)
            out.append(x.reshape(g.rows, g.cols))
        else:
            dt, form = g.outputs[name]
            nb = nblocks[name]
            shape = {"2d": (nb * g.rows, g.cols), "1d": (nb * g.rows,),
                     "mma": (nb * MMA_M, MMA_N)}[form]
            out.append(np.zeros(shape, D.parse(dt).np))
    return out


def _slice(adm: Admitted, sl: slice) -> Admitted:
    return Admitted(adm.name, adm.dtype, adm.value[sl],
                    None if adm.lo is None else adm.lo[sl],
                    None if adm.hi is None else adm.hi[sl], adm.determined,
                    None if adm.nan is None else adm.nan[sl])


def run_group(g: Group, only: list[Combo] | None = None,
              compile_kw: dict | None = None) -> dict[str, dict]:
    """Compile (with ``compile_kw``), run and judge ``g`` (or its members
    ``only``): key -> record."""
    members = [(cb, o, i) for cb, o, i in g.members
               if only is None or cb.key in {c.key for c in only}]
    k = kernel(g, only)
    args = arrays(g, k)
    ref_args = [a.copy() for a in args]
    k.compile(**(compile_kw or {}))(*args)
    with np.errstate(all="ignore"):  # NaN and inf inputs are intended
        return _judge(g, k, members, args, tn.reference(k, *ref_args))


def _judge(g: Group, k: tn.Kernel, members: list, args: list,
           adms: Admitted | tuple) -> dict[str, dict]:
    """Each member's rows of the outputs judged by the oracle's verdicts."""
    adms = adms if isinstance(adms, tuple) else (adms,)
    by_name = {a.name: a for a in adms}
    pos = {v.name: j for j, v in enumerate(k.program.args)}
    rows = MMA_M if g.outputs[members[0][1]][1] == "mma" else g.rows
    res = {}
    # blocks were numbered over the whole group; a restricted kernel keeps them
    for cb, o, i in members:
        sl = slice(i * rows, (i + 1) * rows)
        v = _slice(by_name[o], sl).admits(args[pos[o]][sl])
        res[cb.key] = {"ok": bool(v), "detail": str(v)}
    return res


def sweep(cs: list[Combo] | None = None) -> dict[str, dict]:
    """Every combination of ``cs`` judged (see the module docstring)."""
    res: dict[str, dict] = {}
    for g in groups(cs):
        t0 = time.perf_counter()
        print(f"sweep: {g.name} ({len(g.members)})", file=sys.stderr, flush=True)
        try:
            res.update(run_group(g))
        except (TilenestError, ValueError, TypeError, KeyError) as e:
            first = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"sweep: {g.name} failed as a group ({first}); one by one",
                  file=sys.stderr, flush=True)
            for cb, _, _ in g.members:
                try:
                    res.update(run_group(g, [cb]))
                except (TilenestError, ValueError, TypeError, KeyError) as e1:
                    res[cb.key] = {"ok": False, "detail": f"{type(e1).__name__}: {e1}"}
        print(f"sweep: {g.name} done in {time.perf_counter() - t0:.2f}s", file=sys.stderr,
              flush=True)
    return res


#: accumulator dtypes whose mma groups the default test run leaves to -m slow
#: (LLVM takes seconds to optimize each mma group; the f32, i32, u64 and f16
#: accumulators, with every input dtype that widens into them, run by
#: default: every dtype but i64 and f64 as an input)
MMA_SLOW = ("i8", "i16", "u8", "u16", "u32", "i64", "bf16", "f64")
#: dtypes whose elementwise, conversion and reduce groups run under ``slow``
#: only; the default part keeps one of each kind of lowering: bool, a narrow
#: signed (i8) and unsigned (u16) integer, i32, u64, one FP8 format, f16,
#: bf16, f32 and f64
ELEMENTWISE_SLOW = ("i16", "i64", "u8", "u32", "f8e5m2")
PARTS = ("all", "default", "slow")


def in_part(g: Group, part: str) -> bool:
    """Whether group ``g`` belongs to ``part``: ``all``; ``slow``, the mma
    groups of the MMA_SLOW accumulators and the other groups of the
    ELEMENTWISE_SLOW dtypes; ``default``, every other group."""
    if part not in PARTS:
        raise ValueError(f"no sweep part {part!r}: one of {PARTS}")
    slow = g.dtype in (MMA_SLOW if g.kind == "mma" else ELEMENTWISE_SLOW)
    return part == "all" or slow == (part == "slow")


def shard(gs: list[Group], index: int, count: int) -> list[Group]:
    """Shard ``index`` of ``count`` of the groups, balanced by a cost estimate
    (members, an mma nest weighing as much as about eight elementwise ops)."""
    cost = [len(g.members) * (8 if g.kind == "mma" else 1) for g in gs]
    load = [0] * count
    mine = []
    for i in sorted(range(len(gs)), key=lambda i: -cost[i]):
        j = load.index(min(load))
        load[j] += cost[i]
        if j == index:
            mine.append(gs[i])
    return mine


def main(argv: list[str]) -> int:
    """``llvm_sweep.py OUT.json [INDEX COUNT [PART]]``: run every group of
    ``PART`` (default ``all``; or shard ``INDEX`` of ``COUNT`` of them) and
    write the records."""
    t0 = time.perf_counter()
    index, count = (int(argv[2]), int(argv[3])) if len(argv) > 3 else (0, 1)
    part = argv[4] if len(argv) > 4 else "all"
    mine = shard([g for g in groups() if in_part(g, part)], index, count)
    keys = {cb.key for g in mine for cb, _, _ in g.members}
    res = sweep([c for c in combos() if c.key in keys])
    mods = sorted({m.split(".")[0] for m in sys.modules})
    with open(argv[1], "w") as f:
        json.dump({"results": res, "modules": mods, "seconds": time.perf_counter() - t0,
                   "cpu_seconds": time.process_time(),
                   "imported": sorted(symbols.imported())}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
