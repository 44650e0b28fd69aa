"""A TileIR module: the kernels one text or JSON document holds.

The unit of interchange is a *module*, an ordered sequence of kernels with
distinct names (``spec/interchange.md`` I-19). Each kernel is self-contained:
it declares its own symbols, dim table and custom reducers, and numbers its op
ids from 0, so a kernel means the same inside a module as alone. A module of
one kernel is written exactly as that kernel is, which keeps every
single-kernel text and document a valid module.

:class:`TileModule` is what ``parse_module`` (text), ``jsonio.loads_module``
(JSON) and ``loading.load_module_file`` return; ``single`` is the one-kernel
reading that ``tn.parse`` and ``parse_program`` use.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ..errors import ParseError, Site
from .ir import TileProgram


@dataclass(frozen=True)
class TileModule:
    """Kernels in text order; the invariant is that their names are distinct."""

    kernels: tuple[TileProgram, ...]

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for p in self.kernels:
            if p.name in seen:
                raise ValueError(f"a module holds kernel @{p.name} twice")
            seen.add(p.name)

    def __iter__(self) -> Iterator[TileProgram]:
        return iter(self.kernels)

    def __len__(self) -> int:
        return len(self.kernels)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.kernels)

    def __getitem__(self, key: int | str) -> TileProgram:
        """The kernel at a position, or the kernel named ``key`` (KeyError if none)."""
        if isinstance(key, str):
            for p in self.kernels:
                if p.name == key:
                    return p
            raise KeyError(key)
        return self.kernels[key]

    def __str__(self) -> str:
        from .printer import print_module

        return print_module(self)

    def single(self, kernel: str | None = None, file: str | None = None) -> TileProgram:
        """The one kernel this module stands for: the kernel named ``kernel``,
        or, without a name, the only kernel. A module of several kernels read
        without a name, or a name it does not hold, is a ParseError listing
        the kernels."""
        listing = ", ".join(f"@{n}" for n in self.names) or "none"
        if kernel is not None:
            name = kernel[1:] if kernel.startswith("@") else kernel
            for p in self.kernels:
                if p.name == name:
                    return p
            raise ParseError(f"the text defines no kernel @{name}", Site(file, 1, 1),
                             hint=f"its kernels are: {listing}")
        if len(self.kernels) == 1:
            return self.kernels[0]
        raise ParseError(f"the text defines {len(self.kernels)} kernels ({listing}) where one "
                         "is expected", Site(file, 1, 1),
                         hint="name the one you mean (tn.parse(text, kernel='NAME'), "
                              "--kernel NAME), or read them all with tn.parse_module(text)")
