"""Calls of a compiled llvm kernel, bound once per argument layout.

Binding a call (:class:`~tilenest.backends.calls.ArgumentBinder`: viewing
the arrays, checking dtypes, ranks, extents, assumptions, packing,
writeability and aliasing, choosing the variant, evaluating program counts
and local buffer sizes) costs tens of microseconds in Python, more than a
small kernel's work. Its result depends only on facts of the arguments that
are cheap to read, so it is kept, per kernel, and reused when the facts agree:

* the *layout key* (:func:`fingerprint`): per tensor argument, for a numpy
  array its shape, strides, dtype and flags (writeable, aligned...); for a
  torch tensor its shape, strides, dtype, whether it is on the CPU, and the
  properties that decide whether it can be viewed in place
  (``requires_grad``, the negative bit); per runtime scalar its exact value
  (bits, with its type); then ``params`` and ``threads``. Other arguments (other
  frameworks' arrays, subclasses, 0-d arrays for scalars) are bound afresh at
  every call.
* the *addresses* of the tensor arguments, which are checked at every call,
  never cached: each must be aligned for its dtype, and where a written
  argument's bytes overlap another argument's the two must be the same
  array (same address and layout), which makes them an alias group (M-8).
  The groups select the variant; any other overlap goes to the full binding,
  which decides it exactly (and refuses partial overlaps).

So a check that can fail on an argument is never skipped: an array whose
shape, strides, dtype, flags, address or any other fact in the key changed
is either bound afresh or passes the per-call address checks, which are
exactly the checks that depend on the address. A layout is kept only after
a binding that succeeded, and a plan under the alias groups that the
per-call checks compute for it; the full binding's own decision is checked
to agree with them before anything is kept.

The call itself is one native call (:class:`~.workers.Launch`) whose argument
vector gets the call's addresses. Counters ``binds`` (full bindings) and
``hits`` (calls that reused one) say which path calls took.
"""

from __future__ import annotations

import ctypes
import functools
import numbers
import os
import struct
import sys
import threading
from typing import Any

import numpy as np

from ...errors import TilenestError
from ...semantics.types import TensorType
from ..calls import scratch_arrays
from .workers import Launch

#: most layouts one kernel keeps (then the oldest is forgotten)
MAX_LAYOUTS = 32

_EMPTY = np.zeros(64, dtype=np.uint8)  # what an empty tensor's pointer refers to
_DOUBLE = struct.Struct("<d").pack
_NUMPY_SCALARS = frozenset(np.sctypeDict.values()) - {np.object_, np.str_, np.bytes_,
                                                      np.void, np.datetime64, np.timedelta64}


def _data_offset() -> int | None:
    """Where a numpy array object keeps its data pointer (numpy's C layout: right
    after the object header), if this interpreter is one where that can be
    read and the probes agree; else None (addresses are read the slow way)."""
    if sys.implementation.name != "cpython":
        return None
    at = object.__basicsize__
    for probe in (np.zeros(3), np.zeros((2, 5), np.float32)[:, 1:], np.empty(0)):
        if ctypes.c_void_p.from_address(id(probe) + at).value != probe.ctypes.data:
            return None
    return at


_AT = _data_offset()
_READ = ctypes.c_void_p.from_address


def address(a: np.ndarray) -> int:
    """The address of a numpy array's first element."""
    if _AT is None:
        return int(a.ctypes.data)
    return _READ(id(a) + _AT).value or 0


def fingerprint(tensor: tuple[bool, ...], args: tuple, params: Any, threads: Any
                ) -> tuple[tuple, list[int]] | None:
    """``(layout key, tensor addresses)`` of a call (see the module docstring),
    or None for a call whose arguments are not all of the kinds keyed here.
    ``tensor``: which parameters are tensors. ``addresses`` has 0 for a
    scalar parameter.

    A torch tensor is keyed by shape, strides, dtype, whether it is on the
    CPU, ``requires_grad`` and its negative bit: with its address, what its
    numpy view and the checks of that view are a function of (only strided
    tensors are keyed; the conjugate bit exists only on complex dtypes, which
    no kernel takes)."""
    if len(args) != len(tensor):
        return None
    key: list[Any] = [threads]
    ptrs: list[int] = []
    i = 0
    for a in args:
        t = type(a)
        if t is np.ndarray:
            if not tensor[i]:
                return None  # a 0-d array for a scalar: its value is not keyed
            key.append((a.shape, a.strides, a.dtype, a.flags.num))
            ptrs.append((_READ(id(a) + _AT).value or 0) if _AT is not None else a.ctypes.data)
        elif tensor[i]:
            torch = sys.modules.get("torch")
            if torch is None or t is not torch.Tensor or a.layout is not torch.strided:
                return None
            key.append((a.shape, a.stride(), a.dtype, a.is_cpu, a.requires_grad, a.is_neg()))
            ptrs.append(a.data_ptr())
        else:
            if t is int or t is bool:
                key.append((t, a))
            elif t is float:
                key.append((t, _DOUBLE(a)))
            elif t in _NUMPY_SCALARS:
                key.append((t, a.tobytes()))
            else:
                return None
            ptrs.append(0)
        i += 1
    if params is not None:
        try:
            key.append(tuple((k, type(v), v) for k, v in params.items()))
            hash(key[-1])
        except (AttributeError, TypeError):
            return None
    return tuple(key), ptrs


