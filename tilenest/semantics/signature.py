"""Binding a call's arguments to a program's signature.

A call supplies one value per program argument: a numpy array for each tensor
(exact dtype, rank; its shape binds the extent symbols, and arguments sharing
an extent name must agree; the entry points first turn other frameworks'
arrays into numpy views, ``semantics/arrays.py``), a number for each runtime
scalar, and ``params`` for symbolic parameters no shape determines (integers:
a float is an error, never truncated). Extents that are expressions are
checked after all symbols are bound, then the program's assumptions. Every
mistake of a call is reported at the user's line that made it.
"""

from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np

from ..errors import RuntimeSemanticError, Site, TilenestError, TypeCheckError, user_site
from . import expr as E
from .ir import TileProgram
from .types import TensorType


def _at(p: TileProgram) -> Site | None:
    """Where a call's mistake is reported: the user's line that made the call,
    else (the ``tilenest`` command, a thread pool) the kernel's own location."""
    return user_site() or p.loc


def order_arguments(p: TileProgram, args: Sequence[Any], named: dict[str, Any],
                    params: dict[str, Any] | None = None) -> tuple[tuple, dict[str, Any] | None]:
    """A call's arguments in ``p``'s argument order, from positional ``args``
    followed by ``named`` ones (tensors and runtime scalars by parameter name; a
    symbolic parameter by name joins ``params``). Unknown, duplicate and
    missing names are errors; returns ``(arguments, params)``."""
    if not named:
        return tuple(args), params
    order = [a.name for a in p.args]
    if len(args) > len(order):
        raise TilenestError(f"kernel {p.name} takes {len(order)} arguments "
                            f"({', '.join(order)}), got {len(args)}", _at(p))
    bound = dict(zip(order, args, strict=False))
    out_params = dict(params or {})
    for k, v in named.items():
        if k in bound:
            raise TilenestError(f"kernel {p.name} got argument '{k}' both by position and by "
                                "keyword", _at(p))
        if k in order:
            bound[k] = v
        elif k in p.syms:
            if k in out_params:
                raise TilenestError(f"kernel {p.name} got parameter '{k}' both by keyword and "
                                    "in params=", _at(p))
            out_params[k] = v
        else:
            raise TilenestError(f"kernel {p.name} has no argument '{k}'", _at(p),
                                f"its arguments are: {', '.join(order + list(p.syms))}; "
                                "compile-time constants are fixed when the kernel is compiled "
                                "(specialize it first)")
    missing = [n for n in order if n not in bound]
    if missing:
        raise TilenestError(f"kernel {p.name} is missing argument(s) "
                            f"{', '.join(repr(m) for m in missing)}", _at(p),
                            f"it takes {', '.join(order)}")
    return tuple(bound[n] for n in order), (out_params if out_params or params is not None
                                            else None)


def stored_tensors(p: TileProgram) -> set[str]:
    """The tensor arguments ``p`` writes (the operands of its ``tensor.store`` ops)."""
    return {op.operands[0].name for op in p.walk() if op.name == "tensor.store"}


def bind_call(p: TileProgram, args: Sequence[Any], params: dict[str, int] | None
              ) -> dict[E.Expr, int]:
    """The value of every symbol of ``p`` for this call (raises on a mismatch:
    arity, dtypes, ranks, extents, non-integer parameters, and a read-only
    array passed for a tensor the program writes)."""
    if len(args) != len(p.args):
        names = ", ".join(a.name for a in p.args)
        raise TilenestError(f"kernel {p.name} takes {len(p.args)} arguments ({names}), "
                            f"got {len(args)}", _at(p))
    params = params or {}
    if not isinstance(params, dict):
        raise TilenestError(f"params of kernel {p.name} must be a dict of name -> integer, got "
                            f"{type(params).__name__}", _at(p))
    unknown = set(params) - set(p.syms)
    if unknown:
        raise TilenestError(f"unknown parameter(s) {sorted(unknown)} for kernel {p.name}", _at(p),
                            f"its parameters are: {', '.join(p.syms) or 'none'}")
    syms: dict[E.Expr, int] = {}
    for k, val in params.items():
        if not isinstance(val, numbers.Integral) or isinstance(val, (bool, np.bool_)):
            raise TilenestError(f"parameter '{k}' of kernel {p.name} must be an integer, got "
                                f"{type(val).__name__} {val!r}", _at(p),
                                "symbolic extents and parameters are integers")
        syms[E.Sym(k)] = int(val)
    deferred: list[tuple[str, int, E.Expr, int]] = []
    stored: set[str] | None = None
    for v, a in zip(p.args, args, strict=True):
        t = v.type
        if not isinstance(t, TensorType):
            continue
        if not isinstance(a, np.ndarray):
            raise TilenestError(f"argument '{v.name}' must be a numpy array, got "
                                f"{type(a).__name__}", _at(p),
                                "entry points view other arrays as numpy first (tilenest.semantics.arrays)")
        if a.dtype != t.dtype.np:
            raise TypeCheckError(f"argument '{v.name}' has dtype {a.dtype}, the kernel needs "
                                 f"{t.dtype}", _at(p),
                                 f"convert with {v.name}.astype(np.{np.dtype(t.dtype.np).name})")
        if a.ndim != t.rank:
            raise TypeCheckError(f"argument '{v.name}' has rank {a.ndim}, the kernel needs "
                                 f"{t.rank}", _at(p))
        if not a.flags.writeable:
            stored = stored_tensors(p) if stored is None else stored
            if v.name in stored:
                raise TilenestError(f"argument '{v.name}' is written by kernel {p.name} but the "
                                    "array is read-only", _at(p),
                                    "pass a writeable array (e.g. a.copy())")
        for i, (x, n) in enumerate(zip(t.shape, a.shape, strict=True)):
            if isinstance(x, E.Sym):
                old = syms.get(x)
                if old is not None and old != n:
                    raise TypeCheckError(
                        f"extent {x.name} is {old} elsewhere but '{v.name}' has {n} on axis {i}",
                        _at(p), "arguments sharing an extent name must agree")
                syms[x] = int(n)
            else:
                deferred.append((v.name, i, x, int(n)))
    for s in p.syms:
        if E.Sym(s) not in syms:
            raise TilenestError(f"no value for parameter '{s}' of kernel {p.name}", _at(p),
                                f"pass params={{'{s}': ...}}")
    for name, i, x, n in deferred:
        want = E.evaluate(x, syms)
        if want != n:
            raise TypeCheckError(f"argument '{name}' axis {i} has extent {n}, the kernel "
                                 f"needs {E.to_str(x)} = {want}", _at(p))
    for a in p.assumptions:
        if not E.evaluate(a, syms):
            raise RuntimeSemanticError(f"the call violates the kernel's assumption "
                                       f"{E.pred_to_str(a)}", _at(p))
    return syms
