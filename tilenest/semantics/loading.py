"""Reading a TileIR program from a file: the one way a program enters from disk.

A file whose name ends in ``.json`` holds the JSON form (``jsonio``); any
other file holds the text form (``parser``). Either holds a module of one or
more kernels (:func:`load_module_file`); :func:`load_program_file` reads the
one kernel a caller expects. Both readers
verify what they read, so a program returned here has passed the same
verifier as a captured kernel. A file that cannot be read as UTF-8 text is a
ParseError at the line:col of the first bad byte; a missing file or a folder is
a TilenestError naming the path.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ParseError, Site, TilenestError
from .ir import TileProgram
from .module import TileModule


def read_text(path: Path | str) -> str:
    """The UTF-8 text of the file at ``path``."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except IsADirectoryError:
        raise TilenestError(f"{p} is a directory, not a kernel or IR file",
                            hint="give a .py kernel file, a .tile or a .json file") from None
    except FileNotFoundError:
        raise TilenestError(f"no such file: {p}") from None
    except OSError as e:
        raise TilenestError(f"cannot read {p}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        before = data[:e.start]
        line = before.count(b"\n") + 1
        col = e.start - (before.rfind(b"\n") + 1) + 1
        raise ParseError(f"{p} is not UTF-8 text (byte 0x{data[e.start]:02x})",
                         Site(str(p), line, col),
                         hint="TileIR text and JSON are UTF-8") from None


def load_module_file(path: Path | str) -> TileModule:
    """Every verified kernel in the file at ``path`` (JSON if it ends in
    ``.json``), in order: a file holds a module of one or more kernels."""
    text = read_text(path)
    if str(path).endswith(".json"):
        from .jsonio import loads_module

        return loads_module(text, str(path))
    from .parser import parse_module

    return parse_module(text, str(path))


def load_program_file(path: Path | str, kernel: str | None = None) -> TileProgram:
    """The verified program in the file at ``path`` (JSON if it ends in
    ``.json``): the kernel named ``kernel``, or the file's only kernel."""
    text = read_text(path)
    if str(path).endswith(".json"):
        from .jsonio import loads

        return loads(text, str(path), kernel)
    from .parser import parse_program

    return parse_program(text, str(path), kernel)
