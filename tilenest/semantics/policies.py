"""Policies and constraints attached to regions and operations.

Each is an immutable value. None of them changes what a program computes except
where stated: a bounds policy defines out-of-view reads/writes; a reduction
policy defines the set of admitted evaluation orders; the MMA policy states
whether the contraction may be reassociated. Execution constraints and
pipeline windows only restrict how a program may be realized.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from .maps import Map


class Bounds(Enum):
    """What an access outside its view means.

    * ``zero``   -- reads give 0, writes are masked (the default);
    * ``fill``   -- reads give the policy's fill value, writes are masked;
    * ``checked``-- any out-of-view access is an error naming the op and coordinate;
    * ``assume`` -- the caller promises no out-of-view access; breaking the promise
      is reported by the interpreter and undefined in compiled code.
    """

    zero = "zero"
    fill = "fill"
    checked = "checked"
    assume = "assume"


@dataclass(frozen=True)
class BoundsPolicy:
    kind: Bounds = Bounds.zero
    fill: float | int | bool | None = None

    def __str__(self) -> str:
        return f"fill({self.fill!r})" if self.kind is Bounds.fill else self.kind.value


ZERO = BoundsPolicy(Bounds.zero)
CHECKED = BoundsPolicy(Bounds.checked)
ASSUME = BoundsPolicy(Bounds.assume)


class ReductionPolicy(Enum):
    """The admitted evaluation orders of a reduction (see ``spec/reductions.md``).

    * ``unordered_tree`` (default) -- any grouping and permutation of the
      contributions, seed included exactly once; needs a lawful merge;
    * ``ordered_tree`` -- any grouping that keeps contribution order and the
      seed's position; needs a lawful merge;
    * ``fold_left``  -- exactly ``u(...u(u(z, x0), x1)..., xn-1)``;
    * ``fold_right`` -- exactly ``u(x0, u(x1, ...u(xn-1, z)...))``.
    """

    unordered_tree = "unordered_tree"
    ordered_tree = "ordered_tree"
    fold_left = "fold_left"
    fold_right = "fold_right"

    @property
    def is_tree(self) -> bool:
        return self in (ReductionPolicy.unordered_tree, ReductionPolicy.ordered_tree)

    @property
    def is_fold(self) -> bool:
        return not self.is_tree


#: Target execution scopes a ``parallel`` may be constrained to.
EXEC_SCOPES = ("cluster", "block", "warp", "subgroup", "thread", "core", "vector", "infer")


@dataclass(frozen=True)
class ExecPolicy:
    """Optional constraints on one ``parallel`` level: a target scope name and/or
    a ParallelMap ``layout`` giving the child's logical coordinate as a function
    of its raw index (default: the raw index itself)."""

    scope: str | None = None
    layout: Map | None = None

    def __post_init__(self) -> None:
        if self.scope is not None and self.scope not in EXEC_SCOPES:
            raise ValueError(f"unknown exec scope {self.scope!r}")

    def __str__(self) -> str:
        parts = []
        if self.scope:
            parts.append(self.scope)
        if self.layout is not None:
            parts.append(f"layout {self.layout}")
        return " ".join(parts) or "none"


@dataclass(frozen=True)
class PipelinePolicy:
    """``window``: 0 = planner chooses, 1 = no cross-iteration overlap, N = at most N
    iterations in flight. ``interval``: initiation interval, positive."""

    window: int = 2
    interval: int = 1


@dataclass(frozen=True)
class MmaPolicy:
    """``allow_reassociation``: the K contraction may be evaluated in any grouping
    (default); when false the reference K order is kept."""

    allow_reassociation: bool = True


#: Memory resource classes; capability classes, not an order.
RESOURCES = ("auto", "private", "shared", "cluster", "global", "tensor")
