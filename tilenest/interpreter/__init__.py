"""The reference interpreter: the exact meaning of a TileProgram on numpy.

``interpret(program_or_kernel, *arrays, params=..., schedule=...)`` binds the
arrays (tensors are written in place) and runtime scalars, executes the
program, and returns the tensors it stores to (one array, or a tuple).

Meaning lives in one rule per op: ``values.py`` (pure values), ``memory.py``
(views, Memory), ``regions.py`` (parallel/serial/pipeline/if/while),
``reductions.py`` (reduce policies); ``effects.py`` is the race detector and
``semantics/numerics.py`` the scalar arithmetic of every dtype.
"""

from __future__ import annotations

import itertools
import random as _pyrandom
from typing import Any

import numpy as np

from ..semantics.arrays import host_arguments
from ..semantics.signature import stored_tensors
from ..errors import RuntimeSemanticError
from . import memory, reductions, regions, values  # noqa: F401  (register rules)
from . import shadow as S
from .effects import overlaps_itself
from .core import (BATCHED, CANONICAL, REVERSED, SCHEDULE_SPELLINGS, Interpreter, Options,
                   Schedule, parse_schedule, random)

__all__ = ["interpret", "reference", "Schedule", "parse_schedule", "random", "CANONICAL",
           "REVERSED", "BATCHED", "EXHAUSTIVE", "SCHEDULE_SPELLINGS"]

EXHAUSTIVE = Schedule("exhaustive")

#: most runs an exhaustive exploration makes
EXHAUSTIVE_BUDGET = 5040


def interpret(program_or_kernel: Any, *arrays: Any, params: dict[str, int] | None = None,
              schedule: Any = None, fast: bool = False, check_races: bool = True,
              poison: bool = False, outputs: tuple[str, ...] | None = None,
              check_pipelines: bool = True, batch: bool = True) -> Any:
    """Run a program; returns the tensors it stores to (written in place).

    ``schedule``: None (batched lockstep), 'canonical', 'reversed', random(seed)
    (or 'random:SEED'), 'exhaustive'; anything else is a TilenestError (see
    :func:`parse_schedule`). ``fast``: reassociating ops use BLAS/pairwise orders (still
    admitted). ``check_races``: the parallel effect log. ``poison``: fill pure
    outputs (or ``outputs``) with NaN/sentinels first and report reads of
    elements nothing wrote. ``check_pipelines``: report pipelines whose result
    relies on an order their dependences don't give. ``batch``: evaluate the
    iterations of a reduce region together where that is exactly equivalent
    (``batching.py``); False runs them one by one (the same results, errors and
    race reports, slower)."""
    prog = getattr(program_or_kernel, "program", program_or_kernel)
    sched = parse_schedule(schedule)
    opts = Options(sched, fast, check_races, poison, outputs, check_pipelines, batch=batch)
    host = host_arguments(prog, arrays)  # numpy views of the caller's arrays
    if sched.kind == "exhaustive":
        _exhaustive(prog, host, params or {}, opts)
        return _outputs(prog, arrays)
    it = Interpreter(prog, host, params or {}, opts)
    with np.errstate(all="ignore"):
        it.run()
    return _outputs(prog, arrays)


def _outputs(prog: Any, arrays: tuple) -> Any:
    stored = stored_tensors(prog)
    outs = [a for v, a in zip(prog.args, arrays, strict=True) if v.name in stored]
    return outs[0] if len(outs) == 1 else tuple(outs)


class OrderOracle:
    """Enumerates child orders of parallel regions depth-first across runs:
    each region instance reached is a choice point over the permutations of its
    children; the next run advances the last unexhausted choice point.

    A region of more than ``limit`` children has too many orders to run them
    all; its choice point offers the row-major order, its reverse and
    ``samples`` seeded shuffles. (Every run also checks races with the complete
    effect log, and a race-free run means the same as every order.)"""

    def __init__(self, limit: int = 6, samples: int = 4):
        self.limit = limit
        self.samples = samples
        self.stack: list[list[Any]] = []  # [permutations list, index]
        self.pos = 0

    def orders(self, n: int) -> list[tuple[int, ...]]:
        if n <= self.limit:
            return list(itertools.permutations(range(n)))
        out = [tuple(range(n)), tuple(range(n - 1, -1, -1))]
        for seed in range(self.samples):
            o = list(range(n))
            _pyrandom.Random(seed).shuffle(o)
            out.append(tuple(o))
        return out

    def next(self, op: Any, n: int) -> list[int]:
        if self.pos == len(self.stack):
            self.stack.append([self.orders(n), 0])
        perms, k = self.stack[self.pos]
        self.pos += 1
        return list(perms[k])

    def advance(self) -> bool:
        self.pos = 0
        while self.stack:
            top = self.stack[-1]
            top[1] += 1
            if top[1] < len(top[0]):
                return True
            self.stack.pop()
        return False


