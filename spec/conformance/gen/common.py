"""Helpers the case generators share: argument recipes and the case registry.

A case is declared with :func:`case` around a ``@tn.kernel`` (captured and
printed to TileIR) or with :func:`text_case` for TileIR that the Python
frontend would refuse to build (parse errors, ill-typed or unverifiable IR):
those are written by hand, or derived from a captured kernel by
:func:`mutate`, which replaces exact substrings of its printed TileIR.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

CASES: list["Case"] = []


@dataclass
class Case:
    name: str
    rules: tuple[str, ...]
    summary: str
    args: list[dict[str, Any]]
    expect: dict[str, Any]
    program: Any = None          # a Kernel or TileProgram
    text: str | None = None      # TileIR text (hand-written or mutated)
    json: bool = False           # write the program as a JSON TileIR document
    wrong: Any = None            # Kernel, TileProgram or text of a misreading
    params: dict[str, int] = field(default_factory=dict)
    gap: str | None = None       # a known gap of the reference this case exposes


# ---------------------------------------------------------------- argument recipes
def t(name: str, dtype: str, shape: list[int] | tuple[int, ...], fill: Any = None) -> dict:
    """A tensor argument; ``fill`` is a pattern dict (default zeros)."""
    d: dict[str, Any] = {"name": name, "kind": "tensor", "dtype": dtype, "shape": list(shape)}
    d["fill"] = fill if fill is not None else {"pattern": "zeros"}
    return d


def out(name: str, dtype: str, shape: list[int] | tuple[int, ...]) -> dict:
    """An output tensor pre-filled with NaN (floats) or the least value (ints)."""
    return t(name, dtype, shape, {"pattern": "nan"})


def s(name: str, dtype: str, value: Any) -> dict:
    """A runtime scalar argument."""
    return {"name": name, "kind": "scalar", "dtype": dtype, "value": value}


def alias(name: str, of: str) -> dict:
    """The same array as argument ``of``."""
    return {"name": name, "alias": of}


def normal(seed: int, scale: float = 1.0) -> dict:
    return {"pattern": "normal", "seed": seed, "scale": scale}


def uniform(seed: int, lo: float, hi: float) -> dict:
    return {"pattern": "uniform", "seed": seed, "lo": lo, "hi": hi}


def ints(seed: int, lo: int, hi: int) -> dict:
    return {"pattern": "ints", "seed": seed, "lo": lo, "hi": hi}


def arange(start: float = 0, step: float = 1) -> dict:
    return {"pattern": "arange", "start": start, "step": step}


def const(v: Any) -> dict:
    return {"pattern": "const", "value": v}


def ties(seed: int) -> dict:
    return {"pattern": "ties", "seed": seed}


def special(seed: int) -> dict:
    return {"pattern": "special", "seed": seed}


def cancel(seed: int) -> dict:
    return {"pattern": "cancel", "seed": seed}


def values(*vs: Any) -> dict:
    """Explicit values (row-major); floats may be "nan", "inf", "-inf", "-0.0"."""
    return {"pattern": "values", "values": list(vs)}


# ------------------------------------------------------------------------ cases
def _expect(expect: str) -> dict:
    return {"verdict": "admitted"} if expect == "admitted" else {"verdict": "error",
                                                                 "error": expect}


def case(name: str, rules: str | tuple[str, ...], summary: str, args: list[dict],
         expect: str = "admitted", wrong: Any = None, params: dict | None = None,
         json: bool = False) -> Callable[[Any], Any]:
    """Register the decorated kernel as a case (decorate above ``@tn.kernel``)."""

    def deco(k: Any) -> Any:
        CASES.append(Case(name, _rules(rules), summary, args, _expect(expect), program=k,
                          wrong=wrong, params=params or {}, json=json))
        return k

    return deco


def text_case(name: str, rules: str | tuple[str, ...], summary: str, text: str,
              args: list[dict], expect: str = "admitted", wrong: Any = None,
              params: dict | None = None, json: bool = False) -> None:
    """Register a case whose program is TileIR text (``json``: a JSON document)."""
    CASES.append(Case(name, _rules(rules), summary, args, _expect(expect), text=text,
                      wrong=wrong, params=params or {}, json=json))


def _rules(r: str | tuple[str, ...]) -> tuple[str, ...]:
    return (r,) if isinstance(r, str) else tuple(r)


def tileir(k: Any) -> str:
    """The printed TileIR of a kernel or program (locations removed)."""
    from tilenest.semantics.printer import print_program

    prog = getattr(k, "program", k)
    return strip_locs(print_program(prog))


def strip_locs(text: str) -> str:
    import re

    return re.sub(r' loc\((?:"[^"]*":)?\d+:\d+\)', "", text)


def mutate(k: Any, *edits: tuple[str, str], count: int | None = None) -> str:
    """The TileIR of ``k`` with each ``old`` replaced by ``new``; every ``old``
    must occur (exactly ``count`` times when given)."""
    text = tileir(k)
    for old, new in edits:
        n = text.count(old)
        if n == 0 or (count is not None and n != count):
            raise AssertionError(f"mutation {old!r} occurs {n} times in\n{text}")
        text = text.replace(old, new)
    return text
