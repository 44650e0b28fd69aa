"""Interpreter speed: the batched reference interpreter against the same math
done directly in numpy, measured in the same run.

    python benchmarks/interpreter.py [--quick]

Prints one row per workload: numpy time, interpreter time (fast batched mode,
race and pipeline-order checks off; and with both checks on), and the ratios.
Not a timed test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import gemm as gemm_example  # noqa: E402
import rmsnorm as rmsnorm_example  # noqa: E402
import softmax as softmax_example  # noqa: E402

import tilenest as tn  # noqa: E402


def best(fn, reps: int) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    a = ap.parse_args()
    n = 1024 if a.quick else 4096
    g = 256 if a.quick else 1024
    reps = 3
    rng = np.random.default_rng(0)
    rows = []

    x = rng.standard_normal((n, n)).astype(np.float32)
    y = np.zeros_like(x)

    def np_softmax():
        e = np.exp(x - x.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    k = softmax_example.row_softmax
    k.program  # capture outside the timing
    rows.append((f"row softmax {n}x{n} f32", best(np_softmax, reps),
                 best(lambda: tn.interpret(k, x, y, fast=True, check_races=False,
                                           check_pipelines=False, poison=False),
                      reps),
                 best(lambda: tn.interpret(k, x, y, fast=True, poison=False), 1)))
    assert np.allclose(y, np_softmax(), rtol=1e-5, atol=1e-7)

    w = rng.standard_normal(n).astype(np.float32)
    eps = np.float32(1e-5)

    def np_rmsnorm():
        return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w

    k2 = rmsnorm_example.rmsnorm.specialize(rows_per_program=16)
    k2.program
    rows.append((f"rmsnorm {n}x{n} f32", best(np_rmsnorm, reps),
                 best(lambda: tn.interpret(k2, x, w, y, eps, fast=True, check_races=False,
                                           check_pipelines=False, poison=False), reps),
                 best(lambda: tn.interpret(k2, x, w, y, eps, fast=True, poison=False), 1)))
    assert np.allclose(y, np_rmsnorm(), rtol=1e-4, atol=1e-5)

    A = rng.standard_normal((g, g)).astype(np.float32)
    B = rng.standard_normal((g, g)).astype(np.float32)
    C = np.zeros((g, g), np.float32)
    k3 = gemm_example.gemm.specialize(bm=64, bn=64, bk=64)
    k3.program
    rows.append((f"tiled gemm {g}^3 f32 (64^3 tiles)", best(lambda: A @ B, reps),
                 best(lambda: tn.interpret(k3, A, B, C, fast=True, check_races=False,
                                           check_pipelines=False, poison=False), reps),
                 best(lambda: tn.interpret(k3, A, B, C, fast=True, poison=False), 1)))
    assert np.allclose(C, A @ B, rtol=1e-3, atol=1e-3)

    print(f"{'workload':36} {'numpy s':>9} {'interp s':>9} {'ratio':>7} {'+races s':>9} {'ratio':>7}")
    for name, tn_np, t_i, t_r in rows:
        print(f"{name:36} {tn_np:9.4f} {t_i:9.4f} {t_i / tn_np:7.2f} {t_r:9.4f} {t_r / tn_np:7.2f}")


if __name__ == "__main__":
    main()
