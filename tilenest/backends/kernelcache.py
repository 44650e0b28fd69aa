"""Whole compiled kernels: cached on disk between processes, and in memory with a bound.

**On disk** (``tilenest.diskcache`` namespace ``kernels``). A compile that
succeeded leaves one entry holding everything the target's kernel object
needs to run and to report on itself: the machine code (LLVM object code, an
NVRTC cubin), the *call facts* (:class:`CallFacts`: symbols, phases and their
program counts, local buffers, the kernel-argument order of the global
buffers, the status codes' meanings), the generated code's texts (LLVM IR
and printed loop IR; CUDA source and launch facts), and every obligation
verdict the compile discharged. A second process compiling the same kernel
reads the entry and builds the kernel object from it: no lowering, no
proof, no optimizer, no NVRTC.

The key (:func:`kernel_key`) is the SHA-256 of everything that result depends
on: the entry format, the target, the tilenest version and a digest of the
package's source files (:func:`source_digest`: any change to the compiler,
its proofs or its headers is another key), the printed TileIR program (its
ops, types, symbols, assumptions and source locations), every field of the
schedule except the two that only steer the CPU runtime's worker threads
(``threads``, ``chunk``: the kernel object is rebuilt with the caller's),
the z3 and islpy versions (the verdicts), the Python, numpy and ml_dtypes
versions (constant folding), and the target's toolchain: for
``llvm`` the host triple, CPU and features, llvmlite, LLVM and the pipeline;
for ``cuda`` the architecture and the NVRTC library (path, size, time stamp,
header folders). So a verdict read back is the verdict of exactly that
program under exactly that schedule, computed by exactly this code.

The entry is explicit data, not pickled objects: a JSON header (call facts,
index expressions as JSON trees, verdicts as plain fields) and byte parts.
:func:`read` checks the digest (``tilenest.diskcache``), the format and the
target, and decodes the header strictly; a damaged, stale or undecodable entry
is deleted and reported as a miss (the caller rebuilds), never loaded.
Obligations read back carry their verdict and its rendering (title, sites,
formula text, counterexample lines); the solver-level claim is not kept
(``claim`` is None), so a cached obligation cannot be discharged again -- it
need not be. A verdict is kept as the compile reached it, ``unknown`` ones
too: an ``unknown`` because a solver ran out of its budget (a loaded
machine) stays ``unknown`` in the entry -- sound, never reported as proved,
and the compiled code is the same whatever the verdict -- where a fresh
compile on an idle machine might prove it (``cache=False`` decides again).
Refusing such entries would leave a kernel whose proofs time out uncached
for ever.

**In memory** (:data:`MEMORY`). Compiled kernels are kept per process in one
LRU cache bounded by a number of entries and a number of bytes (the sizes of
the artifacts an entry holds: machine code, IR and source texts, logs; the
native JIT state is not counted). ``TILENEST_MEMORY_CACHE`` sets the bound,
``ENTRIES[,BYTES]`` (``"64"``, ``"64,128M"``; ``0`` or ``off``: nothing kept),
:func:`configure` changes it at run time. Dropping an entry drops the
cache's reference only: a kernel object the user holds keeps its JIT engine
or module alive and keeps working.
"""

from __future__ import annotations

import ctypes
import functools
import gc
import hashlib
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..diskcache import Store, key_of
from ..errors import Site
from ..semantics import expr as E

#: the entry format; part of the key and checked in every entry read
FORMAT = "tilenest-kernel-1"

#: whole compiled kernels on disk, shared by processes
DISK = Store("kernels")


# ---------------------------------------------------------------------------
# the key


def tree_digest(root: Path) -> str:
    """SHA-256 over the relative paths and contents of the files under ``root``
    (byte-code caches excluded), in a fixed order."""
    h = hashlib.sha256()
    base = str(root)
    for dirpath, dirs, files in os.walk(base):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(dirpath, base)
        for name in sorted(files):
            if name.endswith((".pyc", ".pyo")):
                continue
            h.update(os.path.join(rel, name).encode() + b"\0")
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    h.update(f.read())
            except OSError:
                h.update(b"<unreadable>")
            h.update(b"\0")
    return h.hexdigest()


