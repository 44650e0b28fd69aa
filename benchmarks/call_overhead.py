"""What one call of a compiled llvm kernel costs beyond its work.

    python benchmarks/call_overhead.py [--calls 2000] [--blocks 5]

Times, per call (the best of ``--blocks`` medians of ``--calls`` calls each,
so that other load on the machine counts as little as it can), an
elementwise add of 8 elements -- one program (1 x 8) and eight programs
(8 x 1, so a second thread has chunks to take) -- from numpy and from torch
arguments at 1 and 2 threads, and GEMM f32 256^3 at 1 and 2 threads next to
numpy's ``A @ B``. The add's time is almost all call overhead: argument
binding and the worker pool. The last row is the add called right after a
GEMM (next to ``np.add`` after one): the GEMM evicts the interpreter's
working set from the caches, which makes any Python-level call path several
times slower, so a large kernel's calls cost more than the warm figure.
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Callable

import numpy as np


def per_call(f: Callable[[], Any], calls: int, blocks: int) -> float:
    """Seconds per call: the best of ``blocks`` medians."""
    f()
    best = float("inf")
    for _ in range(blocks):
        ts = []
        for _ in range(calls):
            t0 = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t0)
        ts.sort()
        best = min(best, ts[len(ts) // 2])
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--blocks", type=int, default=5)
    a = ap.parse_args()
    from tilenest.bench.codegen import gemm_tiles
    from tilenest.bench.kernels import kernels

    ks = kernels()
    rows = []
    for shape in ((1, 8), (8, 1)):
        x, z = np.ones(shape, np.float32), np.ones(shape, np.float32)
        y = np.empty_like(x)
        args: dict[str, tuple] = {"numpy": (x, z, y)}
        try:
            import torch

            args["torch"] = tuple(torch.from_numpy(v) for v in (x, z, y))
        except ImportError:
            pass
        for threads in (1, 2):
            ck = ks["add"].compile(threads=threads)
            for kind, arrays in args.items():
                t = per_call(lambda ck=ck, arrays=arrays, threads=threads:
                             ck(*arrays, threads=threads), a.calls, a.blocks)
                rows.append((f"add {shape[0]}x{shape[1]} {kind}", threads, t * 1e6, None))
    rng = np.random.default_rng(0)
    A, B = (rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2))
    C = np.empty((256, 256), np.float32)
    calls = max(5, a.calls // 100)
    numpy_t = per_call(lambda: A @ B, calls, a.blocks)
    for threads in (1, 2):
        g = ks["gemm"].specialize(**gemm_tiles(256, 256, threads)).compile(threads=threads)
        t = per_call(lambda g=g, threads=threads: g(A, B, C, threads=threads), calls, a.blocks)
        rows.append(("gemm 256^3", threads, t * 1e6, numpy_t * 1e6))
    g = ks["gemm"].specialize(**gemm_tiles(256, 256, 1)).compile(threads=1)
    add = ks["add"].compile(threads=1)
    x = np.ones((1, 8), np.float32)
    y = np.empty_like(x)
    cold, np_cold = [], []
    for _ in range(calls * a.blocks):
        g(A, B, C, threads=1)
        t0 = time.perf_counter()
        add(x, x, y, threads=1)
        cold.append(time.perf_counter() - t0)
        g(A, B, C, threads=1)
        t0 = time.perf_counter()
        np.add(x, x, out=y)
        np_cold.append(time.perf_counter() - t0)
    cold.sort()
    np_cold.sort()
    rows.append(("add 1x8 after a gemm", 1, cold[len(cold) // 2] * 1e6,
                 np_cold[len(np_cold) // 2] * 1e6))
    print(f"{'call':24s} {'threads':>7s} {'us/call':>10s} {'numpy us':>10s}")
    for name, threads, us, ref in rows:
        print(f"{name:24s} {threads:7d} {us:10.1f} {'' if ref is None else f'{ref:10.1f}'}")


if __name__ == "__main__":
    main()
