"""The ``tilenest`` command line.

Subcommands::

    tilenest show FILE [--kernel NAME] [--json]   print the TileIR of a kernel file (.py)
                                                  or an IR file (.tile / .json)
    tilenest run FILE ...                         run a kernel on the reference interpreter
    tilenest check FILE [--transform SPEC ...] [--target cuda|metal|cpu] [--json]
                   [--timeout S] [--assume SEL]   discharge the proof obligations
                   [--sarif FILE]                 (exit 0 all proved, 5 any refuted,
                                                  6 any unknown and none refuted;
                                                  FILE: the verdicts as SARIF 2.1.0)
    tilenest lower FILE --target llvm --emit E    print one stage (schedule|tileir|loopir|ir|opt|asm;
                                                  cuda: schedule|loopir|cuda|ptx|sass-resources)
    tilenest validate FILE.. --target llvm        translation validation
    tilenest conformance                          run the conformance suite
    tilenest campaign fuzz|text --count N --seed S [--state FILE] [--targets llvm,cuda:K]
                   [--workers W] [--ray [ADDRESS]]   a seeded, resumable fuzz campaign (local
                   [--shard-size K] [--json]       processes or a Ray cluster; exit 1 on a bug)
    tilenest bench                                run benchmarks

Exit status (every subcommand; no two meanings share a number):

===  ======================================================================
0    success
1    the input or the result is wrong: bad IR text, an ill-typed kernel, a
     kernel module that raises, a race, a validation mismatch or nothing
     validated, a failed conformance case, a campaign that found a bug
2    usage error: the command line names no valid invocation (an unknown
     option, subcommand or target, a value out of range, a file that does not
     exist or is not a regular file, an array too large to allocate)
3    a capability this build or machine lacks
4    ``bench --compare``: a benchmark's ratio regressed
5    ``check``: some required obligation is refuted
6    ``check``: some required obligation is unknown and none is refuted
70   an internal error of tilenest (a bug: please report it)
74   the output could not be written (standard output closed, a broken
     pipe, a full device)
130  interrupted (Ctrl-C)
===  ======================================================================

A user's mistake prints the error with its sites and a hint, never a Python
traceback; an internal error prints a short note, and the traceback only when
``TILENEST_DEBUG=1`` is set or ``--traceback`` is given before the subcommand.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

from . import userfiles
from .semantics.signature import stored_tensors
from .errors import (
    InternalError,
    NotAvailableError,
    Site,
    TilenestError,
    UsageError,
    UserCodeError,
)

EXIT_USER_ERROR = 1
#: as argparse and pytest: the command line itself is wrong
EXIT_USAGE = 2
EXIT_NOT_AVAILABLE = 3
#: ``bench --compare``: a ratio fell (tilenest.bench.compare.EXIT_REGRESSED)
EXIT_REGRESSED = 4
#: ``check``'s verdicts (tilenest.proofs.obligation.outcome)
EXIT_REFUTED = 5  # == proofs.obligation.EXIT_REFUTED
EXIT_UNKNOWN = 6  # == proofs.obligation.EXIT_UNKNOWN
#: sysexits.h EX_SOFTWARE: an internal software error
EXIT_INTERNAL = 70
#: sysexits.h EX_IOERR: the output could not be written
EXIT_IO = 74
EXIT_INTERRUPTED = 130

_PACKAGE_DIR = Path(__file__).resolve().parent


def _is_user_file(filename: str) -> bool:
    """Whether a traceback frame's file is the user's code: not tilenest, not
    the Python installation (stdlib, site-packages), not a frozen module."""
    if not filename or filename.startswith("<"):
        return False
    f = Path(filename).resolve()
    roots = {_PACKAGE_DIR, *(Path(x).resolve() for x in
                             {sys.prefix, sys.base_prefix, sys.exec_prefix} if x)}
    return not any(f == r or r in f.parents for r in roots)


def _frames(tb: Any) -> list[traceback.FrameSummary]:
    return list(traceback.extract_tb(tb))


def _site_of(fr: traceback.FrameSummary) -> Site:
    return Site(fr.filename, fr.lineno or 0, (fr.colno or 0) + 1 if fr.colno is not None else 0)


def _user_code_error(e: BaseException, what: str) -> UserCodeError:
    """``e``, raised while running the user's code, located at the deepest frame
    of the user's own files (where the user can act)."""
    frames = _frames(e.__traceback__)
    user = [f for f in frames if _is_user_file(f.filename)]
    notes = []
    if frames and user and frames[-1] is not user[-1]:
        last = frames[-1]
        notes.append(f"raised in {Path(last.filename).name}:{last.lineno} ({last.name}), "
                     f"called from the line above")
    if isinstance(e, RecursionError):
        msg = "Python's recursion limit was exceeded"
        hint = ("look for a function that calls itself without end, or an expression "
                "nested too deeply (split it into named steps)")
    else:
        msg, hint = str(e), "the exception comes from the Python code at that line"
    return UserCodeError(f"{what} raised {type(e).__name__}: {msg}",
                         _site_of(user[-1]) if user else None, hint, tuple(notes))


def _exec_user_module(loader: Any, mod: Any, p: Path) -> None:
    """Import the user's kernel file; what its own code raises is a located
    user error (tilenest diagnostics and Python syntax errors pass through).
    Whatever it raises counts, a ``BaseException`` subclass or ``SystemExit``
    too; only Ctrl-C (``KeyboardInterrupt``) stops the command as such."""
    try:
        loader.exec_module(mod)
    except SyntaxError as e:
        e.filename = e.filename or str(p)
        raise
    except TilenestError:
        raise
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # noqa: BLE001 - whatever the user's module raises
        if isinstance(e, ValueError) and "null bytes" in str(e):
            raise TilenestError(f"{p} is not Python source (it contains null bytes)",
                                hint="give a .py kernel file, a .tile or a .json file") from None
        raise _user_code_error(e, f"importing {p}") from None


