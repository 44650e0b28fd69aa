"""Host emulator for generated SIMT source: the source itself, compiled as host C++.

A generated source of a :class:`~tilenest.backends.simt.emu_dialects.Dialect`
(CUDA C++, or the Metal Shading Language) is compiled by the host C++ compiler against the dialect's
thin header over the runtime core ``shim/tn_runtime.h`` (for CUDA
``g++ -x c++ -std=c++17 -DTN_EMULATE -include shim/tn_cuda_shim.h``) into a
shared library, one launcher per kernel; a launch runs every GPU thread of a
block as a fiber, under the target profile's
:class:`~tilenest.backends.simt.emu_dialects.Limits` (lanes per warp, threads
per block, shared memory), which the runtime receives with every launch.
Nothing here compiles for a GPU: a dialect emulates without its vendor's
compiler. What the emulator guarantees (the runtime's header comment states
it in full):

* threads switch only at barriers and warp collectives, and at each switch
  point the *interleaving policy* (:data:`POLICIES`) picks who runs next, so
  a kernel that is correct under CUDA's rules gives the same answer under
  every policy, and one that leans on an ordering CUDA does not promise
  usually gives a different answer under some policy;
* dynamic shared memory is poisoned before every block (:data:`POISONS`);
* a divergent barrier, a warp collective with a wrong or mismatched mask, a
  lane that exits while its warp waits for it, a deadlock, a fiber stack
  overflow, a wild memory access and ``__trap()`` end the launch and raise
  :class:`EmulatorError` naming the kernel, block, thread and source line.

:func:`run_tsan` builds the same source with ``-fsanitize=thread`` into a
stand-alone executable (each GPU thread a TSan fiber, barriers and collectives
annotated as synchronization), runs it in a subprocess on arrays passed
through files, and returns the data races TSan reports, each with the lines
of the generated source that race.

Compiled artifacts live in the ``simt-emu`` folder of the persistent cache
(``tilenest.diskcache``), keyed by a hash of the source, the launchers, the
flags, the texts of the dialect's header and the runtime core, and the
compiler's version. A build's manifest is a
cache entry (digest-checked, refused when someone else could have written
it) naming the library by a plain file name in the same folder, with the
library's SHA-256: before a cached library is loaded, the headers it was
built from are checked by content and the library itself against that
digest (a damaged one is rebuilt, one another user could have written is
refused). A build that cannot write to the cache (a full disk, a read-only
folder) or runs in no-store mode is made in a private folder of the process
instead, uncached; temporary files of a build that was killed are removed
by the next build.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tilenest import diskcache as DC
from tilenest.diskcache import atomic_write, cache_root
from tilenest.errors import RuntimeSemanticError, Site, TilenestError

from . import guard_pages as GP
from .emu_dialects import CUDA, RUNTIME_PATH, SHIM_DIR, Dialect, Limits
from .emu_dialects import dialect as _dialect

__all__ = [
    "BLOCK_ORDERS",
    "CUDA",
    "Dialect",
    "Limits",
    "POISONS",
    "POLICIES",
    "SHIM_PATH",
    "EmuModule",
    "EmulatorBuildError",
    "EmulatorError",
    "LaunchError",
    "Race",
    "TsanReport",
    "build",
    "cache_dir",
    "parse_kernels",
    "parse_tsan_output",
    "run_tsan",
    "tsan_available",
]

#: Interleaving policies: who runs next at each switch point.
#: ``in_order`` the lowest runnable thread; ``reversed`` the highest;
#: ``warp_ahead`` the threads of one warp (chosen by the seed) as far as the
#: barriers allow, then the others in order; ``random`` a seeded uniform pick.
POLICIES = ("in_order", "reversed", "warp_ahead", "random")
#: Shared-memory poison: ``nan`` 0x7fc00000 words (a float NaN), ``big``
#: 0x7f7fffff words (the largest finite float), ``bytes`` every byte 0xa5.
#: Shuffles that read a lane outside their mask also return the poison.
POISONS = ("nan", "big", "bytes")
#: Order of blocks: ``in_order`` (x fastest) or a ``shuffle`` by the seed.
BLOCK_ORDERS = ("in_order", "shuffle")

#: the CUDA dialect's thin header, and its profile's shared-memory bytes
SHIM_PATH = CUDA.header
SMEM_CAPACITY = CUDA.limits.shared_bytes
DEFAULT_STACK = 64 * 1024

_CXX = os.environ.get("TILENEST_CXX", "g++")
#: the options of every build (the dialect adds its language's: Dialect.flags)
_BASE_FLAGS = ("-O1", "-fno-strict-aliasing", "-ffp-contract=off", "-fvisibility=hidden",
               "-fno-gnu-unique", "-pthread")
_LIB_FLAGS = ("-fPIC", "-shared")
#: a TSan build carries debug lines: its reports name the generated source's lines
_TSAN_FLAGS = ("-g", "-fsanitize=thread", "-fno-omit-frame-pointer", "-DTN_EMU_RUNNER=1")

_ERROR_KINDS = {
    1: "divergent barrier",
    2: "warp collective mask mismatch",
    3: "deadlock",
    4: "fiber stack overflow",
    5: "invalid memory access",
    6: "trap",
    7: "bad launch",
    8: "arithmetic fault",
    9: "warp collective lane exited",
    10: "asynchronous copy protocol violation",
}


class EmulatorError(RuntimeSemanticError):
    """The emulator found a synchronization or memory fault in a launch.

    ``code`` is the shim's error code, ``what`` its name, ``kernel``, ``block``
    and ``thread`` the culprit, ``line`` the line of the generated source (0
    when unknown)."""

    kind = "emulator error"

    def __init__(self, message: str, sites=(), hint: str | None = None, notes=(), *,
                 code: int = 0, kernel: str = "", block: tuple[int, int, int] = (0, 0, 0),
                 thread: tuple[int, int, int] = (0, 0, 0), line: int = 0):
        self.code = code
        self.what = _ERROR_KINDS.get(code, "error")
        self.kernel = kernel
        self.block = block
        self.thread = thread
        self.line = line
        super().__init__(message, sites, hint, notes)


class EmulatorBuildError(TilenestError):
    """The host compiler rejected a generated source (with the shim)."""

    kind = "emulator build error"


class LaunchError(TilenestError):
    """A launch whose arguments or configuration do not fit the kernel."""

    kind = "launch error"


# --------------------------------------------------------------------- the C ABI
class _Cfg(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint32 * 3), ("block", ctypes.c_uint32 * 3),
                ("shared_bytes", ctypes.c_uint64), ("stack_bytes", ctypes.c_uint64),
                ("seed", ctypes.c_uint64), ("policy", ctypes.c_int32),
                ("poison", ctypes.c_int32), ("block_order", ctypes.c_int32),
                ("flags", ctypes.c_int32), ("lanes", ctypes.c_uint32),
                ("max_threads", ctypes.c_uint32), ("max_block", ctypes.c_uint32 * 3),
                ("reserved", ctypes.c_uint32), ("max_shared", ctypes.c_uint64)]


class _Err(ctypes.Structure):
    _fields_ = [("code", ctypes.c_int32), ("line", ctypes.c_int32),
                ("block", ctypes.c_uint32 * 3), ("thread", ctypes.c_uint32 * 3),
                ("message", ctypes.c_char * 2048)]


_LAUNCH_PROTO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p),
                                 ctypes.POINTER(_Cfg), ctypes.POINTER(_Err))

#: scalar C types a kernel may take, with their ctypes
_SCALARS: dict[str, type] = {
    "int": ctypes.c_int32, "signed": ctypes.c_int32, "signed int": ctypes.c_int32,
    "unsigned": ctypes.c_uint32, "unsigned int": ctypes.c_uint32,
    "long long": ctypes.c_int64, "long long int": ctypes.c_int64, "long": ctypes.c_int64,
    "unsigned long long": ctypes.c_uint64, "unsigned long": ctypes.c_uint64,
    "short": ctypes.c_int16, "unsigned short": ctypes.c_uint16,
    "char": ctypes.c_int8, "signed char": ctypes.c_int8, "unsigned char": ctypes.c_uint8,
    "bool": ctypes.c_bool, "float": ctypes.c_float, "double": ctypes.c_double,
    "int8_t": ctypes.c_int8, "int16_t": ctypes.c_int16, "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64, "uint8_t": ctypes.c_uint8, "uint16_t": ctypes.c_uint16,
    "uint32_t": ctypes.c_uint32, "uint64_t": ctypes.c_uint64, "size_t": ctypes.c_uint64,
}
#: pointee C type -> the numpy dtype an array argument must have
_POINTEES: dict[str, np.dtype] = {
    k: np.dtype(v) for k, v in {
        "float": np.float32, "double": np.float64, "int": np.int32, "unsigned": np.uint32,
        "unsigned int": np.uint32, "long long": np.int64, "unsigned long long": np.uint64,
        "short": np.int16, "unsigned short": np.uint16, "signed char": np.int8,
        "unsigned char": np.uint8, "int8_t": np.int8, "uint8_t": np.uint8,
        "int16_t": np.int16, "uint16_t": np.uint16, "int32_t": np.int32,
        "uint32_t": np.uint32, "int64_t": np.int64, "uint64_t": np.uint64, "bool": np.bool_,
        "half": np.float16, "bfloat": np.uint16,
    }.items()
}
_QUALIFIERS = re.compile(r"\b(const|volatile|__restrict__|__restrict|restrict|__grid_constant__)\b")


def _norm(t: str) -> str:
    return " ".join(t.replace("*", " * ").split())


@dataclass(frozen=True)
class _Param:
    """One kernel parameter: its C type text, whether it is a pointer, and the
    ctypes scalar type or the dtype an array must have (None: any dtype).
    ``reference``: a reference parameter (Metal's ``constant S&``), passed
    an array whose bytes it refers to; ``builtin``: the C++ expression the
    launcher passes for a built-in parameter (no launch argument)."""

    ctype: str
    pointer: bool
    scalar: type | None
    dtype: np.dtype | None
    const: bool
    reference: bool = False
    builtin: str | None = None
    #: bytes of a struct passed by value (``Dialect.structs``); 0 for none
    struct: int = 0

    @property
    def argument(self) -> bool:
        """Whether the caller passes this parameter (a built-in it does not)."""
        return self.builtin is None


#: a parameter attribute: ``[[buffer(0)]]``, ``[[thread_position_in_threadgroup]]``
_ATTRIBUTE = re.compile(r"\[\[\s*([^\[\]]*?)\s*\]\]")


def _base_type(text: str, dia: Dialect) -> str:
    """The type named by ``text`` without qualifiers and address spaces, in C's names."""
    words = [w for w in _QUALIFIERS.sub(" ", text).split() if w not in dia.address_spaces]
    base = " ".join(words)
    return dia.type_names.get(base, base)


def _param(ctype: str, kernel: str, dia: Dialect = CUDA) -> _Param:
    attrs = ["".join(a.split()) for a in _ATTRIBUTE.findall(ctype)]
    text = _norm(_ATTRIBUTE.sub(" ", ctype))
    for a in attrs:
        if a in dia.builtins:
            return _Param(ctype, False, None, None, True, builtin=dia.builtins[a])
    words = set(text.replace("&", " ").split())
    read_only = bool(words & ({"const"} | set(dia.read_only)))
    if "*" in text:
        head = text[: text.index("*")]
        read_only = bool(set(head.split()) & ({"const"} | set(dia.read_only)))
        return _Param(ctype, True, None, _POINTEES.get(_base_type(head, dia)), read_only)
    if text.endswith("&"):
        return _Param(ctype, True, None, None, read_only, reference=True)
    base = _base_type(text, dia)
    if base in dia.structs:
        return _Param(ctype, False, None, None, True, struct=dia.structs[base])
    if base not in _SCALARS:
        raise LaunchError(f"kernel {kernel}: parameter type {ctype!r} is not a pointer or a "
                          f"scalar the emulator knows",
                          hint="scalars: " + ", ".join(sorted(_SCALARS)))
    return _Param(ctype, False, _SCALARS[base], None, False)


# ----------------------------------------------------------------- the source
def _strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", lambda m: " " * len(m.group(0)), src, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", "", src)


