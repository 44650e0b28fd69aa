"""Types of TileIR values.

* :class:`TileType` ``tile<T, [d0:e0, ...]>`` -- an immutable value holding one
  element of dtype ``T`` at each point of its Space. The type carries the dim
  identities, so two tiles of equal extents but different dims are different
  types. Rank 0 is a ``Scalar``.
* :class:`TensorType` ``tensor<T, [e0, ...]>`` -- an external addressable view
  (a kernel argument): buffer + layout. Its extents are index expressions
  (usually kernel symbols); its element strides are bound at call time and do
  not affect meaning. Each axis has a dim identity that loads inherit.
* :class:`MemoryType` -- an explicit Memory object: element dtype, logical space,
  local address layout and resource class.
* :class:`StateType` -- a MemoryState token of one Memory object.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import expr as E
from .dtypes import DType
from .expr import Expr
from .maps import MemLayout
from .space import Dim, Space


class Type:
    """Base of value types."""

    __slots__ = ()


@dataclass(frozen=True)
class TileType(Type):
    dtype: DType
    space: Space = Space()

    @property
    def rank(self) -> int:
        return self.space.rank

    @property
    def dims(self) -> tuple[Dim, ...]:
        return self.space.dims

    @property
    def extents(self) -> tuple[Expr, ...]:
        return self.space.extents

    @property
    def is_scalar(self) -> bool:
        return self.space.rank == 0

    def with_dtype(self, dt: DType) -> "TileType":
        return TileType(dt, self.space)


def scalar(dt: DType) -> TileType:
    return TileType(dt, Space())


@dataclass(frozen=True)
class TensorType(Type):
    dtype: DType
    shape: tuple[Expr, ...]
    dims: tuple[Dim, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(E.lift(s) for s in self.shape))
        if len(self.shape) != len(self.dims):
            raise ValueError("tensor needs one dim per axis")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def space(self) -> Space:
        return Space.of(*zip(self.dims, self.shape, strict=True))


@dataclass(frozen=True)
class MemoryType(Type):
    dtype: DType
    space: Space
    layout: MemLayout
    resource: str = "auto"


@dataclass(frozen=True)
class StateType(Type):
    """The state token type of the Memory value named ``memory``."""

    memory: str
