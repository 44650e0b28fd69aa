"""Files and arrays named on the command line, read defensively.

Every path the user gives (a kernel or IR file, a ``.npy`` argument, a
benchmark record, a campaign state file) is read through this module, which
keeps three promises:

* **Only regular files.** A FIFO, a character device (``/dev/urandom``,
  ``/dev/zero``), a socket or a directory is refused by its kind before it is
  opened: opening a FIFO for reading blocks until a writer appears, and a
  device never ends. The check uses ``os.stat`` (which follows symbolic
  links), and the file is then opened with ``O_NONBLOCK`` so that a FIFO
  swapped in between the two steps cannot block either.
* **A size limit.** A file larger than :data:`MAX_FILE_BYTES` (or the limit a
  caller passes) is refused, and reading stops at that many bytes even if the
  file grows while it is read.
* **Sizes before allocation.** :func:`check_array_size` refuses an array
  whose bytes exceed :func:`max_array_bytes` (half of the machine's physical
  memory) before anything is allocated; :func:`load_npy` reads a ``.npy``
  header first and refuses a header that claims more data than the file holds.

Every refusal is a :class:`~tilenest.errors.UsageError` that names the path
and says what was expected; an operating-system failure (a path too long, no
permission) is the same error with the system's reason.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from .errors import UsageError

#: the largest kernel, IR, record or state file read (bytes)
MAX_FILE_BYTES = 256 * 2**20


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def regular_file(path: str | Path, what: str = "input file", hint: str | None = None,
                 limit: int = MAX_FILE_BYTES, prefix: str = "") -> os.stat_result:
    """The ``stat`` of ``path`` when it is a regular file of at most ``limit``
    bytes; otherwise a UsageError naming ``path`` as the ``what`` (its message
    after ``prefix``, e.g. the argument the path was given for)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise UsageError(f"{prefix}no such file: {path}", hint=hint) from None
    except (OSError, ValueError) as e:  # ENAMETOOLONG, EACCES, ELOOP; ValueError: a NUL byte
        why = getattr(e, "strerror", None) or str(e)
        raise UsageError(f"{prefix}cannot read {what} {_short(path)}: {why}", hint=hint) from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{prefix}{path} is {_kind(st.st_mode)}, not a regular file",
                         hint=hint or f"give the path of a regular file as the {what}")
    if st.st_size > limit:
        raise UsageError(f"{prefix}{path} has {st.st_size} bytes; a {what} is read only up to "
                         f"{limit} bytes", hint=hint)
    return st


def read_bytes(path: str | Path, what: str = "input file", hint: str | None = None,
               limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of the regular file ``path`` (at most ``limit``; see
    :func:`regular_file`)."""
    regular_file(path, what, hint, limit)
    with _open_regular(path, what, hint) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise UsageError(f"cannot read {what} {_short(path)}: {e.strerror or e}",
                             hint=hint) from None
    if len(data) > limit:
        raise UsageError(f"{path} grew past {limit} bytes while it was read", hint=hint)
    return data


def _short(path: str | Path, keep: int = 120) -> str:
    """``path`` for a message: an over-long one (the error that named it) is cut."""
    s = str(path)
    return s if len(s) <= keep else f"{s[:keep // 2]}...{s[-keep // 2:]} ({len(s)} characters)"


def max_array_bytes() -> int:
    """The largest array the command line creates or loads: half of the
    machine's physical memory (the interpreter needs room beside it)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
    except (ValueError, OSError, AttributeError):  # a platform without sysconf
        return 8 * 2**30


def check_array_size(where: str, shape: tuple[int, ...], itemsize: int,
                     hint: str | None = None) -> None:
    """Refuse, before allocating, an array of ``shape`` whose bytes exceed
    :func:`max_array_bytes`."""
    n = 1
    for d in shape:
        n *= d
    limit = max_array_bytes()
    if n * itemsize > limit:
        dims = "x".join(map(str, shape))
        raise UsageError(f"{where}: an array of {dims} ({n} elements, {n * itemsize} bytes) "
                         f"is too large: at most {limit} bytes (half of this machine's "
                         "memory)", hint=hint or "give a smaller shape")


def _open_regular(path: str | Path, what: str, hint: str | None) -> Any:
    """A binary file object on the regular file ``path``, opened without
    blocking (a FIFO swapped in after the ``stat`` cannot hang the open) and
    checked again on the descriptor itself."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise UsageError(f"cannot read {what} {_short(path)}: {e.strerror or e}",
                         hint=hint) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UsageError(f"{path} is {_kind(mode)}, not a regular file", hint=hint)
    return os.fdopen(fd, "rb")


def load_npy(path: str | Path, where: str) -> Any:
    """The array in the ``.npy`` file at ``path``, its header checked against
    the file's size and :func:`max_array_bytes` before the data is read."""
    import numpy as np
    from numpy.lib import format as npformat

    hint = "write it with numpy.save"
    what = f"{where} (.npy file)"
    size = regular_file(path, what, hint, limit=max_array_bytes() + 2**20,
                        prefix=f"{where}: ").st_size
    with _open_regular(path, what, hint) as f:
        try:
            version = npformat.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = npformat.read_array_header_1_0(f)
            else:
                shape, _, dtype = npformat.read_array_header_2_0(f)
        except (ValueError, OSError, EOFError, SyntaxError) as e:
            raise UsageError(f"{where}: cannot read {path} as a .npy array ({e})",
                             hint=hint) from None
        if dtype.hasobject:
            raise UsageError(f"{where}: {path} holds Python objects, not numbers", hint=hint)
        n = 1
        for d in shape:
            n *= d
        held = size - f.tell()
        if n * dtype.itemsize > held:
            raise UsageError(f"{where}: the header of {path} claims {n} elements of {dtype} "
                             f"({n * dtype.itemsize} bytes) but the file holds {held} bytes "
                             "of data", hint="the file is truncated or its header is "
                                             "corrupt; " + hint)
        check_array_size(where, tuple(shape), dtype.itemsize)
        f.seek(0)
        try:
            return np.load(f, allow_pickle=False)
        except (OSError, ValueError, EOFError) as e:
            raise UsageError(f"{where}: cannot read {path} as a .npy array ({e})",
                             hint=hint) from None
