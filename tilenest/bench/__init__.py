"""``tilenest bench``: benchmarks that ship with the package, each reported
against baselines measured in the same run.

Suites (``--suite``):

* ``codegen`` (default) -- kernels compiled for ``--target llvm`` against
  numpy and, when installed, PyTorch CPU (:mod:`tilenest.bench.codegen`);
* ``interpreter`` -- the reference interpreter against numpy
  (:mod:`tilenest.bench.interpreter`);
* ``proofs`` -- the obligation checker, with nest depth 1 as the baseline of
  the growth benchmark (:mod:`tilenest.bench.proofs`).

Timing (:mod:`tilenest.bench.timing`): warm-up calls first, then ``--samples``
samples per function in alternating rounds; the median is reported with the
spread of the samples. A ratio is baseline time / tilenest time (> 1: tilenest
is faster). Each benchmark's result is checked before it is timed; a wrong one
is reported and makes the exit status 1. Benchmarks are measurements, not
tests: nothing here asserts a speed.

Records and the regression guard: ``--json`` prints the run as one document
(schema :data:`SCHEMA`: the suite, size, samples, thread counts, the machine
and software versions, the date, and per row its identity, times and ratios);
``--save FILE`` also writes it to ``FILE``. ``--compare FILE`` matches this
run's rows with those of such a record and flags every row whose ratio fell
by more than ``--max-drop`` (25%) (:mod:`tilenest.bench.compare`); the exit
status is then 4 when some row regressed (1 still wins: a wrong result).

GPU benchmarks need CuPy and PyTorch with CUDA and live in the source tree:
``python benchmarks/cuda.py``; ``--target cuda`` runs that script when it is
there and a GPU is present, and is an error saying so otherwise.

Stability (:mod:`tilenest.bench.timing`): a function whose samples still
vary by more than 10% (interquartile range over the median) is sampled
further, up to as many rounds again; a row that stays that noisy is named in
a warning on standard error after the table, since its ratios are uncertain.

Width: the table fits the terminal (or ``$COLUMNS``; 140 columns when the
output is not a terminal and ``COLUMNS`` is unset): cells wrap, and a narrow
codegen table leaves out its compile-time and bandwidth columns, saying so.
The ``±`` of a spread becomes ``+-`` where the output's encoding lacks it
(``PYTHONIOENCODING=ascii``).

Your own kernel: :func:`do_bench` times any callable (a compiled kernel on
its arrays) against a baseline by the same method
(:mod:`tilenest.bench.dobench`).

The command-line entry points are :func:`add_arguments` and :func:`run`
(``tilenest bench``), and :func:`main` (``python -m tilenest.bench``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import progress
from ..errors import NotAvailableError, TilenestError, UsageError
from . import codegen, compare, interpreter, proofs
from .dobench import BenchResult, do_bench
from .timing import noisy

SCHEMA = "tilenest.bench/1"
#: suite -> (its module, what it measures)
SUITES: dict[str, Any] = {"codegen": codegen, "interpreter": interpreter, "proofs": proofs}
SIZES = ("small", "medium", "large")
#: the source checkout whose ``benchmarks/`` holds the device benchmark scripts
ROOT = Path(__file__).resolve().parents[2]


def targets() -> tuple[str, ...]:
    """The ``--target`` choices: the target the in-process codegen suite
    compiles for, then every target whose registry row names a benchmark
    script (``tilenest.targets``)."""
    from ..targets import TARGETS

    return (codegen.TARGET,) + tuple(n for n, t in TARGETS.items()
                                     if t.compiles and t.bench_script and n != codegen.TARGET)
CUDA_HINT = ("GPU benchmarks run from a source checkout on a machine with an NVIDIA GPU, "
             "CuPy and PyTorch: python benchmarks/cuda.py [--quick] [--only NAME ...]")


def _at_least_one(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v} is below the least allowed value 1")
    return v


def _positive_ms(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of milliseconds") from None
    if not 0 < v < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} ms: give a finite time > 0")
    return v


def _fraction(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"{text}: give a fraction between 0 and 1, "
                                         "e.g. 0.25 for 25%")
    return v


def default_threads() -> list[int]:
    """1, and every core when there are more."""
    return sorted({1, os.cpu_count() or 1})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tilenest bench`` (and ``python -m tilenest.bench``)."""
    parser.description = ("Benchmarks that ship with the package, each reported against "
                          "baselines measured in the same run.")
    parser.epilog = ("ratio = baseline time / tilenest time, baselines measured in the same "
                     "run. " + CUDA_HINT + ".")
    parser.add_argument("--suite", choices=tuple(SUITES), default="codegen",
                        help="codegen: compiled kernels vs numpy/torch (default); interpreter: "
                             "the reference interpreter vs numpy; proofs: the checker")
    from ..targets import row

    scripts = "; ".join(f"{n} runs {row(n).bench_script} of a source checkout, on its device"
                        for n in targets()[1:])
    parser.add_argument("--target", choices=targets(), default=codegen.TARGET,
                        help=f"code generation target of the codegen suite (default "
                             f"{codegen.TARGET}); {scripts}")
    parser.add_argument("--only", nargs="+", metavar="NAME", default=None,
                        help="only these benchmarks of the suite (names or NAME,NAME); "
                             "codegen: " + " ".join(codegen.NAMES) + "; interpreter: "
                             + " ".join(interpreter.NAMES) + "; proofs: "
                             + " ".join(proofs.NAMES))
    parser.add_argument("--samples", type=_at_least_one, default=5, metavar="N",
                        help="timed samples per function (default 5); the median is reported "
                             "with the spread")
    parser.add_argument("--size", choices=SIZES, default="medium",
                        help="problem sizes: small (seconds, a smoke run), medium (default), "
                             "large (4096^2 rows, GEMMs up to 1024^3)")
    parser.add_argument("--threads", type=_at_least_one, nargs="+", default=None,
                        metavar="N", help="codegen: thread counts, each in its own worker "
                                          "process with BLAS pinned (default: 1 and every "
                                          "core)")
    parser.add_argument("--min-calls", type=_at_least_one, default=1, metavar="N",
                        help="codegen: calls per sample at least (default 1)")
    parser.add_argument("--min-sample-ms", type=_positive_ms, default=50.0, metavar="MS",
                        help="codegen: the least duration of one sample, in milliseconds "
                             "(default 50: short kernels are timed in steady state)")
    parser.add_argument("--json", action="store_true",
                        help=f"print the results as JSON (schema {SCHEMA}): the record "
                             "--compare reads")
    parser.add_argument("--save", metavar="FILE",
                        help="also write the results as JSON to FILE (the record --compare "
                             "reads)")
    parser.add_argument("--compare", metavar="FILE",
                        help="compare each row's ratios with those recorded in FILE (from "
                             "--json or --save); exit status 4 when a ratio fell by more "
                             "than --max-drop")
    parser.add_argument("--max-drop", type=_fraction, default=compare.MAX_DROP,
                        metavar="F", help="--compare: the fall of a ratio that is a "
                                          "regression (default 0.25: 25%%)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)


def selected(suite: str, only: Sequence[str] | None) -> tuple[str, ...]:
    """The benchmarks of ``suite`` that ``--only`` names (all when None), in
    the suite's order; an unknown name is an error naming the valid ones."""
    names: tuple[str, ...] = SUITES[suite].NAMES
    if not only:
        return names
    asked = [n for item in only for n in item.split(",") if n]
    bad = [n for n in asked if n not in names]
    if bad:
        raise UsageError(f"no benchmark named {', '.join(map(repr, bad))} in the {suite} "
                            "suite", hint="valid names: " + ", ".join(names))
    return tuple(n for n in names if n in asked)


def _cpu_model() -> str:
    """The processor's marketing name (``/proc/cpuinfo`` on Linux, else what
    :func:`platform.processor` says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str | None:
    """The git commit of a source checkout of tilenest (None when installed)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        r = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                           capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def _environment() -> dict[str, Any]:
    """The machine and software a run was measured on (what ``--compare`` warns about)."""
    import llvmlite
    import numpy as np

    from .. import __version__
    from ..lowering.schedule import host_vector_bits

    env: dict[str, Any] = {"cpu": _cpu_model(), "cpus": os.cpu_count(),
                           "vector_bits": host_vector_bits(),
                           "machine": platform.machine(), "system": platform.system(),
                           "python": platform.python_version(), "numpy": np.__version__,
                           "llvmlite": llvmlite.__version__, "tilenest": __version__,
                           "commit": _commit()}
    try:
        import torch  # type: ignore[import-not-found]

        env["torch"] = torch.__version__
    except ImportError:
        env["torch"] = None
    return env


def _script(args: argparse.Namespace) -> int:
    """``--target T`` of a device target: run the benchmark script its
    registry row names (from the source tree), or say why not."""
    from ..targets import row

    tgt = row(args.target)
    assert tgt.bench_script is not None
    if not tgt.load().device_available():
        raise NotAvailableError(f"{args.target} benchmarks need its device; none is available "
                                "here", hint=CUDA_HINT)
    script = ROOT / tgt.bench_script
    if not script.exists():
        raise NotAvailableError(f"the {args.target} benchmarks are not installed with the "
                                "package", hint=CUDA_HINT)
    cmd = [sys.executable, str(script), "--samples", str(args.samples)]
    if args.size != "large":
        cmd.append("--quick")
    if args.only:
        cmd += ["--only", *[n for item in args.only for n in item.split(",") if n]]
    return subprocess.run(cmd, check=False).returncode


def _script_of(target: str) -> str:
    from ..targets import row

    return row(target).bench_script or ""


def run(args: argparse.Namespace) -> int:
    """Run the suite ``args`` asks for; print a table (or JSON), save the
    record, compare it with a recorded one; exit status 0, 1 when some
    benchmark's result was wrong (it is reported, not timed), else 4 when a
    compared row regressed."""
    if args.worker is not None:  # one thread count of the codegen suite, in its own process
        codegen.worker(args.worker, args.size, args.samples,
                       selected("codegen", args.only), codegen.emit_line, args.min_calls,
                       args.min_sample_ms / 1e3)
        return 0
    if args.target != codegen.TARGET:
        script = _script_of(args.target)
        if args.suite != "codegen":
            raise UsageError(f"--target {args.target} applies to the codegen suite, not "
                             f"{args.suite}")
        if args.compare or args.save:
            raise UsageError("--compare and --save record the CPU suites; "
                             f"{script} keeps its own records",
                             hint=f"run --target {args.target} without --compare and --save")
        return _script(args)
    recorded = compare.load(args.compare, args.suite) if args.compare else None
    names = selected(args.suite, args.only)
    doc: dict[str, Any] = {"schema": SCHEMA, "suite": args.suite, "size": args.size,
                           "samples": args.samples,
                           "date": datetime.datetime.now(datetime.timezone.utc)
                           .isoformat(timespec="seconds"),
                           "environment": _environment()}
    if args.suite == "codegen":
        threads = args.threads or default_threads()
        names = codegen.with_ceilings(names)
        doc.update(target=args.target, threads=threads,
                   shapes={n: [codegen.shape_label(s) for s in codegen.shapes(args.size, n)]
                           for n in names})
        con = _console()
        total = codegen.planned(args.size, names) * len(threads)
        with progress.bar("bench codegen", total) as step:
            rows = codegen.run(threads, args.size, args.samples, names, step, args.min_calls,
                               args.min_sample_ms / 1e3)
        rows = doc["benchmarks"] = codegen.attach_bandwidth(rows)
        shown = codegen.table(rows, con.width)
    elif args.suite == "interpreter":
        with progress.bar("bench interpreter", len(names)) as step:
            rows = interpreter.run(args.size, args.samples, names, step)
        doc["benchmarks"] = rows
        shown = interpreter.table(rows)
    else:
        total = len([n for n in names if n != "depth"]) + \
            (proofs.SIZES[args.size] if "depth" in names else 0)
        with progress.bar("bench proofs", total) as step:
            out = proofs.run(args.size, args.samples, names, step)
        doc.update(warmup_s=out["warmup_s"], budget_s=out["budget_s"])
        rows = doc["benchmarks"] = out["rows"]
        shown = proofs.table(out)
    if args.save:
        _save(args.save, doc)
    result = compare.compare(recorded, doc, args.max_drop) if recorded is not None else None
    if args.json:
        print(json.dumps(doc if result is None else {**doc, "comparison": result.to_json()},
                         indent=2))
    else:
        con = _console()
        con.print(shown)
        if result is not None:
            con.print(compare.table(result, args.compare))
            for line in compare.summary(result, args.compare):
                con.print(line, markup=False, highlight=False)
    for w in noisy(rows):
        print(f"warning: {w}", file=sys.stderr)
    if any("error" in r for r in rows):
        return 1
    return compare.EXIT_REGRESSED if result is not None and result.regressed else 0


def _console() -> Any:
    """The console the tables go to: the terminal's width, or ``$COLUMNS``,
    or 140 columns when standard output is not a terminal."""
    from rich.console import Console

    cols = os.environ.get("COLUMNS", "")
    if sys.stdout.isatty() or cols.isdigit():
        return Console()  # rich reads COLUMNS itself
    return Console(width=140)


def _save(path: str, doc: dict[str, Any]) -> None:
    """Write the run's record to ``path``; an unwritable path is the user's error."""
    try:
        Path(path).write_text(json.dumps(doc, indent=2) + "\n")
    except OSError as e:
        raise TilenestError(f"cannot write the benchmark record {path}: {e.strerror}",
                            hint="--save takes the path of a file in a writable folder"
                            ) from None


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tilenest.bench``: the same command outside the ``tilenest`` CLI."""
    ap = argparse.ArgumentParser(prog="python -m tilenest.bench")
    add_arguments(ap)
    a = ap.parse_args(argv)
    try:
        return run(a)
    except NotAvailableError as e:
        print(e.render(), file=sys.stderr)
        return 3
    except TilenestError as e:
        if a.json:
            print(json.dumps({"error": e.to_json()}, indent=2))
        else:
            print(e.render(), file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1


__all__ = ["SCHEMA", "SUITES", "BenchResult", "add_arguments", "do_bench", "main", "run",
           "selected"]
