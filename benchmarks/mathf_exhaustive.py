"""Every f32 input of the float-only math functions, on many cores.

    python benchmarks/mathf_exhaustive.py [--jobs 16] [FUNCTION ...]

The same check as ``test_mathf.py::test_f32_exhaustive`` (``-m slow``): all
2^32 bit patterns of each unary function of ``tn_mathf.h`` against the
interpreter's reference (``numerics.unrounded``), measured with
``test_llvm_math.ulp_error``, split into 256 chunks run by a process pool.
The library is built with ``-march=native`` (the host's fma instruction:
the same results as the library call, faster). Prints the maximum error
per function, where it occurs, and the time.
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def _host_module():
    """``tilenest/backends/simt/mathf_host.py`` of this checkout, by path."""
    spec = importlib.util.spec_from_file_location(
        "mathf_host", ROOT / "tilenest/backends/simt/mathf_host.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_LIB: list = []


def _init(lib: str) -> None:
    _LIB.append(_host_module().MathF(Path(lib)))


def _chunk(task: tuple[str, int]) -> tuple[str, float, float]:
    from test_llvm_math import ulp_error

    from tilenest.semantics import numerics as N
    from tilenest.semantics.dtypes import parse

    op, start = task
    x = np.arange(start, start + (1 << 24), dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        err = ulp_error(_LIB[0].unary(op, x), N.unrounded(op, parse("f32"), x), "f32")
    i = int(np.argmax(err))
    return op, float(err[i]), float(x[i])


def main() -> None:
    M = _host_module()
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=mp.cpu_count())
    ap.add_argument("ops", nargs="*", default=list(M.UNARY))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        lib = str(M.build(Path(d), ("-march=native",)))
        with mp.Pool(args.jobs, _init, (lib,)) as pool:
            for op in args.ops:
                t0 = time.perf_counter()
                res = pool.map(_chunk, [(op, s) for s in range(0, 1 << 32, 1 << 24)])
                _, err, at = max(res, key=lambda r: r[1])
                print(f"{op}: all 2^32 f32 inputs, max {err:.4f} ulp at x = {at!r}, "
                      f"{time.perf_counter() - t0:.0f} s on {args.jobs} processes", flush=True)


if __name__ == "__main__":
    main()
