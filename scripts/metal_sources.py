"""Write the MSL of every shipped kernel as one-string sources, and on a Mac
compile each with Apple's Metal compiler.

    python scripts/metal_sources.py OUT_DIR [--xcrun]

Writes ``OUT_DIR/<name>.metal`` for every kernel of ``examples/*.py`` and
every workload of ``tilenest.workloads`` (small size, f32, f16 and bf16,
default metal schedule), each the source Metal's runtime is given
(:func:`tilenest.backends.metal.emit.standalone`); kernels the Metal target
refuses (f64) are listed, not written. With ``--xcrun`` (macOS with Xcode's
command line tools) each file is compiled by ``xcrun -sdk macosx metal -c``
with fast math off, and the script exits 1 if any is rejected. Here (no
Mac) the same sources are type-checked by clang against the shim in
``make test`` (``tests/test_metal_emit.py``).
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sources() -> dict[str, str]:
    """name -> standalone MSL of every example kernel and workload variant."""
    from tilenest.backends import metal
    from tilenest.cli import load_programs
    from tilenest.errors import TilenestError
    from tilenest.semantics import dtypes as D
    from tilenest.workloads import WORKLOADS

    programs = []
    for f in sorted(glob.glob(os.path.join(ROOT, "examples", "*.py"))):
        for name, p in load_programs(f, None, {}):
            programs.append((f"{os.path.basename(f)[:-3]}-{name}", p))
    for n, w in WORKLOADS.items():
        for dt in (D.f32, D.f16, D.bf16):
            if dt in w.dtypes:
                programs.append((f"{n}-{dt.name}", w.kernel(dt, None, "small").program))
    out = {}
    for name, p in programs:
        try:
            out[name] = metal.standalone(metal.emit(p, "msl"))
        except TilenestError as e:
            print(f"refused {name}: {e.message}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="folder for the .metal files")
    ap.add_argument("--xcrun", action="store_true", help="compile each with xcrun metal")
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    bad = 0
    srcs = sources()
    for name, text in srcs.items():
        path = os.path.join(a.out, f"{name}.metal")
        with open(path, "w") as f:
            f.write(text)
        if a.xcrun:
            # bf16 (bfloat) needs Metal 3.1
            std = "metal3.1" if "bfloat" in text else "metal3.0"
            r = subprocess.run(["xcrun", "-sdk", "macosx", "metal", f"-std={std}",
                                "-fno-fast-math", "-c", path, "-o", path[:-6] + ".air"],
                               capture_output=True, text=True)
            if r.returncode:
                bad += 1
                print(f"REJECTED {name}:\n{r.stderr}")
    print(f"{len(srcs)} sources in {a.out}" + (f", {bad} rejected by xcrun metal"
                                               if a.xcrun else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
