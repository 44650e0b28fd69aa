"""The kernel stager: walks a kernel's Python AST and builds TileIR.

The stager *interprets* the function's syntax tree (it never executes the
function's bytecode). It accepts only the constructs it lists (STYLE #9); each
handler is small, and every error carries the user's ``file:line:col``.

Region statements ``for h in tn.parallel(...)`` (and serial / pipeline / reduce,
member forms ``h.parallel(...)``) stage their body once. Carried state follows
the capture rule of the calculus: at region entry every live tile variable (and
every Memory object's state) is given a *forwarding* placeholder; at exit a
variable that was reassigned becomes a state of the region -- an operand
(incoming value), a body argument (what the placeholder resolves to) and a
result (what the name denotes after the region) -- while an unchanged variable's
placeholder resolves back to the incoming value. Names first defined inside a
region are local to it; using one after the region is diagnosed, as is any use
of an escaped scope handle.

Python ``for`` over Python iterables, and Python ``if``/``while`` on Python
values, run at capture time (host staging). Control flow on a staged value must
use ``tn.if_`` / ``tn.while_``.
"""

from __future__ import annotations

import ast
import builtins
import inspect
import os
import textwrap
import threading
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import CaptureError, ContractError, Site, TilenestError, TypeCheckError
from ..semantics import dtypes as D
from ..semantics import expr as E
from ..semantics.policies import ExecPolicy, ReductionPolicy
from ..semantics.space import IndexSet
from ..semantics.types import TileType
from . import dsl
from .builder import BBlock, BOp, BValue
from .context import ScopeFrame, ctx

_UNSET = object()


class _Escaped:
    """What a region-local name denotes after its region: using it is an error."""

    def __init__(self, name: str, site: Site | None, kind: str):
        self.name, self.site, self.kind = name, site, kind


@dataclass
class Source:
    file: str
    first_line: int
    col_offset: int
    tree: ast.AST


#: parse_function's answers, by (code object, its file, working directory): a function's
#: source is read and parsed once, however many variants, calls and threads
#: ask for it (the working directory is part of the key because the file name
#: a Source carries is relative to it)
_SOURCES: dict[tuple[Any, str, str], Source] = {}
#: held while a source is read and parsed: ``ast.parse`` run by several threads
#: at once has failed inside CPython (SystemError: AST constructor recursion
#: depth mismatch), and one parse per function is all that is needed anyway
_PARSE_LOCK = threading.Lock()


def parse_function(fn: Callable) -> Source:
    """``fn``'s source, parsed once per function and working directory; line
    numbers are corrected to the file. Safe to call from several threads."""
    code = getattr(fn, "__code__", None)
    try:
        # code objects compare by content, not by file: the file is part of the key
        key = (code, code.co_filename, os.getcwd()) if code is not None else None
    except OSError:  # the working directory was deleted: nothing to key on
        key = None
    src = _SOURCES.get(key) if key is not None else None
    if src is not None:
        return src
    with _PARSE_LOCK:
        src = _SOURCES.get(key) if key is not None else None
        if src is None:
            src = _read_and_parse(fn)
            if key is not None:
                _SOURCES[key] = src
    return src


def _read_and_parse(fn: Callable) -> Source:
    try:
        src = inspect.getsource(fn)
        file = inspect.getsourcefile(fn) or "<unknown>"
        first = fn.__code__.co_firstlineno
    except (OSError, TypeError) as e:
        raise CaptureError(f"cannot read the source of kernel {fn.__name__!r}: {e}",
                           hint="kernels must be defined in a file, not typed at a prompt") from None
    try:
        rel = os.path.relpath(file)
        if not rel.startswith(".."):
            file = rel
    except (ValueError, OSError):  # another drive, or no working directory
        pass
    ded = textwrap.dedent(src)
    indent = len(src.splitlines()[0]) - len(ded.splitlines()[0])
    tree = ast.parse(ded)
    ast.increment_lineno(tree, first - 1)
    return Source(file, first, indent, tree)


