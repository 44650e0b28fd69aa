"""Cases for spec/interchange.md (I-1 .. I-19): hand-written TileIR text and JSON.

Positive cases read, verify and run; negative cases must be rejected by the
reader with a parse error."""

from __future__ import annotations

import json

import tilenest as tn
from tilenest import f32
from common import arange, case, normal, out, s, t, text_case

F = "f32"

#: a small canonical program: y[i] = a * x[i] in blocks of 4 (the tail masked)
SCALE = """kernel @scale(%x: tensor<f32, [#x_0:N]>, %y: tensor<f32, [#y_0:N]>, %a: f32)
    syms [N] assume [N >= 1] dims [#x_0 = "x.0", #y_0 = "y.0", #d2] {
  parallel {vars = ($p), domain = {($p) in [#d2:(N + 3) // 4]}, level = 1, exec = exec(scope = block)} {
  ^():
    %v = tensor.load %x {vars = ($0), map = ($0 + 4*$p), valid = $0 + 4*$p < N, bounds = zero} : tile<f32, [#x_0:4]>
    %w = mul %v, %a : tile<f32, [#x_0:4]>
    tensor.store %y, %w {vars = ($0), map = ($0 + 4*$p), valid = true, bounds = zero}
    yield
  }
}
"""
SCALE_ARGS = [t("x", F, [10], normal(1)), out("y", F, [10]), s("a", F, 2.5)]


def scale(*edits: tuple[str, str]) -> str:
    text = SCALE
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    return text


# ---------------------------------------------------------------- I-1 round trip

text_case("I01-canonical-text", "I-1", "the printer's canonical form reads and runs", SCALE,
          SCALE_ARGS)


@case("I01-json-form", ("I-1", "I-16"), "the JSON form of a captured kernel runs the same",
      [t("x", F, [3, 5], normal(2)), out("y", F, [3, 5])], json=True)
@tn.kernel
def i01_softmax(x: tn.Tensor[f32, 2], y: tn.Tensor[f32, 2]):
    rows, cols = x.shape
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(rows)):
        row = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
        m = tn.reduce(row, row.dim(1), tn.maximum)
        e = tn.exp(row - m)
        y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(e / tn.reduce(e, e.dim(1), tn.add))


def _json_of(k, edit=None) -> str:  # type: ignore[no-untyped-def]
    from tilenest.semantics.jsonio import to_json

    d = to_json(k.program)

    def drop(o):  # type: ignore[no-untyped-def]
        if isinstance(o, dict):
            o.pop("loc", None)
            for v in o.values():
                drop(v)
        elif isinstance(o, list):
            for v in o:
                drop(v)

    drop(d)
    if edit is not None:
        edit(d)
    return json.dumps(d, indent=1) + "\n"


def _schema2(d):  # type: ignore[no-untyped-def]
    d["schema"] = "tilenest.tileir/2"


text_case("I01-unknown-version", ("I-1", "I-16"), "a reader refuses another schema version",
          _json_of(i01_softmax, _schema2), [t("x", F, [3, 5], normal(2)), out("y", F, [3, 5])],
          "parse", json=True)

# ---------------------------------------------------------------- I-2 names

text_case("I02-dotted-names", "I-2", "value names may hold dots and digits",
          scale(("%v", "%v.0_in"), ("%w", "%w.1"), ("%v.0_in = ", "%v.0_in = "),
                ("mul %v.0_in, %a", "mul %v.0_in, %a")), SCALE_ARGS)

text_case("I02-bad-value-name", "I-2", "'-' is not a name character",
          scale(("%w = mul %v", "%w-1 = mul %v"), ("store %y, %w", "store %y, %w-1")),
          SCALE_ARGS, "parse")

# ---------------------------------------------------------------- I-3 dim table

text_case("I03-labels", "I-3", "dim labels are kept verbatim; names are only handles",
          scale(('#x_0 = "x.0", #y_0 = "y.0", #d2', '#x_0 = "x axis 0", #y_0 = "", #d2 = "p.0"')),
          SCALE_ARGS)

