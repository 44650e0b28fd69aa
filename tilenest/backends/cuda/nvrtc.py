"""Build step of the CUDA backend: CUDA C++ source text -> cubin, with NVRTC.

This runs without a GPU and without a driver: NVRTC is a plain shared library.
It is called through :mod:`ctypes` (no binding package, so nothing pulls CUDA
parts of another version than the library found).

Which NVRTC. The wheels are the ``cuda`` extra of tilenest (``pip install
'tilenest[cuda]'``); without them and without a toolkit, a cuda compile is a
``NotAvailableError`` naming that extra. The pip wheel ``nvidia-cuda-nvrtc`` (found through the installed
``nvidia`` namespace package, ``nvidia/cu<major>/lib``) is preferred; only if
no wheel is installed is the toolkit's library taken, from ``$CUDA_HOME``,
``$CUDA_PATH`` or ``/usr/local/cuda``. :func:`nvrtc_library` says which one was
chosen and its version. Headers (``cuda_bf16.h``, ``cuda_fp16.h``,
``crt/mma.h``) come from the same place: the ``include`` folders of the
``nvidia-cuda-runtime`` and ``nvidia-cuda-crt`` wheels next to the library, or
the toolkit's ``include``; NVRTC itself has no default include path.

The numerical contract. Every :func:`compile_cuda` compiles with
:data:`CONTRACT_OPTIONS`: no contraction of a multiply and an add into an FMA
(``--fmad=false``, which NVRTC passes on to ptxas), IEEE round-to-nearest
division and square root, denormals preserved, C++17. Options that would
undo the contract are refused rather than silently overriding it (NVRTC lets
a later option win over an earlier one).

The resource report. For a real target (``sm_*``) ptxas runs with ``-v``; its
report, completed from the cubin's ELF attributes, becomes
:attr:`CompiledCuda.resources` (see :mod:`.resources`).
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from tilenest.errors import NotAvailableError, Site, TilenestError, UsageError

from ...diskcache import Store, file_digest, key_of
from .resources import KernelResources, kernel_resources

#: Options every :func:`compile_cuda` passes (besides the target and includes).
CONTRACT_OPTIONS: tuple[str, ...] = (
    "-std=c++17",
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
)

#: Asks ptxas for its resource report (accepted by NVRTC 12.x and 13.0).
PTXAS_VERBOSE = "--ptxas-options=-v"

#: The wheels this backend is pinned to (the GPU machines' toolkit is 13.0).
PINNED_WHEELS = ("nvidia-cuda-nvrtc==13.0.88", "nvidia-cuda-runtime==13.0.96",
                 "nvidia-cuda-crt==13.0.88")

#: the optional dependency group of tilenest that installs :data:`PINNED_WHEELS`
EXTRA = "cuda"

_INSTALL_HINT = (f"the NVRTC wheels are the '{EXTRA}' extra of tilenest: pip install "
                 f"'tilenest[{EXTRA}]' (pinned: " + " ".join(PINNED_WHEELS)
                 + "), or set CUDA_HOME to a CUDA toolkit that has lib64/libnvrtc.so")

# Options a caller may not pass, because compile_cuda owns them: the target is
# the `arch` argument and the rest is the numerical contract or the dialect.
_OWNED_OPTIONS = ("--gpu-architecture", "-arch", "--fmad", "-fmad", "--use_fast_math",
                  "-use_fast_math", "--ftz", "-ftz", "--prec-div", "-prec-div",
                  "--prec-sqrt", "-prec-sqrt", "--std", "-std")

_CONTRACT_WORDS = ("fmad", "ftz", "prec-div", "prec-sqrt", "fast_math", "fast-math")

_ARCH = re.compile(r"^(sm|compute)_(\d+)([af]?)$")

NVRTC_SUCCESS = 0
NVRTC_ERROR_INVALID_OPTION = 5
NVRTC_ERROR_COMPILATION = 6


class CudaCompileError(TilenestError):
    """NVRTC (or the ptxas it runs) rejected a CUDA C++ source.

    ``sites`` are the ``line:col`` of the source that the log names (errors
    only); ``notes`` quote each error with its source line; ``log`` is the
    whole NVRTC program log and ``source`` the text that was compiled.
    """

    kind = "cuda compile error"

    def __init__(self, message: str, sites=(), hint: str | None = None,
                 notes: tuple[str, ...] = (), log: str = "", source: str = ""):
        super().__init__(message, sites, hint, notes)
        self.log = log
        self.source = source


# --------------------------------------------------------------------------- locating NVRTC


@dataclass(frozen=True)
class NvrtcLibrary:
    """The NVRTC found: the shared library, its origin and version, the header folders.

    ``origin`` is ``"wheel"`` (the ``nvidia-cuda-nvrtc`` pip wheel) or
    ``"toolkit"`` (a CUDA toolkit directory). ``version`` is what
    ``nvrtcVersion`` answers; ``package_version`` the wheel's full version
    (``"13.0.88"``) when it is a wheel.
    """

    path: str
    origin: str
    version: tuple[int, int]
    include_dirs: tuple[str, ...]
    package_version: str | None = None
    handle: ctypes.CDLL | None = field(default=None, repr=False, compare=False)

    def describe(self) -> str:
        """One line for reports: version, origin and path."""
        full = f" ({self.package_version})" if self.package_version else ""
        return f"NVRTC {self.version[0]}.{self.version[1]}{full} from {self.origin} {self.path}"


@dataclass(frozen=True)
class _Candidate:
    path: Path
    origin: str
    include_dirs: tuple[Path, ...]


def _lib_names() -> tuple[str, ...]:
    if sys.platform.startswith("linux"):
        return ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so")
    return ()


def _nvidia_roots() -> list[Path]:
    """The folders of the installed ``nvidia`` namespace package (pip wheels)."""
    try:
        import nvidia  # type: ignore[import-untyped,import-not-found,unused-ignore]
    except ImportError:
        return []
    return [Path(p) for p in getattr(nvidia, "__path__", [])]


def _wheel_candidates(roots: Iterable[Path]) -> list[_Candidate]:
    """NVRTC libraries inside the ``nvidia`` package: ``cu<major>/lib/libnvrtc.so.<major>``.

    The header folders are every ``cu<major>/include`` of the same major in any
    root (the runtime and crt wheels may sit in another site directory than
    the nvrtc wheel), the one holding ``cuda_runtime.h`` first.
    """
    roots = list(roots)
    found = []
    for root in roots:
        for sub in sorted(root.glob("cu[0-9]*"), reverse=True):
            for name in _lib_names():
                lib = sub / "lib" / name
                if lib.is_file():
                    incs = [r / sub.name / "include" for r in roots
                            if (r / sub.name / "include").is_dir()]
                    incs.sort(key=lambda p: not (p / "cuda_runtime.h").is_file())
                    found.append(_Candidate(lib, "wheel", tuple(incs)))
                    break
    return found


def _toolkit_homes() -> list[Path]:
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    out: list[Path] = []
    for h in homes:
        if h and Path(h) not in out:
            out.append(Path(h))
    return out


def _toolkit_candidates(homes: Iterable[Path]) -> list[_Candidate]:
    """NVRTC of a CUDA toolkit: ``<home>/lib64``, ``<home>/lib`` or ``<home>/targets/*/lib``."""
    found = []
    for home in homes:
        libdirs = [home / "lib64", home / "lib", *sorted(home.glob("targets/*/lib"))]
        incs = tuple(p for p in [home / "include", *sorted(home.glob("targets/*/include"))]
                     if (p / "cuda_runtime.h").is_file())
        for d in libdirs:
            lib = next((d / n for n in _lib_names() if (d / n).is_file()), None)
            if lib is not None:
                found.append(_Candidate(lib, "toolkit", incs[:1]))
                break
    return found


