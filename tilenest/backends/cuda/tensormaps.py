"""Tensor maps: what a bulk tensor copy (``cp.async.bulk.tensor``) reads.

A kernel with bulk copies (``lowering/bulk_copy.py``) takes one
``__grid_constant__ tn_tmap`` parameter per distinct (tensor, box) it copies,
after the status word, in the order of :attr:`Emitter.tensor_maps`. A
:class:`MapSpec` states one: the tensor parameter, its shape over the
kernel's symbols, the box one copy moves (a 128-byte panel's columns by the
tile's rows) and the element size. Each call encodes the maps for its arrays
and sizes:

* on a GPU, with the driver's ``cuTensorMapEncodeTiled`` (128-byte
  swizzle, zeros outside the tensor, 256-byte L2 promotion);
* on the emulator, in the prelude's own format (``tn_prelude.cuh``).

The encoding has preconditions the kernel cannot state over symbols alone:
the array's base address and every row pitch a multiple of 16 bytes
(:func:`fits`). A call whose arrays miss them runs the same program
compiled with ``tma=False`` (``CudaKernel.__call__``), as a call whose
sizes need 64-bit indices runs the 64-bit variant.
"""

from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import TilenestError
from ...semantics import expr as E

#: bytes of an encoded map
MAP_BYTES = 128


@dataclass(frozen=True)
class MapSpec:
    """One tensor map a kernel takes (module docstring): ``arg`` is the
    tensor's argument position, ``shape`` its extents (outermost first),
    ``box`` the extents one copy moves along each dim, ``itemsize`` the
    element bytes."""

    arg: int
    name: str
    shape: tuple[E.Expr, ...]
    box: tuple[int, ...]
    itemsize: int

    def extents(self, env: dict) -> list[int]:
        """The tensor's extents for these symbol values."""
        return [int(E.evaluate(x, env)) for x in self.shape]

    def to_json(self) -> dict:
        from ..kernelcache import expr_json

        return {"arg": self.arg, "name": self.name, "shape": [expr_json(x) for x in self.shape],
                "box": list(self.box), "itemsize": self.itemsize}

    @classmethod
    def from_json(cls, d: dict) -> "MapSpec":
        from ..kernelcache import expr_of

        return cls(int(d["arg"]), str(d["name"]), tuple(expr_of(x) for x in d["shape"]),
                   tuple(int(x) for x in d["box"]), int(d["itemsize"]))


def fits(spec: MapSpec, address: int, extents: list[int]) -> bool:
    """Whether the map of a tensor at ``address`` with ``extents`` can be
    encoded: a 16-byte aligned base, every pitch a multiple of 16 bytes below
    2^40, every extent in ``[1, 2^32)``."""
    return (address % 16 == 0 and all(1 <= n < 2**32 for n in extents)
            and all(p % 16 == 0 and p < 2**40 for p in _strides(spec, extents)))


def _strides(spec: MapSpec, extents: list[int]) -> list[int]:
    """Byte strides of dims 1.. (innermost first)."""
    out, pitch = [], spec.itemsize
    for n in reversed(extents[1:]):
        pitch *= n
        out.append(pitch)
    return out


def encode_emulated(spec: MapSpec, address: int, extents: list[int]) -> np.ndarray:
    """The map in the emulator's format (``tn_prelude.cuh``), as one
    128-byte element."""
    rank = len(extents)
    w = [0] * 16
    w[0] = address
    w[1] = rank | spec.itemsize << 8 | 128 << 16
    dims = list(reversed(extents))
    box = list(reversed(spec.box))
    for d in range(rank):
        w[2 + d] = dims[d]
    for d, s in enumerate(_strides(spec, extents)):
        w[7 + d] = s
    for d in range(min(rank, 4)):
        w[11] |= box[d] << (16 * d)
    if rank == 5:
        w[12] = box[4]
    return np.frombuffer(struct.pack("<16Q", *w), dtype=np.dtype((np.void, MAP_BYTES))).copy()


_DRIVER: Any = None
#: CUtensorMapDataType of an element size (bytes move unchanged)
_DATA_TYPE = {1: 0, 2: 1, 4: 2}  # UINT8, UINT16, UINT32


def _driver() -> Any:
    global _DRIVER
    if _DRIVER is None:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
        u32, u64 = ctypes.c_uint32, ctypes.c_uint64
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, u32, ctypes.c_void_p,
                       ctypes.POINTER(u64), ctypes.POINTER(u64), ctypes.POINTER(u32),
                       ctypes.POINTER(u32), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int]
        fn.restype = ctypes.c_int
        _DRIVER = fn
    return _DRIVER


def encode_gpu(spec: MapSpec, address: int, extents: list[int]) -> np.ndarray:
    """The driver's encoding of the map (``cuTensorMapEncodeTiled``: 128-byte
    swizzle, no interleave, zeros outside the tensor, 256-byte L2
    promotion), as one 128-byte element passed by value."""
    rank = len(extents)
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    out = np.zeros(1, dtype=np.dtype((np.void, MAP_BYTES)))
    dims = (u64 * rank)(*reversed(extents))
    strides = (u64 * max(1, rank - 1))(*_strides(spec, extents))
    box = (u32 * rank)(*reversed(spec.box))
    ones = (u32 * rank)(*([1] * rank))
    rc = _driver()(out.ctypes.data, _DATA_TYPE[spec.itemsize], rank, address, dims, strides,
                   box, ones, 0, 3, 3, 0)
    if rc != 0:
        raise TilenestError(f"cuTensorMapEncodeTiled failed (CUresult {rc}) for tensor "
                            f"'{spec.name}' of shape {extents}, box {list(spec.box)}",
                            hint="compile with tma=False")
    return out


def map_arguments(specs: tuple[MapSpec, ...], addresses: dict[int, int], env: dict,
                  gpu: bool) -> list[np.ndarray] | None:
    """The encoded maps of a call (``addresses``: argument position -> base
    address of its array), or None when one cannot be encoded (:func:`fits`)."""
    out = []
    for spec in specs:
        ext = spec.extents(env)
        if not fits(spec, addresses[spec.arg], ext):
            return None
        out.append((encode_gpu if gpu else encode_emulated)(spec, addresses[spec.arg], ext))
    return out
