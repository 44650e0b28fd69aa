"""Proof-obligation checker speed, in one run.

Benchmarks:

* ``gemm`` -- the tiled GEMM after ``split(1, 0, 2)``, bound to the CUDA-like
  target: every obligation (program, transform, binding);
* ``softmax`` -- the row softmax: every obligation;
* ``depth`` -- growth with nest depth: a one-level kernel split into ``d``
  nested levels, split once more and bound to CUDA, checked whole, for ``d``
  from 1 to the size's largest depth; the baseline is depth 1, measured in the
  same run (ratio = depth-1 time / depth-d time, below 1: slower).

A sample is one complete check with the per-process law cache cleared (every
run decides every law). The first check of a process pays for importing
islpy and z3: it is measured separately (``warmup_s``) and excluded. The
time per obligation kind is that of the sample closest to the median.
Target: a whole kernel checked in under :data:`BUDGET_S` seconds.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from .timing import Timing, plus_minus

NAMES = ("gemm", "softmax", "depth")
BUDGET_S = 2.0
#: per size: the largest nest depth of the ``depth`` benchmark
SIZES = {"small": 2, "medium": 4, "large": 6}


@functools.cache
def flat() -> Any:
    """A one-level kernel: ``y[i] = 2 x[i]``."""
    import tilenest as tn
    from tilenest import f32

    @tn.kernel
    def flat(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):  # noqa: F821, UP037
        (n,) = x.shape
        for p in tn.parallel(tn.shape(n)):
            y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] * 2.0)

    return flat


def deep(depth: int) -> Any:
    """:func:`flat` split ``depth - 1`` times at its innermost level: ``depth`` levels."""
    import tilenest as tn

    if depth == 1:
        return flat().program
    t = tn.transform.split(flat().program, 1, 0, 4)
    for d in range(2, depth):
        t = tn.transform.split(t, d, 0, 2)
    return t.program


def check(program: Any, transforms: list[str], target: str | None, samples: int
          ) -> tuple[Timing, Any]:
    """Time ``samples`` complete checks; the timing and the median sample's report."""
    import tilenest as tn
    from tilenest.proofs import reductions

    reports = []
    for _ in range(samples):
        reductions._CACHE.clear()  # every run decides every law: no cross-run caching
        reports.append(tn.transform.check(program, list(transforms), target))
    ts = [r.seconds for r in reports]
    med = statistics.median(ts)
    return Timing.of(ts), min(reports, key=lambda r: abs(r.seconds - med))


def per_kind(report: Any) -> dict[str, list[float]]:
    """obligation kind -> [count, total seconds]."""
    acc: dict[str, list[float]] = defaultdict(list)
    for o in report.obligations:
        acc[o.kind].append(o.seconds)
    return {k: [len(v), sum(v)] for k, v in acc.items()}


def run(size: str | int, samples: int, only: tuple[str, ...],
        step: Callable[..., None]) -> dict[str, Any]:
    """``{"warmup_s", "budget_s", "rows"}``; ``size`` may be the largest depth."""
    import tilenest as tn

    from .kernels import kernels

    t0 = time.perf_counter()
    tn.transform.check(flat().program)
    out: dict[str, Any] = {"warmup_s": time.perf_counter() - t0, "budget_s": BUDGET_S,
                           "rows": []}
    ks = kernels()
    named = {"gemm": ("gemm: split(1, 0, 2) + bind cuda", ks["gemm"].program,
                      ["split(1, 0, 2)"], "cuda"),
             "softmax": ("softmax", ks["softmax"].program, [], None)}
    for name in ("gemm", "softmax"):
        if name not in only:
            continue
        label, prog, tr, tgt = named[name]
        t, r = check(prog, tr, tgt, samples)
        out["rows"].append({"name": name, "workload": label, "tilenest": t.to_json(),
                            "obligations": len(r.obligations), "exit_status": r.exit_status,
                            "per_kind": per_kind(r)})
        step(label)
    if "depth" in only:
        base = None
        for d in range(1, (size if isinstance(size, int) else SIZES[size]) + 1):
            t, r = check(deep(d), [f"split({d}, 0, 2)"], "cuda", samples)
            base = base or t.median
            out["rows"].append({"name": "depth", "workload": f"depth {d}", "depth": d,
                                "levels_after": d + 1, "tilenest": t.to_json(),
                                "obligations": len(r.obligations),
                                "ratios": {"depth1": base / t.median},
                                "max_query_s": max(o.seconds for o in r.obligations),
                                "exit_status": r.exit_status})
            step(f"depth {d}")
    return out


def table(out: dict[str, Any]) -> Any:
    """A rich Table of the kernels and depths (median seconds, spread)."""
    from rich.table import Table

    pm = plus_minus()
    t = Table(title=f"tilenest check (median of samples, {pm} spread; warm-up "
                    f"{out['warmup_s']:.2f} s excluded; budget {BUDGET_S} s per kernel)")
    for c in ("benchmark", "obligations", "seconds", "of budget", "vs depth 1", "exit"):
        t.add_column(c, justify="left" if c == "benchmark" else "right", no_wrap=False)
    for r in out["rows"]:
        tm = r["tilenest"]
        ratio = r.get("ratios", {}).get("depth1")
        t.add_row(r["workload"], str(r["obligations"]),
                  f"{tm['median_s']:.3f} {pm}{tm['spread']:.0%}",
                  f"{tm['median_s'] / BUDGET_S:.1%}",
                  "-" if ratio is None else f"{ratio:.2f}x", str(r["exit_status"]))
    return t
