"""Calling a compiled kernel on numpy arrays.

:class:`CompiledKernel` binds a call like the interpreter does (one array per
tensor parameter, one number per runtime scalar; extents bind the kernel's
symbols, ``params=`` gives the others) and checks what the generated code
relies on, with a ``TilenestError`` naming the argument otherwise:

* dtype exactly the parameter's, rank and extents consistent with the
  signature and the kernel's assumptions;
* C-contiguous, aligned arrays (the code indexes them densely, zero-copy), and
  writeable ones for the tensors the kernel stores to;
* no overlap between an array the kernel writes and any other argument (the
  generated code treats distinct buffers as ``noalias``).

Each phase runs its program ids ``[0, n)``: a parallel phase is split into
contiguous ranges, one per worker thread, each calling the JIT'd entry through
ctypes (which releases the GIL) with its own local buffers and status word.
After a phase, a nonzero status raises the error it encodes.
"""

from __future__ import annotations

import ctypes
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ...errors import BoundsError, RuntimeSemanticError, TilenestError
from ...lowering import loopir as L
from ...semantics import expr as E
from ...semantics.ir import TileProgram
from ...semantics.signature import bind_call
from ...semantics.types import TensorType
from .codegen import DIV_ZERO, NEG_SHIFT

ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)

_POOL: ThreadPoolExecutor | None = None
_EMPTY = np.zeros(64, dtype=np.uint8)  # what an empty tensor's pointer refers to


def pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1),
                                   thread_name_prefix="tilenest-cpu")
    return _POOL


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data if a.size else _EMPTY.ctypes.data


