"""Short tracebacks for the user's mistakes.

A :class:`~tilenest.errors.TilenestError` raised for a mistake of the user
already says where the mistake is (its ``-->`` sites) and what to do (its
hint). Python prints the traceback above the message, and the frames of
tilenest between the user's call and the place the error was raised (a dozen
to three dozen) push the message out of sight without telling the user
anything. So every public entry point is an *API boundary*
(:func:`api_boundary`): a user error that leaves it carries a traceback from
which tilenest's own frames are removed; the user's frames (the call, and the
user's functions tilenest called, such as a ``@tn.func`` helper) stay. One
frame of tilenest remains, the boundary's re-raise, which pytest hides
(``__tracebackhide__``).

Kept whole: internal errors (:class:`~tilenest.errors.InternalError` and any
exception that is not a TilenestError: those are bugs of tilenest, whose
frames are the evidence), and everything when ``TILENEST_DEBUG`` is set to
anything but ``0`` -- the same switch that shows tracebacks in the CLI.
"""

from __future__ import annotations

import functools
import os
import types
from typing import Any, Callable, TypeVar

from .errors import InternalError, TilenestError

F = TypeVar("F", bound=Callable[..., Any])

_PACKAGE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")


def debugging() -> bool:
    """Whether full tracebacks were asked for (``TILENEST_DEBUG=1``)."""
    return os.environ.get("TILENEST_DEBUG", "") not in ("", "0")


def _own(code: types.CodeType) -> bool:
    name = code.co_filename
    return not name.startswith("<") and os.path.abspath(name).startswith(_PACKAGE_DIR)


def without_own_frames(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback ``tb`` with the frames of tilenest's own modules left out
    (the others keep their order, lines and local variables)."""
    kept = []
    while tb is not None:
        if not _own(tb.tb_frame.f_code):
            kept.append(tb)
        tb = tb.tb_next
    out = None
    for t in reversed(kept):
        out = types.TracebackType(out, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return out


def api_boundary(fn: F) -> F:
    """``fn`` as a public entry point: a user error it raises leaves with
    tilenest's frames removed from its traceback (see the module docstring)."""

    @functools.wraps(fn)
    def boundary(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # noqa: F841 - read by pytest
        try:
            return fn(*args, **kwargs)
        except TilenestError as e:
            if isinstance(e, InternalError) or debugging():
                raise
            raise e.with_traceback(without_own_frames(e.__traceback__)) from e.__cause__

    return boundary  # type: ignore[return-value]


def boundary_property(fget: Callable[[Any], Any]) -> property:
    """``property(api_boundary(fget))``: an attribute that is an entry point."""
    return property(api_boundary(fget), doc=fget.__doc__)
