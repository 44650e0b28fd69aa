"""Proof-obligation checker speed.

    python benchmarks/proofs.py [--reps 3] [--max-depth 6] [--json]

Measures, in one run:

1. the tiled GEMM example after ``split(1, 0, 2)`` and binding to the CUDA-like
   target: every obligation (program, transform, binding), wall time per
   obligation kind;
2. the row-softmax example: every obligation, per kind;
3. growth with nest depth: a one-level kernel split repeatedly into ``d``
   nested levels, bound to CUDA, checked whole; time and obligation count per
   depth, with the ratio to depth 1 (the baseline measured in the same run).

The first query of a process pays for importing islpy/z3; it is measured once
separately ("warm-up") and excluded from the per-kernel numbers, which are the
best of ``--reps`` complete runs (the per-process law cache is cleared before
each). Target: a whole kernel checked in under 2 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT))

import gemm as gemm_example
import softmax as softmax_example

import tilenest as tn
from tilenest import f32

BUDGET_S = 2.0


@tn.kernel
def flat(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"]):  # noqa: F821
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index()), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)] * 2.0)


def run(program, transforms=(), target=None, reps=3):
    from tilenest.proofs import reductions

    best = None
    for _ in range(reps):
        reductions._CACHE.clear()  # every run decides every law: no cross-run caching
        r = tn.transform.check(program, list(transforms), target)
        if best is None or r.seconds < best.seconds:
            best = r
    return best


def per_kind(report) -> dict[str, tuple[int, float]]:
    acc: dict[str, list[float]] = defaultdict(list)
    for o in report.obligations:
        acc[o.kind].append(o.seconds)
    return {k: (len(v), sum(v)) for k, v in acc.items()}


def deep(depth: int):
    """``flat`` split ``depth - 1`` times at its innermost level: ``depth`` levels."""
    t = tn.transform.split(flat.program, 1, 0, 4)
    for d in range(2, depth):
        t = tn.transform.split(t, d, 0, 2)
    return (t.program if depth > 1 else flat.program)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-depth", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()

    t0 = time.perf_counter()
    tn.transform.check(flat.program)
    warm = time.perf_counter() - t0

    out: dict = {"warmup_s": warm, "budget_s": BUDGET_S, "kernels": {}, "depth": []}
    cases = [("gemm: split(1, 0, 2) + bind cuda", gemm_example.gemm.program,
              ["split(1, 0, 2)"], "cuda"),
             ("softmax", softmax_example.row_softmax.program, [], None)]
    for name, prog, tr, tgt in cases:
        r = run(prog, tr, tgt, a.reps)
        out["kernels"][name] = {"seconds": r.seconds, "obligations": len(r.obligations),
                                "exit_status": r.exit_status, "per_kind": per_kind(r)}
    base = None
    for d in range(1, a.max_depth + 1):
        prog = deep(d)
        r = run(prog, [f"split({d}, 0, 2)"], "cuda", a.reps)
        base = base or r.seconds
        out["depth"].append({"depth": d, "levels_after": d + 1, "obligations":
                             len(r.obligations), "seconds": r.seconds,
                             "ratio_to_depth1": r.seconds / base,
                             "max_query_s": max(o.seconds for o in r.obligations),
                             "exit_status": r.exit_status})
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"warm-up (imports islpy/z3, first query): {warm:.3f} s   budget per kernel: "
          f"{BUDGET_S} s")
    for name, k in out["kernels"].items():
        print(f"\n{name}: {k['obligations']} obligations in {k['seconds']:.3f} s "
              f"({k['seconds'] / BUDGET_S:.1%} of budget), exit {k['exit_status']}")
        print(f"  {'kind':<28}{'n':>4}{'total ms':>11}{'mean ms':>10}")
        for kind, (n, s) in sorted(k["per_kind"].items(), key=lambda kv: -kv[1][1]):
            print(f"  {kind:<28}{n:>4}{s * 1000:>11.2f}{s * 1000 / n:>10.2f}")
    print("\ngrowth with nest depth (kernel split into d levels, one more split, bind cuda):")
    print(f"  {'depth':>5}{'obligations':>13}{'seconds':>10}{'x depth 1':>11}{'max query ms':>14}")
    for row in out["depth"]:
        print(f"  {row['depth']:>5}{row['obligations']:>13}{row['seconds']:>10.3f}"
              f"{row['ratio_to_depth1']:>11.2f}{row['max_query_s'] * 1000:>14.2f}")


if __name__ == "__main__":
    main()
