"""The external symbols JIT-compiled code may call, each bound explicitly.

Invariant: a compiled kernel references only symbols in :func:`bound`, and
each of those is bound, by ``llvmlite.binding.add_symbol``, to a definition
tilenest chose, never to whatever the process happens to have loaded:

* C library math functions (those ``mathlib`` calls, and those LLVM's code
  generator may introduce for an intrinsic or instruction the host lacks:
  ``fmod`` for ``frem``, ``fma``, ``floor`` ... ``roundeven`` without SSE4.1,
  ``sincos`` for a ``sin``/``cos`` pair), taken from the math library opened
  explicitly with ``ctypes``;
* ``memset``/``memcpy``/``memmove`` (loop idioms become these calls), taken
  from the C library opened explicitly;
* the POSIX mutex and condition-variable functions the native worker loop
  (:mod:`.workloop`) sleeps and wakes with, from the C library (or the
  thread library, where the C library does not define them);
* the compiler-runtime conversion helpers (``__truncdfhf2`` ...), defined in
  IR by :mod:`.softfloat` and compiled once per process.

:func:`check_object` lists the undefined symbols of a compiled object file (the
machine code, after instruction selection, which is where helper calls
appear) and raises :class:`UnresolvedSymbolError` for any not bound, so a
missing binding is an error naming the symbol instead of a call through a
null address.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import struct
import threading
from typing import Callable

import llvmlite.binding as llvm

from ...errors import TilenestError


class UnresolvedSymbolError(TilenestError):
    """Compiled code references an external symbol tilenest has not bound (a
    defect of tilenest, not of the kernel)."""

    kind = "internal error"


#: math-library functions that generated code, or LLVM lowering it, may call
LIBM_FUNCTIONS = (
    "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sin", "cos", "tan", "sincos",
    "tanh", "erf", "pow", "atan2", "fmod", "fmodf", "fma", "fmaf", "floor", "floorf", "ceil",
    "ceilf", "trunc", "truncf", "round", "roundf", "roundeven", "roundevenf", "rint", "rintf",
    "nearbyint", "nearbyintf", "sqrt", "sqrtf", "fmin", "fminf", "fmax", "fmaxf", "ldexp",
    "ldexpf", "expf", "exp2f", "logf", "log2f", "powf", "sinf", "cosf", "sincosf",
)
#: C-library functions LLVM emits for loop idioms (memset_pattern16 on Darwin)
LIBC_FUNCTIONS = ("memset", "memcpy", "memmove", "bzero", "memset_pattern16")
#: thread functions the worker loop calls
PTHREAD_FUNCTIONS = ("pthread_mutex_init", "pthread_mutex_lock", "pthread_mutex_unlock",
                     "pthread_cond_init", "pthread_cond_wait", "pthread_cond_broadcast")

_LOCK = threading.Lock()
_BOUND: dict[str, int] = {}
_DONE: list[bool] = []  # non-empty once every binding is made
_SEEN: set[str] = set()  # every symbol a checked object imported, this process
_KEEP: list[object] = []  # libraries and the helper engine, alive for the process


def _open(*names: str) -> ctypes.CDLL:
    """The first of the C libraries ``names`` found (``m`` then ``c`` for the
    math functions: some C libraries include them)."""
    for name in names:
        path = ctypes.util.find_library(name)
        if path is not None:
            return ctypes.CDLL(path)
    raise TilenestError(f"the C library lib{names[0]} was not found; compiled kernels call it",
                        hint="install the system C library (and its math library)")


def _bind(name: str, addr: int) -> None:
    llvm.add_symbol(name, addr)
    _BOUND[name] = addr


def bind_all(triple: str, make_tm: Callable[[], llvm.TargetMachine]) -> None:
    """Bind every symbol of the module docstring (once per process; needs the
    native target initialized). ``make_tm()`` gives a fresh target machine for
    the host, which compiles the soft-float helpers."""
    with _LOCK:
        if _DONE:
            return
        for lib, names in ((_open("m", "c"), LIBM_FUNCTIONS), (_open("c"), LIBC_FUNCTIONS)):
            _KEEP.append(lib)
            for n in names:
                fn = getattr(lib, n, None)  # absent on some libraries (e.g. roundeven)
                if fn is not None:
                    _bind(n, ctypes.cast(fn, ctypes.c_void_p).value)
        threads = _open("c")
        for n in PTHREAD_FUNCTIONS:
            fn = getattr(threads, n, None)
            if fn is None:  # a C library keeping them in libpthread
                threads = _open("pthread")
                _KEEP.append(threads)
                fn = getattr(threads, n)
            _bind(n, ctypes.cast(fn, ctypes.c_void_p).value)
        from .softfloat import HELPERS, helper_module

        mod = llvm.parse_assembly(helper_module(triple))
        mod.verify()
        obj = make_tm().emit_object(mod)
        missing = sorted(undefined_symbols(obj))
        if missing:  # the helpers are integer code: they must not need anything
            raise TilenestError("internal: the soft-float helpers reference " + ", ".join(missing))
        ee = llvm.create_mcjit_compiler(mod, make_tm())
        ee.finalize_object()
        _KEEP.append(ee)
        for n in HELPERS:
            _bind(n, ee.get_function_address(n))
        _DONE.append(True)


def bound() -> dict[str, int]:
    """The explicitly bound symbols: name -> address."""
    return dict(_BOUND)


def imported() -> set[str]:
    """The symbols the objects checked so far in this process imported."""
    return set(_SEEN)


def check_object(obj: bytes, what: str) -> None:
    """Raise :class:`UnresolvedSymbolError` if the object file ``obj`` (compiled
    from ``what``) needs a symbol that is not bound."""
    needs = undefined_symbols(obj)
    _SEEN.update(needs)
    missing = sorted(needs - set(_BOUND))
    if missing:
        raise UnresolvedSymbolError(
            f"compiled code for {what} references external symbol"
            f"{'s' if len(missing) > 1 else ''} that tilenest does not bind: "
            + ", ".join(missing),
            hint="this is a tilenest bug (the code generator or LLVM introduced a call "
                 "with no known definition); please report it with the kernel. Binding "
                 "lives in tilenest/backends/llvm/symbols.py")


def undefined_symbols(obj: bytes) -> set[str]:
    """The names an object file imports (undefined, non-local symbols), for ELF
    and Mach-O objects (Mach-O names without their leading underscore, as the
    JIT looks them up)."""
    if obj[:4] == b"\x7fELF":
        return _elf_undefined(obj)
    if obj[:4] in (b"\xcf\xfa\xed\xfe", b"\xfe\xed\xfa\xcf"):
        return _macho_undefined(obj)
    raise UnresolvedSymbolError(
        "cannot list the external symbols of this host's object format, so compiled code "
        "cannot be checked before it runs",
        hint="the LLVM backend supports ELF (Linux) and Mach-O (macOS) hosts")


def _cstr(data: bytes, off: int) -> str:
    end = data.index(b"\0", off)
    return data[off:end].decode("utf-8", "replace")


def _elf_undefined(obj: bytes) -> set[str]:
    is64 = obj[4] == 2
    e = "<" if obj[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(e + "Q", obj, 0x28)
        shentsize, shnum = struct.unpack_from(e + "HH", obj, 0x3A)
        sh_fmt, sym_fmt = e + "IIQQQQIIQQ", e + "IBBHQQ"
    else:
        shoff, = struct.unpack_from(e + "I", obj, 0x20)
        shentsize, shnum = struct.unpack_from(e + "HH", obj, 0x2E)
        sh_fmt, sym_fmt = e + "IIIIIIIIII", e + "IIIBBH"
    sections = [struct.unpack_from(sh_fmt, obj, shoff + i * shentsize) for i in range(shnum)]
    out: set[str] = set()
    for sh in sections:
        if sh[1] != 2:  # SHT_SYMTAB
            continue
        offset, size, link, entsize = sh[4], sh[5], sh[6], sh[9]
        strtab_off = sections[link][4]
        for i in range(size // entsize):
            fields = struct.unpack_from(sym_fmt, obj, offset + i * entsize)
            if is64:
                name, info, _other, shndx = fields[0], fields[1], fields[2], fields[3]
            else:
                name, info, shndx = fields[0], fields[3], fields[5]
            if name and shndx == 0 and (info >> 4) != 0:  # SHN_UNDEF, not STB_LOCAL
                out.add(_cstr(obj, strtab_off + name))
    return out


def _macho_undefined(obj: bytes) -> set[str]:
    e = "<" if obj[:4] == b"\xcf\xfa\xed\xfe" else ">"
    ncmds, = struct.unpack_from(e + "I", obj, 16)
    off = 32
    out: set[str] = set()
    for _ in range(ncmds):
        cmd, size = struct.unpack_from(e + "II", obj, off)
        if cmd == 0x2:  # LC_SYMTAB
            symoff, nsyms, stroff, _strsize = struct.unpack_from(e + "IIII", obj, off + 8)
            for i in range(nsyms):
                strx, typ, sect, _desc, _value = struct.unpack_from(e + "IBBHQ", obj,
                                                                    symoff + 16 * i)
                if (typ & 0x0E) == 0 and (typ & 0x01) and sect == 0:  # N_UNDF, N_EXT
                    name = _cstr(obj, stroff + strx)
                    out.add(name[1:] if name.startswith("_") else name)
        off += size
    return out
