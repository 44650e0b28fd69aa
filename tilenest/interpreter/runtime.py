"""Runtime values of the interpreter and index evaluation.

Every tile value is an :class:`RV`: a numpy array whose trailing axes are the
tile's dims (in its type's order) and whose ``nb`` leading axes are *batch*
axes -- one per coordinate of each enclosing ``parallel`` domain that is being
executed in lockstep (see ``regions.py``). A value that does not depend on the
batched coordinates has ``nb == 0`` and broadcasts. Index variables are bound
to Python ints (an iteration executed on its own) or to integer arrays of
``ndim == nb_at_binding`` (a batched domain).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..semantics import expr as E
from ..semantics.dtypes import DType
from ..semantics.space import Dim


@dataclass
class RV:
    """A tile value: ``a.shape == batch[:nb] + tile extents``."""

    a: np.ndarray
    nb: int = 0
    # oracle: the admitted set of each element (None = exact: the canonical value,
    # bit for bit): ``{x : lo <= x <= hi}``, plus NaN where ``nan`` (see shadow.py)
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    nan: np.ndarray | None = None

    def lift(self, nb: int, arr: np.ndarray | None = None) -> np.ndarray:
        """The array (``a``, or ``arr`` of the same layout) with singleton batch
        axes appended up to ``nb`` batch axes."""
        a = self.a if arr is None else arr
        if nb == self.nb:
            return a
        extra = nb - self.nb
        assert extra > 0, (nb, self.nb)
        shp = a.shape
        return a.reshape(shp[:self.nb] + (1,) * extra + shp[self.nb:])

    @property
    def exact(self) -> bool:
        return self.lo is None

    def shadow(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(lo, hi, nan)``: the admitted set of every element (shadow.py); an
        exact value gives its canonical value as a point (a NaN as NaN alone)."""
        if self.lo is not None:
            return self.lo, self.hi, self.nan
        from .shadow import point_of

        return point_of(self.a)

    def with_bounds(self, lo: Any, hi: Any, nan: Any) -> "RV":
        """Attach an admitted set (``lo``, ``hi``, ``nan`` of ``a``'s shape); NaN
        in a bound means the set is not bounded (shadow.settle)."""
        from .shadow import settle

        self.lo, self.hi, self.nan = settle(lo, hi, nan)
        return self

    @property
    def tile_shape(self) -> tuple[int, ...]:
        return self.a.shape[self.nb:]


def common_nb(*vs: RV) -> int:
    return max(v.nb for v in vs)


def align(v: RV, src: Sequence[Dim], dst: Sequence[Dim], nb: int,
          arr: np.ndarray | None = None) -> np.ndarray:
    """``v`` (over dims ``src``) laid out over ``dst``: trailing axes permuted to
    ``dst``'s order, size-1 axes for dims ``v`` lacks; batch axes lifted to ``nb``.
    With ``arr``, the same layout change applied to ``arr`` (v's bounds)."""
    a = v.lift(nb, arr)
    if tuple(src) == tuple(dst):
        return a
    perm = list(range(nb)) + [nb + src.index(d) for d in dst if d in src]
    a = a.transpose(perm)
    shape = list(a.shape[:nb])
    it = iter(a.shape[nb:])
    for d in dst:
        shape.append(next(it) if d in src else 1)
    return a.reshape(shape)


@dataclass
class IndexEnv:
    """Values of index leaves: symbols (ints), variables (ints or arrays with
    ``ndim`` equal to the batch rank when they were bound) and data-dependent
    scalars (looked up in the value environment)."""

    syms: dict[E.Expr, int]
    vars: dict[E.Expr, Any] = field(default_factory=dict)

    def copy(self) -> "IndexEnv":
        return IndexEnv(self.syms, dict(self.vars))


def lift_index(x: Any, nb: int, r: int) -> Any:
    """An index value (int or batch array) shaped to broadcast over
    ``batch[:nb] + tile[:r]``."""
    if isinstance(x, (int, np.integer)):
        return int(x)
    x = np.asarray(x)
    return x.reshape(x.shape + (1,) * (nb - x.ndim + r))


def eval_exprs(exprs: Sequence[Any], ienv: IndexEnv, nb: int, local_vars: Sequence[str],
               local_shape: Sequence[int], values: dict[str, Any],
               on_inexact: Any = None) -> list[Any]:
    """Evaluate expressions/predicates over a tile's local grid: the result
    broadcasts over ``batch[:nb] + local_shape``. A value read by an expression
    is taken at its canonical evaluation; when its admitted set is not a single
    value (the oracle's shadow), ``on_inexact(name)`` is told, since admitted
    executions may then compute other indices or conditions."""
    r = len(local_shape)
    env: dict[E.Expr, Any] = dict(ienv.syms)
    for k, v in ienv.vars.items():
        env[k] = lift_index(v, nb, r)
    for i, (name, n) in enumerate(zip(local_vars, local_shape, strict=True)):
        shape = [1] * (nb + r)
        shape[nb + i] = n
        env[E.Var(name)] = np.arange(n, dtype=np.int64).reshape(shape)
    for e in exprs:
        for leaf in E.leaves(e):
            if isinstance(leaf, E.Val) and leaf not in env:
                rv = values[leaf.name]
                if on_inexact is not None and rv.lo is not None and (
                        np.any(rv.lo != rv.hi) or np.any(rv.nan)):
                    on_inexact(leaf.name)
                a = rv.lift(nb) if rv.nb <= nb else rv.a
                env[leaf] = a.astype(np.int64).reshape(a.shape + (1,) * r)
    out = []
    for e in exprs:
        v = E.evaluate(e, env)
        out.append(v)
    return out


def full_shape(nb_shape: Sequence[int], tile: Sequence[int]) -> tuple[int, ...]:
    return tuple(nb_shape) + tuple(tile)


def zeros_of(dt: DType, shape: Sequence[int]) -> np.ndarray:
    return np.zeros(tuple(shape), dtype=dt.np)
