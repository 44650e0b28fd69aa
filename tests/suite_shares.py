"""The conformance suite shared between the two emulated SIMT dialects.

The emulated CUDA and Metal devices run the same SIMT emitter; a default run
takes every conformance case through it once, on one dialect or the other,
each dialect meeting every rule group: Metal runs every third case of each
group (in name order, from the first), CUDA the rest. ``-m slow`` runs the
whole suite on both.
"""

from __future__ import annotations

from tilenest.conformance import load_suite


def _shares() -> tuple[list[str], list[str]]:
    by: dict[str, list[str]] = {}
    for c in load_suite():
        by.setdefault(c.group, []).append(c.name)
    metal, cuda = [], []
    for names in by.values():
        for i, n in enumerate(sorted(names)):
            (metal if i % 3 == 0 else cuda).append(n)
    return sorted(metal), sorted(cuda)


def metal_share() -> list[str]:
    """The cases the emulated Metal device runs by default."""
    return _shares()[0]


def cuda_share() -> list[str]:
    """The cases the emulated CUDA device runs by default."""
    return _shares()[1]
