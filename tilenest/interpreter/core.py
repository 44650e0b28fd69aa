"""The interpreter's driver: argument binding, the environment, op dispatch.

Meaning is defined one op at a time by the rules registered in ``values.py``,
``memory.py``, ``regions.py`` and ``reductions.py`` (a table keyed by op name,
STYLE #3/#8). This module binds a call's arrays and parameters, walks blocks,
and owns the state every rule shares.
"""

from __future__ import annotations

import random as _random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import (RuntimeSemanticError, Site, TilenestError, UninitializedReadError)
from ..semantics import expr as E
from ..semantics.ir import Block, Operation, TileProgram
from ..semantics.signature import bind_call
from ..semantics.types import TensorType, TileType
from .effects import Buffer, EffectLog
from .runtime import RV, IndexEnv

Rule = Callable[["Interpreter", Operation], None]
RULES: dict[str, Rule] = {}


def rule(*names: str) -> Callable[[Rule], Rule]:
    """Register the meaning of ops ``names``."""

    def deco(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn

    return deco


@dataclass(frozen=True)
class Schedule:
    """How ``parallel`` children are executed.

    * ``batched`` (default): all children of a region in lockstep, vectorized.
      Exact for race-free programs, and races are detected.
    * ``canonical`` / ``reversed``: one child at a time in (reverse) row-major order;
    * ``random``: one at a time in a seeded random order;
    * ``exhaustive``: every order of every small region (see :func:`interpret`).
    Reductions and reassociating ``mma`` use the source order unless ``fast``.
    """

    kind: str = "batched"
    seed: int = 0

    def order(self, n: int, rng: _random.Random) -> list[int]:
        if self.kind == "reversed":
            return list(range(n - 1, -1, -1))
        if self.kind == "random":
            o = list(range(n))
            rng.shuffle(o)
            return o
        return list(range(n))


def random(seed: int = 0) -> Schedule:
    return Schedule("random", seed)


CANONICAL = Schedule("canonical")
REVERSED = Schedule("reversed")
BATCHED = Schedule("batched")


@dataclass
class TensorRT:
    """A tensor argument at run time."""

    array: np.ndarray
    buffer: Buffer
    written: np.ndarray | None = None  # poisoned outputs: which elements were stored
    lo: np.ndarray | None = None  # oracle: bounds of stored inexact values (float64)
    hi: np.ndarray | None = None

    def bounds_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Create (once) the bound arrays, initialised to the exact contents."""
        if self.lo is None:
            f = self.array.astype(np.float64)
            self.lo, self.hi = f, f.copy()
        return self.lo, self.hi


@dataclass
class Options:
    schedule: Schedule = BATCHED
    fast: bool = False
    check_races: bool = True
    poison: bool = False
    outputs: tuple[str, ...] | None = None
    check_pipelines: bool = False
    orders: Any = None  # exhaustive exploration: an OrderOracle
    oracle: bool = False  # compute interval shadows of the admitted set (shadow.py)


class Interpreter:
    """Executes one call of a TileProgram."""

    def __init__(self, prog: TileProgram, args: Sequence[Any], params: dict[str, int],
                 opts: Options):
        self.prog = prog
        self.opts = opts
        self.an = prog.analysis
        self.values: dict[str, Any] = {}
        self.bshape: tuple[int, ...] = ()
        self.lane_mask: np.ndarray | None = None
        self.effects = EffectLog(opts.check_races)
        self.rng = _random.Random(opts.schedule.seed)
        self.tensors: dict[str, TensorRT] = {}
        # ancestor-update footprints: (depth of the parallel level, value name -> mask)
        self.track: list[tuple[int, dict[str, Any]]] = []
        self.mem_ids = 0
        self.undetermined: list[Operation] = []  # oracle: control flow on inexact values
        self.batch_axes: dict[E.Expr, int] = {}  # batched index variable -> its batch axis
        self.stage_rec: Any = None  # (pipeline op, iteration, records) while checking
        self.ienv = IndexEnv(self._bind(args, params))

    # -- binding ------------------------------------------------------------
    def _bind(self, args: Sequence[Any], params: dict[str, int]) -> dict[E.Expr, int]:
        p = self.prog
        syms = bind_call(p, args, params)
        for v, a in zip(p.args, args, strict=True):
            t = v.type
            if isinstance(t, TensorType):
                self.tensors[v.name] = TensorRT(a, Buffer(("tensor", v.name), v.name, a.shape))
                self.values[v.name] = self.tensors[v.name]
            else:
                assert isinstance(t, TileType)
                from ..semantics.numerics import constant

                try:
                    self.values[v.name] = RV(constant(_py_scalar(a), t.dtype))
                except (ValueError, TypeError) as e:
                    raise TilenestError(f"argument '{v.name}': {e}", p.loc) from None
        self._alias()
        self._poison()
        return syms

    def _alias(self) -> None:
        """Arguments whose arrays overlap in memory share one effect-log buffer."""
        ts = list(self.tensors.values())
        for i, t in enumerate(ts):
            for u in ts[:i]:
                if np.shares_memory(t.array, u.array):
                    key = u.buffer.key
                    origin = u.array.__array_interface__["data"][0]
                    for w in (t, u):
                        base = w.array.__array_interface__["data"][0]
                        w.buffer.alias = (base - origin, tuple(w.array.strides))
                        w.buffer.key = key
                    t.buffer.name = u.buffer.name = f"{u.buffer.name}/{t.buffer.name}"

    def _poison(self) -> None:
        if not self.opts.poison:
            return
        stored, loaded = set(), set()
        for op in self.prog.walk():
            if op.name == "tensor.store":
                stored.add(op.operands[0].name)
            elif op.name == "tensor.load":
                loaded.add(op.operands[0].name)
        outs = self.opts.outputs if self.opts.outputs is not None else tuple(stored - loaded)
        for n in outs:
            t = self.tensors[n]
            if any(o is not t and np.shares_memory(o.array, t.array)
                   for o in self.tensors.values()):
                continue  # aliased with another argument: its contents are an input
            t.array[...] = poison_value(t.array.dtype)
            t.written = np.zeros(t.array.shape, dtype=bool)

    # -- evaluation -----------------------------------------------------------
    def run(self) -> None:
        self.block(self.prog.body, [])

    def block(self, b: Block, args: Sequence[Any]) -> list[Any]:
        for a, v in zip(b.args, args, strict=True):
            self.values[a.name] = v
        for op in b.ops:
            if op.name == "yield":
                return [self.values[o.name] for o in op.operands]
            fn = RULES.get(op.name)
            if fn is None:
                raise TilenestError(f"the interpreter has no rule for op '{op.name}'", op.loc)
            try:
                fn(self, op)
                if self.track and not op.regions and op.name != "put":
                    self._propagate(op)
            except TilenestError as e:
                raise e.with_site(op.loc) from None
            except FloatingPointError as e:  # pragma: no cover - numpy errstate
                raise RuntimeSemanticError(str(e), op.loc) from None
        return []

    def _propagate(self, op: Operation) -> None:
        """Footprints: a per-child op (anchored at or below the tracked level)
        deriving a value from a tracked one touches the whole result."""
        depth, d = self.track[-1]
        tracked = [d[o.name] for o in op.operands if o.name in d]
        if not tracked:
            return
        if self.anchor_depth(op) >= depth:
            for r in op.results:
                d[r.name] = np.bool_(True)
        elif len(op.results) == 1 and all(np.ndim(m) == 0 for m in tracked):
            # a collective op: the same value in every child; it touches nothing new
            d[op.results[0].name] = np.bool_(any(bool(m) for m in tracked))

    def child_order(self, op: Operation, n: int) -> list[int]:
        if self.opts.orders is not None:
            return self.opts.orders.next(op, n)
        return self.opts.schedule.order(n, self.rng)

    # -- helpers for rules ------------------------------------------------------
    @property
    def nb(self) -> int:
        return len(self.bshape)

    def val(self, v: Any) -> RV:
        return self.values[v.name]

    def set(self, v: Any, rv: Any) -> None:
        self.values[v.name] = rv

    def extent(self, e: E.Expr) -> int:
        """The value of a tile extent; it may not vary across batched instances."""
        env: dict[E.Expr, Any] = dict(self.ienv.syms)
        for k, v in self.ienv.vars.items():
            if isinstance(v, (int, np.integer)):
                env[k] = int(v)
        try:
            n = E.evaluate(e, env)
        except KeyError:
            raise RuntimeSemanticError(
                f"tile extent {E.to_str(e)} varies across parallel instances executed together",
                None, "give tiles a fixed extent and mask the ragged part "
                      "(or run with a one-at-a-time schedule)") from None
        return int(n)

    def anchor_depth(self, op: Operation) -> int:
        return self.an.nest.depth(self.an.anchor[op.oid])

    def site(self, op: Operation) -> Site | None:
        return op.loc

    def check_initialized(self, t: TensorRT, flat: np.ndarray, mask: np.ndarray | None,
                          op: Operation) -> None:
        if t.written is None:
            return
        w = t.written.reshape(-1)[flat]
        bad = ~w if mask is None else (~w & mask)
        if np.any(bad):
            k = np.argwhere(np.broadcast_to(bad, np.shape(bad)))[0]
            f = int(np.broadcast_to(flat, np.shape(bad))[tuple(k)])
            elem = tuple(int(i) for i in np.unravel_index(f, t.array.shape))
            raise UninitializedReadError(
                f"{op.name} reads {t.buffer.name}{list(elem)}, which nothing wrote", op.loc,
                "the element is an output the program has not stored yet")


def poison_value(dt: np.dtype) -> Any:
    """NaN for floats; for integers the most negative value (or max for unsigned)."""
    if np.issubdtype(dt, np.floating) or dt.name == "bfloat16":
        return np.array(np.nan, dtype=np.float32).astype(dt)
    if dt == np.bool_:
        return True
    info = np.iinfo(dt)
    return info.min if info.min < 0 else info.max


def _py_scalar(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        if a.shape != ():
            raise ValueError("a scalar argument must be a number or 0-d array")
        a = a.item()
    if isinstance(a, np.generic):
        a = a.item()
    return a
