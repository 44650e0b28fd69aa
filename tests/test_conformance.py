"""The conformance suite (spec/conformance) and its runner (tilenest.conformance,
`tilenest conformance`): coverage of every spec rule, the interpreter passing it,
the external --impl protocol with one correct and two deliberately wrong
implementations, reports, and the runner's handling of broken implementations."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from tilenest import conformance as C

ROOT = Path(__file__).resolve().parent.parent
SUITE = ROOT / "spec" / "conformance"
IMPLS = ROOT / "tests" / "conformance_impls"


def cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tilenest.cli", "conformance", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def impl(script: str) -> str:
    return f"{sys.executable} {IMPLS / script} {{case}} {{inputs}} {{outputs}}"


@pytest.fixture(scope="module")
def cases() -> list[C.Case]:
    return C.load_suite(SUITE)


@pytest.fixture(scope="module")
def interpreter_report(cases) -> C.Report:  # type: ignore[no-untyped-def]
    return C.run_suite(cases, C.Interpreter())


#: spec files whose rules are this implementation's (its targets), not the
#: calculus's: the backends' own tests and the spec examples cover them, the
#: language-neutral conformance suite does not
IMPLEMENTATION_SPECS = ("lowering.md",)


def spec_rules() -> list[str]:
    """The calculus's rules, which the conformance suite must cover."""
    rules = []
    for f in sorted((ROOT / "spec").glob("*.md")):
        if f.name not in IMPLEMENTATION_SPECS:
            rules += re.findall(r"^### ([A-Z]-\d+) ", f.read_text(), re.M)
    return rules


# ------------------------------------------------------------------ the suite itself
def test_suite_has_150_cases_covering_every_rule_both_ways(cases):
    assert len(cases) >= 150
    rules = spec_rules()
    assert len(rules) > 100
    positive = {r for c in cases for r in c.rules if c.verdict == "admitted"}
    negative = {r for c in cases for r in c.rules if c.negative}
    assert [r for r in rules if r not in positive] == []
    assert [r for r in rules if r not in negative] == []
    assert {r for c in cases for r in c.rules} <= set(rules)
    kinds = {c.verdict for c in cases}
    assert {"admitted", "parse", "verify", "type", "contract", "race", "bounds",
            "runtime"} <= kinds
    assert sum(c.wrong is not None for c in cases) >= 30
    assert any(c.program.name.endswith(".tileir.json") for c in cases)


