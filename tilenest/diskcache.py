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
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAGIC = b"TNCACHE1"
_HEAD = struct.Struct("<8s32sQ")


def cache_root() -> Path | None:
    """The cache's root folder, or None when ``TILENEST_CACHE_DIR=off``."""
    env = os.environ.get("TILENEST_CACHE_DIR")
    if env is not None and env.strip().lower() in ("off", "0", "none", ""):
        return None
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tilenest"


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


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file renamed over it."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
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
    """The entries of one cache user (``namespace``: a subfolder of the root)."""

    namespace: str
    root: Path | None = None
    stats: Stats = field(default_factory=Stats)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def folder(self) -> Path | None:
        base = self.root if self.root is not None else cache_root()
        return None if base is None else base / self.namespace

    def path(self, key: str) -> Path | None:
        d = self.folder()
        return None if d is None else d / f"{key}.tnc"

    def get(self, key: str) -> tuple[dict[str, Any], dict[str, bytes]] | None:
        """``(metadata, parts)`` of the entry ``key``; None when there is none,
        the cache is off, or the entry is corrupt (then it is deleted)."""
        p = self.path(key)
        if p is None:
            return None
        try:
            data = p.read_bytes()
        except OSError:
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
            try:
                p.unlink()
            except OSError:
                pass
        return got

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
        try:
            p.unlink()
        except OSError:
            pass

    def put(self, key: str, meta: dict[str, Any], parts: dict[str, bytes]) -> None:
        """Store an entry (best effort: a cache that cannot be written, e.g. a
        read-only folder, leaves the compile result unaffected)."""
        p = self.path(key)
        if p is None:
            return
        try:
            data = _encode(meta, parts)
        except (TypeError, ValueError):  # metadata JSON cannot hold: not cached
            return
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(p, data)
        except OSError:
            return
        with self._lock:
            self.stats.writes += 1


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
