"""``@tn.kernel``: a Python function captured into a TileProgram.

Signature conventions:

* ``x: tn.Tensor[f32, 2]`` -- a tensor argument; its extents are fresh symbols
  ``x_0, x_1`` unless named: ``tn.Tensor[f32, "M K"]`` (equal names = equal
  extents, checked when called);
* ``eps: tn.Scalar[f32]`` -- a runtime scalar argument;
* ``n: int`` (no default) -- a symbolic integer parameter;
* parameters with defaults (usually keyword-only, ``*, bm=32``) -- compile-time
  constants; ``kernel.specialize(bm=64)`` gives another variant.

Capture is symbolic: it needs no arrays and happens once per variant.
"""

from __future__ import annotations

import functools
import inspect
import sys
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import CaptureError, Site
from ..semantics import expr as E
from ..semantics.dtypes import DType
from ..semantics.ir import TileProgram
from ..semantics.space import Dim
from ..semantics.types import TensorType, TileType
from . import dsl
from .builder import BValue
from .context import CaptureContext, pop, push
from .stager import Stager, parse_function


@dataclass(frozen=True)
class TensorSpec:
    dtype: DType
    rank: int
    names: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ScalarSpec:
    dtype: DType


class Tensor:
    """Annotation ``Tensor[dtype, rank]`` or ``Tensor[dtype, "M K"]``."""

    def __class_getitem__(cls, item: Any) -> TensorSpec:
        if not isinstance(item, tuple) or len(item) != 2:
            raise TypeError("use Tensor[dtype, rank] or Tensor[dtype, 'M N']")
        dt, r = item
        if isinstance(r, str):
            names = tuple(r.replace(",", " ").split())
            return TensorSpec(dt, len(names), names)
        if isinstance(r, (tuple, list)):
            return TensorSpec(dt, len(r), tuple(r))
        return TensorSpec(dt, int(r))


class Scalar:
    """Annotation ``Scalar[dtype]``: a runtime scalar argument."""

    def __class_getitem__(cls, dt: DType) -> ScalarSpec:
        return ScalarSpec(dt)


class Sym:
    """Annotation for a symbolic integer parameter (same as ``int``)."""


def _annotations(fn: Callable, scope: dict[str, Any]) -> dict[str, Any]:
    """Parameter annotations, evaluating string annotations (``from __future__
    import annotations``) in the function's globals, its closure and the scope
    that defined it (so kernel factories can use their own locals)."""
    ns = dict(fn.__globals__)
    ns.update(scope)
    if fn.__closure__:
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__, strict=True):
            try:
                ns[name] = cell.cell_contents
            except ValueError:
                pass
    out: dict[str, Any] = {}
    for k, a in getattr(fn, "__annotations__", {}).items():
        if isinstance(a, str):
            try:
                a = eval(a, ns)  # noqa: S307 - annotations are the user's own code
            except Exception as e:
                raise CaptureError(f"cannot evaluate the annotation of '{k}': {a!r} ({e})",
                                   hint="annotations must name tn.Tensor/tn.Scalar types "
                                        "visible where the kernel is defined") from None
        out[k] = a
    return out


