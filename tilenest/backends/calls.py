"""Binding a call of a compiled kernel to its arguments (every target).

:class:`ArgumentBinder` checks a call like the interpreter does (one array per
tensor parameter, one number per runtime scalar; extents bind the kernel's
symbols, ``params=`` gives the others), and what generated code relies on:
C-contiguous, aligned arrays read in place (read-only arguments also as
strided views with packed rows: ``Schedule.strided``), and aliasing only as
the *same* array (M-8). Arrays of any framework arrive through ``tilenest/semantics/arrays.py``
(host views by default; a target on a device overrides
:meth:`ArgumentBinder.arguments`). A target's kernel class inherits it and
provides ``program`` and ``stored``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..semantics import arrays as A
from ..errors import BoundsError, RuntimeSemanticError, TilenestError, user_site
from ..lowering.loopir import DIV_ZERO, NEG_SHIFT
from ..lowering.schedule import stride_symbol
from ..semantics import expr as E
from ..semantics.signature import bind_call
from ..semantics.types import TensorType
from ..tracebacks import api_boundary


class ArgumentBinder:
    """Argument checks shared by the compiled targets (see the module docstring).
    A target's kernel class that defines ``__call__`` gets it as a public entry
    point (``tracebacks.api_boundary``: short tracebacks for user errors)."""

    program: Any
    stored: set[str]

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        call = cls.__dict__.get("__call__")
        if call is not None and not hasattr(call, "__wrapped__"):
            cls.__call__ = api_boundary(call)  # type: ignore[method-assign]

    # -- binding ------------------------------------------------------------------
    def arguments(self, arrays: tuple) -> tuple:
        """The call's arguments as the kernel reads them: here every tensor as a
        numpy view of the caller's host memory (``tilenest/semantics/arrays.py``)."""
        return A.host_arguments(self.program, arrays, self.stored)

    def bind(self, arrays: tuple, params: dict[str, int] | None) -> tuple[list, dict[str, int]]:
        p = self.program
        given = arrays
        arrays = self.arguments(arrays)
        # a device array's elements stay on the device: the checks see its shape
        env = bind_call(p, tuple(A.stand_in(a) if hasattr(a, "__cuda_array_interface__")
                                 else a for a in arrays), params)
        syms = {k.name: v for k, v in env.items()}
        keep: list[Any] = []
        for v, a, g in zip(p.args, arrays, given, strict=True):
            t = v.type
            if isinstance(t, TensorType):
                st = A.row_strides(a) if not A.is_packed(a) else None
                if not A.is_packed(a) and (st is None or v.name in self.stored):
                    why = ("a written argument must be C-contiguous" if st is not None else
                           "compiled kernels read arrays in place, through views whose "
                           "innermost dimension is packed")
                    raise TilenestError(
                        f"argument '{v.name}' is not a C-contiguous aligned array; {why}",
                        user_site() or p.loc, A.packed_hint(g, a))
                if st is not None:  # only a strided view runs a variant that reads strides
                    for d, x in enumerate(st[:-1]):
                        syms[stride_symbol(v.name, d)] = x
                keep.append(a)
            else:
                from ..semantics.numerics import constant

                try:
                    arr = np.array(constant(scalar_arg(a, v.name), t.dtype), dtype=t.dtype.np)
                except (ValueError, TypeError) as e:
                    raise TilenestError(f"argument '{v.name}': {e}", user_site() or p.loc) \
                        from None
                keep.append(arr)
        return keep, syms

    def strided(self, keep: list) -> tuple[str, ...]:
        """The tensor parameters of a call given strided (not C-contiguous)
        views: the ``Schedule.strided`` of the variant that runs it."""
        return tuple(v.name for v, a in zip(self.program.args, keep, strict=True)
                     if isinstance(v.type, TensorType) and not A.is_packed(a))

    def aliases(self, keep: list) -> tuple[tuple[str, ...], ...]:
        """The alias groups of a call: parameters given the same array where one
        of them is written (M-8). Arrays sharing storage in any other way
        (different offset, shape, strides or dtype) are refused."""
        args = self.program.args
        parent = list(range(len(keep)))

        def root(i: int) -> int:
            while parent[i] != i:
                i = parent[i]
            return i

        for i, a in enumerate(keep):
            for j in range(i):
                b = keep[j]
                if not (a.size and b.size):
                    continue
                if args[i].name not in self.stored and args[j].name not in self.stored:
                    continue
                if not A.shares_memory(a, b):
                    continue
                if not same_array(a, b):
                    raise TilenestError(
                        f"arguments '{args[j].name}' and '{args[i].name}' overlap in memory "
                        "without being the same array, and one of them is written; compiled "
                        "targets support aliased parameters only as one array",
                        user_site() or self.program.loc,
                        "pass the same array for both, separate copies, or run on the "
                        "interpreter (which accepts any overlap)")
                parent[root(i)] = root(j)
        groups: dict[int, list[str]] = {}
        for i in range(len(keep)):
            groups.setdefault(root(i), []).append(args[i].name)
        return tuple(tuple(g) for g in groups.values() if len(g) > 1)



def scratch_arrays(facts: Any, given: int, syms: dict[str, int],
                   zeros: Any = np.zeros) -> list[Any]:
    """The kernel's scratch buffers for one call, in argument order: one array
    of ``zeros(elements, dtype)`` per global buffer past the ``given``
    arguments (``Param.kind == "scratch"``: values that cross a phase
    boundary, ``lowering/phases.py``), sized for these symbol values. Bool
    elements are kept as bytes, as every target stores them, and the
    ``ml_dtypes`` formats as unsigned integers of their width (zero bits are
    +0 in each; a device array library may not know the format)."""
    env = {E.Sym(s): int(v) for s, v in syms.items()}
    out = []
    for b in sorted((b for b in facts.globals if b.arg >= given), key=lambda b: b.arg):
        n = max(1, int(E.evaluate(b.size, env)))
        out.append(zeros(n, dtype=np.uint8 if b.dtype.is_bool else A.bits_dtype(b.dtype.np)))
    return out


def same_array(a: Any, b: Any) -> bool:
    """Whether two arrays (numpy, or both on the device) view exactly the same
    elements in the same way."""
    return (A.address(a) == A.address(b) and a.dtype == b.dtype and a.shape == b.shape
            and a.strides == b.strides)


def scalar_arg(a: Any, name: str) -> Any:
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


def status_error(program: Any, kernel: Any, code: int) -> TilenestError:
    """The error a nonzero status word ``code`` of a compiled kernel stands
    for: an arithmetic error of generated code, or one of the loop IR's
    ``ErrorSite`` s (a checked access out of bounds...)."""
    if code == DIV_ZERO:
        return RuntimeSemanticError("integer division by zero in the compiled kernel",
                                    program.loc, "guard the divisor, e.g. ite(d == 0, 1, d)")
    if code == NEG_SHIFT:
        return RuntimeSemanticError("negative shift count in the compiled kernel", program.loc)
    for e in kernel.errors:
        if e.code == code:
            cls = BoundsError if e.kind == "out of bounds" else RuntimeSemanticError
            return cls(e.message, e.site)
    return RuntimeSemanticError(f"compiled kernel reported error code {code}")
