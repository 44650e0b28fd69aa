"""Lifted elementwise functions of the DSL (``tn.exp``, ``tn.maximum``, ...).

Each is the elementwise lifting of one scalar op (see ``semantics/ops/values.py``).
Binary functions that are also reducer merges carry the reducer's name, so
``tn.reduce(x, d, tn.maximum)`` and ``contract=tn.add`` work.
"""

from .dsl import Fn

add = Fn("add", 2, "add")
sub = Fn("sub", 2)
mul = Fn("mul", 2, "mul")
div = Fn("div", 2)
rem = Fn("rem", 2)
floordiv = Fn("floordiv", 2)
mod = Fn("mod", 2)
maximum = Fn("maximum", 2, "max")
minimum = Fn("minimum", 2, "min")
pow = Fn("pow", 2)  # noqa: A001
atan2 = Fn("atan2", 2)
logical_and = Fn("and", 2, "and")
logical_or = Fn("or", 2, "or")
logical_xor = Fn("xor", 2, "xor")
bitwise_and = logical_and
bitwise_or = logical_or
bitwise_xor = logical_xor
shl = Fn("shl", 2)
shr = Fn("shr", 2)
neg = Fn("neg", 1)
abs = Fn("abs", 1)  # noqa: A001
exp = Fn("exp", 1)
exp2 = Fn("exp2", 1)
log = Fn("log", 1)
log2 = Fn("log2", 1)
log1p = Fn("log1p", 1)
expm1 = Fn("expm1", 1)
sqrt = Fn("sqrt", 1)
rsqrt = Fn("rsqrt", 1)
sin = Fn("sin", 1)
cos = Fn("cos", 1)
tanh = Fn("tanh", 1)
erf = Fn("erf", 1)
sigmoid = Fn("sigmoid", 1)
floor = Fn("floor", 1)
ceil = Fn("ceil", 1)
trunc = Fn("trunc", 1)
round = Fn("round", 1)  # noqa: A001
isnan = Fn("isnan", 1)
isinf = Fn("isinf", 1)
isfinite = Fn("isfinite", 1)
signbit = Fn("signbit", 1)
logical_not = Fn("not", 1)
bitwise_not = Fn("bitnot", 1)

__all__ = [
    "add", "sub", "mul", "div", "rem", "floordiv", "mod", "maximum", "minimum", "pow", "atan2",
    "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
    "shl", "shr", "neg", "abs", "exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt",
    "rsqrt", "sin", "cos", "tanh", "erf", "sigmoid", "floor", "ceil", "trunc", "round",
    "isnan", "isinf", "isfinite", "signbit", "logical_not", "bitwise_not",
]