def load_programs(path: str, kernel: str | None = None,
                  consts: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
    """The ``(name, TileProgram)`` pairs defined by a kernel file or IR file;
    ``consts`` overrides compile-time constants of the kernels of a ``.py``
    file (``Kernel.specialize``)."""
    p = Path(path)
    userfiles.regular_file(p, "kernel or IR file",
                           hint="give a .py kernel file, a .tile or a .json file")
    if p.suffix == ".py":
        from .frontend.kernel import Kernel

        spec = importlib.util.spec_from_file_location(f"_tilenest_user_{p.stem}", p)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(p.parent.resolve()))
        try:
            _exec_user_module(spec.loader, mod, p)
        finally:
            sys.path.pop(0)
        kernels = [(n, k) for n, k in vars(mod).items() if isinstance(k, Kernel)]
        if kernel is not None:
            kernels = [(n, k) for n, k in kernels if n == kernel]
            if not kernels:
                raise UsageError(f"--kernel {kernel}: {path} defines no kernel named "
                                 f"'{kernel}'", hint="kernels: " + ", ".join(
                                     n for n, k in vars(mod).items() if isinstance(k, Kernel)))
        if not kernels:
            raise TilenestError(f"{path} defines no @tn.kernel",
                                hint="decorate a function with @tn.kernel")
        if consts:
            kernels = [(n, k.specialize(**consts)) for n, k in kernels]
        return [(n, k.program) for n, k in kernels]
    if consts:
        raise TilenestError(f"--const sets compile-time constants of a Python kernel; {path} "
                            "is TileIR, whose constants are already bound",
                            hint="drop --const, or give the .py file")
    from .semantics.loading import load_module_file

    module = load_module_file(p)  # read, parsed and verified
    if kernel is not None:
        return [(kernel, module.single(kernel, str(p)))]
    if len(module) == 1:
        return [(p.stem, module.kernels[0])]
    return [(k.name, k) for k in module]


def cmd_show(a: argparse.Namespace) -> int:
    """The kernels as one TileIR module (text or JSON) that parses back."""
    from .semantics.module import TileModule

    module = TileModule(tuple(p for _, p in load_programs(a.file, a.kernel)))
    if a.json:
        from .semantics.jsonio import to_json_module

        print(json.dumps(to_json_module(module), indent=2))
    else:
        print(str(module), end="")
    return 0


_ARG_HINT = "give a .npy file, a number (scalars), zeros:AxB or random:AxB[:seed] (tensors)"
_SHAPE = re.compile(r"(?:\d+(?:x\d+)*)?")


def _parse_arg(spec: str, value: Any) -> Any:
    """A call argument from the command line: a ``.npy`` file, a number (for a
    scalar), or ``zeros:4x8`` / ``random:4x8[:seed]`` (dtype from the kernel's
    signature; an empty shape ``zeros:`` is a 0-d tensor). Anything else, or a
    form that does not fit the parameter, is a usage error naming the
    parameter."""
    import numpy as np

    from .semantics.types import TensorType

    t = value.type
    where = f"argument '{value.name}'"
    is_tensor = isinstance(t, TensorType)
    if spec.endswith(".npy"):
        if not is_tensor:
            raise UsageError(f"{where} is a scalar of {t.dtype}; {spec!r} is a tensor file",
                                hint="give a number")
        arr = userfiles.load_npy(spec, where)
        if not isinstance(arr, np.ndarray):
            raise UsageError(f"{where}: {spec} holds no single array", hint="use numpy.save")
        return arr
    kind, colon, rest = spec.partition(":")
    if colon and kind in ("zeros", "random"):
        if not is_tensor:
            raise UsageError(f"{where} is a scalar of {t.dtype}, not a tensor",
                                hint="give a number")
        shape_s, _, seed_s = rest.partition(":")
        if not _SHAPE.fullmatch(shape_s):
            raise UsageError(f"{where}: bad shape {shape_s!r} in {spec!r}",
                                hint="a shape is non-negative integers joined by 'x', e.g. 4x8")
        shape = tuple(int(x) for x in shape_s.split("x")) if shape_s else ()
        if len(shape) != len(t.shape):
            raise UsageError(f"{where} has rank {len(t.shape)}; {spec!r} has rank "
                                f"{len(shape)}", hint=_ARG_HINT)
        # random draws 64-bit values before converting them
        userfiles.check_array_size(f"{where} ({spec})", shape,
                                   max(8, t.dtype.itemsize) if kind == "random"
                                   else t.dtype.itemsize)
        if kind == "zeros":
            if seed_s:
                raise UsageError(f"{where}: zeros takes no seed ({spec!r})",
                                    hint="zeros:AxB, or random:AxB:SEED")
            return np.zeros(shape, dtype=t.dtype.np)
        if seed_s and not seed_s.isdigit():
            raise UsageError(f"{where}: the seed in {spec!r} is not a non-negative integer",
                                hint="random:AxB:SEED, e.g. random:4x8:7")
        rng = np.random.default_rng(int(seed_s) if seed_s else 0)
        if t.dtype.is_float:
            return rng.standard_normal(shape).astype(t.dtype.np)
        if t.dtype.is_bool:
            return rng.random(shape) < 0.5
        return rng.integers(0, 10, shape).astype(t.dtype.np)
    if is_tensor:
        raise UsageError(f"cannot read {where} (a tensor of {t.dtype}) from {spec!r}",
                            hint=_ARG_HINT)
    try:
        if t.dtype.is_bool:
            if spec.lower() not in ("true", "false", "1", "0"):
                raise ValueError(spec)
            return spec.lower() in ("true", "1")
        if t.dtype.is_float:
            return float(spec)
        return int(spec, 0)
    except ValueError:
        raise UsageError(f"cannot read {where} (a scalar of {t.dtype}) from {spec!r}",
                            hint="give a number of that type") from None


