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
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..errors import CaptureError, Site, TilenestError, TilenestWarning, user_site
from ..tracebacks import api_boundary
from ..semantics import expr as E
from ..semantics.dtypes import DType
from ..semantics.ir import TileProgram
from ..semantics.space import Dim, DimOrigin
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
            raise _annotation_error(f"Tensor[{_show(item)}] needs a dtype and a rank")
        dt, r = item
        if not isinstance(dt, DType):
            raise _annotation_error(f"Tensor[{_show(item)}]: {dt!r} is not a dtype")
        if isinstance(r, str):
            names = tuple(r.replace(",", " ").split())
            return TensorSpec(dt, len(names), names)
        if isinstance(r, (tuple, list)):
            return TensorSpec(dt, len(r), tuple(r))
        import numbers

        if isinstance(r, bool) or not isinstance(r, numbers.Integral) or r < 0:
            raise _annotation_error(f"Tensor[{_show(item)}]: the rank {r!r} is not a "
                                    "non-negative integer")
        return TensorSpec(dt, int(r))


class Scalar:
    """Annotation ``Scalar[dtype]``: a runtime scalar argument."""

    def __class_getitem__(cls, dt: DType) -> ScalarSpec:
        if not isinstance(dt, DType):
            raise _annotation_error(f"Scalar[{_show(dt)}]: {dt!r} is not a dtype",
                                    "use Scalar[dtype], e.g. tn.Scalar[tn.f32]")
        return ScalarSpec(dt)


def _show(item: Any) -> str:
    return ", ".join(map(repr, item)) if isinstance(item, tuple) else repr(item)


_TENSOR_HINT = "use Tensor[dtype, rank] or Tensor[dtype, 'M N'], e.g. tn.Tensor[tn.f32, 2]"


def _annotation_error(msg: str, hint: str = _TENSOR_HINT) -> CaptureError:
    """A malformed annotation, located at the line that wrote it (the caller of
    ``__class_getitem__``; none for an annotation evaluated from a string)."""
    f = sys._getframe(2)
    site = Site(f.f_code.co_filename, f.f_lineno) if not f.f_code.co_filename.startswith("<") \
        else None
    return CaptureError(msg, site, hint)


class Sym:
    """Annotation for a symbolic integer parameter (same as ``int``)."""


def _recursion_notes(e: BaseException) -> tuple[str, ...]:
    """Where a recursion ran through the user's own code: the deepest traceback
    frame outside tilenest and the Python installation, if any."""
    import traceback
    from pathlib import Path

    own = Path(__file__).resolve().parent.parent
    skip = [own, *(Path(x).resolve() for x in {sys.prefix, sys.base_prefix} if x)]
    user = [f for f in traceback.extract_tb(e.__traceback__)
            if not f.filename.startswith("<")
            and not any(r in Path(f.filename).resolve().parents for r in skip)]
    if not user:
        return ()
    last = user[-1]
    return (f"the recursion runs through {last.filename}:{last.lineno} ({last.name})",)


