"""Compiled (``llvm``) kernels against numpy and PyTorch CPU, in one run.

Benchmarks: row softmax, RMSNorm, LayerNorm, elementwise add, row sum (``R x
R`` f32) and GEMM f32, reassociating (``gemm``: the compiled kernel may use
fused multiply-adds, as BLAS does) and strict (``gemm_strict``: every output
element sums its products in order, separately rounded: bitwise the
interpreter). GEMM tile sizes are a schedule choice made here
(:func:`gemm_tiles`).

Every thread count runs in its own worker process with the BLAS thread count
pinned through ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS``/``MKL_NUM_THREADS``
(read when numpy loads, hence a fresh process), torch's through
``torch.set_num_threads``, so the baselines use as many threads as the
compiled kernel and idle workers do not steal cycles. The worker checks every
compiled result against numpy before timing it (a wrong result is reported,
not timed), then times the compiled kernel and its baselines in alternating
rounds (:mod:`tilenest.bench.timing`); a ratio is baseline time / tilenest time
(> 1: tilenest is faster). Compile time is the first, uncached compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import TilenestError
from .timing import Method, measure

NAMES = ("softmax", "rmsnorm", "layernorm", "add", "row_sum", "gemm", "gemm_strict")
GEMMS = ("gemm", "gemm_strict")

#: per size: the row workloads' R (an R x R matrix) and the GEMM shapes (M, K, N)
SIZES: dict[str, dict[str, Any]] = {
    "small": {"rows": 128, "gemm": ((64, 64, 64),)},
    "medium": {"rows": 1024, "gemm": ((256, 256, 256),)},
    "large": {"rows": 4096, "gemm": ((256, 256, 256), (1024, 1024, 1024), (1000, 1000, 1000))},
}

#: seconds to pause before each sample when BLAS runs several threads: its
#: workers keep spinning a while after a call (OpenBLAS about 0.1 s)
SETTLE_S = 0.25
#: a sample lasts at least this long (seconds)
MIN_SAMPLE_S = 0.05
#: worker output lines carrying a result start with this
TAG = "tilenest-bench "
#: the folder holding the ``tilenest`` package
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def gemm_tiles(m: int, n: int, threads: int) -> dict[str, int]:
    """Output tile ``bm x bn`` and K step ``bk`` of one GEMM program.

    A program copies (packs) an A tile and a B tile per K step and reuses them
    for ``bm * bn * bk`` multiply-adds, so large output tiles amortize the
    copies: 256x256 unless that leaves fewer than two programs per thread
    (the runtime balances chunks of programs between threads), then halved,
    rows first. ``bk = 128`` keeps a register block's B panel (128 x 32 f32,
    16 KiB) in L1 and the packed B tile (128 KiB) in L2."""
    bm = bn = 256
    while -(-m // bm) * -(-n // bn) < 2 * threads and bn > 32:
        if bm >= bn:
            bm //= 2
        else:
            bn //= 2
    return {"bm": bm, "bn": bn, "bk": 128}


def planned(size: str, only: tuple[str, ...]) -> int:
    """How many rows one thread count produces."""
    return sum(len(SIZES[size]["gemm"]) if n in GEMMS else 1 for n in only)


@dataclass
class Case:
    """One benchmark instance: the compiled kernel's call and its baselines."""

    name: str
    workload: str
    kernel: Any
    args: tuple[Any, ...]
    out: Any
    numpy: Callable[[], Any]
    torch: Callable[[], Any] | None
    rtol: float = 1e-4
    atol: float = 1e-5


