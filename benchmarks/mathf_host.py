"""Host-CPU emulation of GPU scalar math: the float-only ``tn_mathf.h`` against
the double-based formulation the CUDA prelude uses today.

    python benchmarks/mathf_host.py [--n 4194304] [--samples 5]

Both are compiled as host C++ (``g++ -O2 -std=c++14 -ffp-contract=off
-fno-fast-math -march=native``, ``backends/simt/mathf_host.py``; the host's
fma instruction, as a GPU has): ``tnf_f`` from the header,
and ``(float)f((double)x)`` through the C library (the CUDA prelude's shape:
widen, call the double function, round once). Each runs over the same ``n``
f32 inputs on one core; samples alternate, medians are reported in ns per
element, with the ratio double / float (> 1: the float-only code is faster).

This is the host CPU running GPU code, not GPU speed: a CPU has fast scalar
double units and a vector libm, a GPU has few double units (an H200 runs
double at about half its f32 rate; Apple GPUs have none), so the ratio here
says little about the device. Not a timed test.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tilenest.backends.simt import mathf_host as M  # noqa: E402

#: the input range of each function (a range where its main path runs)
RANGE = {"log": (1e-3, 1e3), "log2": (1e-3, 1e3), "log1p": (-0.9, 1e3), "rsqrt": (1e-3, 1e3),
         "sin": (-100.0, 100.0), "cos": (-100.0, 100.0), "pow": (0.0, 10.0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1 << 22)
    ap.add_argument("--samples", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as d:
        mf = M.MathF(M.build(Path(d), ("-march=native",)))
        print("host CPU emulation of GPU code (not GPU speed); ns per element, one core")
        print(f"{'function':10s} {'float-only':>11s} {'via double':>11s} {'ratio':>7s}")
        for f in (*M.UNARY, *M.BINARY):
            lo, hi = RANGE.get(f, (-10.0, 10.0))
            x = rng.uniform(lo, hi, args.n).astype(np.float32)
            y = rng.uniform(-4, 4, args.n).astype(np.float32)
            times: dict[bool, list[float]] = {False: [], True: []}
            for _ in range(args.samples):
                for dbl in (False, True):
                    t0 = time.perf_counter()
                    if f in M.BINARY:
                        mf.binary(f, x, y, double=dbl)
                    else:
                        mf.unary(f, x, double=dbl)
                    times[dbl].append((time.perf_counter() - t0) / args.n * 1e9)
            a, b = statistics.median(times[False]), statistics.median(times[True])
            print(f"{f:10s} {a:11.2f} {b:11.2f} {b / a:7.2f}")


if __name__ == "__main__":
    main()