text_case("I03-unknown-dim", "I-3", "a dim not in the table", scale(("tile<f32, [#x_0:4]>\n    %w",
                                                                    "tile<f32, [#q:4]>\n    %w")),
          SCALE_ARGS, "parse")

# ---------------------------------------------------------------- I-4 references

text_case("I04-nested-visibility", "I-4", "a value is visible in every block nested below it",
          scale(("  parallel {", "  %two = const {value = 2.0} : f32\n  parallel {"),
                ("%w = mul %v, %a", "%u = mul %v, %two : tile<f32, [#x_0:4]>\n    %w = mul %u, %a")),
          SCALE_ARGS)

text_case("I04-operand-count", "I-4", "an op with an operand count its schema refuses",
          scale(("%w = mul %v, %a", "%w = mul %v")), SCALE_ARGS, "parse")

text_case("I04-used-before-definition", "I-4", "a value used before its definition",
          scale(("%v = tensor.load", "%w0 = mul %w, %a : tile<f32, [#x_0:4]>\n    %v = tensor.load")),
          SCALE_ARGS, "parse")

# ---------------------------------------------------------------- I-5 op ids

text_case("I05-ids-not-in-text", "I-5", "op ids are not part of the form: no 'oid' attribute",
          scale(("%w = mul %v, %a :", "%w = mul %v, %a {oid = 3} :")), SCALE_ARGS, "parse")

text_case("I05-preorder-program", "I-5", "a program with nested regions (ids in pre-order) runs",
          scale(("    %w = mul %v, %a : tile<f32, [#x_0:4]>\n",
                 "    %c = const {value = true} : bool\n"
                 "    %w = if %c : tile<f32, [#x_0:4]> {\n    ^():\n"
                 "      %w1 = mul %v, %a : tile<f32, [#x_0:4]>\n      yield %w1\n    } {\n"
                 "    ^():\n      yield %v\n    }\n")), SCALE_ARGS)

# ---------------------------------------------------------------- I-6 lexical structure

text_case("I06-comments-and-floordiv", "I-6", "whole-line comments; '//' elsewhere is division",
          "// scale every other element\n" + scale(
              ("  parallel {", "    // a comment line inside the body\n  parallel {"),
              ("map = ($0 + 4*$p), valid = $0 + 4*$p < N", "map = (($0 + 8*$p) // 2), "
                                                         "valid = ($0 + 8*$p) // 2 < N")),
          SCALE_ARGS)

text_case("I06-trailing-comment", "I-6", "a '//' after text on a line is the operator",
          scale(("    yield\n  }", "    yield // end of body\n  }")), SCALE_ARGS, "parse")

# ---------------------------------------------------------------- I-7 header

text_case("I07-minimal-header", "I-7", "syms, assume, dims may be left out when empty",
          "kernel @k(%x: tensor<f32, [#a:4]>, %y: tensor<f32, [#b:4]>) dims [#a, #b] {\n"
          "  %v = tensor.load %x {vars = ($0), map = ($0), valid = true, bounds = zero} : "
          "tile<f32, [#a:4]>\n"
          "  %w = neg %v : tile<f32, [#a:4]>\n"
          "  tensor.store %y, %w {vars = ($0), map = ($0), valid = true, bounds = zero}\n}\n",
          [t("x", F, [4], arange(1)), out("y", F, [4])])

text_case("I07-header-without-body", "I-7", "the kernel needs its braces",
          "kernel @k(%x: tensor<f32, [#a:4]>) dims [#a]\n", [t("x", F, [4], arange(1))], "parse")

# ---------------------------------------------------------------- I-8 operations