@functools.cache
def source_digest() -> str:
    """:func:`tree_digest` of the tilenest package (sources, grammar, headers),
    read once per process: the compiler that produced an entry."""
    return tree_digest(Path(__file__).resolve().parent.parent)


def installed_version(module: str, dist: str) -> str:
    """The version of the distribution ``dist`` that provides the top-level
    module ``module``, read from the name of its ``.dist-info`` folder next to
    the module (without importing it, and without ``importlib.metadata``,
    which costs tens of milliseconds to import); the module file's size and
    time stamp stand in when there is no such folder, ``"absent"`` when the
    module is not installed."""
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return "absent"
    origin = spec.origin
    pkg = os.path.dirname(origin) if os.path.basename(origin) == "__init__.py" else origin
    site = os.path.dirname(pkg)
    norm = dist.replace("-", "_").lower()
    try:
        names = sorted(os.listdir(site))
    except OSError:
        names = []
    for n in names:
        if n.endswith(".dist-info"):
            name, _, version = n[: -len(".dist-info")].partition("-")
            if name.replace("-", "_").lower() == norm and version:
                return version
    st = os.stat(origin)
    return f"{origin}:{st.st_size}:{st.st_mtime_ns}"


@functools.cache
def engine_versions() -> tuple[str, str]:
    """The installed z3 and islpy versions (read once; neither is imported)."""
    return installed_version("z3", "z3-solver"), installed_version("islpy", "islpy")


@functools.cache
def numeric_versions() -> tuple[str, str, str]:
    """Python's, numpy's and ml_dtypes' versions: the code generators fold
    constants with them (e.g. the rounding of a bf16 literal)."""
    return (sys.version, installed_version("numpy", "numpy"),
            installed_version("ml_dtypes", "ml_dtypes"))


def schedule_key(schedule: Any) -> list:
    """Every field of ``schedule`` but ``threads`` and ``chunk`` (how the CPU
    runtime spreads program ids over worker threads; the code, the loop IR and
    every verdict are the same for all their values), as ``[name, repr]``."""
    return [[f.name, repr(getattr(schedule, f.name))] for f in fields(schedule)
            if f.name not in ("threads", "chunk")]


def kernel_key(target: str, program: Any, schedule: Any, toolchain: list) -> str:
    """The disk key of ``program`` compiled for ``target`` under ``schedule``
    with ``toolchain`` (the target's compiler and host identity)."""
    from .. import __version__

    return key_of(["kernel", FORMAT, target, __version__, source_digest(),
                   list(engine_versions()), list(numeric_versions()), toolchain,
                   schedule_key(schedule), str(program)])


# ---------------------------------------------------------------------------
# JSON forms of index expressions, sites and verdicts


def expr_json(e: E.Expr) -> Any:
    from ..semantics.jsonio import encode_expr

    return encode_expr(e)


def pred_json(p: E.Pred) -> Any:
    from ..semantics.jsonio import encode_pred

    return encode_pred(p)


def expr_of(d: Any) -> E.Expr:
    """The expression ``expr_json`` wrote, node for node (ValueError or
    TypeError otherwise)."""
    if not isinstance(d, dict) or len(d) not in (1, 2):
        raise TypeError(f"not an expression: {d!r}")
    if "bit" in d:
        a, b = d["args"]
        return E.BitOp(str(d["bit"]), expr_of(a), expr_of(b))
    (k, v), = d.items()
    if k == "const":
        if not isinstance(v, int) or isinstance(v, bool):
            raise ValueError(f"not an integer constant: {v!r}")
        return E.Const(v)
    if k in ("sym", "var", "val"):
        if not isinstance(v, str):
            raise ValueError(f"not a name: {v!r}")
        return {"sym": E.Sym, "var": E.Var, "val": E.Val}[k](v)
    if k == "add":
        return E.Add(tuple(expr_of(t) for t in v))
    if k == "mul":
        return E.Mul(tuple(expr_of(t) for t in v))
    if k in ("floordiv", "mod"):
        a, b = v
        return (E.FloorDiv if k == "floordiv" else E.Mod)(expr_of(a), expr_of(b))
    if k in ("min", "max"):
        a, b = v
        return E.MinMax(k, expr_of(a), expr_of(b))
    raise ValueError(f"unknown expression node {k!r}")


