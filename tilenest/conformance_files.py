"""The conformance runner's untrusted inputs: recipes, command templates and the
files an external implementation writes.

Everything here is read as hostile: a recipe may be any JSON document, a
template any text, an implementation may leave a FIFO, a device, a lying
``.npy`` header or random bytes where an output belongs. Each such input ends
as one located message (a :class:`~tilenest.errors.TilenestError` naming the
file, or an :class:`OutputError` the runner reports for the case), never as a
crash, a hang or an allocation the size of a header's claim.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import errors as ERR

SCHEMA = "tilenest.conformance/1"
PLACEHOLDERS = ("{case}", "{inputs}", "{outputs}")

#: names that become file names (case folders, ``ARG.npy``): no separator, no ``..``
_PLAIN = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*\Z")

# ---------------------------------------------------------------------------- recipes
_ARG_KINDS = ("tensor", "scalar")


def _line_of(text: str, key: str) -> int:
    """The line of the first ``"key"`` in a recipe's text (1 when absent)."""
    at = text.find(f'"{key}"')
    return text.count("\n", 0, at) + 1 if at >= 0 else 1


def _plain(v: Any) -> bool:
    return isinstance(v, str) and bool(_PLAIN.match(v)) and ".." not in v


def check_recipe(d: Any, path: Path, text: str) -> None:
    """Raise a located error unless ``d`` (the parsed JSON of ``path``) has the
    shape of a recipe (spec/conformance/README.md, "Recipes"): an object whose
    ``name``, ``program``, ``wrong`` and argument names are plain file names
    (they name temporary folders and ``ARG.npy`` files, so a separator or
    ``..`` would reach outside them), ``rules`` a list of strings, ``args`` a
    list of argument objects, ``params`` an object of integers and ``expect``
    an object. The values of ``expect`` are judged by the loader."""

    def bad(key: str, what: str, hint: str | None = None) -> ERR.TilenestError:
        return ERR.TilenestError(f"conformance recipe: {what}",
                                 ERR.Site(str(path), _line_of(text, key)), hint)

    if not isinstance(d, dict):
        raise ERR.TilenestError(f"conformance recipe: the document is a JSON "
                                f"{type(d).__name__ if d is not None else 'null'}, not an object",
                                ERR.Site(str(path), 1), hint="see spec/conformance/README.md")
    if d.get("schema") != SCHEMA:
        raise bad("schema", f"'schema' must be {SCHEMA!r}")
    for key in ("name", "rules", "program", "args", "expect"):
        if key not in d:
            raise bad(key, f"lacks '{key}'")
    plain = "a plain file name: letters, digits, '_', '.', '+', '-', no '/' or '..'"
    for key in ("name", "program", "wrong"):
        if key in d and not (key == "wrong" and d[key] in (None, "")) and not _plain(d[key]):
            raise bad(key, f"'{key}' is {json.dumps(d[key])[:60]}, not {plain}")
    if not (isinstance(d["rules"], list) and d["rules"]
            and all(isinstance(r, str) for r in d["rules"])):
        raise bad("rules", "'rules' must be a non-empty list of rule names (\"V-9\")")
    for key in ("summary", "gap"):
        if d.get(key) is not None and not isinstance(d[key], str):
            raise bad(key, f"'{key}' must be a string")
    params = d.get("params", {})
    if not (isinstance(params, dict) and all(isinstance(v, int) and not isinstance(v, bool)
                                             for v in params.values())):
        raise bad("params", "'params' must be an object mapping parameter names to integers")
    if not isinstance(d["expect"], dict):
        raise bad("expect", "'expect' must be an object, e.g. {\"verdict\": \"admitted\"}")
    if not isinstance(d["args"], list):
        raise bad("args", "'args' must be a list of argument objects")
    seen: set[str] = set()
    for i, a in enumerate(d["args"]):
        where = f"args[{i}]"
        if not isinstance(a, dict):
            raise bad("args", f"{where} is not an object")
        if not _plain(a.get("name")):
            raise bad("args", f"{where}: 'name' must be {plain}")
        if a["name"] in seen:
            raise bad("args", f"{where}: a second argument named '{a['name']}'")
        if "alias" in a:
            if a["alias"] not in seen:
                raise bad("alias", f"{where}: 'alias' must name an earlier argument")
        elif a.get("kind") not in _ARG_KINDS:
            raise bad("args", f"{where}: 'kind' must be one of {', '.join(_ARG_KINDS)}")
        elif not isinstance(a.get("dtype"), str):
            raise bad("args", f"{where}: 'dtype' must be a dtype name (\"f32\")")
        elif a["kind"] == "tensor" and not (
                isinstance(a.get("shape"), list)
                and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                        for n in a["shape"])):
            raise bad("args", f"{where}: 'shape' must be a list of non-negative integers")
        elif a["kind"] == "tensor" and not isinstance(a.get("fill", {}), dict):
            raise bad("args", f"{where}: 'fill' must be an object ({{\"pattern\": ...}})")
        elif a["kind"] == "scalar" and (isinstance(a.get("value"), bool)
                                        or not isinstance(a.get("value"), (int, float, str))):
            raise bad("args", f"{where}: a scalar's 'value' must be a number or \"nan\", "
                              "\"inf\", \"-inf\", \"-0.0\"")
        seen.add(a["name"])


