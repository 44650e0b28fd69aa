"""The llvm backend's native worker pool (``backends/llvm/workers.py`` and
``workloop.py``): every chunk of a phase runs once, on at most the threads
asked for, each worker slot with its own local buffers; the error reported is
the lowest failing chunk's whatever the timing; sleeping helpers wake for a
call; a forked child and interpreter exit neither deadlock nor hang.

Entry points written in Python (ctypes callbacks) stand in for compiled
phases where a test needs to see which thread ran which chunk.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32, i32
from tilenest.backends.llvm import workers
from tilenest.backends.llvm import workloop as W
from tilenest.backends.llvm.workers import chunks
from tilenest.errors import BoundsError, RuntimeSemanticError

ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                         ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p)
ARGV, SYMV = (ctypes.c_void_p * 1)(), (ctypes.c_int64 * 1)()


def slot_of(status: int) -> int:
    return ctypes.c_int32.from_address(status + 4).value


class Recorder:
    """An entry that records, per chunk, its range, worker slot, thread and
    locals table; ``fail(lo)`` gives the status code a chunk sets (0: none),
    ``pause(lo)`` seconds it sleeps first."""

    def __init__(self, fail=lambda lo: 0, pause=lambda lo: 0.0):
        self.seen: list[tuple[int, int, int, int, int]] = []
        self.lock = threading.Lock()

        def entry(args, syms, locs, lo, hi, status):
            time.sleep(pause(lo))
            with self.lock:
                self.seen.append((lo, hi, slot_of(status), threading.get_ident(), locs))
            code = fail(lo)
            if code:
                ctypes.c_int32.from_address(status).value = code

        self.entry = ENTRY(entry)

    def run(self, n: int, nworkers: int, chunk: int | None, sizes=(64,)) -> int:
        self.seen.clear()
        return workers.run_phase(self.entry, ARGV, SYMV, list(sizes), n, nworkers, chunk)


@pytest.mark.parametrize("nworkers", [1, 2, 3, 5])
@pytest.mark.parametrize("chunk", [None, 1, 4])
def test_every_chunk_runs_once_on_at_most_the_threads_asked(nworkers, chunk):
    r = Recorder(pause=lambda lo: 0.001)
    assert r.run(37, nworkers, chunk) == 0
    assert sorted((lo, hi) for lo, hi, *_ in r.seen) == chunks(37, nworkers, chunk)
    slots = {(s, t) for _, _, s, t, _ in r.seen}
    assert {s for s, _ in slots} <= set(range(nworkers))
    # one thread per slot and one slot per thread; slot 0 is the caller
    assert len({s for s, _ in slots}) == len(slots) == len({t for _, t in slots})
    assert all(t == threading.get_ident() for s, t in slots if s == 0)
    # each slot has its own locals table, the same for all of its chunks
    tables = {(s, loc) for _, _, s, _, loc in r.seen}
    assert len(tables) == len({s for s, _ in tables}) == len({loc for _, loc in tables})
    if nworkers > 1:
        assert len(workers.pool().threads) >= nworkers - 1


def test_chunking_bounds_the_chunk_count():
    assert workers.chunking(10, 1, None) == (10, 1)
    assert workers.chunking(10, 2, None) == (1, 10)
    assert workers.chunking(10, 2, 3) == (3, 4)
    step, count = workers.chunking(10 * workers.MAX_CHUNKS + 3, 4, 1)
    assert count <= workers.MAX_CHUNKS and step * count >= 10 * workers.MAX_CHUNKS + 3


def test_makespan_counts_the_ids_of_the_busiest_worker():
    assert workers.makespan(20, 3, 2) == 11       # chunks 3 3 3 3 3 3 2: 3+3+3+2
    assert workers.makespan(20, 2, 2) == 10
    assert workers.makespan(10, 2, 2) == 6        # chunks 2 2 2 2 2: 2+2+2
    assert workers.makespan(7, 3, 2) == 4         # chunks 3 3 1: 3+1
    assert workers.makespan(9, 3, 3) == 3


@pytest.mark.parametrize("n", [1, 3, 7, 10, 20, 35, 96, 1000, 4096, 10**7])
@pytest.mark.parametrize("nworkers", [2, 3, 4])
def test_chunks_load_no_worker_past_its_share(n, nworkers):
    """The automatic chunks give the busiest worker at most 1/32 more ids
    than an even split does (20 GEMM tiles on two workers: ten each, where
    chunks of three gave one worker eleven)."""
    step, count = workers.chunking(n, nworkers, None)
    share = -(-n // nworkers)
    assert workers.makespan(n, step, nworkers) <= share + share // workers.TOLERANCE
    assert step <= max(1, -(-n // (nworkers * workers.CHUNKS_PER_WORKER)))
    assert workers.chunking(20, 2, None) == (2, 10)


@pytest.mark.parametrize("nworkers", [1, 2, 3, 4])
def test_the_lowest_failing_chunk_is_reported_whatever_the_timing(nworkers):
    """Chunks from id 8 on fail with code 100 + their first id; chunk 8 is
    the slowest, so later chunks fail first in time."""
    r = Recorder(fail=lambda lo: 100 + lo if lo >= 8 else 0,
                 pause=lambda lo: 0.05 if lo == 8 else 0.0)
    assert r.run(20, nworkers, 2) == 108
    assert r.run(20, nworkers, 1) == 108
    assert r.run(7, nworkers, 1) == 0


def test_local_buffers_are_aligned_per_slot_and_kept_between_calls():
    sizes = [100, 4096, 8]
    r = Recorder(pause=lambda lo: 0.001)
    r.run(16, 3, 1, sizes)
    first = {s: loc for _, _, s, _, loc in r.seen}
    for s, loc in first.items():
        ptrs = [ctypes.c_void_p.from_address(loc + 8 * i).value for i in range(len(sizes))]
        assert all(p % 64 == 0 for p in ptrs)
        assert ptrs[1] - ptrs[0] >= sizes[0] and ptrs[2] - ptrs[1] >= sizes[1]
    r.run(16, 3, 1, sizes)
    again = {s: loc for _, _, s, _, loc in r.seen}
    assert all(again[s] == first[s] for s in again.keys() & first.keys())
    # an arena too large to keep is made for the call and dropped
    r.run(4, 2, 1, [workers.SPARE_BYTES + 64])
    assert all(a.nbytes <= workers.SPARE_BYTES for a in workers.pool().context.arenas)


def test_sleeping_helpers_wake_for_a_call():
    """Once every helper sleeps, a call still gets helpers: chunk 0 blocks its
    thread until another thread has run a chunk."""
    p = workers.pool()
    Recorder().run(8, 3, 1)
    sleepers = p.word[W.SLEEPERS // 8:W.SLEEPERS // 8 + 1]
    deadline = time.monotonic() + 10
    while int(sleepers[0]) < len(p.threads) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert int(sleepers[0]) == len(p.threads) >= 2
    other = threading.Event()
    owner: list[int] = []

    def pause(lo):
        if lo == 0:
            owner.append(threading.get_ident())
            other.wait(10)
        elif owner and threading.get_ident() != owner[0]:
            other.set()
        return 0.0

    assert Recorder(pause=pause).run(8, 3, 1) == 0
    assert other.is_set()


# ---------------------------------------------------------------------------
# compiled kernels


@tn.kernel
def add_rows(x: tn.Tensor[f32, "R C"], z: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    z = z.with_dims(*x.dims())
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(rows)):
        o = tn.coord(p.index(), 0)
        y(o, tn.shape(1, cols)).store(x[o, tn.shape(1, cols)] + z[o, tn.shape(1, cols)])


@tn.kernel
def faults(x: tn.Tensor[i32, "N"], d: tn.Tensor[i32, "N"], y: tn.Tensor[i32, "N"], *, b=4):
    (n,) = x.shape
    d = d.with_dims(x.dim(0))
    y = y.with_dims(x.dim(0))
    for p in tn.parallel(tn.shape(tn.cdiv(n, b))):
        o = tn.coord(p.index() * b)
        y(o, tn.shape(b)).store(x[o, tn.shape(b), tn.bounds.checked]
                                // d[o, tn.shape(b), tn.bounds.zero])


def test_outputs_are_the_same_for_any_threads_and_chunks():
    rng = np.random.default_rng(1)
    x, z = (rng.standard_normal((67, 33)).astype(np.float32) for _ in range(2))
    want = x + z
    for chunk in (None, 1, 5):
        ck = add_rows.compile(chunk=chunk)
        for threads in (1, 2, 3, 4):
            assert ck(x, z, np.empty_like(x), threads=threads).tobytes() == want.tobytes()


@pytest.mark.parametrize("chunk", [None, 1])
def test_first_error_in_program_order_for_any_threads(chunk):
    """Program 1 divides by zero and the last one reads out of bounds: the
    division is reported; without it, the bounds error."""
    ck = faults.compile(chunk=chunk)
    x = np.arange(33, dtype=np.int32)
    d = np.ones(33, np.int32)
    for threads in (1, 2, 3, 4):
        with pytest.raises(BoundsError):
            ck(x, d, np.zeros(33, np.int32), threads=threads)
    d[5] = 0
    for threads in (1, 2, 3, 4):
        with pytest.raises(RuntimeSemanticError, match="division by zero"):
            ck(x, d, np.zeros(33, np.int32), threads=threads)


def test_concurrent_callers_get_their_own_results():
    """Two Python threads call one kernel with the same layout (so the same
    bound call) and their own arrays, in parallel phases."""
    ck = add_rows.compile()
    errors: list[str] = []

    def caller(seed: int) -> None:
        rng = np.random.default_rng(seed)
        x = np.full((40, 16), seed, np.float32)
        for i in range(150):
            z = rng.standard_normal((40, 16)).astype(np.float32) if i % 50 == 0 else z
            y = ck(x, z, np.empty_like(x), threads=2)
            if y.tobytes() != (x + z).tobytes():
                errors.append(f"caller {seed}, call {i}")
                return

    ts = [threading.Thread(target=caller, args=(s,)) for s in (1, 2, 3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors and not any(t.is_alive() for t in ts)


# ---------------------------------------------------------------------------
# fork and exit


def _wait(pid: int, seconds: float) -> int | None:
    """The exit status of child ``pid``, or None (and the child killed) when it
    has not exited within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_during_a_parallel_call_runs_parallel_calls():
    ck = add_rows.compile()
    x = np.ones((64, 8), np.float32)
    ck(x, x, np.empty_like(x), threads=2)  # the pool exists, helpers started
    busy = threading.Thread(target=Recorder(pause=lambda lo: 0.2).run, args=(8, 3, 1))
    busy.start()
    time.sleep(0.1)  # the pool's lock is held and helpers are in chunks
    pid = os.fork()
    if pid == 0:  # the child: no pool threads, the parent's locks possibly held
        code = 1
        try:
            y = ck(x, x, np.empty_like(x), threads=3)
            r = Recorder()
            if (y == 2).all() and r.run(12, 3, 1) == 0 and len(r.seen) == 12:
                code = 0
        finally:
            os._exit(code)
    busy.join()
    assert _wait(pid, 120) == 0


def test_interpreter_exit_stops_and_joins_the_helpers():
    script = textwrap.dedent("""
        import atexit, threading
        def after():  # registered first, so it runs after tilenest's handler
            alive = [t.name for t in threading.enumerate() if t.name.startswith("tilenest-cpu")]
            print("alive:", alive, flush=True)
        atexit.register(after)
        import numpy as np
        from tilenest.backends.llvm import workers
        import ctypes
        E = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * 3), ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_void_p)
        a = (ctypes.c_void_p * 1)()
        assert workers.run_phase(E(lambda *x: None), a, a, [64], 16, 3, 1) == 0
        print("helpers:", len(workers.pool().threads), flush=True)
    """)
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert "helpers: 2" in out.stdout and "alive: []" in out.stdout