def _def_site(fn: Callable) -> Site | None:
    code = getattr(fn, "__code__", None)
    return Site(code.co_filename, code.co_firstlineno) if code is not None else None


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
            except TilenestError as e:
                raise e.with_site(_def_site(fn)) from None
            except Exception as e:
                raise CaptureError(f"cannot evaluate the annotation of '{k}': {a!r} ({e})",
                                   _def_site(fn),
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
        warned: set[str] = set()
        line = fdef.lineno
        c.builder.site = Site(src.file, line, 1)
        for p in sig.parameters.values():
            a = ann.get(p.name)
            if p.name in consts:
                env[p.name] = consts[p.name]
            elif isinstance(a, TensorSpec):
                names = a.names or tuple(f"{p.name}_{i}" for i in range(a.rank))
                _warn_shadowed(fn, sig, consts, p.name, a.names or (), Site(src.file, line, 1),
                               warned)
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
                dims = tuple(Dim.fresh(f"{p.name}.{i}", DimOrigin(
                    f"axis {i} of tensor argument '{p.name}'", Site(src.file, line, 1)))
                    for i in range(a.rank))
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
        try:
            r = st.run_body(fdef.body)
        except RecursionError as e:
            # the statement being staged recurses without end (a helper that calls
            # itself), or nests deeper than Python's stack allows
            raise CaptureError("capturing this statement exceeded Python's recursion limit "
                               "(RecursionError)", c.builder.site,
                               "look for a helper function that calls itself without end, "
                               "or split a deeply nested expression into named steps",
                               _recursion_notes(e)) from None
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


def _warn_shadowed(fn: Callable, sig: inspect.Signature, consts: dict[str, Any], arg: str,
                   names: tuple, site: Site, warned: set[str]) -> None:
    """Warn when an extent name of ``arg``'s shape annotation is also the name of
    a compile-time constant: the body's ``N`` then denotes the constant, while
    the annotation's ``N`` is the tensor's symbolic extent -- two unrelated
    values under one name."""
    import warnings

    for n in names:
        n = str(n)
        q = sig.parameters.get(n)
        if q is None or n == arg or n in warned:
            continue
        if n in consts:
            value = consts[n]
        elif q.default is not inspect.Parameter.empty:
            value = q.default
        else:
            continue
        warned.add(n)
        warnings.warn_explicit(
            f"the shape annotation of '{arg}' names the extent '{n}', which is also "
            f"the compile-time constant '{n}' (= {value!r}) of kernel {fn.__name__}; in the "
            f"body '{n}' is the constant, not the extent (use {arg}.shape for the extent, or "
            "rename one of them)", TilenestWarning, site.file or "<unknown>", site.line)


def ast_FunctionDef() -> type:
    import ast

    return ast.FunctionDef


def kernel_site(fn: Callable) -> Site:
    """``file:line`` of a kernel's ``def`` statement, as capture diagnostics
    name it (from the source parsed once per function, ``parse_function``)."""
    try:
        src = parse_function(fn)
        return Site(src.file, src.tree.body[0].lineno, 1)
    except (TilenestError, SyntaxError, IndexError):
        code = getattr(fn, "__code__", None)
        return Site(code.co_filename if code else "<unknown>",
                    code.co_firstlineno if code else 0)


def call_site(fn: Callable) -> Site:
    """Where a call of the kernel ``fn`` is written: the user's line
    (:func:`~tilenest.errors.user_site`), else the kernel's ``def`` line (a
    call made by the ``tilenest`` command or a thread pool)."""
    return user_site() or kernel_site(fn)


def _kinds(fn: Callable, scope: dict[str, Any], strict: bool = True
           ) -> dict[str, tuple[str, Any]]:
    """Each parameter of ``fn`` classified as ``("tensor"|"scalar"|"sym"|"const",
    default)`` by the signature conventions of this module; a parameter fitting
    none is ``("bad", None)`` (capture reports it). Unless ``strict``, string
    annotations that cannot be evaluated yet (a name defined later in the
    module) leave their parameters unclassified by annotation instead of
    raising: capture reports them when the program is first needed."""
    try:
        ann = _annotations(fn, scope)
    except TilenestError:
        if strict:
            raise
        ann = {}
    out: dict[str, tuple[str, Any]] = {}
    for p in inspect.signature(fn).parameters.values():
        a = ann.get(p.name)
        if isinstance(a, TensorSpec):
            out[p.name] = ("tensor", None)
        elif isinstance(a, ScalarSpec):
            out[p.name] = ("scalar", None)
        elif a in (int, Sym) and p.default is inspect.Parameter.empty:
            out[p.name] = ("sym", None)
        elif p.default is not inspect.Parameter.empty:
            out[p.name] = ("const", p.default)
        else:
            out[p.name] = ("bad", None)
    return out


def _const_type_ok(default: Any, value: Any) -> bool:
    """Whether ``value`` can replace a constant whose default is ``default``:
    the same kind of Python number or string (an int where a float is expected
    is fine; a bool is not an int here), anything where the default is None or
    of another type (the kernel body is the judge of those)."""
    import numbers

    if default is None:
        return True
    if isinstance(default, bool):
        return isinstance(value, (bool, np.bool_))
    if isinstance(default, numbers.Integral):
        return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))
    if isinstance(default, numbers.Real):
        return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if isinstance(default, str):
        return isinstance(value, str)
    return True