_TYPE_WORDS = {"int", "char", "short", "long", "float", "double", "unsigned", "signed", "bool"}


def parse_kernels(source: str, dialect: Dialect | str = CUDA) -> dict[str, list[str]]:
    """The kernels defined in ``source`` (CUDA's ``__global__`` functions, or
    the ``dialect``'s kernel marker): name -> parameter C types (parameter
    names and ``__launch_bounds__`` removed), in order. A parameter whose
    attribute is one of the dialect's built-ins keeps it (``uint3
    [[thread_position_in_threadgroup]]``); other attributes (Metal's
    ``[[buffer(n)]]``) are dropped."""
    dialect = _dialect(dialect)
    text = re.sub(r"__(launch_bounds|cluster_dims)__\s*\([^()]*\)", " ", _strip_comments(source))
    out: dict[str, list[str]] = {}
    for m in dialect.kernel_pattern().finditer(text):
        name = m.group("name")
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        params_text = text[m.end(): i - 1]
        rest = text[i:].lstrip()
        if not rest.startswith("{"):
            continue  # a declaration, not the definition
        params: list[str] = []
        for p in _split_params(params_text):
            p = p.strip()
            if not p or p == "void":
                continue
            p = re.sub(r"\s*=.*$", "", p)
            attrs = ["".join(a.split()) for a in _ATTRIBUTE.findall(p)]
            keep = [a for a in attrs if a in dialect.builtins]
            p = _ATTRIBUTE.sub(" ", p).strip()
            m2 = re.match(r"^(.*?)([A-Za-z_]\w*)\s*$", p)
            if m2 and m2.group(1).strip() and m2.group(2) not in _TYPE_WORDS:
                p = m2.group(1)
            params.append(_norm(p) + "".join(f" [[{a}]]" for a in keep))
        out[name] = params
    return out


