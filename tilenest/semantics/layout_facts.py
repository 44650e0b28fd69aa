"""Concrete facts of an evaluated Memory layout (M-12).

Once every extent and parameter of a layout ``L`` is known, its offsets over
the tile space are an integer array ``off`` of the space's shape, and both
storage rules are decided exactly:

* **range** -- ``0 <= off[u] < size`` for every element ``u``;
* **injectivity** -- ``off[u] = off[v]  =>  u = v``.

These are what a whole-tile store needs: every element its own storage slot
inside the allocation. The interpreter evaluates the offsets of every
allocation anyway, so it decides both facts at each allocation, whatever the
size of the space; the symbolic versions of the same facts are the
``layout.range`` and ``layout.injective`` proof obligations.
"""

from __future__ import annotations

import numpy as np

from ..errors import Site, VerifyError


def first_outside(off: np.ndarray, size: int) -> tuple[int, ...] | None:
    """The first element (row-major) whose offset is outside ``[0, size)``."""
    if off.size == 0:
        return None
    bad = (off < 0) | (off >= size)
    if not bad.any():
        return None
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), off.shape))


def first_collision(off: np.ndarray, size: int | None = None
                    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Two distinct elements with one offset, the pair found first in row-major
    order of the later element, or ``None`` when ``off`` is injective.

    With ``size`` given (and every offset already known to lie in
    ``[0, size)``), the test is one counting pass over ``size`` slots, the
    cost of the allocation itself; the pair is located only when one exists."""
    flat = np.ascontiguousarray(off).reshape(-1)
    if flat.size < 2:
        return None
    if size is not None and flat.min() >= 0 and flat.max() < size:
        if np.bincount(flat, minlength=int(size)).max() <= 1:
            return None
    order = np.argsort(flat, kind="stable")
    s = flat[order]
    dup = np.nonzero(s[1:] == s[:-1])[0]
    if dup.size == 0:
        return None
    # among all colliding pairs (first occurrence, later one), the earliest later one
    later = order[dup + 1]
    k = int(np.argmin(later))
    i, j = int(order[dup[k]]), int(later[k])
    ci = tuple(int(x) for x in np.unravel_index(i, off.shape))
    cj = tuple(int(x) for x in np.unravel_index(j, off.shape))
    return ci, cj


def require_injective(off: np.ndarray, size: int, site: Site | None, name: str = "") -> None:
    """Raise a :class:`~tilenest.errors.VerifyError` naming the first two
    elements that share an offset (see :func:`first_collision`)."""
    pair = first_collision(off, size)
    if pair is None:
        return
    a, b = pair
    what = f"Memory {name}" if name else "memory"
    raise VerifyError(
        f"{what} layout is not injective for these extents: elements {a} and {b} share "
        f"offset {int(off[a])}", site,
        "whole-tile Memory storage needs a one-to-one layout (check its strides or "
        "swizzle); `tilenest check FILE` states layout.injective for all sizes")
