"""Regenerate the conformance cases from the generator modules in ``gen/``.

    python spec/conformance/generate.py           # rewrite cases/
    python spec/conformance/generate.py --check   # fail if cases/ is stale

Each generator module registers cases (DSL kernels captured and printed to
TileIR, or TileIR text); this script writes, per case, into
``cases/<spec file>/``: the program (``NAME.tile``, or ``NAME.tileir.json`` for
JSON-form cases), the recipe ``NAME.json`` and, when the case has one, the
wrong companion ``NAME.wrong.tile``. Locations are stripped so that the files
do not depend on the generators' line numbers. The generated files are
committed; the suite never needs this script to run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gen"))
sys.path.insert(0, str(HERE.parent.parent))

GROUPS = {"V": "values", "E": "execution", "M": "memory", "R": "reductions", "P": "pipeline",
          "T": "transforms", "I": "interchange"}
MODULES = ("values", "execution", "memory", "reductions", "pipeline", "transforms",
           "interchange")


def render() -> dict[Path, str]:
    """Every file of the suite, by path relative to ``cases/``."""
    import importlib

    import common
    from common import strip_locs, tileir

    for m in MODULES:
        if (HERE / "gen" / f"{m}.py").exists():
            importlib.import_module(m)
    files: dict[Path, str] = {}
    names: set[str] = set()
    for c in common.CASES:
        if c.name in names:
            raise SystemExit(f"duplicate case name {c.name}")
        names.add(c.name)
        group = GROUPS[c.rules[0][0]]
        folder = Path(group)
        if c.text is not None:
            prog_name, prog_text = f"{c.name}.tile", strip_locs(c.text)
        elif c.json:
            from tilenest.semantics.jsonio import to_json

            p = getattr(c.program, "program", c.program)
            prog_name = f"{c.name}.tileir.json"
            d = to_json(p)
            _drop_locs(d)
            prog_text = json.dumps(d, indent=1) + "\n"
        else:
            prog_name, prog_text = f"{c.name}.tile", tileir(c.program)
        _check_args(c, prog_text, prog_name)
        files[folder / prog_name] = prog_text
        recipe = {"schema": "tilenest.conformance/1", "name": c.name, "rules": list(c.rules),
                  "summary": c.summary, "program": prog_name, "args": c.args,
                  "params": c.params, "expect": c.expect}
        if c.wrong is not None:
            wname = f"{c.name}.wrong.tile"
            files[folder / wname] = (strip_locs(c.wrong) if isinstance(c.wrong, str)
                                     else tileir(c.wrong))
            recipe["wrong"] = wname
        if c.gap:
            recipe["gap"] = c.gap
        files[folder / f"{c.name}.json"] = dump_recipe(recipe)
    return files


def dump_recipe(recipe: dict) -> str:
    """JSON with one line per key and per argument (diffs stay readable)."""
    lines = []
    for k, v in recipe.items():
        if k == "args":
            inner = ",\n".join(f"  {json.dumps(a)}" for a in v)
            lines.append(f' "args": [\n{inner}\n ]')
        else:
            lines.append(f" {json.dumps(k)}: {json.dumps(v)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _drop_locs(d: object) -> None:
    if isinstance(d, dict):
        d.pop("loc", None)
        for v in d.values():
            _drop_locs(v)
    elif isinstance(d, list):
        for v in d:
            _drop_locs(v)


def _check_args(c: object, text: str, name: str) -> None:
    """Recipe argument names must be the program's, in order (when it parses)."""
    from tilenest.errors import TilenestError

    try:
        if name.endswith(".json"):
            from tilenest.semantics.jsonio import loads

            prog = loads(text)
        else:
            from tilenest.semantics.parser import parse_program

            prog = parse_program(text)
    except TilenestError:
        return
    want = [a.name for a in prog.args]
    got = [a["name"] for a in c.args]  # type: ignore[attr-defined]
    if want != got:
        raise SystemExit(f"case {c.name}: recipe arguments {got} != program arguments {want}")  # type: ignore[attr-defined]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only compare with cases/")
    a = ap.parse_args()
    cases = HERE / "cases"
    files = render()
    existing = {p.relative_to(cases) for p in cases.rglob("*") if p.is_file()}
    stale = sorted(existing - set(files))
    changed = sorted(p for p, text in files.items()
                     if not (cases / p).exists() or (cases / p).read_text() != text)
    if a.check:
        for p in stale:
            print(f"stale: {p}")
        for p in changed:
            print(f"out of date: {p}")
        return 1 if stale or changed else 0
    for p in stale:
        (cases / p).unlink()
    for p in changed:
        (cases / p).parent.mkdir(parents=True, exist_ok=True)
        (cases / p).write_text(files[p])
    n = sum(1 for p in files if p.suffix == ".json" and not p.name.endswith(".tileir.json"))
    print(f"{n} cases, {len(changed)} files written, {len(stale)} removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