def _load(c: _Candidate) -> NvrtcLibrary:
    """Open one candidate and ask its version.

    NVRTC opens ``libnvrtc-builtins.so.<major>.<minor>`` by its bare name at
    compile time, which the dynamic loader finds only on the library path; it
    is loaded first from the same folder so that the name is already resolved.
    """
    for b in sorted(c.path.parent.glob("libnvrtc-builtins.so*")):
        if ".alt." not in b.name:
            ctypes.CDLL(str(b), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(str(c.path))
    _declare(lib)
    major, minor = ctypes.c_int(), ctypes.c_int()
    if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != NVRTC_SUCCESS:
        raise OSError(f"nvrtcVersion failed in {c.path}")
    pkg = None
    if c.origin == "wheel":
        from importlib import metadata  # imported when needed: it is slow to import

        try:
            pkg = metadata.version("nvidia-cuda-nvrtc")
        except metadata.PackageNotFoundError:  # nvrtcVersion's answer then stands alone
            pkg = None
    return NvrtcLibrary(str(c.path), c.origin, (major.value, minor.value),
                        tuple(str(p) for p in c.include_dirs), pkg, lib)


def _declare(lib: ctypes.CDLL) -> None:
    """Give the NVRTC entry points their C signatures (all return nvrtcResult)."""
    p, sz, cp = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p
    sigs = {
        "nvrtcVersion": [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)],
        "nvrtcCreateProgram": [ctypes.POINTER(p), cp, cp, ctypes.c_int,
                               ctypes.POINTER(cp), ctypes.POINTER(cp)],
        "nvrtcDestroyProgram": [ctypes.POINTER(p)],
        "nvrtcCompileProgram": [p, ctypes.c_int, ctypes.POINTER(cp)],
        "nvrtcGetProgramLogSize": [p, ctypes.POINTER(sz)],
        "nvrtcGetProgramLog": [p, ctypes.c_char_p],
        "nvrtcGetPTXSize": [p, ctypes.POINTER(sz)],
        "nvrtcGetPTX": [p, ctypes.c_char_p],
        "nvrtcGetCUBINSize": [p, ctypes.POINTER(sz)],
        "nvrtcGetCUBIN": [p, ctypes.c_char_p],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_int
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p


def find_nvrtc(wheel_roots: Iterable[Path] | None = None,
               toolkit_homes: Iterable[Path] | None = None) -> NvrtcLibrary:
    """Locate and open NVRTC: the pip wheel first, then a toolkit.

    ``wheel_roots`` defaults to the ``nvidia`` namespace package's folders and
    ``toolkit_homes`` to ``$CUDA_HOME``, ``$CUDA_PATH``, ``/usr/local/cuda``.
    Raises :class:`NotAvailableError` naming what was searched if none loads.
    """
    roots = _nvidia_roots() if wheel_roots is None else list(wheel_roots)
    homes = _toolkit_homes() if toolkit_homes is None else list(toolkit_homes)
    tried = []
    for c in _wheel_candidates(roots) + _toolkit_candidates(homes):
        try:
            return _load(c)
        except OSError as e:
            tried.append(f"{c.path}: {e}")
    searched = [str(r) for r in roots] + [str(h) for h in homes]
    notes = tuple(tried) or (f"searched: {', '.join(searched) or 'nothing'}",)
    raise NotAvailableError("NVRTC (the CUDA runtime compiler) was not found",
                            hint=_INSTALL_HINT, notes=notes)


_lock = threading.Lock()
_library: NvrtcLibrary | None = None
_library_error: NotAvailableError | None = None


def nvrtc_library() -> NvrtcLibrary:
    """The process's NVRTC, located once (see :func:`find_nvrtc`); raises
    :class:`NotAvailableError` with an install hint when there is none."""
    global _library, _library_error
    with _lock:
        if _library is None and _library_error is None:
            try:
                _library = find_nvrtc()
            except NotAvailableError as e:
                _library_error = e
        if _library is None:
            assert _library_error is not None
            raise _library_error
        return _library


def nvrtc_available() -> bool:
    """True iff an NVRTC library can be loaded in this process (no GPU needed)."""
    try:
        nvrtc_library()
    except NotAvailableError:
        return False
    return True


def nvrtc_version() -> tuple[int, int]:
    """``(major, minor)`` of the NVRTC in use, as ``nvrtcVersion`` reports it."""
    return nvrtc_library().version


# --------------------------------------------------------------------------- compiling


@dataclass(frozen=True)
class RawCompile:
    """What one NVRTC compilation produced, with exactly the options given.

    ``status`` is the ``nvrtcResult`` of ``nvrtcCompileProgram`` (0 = success);
    ``cubin`` is empty for a virtual target (``compute_*``) or a failure, and
    ``ptx`` is None when NVRTC produced none (it is kept after a ptxas failure).
    """

    status: int
    status_name: str
    log: str
    cubin: bytes
    ptx: str | None


def compile_program(source: str, name: str, options: Iterable[str]) -> RawCompile:
    """Run NVRTC once on ``source`` with ``options`` as given, adding nothing.

    This is the raw layer under :func:`compile_cuda`, which adds the target,
    the numerical contract and the include paths; use that one to build
    kernels. This one exists to inspect NVRTC itself (e.g. to see what an
    option changes). It never raises for a rejected source: see ``status``.
    """
    lib = nvrtc_library()
    h = lib.handle
    assert h is not None
    opts = [o.encode() for o in options]
    argv = (ctypes.c_char_p * max(len(opts), 1))(*opts)
    prog = ctypes.c_void_p()
    rc = h.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None)
    if rc != NVRTC_SUCCESS:
        raise CudaCompileError(f"nvrtcCreateProgram failed: {_status_name(h, rc)}",
                               hint="NVRTC could not allocate the program", source=source)
    try:
        status = h.nvrtcCompileProgram(prog, len(opts), argv)
        log = _fetch_text(h.nvrtcGetProgramLogSize, h.nvrtcGetProgramLog, prog) or ""
        # PTX survives a ptxas failure, so that its errors can be quoted.
        ptx = _fetch_text(h.nvrtcGetPTXSize, h.nvrtcGetPTX, prog)
        cubin = b""
        if status == NVRTC_SUCCESS:
            cubin = _fetch_bytes(h.nvrtcGetCUBINSize, h.nvrtcGetCUBIN, prog)
        return RawCompile(status, _status_name(h, status), log, cubin, ptx)
    finally:
        h.nvrtcDestroyProgram(ctypes.byref(prog))