def capture(fn: Callable, consts: dict[str, Any], scope: dict[str, Any] | None = None
            ) -> TileProgram:
    """Capture ``fn`` with compile-time constants ``consts`` into a TileProgram."""
    src = parse_function(fn)
    fdef = src.tree.body[0]
    if not isinstance(fdef, ast_FunctionDef()):
        raise CaptureError("@tn.kernel needs a plain function definition")
    sig = inspect.signature(fn)
    ann = _annotations(fn, scope or {})
    c = CaptureContext(src.file)
    push(c)
    try:
        env: dict[str, Any] = {}
        args: list[BValue] = []
        line = fdef.lineno
        c.builder.site = Site(src.file, line, 1)
        for p in sig.parameters.values():
            a = ann.get(p.name)
            if p.name in consts:
                env[p.name] = consts[p.name]
            elif isinstance(a, TensorSpec):
                names = a.names or tuple(f"{p.name}_{i}" for i in range(a.rank))
                extents = []
                for n in names:
                    if str(n).isdigit():
                        extents.append(E.Const(int(n)))
                    elif str(n).isidentifier():
                        c.add_sym(str(n))
                        extents.append(E.Sym(str(n)))
                    else:
                        raise CaptureError(f"tensor extent name {n!r} of '{p.name}' is neither "
                                           "an identifier nor an integer", Site(src.file, line, 1))
                dims = tuple(Dim.fresh(f"{p.name}.{i}") for i in range(a.rank))
                v = BValue(TensorType(a.dtype, tuple(extents), dims), p.name)
                args.append(v)
                env[p.name] = dsl.TensorArg(v, p.name, dims)
            elif isinstance(a, ScalarSpec):
                v = BValue(TileType(a.dtype), p.name)
                args.append(v)
                env[p.name] = dsl.Tile(v)
            elif a in (int, Sym) and p.default is inspect.Parameter.empty:
                c.add_sym(p.name)
                env[p.name] = dsl.Index(E.Sym(p.name))
            elif p.default is not inspect.Parameter.empty:
                env[p.name] = p.default
            else:
                raise CaptureError(
                    f"kernel parameter '{p.name}' needs an annotation "
                    "(tn.Tensor[dtype, rank], tn.Scalar[dtype], int) or a default value",
                    Site(src.file, line, 1))
        globs = dict(fn.__globals__)
        if fn.__closure__:
            for name, cell in zip(fn.__code__.co_freevars, fn.__closure__, strict=True):
                try:
                    globs[name] = cell.cell_contents
                except ValueError:
                    pass
        st = Stager(src, globs, env)
        r = st.run_body(fdef.body)
        if r is not None and r[1] is not None:
            raise CaptureError("a kernel returns nothing; write outputs with .store()",
                               Site(src.file, line, 1))
        prog = c.builder.finish(fn.__name__, args, c.syms, c.assumptions, c.reducers,
                                Site(src.file, line, 1))
    finally:
        pop()
    from ..semantics.verify import verify

    verify(prog)
    return prog


def ast_FunctionDef() -> type:
    import ast

    return ast.FunctionDef


class Kernel:
    """A captured kernel: ``.program`` is its TileProgram; calling it with numpy
    arrays runs the reference interpreter."""

    def __init__(self, fn: Callable, consts: dict[str, Any] | None = None,
                 scope: dict[str, Any] | None = None):
        self.fn = fn
        self.consts = dict(consts or {})
        self.scope = scope or {}
        functools.update_wrapper(self, fn)

    @functools.cached_property
    def program(self) -> TileProgram:
        return capture(self.fn, self.consts, self.scope)

    def specialize(self, **consts: Any) -> "Kernel":
        """A variant with compile-time constants overridden."""
        return Kernel(self.fn, {**self.consts, **consts}, self.scope)

    def ir(self) -> str:
        return str(self.program)

    def __call__(self, *arrays: Any, **kw: Any) -> Any:
        from ..interpreter import interpret

        return interpret(self, *arrays, **kw)

    def compile(self, target: str = "llvm", **kw: Any) -> Any:
        """A compiled callable for ``target`` (``schedule=`` a Schedule, or schedule
        fields such as ``threads=``); called like the kernel, on numpy arrays."""
        if target != "llvm":
            from ..errors import NotAvailableError

            raise NotAvailableError(f"compilation for target '{target}' is not available yet",
                                    hint="targets: llvm; or run the kernel on the interpreter")
        from ..backends.llvm import compile_program

        return compile_program(self.program, **kw)

    def __repr__(self) -> str:
        return f"<tn.kernel {self.fn.__name__}>"


def kernel(fn: Callable | None = None, **consts: Any) -> Any:
    """Decorator: ``@tn.kernel`` or ``@tn.kernel(bm=64)``."""
    caller = sys._getframe(1)
    scope = dict(caller.f_locals) if caller.f_code.co_name != "<module>" else {}
    if fn is None:
        return lambda f: Kernel(f, consts, scope)
    return Kernel(fn, consts, scope)
