"""Compiled (llvm) kernels against numpy on the CPU, ratios measured in one run.

    python benchmarks/cpu.py [--quick] [--threads 1 2] [--reps 5]

Workloads: row softmax, RMSNorm, LayerNorm, add, row sum (4096x4096 f32), GEMM
f32 256^3, 1024^3 and ragged 1000^3 (and PyTorch CPU when installed). The GEMM
is ``examples/gemm.py``: its ``mma`` allows reassociation (the default), so the
compiled kernel may use fused multiply-adds, as BLAS does; the "strict" rows
run the same kernel with ``allow_reassociation=False`` (every output element
sums its products in order, separately rounded: bitwise the interpreter).
GEMM tile sizes are a schedule choice made here (:func:`gemm_tiles`). Each
thread count runs in its own subprocess with the BLAS thread count pinned
through ``OPENBLAS_NUM_THREADS``/``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (or
threadpoolctl when installed), so idle BLAS workers do not steal cycles and
numpy's GEMM uses as many threads as the compiled kernel. Every compiled
result is checked against numpy before timing. Times are medians over two
blocks of calls per function (each at least 50 ms, so short kernels are timed
in steady state), the blocks of the compiled kernel and of numpy
alternating, each after a pause that lets spinning BLAS threads go idle; the
ratio is numpy time / compiled time (> 1: compiled is faster). Compile time
is the first, uncached compile of each kernel. Not a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _kernels():
    import tilenest as tn
    from tilenest import f32

    sys.path.insert(0, str(HERE.parent / "examples"))
    import gemm as gemm_example  # noqa: E402
    import softmax as softmax_example  # noqa: E402

    @tn.kernel
    def rmsnorm(x: tn.Tensor[f32, "R C"], w: tn.Tensor[f32, "C"], y: tn.Tensor[f32, "R C"],
                eps: tn.Scalar[f32]):
        rows, cols = x.shape
        c = x.dim(1)
        w = w.with_dims(c)
        for p in tn.parallel(tn.shape(rows)):
            xs = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
            ms = tn.reduce(xs * xs, c, tn.add) / tn.cast(cols, f32)
            y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(
                xs * tn.rsqrt(ms + eps) * w[tn.coord(0), tn.shape(cols)])

    @tn.kernel
    def layernorm(x: tn.Tensor[f32, "R C"], w: tn.Tensor[f32, "C"], b: tn.Tensor[f32, "C"],
                  y: tn.Tensor[f32, "R C"], eps: tn.Scalar[f32]):
        rows, cols = x.shape
        c = x.dim(1)
        w = w.with_dims(c)
        b = b.with_dims(c)
        for p in tn.parallel(tn.shape(rows)):
            t = x[tn.coord(p.index(), 0), tn.shape(1, cols)]
            mu = tn.reduce(t, c, tn.add) / tn.cast(cols, f32)
            d = t - mu
            var = tn.reduce(d * d, c, tn.add) / tn.cast(cols, f32)
            y(tn.coord(p.index(), 0), tn.shape(1, cols)).store(
                d * tn.rsqrt(var + eps) * w[tn.coord(0), tn.shape(cols)]
                + b[tn.coord(0), tn.shape(cols)])

    @tn.kernel
    def add(x: tn.Tensor[f32, "R C"], z: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
        rows, cols = x.shape
        z = z.with_dims(*x.dims())
        for p in tn.parallel(tn.shape(rows)):
            o = tn.coord(p.index(), 0)
            y(o, tn.shape(1, cols)).store(x[o, tn.shape(1, cols)] + z[o, tn.shape(1, cols)])

    @tn.kernel
    def row_sum(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R"]):
        rows, cols = x.shape
        y = y.with_dims(x.dim(0))
        for p in tn.parallel(tn.shape(tn.cdiv(rows, 4))):
            t = x[tn.coord(p.index() * 4, 0), tn.shape(4, cols)]
            y(tn.coord(p.index() * 4), tn.shape(4)).store(tn.reduce(t, t.dim(1), tn.add))

    return {"softmax": softmax_example.row_softmax, "rmsnorm": rmsnorm, "layernorm": layernorm,
            "add": add, "row_sum": row_sum, "gemm": gemm_example.gemm,
            "gemm_strict": gemm_example.gemm.specialize(reassoc=False)}


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


#: seconds to wait before timing a block of calls: BLAS worker threads keep
#: spinning for a while after a call (OpenBLAS about 0.1 s) and would steal the
#: cycles of whatever runs next
SETTLE_S = 0.25
#: blocks of calls per function, alternating between the functions
ROUNDS = 2
#: a block lasts at least this long (seconds), so that a short kernel is timed
#: in steady state (threads awake, caches warm), not just after the pause
MIN_BLOCK_S = 0.05


def _medians(fns: list, reps: int) -> list[float]:
    """Median seconds of each function over ``ROUNDS`` blocks of at least
    ``reps`` calls and ``MIN_BLOCK_S`` seconds. Blocks alternate between the
    functions, so that drifting load from other processes hits all of them
    alike, and each starts after a pause (``SETTLE_S``) and one untimed call."""
    ts: list[list[float]] = [[] for _ in fns]
    for _ in range(ROUNDS):
        for fn, t in zip(fns, ts, strict=True):
            time.sleep(SETTLE_S)
            fn()
            start, n = time.perf_counter(), 0
            while n < reps or time.perf_counter() - start < MIN_BLOCK_S:
                t0 = time.perf_counter()
                fn()
                t.append(time.perf_counter() - t0)
                n += 1
    return [sorted(t)[len(t) // 2] for t in ts]


def worker(threads: int, reps: int, quick: bool) -> list[dict]:
    """Run every workload at ``threads`` threads (BLAS pinned by the parent)."""
    import numpy as np

    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(threads)
    except ImportError:
        pass
    try:
        import torch  # type: ignore[import-not-found]

        torch.set_num_threads(threads)
    except ImportError:
        torch = None
    from tilenest.backends.llvm import clear_cache

    clear_cache()
    ks = _kernels()
    rng = np.random.default_rng(0)
    n = 1024 if quick else 4096
    x = rng.standard_normal((n, n)).astype(np.float32)
    z = rng.standard_normal((n, n)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    eps = np.float32(1e-5)
    y = np.empty_like(x)
    rs = np.empty(n, np.float32)

    def np_softmax():
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    def np_rmsnorm():
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w

    def np_layernorm():
        mu = x.mean(axis=1, keepdims=True)
        d = x - mu
        return d / np.sqrt((d * d).mean(axis=1, keepdims=True) + eps) * w + b

    rows: list[dict] = []

    def bench(name: str, kern, args: tuple, out, np_fn, torch_fn=None, rtol=1e-4, atol=1e-5):
        t0 = time.perf_counter()
        ck = kern.compile(threads=threads)
        csec = time.perf_counter() - t0
        ck(*args, threads=threads)
        want = np_fn()
        np.testing.assert_allclose(out, want, rtol=rtol, atol=atol)
        tc, tn_ = _medians([lambda: ck(*args, threads=threads), np_fn], reps)
        row = {"workload": name, "threads": threads, "numpy_s": tn_, "tilenest_s": tc,
               "ratio": tn_ / tc, "compile_s": csec}
        if torch_fn is not None:
            row["torch_s"] = _medians([torch_fn], reps)[0]
        rows.append(row)

    tx = torch.from_numpy(x) if torch else None
    bench(f"softmax {n}x{n}", ks["softmax"], (x, y), y, np_softmax,
          (lambda: torch.softmax(tx, 1)) if torch else None)
    bench(f"rmsnorm {n}x{n}", ks["rmsnorm"], (x, w, y, eps), y, np_rmsnorm)
    bench(f"layernorm {n}x{n}", ks["layernorm"], (x, w, b, y, eps), y, np_layernorm,
          (lambda: torch.layer_norm(tx, (n,), torch.from_numpy(w), torch.from_numpy(b), 1e-5))
          if torch else None, rtol=1e-3, atol=1e-4)
    out = np.empty_like(x)
    bench(f"add {n}x{n}", ks["add"], (x, z, out), out, lambda: np.add(x, z, out=y),
          (lambda: torch.add(tx, torch.from_numpy(z))) if torch else None)
    bench(f"row sum {n}x{n}", ks["row_sum"], (x, rs), rs, lambda: x.sum(axis=1),
          (lambda: tx.sum(1)) if torch else None, rtol=1e-3, atol=1e-3)
    for m, k_, nn in ((256, 256, 256), (1024, 1024, 1024), (1000, 1000, 1000)):
        if quick and m > 256:
            continue
        A = rng.standard_normal((m, k_)).astype(np.float32)
        B = rng.standard_normal((k_, nn)).astype(np.float32)
        C = np.empty((m, nn), np.float32)
        tiles = gemm_tiles(m, nn, threads)
        shape = "x".join(str(tiles[t]) for t in ("bm", "bn", "bk"))
        for name in ("gemm", "gemm_strict"):
            label = "gemm" if name == "gemm" else "gemm strict"
            bench(f"{label} {m}x{k_}x{nn} ({shape})", ks[name].specialize(**tiles), (A, B, C),
                  C, lambda: A @ B,
                  (lambda: torch.from_numpy(A) @ torch.from_numpy(B))
                  if torch and name == "gemm" else None, rtol=1e-3, atol=1e-3)
    return rows


def table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="tilenest llvm vs numpy (ratio = numpy time / tilenest time)")
    cols = ["workload", "threads", "numpy ms", "tilenest ms", "ratio", "compile s"]
    has_torch = any("torch_s" in r for r in rows)
    if has_torch:
        cols.insert(4, "torch ms")
    for c in cols:
        t.add_column(c, justify="left" if c == "workload" else "right", no_wrap=True)
    for r in rows:
        cells = [r["workload"], str(r["threads"]), f"{r['numpy_s'] * 1e3:.2f}",
                 f"{r['tilenest_s'] * 1e3:.2f}", f"{r['ratio']:.2f}x", f"{r['compile_s']:.2f}"]
        if has_torch:
            cells.insert(4, f"{r['torch_s'] * 1e3:.2f}" if "torch_s" in r else "-")
        t.add_row(*cells)
    Console(width=120).print(t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="1024x1024 rows, 256^3 GEMM only")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--json", action="store_true", help="print rows as JSON")
    a = ap.parse_args()
    if a.worker is not None:
        print(json.dumps(worker(a.worker, a.reps, a.quick)))
        return
    rows: list[dict] = []
    for t in a.threads:
        env = dict(os.environ, OPENBLAS_NUM_THREADS=str(t), OMP_NUM_THREADS=str(t),
                   MKL_NUM_THREADS=str(t))
        cmd = [sys.executable, __file__, "--worker", str(t), "--reps", str(a.reps)]
        if a.quick:
            cmd.append("--quick")
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        rows.extend(json.loads(r.stdout.strip().splitlines()[-1]))
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        table(rows)


if __name__ == "__main__":
    main()