def copy_arguments(arrays: tuple) -> list[Any]:
    """Copies of the arguments that keep their aliasing: arrays sharing memory
    (with another argument, or between their own elements) are re-created as
    views of one copied buffer with the same offsets and strides."""
    roots: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    out: list[Any] = []
    for a in arrays:
        if not isinstance(a, np.ndarray):
            out.append(a)
            continue
        root = a
        while isinstance(root.base, np.ndarray):
            root = root.base
        shared = overlaps_itself(a) or any(np.shares_memory(a, b) for b in arrays
                                           if isinstance(b, np.ndarray) and b is not a)
        if not shared:
            out.append(a.copy())
            continue
        if id(root) not in roots:
            roots[id(root)] = (root, np.copy(root, order="K"))
        r, rc = roots[id(root)]
        off = a.__array_interface__["data"][0] - r.__array_interface__["data"][0]
        out.append(np.ndarray(a.shape, a.dtype, buffer=rc, offset=off, strides=a.strides))
    return out


def _exhaustive(prog: Any, arrays: tuple, params: dict, opts: Options) -> Any:
    originals = [a.copy() if isinstance(a, np.ndarray) else a for a in arrays]
    oracle = OrderOracle()
    first: list[np.ndarray] | None = None
    runs = 0
    while True:
        work = [a.copy() if isinstance(a, np.ndarray) else a for a in originals]
        o = Options(CANONICAL, opts.fast, opts.check_races, opts.poison, opts.outputs,
                    opts.check_pipelines, oracle, batch=opts.batch)
        it = Interpreter(prog, work, params, o)
        with np.errstate(all="ignore"):
            it.run()
        runs += 1
        res = [w for w in work if isinstance(w, np.ndarray)]
        if first is None:
            first = res
        else:
            for a, b in zip(first, res, strict=True):
                if a.tobytes() != b.tobytes():
                    raise RuntimeSemanticError(
                        "the program's result depends on the order of parallel children",
                        prog.loc, "parallel instances must be independent")
        if not oracle.advance() or runs >= EXHAUSTIVE_BUDGET:
            break
    for a, r in zip(arrays, first or [], strict=False):
        if isinstance(a, np.ndarray):
            a[...] = r
    return _outputs(prog, arrays)


def reference(program_or_kernel: Any, *arrays: Any, params: dict[str, int] | None = None,
              outputs: tuple[str, ...] | None = None, poison: bool = False,
              schedule: Any = None, batch: bool = True, trees: dict | None = None) -> Any:
    """The admitted outputs of a call: one :class:`Admitted` per tensor the program
    stores to (a single one, or a tuple in argument order). The arrays passed are
    not modified.

    ``trees`` maps the op id of a tree-policy ``reduce`` under a custom
    contract to the :class:`~tilenest.semantics.trees.BlockTree` a compiled
    kernel evaluates it in (``kernel.trees``): the admitted value of its
    states is then that tree's (R-6 admits it; a custom merge has no
    envelope), computed exactly as the realization does.

    ``schedule`` (as for :func:`interpret`) is the order in which the reference
    run executes ``parallel`` children; every schedule admits the same set for a
    race-free program, and each one checks races. ``exhaustive`` first runs every
    order of every small region (an order-dependent result is an error), then
    computes the admitted set in the canonical order. ``batch`` as for
    :func:`interpret`."""
    from .oracle import Admitted

    prog = getattr(program_or_kernel, "program", program_or_kernel)
    sched = parse_schedule(schedule)
    host = host_arguments(prog, arrays, written=())  # the oracle writes only copies
    if sched.kind == "exhaustive":
        probe = Options(sched, False, True, poison, outputs, True, batch=batch)
        _exhaustive(prog, tuple(copy_arguments(host)), params or {}, probe)
        sched = CANONICAL
    work = copy_arguments(host)
    opts = Options(sched, False, True, poison, outputs, True, None, True, batch=batch,
                   trees=trees)
    it = Interpreter(prog, work, params or {}, opts)
    with np.errstate(all="ignore"):
        it.run()
    stored = stored_tensors(prog)
    res = []
    for v, a in zip(prog.args, work, strict=True):
        if v.name not in stored:
            continue
        t = it.tensors[v.name]
        lo, hi, nan = t.lo, t.hi, t.nan
        if lo is not None:
            # the canonical evaluation is always admitted (spec R-6): where rounding
            # in the canonical order overflowed outside the envelope, widen the range
            # to include it; a canonical NaN the set does not admit (infinities of
            # both signs met in some order) leaves the element unbounded
            ref = S.as_f64(a)
            missed = np.isnan(ref) & ~nan
            lo, hi, nan = S.join((lo, hi, nan), ~np.isnan(ref), ref)
            lo, hi, nan = S.settle(np.where(missed, np.nan, lo), hi, nan)
        at = tuple(dict.fromkeys([f"{op.name} ({op.loc})" if op.loc else op.name
                                  for op in it.undetermined] +
                                 [f"an index or condition reading %{n}"
                                  for n in it.inexact_indices]))
        res.append(Admitted(v.name, v.type.dtype, a, lo, hi,
                            not (it.undetermined or it.inexact_indices), nan, at))
    return res[0] if len(res) == 1 else tuple(res)