class Stager:
    """Walks one function body, building IR in the active capture context."""

    def __init__(self, src: Source, globals_: dict, env: dict):
        self.src = src
        self.globals = globals_
        self.env = env

    # -- sites and errors ---------------------------------------------------
    def site(self, node: ast.AST) -> Site:
        return Site(self.src.file, getattr(node, "lineno", 0),
                    getattr(node, "col_offset", 0) + self.src.col_offset + 1)

    def fail(self, node: ast.AST, msg: str, hint: str | None = None) -> CaptureError:
        return CaptureError(msg, self.site(node), hint)

    def _set_site(self, node: ast.AST) -> None:
        ctx().builder.site = self.site(node)

    # -- statements -----------------------------------------------------------
    def run_body(self, body: list[ast.stmt]) -> Any:
        for st in body:
            r = self.stmt(st)
            if r is not None:
                return r
        return None

    def stmt(self, node: ast.stmt) -> Any:
        handler = getattr(self, "s_" + type(node).__name__, None)
        if handler is None:
            raise self.fail(node, f"unsupported Python construct '{type(node).__name__}' "
                                  "in a kernel",
                            "kernels accept assignments, calls, for/if/while, def and return")
        self._set_site(node)
        try:
            return handler(node)
        except TilenestError as e:
            raise e.with_site(self.site(node)) from None

    def s_Expr(self, node: ast.Expr) -> None:
        self.expr(node.value)

    def s_Pass(self, node: ast.Pass) -> None:
        return None

    def s_Assign(self, node: ast.Assign) -> None:
        value = self.expr(node.value)
        for t in node.targets:
            self.bind(t, value)

    def s_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.bind(node.target, self.expr(node.value))

    def s_AugAssign(self, node: ast.AugAssign) -> None:
        if not isinstance(node.target, ast.Name):
            raise self.fail(node, "augmented assignment only to a plain name")
        cur = self.load_name(node.target)
        rhs = self.expr(node.value)
        self.bind(node.target, self.binop(node.op, cur, rhs, node))

    def s_Return(self, node: ast.Return) -> Any:
        if len(ctx().frames) > 1 and self.depth_kind() is not None:
            raise self.fail(node, "return inside a region",
                            "regions have no early exit; restructure with tn.if_")
        return ("return", None if node.value is None else self.expr(node.value))

    def s_Break(self, node: ast.Break) -> None:
        raise self.fail(node, "'break' is not allowed in a kernel loop",
                        "regions have no early exit; use tn.while_ for a data-dependent loop")

    def s_Continue(self, node: ast.Continue) -> None:
        raise self.fail(node, "'continue' is not allowed in a kernel loop",
                        "guard the rest of the body with `if tn.if_(cond):` instead")

    def s_Assert(self, node: ast.Assert) -> None:
        v = self.expr(node.test)
        if isinstance(v, (dsl.Tile, dsl.Index, dsl.IndexCond)) and not (
                isinstance(v, dsl.IndexCond) and isinstance(v.pred, E.BoolConst)):
            raise self.fail(node, "assert on a staged value",
                            "use tn.assume(...) for facts about symbolic extents")
        if not v:
            msg = self.expr(node.msg) if node.msg is not None else "assertion failed"
            raise self.fail(node, f"kernel assertion failed: {msg}")

    def s_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.decorator_list:
            raise self.fail(node, "decorators on functions nested in a kernel are not supported")
        self.env[node.name] = StagedFunction(self, node.args, node.body, node.name, node)

    def s_Global(self, node: ast.AST) -> None:
        raise self.fail(node, "global/nonlocal declarations are not supported in kernels")

    s_Nonlocal = s_Global

    def depth_kind(self) -> str | None:
        for f in reversed(ctx().frames):
            if f.kind in dsl.REGION_KINDS:
                return f.kind
        return None

    # -- binding ----------------------------------------------------------------
    def bind(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            if isinstance(value, dsl.Tile) and value.v.resolve().hint is None:
                value.v.resolve().hint = target.id
            self.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            try:
                items = list(value)
            except TilenestError:
                raise
            except TypeError:
                raise self.fail(target, f"cannot unpack {type(value).__name__}") from None
            if len(items) != len(target.elts):
                raise self.fail(target, f"cannot unpack {len(items)} values into "
                                        f"{len(target.elts)} names")
            for t, v in zip(target.elts, items, strict=True):
                self.bind(t, v)
        elif isinstance(target, ast.Subscript):
            obj = self.expr(target.value)
            if isinstance(obj, dsl.TensorArg):
                raise self.fail(target, "assignment to a tensor subscript is not a store",
                                f"write {ast.unparse(target.value)}(origin, shape).store(value)")
            raise self.fail(target, "assignment to a subscript is not supported",
                            "use tn.put(tile, origin, patch) for a slice update")
        else:
            raise self.fail(target, f"cannot assign to {type(target).__name__}")

    # -- expressions -----------------------------------------------------------
    def expr(self, node: ast.expr) -> Any:
        handler = getattr(self, "e_" + type(node).__name__, None)
        if handler is None:
            raise self.fail(node, f"unsupported Python expression '{type(node).__name__}' "
                                  "in a kernel")
        return handler(node)

    def e_Constant(self, node: ast.Constant) -> Any:
        return node.value

    def e_Name(self, node: ast.Name) -> Any:
        return self.load_name(node)

    def load_name(self, node: ast.Name) -> Any:
        n = node.id
        if n in self.env:
            v = self.env[n]
        elif n in self.globals:
            v = self.globals[n]
        elif hasattr(builtins, n):
            v = getattr(builtins, n)
        else:
            raise self.fail(node, f"name '{n}' is not defined",
                            "a kernel body sees its parameters, its own assignments, module "
                            "globals and closure variables")
        if isinstance(v, _Escaped):
            raise self.fail(node, f"'{n}' was defined inside a {v.kind} region"
                                  + (f" at {v.site}" if v.site else "")
                                  + " and is not visible after it",
                            "define the value before the region and update it inside, "
                            "which makes it a carried state")
        if isinstance(v, dsl.ScopeHandle) and v.closed:
            raise self.fail(node, f"scope handle '{n}' is used outside its region"
                                  + (f" (opened at {v.site})" if v.site else ""),
                            "a region's coordinates are only readable inside its `for` body")
        return v

    def e_Attribute(self, node: ast.Attribute) -> Any:
        obj = self.expr(node.value)
        try:
            return getattr(obj, node.attr)
        except AttributeError:
            raise self.fail(node, f"{type(obj).__name__} has no attribute '{node.attr}'") from None

    def e_Tuple(self, node: ast.Tuple) -> Any:
        return tuple(self._elts(node.elts))

    def e_List(self, node: ast.List) -> Any:
        return list(self._elts(node.elts))

    def _elts(self, elts: list[ast.expr]) -> list[Any]:
        out: list[Any] = []
        for e in elts:
            if isinstance(e, ast.Starred):
                out.extend(self.expr(e.value))
            else:
                out.append(self.expr(e))
        return out

    def e_Dict(self, node: ast.Dict) -> Any:
        return {self.expr(k): self.expr(v) for k, v in zip(node.keys, node.values, strict=True)
                if k is not None}

    def e_Slice(self, node: ast.Slice) -> Any:
        f = (lambda x: None if x is None else self.expr(x))
        return slice(f(node.lower), f(node.upper), f(node.step))

    def e_Subscript(self, node: ast.Subscript) -> Any:
        obj = self.expr(node.value)
        key = self.expr(node.slice)
        self._set_site(node)
        return self.guard(node, lambda: obj[key])

    def e_Call(self, node: ast.Call) -> Any:
        fn = self.expr(node.func)
        args = self._elts(node.args)
        kwargs: dict[str, Any] = {}
        for kw in node.keywords:
            if kw.arg is None:
                kwargs.update(self.expr(kw.value))
            else:
                kwargs[kw.arg] = self.expr(kw.value)
        self._set_site(node)
        return self.guard(node, lambda: fn(*args, **kwargs))

    def guard(self, node: ast.AST, thunk: Callable[[], Any]) -> Any:
        """Run a host call; Python errors from the DSL become located CaptureErrors."""
        try:
            return thunk()
        except TilenestError as e:
            raise e.with_site(self.site(node)) from None
        except (TypeError, ValueError, IndexError, KeyError, ZeroDivisionError) as e:
            raise self.fail(node, f"{type(e).__name__}: {e}") from None

    def e_BinOp(self, node: ast.BinOp) -> Any:
        a, b = self.expr(node.left), self.expr(node.right)
        self._set_site(node)
        return self.binop(node.op, a, b, node)

    _BINOPS: dict[type, Callable[[Any, Any], Any]] = {
        ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
        ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b,
        ast.FloorDiv: lambda a, b: a // b, ast.Mod: lambda a, b: a % b,
        ast.Pow: lambda a, b: a ** b, ast.BitAnd: lambda a, b: a & b,
        ast.BitOr: lambda a, b: a | b, ast.BitXor: lambda a, b: a ^ b,
        ast.LShift: lambda a, b: a << b, ast.RShift: lambda a, b: a >> b,
        ast.MatMult: lambda a, b: a @ b,
    }

    def binop(self, op: ast.operator, a: Any, b: Any, node: ast.AST) -> Any:
        fn = self._BINOPS.get(type(op))
        if fn is None:
            raise self.fail(node, f"unsupported operator {type(op).__name__}")
        return self.guard(node, lambda: fn(a, b))

    def e_UnaryOp(self, node: ast.UnaryOp) -> Any:
        v = self.expr(node.operand)
        self._set_site(node)
        if isinstance(node.op, ast.Not):
            if isinstance(v, dsl.Tile):
                return self.guard(node, lambda: dsl._unary("not", v))
            if isinstance(v, dsl.IndexCond):
                return ~v
            return not v
        fns = {ast.USub: lambda x: -x, ast.UAdd: lambda x: +x, ast.Invert: lambda x: ~x}
        return self.guard(node, lambda: fns[type(node.op)](v))

    def e_Compare(self, node: ast.Compare) -> Any:
        left = self.expr(node.left)
        result: Any = None
        self._set_site(node)
        fns: dict[type, Callable[[Any, Any], Any]] = {
            ast.Lt: lambda a, b: a < b, ast.LtE: lambda a, b: a <= b,
            ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
            ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b,
            ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b,
            ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
        }
        for op, rnode in zip(node.ops, node.comparators, strict=True):
            right = self.expr(rnode)
            r = self.guard(node, lambda: fns[type(op)](left, right))
            result = r if result is None else self._and(result, r, node)
            left = right
        return result

    def _and(self, a: Any, b: Any, node: ast.AST) -> Any:
        staged = (dsl.Tile, dsl.IndexCond)
        if isinstance(a, staged) or isinstance(b, staged):
            return self.guard(node, lambda: a & b)
        return a and b

    def e_BoolOp(self, node: ast.BoolOp) -> Any:
        vals = [self.expr(node.values[0])]
        staged = (dsl.Tile, dsl.IndexCond)
        for v in node.values[1:]:
            cur = vals[-1]
            if not isinstance(cur, staged):
                # Python short-circuit on host values
                if isinstance(node.op, ast.And) and not cur:
                    return cur
                if isinstance(node.op, ast.Or) and cur:
                    return cur
            vals.append(self.expr(v))
        if not any(isinstance(v, staged) for v in vals):
            return vals[-1]
        out = vals[0]
        for v in vals[1:]:
            out = self.guard(node, (lambda a=out, b=v: a & b) if isinstance(node.op, ast.And)
                             else (lambda a=out, b=v: a | b))
        return out

    def e_IfExp(self, node: ast.IfExp) -> Any:
        c = self.expr(node.test)
        if isinstance(c, (dsl.Tile,)) or (isinstance(c, dsl.IndexCond)
                                          and not isinstance(c.pred, E.BoolConst)):
            raise self.fail(node, "conditional expression on a staged value",
                            "use tn.ite(cond, a, b)")
        return self.expr(node.body) if c else self.expr(node.orelse)

    def e_Lambda(self, node: ast.Lambda) -> Any:
        return StagedFunction(self, node.args, node.body, "<lambda>", node)

    def e_JoinedStr(self, node: ast.JoinedStr) -> Any:
        parts = []
        for v in node.values:
            if isinstance(v, ast.FormattedValue):
                parts.append(format(self.expr(v.value)))
            else:
                parts.append(self.expr(v))
        return "".join(parts)

    def e_ListComp(self, node: ast.ListComp) -> Any:
        return self._comprehension(node.elt, node.generators)

    def e_GeneratorExp(self, node: ast.GeneratorExp) -> Any:
        return self._comprehension(node.elt, node.generators)

    def _comprehension(self, elt: ast.expr, gens: list[ast.comprehension]) -> list[Any]:
        out: list[Any] = []
        saved = dict(self.env)

        def rec(i: int) -> None:
            if i == len(gens):
                out.append(self.expr(elt))
                return
            g = gens[i]
            it = self.expr(g.iter)
            if isinstance(it, dsl.RegionSpec):
                raise self.fail(g.iter, "regions cannot be opened in a comprehension")
            for v in it:
                self.bind(g.target, v)
                if all(self.expr(c) for c in g.ifs):
                    rec(i + 1)

        try:
            rec(0)
        finally:
            self.env.clear()
            self.env.update(saved)
        return out

    # -- control flow -----------------------------------------------------------
    def s_For(self, node: ast.For) -> Any:
        it = self.expr(node.iter)
        self._set_site(node)
        if isinstance(it, dsl.RegionSpec):
            if node.orelse:
                raise self.fail(node, "for-else is not supported on regions")
            if not isinstance(node.target, ast.Name):
                raise self.fail(node.target, "a region's loop variable must be a single name "
                                             "(it is the scope handle)")
            return RegionStager(self, node, it).run()
        if isinstance(it, (dsl.Tile, dsl.Index)):
            raise self.fail(node, "Python for-loop over a staged value",
                            "iterate over a symbolic extent with `for i in tn.serial(...)`")
        try:
            items = list(it)
        except TilenestError:
            raise
        except TypeError:
            raise self.fail(node.iter, f"cannot iterate over {type(it).__name__}") from None
        for v in items:
            self.bind(node.target, v)
            r = self.run_body(node.body)
            if r is not None:
                return r
        if node.orelse:
            return self.run_body(node.orelse)
        return None

    def s_If(self, node: ast.If) -> Any:
        c = self.expr(node.test)
        self._set_site(node)
        if isinstance(c, dsl.IfMarker):
            return IfStager(self, node, c.cond).run()
        if isinstance(c, dsl.Tile) or (isinstance(c, dsl.IndexCond)
                                       and not isinstance(c.pred, E.BoolConst)):
            raise self.fail(node.test, "Python `if` depends on a staged value",
                            "use `if tn.if_(cond):` for a dynamic branch, or tn.ite(...)")
        try:
            take = bool(c)
        except TilenestError as e:
            raise e.with_site(self.site(node.test)) from None
        return self.run_body(node.body if take else node.orelse)

    def s_While(self, node: ast.While) -> Any:
        if node.orelse:
            raise self.fail(node, "while-else is not supported in kernels")
        if (isinstance(node.test, ast.Call)
                and self.expr(node.test.func) is dsl.while_):
            return WhileStager(self, node).run()
        guard = 0
        while True:
            c = self.expr(node.test)
            if isinstance(c, dsl.WhileMarker) or isinstance(c, dsl.Tile) or (
                    isinstance(c, dsl.IndexCond) and not isinstance(c.pred, E.BoolConst)):
                raise self.fail(node.test, "Python `while` depends on a staged value",
                                "use `while tn.while_(cond):`")
            if not c:
                return None
            r = self.run_body(node.body)
            if r is not None:
                return r
            guard += 1
            if guard > 1_000_000:
                raise self.fail(node, "host while-loop did not terminate at capture time")

    # -- forwarding (carried state) ---------------------------------------------
    def open_forwarding(self) -> tuple[dict, dict, dict]:
        """Give every live tile variable and Memory state a forwarding placeholder."""
        c = ctx()
        before = dict(self.env)
        fwd: dict[str, BValue] = {}
        for n, v in before.items():
            if isinstance(v, dsl.Tile):
                p = BValue(v.type, n)
                fwd[n] = p
                self.env[n] = dsl.Tile(p)
        mfwd: dict[int, tuple[Any, BValue, BValue]] = {}
        for m in c.memories:
            p = BValue(m.state.resolve().type, "state")
            mfwd[id(m)] = (m, m.state, p)
            m.state = p
        return before, fwd, mfwd

    def close_scope(self, before: dict, kind: str, site: Site | None) -> None:
        """Names first bound inside the region become invisible after it.

        "First bound" includes a name whose value before the region was itself
        region-local to an earlier sibling (an ``_Escaped`` marker): rebinding it
        inside this region defines a new local, not an update of visible state,
        so it escapes again (otherwise a third sibling would see the second
        sibling's local as live state and carry it)."""
        for n in list(self.env):
            if n not in before or (isinstance(before[n], _Escaped)
                                   and self.env[n] is not before[n]):
                v = self.env[n]
                if isinstance(v, (dsl.Tile, dsl.ScopeHandle, dsl.MemoryObj, dsl.TensorArg,
                                  dsl.Index, dsl.IndexCond)) or isinstance(v, StagedFunction):
                    self.env[n] = _Escaped(n, site, kind)


class StagedFunction:
    """A function nested in a kernel (``def`` or ``lambda``): calls stage its body
    inline with the caller's builder."""

    def __init__(self, stager: Stager, args: ast.arguments, body: Any, name: str, node: ast.AST):
        self.stager, self.args, self.body, self.name, self.node = stager, args, body, name, node
        self.closure = stager.env

    def __call__(self, *a: Any, **kw: Any) -> Any:
        st = self.stager
        env = dict(self.closure)
        params = [p.arg for p in self.args.posonlyargs + self.args.args]
        defaults = [st.expr(d) for d in self.args.defaults]
        if len(a) > len(params) and self.args.vararg is None:
            raise st.fail(self.node, f"{self.name}() takes {len(params)} arguments, got {len(a)}")
        for i, p in enumerate(params):
            if i < len(a):
                env[p] = a[i]
            elif p in kw:
                env[p] = kw.pop(p)
            else:
                j = i - (len(params) - len(defaults))
                if j < 0:
                    raise st.fail(self.node, f"{self.name}() missing argument '{p}'")
                env[p] = defaults[j]
        if self.args.vararg is not None:
            env[self.args.vararg.arg] = tuple(a[len(params):])
        for p, d in zip(self.args.kwonlyargs, self.args.kw_defaults, strict=True):
            env[p.arg] = kw.pop(p.arg) if p.arg in kw else (st.expr(d) if d is not None else None)
        if kw:
            raise st.fail(self.node, f"{self.name}() got unexpected arguments {sorted(kw)}")
        sub = Stager(st.src, st.globals, env)
        if isinstance(self.body, ast.expr):
            return sub.expr(self.body)
        r = sub.run_body(self.body)
        return None if r is None else r[1]

    def __repr__(self) -> str:
        return f"<kernel-local function {self.name}>"


# ---------------------------------------------------------------------------
# regions


def _yield(values: list[BValue]) -> None:
    ctx().builder.op("yield", values)


class _CarryMixin:
    """Shared exit logic: decide states, resolve placeholders, bind results."""

    st: Stager

    def finish_carry(self, before: dict, fwd: dict, mfwd: dict, block: BBlock,
                     node: ast.AST) -> tuple[list[str], list[Any], list[BValue], list[BValue]]:
        """Returns (state names, memory objects, incoming values, final body values)."""
        env = self.st.env
        names, mems, incoming, finals = [], [], [], []
        for n, p in fwd.items():
            cur = env.get(n)
            if isinstance(cur, dsl.Tile) and cur.v.resolve() is not p:
                names.append(n)
                incoming.append(before[n].v.resolve())
                finals.append(cur.v.resolve())
            elif not isinstance(cur, dsl.Tile) or cur.v.resolve() is p:
                p.forward = before[n].v.resolve()
                env[n] = before[n]
        for m, old, p in mfwd.values():
            if m.state.resolve() is not p:
                mems.append(m)
                incoming.append(old.resolve())
                finals.append(m.state.resolve())
            else:
                p.forward = old.resolve()
                m.state = old
        # host values rebound inside a region would be computed once: reject
        for n, v in before.items():
            if n in fwd or isinstance(v, (dsl.ScopeHandle,)):
                continue
            cur = env.get(n, _UNSET)
            if cur is not v and not isinstance(cur, _Escaped) and not isinstance(v, _Escaped):
                if isinstance(v, (int, float, dsl.Index, dsl.IndexCond, bool)) or isinstance(
                        cur, dsl.Tile):
                    raise CaptureError(
                        f"'{n}' is rebound inside a region but it is a host value "
                        f"({type(v).__name__}) computed once at capture",
                        self.st.site(node),
                        "make it a staged value before the region (e.g. tn.scalar(0, tn.i32)) "
                        "so that the update becomes carried state")
        return names, mems, incoming, finals

    def add_args(self, block: BBlock, fwd: dict, mfwd: dict, names: list[str],
                 mems: list[Any]) -> None:
        args = []
        for n in names:
            p = fwd[n]
            a = BValue(p.type, n)
            p.forward = a
            args.append(a)
        for m in mems:
            p = mfwd[id(m)][2]
            a = BValue(p.type, "state")
            p.forward = a
            args.append(a)
        block.args = args

    def bind_results(self, op: BOp, names: list[str], mems: list[Any]) -> None:
        for n, r in zip(names, op.results, strict=False):
            r.hint = n
            self.st.env[n] = dsl.Tile(r)
        for m, r in zip(mems, op.results[len(names):], strict=True):
            m.state = r


def _domain(shape: dsl.Shape, vars_: tuple[str, ...], labels: str, kind: str
            ) -> tuple[IndexSet, dsl.Shape]:
    space = shape.space(labels=labels, made_by=f"the domain dim of the {kind} region '{labels}'")
    return IndexSet(space, vars_), dsl.space_shape(space)


class RegionStager(_CarryMixin):
    """Stages ``for h in <region>: body``."""

    def __init__(self, st: Stager, node: ast.For, spec: dsl.RegionSpec):
        self.st, self.node, self.spec = st, node, spec

    def run(self) -> Any:
        st, node, spec = self.st, self.node, self.spec
        c = ctx()
        name = node.target.id  # type: ignore[attr-defined]
        site = st.site(node)
        frame = c.frame
        scope = c.scope
        if spec.parent is not None and spec.parent is not scope.handle:
            inner = scope.handle.name if scope.handle is not None else "the kernel root"
            raise CaptureError(
                f"region opened from '{spec.parent.name}' while the innermost open scope is "
                f"{'`' + inner + '`' if scope.handle is not None else inner}",
                site, "open nested regions from the innermost scope handle (or use tn.<kind>)")
        if spec.shape.rank == 0:
            raise CaptureError(f"{spec.kind} domain is empty-rank", site,
                               "give at least one extent, e.g. tn.shape(N)")
        rank = spec.shape.rank
        base = name if rank == 1 else name
        vars_ = tuple(c.builder.fresh_var(base if rank == 1 else f"{base}{i}")
                      for i in range(rank))
        domain, shp = _domain(spec.shape, vars_, name, spec.kind)
        level = frame.level
        attrs: dict[str, Any] = {"vars": vars_, "domain": domain}
        child_coord = None
        if spec.kind == "parallel":
            level = c.next_level
            c.next_level += 1
            c.level_parent[level] = frame.level
            attrs["level"] = level
            ex = spec.exec
            if isinstance(ex, dsl.ExecLayoutSpec):
                out = ex.fn(*(dsl.Index(E.Var(v)) for v in vars_))
                out = out if isinstance(out, (tuple, list)) else (out,)
                from ..semantics.maps import Map

                m = Map(vars_, tuple(dsl.as_expr(o) for o in out))
                child_coord = m.outputs
                ex = ExecPolicy(ex.scope, m)
            if ex is not None:
                attrs["exec"] = ex
        elif spec.kind == "serial":
            attrs["order"] = spec.order
        elif spec.kind == "pipeline":
            attrs["policy"] = spec.policy
        elif spec.kind == "reduce":
            attrs["policy"] = spec.policy
        handle = dsl.ScopeHandle(spec.kind, vars_, shp, level, scope.handle, name, site,
                                 child_coord)
        before, fwd, mfwd = st.open_forwarding()
        st.env[name] = handle
        block = BBlock()
        c.builder.push(block)
        myframe = ScopeFrame(spec.kind, handle, block, level)
        c.frames.append(myframe)
        try:
            r = st.run_body(node.body)
            if r is not None:
                raise CaptureError("return inside a region", site)
        finally:
            c.frames.pop()
            c.builder.pop()
        handle.closed = True
        c.builder.site = site
        names, mems, incoming, finals = self.finish_carry(before, fwd, mfwd, block, node)
        self.add_args(block, fwd, mfwd, names, mems)
        if spec.kind == "pipeline":
            finals = _restructure_stages(block, finals, handle, myframe.stages)
        c.builder.push(block)
        c.builder.site = site
        _yield(finals)
        c.builder.pop()
        if spec.kind == "reduce":
            attrs["contracts"] = _reduce_contracts(block, names, mems, spec, site)
        op = c.builder.op(spec.kind, incoming, attrs, regions=[block],
                          result_types=tuple(v.type for v in incoming))
        # type preservation of states
        for n, a, f in zip(names + ["<memory>"] * len(mems), block.args, finals, strict=True):
            if a.type != f.type:
                (ta, tb), notes = _tstrs(a.type, f.type)
                raise TypeCheckError(
                    f"the {spec.kind} region changes the type of '{n}' from {ta} to {tb}", site,
                    "a carried value keeps its dtype and dims; cast or reduce inside the region",
                    notes=notes)
        self.bind_results(op, names, mems)
        st.env[name] = handle
        st.close_scope(before, spec.kind, site)
        st.env[name] = handle  # closed: any later use is diagnosed
        return None


def _tstr(t: Any, names: dict | None = None) -> str:
    from ..semantics.ops.values import describe_space

    if isinstance(t, TileType):
        return f"{t.dtype}{describe_space(t.space, names)}" if t.rank else str(t.dtype)
    return str(t)


def _tstrs(*ts: Any) -> tuple[list[str], tuple[str, ...]]:
    """Several types printed for one diagnostic: distinct dims that would print
    alike are told apart, with notes saying where each was made."""
    from ..semantics.space import dim_names

    dims = [d for t in ts if isinstance(t, TileType) for d in t.dims]
    names, notes = dim_names(dims)
    return [_tstr(t, names) for t in ts], notes


def stage_cut(handle: dsl.ScopeHandle, name: str | None) -> None:
    """Record a pipeline cursor cut at the current position of the pipeline body."""
    c = ctx()
    f = c.frame
    if f.handle is not handle:
        raise CaptureError(
            f"{handle.name}.stage() must be a top-level statement of the pipeline body",
            c.site(), "stage cuts are unconditional; they cannot be inside nested regions")
    if name is not None and not isinstance(name, str):
        raise CaptureError("stage names are strings")
    if name is not None and any(s[1] == name for s in f.stages):
        raise CaptureError(f"duplicate stage name '{name}' in pipeline '{handle.name}'", c.site(),
                           "stage names label the segments of one pipeline; make them unique")
    f.stages.append((len(f.block.ops), name, c.site()))


def _uses(op: BOp) -> list[BValue]:
    out = [o.resolve() for o in op.operands]
    for r in op.regions:
        for inner in r.ops:
            out.extend(_uses(inner))
    for v in op.attrs.values():
        for leaf in _val_leaves(v):
            out.append(BValue.by_uid(int(leaf.name.split(".")[1])).resolve())
    return out


def _val_leaves(x: Any) -> list[E.Val]:
    if isinstance(x, (E.Expr, E.Pred)):
        return [lf for lf in E.leaves(x) if isinstance(lf, E.Val) and lf.name.startswith("tmp.")]
    if isinstance(x, tuple):
        return [lf for i in x for lf in _val_leaves(i)]
    if isinstance(x, IndexSet):
        return _val_leaves(x.pred)
    return []


def _restructure_stages(block: BBlock, finals: list[BValue], handle: Any,
                        cuts: list) -> list[BValue]:
    """Group a pipeline body's ops into ``stage`` ops at the recorded cuts; values
    a later stage (or the iteration's yield) uses become stage results."""
    if not cuts:
        return finals
    ops = block.ops
    first = cuts[0][0]
    for op in ops[:first]:
        raise CaptureError(
            f"'{op.name}' comes before the first {handle.name}.stage() cut", op.loc,
            "once a pipeline has stage cuts, every operation must follow the first cut")
    bounds = [c[0] for c in cuts] + [len(ops)]
    segments = [ops[bounds[i]:bounds[i + 1]] for i in range(len(cuts))]
    seg_of: dict[int, int] = {}
    for i, seg in enumerate(segments):
        for op in seg:
            for r in op.results:
                seg_of[r.uid] = i
    need: list[list[BValue]] = [[] for _ in segments]
    for i, seg in enumerate(segments):
        for op in seg:
            for u in _uses(op):
                j = seg_of.get(u.uid)
                if j is not None and j < i and u not in need[j]:
                    need[j].append(u)
    for f in finals:
        j = seg_of.get(f.resolve().uid)
        if j is not None and f.resolve() not in need[j]:
            need[j].append(f.resolve())
    new_ops: list[BOp] = []
    for i, seg in enumerate(segments):
        body = BBlock([], list(seg))
        body.ops.append(BOp("yield", list(need[i]), [], {}, [], cuts[i][2]))
        name = cuts[i][1] or f"stage{i}"
        sop = BOp("stage", [], [], {"name": name, "ordinal": i}, [body], cuts[i][2])
        sop.results = [BValue(v.type, v.hint, sop) for v in need[i]]
        for v, r in zip(need[i], sop.results, strict=True):
            v_uid = v.uid
            # later uses refer to the stage result
            for later in segments[i + 1:]:
                for op in later:
                    _replace_use(op, v_uid, r)
            finals = [r if f.resolve().uid == v_uid else f for f in finals]
        new_ops.append(sop)
    block.ops = new_ops
    return finals


def _replace_use(op: BOp, uid: int, new: BValue) -> None:
    op.operands = [new if o.resolve().uid == uid else o for o in op.operands]
    for k, v in list(op.attrs.items()):
        leaves = _val_leaves(v)
        if any(int(lf.name.split(".")[1]) == uid or
               BValue.by_uid(int(lf.name.split(".")[1])).resolve().uid == uid for lf in leaves):
            op.attrs[k] = _subst_attr(v, uid, new)
    for r in op.regions:
        for inner in r.ops:
            _replace_use(inner, uid, new)


def _subst_attr(v: Any, uid: int, new: BValue) -> Any:
    if isinstance(v, (E.Expr, E.Pred)):
        m = {lf: E.Val(new.tmp_name) for lf in _val_leaves(v)
             if BValue.by_uid(int(lf.name.split(".")[1])).resolve().uid == uid}
        return E.subst(v, m)
    if isinstance(v, tuple):
        return tuple(_subst_attr(i, uid, new) for i in v)
    if isinstance(v, IndexSet):
        return IndexSet(v.space, v.vars, _subst_attr(v.pred, uid, new))
    return v


def _reduce_contracts(block: BBlock, names: list[str], mems: list[Any], spec: dsl.RegionSpec,
                      site: Site | None) -> tuple:
    """Infer each state's reducer contract from its update (see spec/reductions.md)."""
    from ..semantics.reducers import BY_OP, BUILTINS

    if mems:
        raise CaptureError("a reduce region cannot store to Memory objects", site,
                           "use a serial region for ordered effects")
    policy: ReductionPolicy = spec.policy
    explicit = spec.contract
    out: list[Any] = []
    args = block.args
    arg_uids = {a.uid for a in args}
    defs: dict[int, BOp] = {}
    for op in block.ops:
        for r in op.results:
            defs[r.uid] = op
        if _writes(op) and policy.is_tree:
            raise ContractError(
                f"'{op.name}' inside a {policy.value} reduce region has no defined order", op.loc,
                "tree policies admit any evaluation order; use policy=tn.fold_left or a serial "
                "region for effects")
    yld = block.ops[-1]
    for i, (n, a) in enumerate(zip(names, args, strict=False)):
        fin = yld.operands[i].resolve()
        contract = None
        if explicit is not None:
            contract = _contract_name(explicit, site)
        else:
            op = defs.get(fin.uid)
            if op is not None and op.name in BY_OP and len(op.operands) == 2:
                x, y = (o.resolve() for o in op.operands)
                other = y if x is a else (x if y is a else None)
                if other is not None and not _depends_on(other, arg_uids, defs):
                    contract = BY_OP[op.name].name
                    if not BUILTINS[contract].accepts(a.type.dtype):
                        contract = None
        if contract is not None and contract.startswith("@") and policy.is_tree:
            red = next(r for r in ctx().reducers if r.name == contract[1:])
            if not red.associative:
                raise ContractError(
                    f"reducer @{red.name} is not associative; policy {policy.value} regroups "
                    "contributions", site, "use policy=tn.fold_left or tn.fold_right")
            if policy is ReductionPolicy.unordered_tree and not red.commutative:
                raise ContractError(
                    f"reducer @{red.name} is not commutative; unordered_tree may permute "
                    "contributions", site,
                    "use policy=tn.ordered_tree (keeps order) or a strict fold")
        if contract is None and policy.is_tree:
            raise ContractError(
                f"the update of '{n}' in this reduce region matches no reducer contract, "
                f"but policy {policy.value} needs one to regroup contributions", site,
                "write the update as `s = s + x` / `s += x` / `s = tn.maximum(s, x)` with x "
                "independent of the states, pass contract=..., or choose a strict fold: "
                "policy=tn.fold_left (or tn.fold_right)")
        out.append(contract)
    return tuple(out)


def _contract_name(c: Any, site: Site | None) -> str:
    from ..semantics.reducers import BUILTINS, CustomReducer

    if isinstance(c, dsl.Fn) and c.reducer:
        return c.reducer
    if isinstance(c, str) and c in BUILTINS:
        return c
    if isinstance(c, CustomReducer):
        return "@" + c.name
    raise CaptureError(f"{c!r} is not a reducer contract", site,
                       "use tn.add, tn.mul, tn.maximum, tn.minimum, ... or tn.reducer(...)")


def _writes(op: BOp) -> bool:
    """Whether ``op`` (or a nested op) writes memory or a tensor."""
    if op.name in ("tensor.store", "memory.store"):
        return True
    return any(_writes(i) for r in op.regions for i in r.ops)


def _traits(op: BOp) -> frozenset:
    from ..semantics.ops import REGISTRY

    t = set(REGISTRY[op.name].traits)
    for r in op.regions:
        for inner in r.ops:
            t |= _traits(inner)
    return frozenset(t)


def _depends_on(v: BValue, uids: set[int], defs: dict[int, BOp]) -> bool:
    seen: set[int] = set()
    stack = [v.resolve()]
    while stack:
        x = stack.pop()
        if x.uid in uids:
            return True
        if x.uid in seen:
            continue
        seen.add(x.uid)
        op = defs.get(x.uid)
        if op is not None:
            stack.extend(_uses(op))
    return False


class IfStager(_CarryMixin):
    """Stages ``if tn.if_(c): A else: B`` as an ``if`` op whose results are the
    variables either branch reassigns."""

    def __init__(self, st: Stager, node: ast.If, cond: Any):
        self.st, self.node, self.cond = st, node, cond

    def run(self) -> Any:
        st, node = self.st, self.node
        c = ctx()
        site = st.site(node)
        cond = self.cond
        if isinstance(cond, dsl.IndexCond):
            cond = cond.value()
        if isinstance(cond, bool):
            cond = dsl._literal_tile(cond, D.bool_)
        if not isinstance(cond, dsl.Tile) or not cond.type.is_scalar or not cond.dtype.is_bool:
            raise CaptureError("tn.if_ needs a bool scalar condition", site,
                               "reduce a tile condition first (e.g. with tn.reduce(..., tn.logical_or))")
        before_env = dict(st.env)
        # a Memory declared inside a branch is local to it: only the Memories
        # live before the if can carry a new state out of it
        live = list(c.memories)
        mem_states = {id(m): m.state for m in live}
        branches = []
        for body in (node.body, node.orelse):
            st.env.clear()
            st.env.update(before_env)
            c.memories[:] = live
            for m in live:
                m.state = mem_states[id(m)]
            block = BBlock()
            c.builder.push(block)
            c.frames.append(ScopeFrame("if", None, block, c.level))
            try:
                if st.run_body(body) is not None:
                    raise CaptureError("return inside tn.if_", site)
            finally:
                c.frames.pop()
                c.builder.pop()
            branches.append((block, dict(st.env), {id(m): m.state for m in live}))
        c.memories[:] = live
        # results: names reassigned in either branch (defined before), or new in both
        names: list[str] = []
        for n in set(branches[0][1]) | set(branches[1][1]):
            vals = [b[1].get(n, _UNSET) for b in branches]
            old = before_env.get(n, _UNSET)
            if isinstance(old, _Escaped):
                old = _UNSET  # region-local to an earlier region: not visible here
            changed = any(v is not old for v in vals)
            if not changed:
                continue
            if all(isinstance(v, dsl.Tile) for v in vals):
                names.append(n)
            elif old is _UNSET:
                continue
            elif isinstance(old, dsl.Tile):
                names.append(n)
            else:
                raise CaptureError(f"host value '{n}' is rebound inside tn.if_", site,
                                   "only staged values can differ between branches")
        names.sort()
        mems = [m for m in c.memories
                if any(b[2][id(m)].resolve() is not mem_states[id(m)].resolve()
                       for b in branches)]
        outs = []
        for block, env_b, mst in branches:
            vals = []
            for n in names:
                v = env_b.get(n, before_env.get(n))
                if not isinstance(v, dsl.Tile):
                    raise CaptureError(f"'{n}' is assigned in only one branch of tn.if_ and "
                                       "has no value before it", site,
                                       "define it before the if")
                vals.append(v.v.resolve())
            vals += [mst[id(m)].resolve() for m in mems]
            c.builder.push(block)
            c.builder.site = site
            _yield(vals)
            c.builder.pop()
            outs.append(vals)
        for i, n in enumerate(names):
            if outs[0][i].type != outs[1][i].type:
                (ta, tb), notes = _tstrs(outs[0][i].type, outs[1][i].type)
                raise TypeCheckError(f"'{n}' has type {ta} in one branch of tn.if_ and {tb} in "
                                     "the other", site,
                                     "both branches must give a value of one dtype and dims",
                                     notes=notes)
        st.env.clear()
        st.env.update(before_env)
        for m in c.memories:
            m.state = mem_states[id(m)]
        c.builder.site = site
        op = c.builder.op("if", [cond.v], {}, tuple(v.type for v in outs[0]),
                          regions=[branches[0][0], branches[1][0]])
        self.bind_results(op, names, mems)
        # names new in only one branch are not visible after
        for n in set(branches[0][1]) | set(branches[1][1]):
            if n not in names and (n not in before_env or (
                    isinstance(before_env[n], _Escaped)
                    and any(b[1].get(n) is not before_env[n] for b in branches))):
                st.env[n] = _Escaped(n, site, "tn.if_")
        return None


class WhileStager(_CarryMixin):
    """Stages ``while tn.while_(cond): body``: a ``cond`` region re-evaluating the
    condition on the carried values and a ``body`` region updating them."""

    def __init__(self, st: Stager, node: ast.While):
        self.st, self.node = st, node

    def run(self) -> Any:
        st, node = self.st, self.node
        c = ctx()
        site = st.site(node)
        before, fwd, mfwd = st.open_forwarding()
        cond_block = BBlock()
        c.builder.push(cond_block)
        c.frames.append(ScopeFrame("while", None, cond_block, c.level))
        try:
            call = node.test
            assert isinstance(call, ast.Call)
            if len(call.args) != 1:
                raise CaptureError("tn.while_ takes one condition", site)
            cv = st.expr(call.args[0])
            if isinstance(cv, dsl.IndexCond):
                cv = cv.value()
            if not isinstance(cv, dsl.Tile) or not cv.type.is_scalar or not cv.dtype.is_bool:
                raise CaptureError("tn.while_ needs a bool scalar condition", site)
            if len(cond_block.ops) == 0 or any("effect" in _traits(o) for o in cond_block.ops):
                pass
        finally:
            c.frames.pop()
            c.builder.pop()
        body = BBlock()
        c.builder.push(body)
        c.frames.append(ScopeFrame("while", None, body, c.level))
        try:
            if st.run_body(node.body) is not None:
                raise CaptureError("return inside tn.while_", site)
        finally:
            c.frames.pop()
            c.builder.pop()
        names, mems, incoming, finals = self.finish_carry(before, fwd, mfwd, body, node)
        # both regions see the same carried arguments
        self.add_args(body, fwd, mfwd, names, mems)
        cond_block.args = [BValue(a.type, a.hint) for a in body.args]
        for p, a in zip([fwd[n] for n in names] + [mfwd[id(m)][2] for m in mems],
                        cond_block.args, strict=True):
            _redirect_block(cond_block, p.forward, a)
        c.builder.push(cond_block)
        c.builder.site = site
        _yield([cv.v.resolve()])
        c.builder.pop()
        c.builder.push(body)
        c.builder.site = site
        _yield(finals)
        c.builder.pop()
        c.builder.site = site
        op = c.builder.op("while", incoming, {}, regions=[cond_block, body],
                          result_types=tuple(v.type for v in incoming))
        for n, a, f in zip(names, body.args, finals, strict=False):
            if a.type != f.type:
                (ta, tb), notes = _tstrs(a.type, f.type)
                raise TypeCheckError(f"the while loop changes the type of '{n}' from {ta} to {tb}",
                                     site, "a carried value keeps its dtype and dims; cast or "
                                           "reduce inside the loop", notes=notes)
        self.bind_results(op, names, mems)
        st.close_scope(before, "tn.while_", site)
        return None


def _redirect_block(block: BBlock, old: BValue | None, new: BValue) -> None:
    if old is None:
        return
    for op in block.ops:
        _replace_use(op, old.uid, new)