def _split_params(text: str) -> list[str]:
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch in "(<[":
            depth += 1
        elif ch in ")>]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _launchers(kernels: Mapping[str, Sequence[str]], runner: bool, dialect: Dialect) -> str:
    """The host launcher of each kernel: a thunk unpacking ``void**`` into a
    call of the dialect's entry function of the kernel and an exported
    ``tn_emu_launch_NAME``; with ``runner`` also the executable's main."""
    lines = ['#line 1 "tn_emu_launchers"']
    for name, params in kernels.items():
        if not re.fullmatch(r"[A-Za-z_]\w*", name):
            raise LaunchError(f"kernel name {name!r} is not a C identifier")
        call = []
        for i, t in enumerate(params):
            p = _param(t, name, dialect)
            lines.append(f"typedef {_ATTRIBUTE.sub(' ', t).strip()} tn_emu_{name}_p{i};")
            if p.builtin is not None:
                call.append(p.builtin.format(type=f"tn_emu_{name}_p{i}"))
            elif p.reference:
                call.append(f"*(std::remove_reference<tn_emu_{name}_p{i}>::type *)"
                            f"*(void **)a[{i}]")
            else:
                call.append(f"*(tn_emu_{name}_p{i} *)a[{i}]")
        entry = dialect.entry.format(name=name)
        lines.append(f"static void tn_emu_thunk_{name}(void **a) {{ (void)a; {entry}({', '.join(call)}); }}")
        lines.append(
            f'extern "C" __attribute__((visibility("default"))) int tn_emu_launch_{name}'
            f"(void **a, const tn_emu_cfg *c, tn_emu_err *e) "
            f'{{ return tn_emu::launch(tn_emu_thunk_{name}, "{name}", a, c, e); }}')
    if runner:
        rows = ", ".join(f'{{"{n}", tn_emu_launch_{n}}}' for n in kernels)
        lines.append(f"static const tn_emu::KernelEntry tn_emu_table[] = {{{rows}}};")
        lines.append("int main(int argc, char **argv) { return tn_emu::runner_main(argc, argv, "
                     f"tn_emu_table, {len(kernels)}); }}")
    return "\n".join(lines) + "\n"


# -------------------------------------------------------------------- building
def cache_dir() -> Path:
    """Where compiled emulator artifacts live: ``$TILENEST_EMU_CACHE``, else
    the ``simt-emu`` folder of the persistent cache (``tilenest.diskcache``:
    ``$TILENEST_CACHE_DIR``, ``$XDG_CACHE_HOME/tilenest``, ``~/.cache/tilenest``);
    with the cache off, a folder of this process's that goes with it."""
    env = os.environ.get("TILENEST_EMU_CACHE")
    if env:
        return Path(env)
    root = cache_root()
    if root is None:
        return _private_dir()
    return root / "simt-emu"


_PRIVATE: tempfile.TemporaryDirectory | None = None
_PRIVATE_LOCK = threading.Lock()


def _private_dir() -> Path:
    """A folder of this process's (``0700``, removed at exit): builds that are
    not kept (cache off, no-store mode, a cache that cannot be written)."""
    global _PRIVATE
    with _PRIVATE_LOCK:
        if _PRIVATE is None:
            _PRIVATE = tempfile.TemporaryDirectory(prefix="tilenest-emu-")
        return Path(_PRIVATE.name)


#: a library or executable a manifest may name: a bare name in its own folder
_ARTIFACT_RE = re.compile(r"[0-9a-f]{24}-[0-9a-f]{12}\.(so|tsan)")
_STORES: dict[tuple[str, bool], DC.Store] = {}
_CLEANED: set[str] = set()


def _store(d: Path, per_program: bool = True) -> DC.Store:
    """The manifest store of the build folder ``d``: under the cache root
    its ``simt-emu`` store (the root is checked too), else ``d`` itself.
    ``per_program=False``: the shim's precompiled form, kept in no-store mode."""
    k = (str(d), per_program)
    if k not in _STORES:
        root = cache_root()
        st = DC.Store(d.name, d.parent, per_program=per_program) if root is not None and \
            d.parent == root else DC.Store("", d, per_program=per_program)
        _STORES[k] = st
    return _STORES[k]


