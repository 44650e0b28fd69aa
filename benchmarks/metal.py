"""tilenest's Metal kernels against PyTorch's MPS backend on one Apple GPU.

    python benchmarks/metal.py [--only NAME ...] [--rows R] [--cols C] [--gemm N]
                               [--samples N] [--seed N] [--out FILE.json]

Needs macOS, an Apple GPU, ``pip install 'tilenest[metal]'`` and torch with
MPS. It has not been run by this project (no Mac is available to it); the
parts it relies on are tested without one (``tests/test_metal_runtime.py``,
``tests/test_metal_emit.py``).

Workloads: the row softmax, RMSNorm and LayerNorm of ``tilenest.bench.kernels``
on an ``R x C`` f32 array (default 8192 x 8192) against ``torch.softmax``,
``F.rms_norm`` and ``F.layer_norm`` on ``mps``, and the f32 GEMM at ``N^3``
(default 2048) against ``torch.matmul``; on Metal, ``mma`` runs as the exact
SIMT loop nest.

Correctness first: before timing, each tilenest kernel runs once on the GPU
into an output filled with NaN; every element must be written and the
relative error norm against the float64 numpy formula must be under 1e-4
(the MPS result is judged the same way, as a check of the reference). A
failing kernel is reported, not timed, and the run exits 1.

Timing: tilenest's time is the GPU's own (``GPUEndTime - GPUStartTime`` of
the call's command buffer, all its dispatches, no buffer copies); torch's is
the wall time of a batch of calls between two ``torch.mps.synchronize()``,
divided by the batch size. Each sample alternates between the two; the
median of ``--samples`` samples is reported with the ratio torch time /
tilenest time (> 1: tilenest is faster) and the bandwidth (rows: input read
once, output written once) or the FLOP rate (GEMM).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

NAMES = ("softmax", "rmsnorm", "layernorm", "gemm")
TOL = 1e-4
EPS = 1e-5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="benchmarks/metal.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES), metavar="NAME")
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--gemm", type=int, default=2048, help="the GEMM's M = N = K")
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, metavar="FILE.json", help="write every number here")
    return ap.parse_args(argv)


def case(name: str, a: argparse.Namespace, rng: np.random.Generator
         ) -> tuple[Any, tuple, Callable[..., Any], Callable[[], np.ndarray], float, str]:
    """(kernel, its arguments with the output last-but-scalars NaN-filled,
    the torch call on mps tensors, the float64 reference, the work, its unit)."""
    import tilenest as tn  # noqa: F401 - registers the DSL
    from tilenest.bench.kernels import kernels

    ks = kernels()
    if name == "gemm":
        n = a.gemm
        A = rng.standard_normal((n, n)).astype(np.float32)
        B = rng.standard_normal((n, n)).astype(np.float32)
        C = np.full((n, n), np.nan, np.float32)
        return (ks["gemm"], (A, B, C), lambda tA, tB: tA @ tB,
                lambda: A.astype(np.float64) @ B, 2.0 * n ** 3, "GFLOP/s")
    r, c = a.rows, a.cols
    x = rng.standard_normal((r, c)).astype(np.float32)
    w = rng.standard_normal(c).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    y = np.full((r, c), np.nan, np.float32)
    x64 = x.astype(np.float64)
    bytes_ = 2.0 * 4 * r * c
    if name == "softmax":
        def ref() -> np.ndarray:
            e = np.exp(x64 - x64.max(1, keepdims=True))
            return e / e.sum(1, keepdims=True)
        return ks["softmax"], (x, y), lambda tx: tx.softmax(1), ref, bytes_, "GB/s"
    if name == "rmsnorm":
        import torch.nn.functional as F
        return (ks["rmsnorm"], (x, w, y, np.float32(EPS)),
                lambda tx, tw: F.rms_norm(tx, (c,), tw, EPS),
                lambda: x64 / np.sqrt((x64 * x64).mean(1, keepdims=True) + EPS) * w,
                bytes_, "GB/s")
    import torch.nn.functional as F
    mu = x64.mean(1, keepdims=True)
    return (ks["layernorm"], (x, w, b, y, np.float32(EPS)),
            lambda tx, tw, tb: F.layer_norm(tx, (c,), tw, tb, EPS),
            lambda: (x64 - mu) / np.sqrt(((x64 - mu) ** 2).mean(1, keepdims=True) + EPS) * w + b,
            bytes_, "GB/s")


def rel_err(out: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out.astype(np.float64) - ref) / np.linalg.norm(ref))


def bench(name: str, a: argparse.Namespace, rng: np.random.Generator) -> dict[str, Any]:
    import torch

    kernel, args, torch_fn, ref_fn, work, unit = case(name, a, rng)
    out_pos = next(i for i, v in enumerate(args) if isinstance(v, np.ndarray)
                   and v.dtype == np.float32 and np.isnan(v).all())
    ck = kernel.compile(target="metal", device="gpu")
    ck(*args)
    out, ref = args[out_pos], ref_fn()
    tins = [torch.from_numpy(v).to("mps") for i, v in enumerate(args)
            if isinstance(v, np.ndarray) and v.ndim and i != out_pos]
    tout = torch_fn(*tins)
    torch.mps.synchronize()
    row: dict[str, Any] = {"name": name, "unit": unit,
                           "unwritten": int(np.isnan(out).sum()),
                           "error": rel_err(out, ref),
                           "torch_error": rel_err(tout.cpu().numpy(), ref)}
    if row["unwritten"] or not row["error"] < TOL:
        row["failed"] = True
        return row
    mine, theirs = [], []
    batch = 10
    for _ in range(a.samples):
        ck(*args)
        mine.append(ck._gpu.gpu_seconds)
        torch.mps.synchronize()
        t0 = time.perf_counter()
        for _ in range(batch):
            torch_fn(*tins)
        torch.mps.synchronize()
        theirs.append((time.perf_counter() - t0) / batch)
    t_mine, t_theirs = statistics.median(mine), statistics.median(theirs)
    row.update(tilenest_ms=t_mine * 1e3, torch_ms=t_theirs * 1e3, ratio=t_theirs / t_mine,
               rate=work / t_mine / 1e9, torch_rate=work / t_theirs / 1e9)
    return row


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if sys.platform != "darwin":
        print("benchmarks/metal.py needs macOS and an Apple GPU; off macOS, validate Metal "
              "kernels on the emulator (tilenest validate FILE --target metal)", file=sys.stderr)
        return 2
    import torch

    if not torch.backends.mps.is_available():
        print("torch reports no MPS device", file=sys.stderr)
        return 2
    rng = np.random.default_rng(a.seed)
    rows = [bench(n, a, rng) for n in a.only]
    print(f"{'workload':10} {'tilenest ms':>12} {'torch mps ms':>13} {'ratio':>7} "
          f"{'rate':>16}  errors (tilenest / torch)")
    for r in rows:
        if r.get("failed"):
            print(f"{r['name']:10} FAILED: {r['unwritten']} unwritten, "
                  f"relative error {r['error']:.2e} (limit {TOL:g})")
            continue
        print(f"{r['name']:10} {r['tilenest_ms']:12.3f} {r['torch_ms']:13.3f} "
              f"{r['ratio']:6.2f}x {r['rate']:9.1f} {r['unit']:6}  "
              f"{r['error']:.1e} / {r['torch_error']:.1e}")
    if a.out:
        a.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(a).items()},
                                     "torch": torch.__version__, "rows": rows}, indent=1))
    return 1 if any(r.get("failed") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
