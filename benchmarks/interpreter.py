"""Interpreter speed: the batched reference interpreter against the same math
done directly in numpy, measured in the same run.

    python benchmarks/interpreter.py [--quick] [--samples 3] [--json]

The suite lives in the package (``tilenest bench --suite interpreter``,
:mod:`tilenest.bench.interpreter`). Prints one row per workload: numpy time,
interpreter time (fast batched mode, race and pipeline-order checks off; and
with both checks on), and the slowdowns (interpreter time / numpy time);
times are medians of ``--samples`` single calls after a warm-up call. Not a
timed test.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tilenest import progress
from tilenest.bench import interpreter


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes")
    ap.add_argument("--samples", type=int, default=3, help="samples per function")
    ap.add_argument("--json", action="store_true", help="print rows as JSON")
    a = ap.parse_args()
    size = "medium" if a.quick else "large"
    with progress.bar("interpreter", len(interpreter.NAMES)) as step:
        rows = interpreter.run(size, a.samples, interpreter.NAMES, step)
    if a.json:
        print(json.dumps(rows, indent=2))
        return 1 if any("error" in r for r in rows) else 0
    print(f"{'workload':36} {'numpy s':>9} {'interp s':>9} {'ratio':>7} {'+races s':>9} "
          f"{'ratio':>7}")
    for r in rows:
        if "error" in r:
            print(f"{r['workload']:36} {r['error']}")
            continue
        t_np, t_i, t_r = (x["median_s"] for x in (r["baselines"]["numpy"], r["tilenest"],
                                                  r["checked"]))
        print(f"{r['workload']:36} {t_np:9.4f} {t_i:9.4f} {t_i / t_np:7.2f} {t_r:9.4f} "
              f"{t_r / t_np:7.2f}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