_version_lock = threading.Lock()
_versions: dict[str, str] = {}


def _compiler_version() -> str:
    with _version_lock:
        if _CXX not in _versions:
            try:
                out = subprocess.run([_CXX, "--version"], capture_output=True, text=True,
                                     check=True).stdout
            except (OSError, subprocess.CalledProcessError) as e:
                raise EmulatorBuildError(f"the host C++ compiler {_CXX!r} cannot be run: {e}",
                                         hint="install g++ or set TILENEST_CXX") from None
            _versions[_CXX] = out.splitlines()[0] if out else _CXX
        return _versions[_CXX]


def tsan_available() -> bool:
    """Whether the compiler has a ThreadSanitizer runtime (``libtsan.so``)."""
    try:
        out = subprocess.run([_CXX, "-print-file-name=libtsan.so"], capture_output=True,
                             text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return False
    return bool(out) and os.path.isabs(out) and os.path.exists(out)


def _hash_file(p: str) -> str:
    try:
        return hashlib.sha256(Path(p).read_bytes()).hexdigest()
    except OSError:
        return ""


def _cached_artifact(d: Path, key: str) -> Path | None:
    """The library (or TSan executable) the manifest ``key`` of folder ``d``
    names, if every header it was built from is unchanged (by content) and
    the file matches the manifest's digest; None otherwise (a manifest or
    file that is damaged is discarded). Raises ``UnsafeCacheError`` for a
    folder, manifest or file someone else could have written."""
    store = _store(d)
    got = store.get(key)
    if got is None:
        return None
    meta = got[0]
    name, digest, deps = meta.get("artifact"), meta.get("sha256"), meta.get("deps")
    if not (isinstance(name, str) and _ARTIFACT_RE.fullmatch(name) and isinstance(digest, str)
            and isinstance(deps, dict)):
        store.discard(key)  # not a manifest this code wrote: never followed
        return None
    if any(_hash_file(str(p)) != h for p, h in deps.items()):
        return None
    artifact = d / name
    if DC.sha256_file(artifact) != digest:
        store.discard(key)  # missing, truncated or altered: rebuilt
        return None
    DC.touch(artifact)
    return artifact


def _read_depfile(path: Path, skip: set[str]) -> dict[str, str]:
    text = path.read_text().replace("\\\n", " ")
    _, _, rest = text.partition(":")
    files = [f for f in rest.split() if f not in skip]
    return {f: _hash_file(f) for f in files}


def _shim_texts(dia: Dialect) -> tuple[str, str]:
    """The dialect's header text, and what identifies the shim a build
    includes: that text and the runtime core's (the header includes it)."""
    header = dia.header.read_text()
    return header, json.dumps([header, RUNTIME_PATH.read_text()])


def _shim_includes(dia: Dialect) -> list[str]:
    """``-I`` options for the shim: the runtime core's folder, and the
    dialect header's own where it lives elsewhere."""
    dirs = [str(SHIM_DIR)] + ([str(dia.header.parent)] if dia.header.parent != SHIM_DIR else [])
    return [x for d in dirs for x in ("-I", d)]


def _precompiled_shim(d: Path, shim_text: str, shim_id: str, flags: Sequence[str],
                      dia: Dialect) -> Path:
    """A copy of the dialect's header (``shim_text``) in the folder ``d``
    with its precompiled form beside it (``<copy>.gch``, built once per
    ``shim_id`` -- the header's and the runtime core's texts -- flags and
    compiler):
    a build that ``-include``s the copy reads the parsed shim instead of
    parsing it again, about a third of the time of a typical kernel's build.

    The copy and the ``.gch`` are used again only when the copy holds the
    shim's text and the ``.gch`` the digest recorded when it was built (its
    manifest is a cache entry); otherwise both are made again. The compiler
    takes the ``.gch`` only where it was made with the build's own options
    and falls back to the copy's text otherwise, so the result is the same
    either way. A failed precompile is not an error: the copy alone is
    returned (the build then reports any problem of the shim itself)."""
    key = hashlib.sha256(json.dumps([shim_id, list(flags), _compiler_version()])
                         .encode()).hexdigest()[:24]
    copy = d / f"shim-{key}.h"
    gch = d / f"shim-{key}.h.gch"
    store = _store(d, per_program=False)
    got = store.get(f"shim-{key}")
    if got is not None and DC.read_private(copy) == shim_text.encode() and \
            DC.sha256_file(gch) == got[0].get("gch"):
        return copy
    atomic_write(copy, shim_text.encode())
    with contextlib.suppress(FileNotFoundError):
        gch.unlink()  # an unverified one is never left where the compiler looks
    fd, tmp = DC.temp_file(d, gch.name)
    os.close(fd)
    pch_flags = [f for f in flags if f not in ("-x", "c++", *_LIB_FLAGS[1:])]
    cmd = [_CXX, *pch_flags, "-x", "c++-header", *_shim_includes(dia), str(copy), "-o", tmp]
    try:
        if subprocess.run(cmd, capture_output=True, check=False).returncode == 0:
            digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
            os.replace(tmp, gch)
            store.put(f"shim-{key}", {"gch": digest}, {})
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return copy


def _compile(source: str, kernels: Mapping[str, Sequence[str]], include_dirs: Sequence[str],
             tsan: bool, dia: Dialect = CUDA) -> Path:
    """Compile ``source`` + launchers of the dialect ``dia`` (cached); the
    path of the library or executable. A build that cannot write its files
    where they are kept (a full disk, an unwritable folder) is made again in
    the process's private folder; if that fails too, an
    :class:`EmulatorBuildError` says why."""
    shim_text, shim_id = _shim_texts(dia)
    incs = [str(Path(d).resolve()) for d in (*include_dirs, *dia.include_dirs)]
    flags = list(dia.flags()) + list(_BASE_FLAGS) + (list(_TSAN_FLAGS) if tsan else
                                                     list(_LIB_FLAGS))
    bad = dia.refusals(_strip_comments(source))
    if bad:
        line, text, hint = bad[0]
        raise EmulatorBuildError(f"the {dia.title} emulator cannot run '{text.strip()}'",
                                 Site(f"<{dia.name}>", line), hint)
    source = dia.prepare(source)
    full = source + ("\n" if not source.endswith("\n") else "") + _launchers(kernels, tsan, dia)
    key = hashlib.sha256(json.dumps([full, flags, incs, shim_id, _compiler_version()])
                         .encode()).hexdigest()[:24]
    d = cache_dir()
    private = _private_dir()
    try:
        hit = _cached_artifact(d, key) if DC.secure_folder(d, False, cache_root()) else None
        if hit is None and d != private:
            hit = _cached_artifact(private, key)  # built uncached earlier in this process
    except OSError:
        hit = None
    if hit is not None:
        return hit
    keep = d != private and (cache_root() is None or DC.writes_enabled())
    if keep:
        try:
            return _build(d, key, full, flags, incs, (shim_text, shim_id), tsan, dia)
        except OSError:
            pass  # a full disk or an unwritable cache: built uncached below
    try:
        return _build(private, key, full, flags, incs, (shim_text, shim_id), tsan, dia)
    except OSError as e:
        raise EmulatorBuildError(f"the emulator cannot write its build files: {e}",
                                 hint="free disk space in the temporary folder "
                                      f"({tempfile.gettempdir()}) or set TMPDIR") from None


def _build(d: Path, key: str, full: str, flags: list[str], incs: list[str],
           shim: tuple[str, str], tsan: bool, dia: Dialect) -> Path:
    """Build into folder ``d`` and record the manifest there (OSError when a
    file cannot be written, :class:`EmulatorBuildError` when the source does
    not compile)."""
    DC.secure_folder(d, True, cache_root())
    if str(d) not in _CLEANED:  # once per folder and process: a killed build's leftovers
        _CLEANED.add(str(d))
        DC.clean_stale(d)
    src_path = d / f"{key}.cu"
    atomic_write(src_path, full.encode())
    fd, tmp = DC.temp_file(d, key)
    os.close(fd)
    depfile = Path(tmp[: -len(".tmp")] + ".d.tmp")
    copy = _precompiled_shim(d, shim[0], shim[1], flags, dia)
    cmd = [_CXX, *flags, "-include", str(copy), *_shim_includes(dia)]
    for inc in incs:
        cmd += ["-I", inc]
    cmd += ["-MD", "-MF", str(depfile), str(src_path), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            if "No space left on device" in proc.stderr:
                raise OSError(errno.ENOSPC, "no space left on device", str(d))
            msg = proc.stderr.replace(str(src_path), "<generated>")
            raise EmulatorBuildError(
                f"the generated source does not compile as host C++ against the {dia.title} "
                "shim",
                hint="the emitter used a construct the shim does not provide, or the source "
                     f"is not valid {dia.language}",
                notes=tuple(msg.strip().splitlines()[:40]))
        deps = _read_depfile(depfile, {str(src_path), tmp, str(copy), str(copy) + ".gch"})
        # The artifact's name carries its headers' hash: a process that loaded
        # an older build keeps it, and dlopen never mistakes one for the other.
        tag = hashlib.sha256(json.dumps(deps, sort_keys=True).encode()).hexdigest()[:12]
        out = d / (f"{key}-{tag}.tsan" if tsan else f"{key}-{tag}.so")
        digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
        os.replace(tmp, out)
        store = _store(d)
        if d == _private_dir():
            store = _store(d, per_program=False)  # the process's own folder: always kept
        store.put(key, {"artifact": out.name, "sha256": digest, "deps": deps}, {})
    finally:
        for p in (tmp, str(depfile)):
            if os.path.exists(p):
                os.unlink(p)
    return out


# ------------------------------------------------------------------- launching
def _dim3(v, what: str) -> tuple[int, int, int]:
    t = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    if not 1 <= len(t) <= 3 or not all(isinstance(x, (int, np.integer)) for x in t):
        raise LaunchError(f"{what} must be an int or a tuple of 1 to 3 ints, not {v!r}")
    t = tuple(int(x) for x in t) + (1,) * (3 - len(t))
    if any(x < 1 or x >= 2**32 for x in t):
        raise LaunchError(f"{what} extents must be positive 32-bit values, not {v!r}")
    return t  # type: ignore[return-value]


def _choice(value: str, options: tuple[str, ...], what: str) -> int:
    if value not in options:
        raise LaunchError(f"unknown {what} {value!r}", hint=f"{what}s: {', '.join(options)}")
    return options.index(value)


def _make_cfg(grid, block, shared_bytes: int, policy: str, seed: int, poison: str,
              block_order: str, stack_size: int, limits: Limits) -> _Cfg:
    """One launch's configuration, with the profile's ``limits`` the runtime checks it by."""
    cfg = _Cfg()
    cfg.grid[:] = _dim3(grid, "grid")
    cfg.block[:] = _dim3(block, "block")
    if not 0 <= shared_bytes <= limits.shared_bytes:
        raise LaunchError(f"shared_bytes={shared_bytes} is outside 0..{limits.shared_bytes}")
    cfg.lanes = limits.lanes
    cfg.max_threads = limits.max_threads
    cfg.max_block[:] = limits.max_block
    cfg.max_shared = limits.shared_bytes
    cfg.shared_bytes = shared_bytes
    cfg.stack_bytes = stack_size
    cfg.seed = seed & (2**64 - 1)
    cfg.policy = _choice(policy, POLICIES, "policy")
    cfg.poison = _choice(poison, POISONS, "poison")
    cfg.block_order = _choice(block_order, BLOCK_ORDERS, "block order")
    return cfg


def _check_array(kernel: str, i: int, p: _Param, a: np.ndarray) -> None:
    if not a.flags.c_contiguous:
        raise LaunchError(f"kernel {kernel}: argument {i} ({p.ctype}) is not C-contiguous",
                          hint="pass np.ascontiguousarray(a) and read results from that array")
    if not p.const and not a.flags.writeable:
        raise LaunchError(f"kernel {kernel}: argument {i} ({p.ctype}) is read-only but the "
                          f"kernel may write it")
    if p.dtype is not None and a.dtype != p.dtype:
        raise LaunchError(f"kernel {kernel}: argument {i} ({p.ctype}) needs dtype {p.dtype}, "
                          f"got {a.dtype}")


def _scalar(kernel: str, i: int, p: _Param, v):
    assert p.scalar is not None
    if isinstance(v, np.ndarray):
        raise LaunchError(f"kernel {kernel}: argument {i} ({p.ctype}) is a scalar, got an array")
    if p.scalar in (ctypes.c_float, ctypes.c_double):
        return p.scalar(float(v))
    if p.scalar is ctypes.c_bool:
        return p.scalar(bool(v))
    if isinstance(v, (float, np.floating)) and float(v) != int(v):
        raise LaunchError(f"kernel {kernel}: argument {i} ({p.ctype}) is an integer, got {v!r}")
    iv = int(v)
    bits = ctypes.sizeof(p.scalar) * 8
    signed = p.scalar(-1).value == -1
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1)) if signed else (0, 2**bits)
    if not lo <= iv < hi:
        raise LaunchError(f"kernel {kernel}: argument {i} ({p.ctype}) = {iv} does not fit")
    return p.scalar(iv)