def pred_of(d: Any) -> E.Pred:
    """The predicate ``pred_json`` wrote (ValueError or TypeError otherwise)."""
    if not isinstance(d, dict):
        raise TypeError(f"not a predicate: {d!r}")
    if "bool" in d:
        return E.TRUE if d["bool"] is True else E.FALSE
    if "cmp" in d:
        a, b = d["args"]
        return E.Cmp(str(d["cmp"]), expr_of(a), expr_of(b))
    if "and" in d:
        return E.PAnd(tuple(pred_of(q) for q in d["and"]))
    if "or" in d:
        return E.POr(tuple(pred_of(q) for q in d["or"]))
    if "not" in d:
        return E.PNot(pred_of(d["not"]))
    raise ValueError(f"unknown predicate node {sorted(d)!r}")


def site_json(s: Any) -> Any:
    """A site (or None, or a tuple of sites) as JSON; anything else is not
    kept faithfully, so it is refused (TypeError: the kernel is not cached)."""
    if s is None:
        return None
    if isinstance(s, Site):
        return {"file": s.file, "line": s.line, "col": s.col}
    if isinstance(s, (tuple, list)):
        return {"sites": [site_json(x) for x in s]}
    raise TypeError(f"cannot keep the site {s!r}")


def site_of(d: Any) -> Any:
    if d is None:
        return None
    if "sites" in d:
        return tuple(site_of(x) for x in d["sites"])
    f = d["file"]
    if f is not None and not isinstance(f, str):
        raise ValueError("site file")
    return Site(f, int(d["line"]), int(d["col"]))


def _plain(x: Any) -> Any:
    """A counterexample value as JSON (numbers, strings, lists, dicts); else TypeError."""
    import numpy as np

    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x)
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    raise TypeError(f"cannot keep the value {x!r}")


def obligation_json(o: Any) -> dict[str, Any]:
    """A discharged obligation's verdict and rendering."""
    return {"kind": o.kind, "title": o.title, "sites": [site_json(s) for s in o.sites],
            "role": o.role, "provable": o.provable, "refutable": o.refutable,
            "inexact_note": o.inexact_note, "formula": o.formula,
            "unknown_note": o.unknown_note, "status": o.status, "engine": o.engine,
            "seconds": float(o.seconds), "counterexample": _plain(o.counterexample),
            "reason": o.reason, "checked": bool(o.checked), "assumed_by": o.assumed_by,
            "details": [str(x) for x in o.counterexample_lines()]}


def obligation_of(d: dict[str, Any]) -> Any:
    """An :class:`~tilenest.proofs.obligation.Obligation` with the verdict
    ``obligation_json`` kept (no claim: it is not discharged again)."""
    from ..proofs.obligation import ASSUMED, PROVED, REFUTED, UNKNOWN, Obligation

    if d["status"] not in (PROVED, REFUTED, UNKNOWN, ASSUMED):
        raise ValueError(f"not a verdict: {d['status']!r}")
    cx = d["counterexample"]
    if cx is not None and not isinstance(cx, dict):
        raise ValueError("counterexample")
    return Obligation(
        str(d["kind"]), str(d["title"]), tuple(site_of(s) for s in d["sites"]),
        role=str(d["role"]), provable=bool(d["provable"]), refutable=bool(d["refutable"]),
        inexact_note=str(d["inexact_note"]), formula_text=str(d["formula"]),
        unknown_note=str(d["unknown_note"]), status=d["status"], engine=str(d["engine"]),
        seconds=float(d["seconds"]), counterexample=cx, reason=str(d["reason"]),
        checked=bool(d["checked"]), assumed_by=str(d["assumed_by"]),
        details=[str(x) for x in d["details"]])


# ---------------------------------------------------------------------------
# call facts


@dataclass(frozen=True)
class PhaseFacts:
    """One launch of a kernel: its entry name, its program-id extents (over the
    kernel's symbols) and whether its program ids may run concurrently."""

    name: str
    extents: tuple[E.Expr, ...]
    parallel: bool


