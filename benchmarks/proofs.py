"""Proof-obligation checker speed.

    python benchmarks/proofs.py [--reps 3] [--max-depth 6] [--json]

The suite lives in the package (``tilenest bench --suite proofs``,
:mod:`tilenest.bench.proofs`). Measures, in one run:

1. the tiled GEMM example after ``split(1, 0, 2)`` and binding to the CUDA-like
   target: every obligation (program, transform, binding), wall time per
   obligation kind;
2. the row-softmax example: every obligation, per kind;
3. growth with nest depth: a one-level kernel split repeatedly into ``d``
   nested levels, bound to CUDA, checked whole; time and obligation count per
   depth, with the ratio to depth 1 (the baseline measured in the same run).

The first query of a process pays for importing islpy/z3; it is measured once
separately ("warm-up") and excluded from the per-kernel numbers, which are the
median of ``--reps`` complete runs (the per-process law cache is cleared before
each). Target: a whole kernel checked in under 2 s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tilenest import progress
from tilenest.bench import proofs

BUDGET_S = proofs.BUDGET_S


def legacy(out: dict) -> dict:
    """The suite's result in this script's JSON form (seconds are medians)."""
    doc: dict = {"warmup_s": out["warmup_s"], "budget_s": out["budget_s"], "kernels": {},
                 "depth": []}
    for r in out["rows"]:
        if r["name"] == "depth":
            doc["depth"].append({"depth": r["depth"], "levels_after": r["levels_after"],
                                 "obligations": r["obligations"],
                                 "seconds": r["tilenest"]["median_s"],
                                 "spread": r["tilenest"]["spread"],
                                 "ratio_to_depth1": 1 / r["ratios"]["depth1"],
                                 "max_query_s": r["max_query_s"],
                                 "exit_status": r["exit_status"]})
        else:
            doc["kernels"][r["workload"]] = {
                "seconds": r["tilenest"]["median_s"], "spread": r["tilenest"]["spread"],
                "obligations": r["obligations"], "exit_status": r["exit_status"],
                "per_kind": r["per_kind"]}
    return doc


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-depth", type=int, default=6)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with progress.bar("proofs", 2 + a.max_depth) as step:
        out = legacy(proofs.run(a.max_depth, a.reps, proofs.NAMES, step))
    if a.json:
        print(json.dumps(out, indent=2))
        return
    print(f"warm-up (imports islpy/z3, first query): {out['warmup_s']:.3f} s   budget per "
          f"kernel: {BUDGET_S} s")
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