def _spread(kernel: str, params: Sequence[_Param], args: Sequence) -> list:
    """The caller's ``args`` in the slots of the kernel's ``params``: each
    parameter the caller passes takes the next argument (``bytes`` for a
    reference parameter become a byte array), a built-in one ``None``."""
    wanted = [p for p in params if p.argument]
    if len(args) != len(wanted):
        raise LaunchError(f"kernel {kernel} takes {len(wanted)} arguments, got {len(args)}")
    it = iter(args)
    out: list = []
    for p in params:
        if not p.argument:
            out.append(None)
            continue
        a = next(it)
        if p.reference and isinstance(a, (bytes, bytearray)):
            a = np.frombuffer(bytes(a), np.uint8)
        out.append(a)
    return out


_MEMORY_FAULT = 5
_FAULT_ADDRESS = re.compile(r"at address (0x[0-9a-fA-F]+)")


def _name_guard(err: _Err, at: "GP.Placement", params: list, arrays: list) -> None:
    """Where an invalid access hit the guard page after an array argument,
    say so in ``err``'s message: which argument, and how far past its end."""
    message = err.message.decode(errors="replace")
    m = _FAULT_ADDRESS.search(message)
    addr = int(m.group(1), 16) if m else None
    i = at.owner(addr) if addr is not None else None
    if i is None:
        return
    a = arrays[i]
    past = addr - (at.addresses[i] + a.nbytes)
    what = (f"access past the end of argument {i} ({params[i].ctype}, {a.nbytes} bytes, "
            f"shape {tuple(a.shape)}): at byte {a.nbytes + past} of it, {past} past its "
            f"end; {message}")
    err.message = what.encode()[:_Err.message.size - 1]


