"""Errors a user of tilenest can cause, each naming its site(s) and a hint.

Every error raised for a user's mistake is a :class:`TilenestError`. It carries
the sites it concerns (``file:line:col`` of a kernel's Python source, or
``line:col`` of TileIR text), a one-line message and an optional hint that says
what to do instead. The CLI prints :meth:`TilenestError.render`; it never shows a
Python traceback for these.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Site:
    """A location in user input: a Python kernel file or a TileIR text."""

    file: str | None
    line: int
    col: int = 0

    def __str__(self) -> str:
        where = f"{self.line}:{self.col}" if self.col else f"{self.line}"
        return f"{self.file}:{where}" if self.file else where


class TilenestError(Exception):
    """Base class of every diagnosed user error."""

    kind = "error"

    def __init__(self, message: str, sites: tuple[Site, ...] | Site | None = (),
                 hint: str | None = None, notes: tuple[str, ...] = ()):
        if isinstance(sites, Site):
            sites = (sites,)
        self.message = message
        self.sites: tuple[Site, ...] = tuple(s for s in (sites or ()) if s is not None)
        self.hint = hint
        self.notes = tuple(notes)
        super().__init__(self.render())

    def with_site(self, site: Site | None) -> "TilenestError":
        """Return this error with ``site`` added first if it has no site yet."""
        if site is not None and not self.sites:
            self.sites = (site,)
            self.args = (self.render(),)
        return self

    def render(self) -> str:
        head = f"{self.kind}: {self.message}"
        lines = [head]
        for s in self.sites:
            lines.append(f"  --> {s}")
        for n in self.notes:
            lines.append(f"  note: {n}")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {
            "kind": self.kind,
            "message": self.message,
            "sites": [str(s) for s in self.sites],
            "hint": self.hint,
            "notes": list(self.notes),
        }


class TilenestWarning(UserWarning):
    """A kernel that is legal but probably not what its author meant (reported
    with ``warnings.warn`` at the kernel's ``file:line``)."""


class CaptureError(TilenestError):
    """The Python kernel uses a construct the DSL does not accept."""

    kind = "capture error"


class TypeCheckError(TilenestError):
    """An operation's operands do not have the types or dims it requires."""

    kind = "type error"


class ParseError(TilenestError):
    """TileIR text (or JSON) is malformed."""

    kind = "parse error"


class VerifyError(TilenestError):
    """A structurally well-formed program violates a static rule of the calculus."""

    kind = "verify error"


class ContractError(TilenestError):
    """A reduction or update lacks the algebraic contract its policy needs."""

    kind = "contract error"


class RuntimeSemanticError(TilenestError):
    """A dynamic violation found while executing a program (interpreter)."""

    kind = "runtime error"


class RaceError(RuntimeSemanticError):
    """Two distinct `parallel` instances touched one element, at least one writing."""

    kind = "race"


class BoundsError(RuntimeSemanticError):
    """An access fell outside its view under a policy that forbids that."""

    kind = "out of bounds"


class UninitializedReadError(RuntimeSemanticError):
    """A read of an element that nothing wrote."""

    kind = "uninitialized read"


class NotAvailableError(TilenestError):
    """A capability that this build of tilenest does not provide yet."""

    kind = "not available"


class UsageError(TilenestError):
    """A command line that names no valid invocation (an unknown option, a value
    out of its range, a path that cannot be read or written)."""

    kind = "usage error"


class UserCodeError(TilenestError):
    """The user's own Python code (a kernel module, a helper it calls) raised an
    exception that is not a tilenest diagnostic; the site is the user's line."""

    kind = "error in user code"


class TargetCheckError(TilenestError):
    """Generated target source (Metal Shading Language, ...) that a compiler
    checking it rejects; the site is the line of the generated source."""

    kind = "target check error"


class InternalError(TilenestError):
    """An unexpected exception inside tilenest itself: a bug of tilenest, not of
    the user's input. The site is the innermost frame of tilenest that raised."""

    kind = "internal error"


# ---------------------------------------------------------------------------
# where the user called from

_PACKAGE_DIR = __import__("os").path.dirname(__import__("os").path.abspath(__file__))


def _library_dirs() -> tuple[str, ...]:
    """Folders of the Python installation (its standard library and installed
    packages): frames there are nobody's call site."""
    import os
    import sys
    import sysconfig

    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            dirs.add(sysconfig.get_paths()[key])
        except KeyError:
            pass
    return tuple(os.path.join(os.path.abspath(d), "") for d in dirs if d)


def user_site(depth: int = 1) -> Site | None:
    """The line of the user's code that called into tilenest: the innermost
    frame of the running thread (from ``depth`` frames above this function)
    that is neither tilenest's nor the Python installation's, with its file
    relative to the working directory when it lies below it. None when every
    frame is tilenest's or the installation's, or when the call came
    through the ``tilenest`` command (also when a program runs its ``main``
    in-process), or from a thread pool running a kernel directly: the caller
    then names another site. Meant for error paths; it walks the stack."""
    import os
    import sys

    own = os.path.join(_PACKAGE_DIR, "")
    cli = os.path.join(_PACKAGE_DIR, "cli.py")
    lib = _library_dirs()
    f = sys._getframe(depth)
    while f is not None:
        name = f.f_code.co_filename
        if f.f_code.co_name == "main" and os.path.abspath(name) == cli:
            return None  # the command's user typed a command line, not a call
        if not name.startswith("<frozen"):
            path = os.path.abspath(name) if not name.startswith("<") else name
            if not path.startswith(own) and not path.startswith(lib):
                try:
                    rel = os.path.relpath(path)
                    if not rel.startswith("..") and not name.startswith("<"):
                        path = rel
                except (ValueError, OSError):
                    pass
                return Site(path, f.f_lineno)
        f = f.f_back
    return None
