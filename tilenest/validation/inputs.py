"""Input generation for translation validation.

A *case* is one call of a kernel: a binding of its symbols (extents and integer
parameters) and one value per argument. :func:`generate` draws cases that
stress what compiled code gets wrong:

* sizes -- derived from the kernel's tiles (:func:`tile_sizes`). A symbolic
  extent ``N`` is *tiled by* ``t`` when the program divides it by ``t``
  (``N // t``, ``cdiv(N, t) = (N + t - 1) // t``, ``N % t``) or walks an axis
  of extent ``N`` in steps of ``t`` (an access map ``... + t*$i`` on that axis,
  or a tile of constant extent ``t`` along it). For every tile ``t`` of ``N``
  the pool holds ``t - 1, t, t + 1``, ``2t + 1`` and ``3t + r`` with a ragged
  tail ``0 < r < t`` (at least three whole tiles, then a partial one); every
  symbol also gets 0, 1 and small primes. The first cases aim at the *size
  paths* (:mod:`tilenest.validation.sizes`: each tiled symbol at three tiles
  and a ragged tail, each symbol at 0 and at 1, each tile's ``t +- 1``), the
  other symbols of a case drawn from the pool; later cases sample the pool at
  random. Combinations are sampled, never the full product, and a case's
  total element count stays under :data:`MAX_ELEMENTS` (other symbols shrink
  first; :data:`REQUIRED_ELEMENTS` for a case on a required path), so
  validation stays fast. Every binding satisfies the kernel's
  assumptions: where draws from the pools do not, one is solved for under
  them (:class:`~tilenest.validation.sizes.SizeSolver`), on the wanted path,
  near the draw and away from the bindings already used;
* values -- floats are standard normal, with (in most cases) a sprinkling of
  special values: NaN, +-inf, +-0, subnormals, values near the dtype's
  largest finite magnitude, and large/small magnitudes; integers mix small
  values with the extremes (min, max, 0, -1); bools are fair coins;
* outputs -- tensors the kernel stores to but never reads start *poisoned*
  (NaN / the most negative integer), identically for the reference and the
  compiled run, so an element the compiled code fails to write shows up as a
  mismatch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..semantics.arrays import poison_value
from ..semantics.signature import stored_tensors
from ..semantics import expr as E
from ..semantics.dtypes import DType
from ..semantics.ir import TileProgram
from ..semantics.types import TensorType
from .sizes import SizePath, SizeSolver, elements, multi_tile_size, size_paths

SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 31, 37, 61, 97)

#: the largest extent drawn for an untiled symbol when no limit is given
DEFAULT_LIMIT = 200

#: the most elements (summed over tensor arguments) one generated case holds
MAX_ELEMENTS = 1 << 18

#: the most elements of a case on a required size path (three tiles and a
#: ragged tail), which may be larger than an ordinary case rather than missed
REQUIRED_ELEMENTS = 4 * MAX_ELEMENTS


@dataclass
class Case:
    """One call: ``args`` in signature order, ``syms`` the symbol binding,
    ``label`` a short description (sizes, special values)."""

    args: list[Any]
    syms: dict[str, int]
    label: str
    params: dict[str, int]

    def copy_args(self) -> list[Any]:
        """Fresh copies of the arguments that keep their aliasing (arrays that
        share memory with each other, or whose own elements do, stay so)."""
        from ..interpreter import copy_arguments

        return copy_arguments(tuple(self.args))

    @property
    def size(self) -> int:
        return int(sum(a.size for a in self.args if isinstance(a, np.ndarray)))




def program_constants(p: TileProgram) -> set[int]:
    """Positive integer constants in the program's extents and index maps."""
    out: set[int] = set()

    def scan(x: Any) -> None:
        if isinstance(x, (E.Expr, E.Pred)):
            stack = [x]
            while stack:
                e = stack.pop()
                if isinstance(e, E.Const) and 1 < e.value <= 4096:
                    out.add(e.value)
                stack.extend(getattr(e, "children", ()))
        elif isinstance(x, (tuple, list)):
            for y in x:
                scan(y)

    for op in p.walk():
        for k in ("map", "domain", "value", "origin"):
            v = op.attrs.get(k) if k in op.attrs else None
            if v is None:
                continue
            if hasattr(v, "space"):
                scan(list(v.space.extents))
                scan(v.pred)
            else:
                scan(v)
        for r in op.results:
            scan(list(getattr(r.type, "extents", ())))
    return out


