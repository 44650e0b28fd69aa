"""Reading TileIR text (the form ``printer.py`` writes) back into a TileProgram.

``parse_program(print_program(p)) == p`` for every program whose dims are its
canonical table entries ``Dim(("p", i), label)``. Reading is two steps: the
LALR grammar ``tileir.lark`` gives a parse tree; :class:`Reader` checks every
reference (ops against their schema, ``%values`` against SSA scopes, ``#dims``
against the dim table, symbols against ``syms``, ``@reducers`` against the
program's reducers) while building the immutable IR. Any mistake raises
:class:`~tilenest.errors.ParseError` at the offending token, with a hint.

:func:`parse_program` is the one way in: the program it returns has passed
the verifier (:func:`~tilenest.semantics.verify.verify`), the same one a
captured kernel passes, with each op's diagnostics placed at the op's line:col.
A text may hold several kernels (a module); :func:`parse_module` reads them
all, :func:`parse_program` the one a caller expects.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

from ..errors import ParseError, Site
from .expr import Expr, Pred
from .ioschema import (
    Scope,
    attr_kind,
    canonical_dim,
    grammar,
    missing_attrs,
    number_ops,
    opdef_or_none,
    operand_count_problem,
    ReadSite,
    region_count_problem,
    site_problem,
    unknown_attr_hint,
    unknown_op_hint,
)
from .ir import Block, FrozenDict, Operation, TileProgram, Value
from .maps import MemLayout
from .module import TileModule
from .policies import RESOURCES
from .reducers import CustomReducer
from .space import Dim
from .types import MemoryType, StateType, TensorType, TileType, Type
from .valueread import PTree, ValueReader, position


# ---------------------------------------------------------------------------
# syntax errors

_TERMINAL_NAMES = {
    "RESULTS": "'%name ='", "VALUE": "a %value", "VAR": "a $variable", "DIM": "a #dim",
    "GLOBAL": "an @name", "NAME": "a name", "INT": "an integer", "FLOAT": "a float",
    "STRING": "a string", "$END": "the end of the text", "<END-OF-FILE>": "the end of the text",
}


def _describe_terminal(name: str) -> str:
    if name in _TERMINAL_NAMES:
        return _TERMINAL_NAMES[name]
    try:
        pattern = grammar().get_terminal(name).pattern
    except (KeyError, AttributeError):
        return name
    return f"'{pattern.value}'"


def _end_site(text: str, file: str | None) -> Site:
    lines = text.split("\n")
    return Site(file, len(lines), len(lines[-1]) + 1)


def _syntax_error(e: LarkError, text: str, file: str | None) -> ParseError:
    """The ParseError for a lark failure: where, what was found, what was expected."""
    if isinstance(e, UnexpectedCharacters):
        pos = e.pos_in_stream or 0
        ch = text[pos] if pos < len(text) else ""
        return ParseError(f"unexpected character {ch!r}", Site(file, e.line, e.column),
                          hint="tokens are %values, $vars, #dims, @names, names, numbers, "
                               "strings and punctuation")
    if isinstance(e, (UnexpectedToken, UnexpectedEOF)):
        tok = getattr(e, "token", None)
        expected = sorted({_describe_terminal(t) for t in (e.expected or ())})
        hint = "expected " + ", ".join(expected[:10]) + (", ..." if len(expected) > 10 else "")
        if tok is None or tok.type == "$END":
            return ParseError("unexpected end of text", _end_site(text, file), hint=hint)
        return ParseError(f"unexpected '{tok.value}'", Site(file, tok.line, tok.column),
                          hint=hint)
    return ParseError(f"cannot parse: {e}", Site(file, 1, 1))


def _parse_tree(text: str, start: str, file: str | None) -> PTree:
    try:
        return grammar().parse(text, start=start)
    except LarkError as e:
        raise _syntax_error(e, text, file) from None


# ---------------------------------------------------------------------------
# tree helpers


def _kids(t: PTree) -> list[PTree]:
    return [c for c in t.children if c is not None]


def _trees(t: PTree, data: str) -> list[PTree]:
    return [c for c in t.children if isinstance(c, Tree) and c.data == data]


def _tokens(t: PTree, type_: str) -> list[Token]:
    return [c for c in t.children if isinstance(c, Token) and c.type == type_]


def _one(t: PTree, data: str) -> PTree | None:
    found = _trees(t, data)
    return found[0] if found else None


_RESULT_NAME = re.compile(r"%([A-Za-z0-9_.]+)")


def _result_names(tok: Token) -> list[tuple[str, int, int]]:
    """The names in a ``%a, %b =`` token, each with its line and column."""
    out = []
    for m in _RESULT_NAME.finditer(tok.value):
        before = tok.value[:m.start()]
        nl = before.count("\n")
        line, column = tok.line or 1, tok.column or 1
        col = (column + m.start()) if nl == 0 else m.start() - before.rfind("\n")
        out.append((m.group(1), line + nl, col))
    return out


# ---------------------------------------------------------------------------
# the reader


class Reader(ValueReader):
    """Builds IR from a parse tree, checking every reference on the way."""

    def __init__(self, file: str | None, syms: set[str] | None = None):
        super().__init__(file, syms)
        #: where each op was read, by the provisional op id it is built with
        self.sites: dict[int, Site] = {}

    # -- kernel ---------------------------------------------------------
    def read_kernel(self, t: PTree) -> TileProgram:
        """The kernel; ``self.sites`` is then keyed by the final op ids."""
        gtok = _tokens(t, "GLOBAL")[0]
        name = gtok.value[1:]
        syms = _one(t, "syms")
        self.syms = set()
        sym_names: list[str] = []
        for tok in (_tokens(syms, "NAME") if syms is not None else []):
            if tok.value in self.syms:
                self.fail(tok, f"symbol '{tok.value}' is declared twice")
            self.syms.add(tok.value)
            sym_names.append(tok.value)
        table = _one(t, "dimtable")
        if table is not None:
            self.read_dimtable(table)
        scope = Scope()
        args = []
        for a in _trees(t, "karg"):
            args.append(self.define(a, scope))
        assume = _one(t, "assume")
        assumptions = tuple(self.as_pred(v, scope) for v in _kids(assume)) if assume else ()
        loc = _one(t, "loc")
        reducers = tuple(self.read_reducer(r) for r in _trees(t, "reducer"))
        self.reducers = {r.name for r in reducers}
        body_args = []
        label = _one(t, "label")
        if label is not None:
            body_args = [self.define(a, scope) for a in _trees(label, "blockarg")]
        ops = tuple(self.read_op(o, scope) for o in _trees(t, "op"))
        p = TileProgram(name, tuple(args), tuple(sym_names), assumptions,
                        tuple(self.dim_table), Block(tuple(body_args), ops), reducers,
                        self.read_loc(loc) if loc is not None else None)
        renumbered: dict[int, int] = {}
        p = number_ops(p, renumbered)
        self.sites = {renumbered[k]: v for k, v in self.sites.items() if k in renumbered}
        from .verify import PROGRAM_SITE, remember_sites

        self.sites[PROGRAM_SITE] = ReadSite(self.file, *position(gtok))
        return remember_sites(p, self.sites)

    def read_dimtable(self, t: PTree) -> None:
        for decl in _trees(t, "dimdecl"):
            tok = _tokens(decl, "DIM")[0]
            label_tok = _tokens(decl, "STRING")
            label = self.as_str_token(label_tok[0]) if label_tok else None
            if tok.value[1:] in self.dims:
                self.fail(tok, f"dim {tok.value} is declared twice")
            d = canonical_dim(len(self.dim_table), label)
            self.dims[tok.value[1:]] = d
            self.dim_table.append(d)

    def read_reducer(self, t: PTree) -> CustomReducer:
        gtok = _tokens(t, "GLOBAL")[0]
        name = gtok.value[1:]
        if name in self.reducers:
            self.fail(gtok, f"reducer @{name} is declared twice")
        self.reducers.add(name)
        params: dict[str, Any] = {}
        readers: dict[str, Callable[[PTree], Any]] = {
            "state": self.as_dtype_list, "identity": self.as_number_list,
            "associative": self.as_bool, "commutative": self.as_bool,
            "provenance": self.as_str,
        }
        for kw in _trees(t, "kwarg"):
            key, val = kw.children
            if key.value not in readers:
                self.fail(key, f"unknown reducer parameter '{key.value}'",
                          hint="reducers take state, identity, associative, commutative, "
                               "provenance")
            if key.value in params:
                self.fail(key, f"reducer parameter '{key.value}' is given twice")
            params[key.value] = readers[key.value](val)
        for req in ("state", "identity", "associative", "commutative"):
            if req not in params:
                self.fail(gtok, f"reducer @{name} lacks '{req}'")
        regions = _trees(t, "region")
        # a reducer's blocks are isolated from the kernel body and from each other
        merge = self.read_region(regions[0], Scope())
        lift = self.read_region(regions[1], Scope()) if len(regions) > 1 else None
        return CustomReducer(name, tuple(params["state"]), tuple(params["identity"]), merge,
                             lift, params["associative"], params["commutative"],
                             params.get("provenance", "declared"))

    # -- ops ------------------------------------------------------------
    def define(self, t: PTree, scope: Scope) -> Value:
        """A ``%name: type`` declaration (kernel or block argument), now visible."""
        tok, ty = t.children
        v = Value(tok.value[1:], self.read_type(ty, scope))
        self.declare(tok.value[1:], tok.line, tok.column, scope)
        scope.bind(v)
        return v

    def declare(self, name: str, line: int, col: int, scope: Scope) -> None:
        earlier = scope.declare(name, f"{line}:{col}")
        if earlier is not None:
            raise ParseError(f"value %{name} is already defined", Site(self.file, line, col),
                             hint=f"each value is defined once; the first definition is at "
                                  f"{earlier}")

    def read_op(self, t: PTree, scope: Scope) -> Operation:
        results_tok = _tokens(t, "RESULTS")
        name_tok = _tokens(t, "NAME")[0]
        d = opdef_or_none(name_tok.value)
        if d is None:
            self.fail(name_tok, f"unknown op '{name_tok.value}'",
                      hint=unknown_op_hint(name_tok.value))
        operands = tuple(self.use(tok, scope) for tok in _tokens(t, "VALUE"))
        problem = operand_count_problem(d, len(operands))
        if problem:
            self.fail(name_tok, problem)
        attrs: dict[str, Any] = {}
        attrdict = _one(t, "attrdict")
        for a in (_trees(attrdict, "attr") if attrdict is not None else []):
            key, val = a.children
            kind = attr_kind(d, key.value)
            if kind is None:
                self.fail(key, f"unknown attribute '{key.value}' of '{d.name}'",
                          hint=unknown_attr_hint(d, key.value))
            if key.value in attrs:
                self.fail(key, f"attribute '{key.value}' is given twice")
            attrs[key.value] = self.read_attr(kind, val, scope, f"'{key.value}' of '{d.name}'")
        missing = missing_attrs(d, attrs)
        if missing:
            self.fail(name_tok, f"'{d.name}' lacks attribute " +
                      ", ".join(f"'{m}'" for m in missing))
        optypes = _one(t, "optypes")
        types = [self.read_type(c, scope) for c in _kids(optypes)] if optypes else []
        names = _result_names(results_tok[0]) if results_tok else []
        if len(names) != len(types):
            where = optypes if optypes is not None else name_tok
            self.fail(where, f"'{d.name}' defines {len(names)} result"
                      f"{'' if len(names) == 1 else 's'} but lists {len(types)} type"
                      f"{'' if len(types) == 1 else 's'}",
                      hint="write one type per result after ':'")
        for n, line, col in names:
            self.declare(n, line, col, scope)
        results = tuple(Value(n, ty) for (n, _, _), ty in zip(names, types, strict=True))
        region_trees = _trees(t, "region")
        problem = region_count_problem(d, len(region_trees))
        if problem:
            self.fail(region_trees[d.regions] if len(region_trees) > d.regions else name_tok,
                      problem)
        regions = tuple(self.read_region(r, scope.child()) for r in region_trees)
        for r in results:
            scope.bind(r)
        loc = _one(t, "loc")
        first = results_tok[0] if results_tok else name_tok
        oid = len(self.sites)
        self.sites[oid] = ReadSite(self.file, *position(first))
        return Operation(d.name, operands, results, FrozenDict(attrs), regions,
                         self.read_loc(loc) if loc is not None else None, oid)

    def read_region(self, t: PTree, scope: Scope) -> Block:
        label = _one(t, "label")
        args = tuple(self.define(a, scope) for a in _trees(label, "blockarg"))
        ops = tuple(self.read_op(o, scope) for o in _trees(t, "op"))
        return Block(args, ops)

    def use(self, tok: Token, scope: Scope) -> Value:
        v = scope.lookup(tok.value[1:])
        if v is None:
            msg, hint = scope.undefined_message(tok.value[1:])
            self.fail(tok, msg, hint=hint)
        return v

    def read_loc(self, t: PTree) -> Site:
        s = _tokens(t, "STRING")
        line_tok, col_tok = _tokens(t, "INT")
        line, col = self.int_token(line_tok), self.int_token(col_tok)
        problem = site_problem(line, col)
        if problem:
            self.fail(line_tok, problem)
        return Site(self.as_str_token(s[0]) if s else None, line, col)

    # -- types ----------------------------------------------------------
    def read_type(self, t: PTree, scope: Scope | None = None) -> Type:
        """``f32``, ``tile<...>``, ``tensor<...>``, ``memory<...>`` or ``state<%m>``."""
        if t.data == "state_type":
            return StateType(t.children[0].value[1:])
        dt = self.as_dtype_token(t.children[0])
        if t.data == "scalar_type":
            return TileType(dt)
        space = self.read_space(t.children[1], scope)
        if t.data == "tile_type":
            return TileType(dt, space)
        if t.data == "tensor_type":
            return TensorType(dt, space.extents, space.dims)
        lay = t.children[2]
        vars_ = tuple(tok.value[1:] for tok in _kids(lay)[:-2])
        offset, size = (self.as_expr(x, scope) for x in _kids(lay)[-2:])
        res = t.children[3].value if len(t.children) > 3 and t.children[3] else "auto"
        if res not in RESOURCES:
            self.fail(t.children[3], f"unknown memory resource '{res}'",
                      hint="one of " + ", ".join(RESOURCES))
        return MemoryType(dt, space, MemLayout(vars_, offset, size), res)


# ---------------------------------------------------------------------------
# entry points


def _read_module(text: str, file: str | None
                 ) -> list[tuple[TileProgram, dict[int, Site]]]:
    """Every kernel of the text with its op sites, each read by a fresh
    :class:`Reader` (a kernel's symbols, dims and reducers are its own)."""
    tree = _parse_tree(text, "start", file)
    out: list[tuple[TileProgram, dict[int, Site]]] = []
    seen: dict[str, Site] = {}
    for kt in tree.children:
        gtok = _tokens(kt, "GLOBAL")[0]
        here = Site(file, *position(gtok))
        first = seen.get(gtok.value)
        if first is not None:
            raise ParseError(f"kernel {gtok.value} is defined twice", here,
                             hint=f"kernel names of one text are distinct; the first "
                                  f"{gtok.value} is at {first}")
        seen[gtok.value] = here
        reader = Reader(file)
        try:
            out.append((reader.read_kernel(kt), reader.sites))
        except RecursionError:
            raise ParseError("the text nests too deeply to read", here) from None
    return out


def _verified(p: TileProgram, sites: dict[int, Site], file: str | None) -> TileProgram:
    from .verify import verify

    try:
        verify(p, sites)
    except RecursionError:
        raise ParseError("the program nests too deeply to verify", Site(file, 1, 1)) from None
    return p


def parse_module(text: str, file: str | None = None) -> TileModule:
    """Every kernel written in ``text``, in order, each verified (I-19): a
    TileIR text is a module of one or more kernels. Raises ParseError at the
    first mistake (a kernel name given twice included), or the verifier's
    error at the line:col of the op that breaks a static rule."""
    return TileModule(tuple(_verified(p, sites, file) for p, sites in _read_module(text, file)))


def parse_program(text: str, file: str | None = None, kernel: str | None = None
                  ) -> TileProgram:
    """The one program written in ``text`` (see ``spec/interchange.md``),
    verified; op ids are assigned in pre-order from 0. ``kernel`` picks one
    kernel of a text of several by name; without it, a text of several
    kernels is a ParseError (read those with :func:`parse_module`). Raises
    ParseError at the first mistake of the text, or the verifier's error
    (VerifyError, TypeCheckError, ...) at the line:col of the op that breaks
    a static rule."""
    read = _read_module(text, file)
    chosen = TileModule(tuple(p for p, _ in read)).single(kernel, file)
    return _verified(chosen, next(sites for q, sites in read if q is chosen), file)


def read_program_unverified(text: str, file: str | None = None) -> TileProgram:
    """The syntax layer of :func:`parse_program` alone: references are checked,
    static rules are not. This is the exact inverse of ``print_program`` for
    every program, well typed or not, and serves to test that pair; a program
    from outside is read with :func:`parse_program`."""
    return read_module_unverified(text, file).single(None, file)


def read_module_unverified(text: str, file: str | None = None) -> TileModule:
    """:func:`read_program_unverified` for a text of any number of kernels: the
    inverse of ``print_module``."""
    return TileModule(tuple(p for p, _ in _read_module(text, file)))


def parse_expr(text: str, syms: set[str] | None = None) -> Expr:
    """An index expression; with ``syms``, every bare name must be one of them."""
    return Reader(None, syms).as_expr(_parse_tree(text, "value", None), None)


def parse_pred(text: str, syms: set[str] | None = None) -> Pred:
    """A predicate; with ``syms``, every bare name must be one of them."""
    return Reader(None, syms).as_pred(_parse_tree(text, "value", None), None)


def parse_attr(kind: str, text: str, dims: tuple[Dim, ...] = (),
               dim_names: tuple[str, ...] = (), reducers: tuple[str, ...] = ()) -> Any:
    """One attribute value of ``kind`` (``dim_names[i]`` names ``dims[i]``)."""
    r = Reader(None, None)
    r.dims = dict(zip(dim_names, dims, strict=True))
    r.reducers = set(reducers)
    return r.read_attr(kind, _parse_tree(text, "value", None), None, "the value")


def parse_type(text: str, dims: tuple[Dim, ...] = (), dim_names: tuple[str, ...] = ()) -> Type:
    """One type (``dim_names[i]`` names ``dims[i]``)."""
    r = Reader(None, None)
    r.dims = dict(zip(dim_names, dims, strict=True))
    return r.read_type(_parse_tree(text, "type", None), None)