class CompiledKernel:
    """A JIT-compiled kernel: call it like the interpreter (arrays written in
    place; returns the tensors it stores to). ``loopir``, ``llvm_ir`` and
    ``asm()`` show the generated code."""

    def __init__(self, program: TileProgram, kernel: L.Kernel, engine: Any, schedule: Any,
                 llvm_ir: str, optimized_ir: str, compile_seconds: float):
        self.program = program
        self.kernel = kernel
        self.engine = engine
        self.schedule = schedule
        self.llvm_ir = llvm_ir
        self.optimized_ir = optimized_ir
        self.compile_seconds = compile_seconds
        self.entries = [ENTRY(engine.address(ph.name)) for ph in kernel.phases]
        self.stored = {op.operands[0].name for op in program.walk() if op.name == "tensor.store"}

    @property
    def loopir(self) -> str:
        return L.print_kernel(self.kernel)

    def asm(self) -> str:
        from .jit import asm

        return asm(self.engine.mod, self.engine.tm)

    def __repr__(self) -> str:
        return f"<compiled {self.program.name} for llvm>"

    # -- binding ------------------------------------------------------------------
    def bind(self, arrays: tuple, params: dict[str, int] | None) -> tuple[list, dict[str, int]]:
        p = self.program
        env = bind_call(p, arrays, params)
        syms = {k.name: v for k, v in env.items()}
        keep: list[Any] = []
        for v, a in zip(p.args, arrays, strict=True):
            t = v.type
            if isinstance(t, TensorType):
                if not (a.flags.c_contiguous and a.flags.aligned):
                    raise TilenestError(
                        f"argument '{v.name}' is not a C-contiguous aligned array; compiled "
                        "kernels read arrays in place", p.loc,
                        "pass np.ascontiguousarray(x) (and copy results back if needed)")
                if v.name in self.stored and not a.flags.writeable:
                    raise TilenestError(f"argument '{v.name}' is written by the kernel but the "
                                        "array is read-only", p.loc)
                keep.append(a)
            else:
                from ...semantics.numerics import constant

                try:
                    arr = np.array(constant(_scalar(a, v.name), t.dtype), dtype=t.dtype.np)
                except (ValueError, TypeError) as e:
                    raise TilenestError(f"argument '{v.name}': {e}", p.loc) from None
                keep.append(arr)
        self._check_overlap(keep)
        return keep, syms

    def _check_overlap(self, keep: list) -> None:
        args = self.program.args
        for i, a in enumerate(keep):
            for j in range(i):
                b = keep[j]
                if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or not (
                        a.size and b.size):
                    continue
                if args[i].name not in self.stored and args[j].name not in self.stored:
                    continue
                if np.shares_memory(a, b):
                    raise TilenestError(
                        f"arguments '{args[j].name}' and '{args[i].name}' overlap in memory and "
                        "one of them is written; compiled kernels need separate arrays",
                        self.program.loc, "pass a copy of one of them, or run on the interpreter")

    # -- execution -------------------------------------------------------------------
    def __call__(self, *arrays: Any, params: dict[str, int] | None = None,
                 threads: int | None = None) -> Any:
        keep, syms = self.bind(arrays, params)
        k = self.kernel
        env = {E.Sym(s): v for s, v in syms.items()}
        argv = (ctypes.c_void_p * max(1, len(keep)))(*[_ptr(a) for a in keep])
        symv = (ctypes.c_int64 * max(1, len(k.syms)))(*[syms[s] for s in k.syms])
        sizes = [max(1, int(E.evaluate(b.size, env))) * b.dtype.itemsize for b in k.locals]
        nthreads = threads or self.schedule.threads or os.cpu_count() or 1
        for ph, fn in zip(k.phases, self.entries, strict=True):
            n = 1
            for x in ph.extents:
                n *= int(E.evaluate(x, env))
            if n <= 0:
                continue
            workers = min(nthreads, n) if ph.parallel else 1
            if self.schedule.chunk:
                step = self.schedule.chunk
            else:
                step = -(-n // workers)
            ranges = [(lo, min(n, lo + step)) for lo in range(0, n, step)]
            frames = [_Frame(sizes) for _ in range(min(workers, len(ranges)))]
            if len(frames) == 1:
                for lo, hi in ranges:
                    frames[0].run(fn, argv, symv, lo, hi)
            else:
                groups = [ranges[i::len(frames)] for i in range(len(frames))]
                futs = [pool().submit(_run_all, f, fn, argv, symv, g)
                        for f, g in zip(frames, groups, strict=True)]
                for f in futs:
                    f.result()
            for f in frames:
                if f.status.value:
                    raise self._error(int(f.status.value))
        del keep
        outs = [a for v, a in zip(self.program.args, arrays, strict=True)
                if v.name in self.stored]
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _error(self, code: int) -> TilenestError:
        if code == DIV_ZERO:
            return RuntimeSemanticError("integer division by zero in the compiled kernel",
                                        self.program.loc,
                                        "guard the divisor, e.g. ite(d == 0, 1, d)")
        if code == NEG_SHIFT:
            return RuntimeSemanticError("negative shift count in the compiled kernel",
                                        self.program.loc)
        for e in self.kernel.errors:
            if e.code == code:
                cls = BoundsError if e.kind == "out of bounds" else RuntimeSemanticError
                return cls(e.message, e.site)
        return RuntimeSemanticError(f"compiled kernel reported error code {code}")


class _Frame:
    """One worker's private state: local buffers and status word."""

    def __init__(self, sizes: list[int]):
        offs, total = [], 0
        for s in sizes:
            offs.append(total)
            total += (s + 63) // 64 * 64
        self.arena = np.empty(max(64, total) + 64, dtype=np.uint8)
        base = self.arena.ctypes.data
        base += (-base) % 64
        self.locv = (ctypes.c_void_p * max(1, len(sizes)))(*[base + o for o in offs])
        self.status = ctypes.c_int32(0)

    def run(self, fn: Any, argv: Any, symv: Any, lo: int, hi: int) -> None:
        fn(ctypes.cast(argv, ctypes.c_void_p), ctypes.cast(symv, ctypes.c_void_p),
           ctypes.cast(self.locv, ctypes.c_void_p), lo, hi,
           ctypes.cast(ctypes.byref(self.status), ctypes.c_void_p))


def _run_all(frame: _Frame, fn: Any, argv: Any, symv: Any, ranges: list) -> None:
    for lo, hi in ranges:
        frame.run(fn, argv, symv, lo, hi)


def _scalar(a: Any, name: str) -> Any:
    if isinstance(a, np.ndarray):
        if a.shape != ():
            raise TilenestError(f"argument '{name}' is a scalar parameter; got an array of shape "
                                f"{a.shape}")
        return a.item()
    if isinstance(a, np.generic):
        return a.item()
    if not isinstance(a, (int, float, bool)):
        raise TilenestError(f"argument '{name}' must be a number, got {type(a).__name__}")
    return a