def _exprs(x: Any, depth: int = 0) -> Iterator[E.Expr | E.Pred]:
    """Every index expression or predicate inside an attribute or a type
    (tuples, lists, dicts and the frozen dataclasses of the IR: index sets,
    spaces, maps, layouts)."""
    if isinstance(x, (E.Expr, E.Pred)):
        yield x
    elif isinstance(x, (tuple, list, frozenset, set)):
        for y in x:
            yield from _exprs(y, depth)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _exprs(y, depth)
    elif dataclasses.is_dataclass(x) and not isinstance(x, (type, DType)) and depth < 8:
        for f in dataclasses.fields(x):
            yield from _exprs(getattr(x, f.name), depth + 1)


def _subterms(x: E.Expr | E.Pred) -> Iterator[Any]:
    stack: list[Any] = [x]
    while stack:
        e = stack.pop()
        yield e
        stack.extend(getattr(e, "children", ()))


def _syms(x: E.Expr | E.Pred) -> set[str]:
    return {v.name for v in E.leaves(x) if isinstance(v, E.Sym)}


def _var_steps(e: E.Expr, local: set[str]) -> set[int]:
    """Constant coefficients ``c > 1`` of non-local variables in ``e``'s terms
    (``c*$i``: the axis is walked in steps of ``c``)."""
    out: set[int] = set()
    terms = e.terms if isinstance(e, E.Add) else (e,)
    for t in terms:
        if isinstance(t, E.Mul):
            consts = [f.value for f in t.factors if isinstance(f, E.Const)]
            vars_ = [f for f in t.factors if isinstance(f, E.Var) and f.name not in local]
            if len(consts) == 1 and vars_ and abs(consts[0]) > 1:
                out.add(abs(consts[0]))
    return out


def tile_sizes(p: TileProgram) -> dict[str, set[int]]:
    """For each symbol, the tile sizes the program tiles it with (see the
    module docstring): divisors of ``//`` and ``%`` whose dividend holds the
    symbol, and the steps and constant tile extents of accesses along tensor
    axes whose extent holds it."""
    out: dict[str, set[int]] = {s: set() for s in p.syms}

    def note(syms: set[str], t: int) -> None:
        if 1 < t <= 1 << 16:
            for s in syms:
                out.setdefault(s, set()).add(t)

    def scan(x: Any) -> None:
        for root in _exprs(x):
            for e in _subterms(root):
                if isinstance(e, (E.FloorDiv, E.Mod)) and isinstance(e.b, E.Const):
                    note(_syms(e.a), abs(e.b.value))

    for a in p.args:
        scan(a.type)
    for op in p.walk():
        scan(op.attrs)
        for r in op.results:
            scan(r.type)
        mp = op.attrs.get("map")
        if not (op.operands and isinstance(op.operands[0].type, TensorType)
                and isinstance(mp, tuple)):
            continue
        shape = op.operands[0].type.shape
        local = set(op.attrs.get("vars", ()))
        tile_t = op.results[0].type if op.results else (
            op.operands[1].type if len(op.operands) > 1 else None)
        extents = list(getattr(tile_t, "extents", ()) or ())
        for ext, e in zip(shape, mp, strict=False):
            syms = _syms(ext)
            if not syms or not isinstance(e, E.Expr):
                continue
            for t in _var_steps(e, local):
                note(syms, t)
            for k, v in enumerate(op.attrs.get("vars", ())):
                if k < len(extents) and E.Var(v) in E.leaves(e) \
                        and isinstance(extents[k], E.Const):
                    note(syms, extents[k].value)
    return out