def _write_outputs(out_dir: Path, arrays: dict[str, Any]) -> dict[str, dict]:
    """Save each array as ``out_dir/NAME.npy``; a directory that cannot be made
    or written is a user error naming ``--out-dir``."""
    import numpy as np

    report = {}
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for n, arr in arrays.items():
            path = out_dir / f"{n}.npy"
            np.save(path, arr)
            report[n] = {"path": str(path), "shape": list(arr.shape), "dtype": str(arr.dtype)}
    except OSError as e:
        raise UsageError(f"--out-dir {out_dir}: cannot write outputs there "
                         f"({e.strerror or e}{': ' + str(e.filename) if e.filename else ''})",
                         hint="give a directory that exists or can be created") from None
    return report


def cmd_run(a: argparse.Namespace) -> int:
    from .interpreter import interpret

    progs = load_programs(a.file, a.kernel)
    if len(progs) != 1:
        raise UsageError(f"{a.file} defines {len(progs)} kernels; choose one with --kernel",
                            hint="kernels: " + ", ".join(n for n, _ in progs))
    name, p = progs[0]
    if len(a.args) != len(p.args):
        raise UsageError(f"kernel {name} takes {len(p.args)} arguments "
                         f"({', '.join(v.name for v in p.args)}), got {len(a.args)}",
                         hint="one ARG per kernel argument, in order")
    args = [_parse_arg(s, v) for s, v in zip(a.args, p.args, strict=True)]
    params = dict(a.param or [])
    unknown = sorted(set(params) - set(p.syms))
    if unknown:
        raise UsageError(f"--param {unknown[0]}: kernel {name} has no symbol '{unknown[0]}'",
                         hint="its symbols: " + (", ".join(p.syms) or "none"))
    interpret(p, *args, params=params, schedule=a.schedule, fast=a.fast, poison=a.poison)
    stored = stored_tensors(p)
    report = _write_outputs(Path(a.out_dir), {v.name: arr for v, arr in
                                              zip(p.args, args, strict=True) if v.name in stored})
    if a.json:
        print(json.dumps({"kernel": name, "outputs": report}, indent=2))
    else:
        for n, r in report.items():
            print(f"{n}: {r['dtype']}{r['shape']} -> {r['path']}")
    return 0


def _add_lowering_obligations(report: Any, program: Any, target: str,
                              fields: dict[str, Any]) -> None:
    """Append to ``report`` the obligations of ``program``'s SIMT lowering
    for ``target`` under its default schedule with ``fields`` set (``--set``;
    ``backends.cuda.
    lowering_obligations``: resources, barrier sufficiency, the bulk copies'
    ``tma.*``, coverage, tree placement), titled ``[cuda lowering]``; a
    program the lowering refuses gets a note saying why."""
    from .backends import cuda
    from .lowering import default_schedule

    try:
        *_, res, simt = cuda.lowering_obligations(program,
                                                  default_schedule(program, target, **fields))
    except TilenestError as e:
        report.notes.append(f"the {target} lowering: {e.message}")
        return
    for o in res:  # what only some sizes break: checked at each launch, never a verdict
        o.role = "evidence"
        o.title = f"[{target} lowering, launch precondition] {o.title}"
    for o in simt:
        o.title = f"[{target} lowering] {o.title}"
    report.obligations.extend(res + simt)


def cmd_check(a: argparse.Namespace) -> int:
    """``tilenest check``: exit 0 when every required obligation is proved (or
    assumed), 5 when one is refuted, 6 when one is unknown and none is refuted
    (1 a user error in the input, 2 a usage error). ``--json`` follows spec/obligations.md. ``--sarif FILE``
    also writes the verdicts as a SARIF 2.1.0 log (:mod:`tilenest.sarif`); the
    printed report and the exit status are the same with or without it."""
    from .proofs.report import check

    if a.set_fields and (a.target != "cuda" or a.transform):
        raise UsageError("check --set states a cuda schedule whose lowering is checked: it "
                         "needs --target cuda and the program as written (no --transform)",
                         hint="tilenest check FILE --target cuda --set tma=True")
    if a.sarif is not None:
        from . import sarif

        sarif.check_destination(a.sarif)  # before a long check, not after it
    try:
        progs = load_programs(a.file, a.kernel)
        reports = [check(p, a.transform or (), a.target, timeout=a.timeout,
                         assume=a.assume or (), engine=a.engine, debug=a.debug)
                   for _, p in progs]
        if a.set_fields:
            for (_, p), r in zip(progs, reports, strict=True):
                _add_lowering_obligations(r, p, a.target, dict(a.set_fields))
    except Exception as e:
        if a.sarif is not None:  # a log that says the check stopped, not a stale or no file
            try:
                sarif.write(sarif.document([], a.file, error=e), a.sarif)
            except TilenestError as w:
                print(f"warning: {w.message}", file=sys.stderr)
        raise
    if a.json:
        out = [r.to_json() for r in reports]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2))
    else:
        print("\n\n".join(r.table(a.verbose) for r in reports))
    for sel in a.assume or ():  # a selector that took nothing as an axiom is likely a typo
        if not any(o.matches(sel) for r in reports for o in r.obligations):
            print(f"warning: --assume {sel!r} matched no obligation", file=sys.stderr)
    codes = [r.exit_status for r in reports]
    status = EXIT_REFUTED if EXIT_REFUTED in codes else (
        EXIT_UNKNOWN if EXIT_UNKNOWN in codes else 0)
    if a.sarif is not None:
        sarif.write(sarif.document(reports, a.file, exit_status=status), a.sarif)
    return status


def _settable() -> dict[str, type]:
    """Schedule fields ``--set FIELD=VALUE`` may set, with their types
    (``lowering.schedule.settable_fields``: read from the Schedule's own
    annotations)."""
    from .lowering.schedule import settable_fields

    return settable_fields()


