"""Calling a compiled kernel on numpy arrays.

:class:`CompiledKernel` binds a call like the interpreter does (one array per
tensor parameter, one number per runtime scalar; extents bind the kernel's
symbols, ``params=`` gives the others) and checks what the generated code
relies on, with a ``TilenestError`` naming the argument otherwise:

* dtype exactly the parameter's, rank and extents consistent with the
  signature and the kernel's assumptions;
* C-contiguous, aligned arrays (the code indexes them densely, zero-copy), and
  writeable ones for the tensors the kernel stores to;
* aliasing (M-8): an array the kernel writes may be passed for several
  parameters only as the *same* array (equal address, dtype, shape and
  strides); the call then runs a variant compiled for that alias group (no
  ``noalias``, no lazy reads of the shared storage, legality checked with the
  group as one tensor). Partially overlapping arrays are refused.

A call is bound once per argument layout (:mod:`.callplan`): the checks
above run in full on a layout's first call, and later calls with the same
layout re-check only what depends on the arrays' addresses (alignment and
overlap). Each phase runs its program ids ``[0, n)``: a parallel phase is cut
into contiguous chunks that native worker threads take one after another
(:mod:`.workers`), each with its own local buffers; the whole call is one
foreign call that releases the GIL. After a phase, a nonzero status raises
the error it encodes (the first one in program-id order). Values that cross
a phase boundary live in scratch arrays allocated for the bound call
(``calls.scratch_arrays``), passed after the caller's arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...errors import TilenestError
from ...lowering import loopir as L
from ...semantics import expr as E
from ...semantics.ir import TileProgram
from ...semantics.signature import order_arguments, stored_tensors
from ..calls import ArgumentBinder, status_error
from .callplan import Calls


class CompiledKernel(ArgumentBinder):
    """A JIT-compiled kernel: call it like the interpreter (arrays written in
    place; returns the tensors it stores to). ``loopir``, ``llvm_ir`` and
    ``asm()`` show the generated code.

    ``kernel`` is the serial loop IR the code was generated from, or the
    :class:`~tilenest.backends.kernelcache.CallFacts` of it (a kernel read
    from the disk cache); calls read only ``facts``. For a kernel built from
    facts, ``kernel`` is lowered again on first access (``lower``), never for
    a call. ``engine`` owns the machine code: it lives as long as this
    object, whatever the caches do. ``cached`` is ``"disk"`` for a kernel
    read from the disk cache, else None."""

    def __init__(self, program: TileProgram, kernel: Any, engine: Any, schedule: Any,
                 llvm_ir: str, optimized_ir: str, compile_seconds: float, host: Any = None, *,
                 object_code: bytes = b"", lower: Callable[[], L.Kernel] | None = None,
                 loopir: str | None = None):
        from ..kernelcache import CallFacts

        self.program = program
        self.host = host
        self.facts = CallFacts.of(kernel)
        self._kernel = None if isinstance(kernel, CallFacts) else kernel
        self._lower = lower
        self._loopir = loopir
        self.engine = engine
        self.schedule = schedule
        self.llvm_ir = llvm_ir
        self.optimized_ir = optimized_ir
        self.object_code = object_code
        self.compile_seconds = compile_seconds
        self.obligations: list = []
        self.cached: str | None = None
        #: each phase's entry point
        self.addresses = [engine.address(ph.name) for ph in self.facts.phases]
        self.stored = stored_tensors(program)
        self._extents: dict[tuple[int, ...], tuple[list[int], list[int]]] = {}
        #: this kernel's bound calls (``calls.binds``, ``calls.hits`` count them)
        self.calls = Calls(self)

    @property
    def kernel(self) -> L.Kernel:
        """The serial loop IR kernel (lowered again on first access for a
        kernel read from the disk cache)."""
        if self._kernel is None:
            if self._lower is None:
                raise TilenestError("internal: this compiled kernel has no loop IR")
            self._kernel = self._lower()
        return self._kernel

    @property
    def trees(self) -> dict:
        """Reduce op id -> the fixed tree the lowering committed it to (a
        custom reduction split over programs); the reference evaluates it."""
        return dict(self.kernel.trees)

    @property
    def loopir(self) -> str:
        if self._loopir is None:
            self._loopir = L.print_kernel(self.kernel)
        return self._loopir

    @property
    def nbytes(self) -> int:
        """Bytes of the artifacts this kernel holds (object code, IR texts):
        what it counts for in the in-memory cache's bound."""
        return (len(self.object_code) + len(self.llvm_ir) + len(self.optimized_ir)
                + len(self._loopir or ""))

    def with_schedule(self, schedule: Any) -> CompiledKernel:
        """This kernel under ``schedule``, which differs from its own at most in
        the runtime fields ``threads`` and ``chunk``: itself when those agree,
        else a kernel sharing the engine and the code."""
        own = self.schedule
        if own.threads == schedule.threads and own.chunk == schedule.chunk:
            return self
        ck = CompiledKernel(self.program, self._kernel or self.facts, self.engine, schedule,
                            self.llvm_ir, self.optimized_ir, self.compile_seconds, self.host,
                            object_code=self.object_code, lower=self._lower,
                            loopir=self._loopir)
        ck.obligations = self.obligations
        ck.cached = self.cached
        return ck

    def asm(self) -> str:
        """The host assembly of the optimized module."""
        from .jit import asm, host, parse

        mod = parse(self.optimized_ir, self.host or host())
        try:
            return asm(mod, self.engine.tm)
        finally:
            mod.close()

    def __repr__(self) -> str:
        return f"<compiled {self.program.name} for llvm>"

    def variant(self, aliases: tuple[tuple[str, ...], ...],
                strided: tuple[str, ...] = ()) -> CompiledKernel:
        """This kernel compiled for a call whose parameters alias as ``aliases``
        and whose ``strided`` parameters are strided views."""
        if aliases == self.schedule.aliases and strided == self.schedule.strided:
            return self
        from . import compile_program

        return compile_program(self.program, self.schedule.with_(aliases=aliases,
                                                                 strided=strided))

    # -- execution -------------------------------------------------------------------
    def __call__(self, *arrays: Any, params: dict[str, int] | None = None,
                 threads: int | None = None, **named: Any) -> Any:
        if named:
            arrays, params = order_arguments(self.program, arrays, named, params)
        return self.calls(arrays, params, threads)

    def _evaluate_extents(self, values: tuple[int, ...]) -> tuple[list[int], list[int]]:
        """Bytes of each local buffer and program count of each phase for
        these symbol values (kept for later calls with the same values)."""
        env = {E.Sym(s): v for s, v in zip(self.facts.syms, values, strict=True)}
        sizes = [max(1, int(E.evaluate(b.size, env))) * b.dtype.itemsize
                 for b in self.facts.locals]
        counts = []
        for ph in self.facts.phases:
            n = 1
            for x in ph.extents:
                n *= int(E.evaluate(x, env))
            counts.append(n)
        if len(self._extents) < 64:
            self._extents[values] = (sizes, counts)
        return sizes, counts

    def _error(self, code: int) -> TilenestError:
        return status_error(self.program, self.facts, code)


