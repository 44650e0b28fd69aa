"""Type-checking Metal Shading Language here, without a Mac.

:func:`check_msl` compiles an MSL source with ``clang-19 -fsyntax-only`` as
C++14 against ``shim/metal_stdlib``, a declaration-only stand-in for Metal's
standard library (see its header comment): the four Metal address spaces are
distinct clang address spaces, ``double`` is poisoned and C++17 syntax is an
error, so an address-space mix-up, an f64 value, an ``if constexpr`` or a
misspelled Metal function is refused here as Metal's compiler would refuse
it. What it cannot see is what needs Apple's compiler: resource limits,
Metal-only attribute checks (the attributes are ignored) and code generation.

The one change made to the source before clang sees it keeps every line
where it was: a ``threadgroup`` variable declared inside a function body is
given ``static`` (Metal allocates it once per threadgroup; clang refuses
automatic variables in an address space).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

from ...errors import NotAvailableError, Site, TargetCheckError

#: the compiler: a Debian package (``make test`` installs it where it can)
CLANG = "clang-19"

#: clang's options: C++14 only, the shim on the system include path (its own
#: warnings silent), Metal's attributes accepted without a warning
FLAGS = ("-fsyntax-only", "-std=c++14", "-x", "c++", "-Wno-unknown-attributes",
         "-Werror=c++17-extensions", "-Werror=c++20-extensions", "-Werror=c++23-extensions",
         "-fno-caret-diagnostics", "-fno-color-diagnostics", "-ferror-limit=20")

#: errors quoted in a refusal
SHOWN = 3

_DIAG = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<sev>fatal error|error|"
                   r"warning|note): (?P<msg>.*)$")
_LOCAL_THREADGROUP = re.compile(r"^(\s*)(threadgroup\b)")
#: the ``[[threadgroup(n)]]`` attribute of a threadgroup-memory parameter: the
#: shim's ``threadgroup`` macro would expand inside it, so clang sees another
#: (unknown, ignored) attribute name
_THREADGROUP_ATTR = re.compile(r"\[\[\s*threadgroup\s*\(")


def shim_dir() -> str:
    """The folder holding the ``metal_stdlib`` shim (clang's ``-isystem``)."""
    return os.path.join(os.path.dirname(__file__), "shim")


def clang_path() -> str | None:
    """Where ``clang-19`` is, or None."""
    return shutil.which(CLANG)


def clang_available() -> bool:
    """Whether :func:`check_msl` can run (``clang-19`` is on the PATH)."""
    return clang_path() is not None


def prepare(source: str) -> str:
    """``source`` as clang checks it: each ``threadgroup`` declaration that
    starts a line inside a function body (brace depth > 0, the statement
    ending on that line) gets ``static``, and the ``[[threadgroup(n)]]``
    attribute is renamed ``[[tn_threadgroup(n)]]`` (out of the shim's
    ``threadgroup`` macro); every line keeps its number."""
    out, depth = [], 0
    for line in source.split("\n"):
        code = line.split("//", 1)[0]
        m = _LOCAL_THREADGROUP.match(code)
        if m and depth > 0 and code.rstrip().endswith(";"):
            line = m.group(1) + "static " + line[m.end(1):]
        line = _THREADGROUP_ATTR.sub("[[tn_threadgroup(", line)
        depth += code.count("{") - code.count("}")
        out.append(line)
    return "\n".join(out)


def check_msl(source: str, name: str = "kernel.metal") -> None:
    """Type-check the MSL ``source`` (its file name in messages: ``name``).

    Returns when clang accepts it; raises :class:`~tilenest.errors.TargetCheckError`
    at the line of the first error, quoting clang's first errors each with its
    line of ``source``, when it does not; :class:`~tilenest.errors.NotAvailableError`
    when ``clang-19`` is not installed."""
    clang = clang_path()
    if clang is None:
        raise NotAvailableError(f"type-checking Metal needs {CLANG}, which is not installed",
                                hint="run `make test` once as root (it installs clang-19 "
                                     "with apt-get), or `apt-get install clang-19`")
    with tempfile.TemporaryDirectory(prefix="tilenest-msl-") as tmp:
        path = os.path.join(tmp, os.path.basename(name) or "kernel.metal")
        with open(path, "w") as f:
            f.write(prepare(source))
        r = subprocess.run([clang, *FLAGS, "-isystem", shim_dir(), path], capture_output=True,
                           text=True, check=False, timeout=120)
    if r.returncode == 0:
        return
    errors = _errors(r.stderr, path, source.split("\n"))
    if not errors:  # clang failed without a diagnostic we can read: show what it said
        raise TargetCheckError(f"{CLANG} rejected {name}", Site(name, 1),
                               notes=tuple(r.stderr.strip().splitlines()[:SHOWN]))
    line, col, _ = errors[0]
    notes = tuple(text for _, _, text in errors[:SHOWN])
    raise TargetCheckError(f"{CLANG} rejects the Metal source {name} ({len(errors)} "
                           f"error{'s' if len(errors) != 1 else ''})", Site(name, line, col),
                           hint="the Metal emitter produced invalid MSL; the shim it was "
                                "checked against is tilenest/backends/metal/shim/metal_stdlib",
                           notes=notes)


def _errors(stderr: str, path: str, lines: list[str]) -> list[tuple[int, int, str]]:
    """(line, column, quoted text) of each error clang reports, located in
    the MSL source: an error inside the shim takes the line of the first note
    after it that points into the source (where the call was made). The
    text quotes the source line and the first notes that explain the error
    (e.g. why no candidate of a call fits)."""
    out: list[tuple[int, int, str]] = []
    pending: str | None = None  # an error in the shim, waiting for a note in the source
    explained = 0  # notes added to the last error
    for raw in stderr.splitlines():
        m = _DIAG.match(raw)
        if m is None:
            continue
        here = os.path.abspath(m["file"]) == os.path.abspath(path)
        ln, col = int(m["line"]), int(m["col"])
        if m["sev"] in ("error", "fatal error"):
            pending, explained = None, 0
            if here:
                out.append((ln, col, _quote(ln, col, m["msg"], lines)))
            else:
                pending = m["msg"]
        elif m["sev"] == "note" and pending is not None and here:
            out.append((ln, col, _quote(ln, col, pending, lines)))
            pending, explained = None, SHOWN  # the note only located it
        elif m["sev"] == "note" and out and pending is None and explained < 2 \
                and "requested here" not in m["msg"]:
            ln0, col0, text = out[-1]
            out[-1] = (ln0, col0, text + f"\n      note: {m['msg']}")
            explained += 1
    return out


def _quote(ln: int, col: int, msg: str, lines: list[str]) -> str:
    if "poisoned identifier" in msg:  # the shim poisons one word
        msg += " (Metal has no double)"
    text = lines[ln - 1].strip() if 0 < ln <= len(lines) else ""
    return f"line {ln}:{col}: {msg}" + (f"\n      {ln} | {text}" if text else "")
