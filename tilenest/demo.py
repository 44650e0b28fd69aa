"""``make demo``: capture every example kernel, print its TileIR, check that the
text and JSON interchange forms round-trip, and summarize its execution nest."""

from __future__ import annotations

import sys
from pathlib import Path

from .cli import load_programs
from .errors import TilenestError
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
    print(f"{len(files)} example files, {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
