"""The interpreter's driver: argument binding, the environment, op dispatch.

Meaning is defined one op at a time by the rules registered in ``values.py``,
``memory.py``, ``regions.py`` and ``reductions.py`` (a table keyed by op name,
STYLE #3/#8). This module binds a call's arrays and parameters, walks blocks,
and owns the state every rule shares.

A value leaves the environment after its last use in the block that defines
it, or that binds it as an argument (:func:`last_uses`), and an op reading a
value for the last time may write its result into that value's array when
nothing else holds it (:meth:`Interpreter.reusable`): a chain of whole-tile
ops then runs in one array instead of allocating (and first touching) a fresh
one per op, an ``mma`` accumulates into its accumulator's array, and the dead
tiles do not stay alive to the end of the call. A value whose last use in its
block is a ``stage`` (whose block runs once each time the stage does) dies at
its last use inside that stage; a loop hands each iteration's carried values
to the body (:meth:`Interpreter.block`), so a carried accumulator dies at its
last use in the iteration too.
"""

from __future__ import annotations

import os
import random as _random
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ..semantics.arrays import host_arguments, poison_value
from ..errors import (RuntimeSemanticError, Site, TilenestError, UninitializedReadError)
from ..semantics import expr as E
from ..semantics.analysis import values_read
from ..semantics.ir import Block, Operation, TileProgram
from ..semantics.signature import bind_call, stored_tensors
from ..semantics.types import TensorType, TileType
from .effects import Buffer, EffectLog, overlaps_itself
from .runtime import RV, IndexEnv

Rule = Callable[["Interpreter", Operation], None]
RULES: dict[str, Rule] = {}

#: the least array size an op's result is written into in place of a dead
#: operand's (:meth:`Interpreter.reusable`); smaller ones are cheap to allocate
REUSE_BYTES = 1 << 16

#: whether ``sys.getrefcount`` counts every holder of an object, as
#: :meth:`Interpreter.reusable` needs: CPython with the GIL before 3.14 (3.14
#: borrows references of the operand stack, so counts may be smaller; a
#: free-threaded build counts approximately); elsewhere nothing is reused
EXACT_REFCOUNTS = (sys.implementation.name == "cpython" and sys.version_info < (3, 14)
                   and not sysconfig.get_config_var("Py_GIL_DISABLED"))


def last_uses(b: Block, inherited: frozenset[str] = frozenset()
              ) -> dict[int, tuple[tuple[str, int], ...]]:
    """For each op of ``b``: the values that ``b`` holds and that op reads for the
    last time in ``b``, each with its defining op's index (-1 for ``b``'s
    arguments and for ``inherited``: values of an enclosing block whose last use
    there is the op that runs ``b``, once). A use inside a nested region counts
    as a use by the op holding the region, and so does a value an index
    expression, attribute or result extent mentions
    (:func:`~tilenest.semantics.analysis.values_read`); a value read in a region op's blocks
    (which may run many times) thus dies only after that op, unless the op
    hands it to its block (``stage``, :meth:`Interpreter.block`). A value the
    ``yield`` names dies there, once handed to the op that ran ``b``."""
    defined = {a.name: -1 for a in b.args} | dict.fromkeys(inherited, -1)
    defined |= {r.name: k for k, op in enumerate(b.ops) for r in op.results}
    last: dict[str, int] = {}
    for k, op in enumerate(b.ops):
        # operands, and values read by index expressions, extents and nested blocks
        for n in values_read(op):
            if n in defined:
                last[n] = k
    plan: dict[int, list[tuple[str, int]]] = {}
    for n, k in last.items():
        plan.setdefault(k, []).append((n, defined[n]))
    return {k: tuple(v) for k, v in plan.items()}


def rule(*names: str) -> Callable[[Rule], Rule]:
    """Register the meaning of ops ``names``."""

    def deco(fn: Rule) -> Rule:
        for n in names:
            RULES[n] = fn
        return fn

    return deco


