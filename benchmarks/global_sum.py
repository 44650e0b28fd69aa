"""A global sum of 10^7 f32 on llvm against numpy's ``sum``, ratios in one run.

    python benchmarks/global_sum.py [--n 10000000] [--threads 1 2] [--samples 15]
                                    [--forms whole chunks]

Two forms of the kernel: ``whole`` is one whole-tensor ``reduce`` at the root
and a scalar store; ``chunks`` is what users write, a root ``reduce`` region
over chunks of 16384 elements whose state is a one-element tile. Both lower to
a phase of partials spread over the worker threads and a combine
(``spec/lowering.md``, "Phases"). Each result is checked against the sum in
f64 first. Samples of the two functions alternate; medians are reported. The
ratio is numpy time / compiled time (> 1: compiled is faster). Not a timed
test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tilenest as tn  # noqa: E402
from tilenest import f32  # noqa: E402
from tilenest.bench.kernels import kernels  # noqa: E402


@tn.kernel
def total(x: tn.Tensor[f32, "N"], out: tn.Tensor[f32, "1"]):  # noqa: F821
    (n,) = x.shape
    v = x[tn.coord(0), tn.shape(n)]
    out(tn.coord(0), tn.shape(1)).store(
        tn.broadcast(tn.reduce(v, v.dim(0), tn.add), tn.shape(tn.axis(out.dim(0), 1))))


#: the reduce region over chunks with a tile state: the bench suite's global sum
chunks = kernels()["global_sum"]


FORMS = {"whole": total, "chunks": chunks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10**7)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--samples", type=int, default=15)
    ap.add_argument("--forms", nargs="+", choices=sorted(FORMS), default=["whole", "chunks"])
    a = ap.parse_args()
    x = np.random.default_rng(0).random(a.n, dtype=np.float32)
    out = np.zeros(1, np.float32)
    exact = x.astype(np.float64).sum()
    for form in a.forms:
        ck = FORMS[form].compile(target="llvm")
        ck(x, out)
        if abs(out[0] - exact) > a.n * 2**-24 * exact:
            raise SystemExit(f"{form}: wrong sum {out[0]} (f64: {exact})")
        kinds = [("parallel" if p.parallel else "ordered") for p in ck.facts.phases]
        print(f"{form}: phases {kinds}")
        for th in a.threads:
            ts: dict[str, list[float]] = {"tilenest": [], "numpy": []}
            for _ in range(a.samples):
                t0 = time.perf_counter()
                ck(x, out, threads=th)
                ts["tilenest"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                np.sum(x)
                ts["numpy"].append(time.perf_counter() - t0)
            med = {k: sorted(v)[len(v) // 2] for k, v in ts.items()}
            print(f"{form} n={a.n} threads={th}: tilenest {med['tilenest'] * 1e3:.2f} ms, "
                  f"numpy {med['numpy'] * 1e3:.2f} ms, ratio "
                  f"{med['numpy'] / med['tilenest']:.2f}")


if __name__ == "__main__":
    main()