text_case("I08-multi-result", "I-8", "'%a, %b =' names two results of one op",
          "kernel @fib(%y: tensor<i64, [#y:2]>) syms [] dims [#y, #t] {\n"
          "  %z = const {value = 0} : tile<i64, [#y:1]>\n"
          "  %o = const {value = 1} : tile<i64, [#y:1]>\n"
          "  %a, %b = serial %z, %o {vars = ($t), domain = {($t) in [#t:10]}, "
          "order = \"forward\"} : tile<i64, [#y:1]>, tile<i64, [#y:1]> {\n"
          "  ^(%p: tile<i64, [#y:1]>, %q: tile<i64, [#y:1]>):\n"
          "    %r = add %p, %q : tile<i64, [#y:1]>\n"
          "    yield %q, %r\n  }\n"
          "  tensor.store %y, %a {vars = ($0), map = ($0), valid = true, bounds = zero}\n"
          "  tensor.store %y, %b {vars = ($0), map = ($0 + 1), valid = true, bounds = zero}\n}\n",
          [out("y", "i64", [2])])

text_case("I08-results-vs-types", "I-8", "results and types must pair up",
          scale(("%w = mul %v, %a : tile<f32, [#x_0:4]>",
                 "%w = mul %v, %a : tile<f32, [#x_0:4]>, f32")), SCALE_ARGS, "parse")

# ---------------------------------------------------------------- I-9 types

text_case("I09-memory-and-state-types", "I-9", "memory types with layout and resource; state tokens",
          "kernel @m(%x: tensor<f32, [#a:4]>, %y: tensor<f32, [#b:4]>) syms [] dims [#a, #b, #m] {\n"
          "  %v = tensor.load %x {vars = ($0), map = ($0), valid = true, bounds = zero} : "
          "tile<f32, [#a:4]>\n"
          "  %mem, %s0 = memory.alloc : memory<f32, [#m:4], layout = ($0) -> 2*$0 size 7, "
          "resource = shared>, state<%mem>\n"
          "  %s1 = memory.store %mem, %s0, %v : state<%mem>\n"
          "  %r = memory.load %mem, %s1 : tile<f32, [#m:4]>\n"
          "  tensor.store %y, %r {vars = ($0), map = ($0), valid = true, bounds = zero}\n}\n",
          [t("x", F, [4], arange(1)), out("y", F, [4])])

text_case("I09-unknown-dtype", "I-9", "dtypes are a closed list",
          scale(("%a: f32)", "%a: f8)")), SCALE_ARGS, "parse")

# ---------------------------------------------------------------- I-10 expressions

text_case("I10-expression-forms", "I-10", "min, max, bitwise ops and boolean predicates",
          scale(("map = ($0 + 4*$p), valid = $0 + 4*$p < N, bounds = zero} : tile<f32, [#x_0:4]>",
                 "map = (min($0 + 4*$p, N - 1)), valid = not ($0 + 4*$p >= N or $0 < 0) and "
                 "max($p, 0) == $p, bounds = zero} : tile<f32, [#x_0:4]>"),
                ("tensor.store %y, %w {vars = ($0), map = ($0 + 4*$p)",
                 "tensor.store %y, %w {vars = ($0), map = (($0 ^ 0) + ($p << 2))")),
          SCALE_ARGS)

text_case("I10-chained-comparison", "I-10", "comparisons do not chain",
          scale(("valid = $0 + 4*$p < N", "valid = 0 <= $0 + 4*$p < N")), SCALE_ARGS, "parse")

# ---------------------------------------------------------------- I-11 attribute values

text_case("I11-number-spellings", "I-11", "-0.0, inf, nan and exponents re-read with their types",
          "kernel @c(%y: tensor<f32, [#a:5]>) syms [] dims [#a] {\n"
          "  %p = const {value = -0.0} : tile<f32, [#a:1]>\n"
          "  %q = const {value = inf} : tile<f32, [#a:1]>\n"
          "  %r = const {value = nan} : tile<f32, [#a:1]>\n"
          "  %s = const {value = 2.5e-07} : tile<f32, [#a:1]>\n"
          "  %u = const {value = -inf} : tile<f32, [#a:1]>\n"
          "  tensor.store %y, %p {vars = ($0), map = ($0), valid = true, bounds = zero}\n"
          "  tensor.store %y, %q {vars = ($0), map = ($0 + 1), valid = true, bounds = zero}\n"
          "  tensor.store %y, %r {vars = ($0), map = ($0 + 2), valid = true, bounds = zero}\n"
          "  tensor.store %y, %s {vars = ($0), map = ($0 + 3), valid = true, bounds = zero}\n"
          "  tensor.store %y, %u {vars = ($0), map = ($0 + 4), valid = true, bounds = fill(-inf)}\n"
          "}\n", [out("y", F, [5])])