@dataclass(frozen=True)
class BufferFacts:
    """A buffer as the runtime allocates or passes it (``arg``: the kernel
    argument a global buffer is; ``size`` in elements, over the symbols)."""

    name: str
    dtype: Any
    space: str
    size: E.Expr
    arg: int


@dataclass(frozen=True)
class ErrorFacts:
    """What a status code of the compiled kernel means."""

    code: int
    kind: str
    message: str
    site: Any


@dataclass(frozen=True)
class CallFacts:
    """What calling a compiled kernel needs from its loop IR, and nothing more:
    the attributes a runtime reads (``syms``, ``phases``, ``locals``,
    ``globals``, ``errors``) under the loop IR kernel's own names, so either
    one can be handed to the runtime and to ``calls.status_error``."""

    name: str
    syms: tuple[str, ...]
    phases: tuple[PhaseFacts, ...]
    locals: tuple[BufferFacts, ...]
    globals: tuple[BufferFacts, ...]
    errors: tuple[ErrorFacts, ...]

    @classmethod
    def of(cls, k: Any) -> CallFacts:
        """The facts of a loop IR kernel (or the facts themselves)."""
        if isinstance(k, CallFacts):
            return k
        buf = lambda b: BufferFacts(b.name, b.dtype, b.space, b.size, b.arg)
        return cls(k.name, tuple(k.syms),
                   tuple(PhaseFacts(p.name, tuple(p.extents), bool(p.parallel))
                         for p in k.phases),
                   tuple(buf(b) for b in k.locals), tuple(buf(b) for b in k.globals),
                   tuple(ErrorFacts(e.code, e.kind, e.message, e.site) for e in k.errors))

    def to_json(self) -> dict[str, Any]:
        buf = lambda b: {"name": b.name, "dtype": b.dtype.name, "space": b.space,
                         "size": expr_json(b.size), "arg": b.arg}
        return {"name": self.name, "syms": list(self.syms),
                "phases": [{"name": p.name, "extents": [expr_json(x) for x in p.extents],
                            "parallel": p.parallel} for p in self.phases],
                "locals": [buf(b) for b in self.locals],
                "globals": [buf(b) for b in self.globals],
                "errors": [{"code": e.code, "kind": e.kind, "message": e.message,
                            "site": site_json(e.site)} for e in self.errors]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CallFacts:
        from ..semantics.dtypes import parse

        def buf(b: dict) -> BufferFacts:
            return BufferFacts(str(b["name"]), parse(b["dtype"]), str(b["space"]),
                               expr_of(b["size"]), int(b["arg"]))

        return cls(str(d["name"]), tuple(str(s) for s in d["syms"]),
                   tuple(PhaseFacts(str(p["name"]), tuple(expr_of(x) for x in p["extents"]),
                                    bool(p["parallel"])) for p in d["phases"]),
                   tuple(buf(b) for b in d["locals"]), tuple(buf(b) for b in d["globals"]),
                   tuple(ErrorFacts(int(e["code"]), str(e["kind"]), str(e["message"]),
                                    site_of(e["site"])) for e in d["errors"]))


# ---------------------------------------------------------------------------
# entries


def write(key: str, target: str, meta: Callable[[], dict[str, Any]],
          parts: Callable[[], dict[str, bytes]]) -> bool:
    """Store a kernel entry (best effort: a cache that cannot be written
    leaves the compile unaffected). ``meta()`` and ``parts()`` build the
    header and the byte parts; a header that cannot be kept faithfully (a
    TypeError or ValueError while building or encoding it) stores nothing.
    True when the entry was written."""
    if DISK.folder() is None:
        return False
    try:
        head = {"format": FORMAT, "target": target, **meta()}
        data = parts()
    except (TypeError, ValueError):
        return False
    before = DISK.stats.writes
    DISK.put(key, head, data)
    return DISK.stats.writes > before


def read(key: str, target: str, decode: Callable[[dict[str, Any], dict[str, bytes]], Any]
         ) -> Any:
    """``decode(meta, parts)`` of the entry ``key``; None when there is none.
    An entry of another format or target, or one ``decode`` rejects (a
    malformed header: KeyError, ValueError, TypeError...; or machine code the
    loader refuses: a ``TilenestError``), is discarded as corrupt: deleted,
    counted, and reported as a miss."""
    from ..errors import TilenestError

    got = DISK.get(key)
    if got is None:
        return None
    meta, parts = got
    try:
        if meta.get("format") != FORMAT or meta.get("target") != target:
            raise ValueError("stale entry")
        return decode(meta, parts)
    except (KeyError, ValueError, TypeError, IndexError, UnicodeError, AttributeError,
            TilenestError):
        DISK.discard(key)
        return None


# ---------------------------------------------------------------------------
# the bounded in-memory cache


def _parse_bytes(text: str) -> int:
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if scale > 1 else t) * scale)


