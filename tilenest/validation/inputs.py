"""Input generation for translation validation.

A *case* is one call of a kernel: a binding of its symbols (extents and integer
parameters) and one value per argument. :func:`generate` draws cases that
stress what compiled code gets wrong:

* sizes -- every symbol takes values from a pool built from the program's own
  constants (a tile ``c`` gives ``c-1, c, c+1``), 1, small primes and a few
  moderate random sizes, so ragged tails, single elements and exact multiples
  all occur; the kernel's assumptions are respected;
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

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..semantics import expr as E
from ..semantics.dtypes import DType
from ..semantics.ir import TileProgram
from ..semantics.types import TensorType

SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 31, 37, 61, 97)


@dataclass
class Case:
    """One call: ``args`` in signature order, ``syms`` the symbol binding,
    ``label`` a short description (sizes, special values)."""

    args: list[Any]
    syms: dict[str, int]
    label: str
    params: dict[str, int]

    def copy_args(self) -> list[Any]:
        return [a.copy() if isinstance(a, np.ndarray) else a for a in self.args]

    @property
    def size(self) -> int:
        return int(sum(a.size for a in self.args if isinstance(a, np.ndarray)))


def poison_value(dt: np.dtype) -> Any:
    """NaN for floats; the most negative (signed) / largest (unsigned) integer; True."""
    if np.issubdtype(dt, np.floating) or dt.name == "bfloat16":
        return np.array(np.nan, dtype=np.float32).astype(dt)
    if dt == np.bool_:
        return True
    info = np.iinfo(dt)
    return info.min if info.min < 0 else info.max


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


def size_pool(p: TileProgram, limit: int = 200) -> list[int]:
    pool = {1, *SMALL_PRIMES}
    for c in program_constants(p):
        pool.update({c - 1, c, c + 1, 2 * c + 1})
    return sorted(x for x in pool if 1 <= x <= limit)


def _floats(rng: np.random.Generator, shape: tuple, dt: np.dtype, special: float) -> np.ndarray:
    x = rng.standard_normal(shape)
    if special > 0 and x.size:
        fin = np.finfo(np.float32 if dt.name == "bfloat16" else dt)
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


def _bind_syms(p: TileProgram, rng: np.random.Generator, pool: list[int],
               fixed: dict[str, int]) -> dict[str, int] | None:
    for _ in range(50):
        syms = dict(fixed)
        for s in p.syms:
            if s not in syms:
                syms[s] = int(pool[rng.integers(0, len(pool))])
        env = {E.Sym(k): v for k, v in syms.items()}
        if all(E.evaluate(a, env) for a in p.assumptions):
            ok = True
            for a in p.args:
                if isinstance(a.type, TensorType):
                    ok &= all(int(E.evaluate(x, env)) >= 0 for x in a.type.shape)
            if ok:
                return syms
    return None


def make_case(p: TileProgram, rng: np.random.Generator, special: float = 0.02,
              pool: list[int] | None = None, fixed: dict[str, int] | None = None,
              limit: int = 200) -> Case | None:
    """One random case, or None when no binding satisfies the assumptions."""
    pool = pool or size_pool(p, limit)
    syms = _bind_syms(p, rng, pool, fixed or {})
    if syms is None:
        return None
    env = {E.Sym(k): v for k, v in syms.items()}
    stored = {op.operands[0].name for op in p.walk() if op.name == "tensor.store"}
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


def generate(p: TileProgram, n: int, seed: int = 0, limit: int = 200) -> list[Case]:
    """``n`` cases: the first without special values, then with increasing
    density of special values; sizes vary across the pool."""
    rng = np.random.default_rng(seed)
    pool = size_pool(p, limit)
    out: list[Case] = []
    for i in range(n):
        special = 0.0 if i % 3 == 0 else (0.02 if i % 3 == 1 else 0.2)
        c = make_case(p, rng, special, pool, limit=limit)
        if c is not None:
            out.append(c)
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