def _status_name(h: ctypes.CDLL, rc: int) -> str:
    s = h.nvrtcGetErrorString(rc)
    return s.decode() if s else f"NVRTC error {rc}"


def _fetch_bytes(size_fn, get_fn, prog) -> bytes:
    n = ctypes.c_size_t()
    if size_fn(prog, ctypes.byref(n)) != NVRTC_SUCCESS or n.value == 0:
        return b""
    buf = ctypes.create_string_buffer(n.value)
    if get_fn(prog, buf) != NVRTC_SUCCESS:
        return b""
    return buf.raw


def _fetch_text(size_fn, get_fn, prog) -> str | None:
    """A NUL-terminated NVRTC string (log, PTX); None when it is empty."""
    raw = _fetch_bytes(size_fn, get_fn, prog).rstrip(b"\0")
    return raw.decode("utf-8", "replace") if raw else None


@dataclass(frozen=True)
class CompiledCuda:
    """A compiled CUDA module: the cubin, optionally the PTX, the log, the report.

    ``cubin`` is the ELF image for ``arch`` (empty for a virtual ``compute_*``
    target, which yields PTX only); ``ptx`` is set only if it was asked for and
    NVRTC produced it; ``log`` is NVRTC's program log (warnings and the ptxas
    report); ``options`` the exact options NVRTC received; ``resources`` the
    kernels (``__global__`` entry functions, by mangled or ``extern "C"`` name)
    and what each uses; ``functions`` additionally the device functions ptxas
    compiled separately. Both mappings are read-only.
    """

    cubin: bytes
    ptx: str | None
    log: str
    options: tuple[str, ...]
    resources: Mapping[str, KernelResources]
    arch: str = "sm_90a"
    name: str = "kernel.cu"
    nvrtc_version: tuple[int, int] = (0, 0)
    functions: Mapping[str, KernelResources] = field(default_factory=dict)

    def warnings(self) -> list[str]:
        """One line per kernel or device function that spills registers."""
        table = self.functions or self.resources
        return [w for r in table.values() if (w := r.spill_warning()) is not None]