def cases(size: str, threads: int, only: tuple[str, ...], torch: Any) -> Iterator[Case]:
    """The selected benchmarks at ``size`` in :data:`NAMES` order."""
    import numpy as np

    from .kernels import kernels

    ks = kernels()
    rng = np.random.default_rng(0)
    n = SIZES[size]["rows"]
    x = rng.standard_normal((n, n)).astype(np.float32)
    z = rng.standard_normal((n, n)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    eps = np.float32(1e-5)
    y = np.empty_like(x)
    tx = torch.from_numpy(x) if torch else None

    def np_softmax() -> Any:
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def np_rmsnorm() -> Any:
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w

    def np_layernorm() -> Any:
        mu = x.mean(axis=1, keepdims=True)
        d = x - mu
        return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + eps) * w + b

    shape = f"{n}x{n}"
    if "softmax" in only:
        yield Case("softmax", f"softmax {shape}", ks["softmax"], (x, y), y, np_softmax,
                   (lambda: torch.softmax(tx, 1)) if torch else None)
    if "rmsnorm" in only:
        yield Case("rmsnorm", f"rmsnorm {shape}", ks["rmsnorm"], (x, w, y, eps), y, np_rmsnorm,
                   (lambda: torch.nn.functional.rms_norm(tx, (n,), torch.from_numpy(w), 1e-5))
                   if torch else None)
    if "layernorm" in only:
        yield Case("layernorm", f"layernorm {shape}", ks["layernorm"], (x, w, b, y, eps), y,
                   np_layernorm,
                   (lambda: torch.layer_norm(tx, (n,), torch.from_numpy(w), torch.from_numpy(b),
                                             1e-5)) if torch else None, rtol=1e-3, atol=1e-4)
    if "add" in only:
        out = np.empty_like(x)
        yield Case("add", f"add {shape}", ks["add"], (x, z, out), out,
                   lambda: np.add(x, z, out=y),
                   (lambda: torch.add(tx, torch.from_numpy(z))) if torch else None)
    if "row_sum" in only:
        rs = np.empty(n, np.float32)
        yield Case("row_sum", f"row sum {shape}", ks["row_sum"], (x, rs), rs,
                   lambda: x.sum(axis=1), (lambda: tx.sum(1)) if torch else None,
                   rtol=1e-3, atol=1e-3)
    for m, k, nn in SIZES[size]["gemm"]:
        picked = [g for g in GEMMS if g in only]
        if not picked:
            break
        A = rng.standard_normal((m, k)).astype(np.float32)
        B = rng.standard_normal((k, nn)).astype(np.float32)
        C = np.empty((m, nn), np.float32)
        tiles = gemm_tiles(m, nn, threads)
        tile = "x".join(str(tiles[t]) for t in ("bm", "bn", "bk"))
        for g in picked:
            label = "gemm" if g == "gemm" else "gemm strict"
            yield Case(g, f"{label} {m}x{k}x{nn} ({tile})", ks[g].specialize(**tiles), (A, B, C),
                       C, lambda A=A, B=B: A @ B,
                       (lambda A=A, B=B: torch.from_numpy(A) @ torch.from_numpy(B))
                       if torch and g == "gemm" else None, rtol=1e-3, atol=1e-3)


def _torch(threads: int) -> Any:
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return None
    torch.set_num_threads(threads)
    return torch


def worker(threads: int, size: str, samples: int, only: tuple[str, ...],
           emit: Callable[[dict[str, Any]], None], min_calls: int = 1,
           min_sample_s: float = MIN_SAMPLE_S) -> None:
    """Run the selected benchmarks at ``threads`` threads (BLAS pinned by the
    parent), passing each finished row to ``emit``."""
    import numpy as np

    try:
        from threadpoolctl import threadpool_limits  # type: ignore[import-not-found]

        threadpool_limits(threads)
    except ImportError:
        pass
    torch = _torch(threads)
    from ..backends.llvm import clear_cache

    clear_cache()
    # one thread: no BLAS workers spin between calls, so no pause is needed
    method = Method(samples=samples, min_sample_s=min_sample_s, min_calls=min_calls,
                    settle_s=SETTLE_S if threads > 1 else 0.0)
    for c in cases(size, threads, only, torch):
        row: dict[str, Any] = {"name": c.name, "workload": c.workload, "threads": threads}
        t0 = time.perf_counter()
        ck = c.kernel.compile(threads=threads)
        row["compile_s"] = time.perf_counter() - t0

        def call(ck: Any = ck, c: Case = c) -> None:
            ck(*c.args, threads=threads)

        call()
        try:
            np.testing.assert_allclose(c.out, c.numpy(), rtol=c.rtol, atol=c.atol)
        except AssertionError as e:
            row["error"] = "the compiled result differs from numpy: " + \
                " ".join(str(e).split())[:300]
            emit(row)
            continue
        fns = [call, c.numpy] + ([c.torch] if c.torch is not None else [])
        timings = measure(fns, method)
        row["tilenest"] = timings[0].to_json()
        row["baselines"] = {"numpy": timings[1].to_json()}
        if c.torch is not None:
            row["baselines"]["torch"] = timings[2].to_json()
        row["ratios"] = {k: v["median_s"] / timings[0].median
                         for k, v in row["baselines"].items()}
        emit(row)


