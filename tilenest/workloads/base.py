"""What a workload is, and how one is run and judged.

A :class:`Workload` bundles

* ``build(dtype)`` -- the kernel for a storage dtype (f32, or f16/bf16 storage
  with f32 accumulation); its tile/schedule choices (block sizes, rows per
  program, loop kinds) are keyword-only compile-time constants, so
  ``kernel.specialize(**schedule)`` gives each variant of the same math;
* ``make_args(rng, size, dtype)`` -- every call argument, inputs and outputs, in
  signature order (outputs start as NaN or sentinel values, so an element the
  kernel fails to store is visible);
* ``formula(args, size, dtype)`` -- the independent FP64 numpy formula of each
  output with its per-element error bound (an :class:`~.bounds.Approx`), or an
  exact array for outputs whose contract is bitwise (indices, strict folds), or
  a list of both;
* named ``sizes`` (``small``, ``medium``, shape variants, and ``large``) and at
  least two ``schedules``.

:func:`run` executes a workload on the reference interpreter; :func:`check`
judges the outputs against the FP64 formula, and :func:`admitted` against the
interpreter's own oracle (``tn.reference``). A workload is correct when both
accept.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..semantics.signature import stored_tensors
from ..semantics import dtypes as D
from ..semantics.dtypes import DType
from .bounds import Approx, Check, same_bits, within

Args = dict[str, Any]
Size = dict[str, int]


@dataclass(frozen=True)
class Workload:
    """A real kernel with its FP64 oracle; see the module docstring."""

    name: str
    family: str
    summary: str
    build: Callable[[DType], Any]
    make_args: Callable[[np.random.Generator, Size, DType], Args]
    formula: Callable[[Args, Size, DType], dict[str, Any]]
    sizes: dict[str, Size]
    schedules: tuple[dict[str, Any], ...]
    dtypes: tuple[DType, ...] = (D.f32, D.f16, D.bf16)
    fixed: dict[str, Any] = field(default_factory=dict)
    #: compile-time constants a size implies (e.g. top-k's ``k``)
    size_consts: Callable[[Size], dict[str, Any]] | None = None

    def kernel(self, dtype: DType = D.f32, schedule: dict[str, Any] | None = None,
               size: str | Size | None = None) -> Any:
        consts = {**self.fixed, **(self.schedules[0] if schedule is None else schedule)}
        if size is not None:
            sz = self.size(size)
            if self.size_consts is not None:
                consts.update(self.size_consts(sz))
            consts = {n: (v(sz) if callable(v) else v) for n, v in consts.items()}
        k = self.build(dtype)
        return k.specialize(**consts) if consts else k

    def size(self, size: str | Size) -> Size:
        return dict(self.sizes[size]) if isinstance(size, str) else dict(size)

    def args(self, size: str | Size = "small", dtype: DType = D.f32, seed: int = 0) -> Args:
        """Seeded arguments: the same (workload, size, dtype, seed) gives the same bits."""
        sz = self.size(size)
        key = f"{self.name}/{sorted(sz.items())}/{dtype.name}/{seed}".encode()
        return self.make_args(np.random.default_rng(zlib.crc32(key)), sz, dtype)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Names of the arguments the kernel stores to."""
        prog = self.build(D.f32).program
        stored = stored_tensors(prog)
        return tuple(a.name for a in prog.args if a.name in stored)


class SizeDependent:
    """A schedule constant computed from the size (e.g. a padded tile width)."""

    def __init__(self, name: str, fn: Callable[[Size], Any]):
        self.name, self.fn = name, fn

    def __call__(self, size: Size) -> Any:
        return self.fn(size)

    def __repr__(self) -> str:
        return self.name


@dataclass
class Result:
    """One run: the arguments as passed (before the call) and the outputs."""

    workload: Workload
    size: Size
    dtype: DType
    schedule: dict[str, Any]
    kernel: Any
    args: Args
    outputs: dict[str, np.ndarray]


def _copy(a: Any) -> Any:
    return a.copy() if isinstance(a, np.ndarray) else a


def run(wl: Workload, size: str | Size = "small", dtype: DType = D.f32,
        schedule: dict[str, Any] | None = None, interp: Any = None, fast: bool = False,
        seed: int = 0) -> Result:
    """Run ``wl`` on the reference interpreter (``interp`` is its schedule:
    None for batched lockstep, 'canonical', 'reversed', ``random(seed)``)."""
    import tilenest as tn

    sched = dict(wl.schedules[0] if schedule is None else schedule)
    sz = wl.size(size)
    k = wl.kernel(dtype, sched, sz)
    args = wl.args(sz, dtype, seed)
    work = {n: _copy(a) for n, a in args.items()}
    tn.interpret(k, *work.values(), schedule=interp, fast=fast)
    outs = {n: work[n] for n in wl.outputs}
    return Result(wl, sz, dtype, sched, k, args, outs)


def check(r: Result) -> list[Check]:
    """The outputs of ``r`` against the workload's FP64 formula and bound."""
    want = r.workload.formula({n: _copy(a) for n, a in r.args.items()}, r.size, r.dtype)
    res = []
    for name, got in r.outputs.items():
        ws = want[name] if isinstance(want[name], list) else [want[name]]
        for w in ws:
            res.append(within(name, got, w) if isinstance(w, Approx) else same_bits(name, got, w))
    return res


def admitted(r: Result) -> list[tuple[str, Any]]:
    """The outputs of ``r`` against the interpreter's oracle (``tn.reference``)."""
    import tilenest as tn

    adm = tn.reference(r.kernel, *(_copy(a) for a in r.args.values()))
    adm = adm if isinstance(adm, tuple) else (adm,)
    return [(a.name, a.admits(r.outputs[a.name])) for a in adm]


def reference(r: Result) -> tuple[Any, ...]:
    """The admitted sets of ``r``'s call (one per output)."""
    import tilenest as tn

    adm = tn.reference(r.kernel, *(_copy(a) for a in r.args.values()))
    return adm if isinstance(adm, tuple) else (adm,)


# ---------------------------------------------------------------------- input helpers
def normal(rng: np.random.Generator, shape: Any, dtype: DType, scale: float = 1.0) -> np.ndarray:
    """Non-dyadic normal values, rounded once to the storage dtype."""
    return (rng.standard_normal(shape) * scale).astype(np.float64).astype(dtype.np)


def uniform(rng: np.random.Generator, shape: Any, dtype: DType, lo: float, hi: float
            ) -> np.ndarray:
    return rng.uniform(lo, hi, shape).astype(np.float64).astype(dtype.np)


def sentinel(shape: Any, dtype: DType) -> np.ndarray:
    """An output buffer pre-filled so that unwritten elements stand out."""
    if dtype.is_float:
        return np.full(shape, np.nan, dtype=np.float64).astype(dtype.np)
    info = np.iinfo(dtype.np)
    return np.full(shape, info.min, dtype=dtype.np)


def x64(a: Any, compute: DType = D.f32) -> Approx:
    """A stored input as the exact value the kernel computes with (its storage
    dtype widened, exactly, to the ``compute`` dtype)."""
    from .bounds import cast

    return cast(Approx.exact(a), compute)