# --------------------------------------------------------------------------- templates
_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash"})


def _program_index(words: list[str] | tuple[str, ...]) -> int:
    """The index of the program a template runs: its first word, or the word
    after ``env`` and its options and ``VAR=value`` assignments (past the end
    when ``env -S`` splits a string of its own: no program word then)."""
    i = 0
    if words and os.path.basename(words[0]) == "env":
        i = 1
        while i < len(words) and (words[i].startswith("-") or "=" in words[i]):
            if words[i].startswith("-S") or words[i].startswith("--split-string"):
                return len(words)
            i += 2 if words[i] in ("-u", "-C", "--unset", "--chdir") else 1
    return i


def _script_word(words: list[str]) -> int | None:
    """The index of the word a shell runs as code (``sh -c SCRIPT``, also
    behind ``env VAR=... ``, with options such as ``-e`` or ``-o pipefail``
    before ``-c``), or None when the template does not run a shell script."""
    i = _program_index(words)
    if i >= len(words) or os.path.basename(words[i]) not in _SHELLS:
        return None
    j = i + 1
    while j < len(words) and words[j][:1] in ("-", "+") and words[j] != "--":
        w = words[j]
        if w in ("-o", "+o"):
            j += 2
            continue
        if w.startswith("-") and not w.startswith("--") and "c" in w[1:]:
            return j + 1 if j + 1 < len(words) else None
        j += 1
    return None


def shell_substitute(script: str, values: Mapping[str, str]) -> str:
    """``script`` (shell code) with each placeholder replaced by text the shell
    reads back as exactly the value: quoted for the context the placeholder
    stands in (bare, inside single quotes, inside double quotes), so that a
    value holding ``;``, spaces, quotes or ``$`` stays one piece of data.
    Placeholders inside ``$(...)`` or backquotes are quoted for the context
    around them, which is not the one the shell uses there."""
    out: list[str] = []
    state = ""  # "", "'" or '"': the quotes the scanner stands in
    i = 0
    while i < len(script):
        ph = next((p for p in values if script.startswith(p, i)), None)
        if ph is not None:
            v = values[ph]
            if state == "":
                out.append(shlex.quote(v))
            elif state == "'":
                out.append("'" + shlex.quote(v) + "'")  # close, the quoted word, reopen
            else:
                out.append(re.sub(r'([\\"$`])', r"\\\1", v))
            i += len(ph)
            continue
        ch = script[i]
        if ch == "\\" and state != "'":
            out.append(script[i:i + 2])  # an escaped character, whatever it is
            i += 2
            continue
        out.append(ch)
        if state == "" and ch in "'\"":
            state = ch
        elif state != "" and ch == state:
            state = ""
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class Template:
    """An implementation's command template: argv words with the placeholders
    ``{case}``, ``{inputs}`` and ``{outputs}``. A placeholder in an ordinary
    word is replaced by the plain value (the word stays one argv entry, no
    shell reads it); in the script of a shell (``sh -c '...'``) by the value
    quoted for the shell (:func:`shell_substitute`)."""

    text: str
    words: tuple[str, ...]
    script: int | None

    @classmethod
    def parse(cls, text: str, option: str = "--impl") -> Template:
        """Split ``text`` like a POSIX shell command line; a mistake is a usage
        error naming ``option``."""
        example = f"e.g. {option} 'my-impl {{case}} {{inputs}} {{outputs}}'"
        try:
            words = shlex.split(text)
        except ValueError as e:  # an unbalanced quote, a trailing backslash
            raise ERR.UsageError(f"{option} command cannot be split into words: {e} "
                                 f"in {text!r}", hint="balance its quotes; " + example) from None
        if not words:
            raise ERR.UsageError(f"{option} needs a command", hint=example)
        if not any("{case}" in w for w in words):
            raise ERR.UsageError(f"{option} command has no {{case}} placeholder", hint=example)
        return cls(text, tuple(words), _script_word(words))

    @property
    def program(self) -> str:
        return self.words[0]

    def check_program(self, option: str = "--impl") -> None:
        """A usage error unless the program can be started: a command on
        ``PATH`` or an executable file (checked once, before any case runs;
        behind ``env``, the program ``env`` starts)."""
        for i in sorted({0, _program_index(self.words)}):
            if i < len(self.words):
                self._check_one(self.words[i], option)

    @staticmethod
    def _check_one(prog: str, option: str) -> None:
        if any(p in prog for p in PLACEHOLDERS) or shutil.which(prog) is not None:
            return
        p = Path(prog)
        if os.sep in prog and p.is_file():
            why = "is not executable"
            hint = f"chmod +x {prog}, or start it through its interpreter (python3 {prog} ...)"
        elif os.sep in prog:
            why, hint = "does not exist", "give the implementation's path"
        else:
            why, hint = "is not a command on PATH", "give its path, or add its folder to PATH"
        raise ERR.UsageError(f"{option}: cannot start the implementation: {prog} {why}",
                             hint=hint)

    def argv(self, values: Mapping[str, str]) -> list[str]:
        """The command line of one case."""
        out = []
        for i, w in enumerate(self.words):
            if i == self.script:
                out.append(shell_substitute(w, values))
            else:
                for p, v in values.items():
                    w = w.replace(p, v)
                out.append(w)
        return out