def limits_from_env() -> tuple[int, int]:
    """``(entries, bytes)`` of ``TILENEST_MEMORY_CACHE`` (``ENTRIES[,BYTES]``;
    ``off``/``0``: nothing kept); default 64 entries, 256 MiB. A malformed
    value falls back to the default."""
    raw = os.environ.get("TILENEST_MEMORY_CACHE", "").strip().lower()
    default = (64, 256 << 20)
    if not raw:
        return default
    if raw in ("off", "none", "0"):
        return (0, 0)
    try:
        n, _, b = raw.partition(",")
        return (max(0, int(n)), _parse_bytes(b) if b.strip() else default[1])
    except ValueError:
        return default


@dataclass
class MemoryStats:
    """Lookups and evictions of the in-memory cache in this process."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0


class MemoryCache:
    """A thread-safe LRU map ``key -> (value, nbytes)`` holding at most
    ``max_entries`` entries and ``max_bytes`` bytes (an entry larger than the
    whole budget is not kept). Eviction only forgets the cache's reference;
    ``on_evict(value)`` runs for every entry dropped (outside the lock)."""

    def __init__(self, max_entries: int, max_bytes: int):
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self.stats = MemoryStats()
        self._map: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.on_evict: Callable[[Any], None] | None = None

    def __len__(self) -> int:
        return len(self._map)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, key: str) -> Any:
        with self._lock:
            got = self._map.get(key)
            if got is None:
                self.stats.misses += 1
                return None
            self._map.move_to_end(key)
            self.stats.hits += 1
            return got[0]

    def put(self, key: str, value: Any, nbytes: int) -> None:
        with self._lock:
            old = self._map.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if self.max_entries > 0 and nbytes <= self.max_bytes:
                self._map[key] = (value, nbytes)
                self._bytes += nbytes
            dropped = self._trim()
        self._evicted(dropped)

    def configure(self, max_entries: int | None = None, max_bytes: int | None = None) -> None:
        with self._lock:
            if max_entries is not None:
                self.max_entries = max(0, int(max_entries))
            if max_bytes is not None:
                self.max_bytes = max(0, int(max_bytes))
            dropped = self._trim()
        self._evicted(dropped)

    def clear(self, prefix: str = "") -> int:
        """Forget every entry whose key starts with ``prefix``; their count."""
        with self._lock:
            keys = [k for k in self._map if k.startswith(prefix)]
            dropped = [self._map.pop(k)[0] for k in keys]
            self._bytes = sum(n for _, n in self._map.values())
        self._evicted(dropped)
        return len(dropped)

    def _trim(self) -> list[Any]:
        out = []
        while self._map and (len(self._map) > self.max_entries or self._bytes > self.max_bytes):
            _, (v, n) = self._map.popitem(last=False)
            self._bytes -= n
            self.stats.evictions += 1
            out.append(v)
        return out

    def _evicted(self, values: list[Any]) -> None:
        if self.on_evict is not None:
            for v in values:
                try:
                    self.on_evict(v)
                except Exception:  # noqa: BLE001, S110 - forgetting must never fail a compile
                    pass


#: the process's compiled kernels, every target (keys start with the target name)
MEMORY = MemoryCache(*limits_from_env())


def configure(max_entries: int | None = None, max_bytes: int | None = None) -> None:
    """Change the bound of :data:`MEMORY` (entries beyond it are evicted now)."""
    MEMORY.configure(max_entries, max_bytes)




def release_memory() -> None:
    """Collect garbage and give freed heap pages back to the system (glibc's
    ``malloc_trim``; elsewhere only the collection), so that what a cleared
    cache held shows in the process's resident size."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
