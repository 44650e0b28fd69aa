"""``make demo``: capture every example kernel, print its TileIR, check that the
text and JSON interchange forms round-trip, and summarize its execution nest."""

from __future__ import annotations

import sys
from pathlib import Path

import importlib.util

import numpy as np

from .cli import load_programs
from .errors import TilenestError
from .frontend.kernel import Kernel
from .semantics.jsonio import from_json, to_json
from .semantics.parser import parse_program


def summarize(p) -> str:
    an = p.analysis
    levels = [lv for lid, lv in sorted(an.nest.levels.items()) if lid]
    parts = []
    for lv in levels:
        ex = f" exec={lv.exec}" if lv.exec is not None else ""
        parts.append(f"L{lv.id}{'<L' + str(lv.parent) if lv.parent else ''}{ex}")
    kinds: dict[str, int] = {}
    for op in p.walk():
        kinds[op.name] = kinds.get(op.name, 0) + 1
    regions = ", ".join(f"{k}x{v}" for k, v in sorted(kinds.items())
                        if k in ("parallel", "serial", "pipeline", "reduce", "stage", "if", "while"))
    return f"nest: {' '.join(parts) or 'root only'}; regions: {regions}; ops: {sum(kinds.values())}"


def run_against_numpy(path: Path) -> int:
    """Run each kernel of the example on the interpreter and check that an
    independent numpy computation of the same math (the module's
    ``numpy_reference`` of its ``example_inputs``) is admitted by the oracle.
    Every kernel of a module with these hooks computes that same math."""
    spec = importlib.util.spec_from_file_location(f"_demo_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    if not hasattr(mod, "example_inputs"):
        return 0
    from . import interpret, reference

    failures = 0
    for name, k in [(n, v) for n, v in vars(mod).items() if isinstance(v, Kernel)]:
        args = mod.example_inputs(np.random.default_rng(0))
        adm = reference(k, *args)
        outs = interpret(k, *[a.copy() if isinstance(a, np.ndarray) else a for a in args])
        expected = mod.numpy_reference(*args)
        ok_np = adm.admits(np.asarray(expected, dtype=adm.value.dtype))
        ok_run = adm.admits(outs)
        diff = float(np.max(np.abs(np.asarray(outs, np.float64) -
                                   np.asarray(expected, np.float64))))
        print(f"-- run {name}: interpreter vs numpy max |diff| = {diff:.3g}; numpy result "
              f"{'admitted' if ok_np else 'NOT admitted (' + ok_np.reason + ')'}; "
              f"{int(adm.exact_mask.sum())}/{adm.value.size} elements bitwise, "
              f"max envelope {float(adm.envelope.max()):.3g}")
        print()
        failures += (not ok_np) + (not ok_run)
    return failures


def main() -> int:
    root = Path(__file__).resolve().parent.parent / "examples"
    files = sorted(root.glob("*.py"))
    if not files:
        print("no examples found", file=sys.stderr)
        return 1
    failures = 0
    for f in files:
        try:
            progs = load_programs(str(f.relative_to(Path.cwd()) if f.is_relative_to(Path.cwd())
                                      else f))
        except TilenestError as e:
            print(e.render(), file=sys.stderr)
            failures += 1
            continue
        for name, p in progs:
            text = str(p)
            ok_text = parse_program(text, f"{name}.tile") == p
            ok_json = from_json(to_json(p)) == p
            print(f"==== {f.name}: {name} ====")
            print(text)
            print(f"-- {summarize(p)}")
            print(f"-- round trip: text {'ok' if ok_text else 'FAILED'}, "
                  f"json {'ok' if ok_json else 'FAILED'}")
            print()
            failures += (not ok_text) + (not ok_json)
        failures += run_against_numpy(f)
    print(f"{len(files)} example files, {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
