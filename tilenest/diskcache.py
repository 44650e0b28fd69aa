"""The persistent compile cache: compiled artifacts on disk, shared by processes.

Compilers that are expensive and deterministic (NVRTC's cubins, LLVM's object
code, the emulator's host builds) keep their results here, so a second
process starts without compiling again. An entry is found by a *key*: the
SHA-256 of everything the artifact depends on (the source or IR text, every
option, the toolchain's version, the host's features, the contents of the
headers it includes), which the caller supplies as a list of parts. Nothing
else is consulted, so an entry is never stale: a changed input is another key.

Where: ``$TILENEST_CACHE_DIR`` (``off`` disables the cache), else
``$XDG_CACHE_HOME/tilenest``, else ``~/.cache/tilenest``; each user of the
cache has its own subfolder (:class:`Store` ``namespace``).

Entry format (one file per key, ``<key>.tnc``): the magic ``TNCACHE1``, the
SHA-256 of the payload, the payload's length (8 bytes, little endian), then
the payload: a JSON header (its length first, 4 bytes) with the caller's
metadata and the names and sizes of the binary parts, then the parts. A file
that is truncated, has another magic or whose payload does not match its
digest is *corrupt*: it is deleted and reported as a miss, never loaded, and
the caller rebuilds. A reader that finds a whole entry it cannot use (a
header of another format) discards it the same way (:meth:`Store.discard`).
Writers write a temporary file in the same folder and
rename it over the entry (atomic on POSIX), so concurrent processes see
either the old entry, the new one or none, never a partial one.

**Trust.** An entry holds machine code that a process loads, so the cache
only believes what this user wrote. Folders are created ``0700`` and entries
``0600``; the root, every folder of it and every entry must be owned by the
current user and not writable by group or others, else the read or write
raises :class:`UnsafeCacheError` naming the path (as ssh refuses a key file
others can write). Entries are opened without following links. A cache that
a team shares deliberately is an opt-in, ``TILENEST_CACHE_SHARED=read``:
then entries of another owner are read (never written, evicted or cleared:
misses are compiled and kept in this process only), which means running the
machine code of whoever owns the folder -- trust that owner as you would
trust their binaries. Group- or world-writable paths are refused even so.

**Bound.** ``TILENEST_CACHE_MAX`` (``4G`` by default; ``500M``, ``0``: no
bound) caps the bytes under the root. After this process has written a
sixteenth of the bound (and at its first write) it takes the root's lock
file without waiting and deletes least-recently-used files (a hit refreshes
its entry's time) until the cache is below nine tenths of the bound, and
temporary files that a killed writer left behind. Deleting is safe with
concurrent readers: an open file stays readable, a missing one is a miss.

**No-store mode.** :func:`no_store` (or ``TILENEST_CACHE_WRITE=off``) keeps
reads and stops writes of stores that hold one artifact per program, for
runs that compile programs nobody compiles again (campaigns); the stores of
tilenest's own runtime keep writing.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import stat
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import TilenestError

MAGIC = b"TNCACHE1"
_HEAD = struct.Struct("<8s32sQ")
#: the bound when ``TILENEST_CACHE_MAX`` is not set
DEFAULT_MAX = 4 << 30
#: a temporary file of a process that no longer runs is removed once it is
#: this old (seconds); one whose writer cannot be told is removed after a day
STALE_TMP_SECONDS = 60.0
_ORPHAN_TMP_SECONDS = 24 * 3600.0
#: ``<name>.<pid>.<random>.tmp`` (``.d.tmp`` for a compiler's dependency file)
_TMP_RE = re.compile(r"\.(\d+)\.[A-Za-z0-9_]+(\.d)?\.tmp$")


class UnsafeCacheError(TilenestError):
    """A cache folder or entry that someone other than this user could have
    written: loading from it could run their code, so it is refused."""

    kind = "unsafe cache"


def cache_root() -> Path | None:
    """The cache's root folder, or None when ``TILENEST_CACHE_DIR=off``."""
    env = os.environ.get("TILENEST_CACHE_DIR")
    if env is not None and env.strip().lower() in ("off", "0", "none", ""):
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tilenest"


