"""The compile cache trusts only what this user wrote (``tilenest.diskcache``).

Each test plants what another local user could put in a cache folder they can
write -- a llvm object entry, a cuda kernel entry whose source the emulator
compiles, an emulator manifest naming a foreign library -- and shows that the
victim's process refuses it with an error naming the path and runs none of
it. "Another user can write" is simulated with ``chmod o+w`` / ``g+w``; "owned
by another user" by making ``os.geteuid`` answer another id (the tests may
run as root). Also: emulator builds are digest-checked before they are
loaded, a full disk leaves the emulator working uncached, and a build killed
with SIGKILL does not leave its temporary files behind.
"""

from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from tilenest import diskcache as DC
from tilenest.backends import kernelcache as KC
from tilenest.backends.simt import emulator as em

ROOT = Path(__file__).resolve().parent.parent

#: a library whose constructor leaves a file behind: proof that it was loaded
EVIL_CTOR = r"""
#include <cstdio>
#include <cstdlib>
__attribute__((constructor)) static void tn_planted() {
  const char *p = std::getenv("TN_PLANTED_MARKER");
  if (p) { FILE *f = std::fopen(p, "w"); if (f) { std::fputs("ran", f); std::fclose(f); } }
}
"""

ADD_ONE = r"""
extern "C" __global__ void add_one(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache root of its own (the emulator's builds under it too), a
    marker file the planted code would create, empty in-memory caches."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TILENEST_CACHE_DIR", str(root))
    monkeypatch.delenv("TILENEST_EMU_CACHE", raising=False)
    monkeypatch.delenv("TILENEST_CACHE_SHARED", raising=False)
    marker = tmp_path / "planted-code-ran"
    monkeypatch.setenv("TN_PLANTED_MARKER", str(marker))
    KC.MEMORY.clear()
    yield root, marker
    KC.MEMORY.clear()


def _axpb(scale: float):
    import test_kernel_cache as T

    return T._axpb(scale=scale)


def _reencode(path: Path, edit) -> None:
    """Rewrite the entry at ``path`` as an attacker would: a valid entry
    (right magic and digest) with ``edit(meta, parts)`` applied."""
    meta, parts = DC._decode(path.read_bytes())
    edit(meta, parts)
    path.write_bytes(DC._encode(meta, parts))


def test_folders_are_created_private(cache):
    root, _ = cache
    _axpb(2.5).compile(target="llvm")
    for d in [root, *[p for p in root.iterdir() if p.is_dir()]]:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    for f in root.rglob("*.tnc"):
        assert stat.S_IMODE(f.stat().st_mode) & 0o077 == 0, f


@pytest.mark.parametrize("bits", [stat.S_IWOTH, stat.S_IWGRP])
def test_a_planted_llvm_object_entry_is_refused(cache, monkeypatch, bits):
    root, _ = cache
    k = _axpb(3.5)
    k.compile(target="llvm")  # the victim's own entries
    KC.MEMORY.clear()
    folder = root / "llvm"
    entry = next(folder.glob("*.tnc"))
    _reencode(entry, lambda m, p: p.__setitem__("object", b"\x7fELF planted code"))
    folder.chmod(0o700 | bits)  # another user could have written it
    (root / "kernels").chmod(0o700 | bits)
    loaded = []
    from tilenest.backends.llvm import jit

    real = jit.Engine.__init__
    monkeypatch.setattr(jit.Engine, "__init__",
                        lambda self, obj, *a, **kw: (loaded.append(obj), real(self, obj, *a, **kw)))
    with pytest.raises(DC.UnsafeCacheError) as e:
        k.compile(target="llvm")
    assert str(root / "kernels") in str(e.value) and "writable by group or others" in str(e.value)
    assert not loaded
    (root / "kernels").chmod(0o700)  # the whole-kernel entry is trusted again: the object
    KC.MEMORY.clear()                # store below it is still refused
    for f in (root / "kernels").glob("*.tnc"):
        f.unlink()
    with pytest.raises(DC.UnsafeCacheError, match=str(folder)):
        k.compile(target="llvm")
    assert b"planted" not in b"".join(loaded)


def test_an_entry_of_another_owner_is_refused(cache, monkeypatch):
    k = _axpb(4.5)
    k.compile(target="llvm")
    KC.MEMORY.clear()
    real = os.geteuid()
    monkeypatch.setattr(DC.os, "geteuid", lambda: real + 4242)  # everything is someone else's
    with pytest.raises(DC.UnsafeCacheError, match="owned by user"):
        k.compile(target="llvm")


def test_a_group_writable_entry_in_a_private_folder_is_refused(cache):
    root, _ = cache
    k = _axpb(5.5)
    k.compile(target="llvm")
    KC.MEMORY.clear()
    entry = next((root / "kernels").glob("*.tnc"))
    entry.chmod(0o620)
    with pytest.raises(DC.UnsafeCacheError, match=str(entry)):
        k.compile(target="llvm")


def test_a_planted_cuda_entry_never_reaches_the_emulator(cache):
    from tilenest.backends import cuda
    from tilenest.backends.cuda import nvrtc

    if not nvrtc.nvrtc_available():
        pytest.skip("no NVRTC")
    root, marker = cache
    k = _axpb(6.5)
    prog = k.program
    cuda.compile_program(prog, device="emulated")
    KC.MEMORY.clear()
    folder = root / "kernels"
    entry = next(folder.glob("*.tnc"))
    _reencode(entry, lambda m, p: p.__setitem__("source", p["source"] + EVIL_CTOR.encode()))
    folder.chmod(0o777)  # a world-writable team folder
    with pytest.raises(DC.UnsafeCacheError, match=str(folder)):
        ck = cuda.compile_program(prog, device="emulated")
        x = np.arange(10, dtype=np.float32)
        ck(x, np.zeros_like(x))
    assert not marker.exists()


def _evil_library(where: Path) -> Path:
    src = where / "evil.cc"
    src.write_text(EVIL_CTOR)
    out = where / "evil.so"
    subprocess.run(["g++", "-shared", "-fPIC", str(src), "-o", str(out)], check=True)
    return out


def test_a_planted_emulator_manifest_never_loads_a_foreign_library(cache, tmp_path):
    root, marker = cache
    good = em.build(ADD_ONE)  # the victim's own build and manifest
    x = np.zeros(4, np.float32)
    good.launch("add_one", 1, 4, [x, 4])
    folder = root / "simt-emu"
    evil = _evil_library(tmp_path)
    manifests = [p for p in folder.glob("*.tnc") if not DC._decode(p.read_bytes())[0]
                 .get("gch")]
    assert manifests
    for path in (str(evil), "../../evil.so", evil.name):
        for m in manifests:
            _reencode(m, lambda meta, parts, path=path: meta.__setitem__("artifact", path))
        em._STORES.clear()
        mod = em.build(ADD_ONE)  # a manifest naming anything but a build of its own: rebuilt
        assert mod.path.parent == folder and mod.path.name != "evil.so"
        assert not marker.exists()
    # the same manifest in a folder others can write is refused outright
    folder.chmod(0o757)
    with pytest.raises(DC.UnsafeCacheError, match=str(folder)):
        em.build(ADD_ONE)
    assert not marker.exists()


def test_a_damaged_emulator_build_is_rebuilt_not_loaded(cache):
    src = ADD_ONE.replace("1.0f", "5.0f")  # a library this process has not loaded
    kernels = em.parse_kernels(src)

    def compiled() -> Path:  # the build step alone: nothing is loaded
        return em._compile(src, kernels, [], tsan=False)

    lib = compiled()
    original = lib.read_bytes()
    lib.write_bytes(original[: len(original) // 2])  # truncated: loading it would SIGBUS
    assert compiled().read_bytes() == original
    flipped = bytearray(original)
    flipped[len(flipped) // 3] ^= 0xFF  # one flipped byte: it would load and compute wrongly
    lib.write_bytes(bytes(flipped))
    assert compiled().read_bytes() == original
    mod = em.build(src)
    x = np.zeros(4, np.float32)
    mod.launch("add_one", 1, 4, [x, 4])
    assert (x == 5).all()


def test_a_full_disk_leaves_the_emulator_working_uncached(cache, monkeypatch):
    root, _ = cache
    real = em.atomic_write

    def full(path, data):
        if str(path).startswith(str(root)):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(em, "atomic_write", full)
    src = ADD_ONE.replace("1.0f", "2.0f")
    mod = em.build(src)
    assert not str(mod.path).startswith(str(root))  # built in the process's own folder
    x = np.zeros(4, np.float32)
    mod.launch("add_one", 1, 4, [x, 4])
    assert (x == 2).all()


def test_an_unwritable_store_still_compiles(cache, monkeypatch):
    """The entry stores skip a write that fails (a full disk) and the compile stands."""
    root, _ = cache
    monkeypatch.setattr(DC, "atomic_write", lambda p, d: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device", str(p))))
    ck = _axpb(7.5).compile(target="llvm")
    x = np.arange(8, dtype=np.float32)
    y = np.zeros_like(x)
    ck(x, y)
    assert (y == x * np.float32(7.5) + 1).all()
    assert not list(root.rglob("*.tnc"))


_KILLED_BUILD = textwrap.dedent('''
    import os, sys
    sys.path.insert(0, os.environ["TN_ROOT"])
    from tilenest.backends.simt import emulator as em
    em.build(sys.argv[1])
''')


def test_a_killed_build_leaves_no_temporary_file_behind(cache, tmp_path):
    root, _ = cache
    folder = root / "simt-emu"
    src = ADD_ONE.replace("1.0f", "3.0f") + "\n// killed build\n"
    script = tmp_path / "build.py"
    script.write_text(_KILLED_BUILD)
    env = dict(os.environ, TN_ROOT=str(ROOT))
    p = subprocess.Popen([sys.executable, str(script), src], env=env)
    deadline = time.time() + 120
    tmps: list[Path] = []
    while time.time() < deadline and not tmps:
        tmps = [t for t in folder.glob("*.tmp") if not t.name.startswith("shim-")] \
            if folder.is_dir() else []
        time.sleep(0.05)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    assert tmps, "the build never started"
    left = list(folder.glob("*.tmp"))
    assert left  # what SIGKILL leaves
    old = time.time() - 2 * DC.STALE_TMP_SECONDS
    for t in left:
        os.utime(t, (old, old))
    em._CLEANED.clear()
    em.build(src)  # the next build in this folder cleans up after the killed one
    assert not [t for t in folder.glob("*.tmp") if t in left]


def test_a_deliberately_shared_cache_is_read_but_never_written(cache, monkeypatch):
    root, _ = cache
    k = _axpb(8.5)
    k.compile(target="llvm")
    KC.MEMORY.clear()
    before = sorted(p.name for p in root.rglob("*.tnc"))
    real = os.geteuid()
    monkeypatch.setattr(DC.os, "geteuid", lambda: real + 4242)  # the cache is a teammate's
    monkeypatch.setenv("TILENEST_CACHE_SHARED", "read")
    assert k.compile(target="llvm").cached == "disk"  # read, as opted in
    KC.MEMORY.clear()
    _axpb(9.5).compile(target="llvm")  # a miss is compiled and not written there
    assert sorted(p.name for p in root.rglob("*.tnc")) == before
    (root / "kernels").chmod(0o777)  # a shared cache others can write is refused even so
    KC.MEMORY.clear()
    with pytest.raises(DC.UnsafeCacheError):
        k.compile(target="llvm")