_CACHE_SIZE = 64
_cache: OrderedDict[tuple, CompiledCuda] = OrderedDict()
_cache_lock = threading.Lock()
#: NVRTC results on disk (``tilenest.diskcache``), shared by processes
DISK = Store("nvrtc")


def clear_cache() -> None:
    """Forget every compilation cached in this process."""
    with _cache_lock:
        _cache.clear()


def cache_size() -> int:
    """How many compilations the in-process cache holds (at most 64)."""
    return len(_cache)


def check_arch(arch: str) -> str:
    """``arch`` if it names a real (``sm_90a``) or virtual (``compute_90a``) target."""
    if not _ARCH.match(arch):
        raise UsageError(f"'{arch}' is not a CUDA target architecture",
                         hint="name one such as sm_90a (a cubin) or compute_90a (PTX only)")
    return arch


def build_options(arch: str = "sm_90a", options: Iterable[str] = (),
                  include_dirs: Iterable[str | os.PathLike] = ()) -> tuple[str, ...]:
    """The options :func:`compile_cuda` passes to NVRTC, in order.

    Target, :data:`CONTRACT_OPTIONS`, the ptxas report request (real targets
    only), the caller's ``options``, then ``--include-path`` for the caller's
    ``include_dirs`` followed by the headers found with NVRTC (so a caller's
    header folder is searched first). Raises :class:`UsageError` for an option
    that :func:`compile_cuda` owns (target, contract, dialect).
    """
    check_arch(arch)
    extra = tuple(options)
    for o in extra:
        head = o.split("=", 1)[0]
        # A contract word anywhere also catches it inside --ptxas-options=...
        if head in _OWNED_OPTIONS or any(w in o for w in _CONTRACT_WORDS):
            raise UsageError(
                f"option '{o}' is fixed by the CUDA build step",
                hint=("pass the target as arch=..." if head in ("--gpu-architecture", "-arch")
                      else "the numerical contract (no FMA contraction, IEEE division and "
                           "square root, no flush to zero, C++17) cannot be changed here"))
    lib = nvrtc_library()
    incs = [str(Path(d)) for d in include_dirs] + list(lib.include_dirs)
    ptxas = (PTXAS_VERBOSE,) if arch.startswith("sm_") else ()
    return ((f"--gpu-architecture={arch}",) + CONTRACT_OPTIONS + ptxas + extra
            + tuple(f"--include-path={d}" for d in incs))