def _assignment(kind: str, text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` of a ``--const``/``--set`` option: the name and the
    value (a Python literal -- number, bool, quoted string -- or else the
    bare text as a string)."""
    import ast

    name, eq, value = text.partition("=")
    if not eq or not name.strip().isidentifier():
        what = "FIELD" if kind == "--set" else "NAME"
        raise argparse.ArgumentTypeError(f"{kind} {text!r} is not {what}=VALUE")
    try:
        v: Any = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        v = value.strip()
    return name.strip(), v


def _const_arg(text: str) -> tuple[str, Any]:
    return _assignment("--const", text)


def schedule_field_arg(text: str) -> tuple[str, Any]:
    """``FIELD=VALUE`` of a ``--set`` option, checked against
    the settable Schedule fields (an argparse type; also ``benchmarks/cuda.py``'s)."""
    name, v = _assignment("--set", text)
    fields = _settable()
    want = fields.get(name)
    if want is None:
        raise argparse.ArgumentTypeError(
            f"--set {text!r}: no settable schedule field {name!r} (fields: "
            f"{', '.join(fields)})")
    if (want is int and isinstance(v, bool)) or not isinstance(v, want):
        kind = {int: "an integer", bool: "True or False", str: "a name"}[want]
        raise argparse.ArgumentTypeError(f"--set {text!r}: {name} takes {kind}, not {v!r}")
    from .lowering.schedule import value_problem

    why = value_problem(name, v)
    if why is not None:
        raise argparse.ArgumentTypeError(f"--set {why}")
    if name == "mma_unit":
        from .lowering.mma import MMA_UNITS

        if v not in MMA_UNITS:
            raise argparse.ArgumentTypeError(f"--set mma_unit={v!r}: the units are "
                                             f"{', '.join(MMA_UNITS)}")
    return name, v


def _schedule_for(a: argparse.Namespace, program: Any) -> Any:
    """The target's default schedule with the command line's transforms and
    ``--set`` fields."""
    from .lowering import default_schedule

    s = default_schedule(program, a.target, **dict(getattr(a, "set_fields", None) or ()))
    return s.with_(transforms=tuple(a.transform)) if a.transform else s


def cmd_lower(a: argparse.Namespace) -> int:
    """``tilenest lower``: print one stage of the generated code."""
    from .backends import target

    tgt = target(a.target)
    if a.emit not in tgt.stages():
        raise UsageError(f"--emit {a.emit}: unknown stage '{a.emit}' for target {a.target}",
                            hint="stages: " + ", ".join(tgt.stages()))
    progs = load_programs(a.file, a.kernel, dict(a.const or ()))
    texts = [(n, tgt.emit(p, a.emit, _schedule_for(a, p))) for n, p in progs]
    if a.json:
        print(json.dumps({n: t for n, t in texts}, indent=2))
    else:
        print("\n".join(t for _, t in texts), end="")
    return 0


def _programs_of_files(paths: list[str], kernel: str | None,
                       consts: dict[str, Any]) -> list[tuple[str, Any]]:
    """The kernels of every file in ``paths``, in order (:func:`load_programs`);
    with ``kernel``, that kernel of each file defining it, at least one."""
    if len(paths) == 1:
        return load_programs(paths[0], kernel, consts)
    out: list[tuple[str, Any]] = []
    for path in paths:
        try:
            out += load_programs(path, kernel, consts)
        except UsageError:
            if kernel is None:
                raise
    if not out:
        raise UsageError(f"--kernel {kernel}: none of the {len(paths)} files defines it",
                         hint="name a kernel one of the files defines")
    return out


def cmd_validate(a: argparse.Namespace) -> int:
    """``tilenest validate``: exit 0 when every kernel of the files compared
    some case and every compared case is admitted; 1 on a mismatch, a kernel
    with nothing compared or refused (3 if only for a missing capability)."""
    from .validation.report import run_cli

    progs = _programs_of_files(a.file, a.kernel, dict(a.const or ()))
    if not a.json:
        from .backends import target

        target(a.target)  # an unknown target is a usage error before anything runs
        from .lowering.legality import legality, summary
        from .proofs.obligation import PROVED

        for name, p in progs:  # the compile-time gate's verdicts that are not proofs
            try:
                obs = legality(p, _schedule_for(a, p))
            except TilenestError:
                continue  # the kernel is refused: run_cli reports why, and goes on
            if any(o.status != PROVED and o.role == "required" for o in obs):
                print(f"{name}: {summary(obs)}")
    return run_cli(progs, a, _schedule_for)


def cmd_conformance(a: argparse.Namespace) -> int:
    """``tilenest conformance``: judge an implementation on the suite."""
    from .conformance import main as run_conformance

    return run_conformance(a.suite, a.impl, a.case, a.json_report, a.junit, a.verbose, a.json,
                           a.timeout, a.keep, a.seed, a.backend)


def cmd_campaign(a: argparse.Namespace) -> int:
    """``tilenest campaign``: run (or resume) a seeded campaign on local
    processes or on Ray; print the merged report; exit 1 when it holds a bug."""
    import time

    from . import progress
    from .validation import cluster
    from .validation.campaign import load_state

    c = cluster.make_campaign(a.kind, a.targets, a.cases, a.mutant, a.shrink_secs)
    state = Path(a.state) if a.state else None
    before = len(load_state(state, c.name, a.seed, a.count).records) if state else 0
    t0 = time.perf_counter()
    with progress.bar(f"campaign {a.kind}", total=a.count) as step:
        step(advance=min(before, a.count))
        st = cluster.run(c, a.count, a.seed, state=state, workers=a.workers,
                         ray=a.ray is not None, address=None if a.ray in (None, "") else a.ray,
                         shard=a.shard_size, time_limit=a.time_limit,
                         progress=lambda st, rec: step(f"#{rec['i']} {rec['status']}"))
    rep = cluster.report(c, st)
    rep["run"] = {"new": len(st.records) - before, "wall_secs": round(time.perf_counter() - t0, 1),
                  "on": "ray" if a.ray is not None else "local",
                  "address": a.ray or None, "workers": a.workers}
    if a.json:
        print(json.dumps(rep, indent=2))
    else:
        r = rep["run"]
        print(cluster.render_report(c, rep))
        print(f"  this run: {r['new']} new {c.unit} in {r['wall_secs']} s on "
              f"{'Ray' if r['on'] == 'ray' else 'local processes'}"
              + (f" at {r['address']}" if r["address"] else f" ({r['workers']} workers)"))
    return 1 if rep["bugs"] else 0


def cmd_cache(a: argparse.Namespace) -> int:
    """``tilenest cache info|clear``: the persistent compile cache
    (``tilenest.diskcache``): its folder, bound and contents, or emptied."""
    from . import diskcache as DC

    root = DC.cache_root()
    if a.action == "clear":
        n = DC.clear(root)
        if a.json:
            print(json.dumps({"root": None if root is None else str(root), "deleted": n}))
        else:
            print(f"deleted {n} files from {root}" if root is not None
                  else "the cache is off (TILENEST_CACHE_DIR=off): nothing to clear")
        return 0
    info = DC.usage(root)
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    if root is None:
        print("the cache is off (TILENEST_CACHE_DIR=off)")
        return 0
    mib = lambda n: f"{n / (1 << 20):.1f} MiB"
    bound = mib(info["max_bytes"]) if info["max_bytes"] else "none"
    mode = "shared, read only" if info["shared_read_only"] else "private"
    print(f"compile cache {root} ({mode}): {info['files']} files, {mib(info['bytes'])} "
          f"of at most {bound} (TILENEST_CACHE_MAX)")
    for name, (files, size) in sorted(info["folders"].items()):
        print(f"  {name:<14} {files:>7} files {mib(size):>12}")
    return 0


def _schedule_options(s: argparse.ArgumentParser) -> None:
    """``--const`` and ``--set`` of the commands that compile."""
    s.add_argument("--const", action="append", metavar="NAME=VALUE", type=_const_arg,
                   help="a compile-time constant of the kernel, e.g. bm=128 (repeatable)")
    s.add_argument("--set", action="append", metavar="FIELD=VALUE", type=schedule_field_arg,
                   dest="set_fields",
                   help="a field of the target's schedule, e.g. mma_unit=wgmma, stages=3, "
                        f"block_threads=512 (repeatable; fields: {', '.join(_settable())})")


def _target_arg(text: str) -> str:
    """A code generation target's name (``--target`` of lower and validate):
    an unknown name is a usage error; a known target this machine cannot run
    is reported later, when it is used (exit 3). The targets are the rows of
    the target registry with code generation (``tilenest.targets``); a row
    without it is named as such."""
    from .targets import TARGETS, compiling

    if text not in compiling():
        what = "has no code generation yet" if text in TARGETS else "is not a target"
        raise argparse.ArgumentTypeError(f"no code generation target {text!r}: it {what} "
                                         f"(targets: {', '.join(compiling())})")
    return text


def _compiling_help() -> str:
    """``llvm, cuda``: the targets with code generation, for help texts."""
    from .targets import compiling

    return ", ".join(compiling())


def _int_at_least(lo: int) -> Callable[[str], int]:
    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo:
            raise argparse.ArgumentTypeError(f"{v} is below the least allowed value {lo}")
        return v
    conv.__name__ = f"integer >= {lo}"
    return conv


#: the longest time limit an option takes: a week (the solvers count their
#: budgets in 32-bit milliseconds, and the operating system's timers overflow
#: on far larger ones)
MAX_SECONDS = 7 * 24 * 3600.0


def _positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"{text} seconds: give a finite time > 0")
    if v > MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text} seconds is longer than the longest time "
                                         f"limit, {MAX_SECONDS:.0f} seconds (a week)")
    return v


def _seconds_or_zero(text: str) -> float:
    """A time limit that may be 0 (off)."""
    try:
        if float(text) == 0:
            return 0.0
    except ValueError:
        pass
    return _positive_seconds(text)


def _schedule_arg(text: str) -> Any:
    """``--schedule``: the interpreter's own schedule spelling (one parser)."""
    from .interpreter import parse_schedule

    try:
        return parse_schedule(text)
    except TilenestError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def _param_arg(text: str) -> tuple[str, int]:
    name, eq, value = text.partition("=")
    if not eq or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    try:
        return name, int(value, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name}={value!r}: the value of a symbol is an "
                                         "integer") from None


_SELECTOR = re.compile(r"(?:\*|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*(?:\.\*|\.|\*)?)?"
                       r"(?:@\S+)?")


def _selector_arg(text: str) -> str:
    """An ``--assume`` selector (proofs.obligation.Obligation.matches): ``*``,
    ``KIND``, a kind prefix ending in ``.`` or ``*``, each optionally ``@SITE``."""
    if not text or not _SELECTOR.fullmatch(text) or text == "@":
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a selector: KIND, KIND.* or KIND. (a prefix), *, each "
            "optionally @SITE (e.g. race.storage@gemm.py:30)")
    return text


def _transform_arg(text: str) -> str:
    """A transform spec that parses and names a transform with fitting
    arguments (the check every transform entry point shares:
    :func:`tilenest.proofs.report.validate_spec`)."""
    from .proofs.remap import TransformError
    from .proofs.report import validate_spec

    try:
        validate_spec(text)
    except TransformError as e:
        # not an ArgumentTypeError: the error propagates through argparse as the
        # same TransformError (with the signature as its hint) that Python gets
        raise TransformError(f"--transform {text!r}: {e.message}", e.sites, e.hint,
                             e.notes) from None
    return text


def _blocking_file(p: Path) -> Path | None:
    """The first existing non-directory among ``p``'s ancestors, if any."""
    for q in reversed(p.absolute().parents):
        if q.exists() and not q.is_dir():
            return q
    return None


def _os_checked(check: Callable[[str], str]) -> Callable[[str], str]:
    """An argparse type for a path whose checks ask the file system: a path
    the system refuses to look at (too long, a loop of links) is a usage error
    naming the option's value, not an exception escaping argparse."""
    def conv(text: str) -> str:
        try:
            return check(text)
        except (OSError, ValueError) as e:
            why = getattr(e, "strerror", None) or str(e)
            shown = text if len(text) <= 120 else f"{text[:60]}... ({len(text)} characters)"
            raise argparse.ArgumentTypeError(f"{shown}: {why}") from None
    conv.__name__ = check.__name__
    return conv


@_os_checked
def _out_dir_arg(text: str) -> str:
    p = Path(text)
    bad = _blocking_file(p)
    if (p.exists() and not p.is_dir()) or bad is not None:
        raise argparse.ArgumentTypeError(f"{text}: {bad or p} is a file, not a directory")
    return text


@_os_checked
def _out_file_arg(text: str) -> str:
    p = Path(text)
    if p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory; give a file name")
    bad = _blocking_file(p)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"{text}: {bad} is a file, not a directory")
    if not p.absolute().parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: the directory {p.parent} does not exist")
    return text


@_os_checked
def _suite_dir_arg(text: str) -> str:
    if not Path(text).is_dir():
        why = "not a directory" if Path(text).exists() else "no such directory"
        raise argparse.ArgumentTypeError(f"no conformance suite at {text} ({why})")
    return text


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad command line as a :class:`UsageError` (exit
    status 2, as argparse itself, printed like every other diagnostic and as
    JSON under ``--json``)."""

    def error(self, message: str) -> Any:
        raise UsageError(f"{self.prog}: {message}", hint=f"see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="tilenest", description=__doc__.split("\n\n")[0])
    ap.add_argument("--traceback", action="store_true",
                    help="on an internal error, print the Python traceback (also: "
                         "TILENEST_DEBUG=1)")
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
    s.add_argument("--param", action="append", type=_param_arg, metavar="NAME=VALUE",
                   help="symbolic parameter")
    s.add_argument("--schedule", type=_schedule_arg,
                   help="batched (default) | canonical | reversed | random[:SEED] | exhaustive")
    s.add_argument("--fast", action="store_true", help="BLAS/pairwise orders (still admitted)")
    s.add_argument("--poison", action="store_true", help="report reads of unwritten outputs")
    s.add_argument("--out-dir", default=".", type=_out_dir_arg, help="where outputs are written as NAME.npy")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_run)
    s = sub.add_parser("check", help="state and discharge the proof obligations (exit 0 all "
                       "proved, 1 any refuted, 2 any unknown and none refuted)")
    s.add_argument("file", help="kernel file (.py) or TileIR (.tile/.json)")
    s.add_argument("--kernel", help="only this kernel of a .py file")
    s.add_argument("--transform", action="append", metavar="SPEC", type=_transform_arg,
                   help="a transform applied in order, e.g. 'split(1, 0, 2)', 'tile(1, [2, 2])', "
                        "'bind(1:block, 2:warp)', 'fuse_phases(1)', 'place_reduction(0, 4)'")
    from .targets import catalogue_names

    s.add_argument("--target", choices=catalogue_names(),
                   help="bind the (transformed) nest to this target's scopes (its binding "
                        "catalogue; cpu is the llvm target's)")
    s.add_argument("--json", action="store_true", help="machine-readable report "
                   "(schema tilenest.check/1)")
    s.add_argument("--set", action="append", metavar="FIELD=VALUE", type=schedule_field_arg,
                   dest="set_fields",
                   help="with --target cuda: also check the obligations of the program's SIMT "
                        "lowering under the target's default schedule with this field set, "
                        "e.g. tma=True, stages=4 (repeatable; the program as written, so not "
                        "with --transform)")
    s.add_argument("--timeout", type=_positive_seconds, default=5.0, help="seconds per query (default 5)")
    s.add_argument("--assume", action="append", metavar="SEL", type=_selector_arg,
                   help="take obligations matching KIND[@SITE] as axioms (reported as assumed)")
    s.add_argument("--engine", choices=("auto", "isl", "z3"), default="auto")
    s.add_argument("--debug", action="store_true",
                   help="re-check the program obligations after every rewrite")
    s.add_argument("--verbose", "-v", action="store_true", help="print every statement")
    s.add_argument("--sarif", metavar="FILE",
                   help="also write the verdicts as a SARIF 2.1.0 log for code-scanning "
                        "dashboards (refuted: error, unknown: warning; proved ones omitted)")
    s.set_defaults(fn=cmd_check)
    s = sub.add_parser("lower", help="print the code a kernel lowers to (one stage)")
    s.add_argument("file", help="kernel file (.py) or TileIR (.tile/.json)")
    s.add_argument("--kernel", help="only this kernel of a .py file")
    s.add_argument("--target", default="llvm", type=_target_arg,
                   help=f"code generation target ({_compiling_help()})")
    s.add_argument("--emit", default="loopir",
                   help="stage: schedule | tileir | loopir | fused | ir | opt | asm "
                        "(fused: llvm only)")
    s.add_argument("--transform", action="append", metavar="SPEC", type=_transform_arg,
                   help="a schedule transform applied first, e.g. 'split(1, 0, 4)'")
    _schedule_options(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_lower)
    s = sub.add_parser("validate", help="translation validation of a compiled kernel against "
                       "the reference (exit 1 on any mismatch)")
    s.add_argument("file", nargs="+",
                   help="kernel files (.py) or TileIR (.tile/.json), e.g. examples/*.py")
    s.add_argument("--kernel", help="only this kernel of each .py file that defines it")
    s.add_argument("--target", default="llvm", type=_target_arg,
                   help=f"code generation target ({_compiling_help()})")
    s.add_argument("--cases", type=_int_at_least(1), default=20,
                   help="generated cases per kernel (default 20)")
    s.add_argument("--seed", type=_int_at_least(0), default=0)
    s.add_argument("--limit", type=_int_at_least(1), default=None,
                   help="largest generated extent (default: three tiles and a ragged tail of "
                        "the kernel's largest tile, at least 200)")
    s.add_argument("--accept-unreached", action="store_true",
                   help="pass even when the kernel's assumptions keep a required size path "
                        "(three tiles and a ragged tail) out of reach; the report still names it")
    s.add_argument("--transform", action="append", metavar="SPEC", type=_transform_arg,
                   help="a schedule transform applied first, e.g. 'split(1, 0, 4)'")
    _schedule_options(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_validate)
    s = sub.add_parser("conformance", help="run the conformance suite (spec/conformance) on the "
                       "interpreter, a backend, or an external implementation; exit 1 if a "
                       "case fails")
    s.add_argument("--suite", type=_suite_dir_arg, help="suite folder (default: the suite tilenest carries)")
    s.add_argument("--impl", metavar="CMD",
                   help="external implementation: a command with {case} {inputs} {outputs} "
                        "(shell-quoted inside an 'sh -c' script; spec/conformance/README.md)")
    s.add_argument("--target", "--backend", dest="backend", metavar="TARGET",
                   help=f"a compiled target instead of the interpreter ({_compiling_help()})")
    s.add_argument("--case", action="append", default=[], metavar="PAT",
                   help="only cases whose name contains PAT, or that cite rule PAT (V-7, R)")
    s.add_argument("--json-report", metavar="PATH", type=_out_file_arg, help="write the JSON report here")
    s.add_argument("--junit", metavar="PATH", type=_out_file_arg, help="write a JUnit XML report here")
    s.add_argument("--timeout", type=_positive_seconds, default=120.0,
                   help="seconds per external case")
    s.add_argument("--keep", metavar="DIR", type=_out_dir_arg, help="keep each external case's inputs/outputs here")
    s.add_argument("--seed", type=_int_at_least(0), default=1, help="the interpreter's random schedule seed")
    s.add_argument("--verbose", "-v", action="store_true", help="a row per case")
    s.add_argument("--json", action="store_true", help="print the JSON report instead")
    s.set_defaults(fn=cmd_conformance)
    s = sub.add_parser("campaign", help="a seeded, resumable fuzz campaign on local worker "
                       "processes or a Ray cluster (exit 1 on any bug)")
    s.add_argument("kind", choices=("fuzz", "text"),
                   help="fuzz: random programs, interpreter vs compiled targets; "
                        "text: mutated TileIR text and JSON through the readers")
    s.add_argument("--count", type=_int_at_least(1), required=True,
                   help="items in the campaign (0 .. N-1)")
    s.add_argument("--seed", type=_int_at_least(0), required=True, help="campaign seed")
    s.add_argument("--state", metavar="FILE", type=_out_file_arg,
                   help="JSON-lines state file: resumed if it exists, every item recorded")
    s.add_argument("--targets", metavar="T[:K],...",
                   help="fuzz targets, e.g. llvm,cuda:50 (cuda, on the emulated device, on "
                        f"every 50th program); default llvm; targets: {_compiling_help()}")
    s.add_argument("--workers", type=_int_at_least(1), default=1,
                   help="worker processes, or the CPUs of a local Ray cluster (default 1)")
    s.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="run on Ray: a local cluster of --workers CPUs, or the cluster at "
                        "ADDRESS (HOST:6379 of 'ray start --head')")
    s.add_argument("--shard-size", type=_int_at_least(1), metavar="K",
                   help="items per task (default 8 programs, 100 text inputs)")
    s.add_argument("--cases", type=_int_at_least(1), default=2,
                   help="generated cases per program (default 2)")
    s.add_argument("--time-limit", type=_positive_seconds, default=120.0,
                   help="processor seconds an item may take (default 120)")
    s.add_argument("--shrink-secs", type=_seconds_or_zero, default=60.0,
                   help="processor seconds to shrink a failure, on its worker (0: off)")
    s.add_argument("--mutant", metavar="KIND",
                   help="compile llvm with a deliberate bug (flip_index, drop_tail_guard, "
                        "reorder_fold, drop_reduce_seed): a self-test of the campaign")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(fn=cmd_campaign)
    s = sub.add_parser("cache", help="show or clear the persistent compile cache")
    s.add_argument("action", choices=("info", "clear"),
                   help="info: where it is, its bound and what each folder holds; "
                        "clear: delete every entry")
    s.add_argument("--json", action="store_true", help="print the information as JSON")
    s.set_defaults(fn=cmd_cache)
    from . import bench

    s = sub.add_parser("bench", help="run the benchmarks (ratios to baselines timed in the "
                       "same run)")
    bench.add_arguments(s)
    s.set_defaults(fn=bench.run)
    return ap


def _classify(e: BaseException) -> TilenestError:
    """An exception no handler turned into a diagnostic: the user's when the
    innermost frame is the user's own code (or it is a recursion that runs
    through the user's code), otherwise an internal error of tilenest, located
    at tilenest's innermost frame."""
    frames = _frames(e.__traceback__)
    user = [f for f in frames if _is_user_file(f.filename)]
    if user and (frames[-1] is user[-1] or isinstance(e, RecursionError)):
        return _user_code_error(e, "the kernel's Python code")
    own = [f for f in frames if not _is_user_file(f.filename)
           and not f.filename.startswith("<")
           and (Path(f.filename).resolve() == _PACKAGE_DIR
                or _PACKAGE_DIR in Path(f.filename).resolve().parents)]
    site = None
    if own:
        f = own[-1]
        rel = Path(f.filename).resolve().relative_to(_PACKAGE_DIR.parent)
        site = Site(str(rel), f.lineno or 0)
    notes = [f"while running your code at {_site_of(user[-1])}"] if user else []
    return InternalError(
        f"tilenest failed unexpectedly: {type(e).__name__}: {e}", site,
        "this is a bug in tilenest, not in your input; please report it with the command "
        "line and its input files (set TILENEST_DEBUG=1 or pass --traceback before the "
        "subcommand to print the Python traceback)", tuple(notes))


def _quiet_stdout() -> None:
    """After a broken pipe (``tilenest show ... | head``): point stdout at
    devnull so that the interpreter's final flush does not fail again (the
    recipe of the Python documentation, "Note on SIGPIPE")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a descriptor (in tests)
        pass


def _report(e: TilenestError, a: argparse.Namespace | None) -> None:
    """Print ``e`` (JSON on stdout in ``--json`` mode); a diagnostic that names
    no site and not the input file gets a note naming the file."""
    f = getattr(a, "file", None)
    if f and not e.sites and not isinstance(e, (InternalError, UsageError)) \
            and not any(f in t for t in (e.message, *e.notes)):
        e.notes = (*e.notes, f"while reading {f}")
    if a is not None and getattr(a, "json", False) and not isinstance(e, UsageError):
        print(json.dumps({"error": e.to_json()}, indent=2))
    else:
        print(e.render(), file=sys.stderr)


class OutputError(Exception):
    """Writing the command's output to standard output failed: ``cause`` is
    the system's error, None when standard output is closed."""

    def __init__(self, cause: OSError | None):
        self.cause = cause
        super().__init__(self.reason)

    @property
    def reason(self) -> str:
        if self.cause is None:
            return "standard output is closed"
        if isinstance(self.cause, BrokenPipeError):
            return "broken pipe (the reading end is closed)"
        return self.cause.strerror or str(self.cause)


class _GuardedOutput:
    """Standard output for one command: a failed write or flush (a broken
    pipe, a full device, a closed descriptor) becomes an :class:`OutputError`,
    which :func:`main` reports as one line, so that no I/O failure is mistaken
    for a bug of tilenest."""

    def __init__(self, stream: Any):
        self._stream = stream

    def write(self, text: str) -> int:
        if self._stream is None:
            raise OutputError(None)
        try:
            return self._stream.write(text)
        except OSError as e:
            raise OutputError(e) from None

    def flush(self) -> None:
        if self._stream is None:
            return
        try:
            self._stream.flush()
        except OSError as e:
            raise OutputError(e) from None

    def isatty(self) -> bool:
        return self._stream is not None and self._stream.isatty()

    def __getattr__(self, name: str) -> Any:
        if self._stream is None:
            raise AttributeError(name)
        return getattr(self._stream, name)


def _check_cwd() -> None:
    """A working directory that was deleted under the command is the user's
    environment to fix, said before anything else fails on it."""
    try:
        os.getcwd()
    except OSError as e:
        raise TilenestError(f"the working directory cannot be read ({e.strerror or e}): it "
                            "was deleted or its permissions changed",
                            hint="cd to an existing directory and run the command again"
                            ) from None


def _run(argv: list[str], show_traceback: bool) -> int:
    """Parse and run one command; map every outcome to its exit status."""
    a: argparse.Namespace | None = None
    parsing = False  # an error raised while the command line is read is a usage error
    try:
        _check_cwd()
        ap = build_parser()
        parsing = True
        a, extra = ap.parse_known_args(argv)
        if extra and a.cmd == "run" and not any(x.startswith("--") for x in extra):
            a.args = [*a.args, *extra]  # ``run FILE --kernel K ARG...``: ARGs after options
        elif extra:
            opts = [x for x in extra if x.startswith("-")] or extra
            ap.error(f"unrecognized arguments: {' '.join(opts)}")
        show_traceback |= a.traceback
        parsing = False
        status = a.fn(a)
        sys.stdout.flush()  # inside the try: a closed pipe is reported here
        return status
    except OutputError:
        raise
    except NotAvailableError as e:
        _report(e, a)
        return EXIT_NOT_AVAILABLE
    except UsageError as e:
        _report(e, a)
        return EXIT_USAGE
    except InternalError as e:  # a bug that a subcommand already diagnosed as one
        _report(e, a)
        return EXIT_INTERNAL
    except TilenestError as e:
        _report(e, a)
        return EXIT_USAGE if parsing else EXIT_USER_ERROR
    except SyntaxError as e:
        where = ":".join(str(x) for x in (e.filename or getattr(a, "file", None) or "<input>",
                                          e.lineno, e.offset) if x is not None)
        print(f"error: Python syntax error in {where}: {e.msg}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit:  # --help, --version: argparse's own exit
        raise
    except BaseException as e:  # noqa: BLE001 - the last line of defence, classified below
        err = _classify(e)
        _report(err, a)
        if isinstance(err, UserCodeError):
            return EXIT_USER_ERROR
        if show_traceback:
            traceback.print_exception(e, file=sys.stderr)
        return EXIT_INTERNAL


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the exit status (see the module docstring)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    show_traceback = os.environ.get("TILENEST_DEBUG", "") not in ("", "0")
    saved = sys.stdout
    sys.stdout = _GuardedOutput(saved)  # type: ignore[assignment]
    try:
        return _run(argv, show_traceback)
    except OutputError as e:
        _quiet_stdout()
        print(f"error: cannot write the output: {e.reason}", file=sys.stderr)
        return EXIT_IO
    finally:
        sys.stdout = saved


if __name__ == "__main__":
    sys.exit(main())
