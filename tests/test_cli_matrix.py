"""The command line's bad-input matrix: for every subcommand, bad inputs (a
file that cannot be read, a kernel module that raises, an option out of its
range, an argument spec that does not parse, a path that cannot be written)
each give a located one-line error and exit status 1 -- never a Python
traceback. An exception of tilenest itself is an internal error (exit 70)
that asks for a report, with the traceback only on request."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tilenest import cli
from tilenest.cli import EXIT_INTERNAL, main

ROOT = Path(__file__).resolve().parent.parent
SOFTMAX = str(ROOT / "examples" / "softmax.py")

FILES = {
    "bin.tile": b"\x80\x81\xff kernel",
    "bin.json": b'{"schema": "\xff"}',
    "bad.json": b'{"schema": ',
    "nul.py": b"import tilenest\x00\n",
    "raise.py": b'import tilenest as tn\nx = 1\nraise ValueError("boom")\n',
    "badann.py": (b"import tilenest as tn\n\n@tn.kernel\n"
                  b"def k(x: tn.Tensor[tn.f32], y: tn.Tensor[tn.f32, 1]):\n    pass\n"),
    "rec.py": b"""import tilenest as tn
from tilenest import f32

def f(t, n):
    return f(t + 1.0, n - 1)

@tn.kernel
def k(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        t = x[tn.coord(p.index()), tn.shape(1)]
        y(tn.coord(p.index()), tn.shape(1)).store(f(t, 10))
""",
    "deep.py": (b"import tilenest as tn\nv = 1\nw = " + b"(" * 5000 + b"v" + b")" * 5000
                + b"\n"),
    "nokernel.py": b"import tilenest as tn\nx = 1\n",
    "helper_asserts.py": b"""import tilenest as tn
from tilenest import f32

def helper(t):
    assert False, "helper refuses"

@tn.kernel
def k(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    for p in tn.parallel(tn.shape(1)):
        y(tn.coord(0), tn.shape(1)).store(helper(x[tn.coord(0), tn.shape(1)]))
""",
    "serial2.py": b"""import tilenest as tn
from tilenest import f32

@tn.kernel
def k(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for s in tn.serial(tn.shape(n)):
        y(tn.coord(s.index()), tn.shape(1)).store(x[tn.coord(s.index()), tn.shape(1)])
    for s in tn.serial(tn.shape(n)):
        y(tn.coord(s.index()), tn.shape(1)).store(x[tn.coord(s.index()), tn.shape(1)])
""",
    "fake.npy": b"not an array",
    "afile": b"",
}


@pytest.fixture(scope="module")
def d(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_matrix")
    for name, data in FILES.items():
        (root / name).write_bytes(data)
    (root / "adir").mkdir()
    (root / "adir.py").mkdir()
    np.save(root / "x45.npy", np.zeros((4, 5), np.float32))
    return root


# (id, argv with {d} for the fixture folder, expected exit status, substrings of the message)
MATRIX = [
    # -- show
    ("show-missing", "show {d}/nope.tile", 2, ["no such file", "nope.tile"]),
    ("show-dir", "show {d}/adir", 2, ["adir is a directory"]),
    ("show-dir-py", "show {d}/adir.py", 2, ["adir.py is a directory"]),
    ("show-binary-tile", "show {d}/bin.tile", 1, ["not UTF-8", "bin.tile:1:1"]),
    ("show-binary-json", "show {d}/bin.json", 1, ["not UTF-8", "bin.json:1:"]),
    ("show-truncated-json", "show {d}/bad.json", 1, ["malformed JSON", "bad.json"]),
    ("show-nul-py", "show {d}/nul.py", 1, ["null bytes", "nul.py"]),
    ("show-module-raises", "show {d}/raise.py", 1, ["ValueError: boom", "raise.py:3"]),
    ("show-bad-annotation", "show {d}/badann.py", 1, ["Tensor[dtype, rank]", "badann.py:4"]),
    ("show-capture-recursion", "show {d}/rec.py", 1, ["RecursionError", "rec.py:5"]),
    ("show-deep-nesting", "show {d}/deep.py", 1, ["deep.py"]),
    ("show-capture-helper-raises", "show {d}/helper_asserts.py", 1,
     ["AssertionError: helper refuses", "helper_asserts.py:5"]),
    ("show-no-kernel", "show {d}/nokernel.py", 1, ["defines no @tn.kernel"]),
    ("show-unknown-kernel", "show " + SOFTMAX + " --kernel nope", 2, ["no kernel named 'nope'"]),
    ("show-unknown-option", "show " + SOFTMAX + " --bogus", 2, ["--bogus"]),
    ("show-no-file", "show", 2, ["file"]),
    # -- run
    ("run-bad-seed", "run " + SOFTMAX + " random:4x5:xyz zeros:4x5 --out-dir {d}/o", 2,
     ["argument 'x'", "random:4x5:xyz"]),
    ("run-missing-npy", "run " + SOFTMAX + " {d}/missing.npy zeros:4x5", 2,
     ["argument 'x'", "missing.npy"]),
    ("run-fake-npy", "run " + SOFTMAX + " {d}/fake.npy zeros:4x5", 2, ["fake.npy"]),
    ("run-bad-shape", "run " + SOFTMAX + " zeros:4xq zeros:4x5", 2, ["'4xq'"]),
    ("run-negative-shape", "run " + SOFTMAX + " zeros:-4x4 zeros:4x5", 2, ["'-4x4'"]),
    ("run-wrong-rank", "run " + SOFTMAX + " zeros:4 zeros:4x5", 2, ["argument 'x'", "rank"]),
    ("run-number-for-tensor", "run " + SOFTMAX + " 3 zeros:4x5", 2, ["argument 'x'"]),
    ("run-bad-spec", "run " + SOFTMAX + " ones:4x5 zeros:4x5", 2, ["'ones:4x5'"]),
    ("run-arg-count", "run " + SOFTMAX + " zeros:4x5", 2, ["takes 2 arguments"]),
    ("run-param-not-int", "run " + SOFTMAX + " zeros:4x5 zeros:4x5 --param R=abc", 2,
     ["--param", "R="]),
    ("run-param-no-eq", "run " + SOFTMAX + " zeros:4x5 zeros:4x5 --param R", 2, ["--param"]),
    ("run-param-unknown", "run " + SOFTMAX + " zeros:4x5 zeros:4x5 --param Q=3", 2,
     ["--param Q", "no symbol 'Q'"]),
    ("run-schedule-bogus", "run " + SOFTMAX + " zeros:4x5 zeros:4x5 --schedule bogus", 2,
     ["--schedule", "bogus"]),
    ("run-schedule-bad-seed", "run " + SOFTMAX + " zeros:4x5 zeros:4x5 --schedule random:x", 2,
     ["--schedule"]),
    ("run-out-dir-under-file", "run " + SOFTMAX + " zeros:4x5 zeros:4x5 --out-dir {d}/afile/o",
     2, ["--out-dir", "afile is a file"]),
    ("run-out-dir-is-file", "run " + SOFTMAX + " zeros:4x5 zeros:4x5 --out-dir {d}/afile", 2,
     ["--out-dir"]),
    ("run-shape-disagrees", "run " + SOFTMAX + " {d}/x45.npy zeros:4x6 --out-dir {d}/o", 1,
     ["extent C"]),
    ("run-binary-tile", "run {d}/bin.tile", 1, ["not UTF-8"]),
    ("run-unknown-option", "run " + SOFTMAX + " zeros:4x5 --frob zeros:4x5", 2,
     ["unrecognized arguments: --frob"]),
    # -- check
    ("check-fuse-serial", "check {d}/serial2.py --transform fuse_phases(1)", 1,
     ["no parallel level 1"]),
    ("check-timeout-negative", "check " + SOFTMAX + " --timeout -1", 2, ["--timeout"]),
    ("check-timeout-nan", "check " + SOFTMAX + " --timeout nan", 2, ["--timeout"]),
    ("check-timeout-text", "check " + SOFTMAX + " --timeout soon", 2, ["--timeout"]),
    ("check-assume-invalid", "check " + SOFTMAX + " --assume ???", 2, ["--assume", "???"]),
    ("check-assume-empty-site", "check " + SOFTMAX + " --assume race@", 2, ["--assume"]),
    ("check-transform-arity", "check " + SOFTMAX + " --transform split(1)", 2,
     ["--transform", "split(1)"]),
    ("check-transform-unknown", "check " + SOFTMAX + " --transform nope(1)", 2,
     ["--transform", "nope"]),
    ("check-transform-syntax", "check " + SOFTMAX + " --transform split(1,", 2, ["--transform"]),
    ("check-target", "check " + SOFTMAX + " --target gpu", 2, ["--target", "gpu"]),
    ("check-engine", "check " + SOFTMAX + " --engine magic", 2, ["--engine"]),
    ("check-dir", "check {d}/adir", 2, ["adir is a directory"]),
    # -- lower
    ("lower-emit", "lower " + SOFTMAX + " --emit bogus", 2, ["unknown stage 'bogus'"]),
    ("lower-transform", "lower " + SOFTMAX + " --transform frob(2)", 2, ["--transform", "frob"]),
    ("lower-missing", "lower {d}/nope.py", 2, ["no such file"]),
    ("lower-dir", "lower {d}/adir", 2, ["is a directory"]),
    ("lower-module-raises", "lower {d}/raise.py", 1, ["raise.py:3"]),
    ("lower-binary", "lower {d}/bin.tile", 1, ["not UTF-8"]),
    ("lower-target", "lower " + SOFTMAX + " --target tpu", 2, ["no code generation target", "tpu", "cuda"]),
    ("lower-set-unknown-field", "lower " + SOFTMAX + " --set mma_units=wgmma", 2,
     ["--set", "no settable schedule field 'mma_units'", "mma_unit"]),
    ("lower-set-bad-value", "lower " + SOFTMAX + " --set stages=three", 2,
     ["stages takes an integer", "'three'"]),
    ("lower-set-no-eq", "lower " + SOFTMAX + " --set stages", 2, ["not FIELD=VALUE"]),
    ("lower-set-refused-unit", "lower " + SOFTMAX + " --target cuda --set mma_unit=gpu", 2,
     ["mma_unit='gpu'"]),
    ("lower-const-unknown", "lower " + SOFTMAX + " --const bq=3", 1,
     ["no parameter 'bq'", "softmax.py"]),
    ("validate-set-bad-bool", "validate " + SOFTMAX + " --set stage_loads=3", 2,
     ["stage_loads takes True or False"]),
    # -- validate
    ("validate-limit-0", "validate " + SOFTMAX + " --limit 0", 2, ["--limit"]),
    ("validate-cases-0", "validate " + SOFTMAX + " --cases 0", 2, ["--cases"]),
    ("validate-cases-negative", "validate " + SOFTMAX + " --cases -1", 2, ["--cases"]),
    ("validate-cases-text", "validate " + SOFTMAX + " --cases many", 2, ["--cases"]),
    ("validate-seed-negative", "validate " + SOFTMAX + " --seed -3", 2, ["--seed"]),
    ("validate-transform", "validate " + SOFTMAX + " --transform split(", 2, ["--transform"]),
    ("validate-missing", "validate {d}/nope.py", 2, ["no such file"]),
    ("validate-module-raises", "validate {d}/raise.py", 1, ["raise.py:3"]),
    # -- conformance
    ("conformance-json-report-under-file", "conformance --json-report {d}/afile/r.json", 2,
     ["--json-report", "afile is a file"]),
    ("conformance-json-report-dir", "conformance --json-report {d}/adir", 2,
     ["--json-report", "is a directory"]),
    ("conformance-junit-dir", "conformance --junit {d}/adir", 2, ["--junit", "is a directory"]),
    ("conformance-junit-no-parent", "conformance --junit {d}/none/j.xml", 2,
     ["--junit", "does not exist"]),
    ("conformance-suite-missing", "conformance --suite {d}/nosuite", 2,
     ["--suite", "no conformance suite", "no such directory"]),
    ("conformance-suite-file", "conformance --suite {d}/afile", 2, ["--suite"]),
    ("conformance-timeout", "conformance --timeout 0", 2, ["--timeout"]),
    ("conformance-keep-under-file", "conformance --keep {d}/afile/k", 2, ["--keep"]),
    ("conformance-seed", "conformance --seed -1", 2, ["--seed"]),
    ("conformance-impl-and-backend", "conformance --impl x --target llvm", 1,
     ["exclude each other"]),
    ("conformance-no-case", "conformance --suite {d}/adir", 1, ["has no cases"]),
    # -- bench and the top level
    ("bench-only", "bench --only bogus", 2, ["'bogus'", "valid names: read, copy, softmax"]),
    ("bench-samples", "bench --samples 0", 2, ["--samples", "least allowed value 1"]),
    ("bench-size", "bench --size huge", 2, ["--size", "huge"]),
    ("bench-suite", "bench --suite gpu", 2, ["--suite", "gpu"]),
    ("bench-threads", "bench --threads 0", 2, ["--threads"]),
    ("bench-json", "bench --only gemm --json --samples x", 2, ["--samples", "'x'"]),
    ("no-subcommand", "", 2, ["cmd"]),
    ("unknown-subcommand", "frobnicate x", 2, ["frobnicate"]),
    ("top-level-option", "--bogus show x", 2, ["--bogus"]),
]


@pytest.mark.parametrize("argv,status,needles", [m[1:] for m in MATRIX],
                         ids=[m[0] for m in MATRIX])
def test_bad_input(d, capsys, argv, status, needles):
    args = [a.replace("{d}", str(d)) for a in argv.split()]
    rc = main(args)
    out, err = capsys.readouterr()
    text = out + err
    assert "Traceback" not in text, text
    assert rc == status, text
    for n in needles:
        assert n in text, (n, text)
    if "--json" not in args:
        # one diagnostic on stderr: a head line, then only its site/note/hint lines
        lines = err.strip().splitlines()
        assert lines and all(ln.startswith("  ") for ln in lines[1:]), err


def test_every_subcommand_has_five_bad_inputs():
    per: dict[str, int] = {}
    for name, *_ in MATRIX:
        per[name.split("-")[0]] = per.get(name.split("-")[0], 0) + 1
    for cmd in ("show", "run", "check", "lower", "validate", "conformance", "bench"):
        assert per.get(cmd, 0) >= 5, (cmd, per)


def test_run_takes_its_arguments_after_options(d, capsys):
    rc = main(["run", SOFTMAX, "--out-dir", str(d / "o2"), str(d / "x45.npy"), "zeros:4x5"])
    assert rc == 0, capsys.readouterr().err
    assert (d / "o2" / "y.npy").exists()


def test_json_mode_reports_the_error_as_json(d, capsys):
    rc = main(["show", str(d / "bin.tile"), "--json"])
    out = capsys.readouterr().out
    assert rc == 1
    e = json.loads(out)["error"]
    assert "not UTF-8" in e["message"] and e["sites"] == [f"{d}/bin.tile:1:1"]


# ---------------------------------------------------------------------------
# internal errors


def test_internal_error_asks_for_a_report(monkeypatch, capsys):
    # a stand-in for a bug of tilenest: a helper of the CLI handed the wrong object
    monkeypatch.setattr(cli, "cmd_show", functools.partial(cli._blocking_file))
    monkeypatch.delenv("TILENEST_DEBUG", raising=False)
    rc = main(["show", SOFTMAX])
    err = capsys.readouterr().err
    assert rc == EXIT_INTERNAL == 70
    assert err.startswith("internal error: tilenest failed unexpectedly: AttributeError")
    assert "--> tilenest/cli.py:" in err  # tilenest's own innermost frame
    assert "bug in tilenest" in err and "report" in err and "Traceback" not in err
    rc = main(["--traceback", "show", SOFTMAX])
    err = capsys.readouterr().err
    assert rc == 70 and "Traceback" in err and "_blocking_file" in err
    monkeypatch.setenv("TILENEST_DEBUG", "1")
    rc = main(["show", SOFTMAX])
    assert rc == 70 and "Traceback" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# through a real process


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tilenest.cli", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw)


def test_output_into_a_closed_pipe_is_one_io_error_line():
    """``tilenest show ... | head``: the reader is gone before the output is
    written; the process ends with one line saying so (exit 74), without a
    BrokenPipeError traceback."""
    p = _cli("show", "--json", str(ROOT / "examples" / "gemm.py"))
    p.stdout.close()  # the reader goes away at once
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert err.strip().splitlines() == ["error: cannot write the output: broken pipe (the "
                                        "reading end is closed)"], err
    assert p.returncode == 74


def test_subprocess_module_error_and_usage_error(d):
    p = _cli("show", str(d / "raise.py"))
    _, err = p.communicate(timeout=120)
    assert p.returncode == 1 and b"Traceback" not in err and b"raise.py:3" in err
    p = _cli("validate", SOFTMAX, "--cases", "-1")
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2 and b"--cases" in err and b"Traceback" not in err


# ---------------------------------------------------------------------------
# the same mistakes through the Python API: located TilenestErrors


def test_bad_annotations_are_located_capture_errors(tmp_path, capsys):
    import tilenest as tn
    from tilenest.errors import CaptureError

    with pytest.raises(CaptureError, match="needs a dtype and a rank") as ei:
        _ = tn.Tensor[tn.f32]
    assert ei.value.sites and ei.value.sites[0].file == __file__
    with pytest.raises(CaptureError, match="rank 1.5"):
        _ = tn.Tensor[tn.f32, 1.5]
    with pytest.raises(CaptureError, match="not a dtype"):
        _ = tn.Tensor["f32", 2]
    with pytest.raises(CaptureError, match="not a dtype"):
        _ = tn.Scalar[3]
    # a string annotation is evaluated at capture: located at the kernel
    src = tmp_path / "strann.py"
    src.write_text("from __future__ import annotations\nimport tilenest as tn\n\n"
                   "@tn.kernel\ndef k(x: tn.Tensor[tn.f32], y: tn.Tensor[tn.f32, 1]):\n"
                   "    pass\n")
    rc = main(["show", str(src)])
    err = capsys.readouterr().err
    assert rc == 1 and "needs a dtype and a rank" in err and "strann.py:4" in err, err


def test_recursion_during_capture_is_a_located_capture_error(d):
    import importlib.util

    from tilenest.errors import CaptureError

    spec = importlib.util.spec_from_file_location("matrix_rec", d / "rec.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    with pytest.raises(CaptureError, match="recursion limit") as ei:
        _ = m.k.program
    e = ei.value
    assert str(e.sites[0]).startswith(f"{d}/rec.py:12")  # the kernel's statement
    assert any("rec.py:5 (f)" in n for n in e.notes)  # where the recursion runs


@pytest.mark.parametrize("sel", ["*", "noninterference", "coverage.*", "coverage.", "layout*",
                                 "race.storage@gemm.py:30", "@gemm.py:30"])
def test_assume_selectors_of_every_documented_form_are_accepted(sel):
    assert cli._selector_arg(sel) == sel


@pytest.mark.parametrize("sel", ["???", "race@", "", ".*", "a..b", "cover age"])
def test_malformed_assume_selectors_are_refused(sel):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="is not a selector"):
        cli._selector_arg(sel)


def test_an_assume_selector_that_matches_nothing_is_warned_about(capsys):
    rc = main(["check", SOFTMAX, "--assume", "no.such.kind"])
    err = capsys.readouterr().err
    assert rc == 0 and "--assume 'no.such.kind' matched no obligation" in err


def test_settable_fields_are_the_schedules_scalar_fields():
    """``--set`` takes every Schedule field of one scalar type, read from the
    Schedule's annotations (a new field needs no second list), and no other."""
    import dataclasses

    from tilenest.cli import schedule_field_arg
    from tilenest.lowering import Schedule
    from tilenest.lowering.schedule import settable_fields

    got = settable_fields()
    assert got["row_registers"] is int and got["cache_hints"] is bool and got["mma_unit"] is str
    assert got["grid_blocks"] is int  # int | None
    for name in ("target", "transforms", "bind", "aliases", "mma_block"):
        assert name not in got
    assert set(got) <= {f.name for f in dataclasses.fields(Schedule)}
    assert schedule_field_arg("row_registers=32") == ("row_registers", 32)
    with pytest.raises(Exception, match="takes an integer"):
        schedule_field_arg("row_registers=True")