def compile_cuda(source: str, name: str = "kernel.cu", *, arch: str = "sm_90a",
                 options: tuple[str, ...] = (), include_dirs: tuple = (),
                 want_ptx: bool = False, cache: bool = True) -> CompiledCuda:
    """Compile CUDA C++ ``source`` for ``arch`` under the numerical contract.

    ``name`` is the file name the diagnostics use. A real target (``sm_90a``)
    yields a cubin and its resource report; a virtual one (``compute_90a``)
    yields PTX only (``want_ptx`` is implied). ``ptx`` is returned when asked
    for and produced. Results are cached in-process by (source, name,
    options, arch, NVRTC version and path, want_ptx), at most 64 of them, and
    on disk (:data:`DISK`) by the same and the contents of the headers in
    ``include_dirs``; a disk hit runs no NVRTC. ``cache=False`` compiles
    afresh (and stores the result).

    Raises :class:`CudaCompileError` with the log's ``line:col`` sites when
    NVRTC rejects the source, :class:`NotAvailableError` when there is no
    NVRTC, :class:`UsageError` for an option the contract fixes.
    """
    full = build_options(arch, options, include_dirs)
    lib = nvrtc_library()
    want_ptx = want_ptx or arch.startswith("compute_")
    key = (source, name, full, lib.version, lib.path, want_ptx)
    with _cache_lock:
        hit = _cache.get(key) if cache else None
        if hit is not None:
            _cache.move_to_end(key)
            return hit
    headers = [f for d in include_dirs for f in Path(d).glob("*")
               if f.suffix in (".h", ".cuh", ".hpp")]
    dkey = key_of(["nvrtc", source, name, list(full), list(lib.version), str(lib.path),
                   want_ptx, file_digest(headers)])
    got = DISK.get(dkey) if cache else None
    if got is not None:
        meta, parts = got
        raw = RawCompile(NVRTC_SUCCESS, "NVRTC_SUCCESS", meta["log"], parts["cubin"],
                         parts["ptx"].decode() if "ptx" in parts else None)
    else:
        raw = compile_program(source, name, full)
        if raw.status != NVRTC_SUCCESS:
            raise compile_error(raw, source, name, full)
        if arch.startswith("sm_") and not raw.cubin:
            raise CudaCompileError(f"NVRTC produced no cubin for {arch}", source=source,
                                   log=raw.log,
                                   hint="NVRTC reported success without code; see its log")
        parts = {"cubin": raw.cubin}
        if want_ptx and raw.ptx is not None:
            parts["ptx"] = raw.ptx.encode()
        DISK.put(dkey, {"log": raw.log}, parts)
    result = compiled_cuda(raw.cubin, raw.ptx if want_ptx else None, raw.log, full, arch, name,
                           lib.version)
    with _cache_lock:
        _cache[key] = result
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return result


