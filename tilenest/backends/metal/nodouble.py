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

from ...errors import NotAvailableError
from ...semantics.ir import TileProgram

HINT = "use f32 (or f16/bf16), or compile for the llvm or cuda target"


def refuse_f64(program: TileProgram) -> None:
    """Raise :class:`~tilenest.errors.NotAvailableError` at the first f64
    argument (the kernel's site) or op (its own site) of ``program``."""
    use = program.first_use_of("f64")
    if use is None:
        return
    what, detail, site = use
    if detail:
        msg = f"{what} computes in f64 ({detail})"
    else:
        msg = f"{what} has dtype f64"
    raise NotAvailableError(f"{msg}, which Metal does not have (Apple GPUs have no double)",
                            site, HINT)
