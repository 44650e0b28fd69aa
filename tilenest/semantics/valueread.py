"""Reading attribute values of TileIR text by their declared kind.

The grammar has one expression language for every attribute value; this
module gives a parse tree of that language its meaning under an attribute
kind (:data:`~tilenest.semantics.ops.ATTR_KINDS`), or reports, at the value,
that it is not of that kind. Index expressions are rebuilt with the smart
constructors of :mod:`~tilenest.semantics.expr`, so they come back canonical.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any, NoReturn

from lark import Token, Tree

from ..errors import ParseError, Site
from . import dtypes as D
from . import expr as E
from .expr import Expr, Pred
from .ioschema import MAX_LITERAL, Scope, build_bitop, string_problem
from .maps import Map
from .policies import EXEC_SCOPES, Bounds, BoundsPolicy, ExecPolicy, PipelinePolicy, ReductionPolicy
from .reducers import BUILTINS
from .space import Dim, DimFactor, IndexSet, Space

#: A node of a lark parse tree (a Tree or a Token). Its shape is fixed by
#: ``tileir.lark``, which static types cannot express, so it is typed loosely.
PTree = Any

_EXPR_BINARY: dict[str, Callable[[Expr, Expr], Expr]] = {
    "add": E.add,
    "sub": lambda a, b: E.add(a, E.mul(-1, b)),
    "mul": E.mul,
    "floordiv": E.floordiv,
    "mod": E.mod,
    "bitor": lambda a, b: build_bitop("|", a, b),
    "bitxor": lambda a, b: build_bitop("^", a, b),
    "bitand": lambda a, b: build_bitop("&", a, b),
    "shl": lambda a, b: build_bitop("<<", a, b),
    "shr": lambda a, b: build_bitop(">>", a, b),
}

_KIND_WORDS = {
    "int": "an integer", "bool": "true or false", "str": "a string",
    "number": "a number (integer, float or bool)", "dtype": "a dtype name",
    "expr": "an index expression", "exprs": "a tuple of index expressions ( e, ... )",
    "vars": "a tuple of variables ($a, ...)", "ints": "a list of integers [i, ...]",
    "indexset": "an index set {($i, ...) in [#d:extent, ...] | pred}",
    "pred": "a predicate", "bounds": "zero, checked, assume or fill(number)",
    "exec": "exec(scope = s, layout = ($a, ...) -> (e, ...))",
    "pipeline": "pipeline(window = w, interval = i)",
    "rpolicy": "one of " + ", ".join(p.value for p in ReductionPolicy),
    "contracts": "a list of reducers [add, @custom, none, ...]",
}


def position(n: PTree) -> tuple[int, int]:
    """Line and column (both from 1) where a token or tree starts."""
    if isinstance(n, Token):
        return n.line or 1, n.column or 1
    meta = n.meta
    if not meta.empty:
        return meta.line, meta.column
    for c in n.children:
        if c is not None:
            return position(c)
    return 1, 1


class ValueReader:
    """The context values are read in: the file name for sites, the declared
    symbols (``None``: any name is a symbol), the dim table by printed name and
    the custom reducers' names."""

    def __init__(self, file: str | None, syms: set[str] | None = None):
        self.file = file
        self.syms = syms
        self.dims: dict[str, Dim] = {}
        self.dim_table: list[Dim] = []
        self.reducers: set[str] = set()

    def fail(self, n: PTree, message: str, hint: str | None = None) -> NoReturn:
        line, col = position(n)
        raise ParseError(message, Site(self.file, line, col), hint=hint)

    def expect(self, n: PTree, kind: str, what: str = "the value") -> NoReturn:
        self.fail(n, f"{what} must be {_KIND_WORDS.get(kind, kind)}")

    # -- scalars --------------------------------------------------------
    def int_token(self, tok: Token) -> int:
        """An integer literal of magnitude below 2**64 (:data:`MAX_LITERAL`: the
        largest u64 element); the verifier then checks that index arithmetic
        stays in int64 and that element literals fit their dtypes."""
        if len(tok.value.lstrip("0")) > 20 or int(tok.value) > MAX_LITERAL:
            self.fail(tok, "integer literal is outside the 64-bit range",
                      hint="index integers are int64; element literals fit their dtype")
        return int(tok.value)

    def as_int(self, n: PTree, what: str = "the value") -> int:
        if n.data == "int":
            return self.int_token(n.children[0])
        if n.data == "negate" and n.children[0].data == "int":
            return -self.int_token(n.children[0].children[0])
        self.expect(n, "int", what)

    def as_bool(self, n: PTree, what: str = "the value") -> bool:
        if n.data == "name" and n.children[0].value in ("true", "false"):
            return bool(n.children[0].value == "true")
        self.expect(n, "bool", what)

    def as_number(self, n: PTree, what: str = "the value") -> int | float | bool:
        sign = 1
        inner = n
        if n.data == "negate":
            sign, inner = -1, n.children[0]
        if inner.data == "int":
            return sign * self.int_token(inner.children[0])
        if inner.data == "float":
            return sign * float(inner.children[0].value)
        if inner.data == "name":
            word = inner.children[0].value
            if word == "inf":
                return sign * math.inf
            if word == "nan" and sign == 1:
                return math.nan  # one shared NaN object, so equal programs compare equal
            if word in ("true", "false") and sign == 1:
                return bool(word == "true")
        self.expect(n, "number", what)

    def as_str_token(self, tok: Token) -> str:
        try:
            s = str(json.loads(tok.value))
        except json.JSONDecodeError:
            self.fail(tok, "malformed string literal", hint="strings use JSON escapes")
        problem = string_problem(s)
        if problem:
            self.fail(tok, problem)
        return s

    def as_str(self, n: PTree, what: str = "the value") -> str:
        if n.data == "string":
            return self.as_str_token(n.children[0])
        self.expect(n, "str", what)

    def as_dtype_token(self, tok: Token) -> D.DType:
        d = D.BY_NAME.get(tok.value)
        if d is None:
            self.fail(tok, f"unknown dtype '{tok.value}'",
                      hint="dtypes are " + ", ".join(D.BY_NAME))
        return d

    def as_dtype(self, n: PTree, what: str = "the value") -> D.DType:
        if n.data == "name":
            return self.as_dtype_token(n.children[0])
        self.expect(n, "dtype", what)

    def items(self, n: PTree, kind: str, what: str) -> list[PTree]:
        """The entries of a ``[...]`` list."""
        if n.data != "list":
            self.expect(n, kind, what)
        return [c for c in n.children if c is not None]

    def as_dtype_list(self, n: PTree) -> list[D.DType]:
        return [self.as_dtype(c, "a state component") for c in self.items(n, "dtype", "state")]

    def as_number_list(self, n: PTree) -> list[Any]:
        return [self.as_number(c, "an identity") for c in self.items(n, "number", "identity")]

    # -- index expressions and predicates ---------------------------------
    def as_expr(self, n: PTree, scope: Scope | None, what: str = "the value") -> Expr:
        """An index expression; names must be declared symbols, ``%values``
        visible ones (when a scope is given)."""
        k = n.data
        if k == "int":
            return E.Const(self.int_token(n.children[0]))
        if k == "name":
            name = n.children[0].value
            if self.syms is not None and name not in self.syms:
                self.fail(n, f"unknown symbol '{name}'",
                          hint="declare it in the kernel header's syms [...]")
            return E.Sym(name)
        if k == "var":
            return E.Var(n.children[0].value[1:])
        if k == "val":
            name = n.children[0].value[1:]
            if scope is not None and scope.lookup(name) is None:
                msg, hint = scope.undefined_message(name)
                self.fail(n, msg, hint=hint)
            return E.Val(name)
        if k == "paren":
            return self.as_expr(n.children[0], scope, what)
        if k == "negate":
            return E.mul(-1, self.as_expr(n.children[0], scope, what))
        if k in _EXPR_BINARY:
            a, b = (self.as_expr(c, scope, what) for c in n.children)
            try:
                return _EXPR_BINARY[k](a, b)
            except ZeroDivisionError:
                self.fail(n, "index expression divides by zero")
            except ValueError as e:
                self.fail(n, str(e))
        if k == "call":
            fn = n.children[0].value
            args = [c for c in n.children[1:] if c is not None]
            if fn in ("min", "max") and len(args) == 2 and all(
                    isinstance(a, Tree) and a.data != "kwarg" for a in args):
                a, b = (self.as_expr(c, scope, what) for c in args)
                return E.minimum(a, b) if fn == "min" else E.maximum(a, b)
            self.fail(n, f"'{fn}(...)' is not an index expression",
                      hint="the functions of index expressions are min(a, b) and max(a, b)")
        self.expect(n, "expr", what)

    def as_pred(self, n: PTree, scope: Scope | None, what: str = "the value") -> Pred:
        k = n.data
        if k == "name" and n.children[0].value in ("true", "false"):
            return E.TRUE if n.children[0].value == "true" else E.FALSE
        if k == "compare":
            a, op, b = n.children
            return E.cmp(op.children[0].value, self.as_expr(a, scope, what),
                         self.as_expr(b, scope, what))
        if k == "and_":
            return E.pand(*(self.as_pred(c, scope, what) for c in n.children))
        if k == "or_":
            return E.por(*(self.as_pred(c, scope, what) for c in n.children))
        if k == "not_":
            return E.pnot(self.as_pred(n.children[0], scope, what))
        if k == "paren":
            return self.as_pred(n.children[0], scope, what)
        self.expect(n, "pred", what)

    def tuple_items(self, n: PTree, kind: str, what: str) -> list[PTree]:
        """The entries of ``( ... )``: ``(x)`` is a one-entry tuple here."""
        if n.data == "paren":
            return [n.children[0]]
        if n.data == "tuple":
            return list(n.children)
        self.expect(n, kind, what)

    def as_vars(self, n: PTree, what: str = "the value") -> tuple[str, ...]:
        out = []
        for c in self.tuple_items(n, "vars", what):
            if c.data != "var":
                self.expect(c, "vars", what)
            out.append(c.children[0].value[1:])
        if len(set(out)) != len(out):
            self.fail(n, f"{what} names a variable twice")
        return tuple(out)

    def as_exprs(self, n: PTree, scope: Scope | None, what: str = "the value") -> tuple[Expr, ...]:
        return tuple(self.as_expr(c, scope, what) for c in self.tuple_items(n, "exprs", what))

    def as_map(self, n: PTree, scope: Scope | None, what: str) -> Map:
        if n.data != "arrow":
            self.fail(n, f"{what} must be a map ($a, ...) -> (e, ...)")
        ins, outs = n.children
        return Map(self.as_vars(ins, what), self.as_exprs(outs, scope, what))

    # -- structured kinds -----------------------------------------------
    def read_space(self, t: PTree, scope: Scope | None) -> Space:
        """``[#dim:extent, ...]``: every dim from the table, none twice."""
        factors: list[DimFactor] = []
        seen: set[Dim] = set()
        for f in t.children:
            if f is None:
                continue
            tok, ext = f.children
            d = self.dim(tok)
            if d in seen:
                self.fail(tok, f"dim {tok.value} appears twice in one space")
            seen.add(d)
            factors.append(DimFactor(d, self.as_expr(ext, scope)))
        return Space(tuple(factors))

    def dim(self, tok: Token) -> Dim:
        d = self.dims.get(tok.value[1:])
        if d is None:
            self.fail(tok, f"unknown dim {tok.value}",
                      hint="declare it in the kernel header's dims [...] table")
        return d

    def as_indexset(self, n: PTree, scope: Scope | None, what: str) -> IndexSet:
        if n.data != "indexset":
            self.expect(n, "indexset", what)
        vars_ = self.as_vars(n.children[0], what)
        space = self.read_space(n.children[1], scope)
        if len(vars_) != space.rank:
            self.fail(n.children[0], f"{what} names {len(vars_)} variables for "
                      f"{space.rank} dims", hint="give one variable per dim")
        pred = self.as_pred(n.children[2], scope, what) if len(n.children) > 2 else E.TRUE
        return IndexSet(space, vars_, pred)

    def as_bounds(self, n: PTree, what: str) -> BoundsPolicy:
        if n.data == "name" and n.children[0].value in ("zero", "checked", "assume"):
            return BoundsPolicy(Bounds(n.children[0].value))
        if n.data == "call" and n.children[0].value == "fill":
            args = [c for c in n.children[1:] if c is not None]
            if len(args) == 1 and args[0].data != "kwarg":
                return BoundsPolicy(Bounds.fill, self.as_number(args[0], "the fill value"))
        self.expect(n, "bounds", what)

    def kwargs(self, n: PTree, fn: str, kind: str, allowed: tuple[str, ...],
               what: str) -> dict[str, PTree]:
        """The ``key = value`` arguments of a call ``fn(...)``."""
        if n.data != "call" or n.children[0].value != fn:
            self.expect(n, kind, what)
        out: dict[str, PTree] = {}
        for a in n.children[1:]:
            if a is None:
                continue
            if a.data != "kwarg":
                self.fail(a, f"arguments of {fn}(...) are written key = value",
                          hint="keys: " + ", ".join(allowed))
            key, val = a.children
            if key.value not in allowed:
                self.fail(key, f"unknown argument '{key.value}' of {fn}(...)",
                          hint="keys: " + ", ".join(allowed))
            if key.value in out:
                self.fail(key, f"argument '{key.value}' is given twice")
            out[key.value] = val
        return out

    def as_exec(self, n: PTree, scope: Scope | None, what: str) -> ExecPolicy:
        kw = self.kwargs(n, "exec", "exec", ("scope", "layout"), what)
        scope_name = None
        if "scope" in kw:
            s = kw["scope"]
            if s.data != "name" or s.children[0].value not in EXEC_SCOPES:
                self.fail(s, "unknown exec scope", hint="one of " + ", ".join(EXEC_SCOPES))
            scope_name = s.children[0].value
        layout = self.as_map(kw["layout"], scope, "the exec layout") if "layout" in kw else None
        return ExecPolicy(scope_name, layout)

    def as_pipeline(self, n: PTree, what: str) -> PipelinePolicy:
        kw = self.kwargs(n, "pipeline", "pipeline", ("window", "interval"), what)
        window = self.as_int(kw["window"], "the window") if "window" in kw else 2
        interval = self.as_int(kw["interval"], "the interval") if "interval" in kw else 1
        try:
            return PipelinePolicy(window, interval)
        except ValueError as e:
            self.fail(n, str(e))

    def as_rpolicy(self, n: PTree, what: str) -> ReductionPolicy:
        if n.data == "name" and n.children[0].value in ReductionPolicy.__members__:
            return ReductionPolicy[n.children[0].value]
        self.expect(n, "rpolicy", what)

    def as_contracts(self, n: PTree, what: str) -> tuple[str | None, ...]:
        out: list[str | None] = []
        for c in self.items(n, "contracts", what):
            if c.data == "name" and c.children[0].value == "none":
                out.append(None)
            elif c.data == "name" and c.children[0].value in BUILTINS or c.data == "global" and c.children[0].value[1:] in self.reducers:
                out.append(c.children[0].value)
            elif c.data in ("name", "global"):
                self.fail(c, f"unknown reducer '{c.children[0].value}'",
                          hint="built-in reducers are " + ", ".join(BUILTINS)
                          + "; custom ones are written @name and declared in the kernel")
            else:
                self.expect(c, "contracts", what)
        return tuple(out)

    def read_attr(self, kind: str, n: PTree, scope: Scope | None, what: str) -> Any:
        """The value of tree ``n`` as an attribute of ``kind``."""
        what = f"attribute {what}" if not what.startswith("the") else what
        if kind == "int":
            return self.as_int(n, what)
        if kind == "bool":
            return self.as_bool(n, what)
        if kind == "str":
            return self.as_str(n, what)
        if kind == "number":
            return self.as_number(n, what)
        if kind == "dtype":
            return self.as_dtype(n, what)
        if kind == "expr":
            return self.as_expr(n, scope, what)
        if kind == "exprs":
            return self.as_exprs(n, scope, what)
        if kind == "vars":
            return self.as_vars(n, what)
        if kind == "ints":
            return tuple(self.as_int(c, what) for c in self.items(n, "ints", what))
        if kind == "indexset":
            return self.as_indexset(n, scope, what)
        if kind == "pred":
            return self.as_pred(n, scope, what)
        if kind == "bounds":
            return self.as_bounds(n, what)
        if kind == "exec":
            return self.as_exec(n, scope, what)
        if kind == "pipeline":
            return self.as_pipeline(n, what)
        if kind == "rpolicy":
            return self.as_rpolicy(n, what)
        if kind == "contracts":
            return self.as_contracts(n, what)
        raise ValueError(f"unknown attribute kind {kind!r}")