class Layout:
    """What every call with one layout key shares: each tensor's byte span
    around its address and alignment, the pairs whose overlap matters (one of
    them written), and the plans bound so far, by alias groups."""

    def __init__(self, names: list[str], keep: list, tensor: tuple[bool, ...],
                 written: set[str]):
        self.names = names
        self.align: list[tuple[int, int]] = []
        spans: dict[int, tuple[int, int]] = {}
        for i, (is_tensor, a) in enumerate(zip(tensor, keep, strict=True)):
            if not is_tensor:
                continue
            self.align.append((i, max(1, a.dtype.alignment)))
            if a.size:
                lo = sum((n - 1) * s for n, s in zip(a.shape, a.strides, strict=True) if s < 0)
                hi = sum((n - 1) * s for n, s in zip(a.shape, a.strides, strict=True) if s > 0)
                spans[i] = (lo, hi + a.itemsize)
        self.pairs = []
        for i in spans:
            for j in spans:
                if j < i and (names[i] in written or names[j] in written):
                    a, b = keep[i], keep[j]
                    same = a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype
                    self.pairs.append((i, j, spans[i], spans[j], same))
        self.plans: dict[tuple, Plan] = {}

    def groups(self, ptrs: list[int]) -> tuple[tuple[str, ...], ...] | None:
        """The alias groups of a call with these addresses, in the form
        ``ArgumentBinder.aliases`` gives them; None when an address is
        misaligned or two spans overlap without being the same array (the
        full binding decides those)."""
        for i, al in self.align:
            if ptrs[i] % al:
                return None
        parent: dict[int, int] | None = None
        for i, j, (ilo, ihi), (jlo, jhi), same in self.pairs:
            pi, pj = ptrs[i], ptrs[j]
            if pi + ilo < pj + jhi and pj + jlo < pi + ihi:
                if not same or pi != pj:
                    return None
                if parent is None:
                    parent = {}
                ri, rj = _root(parent, i), _root(parent, j)
                if ri != rj:
                    parent[ri] = rj
        if parent is None:
            return ()
        out: dict[int, list[str]] = {}
        for i in range(len(self.names)):
            out.setdefault(_root(parent, i), []).append(self.names[i])
        return tuple(tuple(g) for g in out.values() if len(g) > 1)


def _root(parent: dict[int, int], i: int) -> int:
    while i in parent:
        i = parent[i]
    return i


class Plan:
    """A bound call: the kernel variant that runs it, its launch (argument
    vector, symbols, chunking, local buffers), where the call's addresses go
    in the argument vector and which arguments the call returns."""

    def __init__(self, kernel: Any, launch: Launch, fill: list[int], outs: list[int],
                 keep: list, scratch: Any):
        self.kernel = kernel
        self.launch = launch
        self.fill = fill
        self.outs = outs
        #: the runtime scalars' arrays, which the argument vector points at
        self.scalars = [a for i, a in enumerate(keep) if a.ndim == 0 and i not in fill]
        #: ``() -> arrays``: fresh scratch buffers (values crossing a phase
        #: boundary) for this call's sizes; the plan's own follow the arguments
        self.new_scratch = scratch
        self.scratch = scratch()
        self.first = len(keep)
        for j, a in enumerate(self.scratch):
            launch.argv[self.first + j] = address(a)
        self.lock = threading.Lock()

    def run(self, ptrs: list[int]) -> int:
        """Run with the tensors at ``ptrs``; the status code (0: success)."""
        if self.lock.acquire(False):
            try:
                argv = self.launch.argv
                for i in self.fill:
                    argv[i] = ptrs[i]
                return self.launch.run()
            finally:
                self.lock.release()
        launch = self.launch.copy()  # another thread is running this plan
        for i in self.fill:
            launch.argv[i] = ptrs[i]
        scratch = self.new_scratch()  # its own: the running call uses the plan's
        for j, a in enumerate(scratch):
            launch.argv[self.first + j] = address(a)
        code = launch.run()
        del scratch
        return code