def _raise_for(err: _Err, kernel: str, dia: Dialect = CUDA) -> None:
    code = int(err.code)
    if code == 0:
        return
    block = tuple(int(x) for x in err.block)
    thread = tuple(int(x) for x in err.thread)
    line = int(err.line)
    message = err.message.decode(errors="replace")
    raise EmulatorError(
        f"{_ERROR_KINDS.get(code, 'error')} in kernel {kernel}, block {block}, thread {thread}: "
        f"{message}",
        Site(f"<{dia.name}:{kernel}>", line) if line > 0 else (), dia.hints.get(code),
        code=code, kernel=kernel, block=block, thread=thread, line=line)  # type: ignore[arg-type]


@dataclass
class EmuModule:
    """A compiled emulator library: its kernels (name -> parameter C types)
    and a launcher for each, its dialect, and the profile limits its launches
    run under. Launches of one module run one at a time."""

    path: Path
    kernels: dict[str, list[str]]
    _lib: ctypes.CDLL = field(repr=False)
    _params: dict[str, list[_Param]] = field(repr=False, default_factory=dict)
    dialect: Dialect = CUDA
    limits: Limits = CUDA.limits
    _lock: threading.Lock = field(repr=False, default_factory=threading.Lock)

    def state_address(self) -> int:
        """Address of this library's emulator state (distinct per library)."""
        fn = self._lib.tn_emu_state_addr
        fn.restype = ctypes.c_void_p
        return int(fn())

    def smem_address(self) -> int:
        """Address of this library's emulated shared memory (``tn_smem``)."""
        fn = self._lib.tn_emu_smem_addr
        fn.restype = ctypes.c_void_p
        return int(fn())

    def argument_dtypes(self, name: str) -> list[np.dtype | None]:
        """Per launch argument of kernel ``name`` (built-in parameters have
        none), the dtype an array passed there must have; None for a scalar
        or a pointer that takes any dtype."""
        return [p.dtype for p in self._params[name] if p.argument]

    def launch(self, name: str, grid, block, args: Sequence, *, shared_bytes: int = 0,
               policy: str = "in_order", seed: int = 0, poison: str = "nan",
               block_order: str = "in_order", stack_size: int = DEFAULT_STACK,
               guard: bool = True) -> None:
        """Run kernel ``name`` on ``grid`` x ``block`` threads. Arrays are
        passed by pointer and updated in place; scalars by value. Raises
        :class:`EmulatorError` for what the emulator detects (the launch stops
        at the first error; arrays may be partly written).

        With ``guard`` (the default) the arrays run as copies against guard
        pages (:mod:`.guard_pages`), so an access past an array's end is an
        invalid memory access naming that argument. A launch that passes a
        struct (a tensor map, which holds an array's address itself) runs on
        the caller's arrays."""
        if name not in self.kernels:
            raise LaunchError(f"no kernel {name!r} in this module",
                              hint="kernels: " + ", ".join(self.kernels))
        params = self._params[name]
        args = _spread(name, params, args)
        arrays = [a if p.pointer and p.builtin is None and isinstance(a, np.ndarray) else None
                  for p, a in zip(params, args, strict=True)]
        for i, (p, a) in enumerate(zip(params, arrays, strict=True)):
            if a is not None:
                _check_array(name, i, p, a)
        if not guard or any(p.struct for p in params):
            self._launch(name, params, args, arrays, None, grid, block, shared_bytes, policy,
                         seed, poison, block_order, stack_size)
            return
        with GP.placed(arrays, [not p.const for p in params]) as at:
            self._launch(name, params, args, arrays, at, grid, block, shared_bytes, policy,
                         seed, poison, block_order, stack_size)

    def _launch(self, name: str, params: list, args: list, arrays: list,
                at: "GP.Placement | None", grid, block, shared_bytes: int, policy: str,
                seed: int, poison: str, block_order: str, stack_size: int) -> None:
        """One launch of :meth:`launch`, the arrays at ``at``'s addresses (or
        their own where ``at`` is None)."""
        keep: list = []
        argv = (ctypes.c_void_p * max(1, len(params)))()
        for i, (p, a) in enumerate(zip(params, args, strict=True)):
            if p.builtin is not None:
                slot = ctypes.c_void_p(0)  # the launcher passes it
            elif p.struct:
                if not isinstance(a, np.ndarray) or a.nbytes != p.struct:
                    raise LaunchError(f"kernel {name}: argument {i} ({p.ctype}) needs an array "
                                      f"of {p.struct} bytes")
                a = np.ascontiguousarray(a)
                slot = (ctypes.c_char * p.struct).from_buffer(a.view(np.uint8))
            elif p.pointer:
                if a is None:
                    slot = ctypes.c_void_p(0)
                elif isinstance(a, np.ndarray):
                    slot = ctypes.c_void_p(a.ctypes.data if at is None else at.addresses[i])
                else:
                    raise LaunchError(f"kernel {name}: argument {i} ({p.ctype}) needs a numpy "
                                      f"array, got {type(a).__name__}")
            else:
                slot = _scalar(name, i, p, a)
            keep.append((a, slot))
            argv[i] = ctypes.cast(ctypes.pointer(slot), ctypes.c_void_p)
        cfg = _make_cfg(grid, block, shared_bytes, policy, seed, poison, block_order, stack_size,
                        self.limits)
        err = _Err()
        fn = _LAUNCH_PROTO(("tn_emu_launch_" + name, self._lib))
        with self._lock:
            fn(argv, ctypes.byref(cfg), ctypes.byref(err))
        del keep
        if at is not None and int(err.code) == _MEMORY_FAULT:
            _name_guard(err, at, params, arrays)
        _raise_for(err, name, self.dialect)