def shared_read_only() -> bool:
    """Whether ``TILENEST_CACHE_SHARED=read`` opts into reading a cache of
    another owner (and then writing nothing to it)."""
    v = os.environ.get("TILENEST_CACHE_SHARED", "").strip().lower()
    return v in ("read", "readonly", "read-only", "1", "yes", "on")


_NO_STORE = threading.local()


def writes_enabled() -> bool:
    """Whether stores that hold one artifact per program may write: not in a
    shared read-only cache, not under :func:`no_store` or
    ``TILENEST_CACHE_WRITE=off``."""
    if shared_read_only() or getattr(_NO_STORE, "depth", 0) > 0 or _NO_STORE_PROCESS[0]:
        return False
    v = os.environ.get("TILENEST_CACHE_WRITE", "").strip().lower()
    return v not in ("off", "0", "no", "false")


_NO_STORE_PROCESS = [False]


@contextlib.contextmanager
def no_store() -> Iterator[None]:
    """Within the block (this thread), per-program stores read but do not
    write (see the module's *No-store mode*)."""
    _NO_STORE.depth = getattr(_NO_STORE, "depth", 0) + 1
    try:
        yield
    finally:
        _NO_STORE.depth -= 1


def set_no_store(on: bool = True) -> None:
    """Turn no-store mode on or off for the whole process (a worker process
    of a campaign)."""
    _NO_STORE_PROCESS[0] = on


def max_bytes() -> int:
    """The cache's bound in bytes (``TILENEST_CACHE_MAX``; 0: unbounded). A
    malformed value is a usage error naming the variable."""
    raw = os.environ.get("TILENEST_CACHE_MAX", "").strip().lower()
    if not raw:
        return DEFAULT_MAX
    if raw in ("0", "off", "none", "unlimited"):
        return 0
    t = raw.removesuffix("ib").removesuffix("b")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(t[-1:], 1)
    try:
        n = float(t[:-1] if scale > 1 else t)
    except ValueError:
        n = -1.0
    if not n >= 0 or n != n or n == float("inf"):
        from .errors import UsageError

        raise UsageError(f"TILENEST_CACHE_MAX={raw!r} is not a size",
                         hint="write a byte count with an optional K, M, G or T suffix "
                              "(4G, 500M), or 0 for no bound")
    return int(n * scale)


# ---------------------------------------------------------------------------
# trust


def _refuse(path: Path | str, why: str) -> UnsafeCacheError:
    return UnsafeCacheError(
        f"refusing the compile cache at {path}: {why}",
        hint="the cache holds machine code this process runs: make it yours and private "
             f"(chown $USER; chmod go-w {path}), point TILENEST_CACHE_DIR at a folder of "
             "your own, or turn the cache off with TILENEST_CACHE_DIR=off; a cache shared "
             "on purpose is read with TILENEST_CACHE_SHARED=read")


def check_stat(path: Path | str, st: os.stat_result, kind: str) -> None:
    """Refuse (:class:`UnsafeCacheError`) a cache ``kind`` (``folder`` or
    ``entry``) that is not of that kind, is writable by group or others, or
    is owned by another user (unless :func:`shared_read_only`)."""
    if kind == "folder" and not stat.S_ISDIR(st.st_mode):
        # not a trust question: nothing can be kept there (a miss, a write skipped)
        raise NotADirectoryError(errno.ENOTDIR, "a cache folder is not a folder", str(path))
    if kind != "folder" and not stat.S_ISREG(st.st_mode):
        raise _refuse(path, "the entry is not a regular file")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise _refuse(path, f"the {kind} is writable by group or others "
                            f"(mode {stat.S_IMODE(st.st_mode):04o})")
    if st.st_uid != os.geteuid() and not shared_read_only():
        raise _refuse(path, f"the {kind} is owned by user {st.st_uid}, not by this user "
                            f"({os.geteuid()})")


