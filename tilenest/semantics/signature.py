"""Binding a call's arguments to a program's signature.

A call supplies one value per program argument: a numpy array for each tensor
(exact dtype, rank; its shape binds the extent symbols, and arguments sharing
an extent name must agree), a number for each runtime scalar, and ``params``
for symbolic parameters no shape determines (integers: a float is an error,
never truncated). Extents that are expressions are
checked after all symbols are bound, then the program's assumptions.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from ..errors import RuntimeSemanticError, TilenestError, TypeCheckError
from . import expr as E
from .ir import TileProgram
from .types import TensorType


def bind_call(p: TileProgram, args: Sequence[Any], params: dict[str, int] | None
              ) -> dict[E.Expr, int]:
    """The value of every symbol of ``p`` for this call (raises on a mismatch)."""
    if len(args) != len(p.args):
        names = ", ".join(a.name for a in p.args)
        raise TilenestError(f"kernel {p.name} takes {len(p.args)} arguments ({names}), "
                            f"got {len(args)}", p.loc)
    params = params or {}
    if not isinstance(params, dict):
        raise TilenestError(f"params of kernel {p.name} must be a dict of name -> integer, got "
                            f"{type(params).__name__}", p.loc)
    unknown = set(params) - set(p.syms)
    if unknown:
        raise TilenestError(f"unknown parameter(s) {sorted(unknown)} for kernel {p.name}", p.loc,
                            f"its parameters are: {', '.join(p.syms) or 'none'}")
    syms: dict[E.Expr, int] = {}
    for k, v in params.items():
        if not isinstance(v, numbers.Integral) or isinstance(v, (bool, np.bool_)):
            raise TilenestError(f"parameter '{k}' of kernel {p.name} must be an integer, got "
                                f"{type(v).__name__} {v!r}", p.loc,
                                "symbolic extents and parameters are integers")
        syms[E.Sym(k)] = int(v)
    deferred: list[tuple[str, int, E.Expr, int]] = []
    for v, a in zip(p.args, args, strict=True):
        t = v.type
        if not isinstance(t, TensorType):
            continue
        if not isinstance(a, np.ndarray):
            raise TilenestError(f"argument '{v.name}' must be a numpy array, got "
                                f"{type(a).__name__}", p.loc)
        if a.dtype != t.dtype.np:
            raise TypeCheckError(f"argument '{v.name}' has dtype {a.dtype}, the kernel needs "
                                 f"{t.dtype}", p.loc,
                                 f"convert with array.astype({t.dtype.np.name!r})")
        if a.ndim != t.rank:
            raise TypeCheckError(f"argument '{v.name}' has rank {a.ndim}, the kernel needs "
                                 f"{t.rank}", p.loc)
        for i, (x, n) in enumerate(zip(t.shape, a.shape, strict=True)):
            if isinstance(x, E.Sym):
                old = syms.get(x)
                if old is not None and old != n:
                    raise TypeCheckError(
                        f"extent {x.name} is {old} elsewhere but '{v.name}' has {n} on axis {i}",
                        p.loc, "arguments sharing an extent name must agree")
                syms[x] = int(n)
            else:
                deferred.append((v.name, i, x, int(n)))
    for s in p.syms:
        if E.Sym(s) not in syms:
            raise TilenestError(f"no value for parameter '{s}' of kernel {p.name}", p.loc,
                                f"pass params={{'{s}': ...}}")
    for name, i, x, n in deferred:
        want = E.evaluate(x, syms)
        if want != n:
            raise TypeCheckError(f"argument '{name}' axis {i} has extent {n}, the kernel "
                                 f"needs {E.to_str(x)} = {want}", p.loc)
    for a in p.assumptions:
        if not E.evaluate(a, syms):
            raise RuntimeSemanticError(f"the call violates the kernel's assumption "
                                       f"{E.pred_to_str(a)}", p.loc)
    return syms