class Calls:
    """The bound calls of one compiled kernel (see the module docstring)."""

    def __init__(self, kernel: Any):
        self.kernel = kernel
        p = kernel.program
        self.names = [v.name for v in p.args]
        self.tensor = tuple(isinstance(v.type, TensorType) for v in p.args)
        self.outs = [i for i, v in enumerate(p.args) if v.name in kernel.stored]
        self.layouts: dict[tuple, Layout] = {}
        #: calls bound afresh, and calls that reused a binding
        self.binds = 0
        self.hits = 0

    def __call__(self, args: tuple, params: Any, threads: Any) -> Any:
        fp = fingerprint(self.tensor, args, params, threads)
        if fp is not None:
            key, ptrs = fp
            lay = self.layouts.get(key)
            if lay is not None:
                groups = lay.groups(ptrs)
                plan = lay.plans.get(groups) if groups is not None else None
                if plan is not None:
                    self.hits += 1
                    return self._finish(plan, plan.run(ptrs), args)
        return self._bind(args, params, threads, fp)

    def _finish(self, plan: Plan, code: int, args: tuple) -> Any:
        if code:
            raise plan.kernel._error(code)
        outs = [args[i] for i in plan.outs]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _bind(self, args: tuple, params: Any, threads: Any, fp: Any) -> Any:
        """Bind a call afresh (every check), keep it when it may be reused, run it."""
        self.binds += 1
        k = self.kernel
        if threads is not None and (not isinstance(threads, numbers.Integral)
                                    or isinstance(threads, bool) or threads < 1):
            raise TilenestError(f"threads={threads!r} for kernel {k.program.name}: the number of "
                                "threads must be a positive integer", k.program.loc,
                                "leave threads out for the schedule's (default: one per CPU)")
        keep, syms = k.bind(args, params)
        groups, strided = k.aliases(keep), k.strided(keep)
        kern = k.variant(groups, strided)
        plan = self._plan(kern, keep, syms, threads)
        # run before the plan is shared: once in ``layouts``, another thread's
        # call may refill its argument vector (``Plan.run``), and this run
        # holds no lock on it
        code = plan.launch.run()
        if fp is not None:
            key, ptrs = fp
            lay = self.layouts.get(key)
            if lay is None:
                lay = Layout(self.names, keep, self.tensor, k.stored)
                if len(self.layouts) >= MAX_LAYOUTS:
                    del self.layouts[next(iter(self.layouts))]
                self.layouts[key] = lay
            if lay.groups(ptrs) == groups and all(address(keep[i]) == ptrs[i]
                                                  for i in plan.fill):
                lay.plans[groups] = plan
        return self._finish(plan, code, args)

    def _plan(self, kern: Any, keep: list, syms: dict[str, int], threads: int | None) -> Plan:
        facts = kern.facts
        values = tuple(syms[s] for s in facts.syms)
        sizes, counts = kern._extents.get(values) or kern._evaluate_extents(values)
        nthreads = int(threads or kern.schedule.threads or os.cpu_count() or 1)
        phases = [(addr, n, nthreads if ph.parallel else 1)
                  for addr, n, ph in zip(kern.addresses, counts, facts.phases, strict=True)]
        fill = [i for i, t in enumerate(self.tensor) if t and keep[i].size]
        scratch = functools.partial(scratch_arrays, facts, len(keep), syms)
        n_scratch = sum(1 for b in facts.globals if b.arg >= len(keep))
        argv = np.array([_EMPTY.ctypes.data if t and not a.size else address(a)
                         for t, a in zip(self.tensor, keep, strict=True)]
                        + [0] * n_scratch or [0], dtype=np.int64)
        symv = np.array(values or (0,), dtype=np.int64)
        launch = Launch(phases, argv, symv, sizes, kern.schedule.chunk)
        return Plan(kern, launch, fill, self.outs, keep, scratch)
