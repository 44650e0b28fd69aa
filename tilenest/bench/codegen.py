"""Compiled (``llvm``) kernels against numpy and PyTorch CPU, in one run.

Benchmarks (:data:`NAMES`):

* the bandwidth ceilings ``read`` (every element of an ``R x R`` f32 array
  read once) and ``copy`` (the array copied into another), see below;
* the row workloads row softmax, RMSNorm, LayerNorm, elementwise add, FP8
  quantization (``fp8_quantize``: ``x * s`` rounded into e4m3fn, saturating;
  against ``ml_dtypes`` and torch's ``float8_e4m3fn``, bit for bit) and row
  sum of an ``R x R`` f32 matrix, and ``global_sum`` (``N`` f32 to one scalar,
  a ``reduce`` region over chunks at the top level with a one-element tile
  state, which the lowering runs as per-chunk partials over the threads and a
  combine);
* GEMM f32, reassociating (``gemm``: the compiled kernel may use fused
  multiply-adds, as BLAS does) and strict (``gemm_strict``: every output
  element sums its products in order, separately rounded: bitwise the
  interpreter); ``swiglu`` (``silu(x @ Wg) * (x @ Wu)``, the two products
  sharing each loaded ``x`` tile) and ``bmm_nt`` (``C[b] = A[b] @ B[b]^T``).
  Their tile sizes are a schedule choice made here (:func:`gemm_tiles`).

A row is identified by its name, its ``shape`` (``R x R``, ``M x K x N``,
``B x M x N x K`` or ``N``) and its thread count; ``workload`` is its label.

**Bandwidth.** A memory-bound row also reports the bandwidth it reached --
the bytes it must move at least (each input read once, each output written
once) over its median time -- as a fraction of a ceiling measured at the same
size and thread count in the same run: ``row_sum`` and ``global_sum`` against
``read``, the others against ``copy``. A ceiling is the best bandwidth any of
its three implementations shows -- the compiled kernel, numpy (``x.sum()``,
``np.copyto``) and torch (``x.sum()``, ``y.copy_(x)``) -- so it is the most
the machine demonstrably does, not what tilenest happens to reach; a row
selected with ``--only`` brings its ceiling along (:func:`with_ceilings`).
Like STREAM, the byte counts leave out the line a store first reads into the
cache (write-allocate), so a kernel with more reads per write than ``copy``
(``add``: two per write) can show more than 100% of it.
The fractions are computed from the finished rows by :func:`attach_bandwidth`.

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
from .timing import Method, measure, plus_minus

NAMES = ("read", "copy", "softmax", "rmsnorm", "layernorm", "add", "fp8_quantize", "row_sum",
         "logsumexp", "global_sum", "gemm", "gemm_strict", "swiglu", "bmm_nt")
GEMMS = ("gemm", "gemm_strict")
#: the benchmarks over an R x R matrix (one shape per size)
ROWS = ("read", "copy", "softmax", "rmsnorm", "layernorm", "add", "fp8_quantize", "row_sum",
        "logsumexp")
#: memory-bound benchmark -> the ceiling its bandwidth is measured against
CEILING_OF = {"softmax": "copy", "rmsnorm": "copy", "layernorm": "copy", "add": "copy",
              "fp8_quantize": "copy", "row_sum": "read", "logsumexp": "read",
              "global_sum": "read"}
CEILINGS = ("read", "copy")

#: per size: the row workloads' R (an R x R matrix), the GEMM and SwiGLU shapes
#: (M, K, N), the transposed batched product's (B, M, N, K), the global sum's N
SIZES: dict[str, dict[str, Any]] = {
    "small": {"rows": 128, "gemm": ((64, 64, 64),), "swiglu": ((64, 64, 64),),
              "bmm_nt": ((2, 64, 64, 32),), "global_sum": 100_000},
    "medium": {"rows": 1024, "gemm": ((256, 256, 256),), "swiglu": ((256, 256, 512),),
               "bmm_nt": ((8, 256, 256, 64),), "global_sum": 1_000_000},
    "large": {"rows": 4096,
              "gemm": ((256, 256, 256), (1024, 1024, 1024), (1000, 1000, 1000)),
              "swiglu": ((256, 256, 512), (512, 1024, 1024)),
              "bmm_nt": ((8, 256, 256, 64), (16, 512, 512, 128)), "global_sum": 10_000_000},
}

#: seconds to pause before each sample when BLAS runs several threads: its
#: workers keep spinning a while after a call (OpenBLAS about 0.1 s)
SETTLE_S = 0.25
#: the target whose kernels this suite compiles and times (in this process,
#: on the host's cores: the ``threads`` schedule field)
TARGET = "llvm"
#: a sample lasts at least this long (seconds)
MIN_SAMPLE_S = 0.05
#: worker output lines carrying a result start with this
TAG = "tilenest-bench "
#: the folder holding the ``tilenest`` package
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


def gemm_tiles(m: int, n: int, threads: int, batch: int = 1, k: int = 128,
               rows: int | None = None, cols: int | None = None,
               l2_bytes: int | None = None, b_tiles: int = 1) -> dict[str, int]:
    """Output tile ``bm x bn`` and K step ``bk`` of one GEMM program (of
    ``batch`` independent products of depth ``k``), as a user sizing tiles to
    the problem and the host's caches would pick them.

    A program copies (packs) an A tile and a B tile per K step and reuses them
    for ``bm * bn * bk`` multiply-adds, so large output tiles amortize the
    copies. ``bk`` is at most 128, and the packed B tiles (``b_tiles`` of
    ``bk x bn`` f32: SwiGLU packs two) at most half of one core's
    second-level cache (``l2_bytes``: the host's, or 512 KiB where it is not
    known), so that they stay there while every row band of the A tile passes
    over them: up to 1024 columns, and up to 1024 rows, unless that leaves
    fewer than two programs per thread with several threads (the runtime
    balances chunks of programs between threads), then the longer side is cut
    into tiles of at most half as many. Rows come in multiples of the
    register block (``rows``: the host's ``mma_block``), columns in whole
    vectors (``cols``: the host's f32 lanes; a tile that is not a multiple of
    the register block's columns ends in a narrower block), each extent cut
    into the fewest tiles of at most the limit or one more, whichever pads it
    least: at two threads 1000 rows make two tiles of 504, not three of 336.
    The accumulator tile (up to 4 MiB) is read and written once per
    micro-tile and K step, a small stream beside the multiply-adds. The
    padding of a ragged K step is skipped by the ``mma`` itself. Wide tiles
    copy each A tile for fewer programs, tall ones each B tile: on a 2-core
    AMD EPYC (AVX-512, 1 MiB of L2 per core), one thread, one process, best
    of 7, 1000^3 took 18.9 ms in 1000 x 1008 tiles against 19.7 ms in
    1000 x 512 (numpy 19.1 ms), and 1024^3 19.8 ms in 1024 x 1024 against
    20.2 ms in 1024 x 512 (spec/lowering.md, *Measuring the CPU code*)."""
    from ..lowering.schedule import default_mma_block, host_vector_bits

    if rows is None:
        rows = default_mma_block(host_vector_bits())[0]
    if cols is None:
        cols = max(1, (host_vector_bits() or 128) // 32)
    bk = max(1, min(128, k))
    l2 = host_l2_bytes() if l2_bytes is None else l2_bytes
    wide = max(cols, min(1024, l2 // 2 // (4 * bk * b_tiles)) // cols * cols)

    def fit(extent: int, most: int, granule: int) -> int:
        """The tile of the fewest (or one more) equal tiles covering ``extent``
        that pads it least."""
        def cdiv(a: int, b: int) -> int:
            return -(-a // b)

        few = cdiv(extent, most)
        cands = {cdiv(cdiv(extent, c), granule) * granule for c in (few, few + 1)}
        return min(cands, key=lambda t: (cdiv(extent, t) * t - extent, -t))

    bm, bn = fit(m, 1024, rows), fit(n, wide, cols)
    need = 2 * threads if threads > 1 else 1
    while batch * -(-m // bm) * -(-n // bn) < need and max(bm, bn) > 32:
        if bm >= bn:
            bm = fit(m, max(rows, bm // 2), rows)
        else:
            bn = fit(n, max(cols, bn // 2), cols)
    return {"bm": bm, "bn": bn, "bk": bk}


def host_l2_bytes(root: str = "/sys/devices/system/cpu/cpu0/cache") -> int:
    """One core's second-level cache in bytes, as the OS reports it (Linux
    sysfs: ``root``'s ``index*/level``, ``type`` and ``size``, such as
    ``1024K``), or 512 KiB where it does not."""
    import glob

    for d in sorted(glob.glob(f"{root}/index*")):
        try:
            with open(f"{d}/level") as f:
                level = f.read().strip()
            with open(f"{d}/type") as f:
                kind = f.read().strip()
            with open(f"{d}/size") as f:
                size = f.read().strip()
        except OSError:
            continue
        if level == "2" and kind in ("Unified", "Data") and size.rstrip("KM").isdigit():
            unit = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
            return int(size.rstrip("KM")) * unit
    return 512 << 10


def shapes(size: str, name: str) -> tuple[tuple[int, ...], ...]:
    """The problem shapes of benchmark ``name`` at ``size``, one row each."""
    sz = SIZES[size]
    if name in ROWS:
        return ((sz["rows"], sz["rows"]),)
    if name == "global_sum":
        return ((sz["global_sum"],),)
    return tuple(sz["gemm" if name in GEMMS else name])


def shape_label(shape: tuple[int, ...]) -> str:
    """A shape as it appears in a row's identity: ``4096x4096``."""
    return "x".join(map(str, shape))


def with_ceilings(only: tuple[str, ...]) -> tuple[str, ...]:
    """``only`` and the ceilings its memory-bound benchmarks are measured
    against, in :data:`NAMES` order."""
    need = set(only) | {CEILING_OF[n] for n in only if n in CEILING_OF}
    return tuple(n for n in NAMES if n in need)


def planned(size: str, only: tuple[str, ...]) -> int:
    """How many rows one thread count produces."""
    return sum(len(shapes(size, n)) for n in only)


@dataclass
class Case:
    """One benchmark instance: the compiled kernel's call and its baselines."""

    name: str
    shape: tuple[int, ...]
    workload: str
    kernel: Any
    args: tuple[Any, ...]
    out: Any
    numpy: Callable[[], Any]
    torch: Callable[[], Any] | None
    rtol: float = 1e-4
    atol: float = 1e-5
    #: what ``out`` must hold, when not the numpy baseline's result
    expected: Callable[[], Any] | None = None
    #: the least bytes the workload moves (memory-bound benchmarks only)
    bytes: int | None = None


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
    sq = (n, n)
    label = f"{n}x{n}"
    f4 = 4  # bytes of an f32

    def np_softmax() -> Any:
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def np_rmsnorm() -> Any:
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w

    def np_layernorm() -> Any:
        mu = x.mean(axis=1, keepdims=True)
        d = x - mu
        return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + eps) * w + b

    if "read" in only:
        rp = 8
        blocks = np.empty(-(-n // rp), np.float32)
        sums = np.add.reduceat(x.sum(axis=1, dtype=np.float64), np.arange(0, n, rp))
        yield Case("read", sq, f"read {label} (ceiling)", ks["read"].specialize(rp=rp),
                   (x, blocks), blocks, lambda: x.sum(), (lambda: tx.sum()) if torch else None,
                   rtol=0.0, atol=1e-5 * rp * n, expected=lambda: sums, bytes=f4 * n * n)
    if "copy" in only:
        out, other = np.empty_like(x), np.empty_like(x)
        ty = torch.from_numpy(np.empty_like(x)) if torch else None
        yield Case("copy", sq, f"copy {label} (ceiling)", ks["copy"], (x, out), out,
                   lambda: np.copyto(other, x), (lambda: ty.copy_(tx)) if torch else None,
                   expected=lambda: x, bytes=2 * f4 * n * n)
    if "softmax" in only:
        yield Case("softmax", sq, f"softmax {label}", ks["softmax"], (x, y), y, np_softmax,
                   (lambda: torch.softmax(tx, 1)) if torch else None, bytes=2 * f4 * n * n)
    if "rmsnorm" in only:
        yield Case("rmsnorm", sq, f"rmsnorm {label}", ks["rmsnorm"], (x, w, y, eps), y,
                   np_rmsnorm,
                   (lambda: torch.nn.functional.rms_norm(tx, (n,), torch.from_numpy(w), 1e-5))
                   if torch else None, bytes=f4 * (2 * n * n + n))
    if "layernorm" in only:
        yield Case("layernorm", sq, f"layernorm {label}", ks["layernorm"], (x, w, b, y, eps), y,
                   np_layernorm,
                   (lambda: torch.layer_norm(tx, (n,), torch.from_numpy(w), torch.from_numpy(b),
                                             1e-5)) if torch else None, rtol=1e-3, atol=1e-4,
                   bytes=f4 * (2 * n * n + 2 * n))
    if "add" in only:
        out = np.empty_like(x)
        yield Case("add", sq, f"add {label}", ks["add"], (x, z, out), out,
                   lambda: np.add(x, z, out=y),
                   (lambda: torch.add(tx, torch.from_numpy(z))) if torch else None,
                   bytes=3 * f4 * n * n)
    if "fp8_quantize" in only:
        import ml_dtypes

        e4 = ml_dtypes.float8_e4m3fn
        s = np.float32(0.75)
        q = np.empty((n, n), e4)
        tq = getattr(torch, "float8_e4m3fn", None) if torch else None
        yield Case("fp8_quantize", sq, f"fp8 quantize {label} (e4m3fn, saturating)",
                   ks["fp8_quantize"], (x, q, s), q,
                   lambda: np.clip(x * s, -448.0, 448.0).astype(e4),
                   (lambda: (tx * 0.75).clamp(-448.0, 448.0).to(tq)) if tq is not None else None,
                   rtol=0.0, atol=0.0, bytes=(f4 + 1) * n * n)
    if "row_sum" in only:
        rs = np.empty(n, np.float32)
        yield Case("row_sum", sq, f"row sum {label}", ks["row_sum"], (x, rs), rs,
                   lambda: x.sum(axis=1), (lambda: tx.sum(1)) if torch else None,
                   rtol=1e-3, atol=1e-3, bytes=f4 * (n * n + n))
    if "logsumexp" in only:
        ls = np.empty(n, np.float32)

        def np_logsumexp() -> Any:
            m = x.max(axis=1)
            return m + np.log(np.exp(x - m[:, None]).sum(axis=1))

        yield Case("logsumexp", sq, f"logsumexp {label}", ks["logsumexp"], (x, ls), ls,
                   np_logsumexp, (lambda: torch.logsumexp(tx, 1)) if torch else None,
                   rtol=1e-5, atol=1e-5, bytes=f4 * (n * n + n))
    if "global_sum" in only:
        (count,) = shapes(size, "global_sum")[0]
        v = rng.standard_normal(count).astype(np.float32)
        tv = torch.from_numpy(v) if torch else None
        total = np.empty(1, np.float32)
        exact = v.sum(dtype=np.float64)
        # f32 partial sums: allow a relative error of 1e-6 of the sum of magnitudes
        yield Case("global_sum", (count,), f"global sum {count}", ks["global_sum"], (v, total),
                   total, lambda: v.sum(), (lambda: tv.sum()) if torch else None, rtol=0.0,
                   atol=1e-6 * float(np.abs(v).sum(dtype=np.float64)),
                   expected=lambda: exact, bytes=f4 * count)
    yield from _products(size, threads, only, torch, rng)


def _products(size: str, threads: int, only: tuple[str, ...], torch: Any,
              rng: Any) -> Iterator[Case]:
    """The GEMM-class benchmarks of :func:`cases`: gemm, gemm_strict, swiglu, bmm_nt."""
    import numpy as np

    from .kernels import kernels

    ks = kernels()

    def tile_label(tiles: dict[str, int]) -> str:
        return "x".join(str(tiles[t]) for t in ("bm", "bn", "bk"))

    picked = [g for g in GEMMS if g in only]
    for m, k, nn in shapes(size, "gemm") if picked else ():
        A = rng.standard_normal((m, k)).astype(np.float32)
        B = rng.standard_normal((k, nn)).astype(np.float32)
        C = np.empty((m, nn), np.float32)
        tiles = gemm_tiles(m, nn, threads, k=k)
        for g in picked:
            label = "gemm" if g == "gemm" else "gemm strict"
            yield Case(g, (m, k, nn), f"{label} {m}x{k}x{nn} ({tile_label(tiles)})",
                       ks[g].specialize(**tiles), (A, B, C), C, lambda A=A, B=B: A @ B,
                       (lambda A=A, B=B: torch.from_numpy(A) @ torch.from_numpy(B))
                       if torch and g == "gemm" else None, rtol=1e-3, atol=1e-3)
    for m, k, nn in shapes(size, "swiglu") if "swiglu" in only else ():
        # weights scaled as a trained layer's are: the products stay O(1)
        X = rng.standard_normal((m, k)).astype(np.float32)
        Wg = (rng.standard_normal((k, nn)) / np.sqrt(k)).astype(np.float32)
        Wu = (rng.standard_normal((k, nn)) / np.sqrt(k)).astype(np.float32)
        H = np.empty((m, nn), np.float32)
        tiles = gemm_tiles(m, nn, threads, k=k, b_tiles=2)

        def np_swiglu(X: Any = X, Wg: Any = Wg, Wu: Any = Wu) -> Any:
            g = X @ Wg
            return g / (1 + np.exp(-g)) * (X @ Wu)

        def torch_swiglu(t: Any = (X, Wg, Wu)) -> Any:
            tX, tG, tU = (torch.from_numpy(a) for a in t)
            return torch.nn.functional.silu(tX @ tG) * (tX @ tU)

        yield Case("swiglu", (m, k, nn), f"swiglu {m}x{k}x{nn} ({tile_label(tiles)})",
                   ks["swiglu"].specialize(**tiles), (X, Wg, Wu, H), H, np_swiglu,
                   torch_swiglu if torch else None, rtol=1e-3, atol=1e-4)
    for nb, m, nn, k in shapes(size, "bmm_nt") if "bmm_nt" in only else ():
        A = rng.standard_normal((nb, m, k)).astype(np.float32)
        Bt = rng.standard_normal((nb, nn, k)).astype(np.float32)
        C = np.empty((nb, m, nn), np.float32)
        tiles = gemm_tiles(m, nn, threads, batch=nb, k=k)
        yield Case("bmm_nt", (nb, m, nn, k), f"bmm A@B^T {nb}x{m}x{nn}x{k} ({tile_label(tiles)})",
                   ks["bmm_nt"].specialize(**tiles), (A, Bt, C), C,
                   lambda A=A, Bt=Bt: A @ Bt.transpose(0, 2, 1),
                   (lambda A=A, Bt=Bt: torch.from_numpy(A) @ torch.from_numpy(Bt).mT)
                   if torch else None, rtol=1e-3, atol=1e-3)


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
        row: dict[str, Any] = {"name": c.name, "shape": shape_label(c.shape),
                               "workload": c.workload, "threads": threads}
        if c.bytes is not None:
            row["bytes"] = c.bytes
        t0 = time.perf_counter()
        ck = c.kernel.compile(TARGET, threads=threads)
        row["compile_s"] = time.perf_counter() - t0

        def call(ck: Any = ck, c: Case = c) -> None:
            ck(*c.args, threads=threads)

        call()
        try:
            want = c.expected() if c.expected is not None else c.numpy()
            np.testing.assert_allclose(c.out, want, rtol=c.rtol, atol=c.atol)
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


def attach_bandwidth(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with their bandwidths: a ceiling row gets ``ceiling`` (its best
    bandwidth in bytes/s over the compiled kernel and the baselines, and which
    one reached it), a memory-bound row ``bandwidth`` (bytes/s of the compiled
    kernel, the ceiling's name and the fraction of it), each ceiling taken at
    the row's own thread count and shape (the global sum's vector has no
    ``R x R`` twin: the best ceiling of its thread count). Rows without a
    timing or without their ceiling in ``rows`` are returned as they are; a
    pure function."""
    best: dict[tuple[str, int, str], float] = {}
    out: list[dict[str, Any]] = []
    for r in rows:
        if r.get("name") in CEILINGS and "tilenest" in r and "bytes" in r:
            times = {"tilenest": r["tilenest"]["median_s"],
                     **{k: v["median_s"] for k, v in r["baselines"].items()}}
            by = min(times, key=lambda k: times[k])
            rate = r["bytes"] / times[by]
            best[(r["name"], r["threads"], r["shape"])] = rate
            r = {**r, "ceiling": {"bytes_per_s": rate, "by": by}}
        out.append(r)
    for i, r in enumerate(out):
        ceiling = CEILING_OF.get(r.get("name", ""))
        if ceiling is None or "tilenest" not in r or "bytes" not in r:
            continue
        rate = r["bytes"] / r["tilenest"]["median_s"]
        at = {sh: v for (n, t, sh), v in best.items() if n == ceiling and t == r["threads"]}
        # the global sum's vector has no R x R twin: any shape at its thread count
        same = list(at.values()) if r["name"] not in ROWS else \
            [at[r["shape"]]] if r["shape"] in at else []
        if same:
            out[i] = {**r, "bandwidth": {"bytes_per_s": rate, "ceiling": ceiling,
                                         "fraction": rate / max(same)}}
    return out


#: below this many columns the table leaves out the compile times, and below
#: NARROWEST also the bandwidth column (``--json`` keeps both)
NARROW = 110
NARROWEST = 96


def table(rows: list[dict[str, Any]], width: int | None = None) -> Any:
    """A rich Table of the rows: medians in ms with their spreads, ratios.
    ``width``: the columns it must fit (None: any); cells wrap at spaces, and a
    narrow table drops the compile-time and then the bandwidth column, saying
    so in its caption."""
    from rich.table import Table

    pm = plus_minus()
    has_torch = any("torch" in r.get("baselines", {}) for r in rows)
    has_bw = any("ceiling" in r or "bandwidth" in r for r in rows)
    show_compile = width is None or width >= NARROW
    show_bw = has_bw and (width is None or width >= NARROWEST)
    dropped = [c for c, shown in (("compile s", show_compile), ("of ceiling", show_bw or not has_bw))
               if not shown]
    t = Table(title="tilenest llvm vs numpy" + (" and torch" if has_torch else "")
              + f" (ratio = baseline time / tilenest time; median of samples, {pm} spread"
              + ("; of ceiling = tilenest's bytes/s over the best of the ceiling row"
                 if show_bw else "") + ")",
              caption=(f"{' and '.join(dropped)} left out at {width} columns; --json has "
                       "every column") if dropped else None,
              pad_edge=show_compile)  # narrow: no blank beside the outer borders
    cols = ["benchmark", "threads", "tilenest ms", "numpy ms", "ratio"]
    if has_torch:
        cols += ["torch ms", "ratio "]
    if show_bw:
        cols.append("of ceiling")
    if show_compile:
        cols.append("compile s")
    # a cell wraps at its spaces, but no word of it is cut: a column is at
    # least as wide as its longest word
    longest = max((len(w) for r in rows for w in str(r.get("workload", "")).split()),
                  default=9)
    for c in cols:
        t.add_column(c, justify="left" if c == "benchmark" else "right",
                     no_wrap=c.startswith("ratio"),
                     min_width=max(longest, 9) if c == "benchmark" else None)

    # narrow: a time's spread goes on a line of its own
    sep = " " if show_compile else "\n"

    def ms(tm: dict[str, Any] | None) -> str:
        return "-" if tm is None else f"{tm['median_s'] * 1e3:.3f}{sep}{pm}{tm['spread']:.0%}"

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
        if show_bw:
            cells.append(_bandwidth_cell(r))
        if show_compile:
            cells.append(f"{r['compile_s']:.2f}")
        t.add_row(*cells)
    return t


def _bandwidth_cell(r: dict[str, Any]) -> str:
    """A ceiling's best GB/s and who reached it, or a row's share of its ceiling."""
    if "ceiling" in r:
        return f"{r['ceiling']['bytes_per_s'] / 1e9:.1f} GB/s ({r['ceiling']['by']})"
    if "bandwidth" in r:
        bw = r["bandwidth"]
        return f"{bw['fraction']:.0%} of {bw['ceiling']}"
    return ""
