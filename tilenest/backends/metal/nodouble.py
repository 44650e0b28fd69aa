"""The f64 refusal of the Metal target: Apple GPUs have no double.

A program whose arguments, values or op attributes have dtype f64 cannot
keep its numerical contract on Metal (nothing can hold the value), so it is
refused before lowering, with the op and the user's source line. Operations
that other targets evaluate *through* f64 for narrower dtypes (16-bit
transcendentals, ``pow``, ``atan2``, float <-> 64-bit integer conversions)
are not refused: the Metal emitter computes them in float alone
(``tn_mathf.h``).
"""

from __future__ import annotations

from typing import Any

from ...errors import NotAvailableError
from ...semantics.dtypes import DType
from ...semantics.ir import TileProgram

HINT = "use f32 (or f16/bf16), or compile for the llvm or cuda target"


def _has_f64(x: Any) -> bool:
    """Whether ``x`` (a type, a dtype, an attribute value) is or holds f64."""
    if isinstance(x, DType):
        return x.name == "f64"
    dt = getattr(x, "dtype", None)
    if isinstance(dt, DType):
        return dt.name == "f64"
    if isinstance(x, (tuple, list)):
        return any(_has_f64(y) for y in x)
    return False


def refuse_f64(program: TileProgram) -> None:
    """Raise :class:`~tilenest.errors.NotAvailableError` at the first f64
    argument (the kernel's line) or op (its own line) of ``program``."""
    for a in program.args:
        if _has_f64(a.type):
            raise NotAvailableError(f"argument '{a.name}' of kernel {program.name} has dtype "
                                    "f64, which Metal does not have (Apple GPUs have no "
                                    "double)", program.loc, HINT)
    for op in program.walk():
        vals = [v for v in (*op.results, *op.operands) if _has_f64(v.type)]
        attrs = [k for k, v in op.attrs.items() if _has_f64(v)]
        if vals or attrs:
            what = f"value %{vals[0].name}" if vals else f"attribute '{attrs[0]}'"
            raise NotAvailableError(f"op '{op.name}' computes in f64 ({what}), which Metal "
                                    "does not have (Apple GPUs have no double)",
                                    op.loc or program.loc, HINT)