def check_constants(fn: Callable, consts: dict[str, Any], scope: dict[str, Any],
                    how: str = "specialize") -> None:
    """Reject compile-time constants that name no constant parameter of ``fn``, or
    whose value does not fit the parameter (its default's type; an integer for a
    symbolic parameter). The error names the line that passed the constant
    (:func:`call_site`)."""
    kinds = _kinds(fn, scope, strict=False)
    consts_ok = sorted(n for n, (k, _) in kinds.items() if k in ("const", "sym"))
    listing = ", ".join(consts_ok) if consts_ok else "none"
    for name, value in consts.items():
        kind, default = kinds.get(name, (None, None))
        if kind is None:
            raise TilenestError(
                f"{how}: kernel {fn.__name__} has no parameter '{name}'", call_site(fn),
                f"its compile-time parameters are: {listing}")
        if kind in ("tensor", "scalar"):
            raise TilenestError(
                f"{how}: '{name}' is a {kind} argument of kernel {fn.__name__}, not a "
                "compile-time constant", call_site(fn),
                f"pass it when calling the kernel; compile-time parameters: {listing}")
        if kind == "sym":
            import numbers

            if not isinstance(value, numbers.Integral) or isinstance(value, (bool, np.bool_)):
                raise TilenestError(
                    f"{how}: symbolic parameter '{name}' of kernel {fn.__name__} needs an "
                    f"integer, got {type(value).__name__} {value!r}", call_site(fn))
        elif kind == "const" and not _const_type_ok(default, value):
            raise TilenestError(
                f"{how}: constant '{name}' of kernel {fn.__name__} defaults to "
                f"{type(default).__name__} {default!r}; got {type(value).__name__} {value!r}",
                call_site(fn), f"pass a value of type {type(default).__name__}")


#: keyword options of the interpreter, passed through by a kernel call
_RUN_OPTIONS = ("params", "schedule", "fast", "check_races", "poison", "outputs",
                "check_pipelines", "batch")