class CannotStart(ERR.UsageError):
    """The implementation's command could not be started at all (no such file,
    not executable, not a program): one error for the run, not one per case."""


@dataclass
class Finished:
    """How one run of an implementation ended: its exit status and the last
    lines it printed (stdout and stderr together)."""

    returncode: int
    tail: str


def run_command(argv: list[str], timeout: float, option: str = "--impl") -> Finished | None:
    """Run ``argv`` in a session of its own; None when it is still running
    after ``timeout`` seconds. Whatever the command started (background
    children included) is killed when it ends or times out, so that nothing
    still writes its outputs while they are read. Output goes to a temporary
    file, not a pipe: a child that keeps the pipe open cannot stall the run."""
    with tempfile.TemporaryFile() as log:
        try:
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            raise CannotStart(f"{option}: cannot start the implementation {argv[0]}: "
                              f"{e.strerror or e}",
                              hint="check the command; a script needs a #! line and +x, or "
                                   "its interpreter in front") from None
        try:
            code = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait()
        if code is None:
            return None
        log.seek(max(0, log.seek(0, os.SEEK_END) - 4096))
        text = log.read().decode("utf-8", "replace")
    return Finished(code, " | ".join(text.strip().splitlines()[-3:]))


# ----------------------------------------------------------------------------- outputs
class OutputError(Exception):
    """An output file the runner refuses to read; the message names the file."""


def _open_regular(path: Path, limit: int) -> tuple[Any, int]:
    """``(binary file, size)`` of ``path``, opened without blocking: a FIFO,
    a device or a folder in its place is refused, as is a file over ``limit``
    bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise OutputError(f"cannot open {path.name}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a plain file")
        raise OutputError(f"{path.name} is {kind}, not a regular file")
    if st.st_size > limit:
        os.close(fd)
        raise OutputError(f"{path.name} is too large: {st.st_size} bytes, at most {limit} "
                          "are read")
    return os.fdopen(fd, "rb"), st.st_size


def read_error_json(path: Path) -> dict[str, Any]:
    """The implementation's ``error.json``: an object with a string ``kind``."""
    f, _ = _open_regular(path, 1 << 20)
    with f:
        raw = f.read()
    try:
        d = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        d = None
    if not isinstance(d, dict) or not isinstance(d.get("kind"), str):
        raise OutputError("error.json is not a JSON object with a string 'kind'")
    return d


_NPY_MAGIC = b"\x93NUMPY"


def read_npy(path: Path, max_bytes: int) -> np.ndarray:
    """An output array from an ``.npy`` file, sized from its header before
    anything is allocated: at most ``max_bytes`` of data, no more than the file
    holds, no Python objects."""
    f, size = _open_regular(path, max_bytes + (1 << 16))
    with f:
        if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
            raise OutputError(f"{path.name} is not an .npy file (it does not start with the "
                              "NumPy magic string)")
        f.seek(0)
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
            elif version == (2, 0):
                shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise ValueError(f"format version {version[0]}.{version[1]} is not supported")
        except ValueError as e:
            raise OutputError(f"{path.name} has no valid .npy header: {e}") from None
        if dtype.hasobject:
            raise OutputError(f"{path.name} holds Python objects (pickled data); outputs are "
                              "arrays of numbers")
        count = 1
        for n in shape:
            count *= int(n)
        nbytes = count * dtype.itemsize
        if nbytes > max_bytes:
            raise OutputError(f"{path.name} is too large: its header claims shape "
                              f"{tuple(shape)} of {dtype} ({nbytes} bytes), more than the "
                              f"{max_bytes} bytes an output of this case may hold")
        held = size - f.tell()
        if held < nbytes:
            raise OutputError(f"{path.name} is truncated: its header claims {nbytes} bytes of "
                              f"data, the file holds {held} after the header")
        data = f.read(nbytes)
    a = np.frombuffer(data, dtype=dtype, count=count)
    return a.reshape(shape, order="F" if fortran else "C").copy()