def compiled_cuda(cubin: bytes, ptx: str | None, log: str, options: Iterable[str], arch: str,
                  name: str, version: tuple[int, int]) -> CompiledCuda:
    """The :class:`CompiledCuda` of an NVRTC result (fresh or read back from a
    cache): the resource report is read from the log and the cubin."""
    table = kernel_resources(log, cubin or None)
    return CompiledCuda(
        cubin=cubin, ptx=ptx, log=log, options=tuple(options),
        resources=MappingProxyType({k: v for k, v in table.items() if v.entry}),
        arch=arch, name=name, nvrtc_version=(int(version[0]), int(version[1])),
        functions=MappingProxyType(table))


def _file_identity(p: Path) -> list:
    try:
        st = p.stat()
    except OSError:
        return [str(p), "missing"]
    return [str(p), st.st_size, st.st_mtime_ns]


def toolchain_identity() -> list:
    """The NVRTC a compile in this process uses, identified without loading
    it (a caller with a compiled result cached needs no NVRTC): the library
    already loaded, else the first one :func:`find_nvrtc` would try -- its
    path, size and time stamp, those of its builtins library, and the header
    folders; ``["absent"]`` when there is none. A caller that stores a result
    under this identity reads it again after compiling (the library loaded
    then is the one that produced the result)."""
    if _library is not None:
        path, incs = Path(_library.path), tuple(_library.include_dirs)
    else:
        found = _wheel_candidates(_nvidia_roots()) + _toolkit_candidates(_toolkit_homes())
        if not found:
            return ["absent"]
        path, incs = found[0].path, tuple(str(d) for d in found[0].include_dirs)
    try:
        names = sorted(n for n in os.listdir(path.parent) if n.startswith("libnvrtc-builtins.so"))
    except OSError:
        names = []
    builtins = [_file_identity(path.parent / n) for n in names]
    return [_file_identity(path), builtins, list(incs)]


