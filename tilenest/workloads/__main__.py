"""``python -m tilenest.workloads [NAME...] [--size S] [--dtype D] [--all-schedules]``:
run workloads on the interpreter and print, per run, whether the FP64 formula
and the oracle admit the outputs and how close the worst element comes to its
derived bound (``|got - v| / e``, 1.0 = on the bound)."""

from __future__ import annotations

import argparse
import sys
import time

from ..semantics import dtypes as D
from . import WORKLOADS, admitted, check, run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tilenest.workloads", description=__doc__)
    ap.add_argument("names", nargs="*", help="workloads (default: all)")
    ap.add_argument("--size", action="append", help="sizes (default: small and medium)")
    ap.add_argument("--dtype", default="f32", help="storage dtype: f32, f16 or bf16")
    ap.add_argument("--all-schedules", action="store_true", help="every tile schedule")
    a = ap.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    unknown = [n for n in a.names if n not in WORKLOADS]
    if unknown:
        print(f"error: unknown workload(s) {', '.join(unknown)}; known: {', '.join(WORKLOADS)}",
              file=sys.stderr)
        return 1
    dt = D.parse(a.dtype)
    t = Table(title=f"tilenest workloads ({dt})")
    for col in ("workload", "family", "size", "schedule", "fp64", "oracle", "worst/bound", "s"):
        t.add_column(col)
    bad = 0
    for name in a.names or list(WORKLOADS):
        wl = WORKLOADS[name]
        for size in a.size or ["small", "medium"]:
            if size not in wl.sizes:
                continue
            for sched in wl.schedules if a.all_schedules else wl.schedules[:1]:
                t0 = time.perf_counter()
                r = run(wl, size, dt, sched)
                fp = check(r)
                ora = admitted(r)
                ok = all(fp) and all(v for _, v in ora)
                bad += not ok
                t.add_row(name, wl.family, size, " ".join(f"{k}={v}" for k, v in sched.items()),
                          "ok" if all(fp) else "[red]" + next(str(c) for c in fp if not c),
                          "ok" if all(v for _, v in ora) else "[red]not admitted",
                          f"{max(c.max_ratio for c in fp):.3f}",
                          f"{time.perf_counter() - t0:.2f}")
    Console(width=160).print(t)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
