"""The error of ``tn_tanh_approx`` over every f32 input, on the host.

    python benchmarks/tanh_approx.py [--jobs 2] [--fit]

``tn_tanh_approx`` (the cuda prelude's f32 tanh under a declared bound,
spec/lowering.md *Declared bounds on cuda*) against f64 ``tanh``, in two
parts:

* *emulated*: the prelude's own code compiled for the host as the emulator
  compiles it (``-DTN_EMULATE``: the special function unit's ``ex2`` and
  ``rcp`` are the correctly rounded values), over all 2^32 inputs -- NaN
  must stay NaN, +-0 and +-inf give exactly +-0 and +-1;
* *bounded*: where those two units are used (``|x|`` from 1 to 16; from
  about 9.1 on the result is exactly +-1 whatever they return within their
  promises, since ``2 / (e + 1) < 2^-25``), the function emulated in numpy
  float32 arithmetic (``tests/tanh_approx_model.py``) with every ``ex2``
  result within 2.5 ulp of the exact ``2^a`` (the PTX ISA's 2 ulp of the
  correctly rounded value) combined with every ``rcp`` result within one
  float of the correctly rounded ``1/s`` (the ISA's 1 ulp): the largest
  error over all those combinations bounds what a device meeting the ISA's
  promises computes.

``--fit`` refits the polynomial's coefficients first (printing them in the
form ``COEFFS`` and the prelude use). Prints the largest error of each part
and where it occurs. A few minutes on two cores; not a timed test.
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import tanh_approx_model as M  # noqa: E402

CHUNK = 1 << 24


def fit(split: float = 1.0, degree: int = 6, iters: int = 60) -> list[np.float32]:
    """P's f32 coefficients (lowest first) for ``tanh(x) ~ x + x^3 P(x^2)`` on
    ``(0, split]``: weighted least squares on the relative error of tanh,
    reweighted toward minimax (Lawson's iteration); each coefficient is
    rounded to f32 and the higher ones refitted to the rest."""
    x = np.linspace(1e-3, split, 20000)
    s = x * x
    g = (np.tanh(x) - x) / x**3
    w = x**3 / np.tanh(x)
    V = np.vander(s, degree + 1, increasing=True)
    fixed: list[np.float32] = []
    for k in range(degree + 1):
        rest = g - sum(float(c) * s**i for i, c in enumerate(fixed))
        wt = np.ones_like(x)
        for _ in range(iters):
            A = V[:, k:] * (w * np.sqrt(wt))[:, None]
            c = np.linalg.lstsq(A, rest * w * np.sqrt(wt), rcond=None)[0]
            e = np.abs((V[:, k:] @ c - rest) * w)
            wt = wt * e / np.sum(wt * e)
        fixed.append(np.float32(c[0]))
    return fixed


#: the prelude's own function, compiled as the emulator compiles it, over a
#: range of input bit patterns: the largest error and where, and the count of
#: broken exact cases (NaN stays NaN, +-0 and +-inf give +-0 and +-1 exactly)
HARNESS = r"""
#include "tn_prelude.cuh"
extern "C" void tn_tanh_sweep(unsigned long long lo, unsigned long long hi, double* worst,
                              unsigned* at, unsigned long long* bad) {
  double mx = 0;
  unsigned where = 0;
  unsigned long long nbad = 0;
  for (unsigned long long u = lo; u < hi; ++u) {
    const unsigned b = (unsigned)u;
    float x, y;
    unsigned yb;
    memcpy(&x, &b, 4);
    y = tn_tanh_approx(x);
    memcpy(&yb, &y, 4);
    if (x != x) { nbad += !(y != y); continue; }
    if (x == 0) { nbad += yb != b; continue; }
    if (isinf(x)) { nbad += y != (x > 0 ? 1.0f : -1.0f); continue; }
    const double ref = tanh((double)x);
    const int e = ilogb(fabs(ref));
    const double err = fabs((double)y - ref) / ldexp(1.0, (e < -126 ? -126 : e) - 23);
    if (err > mx) { mx = err; where = b; }
  }
  *worst = mx;
  *at = where;
  *bad = nbad;
}
"""


def build(folder: Path) -> Path:
    """:data:`HARNESS` as a shared library, built with the emulator's dialect
    header and flags (``-DTN_EMULATE``: the host's correctly rounded ``2^a``
    and ``1/s`` for the special function unit's)."""
    from tilenest.backends.cuda import prelude_dirs
    from tilenest.backends.simt import emu_dialects as D
    from tilenest.backends.simt.emulator import SHIM_DIR

    src = folder / "tanh_sweep.cc"
    src.write_text(HARNESS)
    lib = folder / "tanh_sweep.so"
    incs = [x for d in (str(SHIM_DIR), *prelude_dirs()) for x in ("-I", d)]
    subprocess.run(["g++", *D.CUDA.flags(), "-O2", "-ffp-contract=off", "-fno-strict-aliasing",
                    "-fPIC", "-shared", "-include", str(D.CUDA.header), *incs, str(src), "-o",
                    str(lib)], check=True)
    return lib


_LIB: list = []


def _load(lib: str) -> None:
    f = ctypes.CDLL(lib).tn_tanh_sweep
    f.argtypes = [ctypes.c_ulonglong, ctypes.c_ulonglong, ctypes.POINTER(ctypes.c_double),
                  ctypes.POINTER(ctypes.c_uint), ctypes.POINTER(ctypes.c_ulonglong)]
    _LIB.append(f)


def _emulated(start: int) -> tuple[float, float, int]:
    worst, at, bad = ctypes.c_double(), ctypes.c_uint(), ctypes.c_ulonglong()
    _LIB[0](start, start + CHUNK, worst, at, bad)
    return worst.value, float(np.uint32(at.value).view(np.float32)), bad.value


def _bounded(start: int) -> tuple[float, float, int]:
    stop = min(start + CHUNK, int(np.float32(16).view(np.uint32)))
    x = np.arange(start, stop, dtype=np.uint64).astype(np.uint32).view(np.float32)
    ref = np.tanh(x.astype(np.float64))
    ulp = M.ulp32(ref)
    worst = np.zeros(len(x))
    for k in range(-3, 4):
        for j in (-1, 0, 1):
            y, ok = M.exponential(x, k, j)
            worst = np.maximum(worst, np.where(ok, np.abs(y - ref) / ulp, 0.0))
    i = int(np.argmax(worst))
    return float(worst[i]), float(x[i]), 0


def _run(pool: mp.pool.Pool, fn, starts: list[int], what: str) -> None:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    err, at, bad = 0.0, 0.0, 0
    for e, x, b in pool.imap_unordered(fn, starts):
        bad += b
        if e > err:
            err, at = e, x
    print(f"{what}: at most {err:.4f} ulp (at x = {at!r}), {bad} exact cases broken, "
          f"{time.perf_counter() - t0:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--fit", action="store_true", help="refit and print the coefficients")
    ap.add_argument("--bounded-only", action="store_true")
    args = ap.parse_args()
    if args.fit:
        c = fit()
        print("COEFFS:", ", ".join(f'"{float(v).hex()}"' for v in c))
        print("prelude:", ", ".join(f"{float(v):.8e}f" for v in c))
        M.COEFFS = tuple(c)
    lo = int(np.float32(M.SPLIT).view(np.uint32))
    hi = int(np.float32(16).view(np.uint32))
    with mp.Pool(args.jobs) as pool:
        _run(pool, _bounded, list(range(lo, hi, CHUNK)),
             "bounded, 1 <= |x| < 16 (ex2 within 2.5 ulp, rcp within one float)")
    if args.bounded_only:
        return
    with tempfile.TemporaryDirectory() as d, \
            mp.Pool(args.jobs, _load, (str(build(Path(d))),)) as pool:
        _run(pool, _emulated, list(range(0, 1 << 32, CHUNK)),
             "emulated, every f32 input (the prelude's code; ex2 and rcp correctly rounded)")


if __name__ == "__main__":
    main()