def secure_folder(path: Path, create: bool = True, root: Path | None = None) -> bool:
    """Check the cache folder ``path`` and every folder between it and the
    cache root (``root``, default :func:`cache_root`), creating missing ones
    ``0700`` when ``create``; False when ``path`` does not exist (and was not
    created). Raises :class:`UnsafeCacheError` for a folder others could
    write or another user owns, ``OSError`` when one cannot be made."""
    root = cache_root() if root is None else root
    chain = [path]
    if root is not None and root in path.parents:
        chain = [q for q in reversed(path.parents) if q == root or root in q.parents] + [path]
    if create and not shared_read_only():
        missing = [q for q in chain if not q.exists()]
        if missing and missing[0].parent not in chain:
            missing[0].parent.mkdir(parents=True, exist_ok=True)
        for q in missing:
            with contextlib.suppress(FileExistsError):
                q.mkdir(mode=0o700)
    for q in chain:
        try:
            st = os.stat(q)  # the root may be a link (a cache on another disk)
        except (FileNotFoundError, NotADirectoryError):
            return False
        check_stat(q, st, "folder")
    return True


def read_private(path: Path) -> bytes | None:
    """The bytes of the cache file ``path`` (None when there is none), opened
    without following a link and checked (:func:`check_stat`) on the open
    file itself, so what is checked is what is read."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _refuse(path, "the entry is a symbolic link") from None
        return None
    with os.fdopen(fd, "rb") as f:
        check_stat(path, os.fstat(f.fileno()), "entry")
        return f.read()


def sha256_file(path: Path) -> str | None:
    """SHA-256 of the cache file ``path`` read as :func:`read_private` does
    (None when it is missing)."""
    data = read_private(path)
    return None if data is None else hashlib.sha256(data).hexdigest()


def touch(path: Path) -> None:
    """Mark ``path`` as just used (its modification time: what eviction
    orders by), best effort."""
    try:
        os.utime(path)
    except OSError:
        pass


def key_of(parts: list[Any]) -> str:
    """The key of an artifact: SHA-256 over the JSON of its input parts
    (strings, numbers, lists; bytes are hashed first)."""
    def norm(x: Any) -> Any:
        if isinstance(x, (bytes, bytearray)):
            return {"sha256": hashlib.sha256(x).hexdigest()}
        if isinstance(x, (list, tuple)):
            return [norm(y) for y in x]
        return x

    return hashlib.sha256(json.dumps(norm(parts), sort_keys=True).encode()).hexdigest()


def temp_file(folder: Path, name: str, suffix: str = ".tmp") -> tuple[int, str]:
    """``mkstemp`` in ``folder`` (mode ``0600``), named after ``name`` and
    this process (``<name>.<pid>.<random>.tmp``), so that a cleaner can tell
    the temporary file of a writer that was killed (:func:`clean_stale`)."""
    return tempfile.mkstemp(dir=folder, prefix=f"{name}.{os.getpid()}.", suffix=suffix)


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed over it."""
    fd, tmp = temp_file(path.parent, path.name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def file_digest(paths: list[Path]) -> str:
    """SHA-256 over the names and contents of ``paths`` (a header set a
    compilation includes), sorted by name; unreadable files count as empty."""
    h = hashlib.sha256()
    for p in sorted(paths, key=str):
        h.update(str(p.name).encode() + b"\0")
        try:
            h.update(p.read_bytes())
        except OSError:
            pass
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class Stats:
    """Lookups of one store in this process."""

    hits: int = 0
    misses: int = 0
    corrupt: int = 0
    writes: int = 0


@dataclass
class Store:
    """The entries of one cache user (``namespace``: a subfolder of the root).

    ``per_program`` stores (the default) hold one artifact per compiled
    program and write nothing in no-store mode (:func:`writes_enabled`);
    the others hold tilenest's own runtime, shared by every program."""

    namespace: str
    root: Path | None = None
    stats: Stats = field(default_factory=Stats)
    per_program: bool = True
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _base(self) -> Path | None:
        return self.root if self.root is not None else cache_root()

    def folder(self) -> Path | None:
        base = self._base()
        return None if base is None else base / self.namespace

    def path(self, key: str) -> Path | None:
        d = self.folder()
        return None if d is None else d / f"{key}.tnc"

    def writable(self) -> bool:
        """Whether :meth:`put` may write now (cache on, writes allowed)."""
        if self.folder() is None:
            return False
        return writes_enabled() if self.per_program else not shared_read_only()

    def get(self, key: str) -> tuple[dict[str, Any], dict[str, bytes]] | None:
        """``(metadata, parts)`` of the entry ``key``; None when there is none,
        the cache is off, or the entry is corrupt (then it is deleted).
        Raises :class:`UnsafeCacheError` for a folder or entry someone else
        could have written (:func:`check_stat`)."""
        p = self.path(key)
        if p is None:
            return None
        try:
            data = read_private(p) if secure_folder(p.parent, False, self._base()) else None
        except OSError:  # a root that is not a folder, an unreadable file: a miss
            data = None
        if data is None:
            with self._lock:
                self.stats.misses += 1
            return None
        got = _decode(data)
        with self._lock:
            if got is None:
                self.stats.corrupt += 1
                self.stats.misses += 1
            else:
                self.stats.hits += 1
        if got is None:
            self._unlink(p)
        else:
            touch(p)
        return got

    def _unlink(self, p: Path) -> None:
        if shared_read_only():
            return  # another owner's cache: never changed from here
        try:
            p.unlink()
        except OSError:
            pass

    def discard(self, key: str) -> None:
        """Delete the entry ``key`` that :meth:`get` returned but its reader
        found unusable (another format, a header it cannot decode): counted as
        corrupt and as a miss instead of a hit, so the caller rebuilds it."""
        p = self.path(key)
        if p is None:
            return
        with self._lock:
            self.stats.hits = max(0, self.stats.hits - 1)
            self.stats.misses += 1
            self.stats.corrupt += 1
        self._unlink(p)

    def put(self, key: str, meta: dict[str, Any], parts: dict[str, bytes]) -> None:
        """Store an entry (best effort: a cache that cannot be written, e.g. a
        read-only folder or a full disk, leaves the compile result
        unaffected; nothing is written in no-store mode). A folder others
        could write raises :class:`UnsafeCacheError`."""
        p = self.path(key)
        if p is None or not self.writable():
            return
        try:
            data = _encode(meta, parts)
        except (TypeError, ValueError):  # metadata JSON cannot hold: not cached
            return
        try:
            secure_folder(p.parent, True, self._base())
            atomic_write(p, data)
        except OSError:
            return
        with self._lock:
            self.stats.writes += 1
        wrote(self._base(), len(data))


def _encode(meta: dict[str, Any], parts: dict[str, bytes]) -> bytes:
    head = json.dumps({"meta": meta, "parts": [[n, len(b)] for n, b in parts.items()]}).encode()
    payload = struct.pack("<I", len(head)) + head + b"".join(parts.values())
    return _HEAD.pack(MAGIC, hashlib.sha256(payload).digest(), len(payload)) + payload


def _decode(data: bytes) -> tuple[dict[str, Any], dict[str, bytes]] | None:
    if len(data) < _HEAD.size:
        return None
    magic, digest, n = _HEAD.unpack_from(data)
    payload = data[_HEAD.size:]
    if magic != MAGIC or n != len(payload) or hashlib.sha256(payload).digest() != digest:
        return None
    try:
        (hn,) = struct.unpack_from("<I", payload)
        head = json.loads(payload[4:4 + hn])
        off = 4 + hn
        parts: dict[str, bytes] = {}
        for name, size in head["parts"]:
            parts[name] = payload[off:off + size]
            off += size
        if off != len(payload):
            return None
        return head["meta"], parts
    except (ValueError, KeyError, TypeError, struct.error):
        return None


# ---------------------------------------------------------------------------
# the bound: usage, eviction, clearing


#: per cache root: bytes this process wrote there since it last enforced the bound
_WRITTEN: dict[str, int] = {}
_WRITTEN_LOCK = threading.Lock()


def wrote(root: Path | None, nbytes: int) -> None:
    """Count ``nbytes`` written under ``root`` by this process; at the first
    write and after each sixteenth of the bound (at most 64 MiB) written,
    enforce the bound (:func:`evict`)."""
    limit = max_bytes()
    if limit <= 0 or root is None:
        return
    with _WRITTEN_LOCK:
        k = str(root)
        first = k not in _WRITTEN
        _WRITTEN[k] = _WRITTEN.get(k, 0) + nbytes
        due = first or _WRITTEN[k] >= min(limit // 16, 64 << 20)
        if due:
            _WRITTEN[k] = 0
    if due:
        try:
            evict(root, limit)
        except OSError:
            pass


@dataclass(frozen=True)
class CacheFile:
    """A file under the cache root: its path, size and last use (mtime)."""

    path: Path
    size: int
    used: float


def _files(root: Path) -> list[CacheFile]:
    """Every regular file in the folders directly under ``root`` (the stores
    and the emulator's builds), links not followed."""
    out: list[CacheFile] = []
    try:
        folders = [e for e in os.scandir(root) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return out
    for d in folders:
        try:
            entries = list(os.scandir(d.path))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out.append(CacheFile(Path(e.path), st.st_size, st.st_mtime))
    return out


def _stale(f: CacheFile, now: float) -> bool:
    """Is ``f`` the temporary file of a writer that is gone? Its name carries
    the writer's process id (:func:`temp_file`): stale when that process no
    longer runs and the file is older than :data:`STALE_TMP_SECONDS`, or in
    any case after a day (a writer of another machine or PID namespace)."""
    m = _TMP_RE.search(f.path.name)
    if m is None:
        return False
    age = now - f.used
    if age > _ORPHAN_TMP_SECONDS:
        return True
    if age < STALE_TMP_SECONDS:
        return False
    try:
        os.kill(int(m.group(1)), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):
        return False
    return False


def clean_stale(folder: Path) -> int:
    """Delete the stale temporary files (:func:`_stale`) in ``folder``; their count."""
    now, n = time.time(), 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and _stale(CacheFile(Path(e.path), st.st_size, st.st_mtime), now):
            try:
                os.unlink(e.path)
                n += 1
            except OSError:
                pass
    return n


@contextlib.contextmanager
def _root_lock(root: Path, wait: bool) -> Iterator[bool]:
    """The root's lock file (``.lock``), held while eviction or clearing
    deletes: True when taken (``wait=False`` gives up at once if another
    process holds it)."""
    import fcntl

    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def evict(root: Path, limit: int, wait: bool = False) -> int:
    """Bring the files under ``root`` below nine tenths of ``limit`` bytes,
    least recently used first, and delete stale temporary files; the bytes
    freed. Skipped when another process is evicting (``wait=False``)."""
    if shared_read_only() or not root.is_dir():
        return 0
    check_stat(root, os.stat(root), "folder")
    with _root_lock(root, wait) as held:
        if not held:
            return 0
        now = time.time()
        files = _files(root)
        freed = 0
        keep: list[CacheFile] = []
        for f in files:
            if _stale(f, now):
                with contextlib.suppress(OSError):
                    f.path.unlink()
                    freed += f.size
            elif not _TMP_RE.search(f.path.name):
                keep.append(f)
        total = sum(f.size for f in keep)
        if limit > 0 and total > limit:
            target = limit * 9 // 10
            for f in sorted(keep, key=lambda f: f.used):
                if total <= target:
                    break
                with contextlib.suppress(OSError):
                    f.path.unlink()
                    total -= f.size
                    freed += f.size
        return freed


def usage(root: Path | None = None) -> dict[str, Any]:
    """What the cache holds: its root, bound and mode, and per folder the
    number of files and bytes (``{"folders": {name: [files, bytes]}}``)."""
    root = cache_root() if root is None else root
    info: dict[str, Any] = {"root": None if root is None else str(root),
                            "max_bytes": max_bytes(), "shared_read_only": shared_read_only(),
                            "writes": writes_enabled(), "folders": {}, "files": 0, "bytes": 0}
    if root is None or not root.is_dir():
        return info
    for f in _files(root):
        row = info["folders"].setdefault(f.path.parent.name, [0, 0])
        row[0] += 1
        row[1] += f.size
        info["files"] += 1
        info["bytes"] += f.size
    return info


def clear(root: Path | None = None) -> int:
    """Delete every file in the cache's folders (not the folders, nor
    anything directly in the root); the number deleted. Refused
    (:class:`UnsafeCacheError`) for a cache that is not this user's."""
    root = cache_root() if root is None else root
    if root is None or not root.is_dir():
        return 0
    if shared_read_only():
        raise UnsafeCacheError(f"the shared cache at {root} is read only here",
                               hint="its owner clears it; unset TILENEST_CACHE_SHARED to "
                                    "manage a cache of your own")
    check_stat(root, os.stat(root), "folder")
    n = 0
    with _root_lock(root, wait=True):
        for f in _files(root):
            with contextlib.suppress(OSError):
                f.path.unlink()
                n += 1
    return n