def test_generated_files_match_the_generators():
    r = subprocess.run([sys.executable, str(SUITE / "generate.py"), "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


def test_recipes_are_language_neutral(cases):
    for c in cases:
        d = json.loads(c.recipe.read_text())
        assert d["schema"] == C.SCHEMA and d["program"] == c.program.name
        for a in d["args"]:
            assert set(a) <= {"name", "kind", "dtype", "shape", "fill", "value", "alias"}
        text = c.program.read_text()
        assert "/work/" not in text and "loc(\"/" not in text   # no machine paths


def test_interpreter_passes_the_suite(interpreter_report):
    rep = interpreter_report
    bad = [(r.case.name, r.detail) for r in rep.results if not r.ok]
    assert bad == []
    assert rep.passed >= 150 and rep.ok
    # known gaps of the reference are few and each names what is missing
    gaps = [r for r in rep.results if r.status == "xfail"]
    assert len(gaps) <= 12 and all(r.case.gap for r in gaps)


def test_llvm_backend_passes_the_whole_suite(cases):
    """The compiled target reproduces every verdict: admitted outputs, runtime
    errors, races (refused statically by the legality gate) and broken
    ``assume`` promises (in the checked build the driver uses)."""
    rep = C.run_suite(cases, C.Backend("llvm"))
    bad = [(r.case.name, r.detail) for r in rep.results if not r.ok]
    assert bad == []
    assert rep.passed == len(cases)


def test_wrong_companions_are_rejected(cases):
    """The self-check: each misreading's outputs fall outside the case's oracle."""
    for c in [c for c in cases if c.wrong is not None][:200]:
        exp = C.oracle(c)
        assert exp.admitted is not None, c.name
        assert C.self_check(c, exp) is None, c.name


# --------------------------------------------------------------------------- the CLI
def test_cli_runs_the_suite_and_writes_json_and_junit(tmp_path):
    j, x = tmp_path / "r.json", tmp_path / "r.xml"
    r = cli("--case", "V-9", "--case", "R-8", "--case", "E10", "--json-report", str(j),
            "--junit", str(x))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "tilenest conformance" in r.stdout and "passed" in r.stdout
    rep = json.loads(j.read_text())
    assert rep["summary"]["failed"] == 0 and rep["summary"]["cases"] >= 5
    assert {c["status"] for c in rep["cases"]} == {"pass"}
    assert "V-9" in rep["rules"] and rep["rules"]["V-9"]["negative"] >= 1
    suite = ET.parse(x).getroot().find("testsuite")
    assert suite is not None and int(suite.get("tests")) == rep["summary"]["cases"]
    assert int(suite.get("failures")) == 0


def test_cli_json_output_and_user_errors(tmp_path):
    r = cli("--case", "I-18", "--json")
    assert r.returncode == 0
    assert json.loads(r.stdout)["summary"]["passed"] >= 2
    for args, msg, status in ((("--suite", str(tmp_path / "nope")), "no conformance suite", 2),
                              (("--case", "Q-99"), "no conformance case matches", 1),
                              (("--impl", "echo hello"), "no {case} placeholder", 2),
                              (("--target", "nope"), "no conformance driver", 1)):
        r = cli(*args)
        assert r.returncode == status and msg in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_broken_recipe_is_a_located_error(tmp_path):
    d = tmp_path / "cases" / "values"
    d.mkdir(parents=True)
    (d / "bad.json").write_text('{"schema": "tilenest.conformance/1", "name": ')
    r = cli("--suite", str(tmp_path))
    assert r.returncode == 1 and "bad.json:1:" in r.stderr and "Traceback" not in r.stderr


# ------------------------------------------------------------ external implementations
EXTERNAL_CASES = ("V09-no-fma", "V13-bf16", "R02-source-order-2d", "M08-alias-same",
                  "E10-write-write", "I01-json-form", "R12-tree-body-stores")


def test_external_reference_impl_passes(tmp_path):
    j = tmp_path / "r.json"
    args = [a for c in EXTERNAL_CASES for a in ("--case", c)]
    r = cli(*args, "--impl", impl("reference_impl.py"), "--json-report", str(j))
    assert r.returncode == 0, r.stdout + r.stderr
    rep = json.loads(j.read_text())
    status = {c["name"]: c["status"] for c in rep["cases"]}
    assert len(status) == len(EXTERNAL_CASES)
    assert status["E10-write-write"] == "pass"              # reported its race via error.json
    assert all(s == "pass" for s in status.values())


def test_external_reversed_fold_impl_fails(tmp_path):
    j, x = tmp_path / "r.json", tmp_path / "r.xml"
    r = cli("--case", "R02-source-order-2d", "--case", "R03-fold-left-bitwise", "--case",
            "V01-shared-dim", "--impl", impl("reversed_fold_impl.py"), "--json-report", str(j),
            "--junit", str(x))
    assert r.returncode == 1
    status = {c["name"]: (c["status"], c["detail"]) for c in json.loads(j.read_text())["cases"]}
    assert status["R02-source-order-2d"][0] == "fail"
    assert "bitwise" in status["R02-source-order-2d"][1]
    assert status["R03-fold-left-bitwise"][0] == "fail"
    assert status["V01-shared-dim"][0] == "pass"          # no fold: unaffected
    failures = ET.parse(x).getroot().iter("failure")
    assert len(list(failures)) == 2
    assert "R02-source-order-2d" in r.stdout


def test_external_drop_tail_impl_fails(tmp_path):
    j = tmp_path / "r.json"
    r = cli("--case", "M05-zero-and-fill", "--case", "E13-reverse-order", "--impl",
            impl("drop_tail_impl.py"), "--json-report", str(j))
    assert r.returncode == 1
    rep = json.loads(j.read_text())
    assert rep["summary"]["failed"] == 2
    assert all("bitwise" in c["detail"] for c in rep["cases"])


@pytest.mark.slow
def test_external_reference_impl_passes_the_whole_suite(tmp_path):
    r = cli("--impl", impl("reference_impl.py"))
    assert r.returncode == 0, r.stdout[-3000:]


# ------------------------------------------------------------------- the judge itself
class Canned:
    """An implementation returning one fixed outcome."""

    name = "canned"

    def __init__(self, outcome: C.Outcome):
        self.outcome = outcome

    def run(self, case: C.Case) -> C.Outcome:
        return self.outcome


def _case(cases, name):  # type: ignore[no-untyped-def]
    return next(c for c in cases if c.name == name)


def test_judge_error_expectations(cases):
    c = _case(cases, "E10-write-write")
    exp = C.oracle(c)
    assert exp.error == "race"
    assert C.judge(c, exp, C.Outcome(error="race"))[0] == "pass"
    st, why = C.judge(c, exp, C.Outcome(error="bounds", message="x"))
    assert st == "fail" and "expected a race error, got bounds" in why
    st, why = C.judge(c, exp, C.Outcome({"y": np.zeros(2, np.float32)}))
    assert st == "fail" and "returned outputs" in why


def test_judge_admitted_outputs(cases):
    c = _case(cases, "R08-tree-envelope")
    exp = C.oracle(c)
    (adm,) = exp.admitted.values()
    ok = adm.value.copy()
    assert C.judge(c, exp, C.Outcome({"y": ok}))[0] == "pass"
    assert C.judge(c, exp, C.Outcome({}))[0] == "fail"
    assert "unexpected race" in C.judge(c, exp, C.Outcome(error="race"))[1]
    bad = ok + np.float32(1e3)
    st, why = C.judge(c, exp, C.Outcome({"y": bad}))
    assert st == "fail" and "outside the admitted" in why
    assert C.judge(c, exp, C.Outcome({"y": ok.astype(np.float64)}))[0] == "fail"   # dtype


def test_harness_failures_are_reported_not_raised(cases, tmp_path):
    c = _case(cases, "V09-no-fma")
    script = tmp_path / "impl.py"
    for body, expect in (("import sys; sys.exit(3)", "exit status 3"),
                         ("import time; time.sleep(30)", "timed out"),
                         ("import sys, pathlib; pathlib.Path(sys.argv[3], 'error.json')"
                          ".write_text('[1]')", "error.json is not"),
                         ("pass", "no output for 'y'")):
        script.write_text(body)
        ext = C.External(f"{sys.executable} {script} {{case}} {{inputs}} {{outputs}}",
                         timeout=2.0)
        rep = C.run_suite([c], ext)
        assert rep.results[0].status == "fail" and expect in rep.results[0].detail, body


def test_inputs_travel_as_npy_and_read_back(cases, tmp_path):
    c = _case(cases, "V13-bf16-storage")
    args = C.materialize(c)
    C.write_inputs(c, args, tmp_path)
    back, params, entries = C.read_call(tmp_path)
    assert [e["name"] for e in entries] == ["x", "y"]
    assert back[0].dtype == args[0].dtype and back[0].tobytes() == args[0].tobytes()
    assert np.load(tmp_path / "x.npy").dtype == np.uint16     # bf16 as its bits
    again = C.materialize(c)                                   # deterministic recipes
    assert again[0].tobytes() == args[0].tobytes()


def test_value_patterns():
    from tilenest.semantics import dtypes as D

    t = C._fill({"pattern": "ties", "seed": 1}, (64,), D.f32)
    assert np.signbit(t[t == 0]).any() and (~np.signbit(t[t == 0])).any()
    s = C._fill({"pattern": "special", "seed": 2}, (64,), D.f32)
    assert np.isnan(s).any() and np.isinf(s).any()
    v = C._fill({"pattern": "values", "values": [1, "-0.0", "nan", "inf"]}, (2, 2), D.f32)
    assert np.signbit(v[0, 1]) and np.isnan(v[1, 0]) and v[1, 1] == np.inf
    i = C._fill({"pattern": "ints", "seed": 0, "lo": -3, "hi": 3}, (10,), D.i64)
    assert i.dtype == np.int64 and i.min() >= -3


def test_a_companion_that_agrees_fails_the_self_check(cases, tmp_path):
    c = _case(cases, "E13-reverse-order")
    d = tmp_path / "cases" / "execution"
    d.mkdir(parents=True)
    shutil.copy(c.program, d / c.program.name)
    shutil.copy(c.program, d / f"{c.name}.wrong.tile")        # "wrong" = the program itself
    shutil.copy(c.recipe, d / c.recipe.name)
    (copy,) = C.load_suite(tmp_path)
    rep = C.run_suite([copy], C.Interpreter())
    assert rep.results[0].status == "error" and "does not discriminate" in rep.results[0].detail


def test_gap_cases_pass_an_implementation_that_follows_the_spec(cases):
    """The `gap` marker: a case whose verdict the reference cannot produce yet is an
    expected failure for an implementation sharing the gap and a pass for one that
    follows the spec (no case is marked today; the mechanism is tested on a copy)."""
    import dataclasses

    c = _case(cases, "R11-unordered-needs-commutative")
    assert not c.gap and C.oracle(c).error == "contract"   # the reference checks it now
    c = dataclasses.replace(c, gap="synthetic gap")
    admitted = C.Expected(admitted=None, error=None, message="")  # an oracle sharing the gap
    assert C.judge(c, admitted, C.Outcome(error="contract"))[0] == "pass"
    assert C.judge(c, admitted, C.Outcome({"o": np.zeros(1, np.int32)}))[0] == "xfail"