def sym_pools(p: TileProgram, limit: int | None = None) -> dict[str, list[int]]:
    """The sizes each symbol may take (see the module docstring); with
    ``limit`` every size above it is dropped (0 and 1 stay)."""
    tiles = tile_sizes(p)
    consts = program_constants(p)
    biggest = max((multi_tile_size(t) for ts in tiles.values() for t in ts), default=0)
    cap = limit if limit is not None else max(DEFAULT_LIMIT, biggest)
    base = {0, 1, *SMALL_PRIMES}
    for c in consts:
        base.update({c - 1, c, c + 1, 2 * c + 1})
    out = {}
    for s in p.syms:
        pool = set(base)
        for t in tiles.get(s, ()):
            pool.update({t - 1, t, t + 1, 2 * t + 1, multi_tile_size(t)})
        out[s] = sorted(x for x in pool if 0 <= x <= max(cap, 1))
    return out


def size_pool(p: TileProgram, limit: int | None = None) -> list[int]:
    """Every size some symbol of ``p`` may take (the union of :func:`sym_pools`)."""
    pools = sym_pools(p, limit)
    return sorted(set().union(*pools.values())) if pools else [1]


def coverage_paths(p: TileProgram) -> list[SizePath]:
    """The size paths the first cases aim at, most important first
    (:func:`tilenest.validation.sizes.size_paths`), one per distinct size."""
    seen: set[tuple[str, int]] = set()
    out = []
    for q in size_paths(tile_sizes(p), p.syms):
        if (q.sym, q.preferred) not in seen:
            seen.add((q.sym, q.preferred))
            out.append(q)
    return out


def coverage_targets(p: TileProgram, limit: int | None = None) -> list[dict[str, int]]:
    """The key sizes of :func:`coverage_paths` that lie in the symbols' pools:
    each tiled symbol at its multi-tile size (largest tile first), each symbol
    at 0 and at 1, each tile's ``t + 1`` and ``t - 1``."""
    pools = sym_pools(p, limit)
    return [{q.sym: q.preferred} for q in coverage_paths(p)
            if q.preferred in pools.get(q.sym, ())]


def _floats(rng: np.random.Generator, shape: tuple, dt: np.dtype, special: float) -> np.ndarray:
    x = rng.standard_normal(shape)
    if special > 0 and x.size:
        if np.issubdtype(dt, np.floating):
            fin = np.finfo(dt)
        else:  # bfloat16, the FP8 formats
            import ml_dtypes

            fin = ml_dtypes.finfo(dt)
        specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, float(fin.tiny) / 4,
                             -float(fin.tiny) / 2, float(fin.max) / 2, -float(fin.max) / 3,
                             1e4, -3e4, 1e-30, 88.5, -100.0])
        mask = rng.random(shape) < special
        x = np.where(mask, specials[rng.integers(0, len(specials), shape)], x)
    with np.errstate(all="ignore"):
        return x.astype(dt)


def _ints(rng: np.random.Generator, shape: tuple, dt: np.dtype, special: float) -> np.ndarray:
    info = np.iinfo(dt)
    if special == 0:  # clean cases: small non-negative values (valid as indices)
        lo, hi = 0, min(info.max, 7)
    else:
        lo, hi = max(info.min, -100), min(info.max, 100)
    x = rng.integers(lo, hi + 1, shape, dtype=np.int64).astype(dt)
    if special > 0 and x.size:
        ext = np.array([info.min, info.max, 0, 1, info.max - 1] + ([-1] if info.min < 0 else []),
                       dtype=dt)
        mask = rng.random(shape) < special
        x = np.where(mask, ext[rng.integers(0, len(ext), shape)], x).astype(dt)
    return x


