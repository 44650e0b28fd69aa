"""The pytest plugin (tilenest.pytest_plugin), exercised as an implementer uses
it: pytest run in a subprocess on a small external project
(tests/plugin_project) whose own tests use the fixtures, with
``--tilenest-impl`` adding the conformance cases run on the example external
implementations (tests/conformance_impls)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import tilenest as tn
from tilenest import conformance as C
from tilenest import f32
from tilenest.errors import TilenestError
from tilenest.pytest_plugin import Oracle

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "tests" / "plugin_project"
IMPLS = ROOT / "tests" / "conformance_impls"


def project_pytest(*args: str) -> subprocess.CompletedProcess:
    """pytest on the external project, configured by its own pytest.ini alone:
    no autoloaded plugins (an installed entry point would register the plugin
    a second time), no cache, no options from the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])  # this checkout
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tilenest.pytest_plugin",
                           "-p", "no:cacheprovider", "-c", "pytest.ini", "-rA", *args],
                          cwd=PROJECT, env=env, capture_output=True, text=True, timeout=300,
                          check=False)


def impl(script: str) -> str:
    return f"{sys.executable} {IMPLS / script} {{case}} {{inputs}} {{outputs}}"


def item_name(case: C.Case) -> str:
    return f"{case.name}[{','.join(case.rules)}]"


def citing(*rules: str) -> list[C.Case]:
    return [c for c in C.load_suite() if set(c.rules) & set(rules)]


def junit(path: Path) -> dict[str, str]:
    """testcase name -> pass | failure | error | skipped, for the conformance items."""
    out = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        if tc.get("classname", "").startswith("tilenest-conformance."):
            kinds = [e.tag for e in tc if e.tag in ("failure", "error", "skipped")]
            out[tc.get("name", "")] = kinds[0] if kinds else "pass"
    return out


# ------------------------------------------------------------ conformance items
def test_reference_impl_passes_the_selected_rules(tmp_path):
    x = tmp_path / "junit.xml"
    r = project_pytest("--tilenest-impl", impl("reference_impl.py"),
                       "-k", "[E-10] or [M-5] or [V-1]", f"--junitxml={x}")
    out = r.stdout + r.stderr
    want = citing("E-10", "M-5", "V-1")
    assert r.returncode == 0, out
    assert f"{len(want)} passed" in out and "failed" not in out
    assert junit(x) == {item_name(c): "pass" for c in want}
    assert "tilenest-conformance::execution::E10-write-write[E-10]" in out   # ids: group, rule


def collected(stdout: str) -> list[str]:
    """The conformance item names that ``--collect-only -q`` lists."""
    prefix = "tilenest-conformance::"
    return [line.split("::")[-1] for line in stdout.splitlines() if line.startswith(prefix)]


