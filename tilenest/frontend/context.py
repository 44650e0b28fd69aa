"""The capture context: which kernel is being captured and which scopes are open.

Surface objects (tiles, handles, views) build IR through :func:`ctx`; using one
outside a capture is a :class:`~tilenest.errors.CaptureError`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ..errors import CaptureError, Site
from .builder import BBlock, Builder


@dataclass(eq=False)
class ScopeFrame:
    """One open region during capture."""

    kind: str  # parallel | serial | pipeline | reduce | if | while | root | stage-body
    handle: Any  # the ScopeHandle (None for root/if/while)
    block: BBlock
    level: int  # innermost enclosing parallel level id (0 = root)
    stages: list = field(default_factory=list)  # pipeline cursor cuts: (index in ops, name, site)
    stmt_depth: int = 0


class CaptureContext:
    """State of one kernel capture."""

    def __init__(self, file: str | None) -> None:
        self.builder = Builder()
        self.file = file
        self.frames: list[ScopeFrame] = [ScopeFrame("root", None, self.builder.block, 0)]
        self.next_level = 1
        self.level_parent: dict[int, int] = {0: 0}
        self.memories: list[Any] = []  # MemoryObj in allocation order
        self.syms: list[str] = []
        self.sym_defs: dict[str, Any] = {}
        self.assumptions: list[Any] = []
        self.reducers: list[Any] = []
        self.reducer_names: set[str] = set()
        self.stmt_depth = 0

    @property
    def frame(self) -> ScopeFrame:
        return self.frames[-1]

    @property
    def scope(self) -> ScopeFrame:
        """The innermost open nest region (or the root): ``if``/``while`` bodies
        add no nest level (E-15), so they are looked through."""
        return next(f for f in reversed(self.frames) if f.kind not in ("if", "while"))

    @property
    def level(self) -> int:
        return self.frame.level

    def site(self) -> Site | None:
        return self.builder.site

    def add_sym(self, name: str) -> None:
        if name not in self.syms:
            self.syms.append(name)


class _Stacks(threading.local):
    """The captures in progress, per thread: two threads capturing two kernels
    at once each build their own program."""

    def __init__(self) -> None:
        self.stack: list[CaptureContext] = []


_LOCAL = _Stacks()


def ctx() -> CaptureContext:
    stack = _LOCAL.stack
    if not stack:
        raise CaptureError("tile operations can only be used while a @tn.kernel is captured",
                           hint="call them inside a function decorated with @tn.kernel")
    return stack[-1]


def active() -> bool:
    return bool(_LOCAL.stack)


def push(c: CaptureContext) -> None:
    _LOCAL.stack.append(c)


def pop() -> None:
    _LOCAL.stack.pop()
