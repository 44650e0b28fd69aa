"""Fixed reduction trees: the one evaluation tree a realization commits to.

A tree-policy ``reduce`` admits every merge tree over its leaves (R-6). A
realization that runs the contributions on ``threads`` cooperating threads
evaluates one particular tree; :class:`BlockTree` names that tree, so that
the code generator that builds it and the reference that checks it (the
interpreter, given the plan) agree on the same member of the admitted set.

For ``n`` contributions ``x_0 .. x_{n-1}`` (source order), a seed ``z`` and
the region's update ``u`` (declared equal to ``merge(s, lift(x))``, R-11):

1. **Partials.** Thread ``t`` folds its *segment* -- the positions
   :meth:`BlockTree.segments` gives it, in increasing order -- with the body,
   starting from the contract's identity ``e``: ``p_t = u(..u(e, x_a).., x_b)``.
   ``strided`` (``blocked=False``): thread ``t`` takes ``t, t + W, t + 2W,
   ..`` (consecutive threads read consecutive elements); ``blocked``: thread
   ``t`` takes the contiguous run ``[t c, min((t + 1) c, n))``, ``c = ceil(n
   / W)``, so the partials are in source order.
2. **Lanes.** The ``warp`` partials of each warp are merged pairwise,
   lower lane on the left: ``merge(p_2i, p_2i+1)``, then the pairs of pairs,
   and so on -- a balanced tree whose leaves, read left to right, are the
   warp's lanes in order.
3. **Warps.** The warp totals ``w_0, w_1, ..`` are folded left in warp
   order: ``T = merge(..merge(w_0, w_1).., w_last)``.
4. **Seed.** The result is ``merge(z, T)``.

Every step keeps the seed once and each contribution once, and inserts only
identity leaves (threads without elements, the ``e`` each fold starts from),
so the value is a member of the ``unordered_tree`` set; under ``blocked`` the
leaves stay in source order, so it is a member of the ``ordered_tree`` set
too.

A :class:`RunTree` is the tree of a reduction split over programs
(``lowering/phases.py``): program ``c`` folds the contiguous run ``[c per,
min((c + 1) per, n))`` from ``e``, the run partials are folded left in run
order, ``T = merge(..merge(p_0, p_1).., p_last)``, and the result is
``merge(z, T)`` (the seed alone when ``n = 0``). Its leaves stay in source
order: a member of both tree policies' sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

S = TypeVar("S")


@dataclass(frozen=True)
class BlockTree:
    """The tree of a reduction run by ``threads`` threads in warps of
    ``warp`` lanes (module docstring); ``blocked`` gives each thread a
    contiguous run of contributions, otherwise every ``threads``-th."""

    threads: int
    blocked: bool
    warp: int = 32

    def __post_init__(self) -> None:
        w = self.warp
        if w < 1 or w & (w - 1) or self.threads < w or self.threads % w:
            raise ValueError(f"a block tree needs a power-of-two warp dividing the threads, "
                             f"got threads={self.threads}, warp={w}")

    def chunk(self, n: int) -> int:
        """Contributions per thread of a ``blocked`` tree over ``n``."""
        return -(-n // self.threads)

    def segments(self, n: int) -> list[list[int]]:
        """For each thread, the positions (in ``[0, n)``) it folds, in order."""
        W = self.threads
        if self.blocked:
            c = self.chunk(n)
            return [list(range(t * c, min((t + 1) * c, n))) for t in range(W)]
        return [list(range(t, n, W)) for t in range(W)]

    def combine(self, parts: list[S], merge: Callable[[S, S], S]) -> S:
        """The block total of the threads' partials ``parts`` (steps 2 and 3)."""
        if len(parts) != self.threads:
            raise ValueError(f"{len(parts)} partials for a tree of {self.threads} threads")
        totals = []
        for w in range(0, self.threads, self.warp):
            lanes = parts[w:w + self.warp]
            while len(lanes) > 1:
                lanes = [merge(lanes[i], lanes[i + 1]) for i in range(0, len(lanes), 2)]
            totals.append(lanes[0])
        out = totals[0]
        for t in totals[1:]:
            out = merge(out, t)
        return out

    def describe(self) -> str:
        how = "blocked" if self.blocked else "strided"
        return f"block tree: {self.threads} threads ({how}), lanes pairwise, warps in order"

    def to_json(self) -> dict:
        return {"threads": self.threads, "blocked": self.blocked, "warp": self.warp}

    @classmethod
    def from_json(cls, d: dict) -> "BlockTree":
        return cls(int(d["threads"]), bool(d["blocked"]), int(d.get("warp", 32)))


@dataclass(frozen=True)
class RunTree:
    """The tree of a reduction folded in contiguous runs by several programs
    (module docstring): ``per`` contributions per run, or, with ``splits``,
    ``max(1, ceil(n / splits))``."""

    splits: int | None = None
    per: int | None = None

    def __post_init__(self) -> None:
        if (self.splits is None) == (self.per is None) or (self.splits or self.per or 0) < 1:
            raise ValueError(f"a run tree needs a positive splits or per, got {self}")

    def run(self, n: int) -> int:
        """Contributions per run over ``n``."""
        return self.per if self.per is not None else max(1, -(-n // self.splits))  # type: ignore[operator]

    def segments(self, n: int) -> list[list[int]]:
        """For each run, the positions it folds, in order (none when ``n = 0``)."""
        c = self.run(n)
        return [list(range(a, min(a + c, n))) for a in range(0, n, c)]

    def combine(self, parts: list[S], merge: Callable[[S, S], S]) -> S | None:
        """The left fold of the run partials; None when there are none."""
        if not parts:
            return None
        out = parts[0]
        for p in parts[1:]:
            out = merge(out, p)
        return out

    def describe(self) -> str:
        how = f"{self.splits} splits" if self.splits is not None else f"runs of {self.per}"
        return f"run tree: {how}, partials folded left in run order"

    def to_json(self) -> dict:
        return {"kind": "runs", "splits": self.splits, "per": self.per}


def tree_from_json(d: dict) -> "BlockTree | RunTree":
    """A tree from its :meth:`to_json` form."""
    if d.get("kind") == "runs":
        return RunTree(d.get("splits"), d.get("per"))
    return BlockTree.from_json(d)
