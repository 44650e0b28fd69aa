"""The ``tilenest`` command line.

Subcommands::

    tilenest show FILE [--kernel NAME] [--json]   print the TileIR of a kernel file (.py)
                                                  or an IR file (.tile / .json)
    tilenest run FILE ...                         run a kernel on the reference interpreter
    tilenest check FILE [--transform SPEC ...] [--target cuda|metal|cpu] [--json]
                   [--timeout S] [--assume SEL]   discharge the proof obligations
                                                  (exit 0 all proved, 1 any refuted,
                                                  2 any unknown and none refuted)
    tilenest lower FILE --target llvm --emit E    print one stage (schedule|tileir|loopir|ir|opt|asm)
    tilenest validate FILE --target llvm          translation validation
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


def _parse_arg(spec: str, value: Any) -> Any:
    """A call argument from the command line: a .npy file, a number, or
    ``zeros:4x8`` / ``random:4x8[:seed]`` (dtype from the kernel's signature)."""
    import numpy as np

    from .semantics.types import TensorType

    t = value.type
    if spec.endswith(".npy"):
        return np.load(spec)
    if spec.startswith(("zeros:", "random:")):
        parts = spec.split(":")
        shape = tuple(int(x) for x in parts[1].split("x")) if parts[1] else ()
        if not isinstance(t, TensorType):
            raise TilenestError(f"argument '{value.name}' is a scalar, not a tensor")
        if parts[0] == "zeros":
            return np.zeros(shape, dtype=t.dtype.np)
        rng = np.random.default_rng(int(parts[2]) if len(parts) > 2 else 0)
        return rng.standard_normal(shape).astype(t.dtype.np) if t.dtype.is_float else \
            rng.integers(0, 10, shape).astype(t.dtype.np)
    try:
        return float(spec) if "." in spec or "e" in spec.lower() else int(spec)
    except ValueError:
        raise TilenestError(f"cannot read argument '{value.name}' from {spec!r}",
                            hint="give a .npy file, a number, zeros:AxB or random:AxB[:seed]") \
            from None


def cmd_run(a: argparse.Namespace) -> int:
    import numpy as np

    from .interpreter import interpret, random as rand_sched

    progs = load_programs(a.file, a.kernel)
    if len(progs) != 1:
        raise TilenestError(f"{a.file} defines {len(progs)} kernels; choose one with --kernel",
                            hint="kernels: " + ", ".join(n for n, _ in progs))
    name, p = progs[0]
    if len(a.args) != len(p.args):
        raise TilenestError(f"kernel {name} takes {len(p.args)} arguments "
                            f"({', '.join(v.name for v in p.args)}), got {len(a.args)}")
    args = [_parse_arg(s, v) for s, v in zip(a.args, p.args, strict=True)]
    params = {}
    for kv in a.param or []:
        k, _, v = kv.partition("=")
        params[k] = int(v)
    sched: Any = a.schedule
    if sched and sched.startswith("random"):
        sched = rand_sched(int(sched.partition(":")[2] or 0))
    interpret(p, *args, params=params, schedule=sched, fast=a.fast, poison=a.poison)
    stored = {op.operands[0].name for op in p.walk() if op.name == "tensor.store"}
    out_dir = Path(a.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {}
    for v, arr in zip(p.args, args, strict=True):
        if v.name in stored:
            path = out_dir / f"{v.name}.npy"
            np.save(path, arr)
            report[v.name] = {"path": str(path), "shape": list(arr.shape), "dtype": str(arr.dtype)}
    if a.json:
        print(json.dumps({"kernel": name, "outputs": report}, indent=2))
    else:
        for n, r in report.items():
            print(f"{n}: {r['dtype']}{r['shape']} -> {r['path']}")
    return 0


def cmd_check(a: argparse.Namespace) -> int:
    """``tilenest check``: exit 0 when every required obligation is proved (or
    assumed), 1 when one is refuted (or on a user error), 2 when one is unknown
    and none is refuted. ``--json`` follows spec/obligations.md."""
    from .proofs.report import check

    progs = load_programs(a.file, a.kernel)
    reports = [check(p, a.transform or (), a.target, timeout=a.timeout, assume=a.assume or (),
                     engine=a.engine, debug=a.debug) for _, p in progs]
    if a.json:
        out = [r.to_json() for r in reports]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2))
    else:
        print("\n\n".join(r.table(a.verbose) for r in reports))
    codes = [r.exit_status for r in reports]
    return 1 if 1 in codes else (2 if 2 in codes else 0)


def _schedule_for(a: argparse.Namespace, program: Any) -> Any:
    from .lowering import default_schedule

    s = default_schedule(program, a.target)
    return s.with_(transforms=tuple(a.transform)) if a.transform else s


def cmd_lower(a: argparse.Namespace) -> int:
    """``tilenest lower``: print one stage of the generated code."""
    from .backends.llvm import STAGES, emit

    if a.target != "llvm":
        raise NotAvailableError(f"no lowering for target '{a.target}'", hint="targets: llvm")
    if a.emit not in STAGES:
        raise TilenestError(f"unknown stage '{a.emit}'", hint="stages: " + ", ".join(STAGES))
    progs = load_programs(a.file, a.kernel)
    texts = [(n, emit(p, a.emit, _schedule_for(a, p))) for n, p in progs]
    if a.json:
        print(json.dumps({n: t for n, t in texts}, indent=2))
    else:
        print("\n".join(t for _, t in texts), end="")
    return 0


