"""Row kernels with and without streaming stores, in one process.

    python benchmarks/streaming.py [--threads N] [--size R] [--rounds K]

Each kernel of ``tilenest.bench.kernels`` (softmax, RMSNorm, LayerNorm, add,
copy) is compiled twice on an ``R x R`` f32 array (default 4096): as shipped,
and with ``backends/llvm/streaming.MIN_BYTES`` out of reach so its output
loops only ever take the ordinary form. Both must give the same bits; then
they are called alternately ``K`` times (default 12) and the best and median
wall times of each are printed. This isolates what streaming stores change;
``tilenest bench`` is the suite against numpy and torch.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=12)
    a = ap.parse_args()
    from tilenest.backends.llvm import streaming as ST
    from tilenest.bench.kernels import kernels

    ks = kernels()
    n = a.size
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, n)).astype(np.float32)
    z = rng.standard_normal((n, n)).astype(np.float32)
    w = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    y = np.empty_like(x)
    eps = np.float32(1e-5)
    cases = {"softmax": (x, y), "rmsnorm": (x, w, y, eps), "layernorm": (x, w, b, y, eps),
             "add": (x, z, y), "copy": (x, y)}
    print(f"{n}x{n} f32, {a.threads} thread(s), best / median of {a.rounds} alternating calls")
    for name, args in cases.items():
        streamed = ks[name].compile(threads=a.threads, cache=False)
        shipped = ST.MIN_BYTES
        ST.MIN_BYTES = 1 << 62
        try:
            ordinary = ks[name].compile(threads=a.threads, cache=False)
        finally:
            ST.MIN_BYTES = shipped
        streamed(*args)
        first = y.copy()
        ordinary(*args)
        assert first.tobytes() == y.tobytes(), f"{name}: streaming changed the result"
        ts: dict[str, list[float]] = {"streaming": [], "ordinary": []}
        for _ in range(a.rounds):
            for label, k in (("streaming", streamed), ("ordinary", ordinary)):
                t0 = time.perf_counter()
                k(*args)
                ts[label].append(time.perf_counter() - t0)
        s, o = ts["streaming"], ts["ordinary"]
        print(f"{name:10} streaming {min(s) * 1e3:7.2f} / {np.median(s) * 1e3:7.2f} ms   "
              f"ordinary {min(o) * 1e3:7.2f} / {np.median(o) * 1e3:7.2f} ms")


if __name__ == "__main__":
    main()