class Kernel:
    """A captured kernel: ``.program`` is its TileProgram; calling it with numpy
    arrays runs the reference interpreter."""

    def __init__(self, fn: Callable, consts: dict[str, Any] | None = None,
                 scope: dict[str, Any] | None = None):
        self.fn = fn
        self.consts = dict(consts or {})
        self.scope = scope or {}
        functools.update_wrapper(self, fn)
        self._variants: dict[tuple, Kernel] = {}
        self._program: TileProgram | None = None
        #: the exception capture raised, with its traceback, raised again on each use
        self._failure: tuple[BaseException, Any] | None = None
        self._capture_lock = threading.Lock()
        #: the parameters classified (``_kinds``), once per kernel: a call needs them
        self._kinds: dict[str, tuple[str, Any]] | None = None
        if self.consts:
            check_constants(fn, self.consts, self.scope)

    @property
    @api_boundary
    def program(self) -> TileProgram:
        """The captured TileProgram, captured on first use (once, whichever
        thread asks first). A capture that failed fails again with its own
        error on every later use; an AttributeError escaping capture (a bug)
        is re-raised as a RuntimeError, since an AttributeError out of this
        property would read as "no attribute 'program'" to ``getattr``."""
        prog = self._program
        if prog is not None:
            return prog
        with self._capture_lock:
            if self._program is None:
                if self._failure is None:
                    try:
                        self._program = capture(self.fn, self.consts, self.scope)
                    except TilenestError as e:
                        if self.consts:
                            given = ", ".join(f"{k}={v!r}" for k, v in self.consts.items())
                            e.notes = e.notes + (f"this variant of {self.fn.__name__} has "
                                                 f"the compile-time constants {given}",)
                            e.args = (e.render(),)
                        self._failure = (e, e.__traceback__)
                    except AttributeError as e:
                        err = RuntimeError(f"capturing kernel {self.fn.__name__} failed: "
                                           f"AttributeError: {e}")
                        err.__cause__ = e
                        self._failure = (err, e.__traceback__)
                    except Exception as e:  # noqa: BLE001 - kept and raised again below
                        self._failure = (e, e.__traceback__)
                if self._failure is not None:
                    exc, tb = self._failure
                    raise exc.with_traceback(tb)
            return self._program

    @api_boundary
    def specialize(self, **consts: Any) -> "Kernel":
        """A variant with compile-time constants overridden (each must name a
        constant or symbolic parameter of the kernel and fit its type)."""
        check_constants(self.fn, consts, self.scope)
        return Kernel(self.fn, {**self.consts, **consts}, self.scope)

    @api_boundary
    def ir(self) -> str:
        return str(self.program)

    def bind_arguments(self, args: tuple, kw: dict[str, Any]
                       ) -> tuple["Kernel", tuple, dict[str, Any]]:
        """Resolve a call ``kernel(*args, **kw)``: the variant to run (keyword
        compile-time constants select a specialization), the tensor and scalar
        arguments in signature order, and the interpreter options (a symbolic
        parameter given by keyword joins ``params``)."""
        kinds = self._kinds
        if kinds is None:
            kinds = self._kinds = _kinds(self.fn, self.scope)
        name = self.fn.__name__
        order = [n for n, (k, _) in kinds.items() if k in ("tensor", "scalar")
                 and n not in self.consts]
        opts = {k: v for k, v in kw.items() if k in _RUN_OPTIONS}
        rest = {k: v for k, v in kw.items() if k not in _RUN_OPTIONS}
        if len(args) > len(order):
            raise TilenestError(
                f"kernel {name} takes {len(order)} positional arguments "
                f"({', '.join(order)}), got {len(args)}", call_site(self.fn),
                "compile-time constants are passed by keyword")
        bound: dict[str, Any] = dict(zip(order, args, strict=False))
        consts: dict[str, Any] = {}
        given = opts.get("params")
        if given is not None and not isinstance(given, dict):
            raise TilenestError(f"params of kernel {name} must be a dict of name -> integer, got "
                                f"{type(given).__name__}", call_site(self.fn))
        params = dict(given or {})
        for k, v in rest.items():
            kind = kinds.get(k, (None, None))[0]
            if k in bound:
                raise TilenestError(f"kernel {name} got argument '{k}' both by position "
                                    "and by keyword", call_site(self.fn))
            if kind in ("tensor", "scalar") and k in order:
                bound[k] = v
            elif kind == "const" or kind == "sym" and k in self.consts:
                consts[k] = v
            elif kind == "sym":
                if k in params:
                    raise TilenestError(f"kernel {name} got parameter '{k}' both by keyword "
                                        "and in params=", call_site(self.fn))
                params[k] = v
            else:
                valid = order + sorted(n for n, (kd, _) in kinds.items()
                                       if kd in ("const", "sym")) + list(_RUN_OPTIONS)
                raise TilenestError(f"kernel {name} has no argument '{k}'", call_site(self.fn),
                                    f"its arguments are: {', '.join(valid)}")
        missing = [n for n in order if n not in bound]
        if missing:
            raise TilenestError(
                f"kernel {name} is missing argument(s) {', '.join(repr(m) for m in missing)}",
                call_site(self.fn), f"it takes {', '.join(order)}")
        if params or "params" in opts:
            opts["params"] = params
        variant = self
        if consts:
            key = tuple(sorted((k, type(v).__name__, repr(v)) for k, v in consts.items()))
            variant = self._variants.get(key)
            if variant is None:
                variant = self._variants[key] = self.specialize(**consts)
        return variant, tuple(bound[n] for n in order), opts

    @api_boundary
    def __call__(self, *arrays: Any, **kw: Any) -> Any:
        """Run on the reference interpreter: tensors and scalars by position or
        by name, compile-time constants by name (a specialized variant), and the
        interpreter's options (``params=``, ``schedule=``, ...)."""
        from ..interpreter import interpret

        variant, args, opts = self.bind_arguments(arrays, kw)
        return interpret(variant, *args, **opts)

    @api_boundary
    def compile(self, target: str = "llvm", **kw: Any) -> Any:
        """A compiled callable for ``target`` (``schedule=`` a Schedule, or
        schedule fields such as ``threads=``; for ``cuda`` and ``metal`` also
        ``device="gpu"|"emulated"``); called like the kernel, on numpy arrays."""
        from ..backends import target as lookup

        return lookup(target).compile(self.program, **kw)

    def __repr__(self) -> str:
        return f"<tn.kernel {self.fn.__name__}>"


def kernel(fn: Callable | None = None, **consts: Any) -> Any:
    """Decorator: ``@tn.kernel`` or ``@tn.kernel(bm=64)``."""
    caller = sys._getframe(1)
    scope = dict(caller.f_locals) if caller.f_code.co_name != "<module>" else {}
    if fn is None:
        return lambda f: Kernel(f, consts, scope)
    return Kernel(fn, consts, scope)