def test_selection_by_rule_and_nothing_without_the_option():
    r = project_pytest("--collect-only", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "check_kernels.py::test_bitwise_output_is_admitted" in r.stdout
    assert "3 tests collected" in r.stdout and collected(r.stdout) == []
    cmd = ("--tilenest-impl", impl("reference_impl.py"), "--collect-only", "-q")
    exact = collected(project_pytest(*cmd, "-k", "[V-1]").stdout)
    assert exact == [item_name(c) for c in citing("V-1")]
    loose = collected(project_pytest(*cmd, "-k", "V-1").stdout)    # a substring: V-1x too
    assert loose == [item_name(c) for c in citing("V-1", *(f"V-{i}" for i in range(10, 20)))]
    every = project_pytest(*cmd).stdout
    assert len(collected(every)) == len(C.load_suite())
    assert f"{len(C.load_suite()) + 3} tests collected" in every     # the project's 3 beside


def test_wrong_impls_fail_exactly_the_cases_they_break(tmp_path):
    x = tmp_path / "junit.xml"
    r = project_pytest("--tilenest-impl", impl("reversed_fold_impl.py"),
                       "-k", "[R-2] or [R-3] or V01-shared-dim", f"--junitxml={x}")
    assert r.returncode == 1
    got = junit(x)
    broken = {"R02-source-order-2d[R-2]", "R03-fold-left-bitwise[R-3]"}
    assert {n for n, s in got.items() if s == "failure"} == broken
    assert len(got) == len(citing("R-2", "R-3")) + 1 and "V01-shared-dim[V-1]" in got
    assert ("R02-source-order-2d (rule R-2; expects admitted): y[0, 0] = 654321 but the "
            "contract is bitwise: expected 123456") in r.stdout
    r = project_pytest("--tilenest-impl", impl("drop_tail_impl.py"),
                       "-k", "M05-zero-and-fill or E10-write-write")
    assert r.returncode == 1
    assert "1 failed, 1 passed" in r.stdout                          # a race needs no outputs
    assert "FAILED tilenest-conformance::memory::M05-zero-and-fill[M-5]" in r.stdout
    assert "a[5] = nan (bits 0x7fc00000) but the contract is bitwise: expected 0.0" in r.stdout


def test_an_impl_that_cannot_run_is_an_error_and_a_bad_option_a_usage_error(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import sys; sys.exit(3)")
    r = project_pytest("--tilenest-impl", f"{sys.executable} {script} {{case}}",
                       "-k", "V01-shared-dim")
    assert r.returncode == 1
    assert "1 error" in r.stdout and "ERROR at setup of V01-shared-dim[V-1]" in r.stdout
    assert "could not be judged: exit status 3 without error.json" in r.stdout
    assert "rerun keeping its files: tilenest conformance" in r.stdout
    r = project_pytest("--tilenest-impl", "my-impl {inputs} {outputs}")
    assert r.returncode == 4
    err = r.stdout + r.stderr
    assert "--tilenest-impl command has no {case} placeholder" in err and "hint:" in err
    r = project_pytest("--tilenest-impl", impl("reference_impl.py"), "--tilenest-suite",
                       str(tmp_path / "none"))
    assert r.returncode == 4 and "no conformance suite at" in r.stdout + r.stderr
    (tmp_path / "cases" / "x").mkdir(parents=True)
    (tmp_path / "cases" / "x" / "bad.json").write_text("{")
    r = project_pytest("--tilenest-impl", impl("reference_impl.py"), "--tilenest-suite",
                       str(tmp_path))
    assert r.returncode == 2 and "ERROR collecting tilenest-conformance" in r.stdout
    assert "conformance recipe is not JSON: Expecting property name" in r.stdout
    assert f"--> {tmp_path / 'cases' / 'x' / 'bad.json'}:1:2" in r.stdout


# -------------------------------------------------------------------- fixtures
def test_the_projects_own_tests_use_the_fixtures():
    r = project_pytest()
    assert r.returncode == 1
    assert "1 failed, 2 passed" in r.stdout
    assert "PASSED check_kernels.py::test_reassociated_sum_is_admitted" in r.stdout
    assert "FAILED check_kernels.py::test_deliberately_wrong_output" in r.stdout
    assert ("y[13] = 0.0 (bits 0x00000000) but the contract is bitwise: expected 14.0"
            in r.stdout)


@tn.kernel
def scale2(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1], z: tn.Tensor[f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
        o = tn.coord(p.index() * 4)
        y(o, tn.shape(4)).store(x[o, tn.shape(4)] * 2.0)
        z(o, tn.shape(4)).store(x[o, tn.shape(4)] * 3.0)


def test_admitted_outputs_by_name_or_order_and_its_user_errors():
    x = np.arange(8, dtype=np.float32)
    adm = Oracle()(scale2, (x, np.zeros_like(x), np.zeros_like(x)))
    assert adm.names == ("y", "z") and repr(adm) == "AdmittedOutputs(y: f32[8] bitwise, " \
                                                    "z: f32[8] bitwise)"
    assert adm.admits((2 * x, 3 * x)) and adm.admits({"z": 3 * x, "y": 2 * x})
    v = adm.admits({"y": 2 * x})
    assert not v and v.reason == "no output for 'z'"
    v = adm.admits((2 * x, 3 * x[:4]))
    assert not v and v.reason.startswith("z: shape (4,)")
    for bad, why in (({"w": x}, "no tensor named 'w'"), ((x,), "1 outputs given"),
                     (x, "the call stores 2 tensors")):
        with pytest.raises(TilenestError, match=why) as e:
            adm.admits(bad)
        assert e.value.hint


def test_entry_point_names_the_plugin():
    eps = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "tilenest"]
    if not eps:
        pytest.skip("the pytest11 entry point 'tilenest' is not installed (pyproject.toml)")
    assert eps[0].value == "tilenest.pytest_plugin"
