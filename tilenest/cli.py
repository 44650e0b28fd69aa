"""The ``tilenest`` command line.

Subcommands::

    tilenest show FILE [--kernel NAME] [--json]   print the TileIR of a kernel file (.py)
                                                  or an IR file (.tile / .json)
    tilenest run FILE ...                         run a kernel on the reference interpreter
    tilenest check FILE ...                       discharge the proof obligations
    tilenest lower FILE --target T --emit E       print generated code
    tilenest validate FILE --target T             translation validation
    tilenest conformance                          run the conformance suite
    tilenest bench                                run benchmarks

A user's mistake (bad IR text, an ill-typed kernel, a race...) prints the
error with its sites and a hint and exits with status 1; it never prints a
Python traceback. Subcommands whose capability is not built yet say so and
exit with status 3.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, Sequence

from .errors import NotAvailableError, TilenestError

EXIT_USER_ERROR = 1
EXIT_NOT_AVAILABLE = 3


def load_programs(path: str, kernel: str | None = None) -> list[tuple[str, Any]]:
    """The ``(name, TileProgram)`` pairs defined by a kernel file or IR file."""
    p = Path(path)
    if not p.exists():
        raise TilenestError(f"no such file: {path}")
    if p.suffix == ".py":
        from .frontend.kernel import Kernel

        spec = importlib.util.spec_from_file_location(f"_tilenest_user_{p.stem}", p)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(p.parent.resolve()))
        try:
            spec.loader.exec_module(mod)
        finally:
            sys.path.pop(0)
        kernels = [(n, k) for n, k in vars(mod).items() if isinstance(k, Kernel)]
        if kernel is not None:
            kernels = [(n, k) for n, k in kernels if n == kernel]
            if not kernels:
                raise TilenestError(f"{path} defines no kernel named '{kernel}'")
        if not kernels:
            raise TilenestError(f"{path} defines no @tn.kernel",
                                hint="decorate a function with @tn.kernel")
        return [(n, k.program) for n, k in kernels]
    text = p.read_text()
    if p.suffix == ".json":
        from .semantics.jsonio import loads

        return [(p.stem, loads(text))]
    from .semantics.parser import parse_program

    return [(p.stem, parse_program(text, str(p)))]


def cmd_show(a: argparse.Namespace) -> int:
    progs = load_programs(a.file, a.kernel)
    if a.json:
        from .semantics.jsonio import to_json

        out = [to_json(p) for _, p in progs]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2))
    else:
        print("\n\n".join(str(p) for _, p in progs))
    return 0


def _not_yet(what: str, issue: str) -> Any:
    def run(a: argparse.Namespace) -> int:
        raise NotAvailableError(f"'tilenest {what}' is not available in this build yet",
                                hint=f"it arrives with the {issue}; see README.md")
    return run


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tilenest", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("show", help="print the TileIR of a kernel or IR file")
    s.add_argument("file")
    s.add_argument("--kernel", help="only this kernel of a .py file")
    s.add_argument("--json", action="store_true", help="print the JSON interchange form")
    s.set_defaults(fn=cmd_show)
    for name, issue, help_ in (
            ("run", "reference interpreter", "run a kernel on the reference interpreter"),
            ("check", "proof-obligation checker", "discharge proof obligations"),
            ("lower", "lowering pipeline", "print generated code"),
            ("validate", "translation validation", "validate a compiled kernel"),
            ("conformance", "conformance suite", "run the conformance suite"),
            ("bench", "benchmarks", "run benchmarks")):
        s = sub.add_parser(name, help=help_ + " (not yet available)")
        s.add_argument("args", nargs=argparse.REMAINDER)
        s.add_argument("--json", action="store_true")
        s.set_defaults(fn=_not_yet(name, issue))
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        return a.fn(a)
    except NotAvailableError as e:
        print(e.render(), file=sys.stderr)
        return EXIT_NOT_AVAILABLE
    except TilenestError as e:
        if getattr(a, "json", False):
            print(json.dumps({"error": e.to_json()}, indent=2))
        else:
            print(e.render(), file=sys.stderr)
        return EXIT_USER_ERROR
    except SyntaxError as e:
        print(f"error: Python syntax error in {e.filename}:{e.lineno}:{e.offset}: {e.msg}",
              file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