#: the kinds of schedule; ``batched`` is the default (lockstep)
SCHEDULE_KINDS = ("batched", "canonical", "reversed", "random", "exhaustive")

#: the spellings :func:`parse_schedule` accepts, for messages and command lines
SCHEDULE_SPELLINGS = ("batched", "canonical", "reversed", "random", "random:SEED", "exhaustive")


@dataclass(frozen=True)
class Schedule:
    """How ``parallel`` children are executed.

    * ``batched`` (default): all children of a region in lockstep, vectorized.
      Exact for race-free programs, and races are detected.
    * ``canonical`` / ``reversed``: one child at a time in (reverse) row-major order;
    * ``random``: one at a time in a seeded random order;
    * ``exhaustive``: every order of every small region (see :func:`interpret`).
    Reductions and reassociating ``mma`` use the source order unless ``fast``.
    Every schedule gives a race-free program the same result.
    """

    kind: str = "batched"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULE_KINDS:
            raise _bad_schedule(self.kind)
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) \
                or self.seed < 0:
            raise TilenestError(f"schedule seed {self.seed!r} is not a non-negative integer",
                                None, "write random(SEED) or 'random:SEED' with SEED >= 0")

    def order(self, n: int, rng: _random.Random) -> list[int]:
        if self.kind == "reversed":
            return list(range(n - 1, -1, -1))
        if self.kind == "random":
            o = list(range(n))
            rng.shuffle(o)
            return o
        return list(range(n))

    def __str__(self) -> str:
        return f"random:{self.seed}" if self.kind == "random" else self.kind


def _bad_schedule(spec: Any) -> TilenestError:
    return TilenestError(
        f"unknown schedule {spec!r}; the schedules are {', '.join(SCHEDULE_SPELLINGS)}", None,
        "pass None (batched, the default), one of those names, or a Schedule object such as "
        "tilenest.interpreter.random(seed)")


def parse_schedule(spec: Any) -> "Schedule":
    """The :class:`Schedule` a user's spelling names, or a :class:`TilenestError`
    listing the valid ones.

    Accepted: ``None`` (batched), a :class:`Schedule`, or a string ``batched``,
    ``canonical``, ``reversed``, ``random`` (seed 0), ``random:SEED`` (a
    non-negative decimal integer) or ``exhaustive``; nothing else."""
    if spec is None:
        return BATCHED
    if isinstance(spec, Schedule):
        return spec
    if isinstance(spec, str):
        kind, colon, seed = spec.strip().partition(":")
        if kind == "random" and colon:
            if not seed.isdigit():
                raise TilenestError(
                    f"schedule {spec!r}: the seed {seed!r} is not a non-negative integer",
                    None, "write random:SEED, e.g. random:7")
            return Schedule("random", int(seed))
        if kind in SCHEDULE_KINDS and not colon:
            return Schedule(kind)
    raise _bad_schedule(spec)