def _resolve_kernels(source: str, kernels, dia: Dialect) -> dict[str, list[str]]:
    ks = {k: list(v) for k, v in
          (kernels if kernels is not None else parse_kernels(source, dia)).items()}
    if not ks:
        raise LaunchError(f"the source defines no {dia.kernel_marker} kernel",
                          hint="pass kernels={name: [param C types]}")
    return ks


def build(source: str, kernels: Mapping[str, Sequence[str]] | None = None, *,
          include_dirs: Sequence[str | os.PathLike] = (), tsan: bool = False,
          dialect: Dialect | str = CUDA, limits: Limits | None = None) -> EmuModule:
    """Compile a generated source of ``dialect`` (CUDA by default) for the
    host emulator; its launches run under the profile ``limits`` (default:
    the dialect's).

    ``kernels`` maps each kernel to launch to its parameter C types (e.g.
    ``["float*", "const float*", "long long", "int*"]``); ``None`` reads them
    from the kernel definitions in the source (CUDA's ``__global__``).
    ``include_dirs`` are searched for the source's includes (the dialect's
    prelude), before the dialect's own folders (the portable prelude's).
    ``tsan=True`` is for :func:`run_tsan` only (a TSan build cannot be loaded
    into this process)."""
    dia = _dialect(dialect)
    if tsan:
        raise LaunchError("a ThreadSanitizer build runs in a subprocess", hint="use run_tsan()")
    ks = _resolve_kernels(source, kernels, dia)
    params = {k: [_param(t, k, dia) for t in v] for k, v in ks.items()}
    path = _compile(source, ks, [str(d) for d in include_dirs], tsan=False, dia=dia)
    lib = ctypes.CDLL(str(path), mode=os.RTLD_LOCAL)
    return EmuModule(path, ks, lib, params, dia, limits or dia.limits)


# ------------------------------------------------------------------------ TSan
@dataclass(frozen=True)
class Access:
    """One side of a race: ``Write``/``Read``, size, the thread's name (block
    and thread of the GPU thread) and the first frame in the generated source."""

    op: str
    size: int
    thread: str
    function: str
    line: int


@dataclass(frozen=True)
class Race:
    """A data race TSan reported: the current and the previous access, what
    memory (``shared`` for ``tn_smem``, else ``global``), and the raw text."""

    current: Access
    previous: Access | None
    space: str
    location: str
    text: str

    @property
    def lines(self) -> tuple[int, ...]:
        """Source lines of both accesses (generated source), current first."""
        ls = [self.current.line] + ([self.previous.line] if self.previous else [])
        return tuple(x for x in ls if x > 0)


@dataclass
class TsanReport:
    """Result of a TSan run: the races (empty when clean), any emulator error
    the run raised, the process return code and the sanitizer's full output."""

    races: list[Race]
    error: EmulatorError | None
    returncode: int
    log: str

    @property
    def clean(self) -> bool:
        return not self.races and self.error is None


_ACCESS_RE = re.compile(r"^\s*(Previous )?(atomic )?([Ww]rite|[Rr]ead) of size (\d+) at \S+ by "
                        r"(main thread|thread T\d+)")
_FRAME_RE = re.compile(r"^\s*#\d+ (\S+).*? (\S+?):(\d+)(?::\d+)? ")
_THREAD_RE = re.compile(r"^\s*Thread (T\d+) '([^']*)'")