# --------------------------------------------------------------------------- diagnostics

# "kernel.cu(12): error: expected a ";"" and "... catastrophic error: ..."
_DIAG = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<sev>error|catastrophic error|"
                   r"warning|remark)(?: #\S+)?: (?P<msg>.*)$")
_PTXAS_DIAG = re.compile(r"^ptxas .*?(?:line (?P<line>\d+); )?(?P<sev>error|fatal)\s*: (?P<msg>.*)$")


def _caret_col(log_lines: list[str], at: int) -> int:
    """The 1-based column of the ``^`` NVRTC prints two lines under a diagnostic.

    NVRTC echoes the source line indented by two spaces and, on the next line,
    a caret under the offending character (tabs repeated as tabs); 0 if the
    caret is not there (e.g. ``--brief-diagnostics``).
    """
    if at + 2 < len(log_lines):
        caret = log_lines[at + 2]
        if caret.strip() == "^" and caret.startswith("  "):
            return caret.index("^") - 2 + 1
    return 0


def compile_error(raw: RawCompile, source: str, name: str,
                  options: tuple[str, ...]) -> CudaCompileError:
    """The :class:`CudaCompileError` for a failed compilation, built from its log.

    Each ``name(L): error: msg`` line becomes a site ``name:L:C`` (column from
    the caret line) and a note quoting the message and line ``L`` of
    ``source``; ptxas errors (inline PTX) name a line of the generated PTX and
    become notes only; an option error names the option.
    """
    lines = raw.log.splitlines()
    src = source.splitlines()
    ptx = (raw.ptx or "").splitlines()
    quoted_ptx: set[int] = set()
    sites: list[Site] = []
    notes: list[str] = []
    first: str | None = None
    for i, text in enumerate(lines):
        if (m := _DIAG.match(text)) and "error" in m.group("sev"):
            ln = int(m.group("line"))
            col = _caret_col(lines, i)
            site = Site(name, ln, col)
            sites.append(site)
            quoted = src[ln - 1].rstrip() if 0 < ln <= len(src) else ""
            notes.append(f"{site}: {m.group('sev')}: {m.group('msg')}")
            notes.append(f"  {ln:>4} | {quoted}")
            first = first or m.group("msg")
        elif m := _PTXAS_DIAG.match(text):
            pl = int(m.group("line") or 0)
            where = f" (line {pl} of the PTX NVRTC generated)" if pl else ""
            notes.append(f"ptxas {m.group('sev')}{where}: {m.group('msg')}")
            if 0 < pl <= len(ptx) and pl not in quoted_ptx:
                quoted_ptx.add(pl)
                notes.append(f"  {pl:>4} | {ptx[pl - 1].strip()}")
            first = first or f"ptxas: {m.group('msg')}"
        elif text.startswith("nvrtc: error:"):
            notes.append(text)
            first = first or text[len("nvrtc: "):]
    if raw.status == NVRTC_ERROR_INVALID_OPTION:
        hint = "NVRTC refused an option; the options were: " + " ".join(options)
    elif any("cannot open source file" in n for n in notes):
        hint = ("a header was not found on the include path; " + _INSTALL_HINT
                if not nvrtc_library().include_dirs else
                "a header was not found on the include path: " + " ".join(
                    o for o in options if o.startswith("--include-path=")))
    elif sites:
        hint = f"the named lines are lines of the CUDA source given as '{name}'"
    elif any("Insufficient registers" in n for n in notes):
        hint = ("a thread's register limit is below what an instruction needs: the "
                "launch bounds allow 65536 / (min_blocks x block_threads) registers per "
                "thread; lower the schedule's min_blocks or block_threads")
    else:
        hint = "an inline PTX instruction or a target feature was rejected; see the log"
    message = f"NVRTC could not compile '{name}'"
    if first:
        message += f": {first}"
    return CudaCompileError(message, tuple(sites), hint, tuple(notes) or (raw.log.strip(),),
                            log=raw.log, source=source)
