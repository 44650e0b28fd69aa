"""Compiled (llvm) kernels against numpy on the CPU, ratios measured in one run.

    python benchmarks/cpu.py [--quick] [--threads 1 2] [--reps 5] [--samples 5] [--json]

The suite lives in the package (``tilenest bench --suite codegen``,
:mod:`tilenest.bench.codegen`); this script runs it at the sizes it always
had. Workloads: the read and copy bandwidth ceilings, row softmax, RMSNorm,
LayerNorm, add, row sum (4096x4096 f32), a global sum of 10^7 f32, GEMM f32
256^3, 1024^3 and ragged 1000^3, reassociating and strict, SwiGLU and a
batched A @ B^T (``--quick``: 1024x1024 rows, 10^6 sum, one shape per
product), against numpy and PyTorch CPU when installed; memory-bound rows
also as a fraction of their ceiling. Each thread count runs in its own worker
process with the BLAS thread count pinned; every compiled result is checked
against numpy before timing. A sample is a block of at least ``--reps`` calls
lasting at least 50 ms; ``--samples`` samples per function, the functions
alternating; the median is reported with the spread of the samples. The ratio
is numpy time / compiled time (> 1: compiled is faster). Compile time is the
first, uncached compile of each kernel. Not a timed test. For a record that
``tilenest bench --compare`` reads, run ``tilenest bench --size large --save
FILE``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tilenest import progress
from tilenest.bench import codegen

gemm_tiles = codegen.gemm_tiles


def legacy(row: dict) -> dict:
    """A row in this script's JSON form (seconds are medians)."""
    if "error" in row:
        return {"workload": row["workload"], "threads": row["threads"], "error": row["error"]}
    out = {"workload": row["workload"], "threads": row["threads"],
           "numpy_s": row["baselines"]["numpy"]["median_s"],
           "tilenest_s": row["tilenest"]["median_s"], "ratio": row["ratios"]["numpy"],
           "compile_s": row["compile_s"], "tilenest_spread": row["tilenest"]["spread"],
           "numpy_spread": row["baselines"]["numpy"]["spread"]}
    if "torch" in row["baselines"]:
        out["torch_s"] = row["baselines"]["torch"]["median_s"]
    if "bandwidth" in row:
        out["of_ceiling"] = row["bandwidth"]["fraction"]
    if "ceiling" in row:
        out["ceiling_bytes_per_s"] = row["ceiling"]["bytes_per_s"]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=5, help="calls per sample at least")
    ap.add_argument("--samples", type=int, default=5, help="samples per function")
    ap.add_argument("--quick", action="store_true", help="1024x1024 rows, 256^3 GEMM only")
    ap.add_argument("--json", action="store_true", help="print rows as JSON")
    a = ap.parse_args()
    size = "medium" if a.quick else "large"
    with progress.bar("cpu", codegen.planned(size, codegen.NAMES) * len(a.threads)) as step:
        rows = codegen.attach_bandwidth(codegen.run(a.threads, size, a.samples, codegen.NAMES,
                                                    step, a.reps))
    if a.json:
        print(json.dumps([legacy(r) for r in rows], indent=2))
    else:
        from rich.console import Console

        Console(width=140).print(codegen.table(rows))
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