def run(threads: list[int], size: str, samples: int, only: tuple[str, ...],
        step: Callable[..., None], min_calls: int = 1,
        min_sample_s: float = MIN_SAMPLE_S) -> list[dict[str, Any]]:
    """Every thread count in a worker process (``python -m tilenest.bench
    --worker``) with BLAS pinned; ``step(label)`` after each row."""
    rows: list[dict[str, Any]] = []
    for t in threads:
        # the worker imports this very package (also from an uninstalled checkout),
        # and compiles uncached (no persistent cache: compile time is measured)
        path = os.pathsep.join(p for p in (_PACKAGE_ROOT, os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t),
                   MKL_NUM_THREADS=str(t), TILENEST_PROGRESS="0", TILENEST_CACHE_DIR="off",
                   PYTHONPATH=path)
        cmd = [sys.executable, "-m", "tilenest.bench", "--worker", str(t), "--size", size,
               "--samples", str(samples), "--min-calls", str(min_calls),
               "--min-sample-ms", repr(min_sample_s * 1e3), "--only", *only]
        with tempfile.TemporaryFile("w+") as err:
            p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
            assert p.stdout is not None
            for line in p.stdout:
                if line.startswith(TAG):
                    row = json.loads(line[len(TAG):])
                    rows.append(row)
                    step(f"{row['workload']} ({t} thread{'s' if t > 1 else ''})")
            status = p.wait()
            if status != 0:
                err.seek(0)
                tail = err.read().strip().splitlines()[-6:]
                raise TilenestError(f"the benchmark worker at {t} thread(s) failed "
                                    f"(exit status {status})", notes=tuple(tail))
    return rows


def emit_line(row: dict[str, Any]) -> None:
    """A worker's output: one tagged JSON line per row, flushed at once."""
    print(TAG + json.dumps(row), flush=True)


def table(rows: list[dict[str, Any]]) -> Any:
    """A rich Table of the rows: medians in ms with their spreads, ratios."""
    from rich.table import Table

    has_torch = any("torch" in r.get("baselines", {}) for r in rows)
    t = Table(title="tilenest llvm vs numpy" + (" and torch" if has_torch else "")
              + " (ratio = baseline time / tilenest time; median of samples, ± spread)")
    cols = ["benchmark", "threads", "tilenest ms", "numpy ms", "ratio"]
    if has_torch:
        cols += ["torch ms", "ratio "]
    cols.append("compile s")
    for c in cols:
        t.add_column(c, justify="left" if c == "benchmark" else "right", no_wrap=True)

    def ms(tm: dict[str, Any] | None) -> str:
        return "-" if tm is None else f"{tm['median_s'] * 1e3:.3f} ±{tm['spread']:.0%}"

    for r in rows:
        if "error" in r:
            t.add_row(r["workload"], str(r["threads"]), f"[red]{r['error'][:60]}[/red]",
                      *([""] * (len(cols) - 3)))
            continue
        cells = [r["workload"], str(r["threads"]), ms(r["tilenest"]),
                 ms(r["baselines"]["numpy"]), f"{r['ratios']['numpy']:.2f}x"]
        if has_torch:
            tt = r["baselines"].get("torch")
            cells += [ms(tt), f"{r['ratios']['torch']:.2f}x" if tt else "-"]
        cells.append(f"{r['compile_s']:.2f}")
        t.add_row(*cells)
    return t