def parse_tsan_output(text: str, source_name: str) -> list[Race]:
    """The data races in TSan's output ``text``; frames are matched to the
    generated source by the file name ``source_name``."""
    races: list[Race] = []
    for block in text.split("==================\n"):
        if "WARNING: ThreadSanitizer: data race" not in block:
            continue
        names = {m.group(1): m.group(2) for m in map(_THREAD_RE.match, block.splitlines()) if m}
        accesses: list[Access] = []
        location = ""
        cur: dict | None = None
        for ln in block.splitlines():
            m = _ACCESS_RE.match(ln)
            if m:
                if cur:
                    accesses.append(Access(**cur))
                who = m.group(5)
                tid = who.split()[-1]
                cur = {"op": m.group(3).capitalize(), "size": int(m.group(4)),
                       "thread": names.get(tid, who), "function": "", "line": 0}
                continue
            f = _FRAME_RE.match(ln)
            if f and cur is not None and cur["line"] == 0 and \
                    os.path.basename(f.group(2)) == source_name:
                cur["function"], cur["line"] = f.group(1), int(f.group(3))
            if ln.strip().startswith("Location is"):
                location = ln.strip()
        if cur:
            accesses.append(Access(**cur))
        if not accesses:
            continue
        space = "shared" if "'tn_smem'" in location else "global"
        races.append(Race(accesses[0], accesses[1] if len(accesses) > 1 else None, space,
                          location, block.strip()))
    return races


def run_tsan(source: str, name: str, grid, block, args: Sequence, *,
             kernels: Mapping[str, Sequence[str]] | None = None,
             include_dirs: Sequence[str | os.PathLike] = (), shared_bytes: int = 0,
             policy: str = "in_order", seed: int = 0, poison: str = "nan",
             block_order: str = "in_order", stack_size: int = DEFAULT_STACK,
             timeout: float = 120.0, dialect: Dialect | str = CUDA,
             limits: Limits | None = None) -> TsanReport:
    """Run one launch under ThreadSanitizer in a subprocess and report its races
    (``dialect`` and ``limits`` as for :func:`build`).

    Arrays in ``args`` go to the subprocess through files and come back in
    place (as with :meth:`EmuModule.launch`). An emulator error in the run is
    returned in :attr:`TsanReport.error`, not raised."""
    if not tsan_available():
        raise LaunchError("the host compiler has no ThreadSanitizer runtime (libtsan)",
                          hint="install libtsan for the compiler (e.g. the gcc libtsan package)")
    dia = _dialect(dialect)
    lim = limits or dia.limits
    ks = _resolve_kernels(source, kernels, dia)
    if name not in ks:
        raise LaunchError(f"no kernel {name!r} in the source", hint="kernels: " + ", ".join(ks))
    params = [_param(t, name, dia) for t in ks[name]]
    args = _spread(name, params, args)
    cfg = _make_cfg(grid, block, shared_bytes, policy, seed, poison, block_order, stack_size,
                    lim)
    exe = _compile(source, ks, [str(d) for d in include_dirs], tsan=True, dia=dia)
    work = Path(tempfile.mkdtemp(prefix="tn-tsan-"))
    try:
        lines = [f"kernel {name}", "grid {} {} {}".format(*cfg.grid),
                 "block {} {} {}".format(*cfg.block), f"shared {cfg.shared_bytes}",
                 f"stack {cfg.stack_bytes}", f"seed {cfg.seed}", f"policy {cfg.policy}",
                 f"poison {cfg.poison}", f"order {cfg.block_order}", f"lanes {cfg.lanes}",
                 f"threads {cfg.max_threads}", "blockmax {} {} {}".format(*cfg.max_block),
                 f"smem {cfg.max_shared}"]
        arrays: list[tuple[np.ndarray, Path]] = []
        for i, (p, a) in enumerate(zip(params, args, strict=True)):
            if p.pointer or p.builtin is not None:
                if a is None:
                    lines.append("null")
                    continue
                if not isinstance(a, np.ndarray):
                    raise LaunchError(f"kernel {name}: argument {i} ({p.ctype}) needs a numpy "
                                      f"array, got {type(a).__name__}")
                _check_array(name, i, p, a)
                f = work / f"arg{i}.bin"
                f.write_bytes(a.tobytes())
                arrays.append((a, f))
                lines.append(f"ptr {a.nbytes} {f}")
            else:
                s = _scalar(name, i, p, a)
                raw = bytes(s).ljust(8, b"\0")
                lines.append(f"val {ctypes.sizeof(s)} {int.from_bytes(raw, 'little'):x}")
        (work / "manifest").write_text("\n".join(lines) + "\n")
        env = dict(os.environ)
        env["TSAN_OPTIONS"] = ("halt_on_error=0 exitcode=66 report_signal_unsafe=0 "
                               "history_size=4 allow_addr2line=1 " +
                               env.get("TILENEST_TSAN_OPTIONS", ""))
        proc = subprocess.run([str(exe), str(work / "manifest"), str(work / "result")],
                              check=False, capture_output=True, text=True, env=env, timeout=timeout)
        result = work / "result"
        if proc.returncode not in (0, 66) or not result.exists():
            raise EmulatorError(f"the TSan run of kernel {name} failed (exit status "
                                f"{proc.returncode})", (), "see the notes for its output",
                                tuple(proc.stderr.strip().splitlines()[-30:]), kernel=name)
        for a, f in arrays:
            if not (a.flags.writeable):
                continue
            a[...] = np.frombuffer(f.read_bytes(), dtype=a.dtype).reshape(a.shape)
        head, _, msg = result.read_text().partition("\n")
        nums = [int(x) for x in head.split()]
        err = _Err()
        err.code, err.line = nums[0], nums[1]
        err.block[:] = nums[2:5]
        err.thread[:] = nums[5:8]
        err.message = msg.strip().encode()[:2047]
        error = None
        try:
            _raise_for(err, name, dia)
        except EmulatorError as e:
            error = e
        races = parse_tsan_output(proc.stderr, exe.name.split("-")[0] + ".cu")
        return TsanReport(races, error, proc.returncode, proc.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