def values(rng: np.random.Generator, shape: tuple, dt: DType, special: float) -> np.ndarray:
    """Random values of ``dt`` (see the module docstring)."""
    npdt = dt.np
    if dt.is_float:
        return _floats(rng, shape, npdt, special)
    if dt.is_bool:
        return rng.random(shape) < 0.5
    return _ints(rng, shape, npdt, special)


def _bind_syms(p: TileProgram, rng: np.random.Generator, pools: dict[str, list[int]],
               fixed: dict[str, int], budget: int = MAX_ELEMENTS,
               avoid: list[dict[str, int]] | None = None) -> dict[str, int] | None:
    """A binding drawn at random that extends ``fixed``, satisfies the
    assumptions, gives every tensor a non-negative shape and stays within
    ``budget`` elements; the free symbols are drawn from their pools (never 0:
    only coverage targets are empty), from ever smaller parts of them after
    repeated failures. In the first half of the attempts a binding in
    ``avoid`` (already used) counts as a failure."""
    for attempt in range(60):
        syms = dict(fixed)
        for s in p.syms:
            if s not in syms:
                cand = [x for x in pools.get(s, ()) if x >= 1] or [1]
                cand = cand[:max(1, len(cand) >> (attempt // 15))]
                syms[s] = int(cand[rng.integers(0, len(cand))])
        if avoid and attempt < 30 and syms in avoid:
            continue
        env: dict[E.Expr, int] = {E.Sym(k): v for k, v in syms.items()}
        if not all(E.evaluate(a, env) for a in p.assumptions):
            continue
        if not all(int(E.evaluate(x, env)) >= 0 for a in p.args
                   if isinstance(a.type, TensorType) for x in a.type.shape):
            continue
        if elements(p, syms) <= budget:
            return syms
    return None


def _draw(p: TileProgram, rng: np.random.Generator, pools: dict[str, list[int]]
          ) -> dict[str, int]:
    """One positive size per symbol from its pool: the solver's preferences."""
    out = {}
    for s in p.syms:
        cand = [x for x in pools.get(s, ()) if x >= 1] or [1]
        out[s] = int(cand[rng.integers(0, len(cand))])
    return out


def bind(p: TileProgram, rng: np.random.Generator, pools: dict[str, list[int]],
         path: SizePath | None = None, avoid: list[dict[str, int]] | None = None,
         limit: int | None = None, fixed: dict[str, int] | None = None,
         solver: SizeSolver | None = None) -> dict[str, int] | None:
    """A binding of every symbol on ``path`` (any binding when None) that
    agrees with ``fixed``: drawn from the pools first (the path's symbol at its
    preferred size when that is in its pool), and when no draw satisfies the
    kernel's assumptions, solved for under them (:class:`SizeSolver`, near a
    draw and away from ``avoid``). Within :data:`MAX_ELEMENTS`, or for a
    required path :data:`REQUIRED_ELEMENTS` when nothing smaller takes it;
    None when the size space has no such binding within the limit and the
    budget."""
    want = dict(fixed or {})
    if path is not None and path.preferred in pools.get(path.sym, ()):
        want.setdefault(path.sym, path.preferred)
    budgets = [MAX_ELEMENTS] + ([REQUIRED_ELEMENTS] if path is not None and path.required
                                else [])
    solver = solver or SizeSolver(p, limit)
    drawn = None
    for budget in budgets:
        if path is None or path.sym in want:
            got = _bind_syms(p, rng, pools, want, budget, avoid=avoid)
            if got is not None and (path is None or path.holds(got)):
                if got not in (avoid or ()):
                    return got
                drawn = drawn or got
        solved = solver.solve(path, _draw(p, rng, pools), avoid or (), budget, fixed)
        if solved is not None:
            return solved
    return drawn


def case_for(p: TileProgram, rng: np.random.Generator, syms: dict[str, int],
             special: float = 0.02) -> Case:
    """The case of the binding ``syms``: random argument values (see the
    module docstring), outputs that are never read poisoned."""
    env: dict[E.Expr, int] = {E.Sym(k): v for k, v in syms.items()}
    stored = stored_tensors(p)
    loaded = {op.operands[0].name for op in p.walk() if op.name == "tensor.load"}
    args: list[Any] = []
    for a in p.args:
        t = a.type
        if isinstance(t, TensorType):
            shape = tuple(int(E.evaluate(x, env)) for x in t.shape)
            if a.name in stored and a.name not in loaded:
                args.append(np.full(shape, poison_value(t.dtype.np), dtype=t.dtype.np))
            else:
                args.append(values(rng, shape, t.dtype, special))
        else:
            v = values(rng, (), t.dtype, special / 4)
            args.append(v.item() if hasattr(v, "item") else v)
    tensor_syms = {x.name for a in p.args if isinstance(a.type, TensorType)
                   for s in a.type.shape for x in E.leaves(s) if isinstance(x, E.Sym)}
    params = {k: v for k, v in syms.items() if k not in tensor_syms}
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(syms.items()))
    return Case(args, syms, f"{sizes}{' +special' if special else ''}", params)


def make_case(p: TileProgram, rng: np.random.Generator, special: float = 0.02,
              pool: list[int] | dict[str, list[int]] | None = None,
              fixed: dict[str, int] | None = None, limit: int | None = None) -> Case | None:
    """One random case, or None when no binding satisfies the assumptions.
    ``pool``: the sizes of every symbol (a list), or per symbol (a dict);
    default :func:`sym_pools`."""
    pools = sym_pools(p, limit) if pool is None else (
        pool if isinstance(pool, dict) else {s: list(pool) for s in p.syms})
    syms = bind(p, rng, pools, None, None, limit, fixed)
    return None if syms is None else case_for(p, rng, syms, special)


def generate(p: TileProgram, n: int, seed: int = 0, limit: int | None = None) -> list[Case]:
    """Up to ``n`` cases: the first clean (no special values), then with
    increasing density of special values. After one case of ordinary sizes,
    the cases aim at the :func:`coverage_paths` in order (a path the size
    space excludes is passed over); the rest sample :func:`sym_pools`. Every
    binding satisfies the kernel's assumptions, solved for when random draws
    do not (:func:`bind`), and a binding is repeated only when no other one
    is found. Fewer than ``n`` only when the assumptions reject every size."""
    rng = np.random.default_rng(seed)
    pools = sym_pools(p, limit)
    paths: list[SizePath | None] = [None, *coverage_paths(p)]
    solver = SizeSolver(p, limit)
    out: list[Case] = []
    used: list[dict[str, int]] = []
    for _ in range(3 * n + len(paths)):
        if len(out) >= n:
            break
        i = len(out)
        special = 0.0 if i % 3 == 0 else (0.02 if i % 3 == 1 else 0.2)
        path = paths.pop(0) if paths else None
        syms = bind(p, rng, pools, path, used, limit, solver=solver)
        if syms is None:
            continue
        out.append(case_for(p, rng, syms, special))
        used.append(syms)
    return out


def user_case(p: TileProgram, args: list[Any], params: dict[str, int] | None = None) -> Case:
    """A case from given arguments (outputs are not poisoned)."""
    syms: dict[str, int] = dict(params or {})
    for a, v in zip(p.args, args, strict=True):
        if isinstance(a.type, TensorType) and isinstance(v, np.ndarray):
            for x, n in zip(a.type.shape, v.shape, strict=True):
                if isinstance(x, E.Sym):
                    syms[x.name] = int(n)
    sizes = ", ".join(f"{k}={v}" for k, v in sorted(syms.items()))
    return Case(list(args), syms, f"given ({sizes})", dict(params or {}))