def cmd_validate(a: argparse.Namespace) -> int:
    """``tilenest validate``: exit 0 when every case is admitted, 1 on a mismatch."""
    from .validation.report import run_cli

    progs = load_programs(a.file, a.kernel)
    if not a.json and a.target == "llvm":
        from .lowering.legality import legality, summary
        from .proofs.obligation import PROVED

        for name, p in progs:  # the compile-time gate's verdicts that are not proofs
            obs = legality(p, _schedule_for(a, p))
            if any(o.status != PROVED and o.role == "required" for o in obs):
                print(f"{name}: {summary(obs)}")
    return run_cli(progs, a, _schedule_for)


def cmd_conformance(a: argparse.Namespace) -> int:
    """``tilenest conformance``: judge an implementation on the suite."""
    from .conformance import main as run_conformance

    return run_conformance(a.suite, a.impl, a.case, a.json_report, a.junit, a.verbose, a.json,
                           a.timeout, a.keep, a.seed, a.backend)


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
    s = sub.add_parser("run", help="run a kernel on the reference interpreter")
    s.add_argument("file", help="kernel file (.py) or TileIR (.tile/.json)")
    s.add_argument("args", nargs="*",
                   help="one per kernel argument: FILE.npy, a number, zeros:AxB, random:AxB[:seed]")
    s.add_argument("--kernel", help="which kernel of a .py file")
    s.add_argument("--param", action="append", help="symbolic parameter NAME=VALUE")
    s.add_argument("--schedule", help="canonical | reversed | random[:seed] | exhaustive")
    s.add_argument("--fast", action="store_true", help="BLAS/pairwise orders (still admitted)")
    s.add_argument("--poison", action="store_true", help="report reads of unwritten outputs")
    s.add_argument("--out-dir", default=".", help="where outputs are written as NAME.npy")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_run)
    s = sub.add_parser("check", help="state and discharge the proof obligations (exit 0 all "
                       "proved, 1 any refuted, 2 any unknown and none refuted)")
    s.add_argument("file", help="kernel file (.py) or TileIR (.tile/.json)")
    s.add_argument("--kernel", help="only this kernel of a .py file")
    s.add_argument("--transform", action="append", metavar="SPEC",
                   help="a transform applied in order, e.g. 'split(1, 0, 2)', 'tile(1, [2, 2])', "
                        "'bind(1:block, 2:warp)', 'fuse_phases(1)', 'place_reduction(0, 4)'")
    s.add_argument("--target", choices=("cuda", "metal", "cpu"),
                   help="bind the (transformed) nest to this target's scopes")
    s.add_argument("--json", action="store_true", help="machine-readable report "
                   "(schema tilenest.check/1)")
    s.add_argument("--timeout", type=float, default=5.0, help="seconds per query (default 5)")
    s.add_argument("--assume", action="append", metavar="SEL",
                   help="take obligations matching KIND[@SITE] as axioms (reported as assumed)")
    s.add_argument("--engine", choices=("auto", "isl", "z3"), default="auto")
    s.add_argument("--debug", action="store_true",
                   help="re-check the program obligations after every rewrite")
    s.add_argument("--verbose", "-v", action="store_true", help="print every statement")
    s.set_defaults(fn=cmd_check)
    s = sub.add_parser("lower", help="print the code a kernel lowers to (one stage)")
    s.add_argument("file", help="kernel file (.py) or TileIR (.tile/.json)")
    s.add_argument("--kernel", help="only this kernel of a .py file")
    s.add_argument("--target", default="llvm", help="code generation target (llvm)")
    s.add_argument("--emit", default="loopir",
                   help="stage: schedule | tileir | loopir | ir | opt | asm")
    s.add_argument("--transform", action="append", metavar="SPEC",
                   help="a schedule transform applied first, e.g. 'split(1, 0, 4)'")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_lower)
    s = sub.add_parser("validate", help="translation validation of a compiled kernel against "
                       "the reference (exit 1 on any mismatch)")
    s.add_argument("file", help="kernel file (.py) or TileIR (.tile/.json)")
    s.add_argument("--kernel", help="only this kernel of a .py file")
    s.add_argument("--target", default="llvm", help="code generation target (llvm)")
    s.add_argument("--cases", type=int, default=20, help="generated cases per kernel")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--limit", type=int, default=200, help="largest generated extent")
    s.add_argument("--transform", action="append", metavar="SPEC",
                   help="a schedule transform applied first, e.g. 'split(1, 0, 4)'")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_validate)
    s = sub.add_parser("conformance", help="run the conformance suite (spec/conformance) on the "
                       "interpreter, a backend, or an external implementation; exit 1 if a "
                       "case fails")
    s.add_argument("--suite", help="suite folder (default: the source tree's spec/conformance)")
    s.add_argument("--impl", metavar="CMD",
                   help="external implementation: a command with {case} {inputs} {outputs}")
    s.add_argument("--target", "--backend", dest="backend", metavar="TARGET",
                   help="a compiled target instead of the interpreter (llvm)")
    s.add_argument("--case", action="append", default=[], metavar="PAT",
                   help="only cases whose name contains PAT, or that cite rule PAT (V-7, R)")
    s.add_argument("--json-report", metavar="PATH", help="write the JSON report here")
    s.add_argument("--junit", metavar="PATH", help="write a JUnit XML report here")
    s.add_argument("--timeout", type=float, default=120.0, help="seconds per external case")
    s.add_argument("--keep", metavar="DIR", help="keep each external case's inputs/outputs here")
    s.add_argument("--seed", type=int, default=1, help="the interpreter's random schedule seed")
    s.add_argument("--verbose", "-v", action="store_true", help="a row per case")
    s.add_argument("--json", action="store_true", help="print the JSON report instead")
    s.set_defaults(fn=cmd_conformance)
    for name, issue, help_ in (
            ("bench", "benchmarks", "run benchmarks"),):
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