text_case("I11-wrong-kind", "I-11", "a bounds attribute that is a number",
          scale(("valid = true, bounds = zero}", "valid = true, bounds = 3}")), SCALE_ARGS,
          "parse")

# ---------------------------------------------------------------- I-12 custom reducers

REDUCER = """kernel @r(%x: tensor<i32, [#a:6]>, %y: tensor<i32, [#b:1]>) syms [] dims [#a, #b, #r] {
  reducer @bor(state = [i32], identity = [0], associative = true, commutative = true) merge {
  ^(%p: i32, %q: i32):
    %c = or %p, %q : i32
    yield %c
  } lift {
  ^(%v: i32):
    %one = const {value = 1} : i32
    %l = shl %one, %v : i32
    yield %l
  }
  %v = tensor.load %x {vars = ($0), map = ($0), valid = true, bounds = zero} : tile<i32, [#a:6]>
  %z = const {value = 0} : i32
  %s = reduce %z {vars = ($r), domain = {($r) in [#r:6]}, policy = unordered_tree, contracts = [@bor]} : i32 {
  ^(%acc: i32):
    %e = reindex %v {vars = (), map = ($r)} : i32
    %one = const {value = 1} : i32
    %bit = shl %one, %e : i32
    %n = or %acc, %bit : i32
    yield %n
  }
  %b = broadcast %s : tile<i32, [#b:1]>
  tensor.store %y, %b {vars = ($0), map = ($0), valid = true, bounds = zero}
}
"""

text_case("I12-reducer-with-lift", "I-12", "a custom reducer with merge and lift blocks", REDUCER,
          [t("x", "i32", [6], {"pattern": "values", "values": [0, 3, 3, 5, 1, 0]}),
           out("y", "i32", [1])])

text_case("I12-reducer-sees-kernel-value", "I-12", "merge blocks are isolated from the kernel",
          REDUCER.replace("    %c = or %p, %q : i32", "    %c = or %p, %z : i32"),
          [t("x", "i32", [6], {"pattern": "values", "values": [0, 3, 3, 5, 1, 0]}),
           out("y", "i32", [1])], "parse")

# ---------------------------------------------------------------- I-13 locations

text_case("I13-locations", "I-13", "locations after types and on the header",
          scale(("dims [#x_0 = \"x.0\", #y_0 = \"y.0\", #d2] {",
                 "dims [#x_0 = \"x.0\", #y_0 = \"y.0\", #d2] loc(\"scale.py\":3:0) {"),
                ("%w = mul %v, %a : tile<f32, [#x_0:4]>",
                 "%w = mul %v, %a : tile<f32, [#x_0:4]> loc(\"scale.py\":6:8)"),
                ("    yield\n", "    yield loc(9:4)\n")), SCALE_ARGS)

text_case("I13-bad-location", "I-13", "a location needs line and column",
          scale(("%w = mul %v, %a : tile<f32, [#x_0:4]>",
                 "%w = mul %v, %a : tile<f32, [#x_0:4]> loc(6)")), SCALE_ARGS, "parse")

# ---------------------------------------------------------------- I-14 diagnostics, I-15 grammar

text_case("I15-free-layout", ("I-15", "I-14"), "whitespace, tabs and line breaks are free",
          scale(("{vars = ($0), map = ($0 + 4*$p), valid = $0 + 4*$p < N, bounds = zero}",
                 "{\tvars = ($0),\n        map = ($0 + 4 * $p),\n\tvalid = $0 + 4*$p < N ,"
                 " bounds = zero }")), SCALE_ARGS)

