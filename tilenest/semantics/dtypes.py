"""Element types of tiles, tensors and memories.

A :class:`DType` is an exact storage/arithmetic format. Its meaning is the set of
values of the corresponding numpy (or ``ml_dtypes``) type, with IEEE
round-to-nearest-even for floating point and two's-complement wrap-around for
integers. Changing the dtype never changes execution structure.

The two FP8 formats are storage formats: ``f8e4m3fn`` (1 sign, 4 exponent
bits with bias 7, 3 fraction bits; finite through +-448, signed zeros, NaN
only as ``S.1111.111``, no infinities) and ``f8e5m2`` (bias 15, 2 fraction
bits; finite through +-57344, infinities and NaNs as in IEEE). Arithmetic
does not take them (:data:`FP8_OPS` says which ops do); a cast into one
states its overflow policy (``spec/values.md``).

``ml_dtypes`` (which holds ``bfloat16`` and the FP8 formats, and takes most of
a second to load) is imported the first time such a value needs its numpy
type, not when tilenest is imported.
"""

from __future__ import annotations

from dataclasses import dataclass

import sys

import numpy as np


@dataclass(frozen=True)
class DType:
    """An element format: ``kind`` is ``b`` (bool), ``i``/``u`` (integers) or ``f``."""

    name: str
    kind: str
    bits: int

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in ("i", "u")

    @property
    def is_signed(self) -> bool:
        return self.kind == "i"

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def is_fp8(self) -> bool:
        """One of the 8-bit float storage formats (``f8e4m3fn``, ``f8e5m2``)."""
        return self.kind == "f" and self.bits == 8

    @property
    def np(self) -> np.dtype:
        """The numpy dtype holding exactly this format."""
        return _NUMPY.get(self.name) or _ml_dtype(self.name)

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    def __repr__(self) -> str:
        return self.name

    __str__ = __repr__


bool_ = DType("bool", "b", 8)
i8 = DType("i8", "i", 8)
i16 = DType("i16", "i", 16)
i32 = DType("i32", "i", 32)
i64 = DType("i64", "i", 64)
u8 = DType("u8", "u", 8)
u16 = DType("u16", "u", 16)
u32 = DType("u32", "u", 32)
u64 = DType("u64", "u", 64)
f8e4m3fn = DType("f8e4m3fn", "f", 8)
f8e5m2 = DType("f8e5m2", "f", 8)
f16 = DType("f16", "f", 16)
bf16 = DType("bf16", "f", 16)
f32 = DType("f32", "f", 32)
f64 = DType("f64", "f", 64)

ALL: tuple[DType, ...] = (bool_, i8, i16, i32, i64, u8, u16, u32, u64, f8e4m3fn, f8e5m2, f16,
                          bf16, f32, f64)
#: the FP8 storage formats
FP8: tuple[DType, ...] = (f8e4m3fn, f8e5m2)
BY_NAME: dict[str, DType] = {d.name: d for d in ALL}

_NUMPY: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
    "u8": np.dtype(np.uint8),
    "u16": np.dtype(np.uint16),
    "u32": np.dtype(np.uint32),
    "u64": np.dtype(np.uint64),
    "f16": np.dtype(np.float16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
}



#: the ``ml_dtypes`` type of each format numpy lacks
ML_DTYPES = {"bf16": "bfloat16", "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}


def _ml_dtype(name: str) -> np.dtype:
    """numpy's dtype of the ``ml_dtypes`` type of format ``name``, importing
    ml_dtypes on first use (then every such format is known to numpy)."""
    import ml_dtypes

    for n, t in ML_DTYPES.items():
        _NUMPY[n] = np.dtype(getattr(ml_dtypes, t))
    return _NUMPY[name]


#: The dtype of index arithmetic lifted into values (coordinates, iota).
INDEX = i64


def from_numpy(dt: np.dtype | type | str) -> DType:
    """The DType whose storage is exactly ``dt``; raises KeyError for others."""
    if "bf16" not in _NUMPY and ("ml_dtypes" in sys.modules or dt in ML_DTYPES.values()):
        _ml_dtype("bf16")  # such an array exists only once ml_dtypes is loaded
    dt = np.dtype(dt)
    for name, d in _NUMPY.items():
        if d == dt:
            return BY_NAME[name]
    raise KeyError(str(dt))


#: ops that take FP8 operands: conversions, selection, comparisons and
#: classification (exact on the encoded values), data movement, and ``mma``
#: into a wider accumulator. Every other op is arithmetic on the format,
#: which the calculus does not define: cast to a wider float first.
FP8_OPS = frozenset(("cast", "bitcast", "ite", "lt", "le", "gt", "ge", "eq", "ne", "isnan",
                     "isinf", "isfinite", "signbit", "mma"))


def parse(name: str) -> DType:
    """The DType named ``name`` (``f32``, ``bf16``, ``bool``...)."""
    return BY_NAME[name]
