"""Element types of tiles, tensors and memories.

A :class:`DType` is an exact storage/arithmetic format. Its meaning is the set of
values of the corresponding numpy (or ``ml_dtypes``) type, with IEEE
round-to-nearest-even for floating point and two's-complement wrap-around for
integers. Changing the dtype never changes execution structure.

``ml_dtypes`` (which holds ``bfloat16`` and takes most of a second to load)
is imported the first time a bf16 value needs its numpy type, not when
tilenest is imported.
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
    def np(self) -> np.dtype:
        """The numpy dtype holding exactly this format."""
        return _NUMPY.get(self.name) or _bfloat16()

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
f16 = DType("f16", "f", 16)
bf16 = DType("bf16", "f", 16)
f32 = DType("f32", "f", 32)
f64 = DType("f64", "f", 64)

ALL: tuple[DType, ...] = (bool_, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64)
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



def _bfloat16() -> np.dtype:
    """numpy's dtype of ``ml_dtypes.bfloat16``, importing ml_dtypes on first use."""
    import ml_dtypes

    dt = np.dtype(ml_dtypes.bfloat16)
    _NUMPY["bf16"] = dt
    return dt


#: The dtype of index arithmetic lifted into values (coordinates, iota).
INDEX = i64


def from_numpy(dt: np.dtype | type | str) -> DType:
    """The DType whose storage is exactly ``dt``; raises KeyError for others."""
    if "bf16" not in _NUMPY and ("ml_dtypes" in sys.modules or dt == "bfloat16"):
        _bfloat16()  # a bfloat16 array exists only once ml_dtypes is loaded
    dt = np.dtype(dt)
    for name, d in _NUMPY.items():
        if d == dt:
            return BY_NAME[name]
    raise KeyError(str(dt))


def parse(name: str) -> DType:
    """The DType named ``name`` (``f32``, ``bf16``, ``bool``...)."""
    return BY_NAME[name]