text_case("I15-unbalanced", ("I-15", "I-14"), "a syntax error: the body never closes",
          scale(("    yield\n  }\n}\n", "    yield\n  }\n")), SCALE_ARGS, "parse")

text_case("I14-unknown-op", "I-14", "an unknown op name is a parse error at the name",
          scale(("%w = mul %v, %a", "%w = multiply %v, %a")), SCALE_ARGS, "parse")

# ---------------------------------------------------------------- I-16 .. I-18 JSON


def _plain_floats(d):  # type: ignore[no-untyped-def]
    def walk(o):  # type: ignore[no-untyped-def]
        if isinstance(o, dict):
            for k, v in list(o.items()):
                if isinstance(v, dict) and set(v) == {"float"} and v["float"] not in (
                        "inf", "-inf", "nan", "-0.0"):
                    o[k] = float(v["float"])
                else:
                    walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(d)


@tn.kernel
def i16_affine(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
        v = x[tn.coord(p.index() * 4 + 1), tn.shape(4)]
        y(tn.coord(p.index() * 4), tn.shape(4)).store(v * 0.5 + 1.25)


text_case("I18-plain-json-floats", ("I-18", "I-16"), "readers accept plain JSON floats",
          _json_of(i16_affine, _plain_floats), [t("x", F, [9], normal(4)), out("y", F, [9])],
          json=True)


def _noncanonical(d):  # type: ignore[no-untyped-def]
    """Rewrite every map `a + 4*p` as the non-canonical tree p*4 + a (readers canonicalize)."""
    def walk(o):  # type: ignore[no-untyped-def]
        if isinstance(o, dict):
            if "add" in o and isinstance(o["add"], list):
                o["add"] = list(reversed(o["add"]))
            if "mul" in o and isinstance(o["mul"], list):
                o["mul"] = list(reversed(o["mul"]))
            for v in o.values():
                walk(v)
        elif isinstance(o, list):
            for v in o:
                walk(v)

    walk(d)


text_case("I17-noncanonical-trees", "I-17", "expression trees in any order are canonicalized",
          _json_of(i16_affine, _noncanonical), [t("x", F, [9], normal(4)), out("y", F, [9])],
          json=True)


def _bad_tree(d):  # type: ignore[no-untyped-def]
    for op in d["body"]["ops"]:
        if op["op"] == "parallel":
            inner = op["regions"][0]["ops"][0]
            inner["attrs"]["map"] = [{"pow": [{"var": "0"}, {"const": 2}]}]


text_case("I17-unknown-tree", "I-17", "an expression tree with an unknown key",
          _json_of(i16_affine, _bad_tree), [t("x", F, [9], normal(4)), out("y", F, [9])],
          "parse", json=True)

text_case("I18-invalid-json", "I-18", "a document that is not JSON",
          _json_of(i16_affine)[:-40] + "\n", [t("x", F, [9], normal(4)), out("y", F, [9])],
          "parse", json=True)


def _no_schema_body(d):  # type: ignore[no-untyped-def]
    d["body"]["ops"][0]["attrs"]["vars"] = "p"


text_case("I16-wrong-shape", "I-16", "an attribute of the wrong JSON shape is located by path",
          _json_of(i16_affine, _no_schema_body), [t("x", F, [9], normal(4)), out("y", F, [9])],
          "parse", json=True)


# ---------------------------------------------------------------- I-19 modules


def _module_of_one(text: str) -> str:
    """A module document holding one program document (I-19)."""
    return json.dumps({"schema": "tilenest.tileir/1", "kernels": [json.loads(text)]},
                      indent=1) + "\n"


text_case("I19-module-document-of-one", ("I-19", "I-16"),
          "a JSON module document of one kernel reads as that kernel",
          _module_of_one(_json_of(i16_affine)), [t("x", F, [9], normal(4)), out("y", F, [9])],
          json=True)

text_case("I19-kernel-defined-twice", "I-19", "kernel names of one module are distinct",
          SCALE + "\n" + SCALE, SCALE_ARGS, "parse")