def random(seed: int = 0) -> Schedule:
    """The random schedule: children one at a time in an order drawn from ``seed``."""
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
    # oracle: the admitted set of each element once an inexact value is stored
    # (``lo``, ``hi``, ``nan``: see shadow.py)
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None
    nan: np.ndarray | None = None
    #: the program never writes this tensor's memory (no store names it, no argument
    #: it shares memory with): a load may keep a read-only view instead of a copy
    constant: bool = False

    def bounds_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Create (once) the shadow arrays, initialised to the exact contents."""
        if self.lo is None:
            from .shadow import point_of

            self.lo, self.hi, self.nan = (np.array(b) for b in point_of(self.array))
        return self.lo, self.hi, self.nan


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
    batch: bool = True  # evaluate reduce iterations together where exact (batching.py)
    #: reduce op id -> the fixed tree (semantics/trees.py) a realization
    #: evaluates it in; the reference then computes that member of the
    #: admitted set (interpreter/reductions.py, ``_block_tree``)
    trees: dict | None = None


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
        #: oracle: values with inexact admitted sets read by index expressions
        self.inexact_indices: list[str] = []
        self.batch_axes: dict[E.Expr, int] = {}  # batched index variable -> its batch axis
        # batched index variable -> its value at index 0 of its axis (absent: 0)
        self.batch_base: dict[E.Expr, int] = {}
        self.batch_plans: dict[Any, Any] = {}  # (region op id, planner) -> its plan (or None)
        self.batched_iterations = 0  # reduce iterations evaluated in batches (batching.py)
        self._bar_open = False  # a region's progress bar is shown (Interpreter.progress)
        self.stage_rec: Any = None  # (pipeline op, iteration, records) while checking
        # region op id -> per-instance box constraint of a domain whose extents
        # differ between the instances executing it together (regions.domain_points)
        self.ragged: dict[int, E.Pred] = {}
        #: (id of a block, inherited names) -> the block (held, so that its id is
        #: not reused) and {op index: the values the block holds whose last use
        #: is that op, with their defining op's index} (:func:`last_uses`)
        self.last_uses: dict[tuple[int, frozenset[str]],
                             tuple[Block, dict[int, tuple[tuple[str, int], ...]]]] = {}
        #: the values the running op reads for the last time (:meth:`reusable`;
        #: a ``stage`` hands them to its block)
        self.dying: frozenset[str] = frozenset()
        self.ienv = IndexEnv(self._bind(args, params))

    # -- binding ------------------------------------------------------------
    def _bind(self, args: Sequence[Any], params: dict[str, int]) -> dict[E.Expr, int]:
        p = self.prog
        args = host_arguments(p, args)  # any host array, as a numpy view of its memory
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
        stored = stored_tensors(p)
        for name, t in self.tensors.items():
            t.constant = name not in stored and t.buffer.alias is None
        return syms

    def _alias(self) -> None:
        """Arguments whose arrays overlap in memory share one effect-log buffer;
        an argument whose elements overlap each other is addressed by byte."""
        ts = list(self.tensors.values())
        for t in ts:
            if overlaps_itself(t.array):
                t.buffer.alias = (0, tuple(t.array.strides))
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
            if t.buffer.alias is not None:
                # aliased with another argument (its contents are an input), or
                # with itself (one element has several coordinates)
                continue
            t.array[...] = poison_value(t.array.dtype)
            t.written = np.zeros(t.array.shape, dtype=bool)

    # -- evaluation -----------------------------------------------------------
    def run(self) -> None:
        self.block(self.prog.body, [])

    def block(self, b: Block, args: Sequence[Any], inherit: frozenset[str] = frozenset(),
              handover: bool = False) -> list[Any]:
        """Run ``b`` with its arguments bound to ``args``; the values it yields.
        ``inherit``: values of the enclosing block that die in ``b`` (the op
        running ``b`` is their last use and runs ``b`` once: :func:`last_uses`).
        ``handover``: the caller keeps no other reference to the values of the
        list ``args``, which is emptied once they are bound, so that ``b`` may
        write into an argument's array at its last use (:meth:`reusable`)."""
        # bound without a loop variable, which would hold the last value
        self.values.update(zip([a.name for a in b.args], args, strict=True))
        if handover:
            assert isinstance(args, list)
            args.clear()
        return self._ops(b, 0, inherit)

    def _ops(self, b: Block, start: int, inherit: frozenset[str] = frozenset(),
             whole: bool = True) -> list[Any]:
        """Run ``b.ops[start:]``; the values its ``yield`` names (``[]`` without one).

        A value ``b`` holds leaves the environment after its last use, and that op
        may write its result into the value's array (:meth:`reusable`): one
        defined at ``start`` or later (the ops before it are not run again), or,
        in a ``whole`` run of ``b`` (not one group of a regrouped tail:
        :meth:`_regroup`), an argument of ``b`` or a name in ``inherit``."""
        key = (id(b), inherit)
        held = self.last_uses.get(key)
        if held is None or held[0] is not b:
            held = self.last_uses[key] = (b, last_uses(b, inherit))
        plan = held[1]
        for k in range(start, len(b.ops)):
            op = b.ops[k]
            if op.name == "yield":
                outs = [self.values[o.name] for o in op.operands]
                for n, at in plan.get(k, ()):
                    if whole or at >= start:
                        self.values.pop(n, None)
                return outs
            fn = RULES.get(op.name)
            if fn is None:
                raise TilenestError(f"the interpreter has no rule for op '{op.name}'", op.loc)
            dead = [n for n, at in plan.get(k, ()) if whole or at >= start]
            try:
                if op.regions:
                    self._result_extents(op)
                self.dying = frozenset(dead)
                try:
                    fn(self, op)
                finally:
                    self.dying = frozenset()
                for n in dead:
                    self.values.pop(n, None)  # an inherited one died inside already
                if self.track and not op.regions and op.name != "put":
                    self._propagate(op)
            except ExtentDiverges as dv:
                if dv.bshape != self.bshape:  # pragma: no cover - rules restore bshape first
                    raise RuntimeSemanticError(
                        f"tile extent {E.to_str(dv.expr)} varies across parallel instances "
                        "executed together", op.loc) from None
                return self._regroup(b, k, dv)
            except TilenestError as e:
                raise e.with_site(op.loc) from None
            except FloatingPointError as e:  # pragma: no cover - numpy errstate
                raise RuntimeSemanticError(str(e), op.loc) from None
            except ZeroDivisionError as e:  # an index expression over sizes of this call
                raise RuntimeSemanticError(
                    f"an index expression divides by zero in this call ({e})", op.loc,
                    "a size the kernel divides by is 0 here; state what the kernel needs "
                    "with tn.assume (e.g. tn.assume(H >= 1)), so such a call is refused up "
                    "front") from None
        return []

    def _result_extents(self, op: Operation) -> None:
        """Evaluate the extents of a region op's result types before it runs, so that
        a divergence among the active instances regroups them here (before any of
        the region's effects) rather than inside a branch whose yields then differ
        in shape."""
        for r in op.results:
            t = r.type
            if isinstance(t, TileType):
                for x in t.extents:
                    if not isinstance(x, E.Const):
                        self.extent(x)

    def _regroup(self, b: Block, k: int, dv: "ExtentDiverges") -> list[Any]:
        """Run ``b.ops[k:]`` once per group of active instances that agree on the
        diverging extent (each group under its lane mask, so every instance's
        effects happen exactly once, in its group), then join the yielded values
        per instance as a divergent ``if`` does: instance ``l`` takes group ``g``'s
        value where ``l`` is in ``g``."""
        saved = self.lane_mask
        runs: list[tuple[np.ndarray, list[Any], list[Any]]] = []
        y = b.terminator
        yielded = list(y.operands) if y is not None else []
        names = [o.name for o in yielded]
        try:
            for g in dv.groups:
                self.lane_mask = g
                outs = self._ops(b, k, whole=False)
                d = self.track[-1][1] if self.track else {}
                runs.append((g, outs, [d.get(n) for n in names]))
        finally:
            self.lane_mask = saved
        from .regions import select_lanes

        _, outs, marks = runs[-1]
        outs, marks = list(outs), list(marks)
        for g, o, m in reversed(runs[:-1]):
            outs = [select_lanes(g, a, c, self.nb) for a, c in zip(o, outs, strict=True)]
            for j, (ma, mb) in enumerate(zip(m, marks, strict=True)):
                if ma is None and mb is None:
                    continue
                ma = np.asarray(ma if ma is not None else False)
                mb = np.asarray(mb if mb is not None else False)
                rank = getattr(yielded[j].type, "rank", 0)
                marks[j] = np.where(g.reshape(g.shape + (1,) * rank), ma, mb)
        if self.track:
            d = self.track[-1][1]
            for n, m in zip(names, marks, strict=True):
                if m is not None:
                    d[n] = m
        return outs

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

    @contextmanager
    def progress(self, op: Operation, total: int, what: str = ""
                 ) -> Iterator[Callable[..., None]]:
        """A progress bar over the ``total`` iterations of region ``op`` (``what``
        says which pass over them, when not the run itself), for a region
        that is long: ``PROGRESS_MIN`` iterations or more, or one whose first
        iterations predict ``PROGRESS_AFTER`` seconds or more (the bar then
        starts part way, at the iterations done). One region at a time shows
        a bar; none is drawn where ``tilenest.progress`` draws nothing (not a
        terminal, CI, switched off). Yields the region's step function, called
        once per iteration (or ``advance=`` a batch of them)."""
        from .. import progress as _progress

        if total < 2 or self._bar_open or not _progress.enabled():
            yield _no_step
            return
        loc = op.loc
        where = f" at {os.path.basename(loc.file or '')}:{loc.line}" if loc else ""
        title = f"interpreting {op.name}{where}{f', {what}' if what else ''}"
        with ExitStack() as stack:
            bar: list[Callable[..., None]] = []
            done = 0
            t0 = _now()

            def open_bar() -> None:
                self._bar_open = True
                stack.callback(setattr, self, "_bar_open", False)
                bar.append(stack.enter_context(_progress.bar(title, total)))

            if total >= PROGRESS_MIN:
                open_bar()

            def step(label: str = "", advance: int = 1) -> None:
                nonlocal done
                if bar:
                    bar[0](label, advance)
                    return
                done += advance
                spent = _now() - t0
                if self._bar_open or spent < PROGRESS_PROBE:
                    return
                if spent >= PROGRESS_AFTER or spent / max(done - 1, 1) * total >= PROGRESS_AFTER:
                    open_bar()
                    bar[0](label, done)

            yield step

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

    def reusable(self, v: Any) -> np.ndarray | None:
        """The array of operand ``v`` of the running op, for the op's result to
        be written into, or None. It is given when this op reads ``v`` for the
        last time (``v`` leaves the environment after it: :meth:`_ops`), the
        run computes no oracle bounds (they are made from the operands after
        the result), and ``v``'s array is a writeable array of at least
        :data:`REUSE_BYTES` that owns its memory (C-contiguous) or views the
        whole of an array of its dtype that does, which nothing but ``v``'s entry holds (no
        other view, value or tensor: the reference counts say so, where they
        count every holder: :data:`EXACT_REFCOUNTS`). Callers check the layout
        they need (an owning array's may be reshaped; a view's strides are its
        own)."""
        if v.name not in self.dying or self.opts.oracle or not EXACT_REFCOUNTS:
            return None
        rv = self.values.get(v.name)
        if type(rv) is not RV:
            return None
        a = rv.a
        if type(a) is not np.ndarray or a.nbytes < REUSE_BYTES or not a.flags.writeable:
            return None
        # held by the environment and here (``rv``), by ``rv`` and here (``a``),
        # and by getrefcount's argument
        if sys.getrefcount(rv) != 3 or sys.getrefcount(a) != 3:
            return None
        if a.base is None:
            return a if a.flags.c_contiguous else None
        owner = a.base
        # a view of all of an owning array of the same dtype (not a reinterpretation
        # of its bits: ``bitcast``, a sign flip done on the integer bits), held by
        # the view's base and here
        if (type(owner) is not np.ndarray or owner.base is not None
                or owner.dtype != a.dtype or owner.nbytes != a.nbytes
                or not owner.flags.c_contiguous or sys.getrefcount(owner) != 3):
            return None
        return a

    def extent(self, e: E.Expr) -> int:
        """The value of a tile extent for the instances executing now.

        Tile shapes are shared by the instances executed together, so ``e`` must
        take one value on every active instance (inactive ones are masked out and
        do not count). When it does not, :class:`ExtentDiverges` asks the block
        being executed to regroup the active instances by the value of ``e``."""
        env: dict[E.Expr, Any] = dict(self.ienv.syms)
        for k, v in self.ienv.vars.items():
            if isinstance(v, (int, np.integer)):
                env[k] = int(v)
        try:
            return int(E.evaluate(e, env))
        except KeyError:
            pass
        vals = self.lane_values(e)
        if vals.size == 0 or self.nb == 0:
            return int(vals.reshape(-1)[0]) if vals.size else 0
        act = self.active_lanes()
        live = vals[act] if act is not None else vals.reshape(-1)
        if live.size == 0:
            return max(0, int(vals.reshape(-1)[0]))  # no instance runs: any shape will do
        first = live[0]
        if np.all(live == first):
            return int(first)
        groups = [np.broadcast_to(vals == u, self.bshape) & (act if act is not None else True)
                  for u in np.unique(live)]
        raise ExtentDiverges(e, tuple(self.bshape), groups)

    def extent_bound(self, e: E.Expr) -> tuple[int, bool]:
        """``(n, uniform)``: the largest value of ``e`` over the active instances
        (at least 0), and whether every active instance has that value."""
        try:
            return self.extent(e), True
        except ExtentDiverges:
            act = self.active_lanes()
            vals = self.lane_values(e)
            live = vals.reshape(-1) if act is None else vals[act]
            return max(0, int(live.max())), False

    def index_from_inexact(self, name: str) -> None:
        """An index expression or condition read ``name``, whose admitted set is
        not one value: the oracle's answer is then undetermined (reference)."""
        if self.opts.oracle and name not in self.inexact_indices:
            self.inexact_indices.append(name)

    def lane_values(self, e: E.Expr) -> np.ndarray:
        """``e`` at every batched instance (an int64 array of shape ``bshape``)."""
        from .runtime import eval_exprs

        (v,) = eval_exprs([e], self.ienv, self.nb, (), (), self.values,
                          self.index_from_inexact)
        v = np.asarray(v, dtype=np.int64)
        v = v.reshape(v.shape + (1,) * (self.nb - v.ndim)) if v.ndim < self.nb else v
        return np.broadcast_to(v, self.bshape)

    def active_lanes(self) -> np.ndarray | None:
        """The active-instance mask over ``bshape`` (None: all active)."""
        if self.lane_mask is None:
            return None
        return np.broadcast_to(self.lane_mask, self.bshape)

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


#: iterations from which a region shows a progress bar (at a terminal)
PROGRESS_MIN = 2000

#: seconds a shorter region is predicted (or seen) to run from which it shows
#: a bar too, and how long it runs before the prediction is made
PROGRESS_AFTER = 2.0
PROGRESS_PROBE = 0.25

#: the clock the progress prediction reads
_now = time.perf_counter


def _no_step(label: str = "", advance: int = 1) -> None:
    """The step of a region without a progress bar."""


class ExtentDiverges(Exception):
    """Internal signal: a tile extent differs between active batched instances.

    Not an error of the program: the block that runs the op catches it and
    re-runs the rest of the block once per group (``groups``: masks over
    ``bshape`` partitioning the active instances by the extent's value)."""

    def __init__(self, expr: E.Expr, bshape: tuple[int, ...], groups: list[np.ndarray]):
        super().__init__(E.to_str(expr))
        self.expr = expr
        self.bshape = bshape
        self.groups = groups


def _py_scalar(a: Any) -> Any:
    if isinstance(a, np.ndarray):
        if a.shape != ():
            raise ValueError("a scalar argument must be a number or 0-d array")
        a = a.item()
    if isinstance(a, np.generic):
        a = a.item()
    return a
