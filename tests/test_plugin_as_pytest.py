"""The pytest plugin behaves like pytest for an external project: pytest run in a
subprocess on a throwaway project with a small fake implementation (plain
Python, no tilenest) that passes one case, fails one and declares every other
case unsupported. Node ids select cases, ``--lf`` reruns the last failure, a
file argument runs that file alone, an unsupported case is skipped with its
reason, a command that cannot start is one usage error, and the JUnit ids
match ``tilenest conformance --junit``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from tilenest import conformance as C

ROOT = Path(__file__).resolve().parent.parent

FAKE_IMPL = textwrap.dedent('''
    """Passes E10-write-write (it reports the race), writes nothing for
    M05-zero-and-fill (a failure) and declines every other case."""
    import json, sys
    from pathlib import Path

    case, inputs, outputs = (Path(a) for a in sys.argv[1:4])
    name = case.name.split(".")[0]
    if name == "E10-write-write":
        (outputs / "error.json").write_text(json.dumps({"kind": "race", "message": "2 writers"}))
    elif name != "M05-zero-and-fill":
        (outputs / "error.json").write_text(json.dumps(
            {"kind": "unsupported", "reason": f"no support for {name} yet"}))
''')

M05 = "tilenest-conformance::memory::M05-zero-and-fill[M-5]"
E10 = "tilenest-conformance::execution::E10-write-write[E-10]"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project with one test of its own and the fake implementation."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_own.py").write_text("def test_own():\n    assert True\n")
    (tmp_path / "fake_impl.py").write_text(FAKE_IMPL)
    return tmp_path


def fake(project: Path) -> str:
    return f"{sys.executable} {project / 'fake_impl.py'} {{case}} {{inputs}} {{outputs}}"


def run(project: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest in the project, with this checkout's tilenest and its cache on
    (``--lf`` needs it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tilenest.pytest_plugin",
                           "-rA", *args], cwd=project, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def outcomes(stdout: str) -> dict[str, str]:
    """node id -> PASSED / FAILED / SKIPPED / ERROR from the ``-rA`` summary."""
    out = {}
    for line in stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR"):
            out[rest.split(" - ")[0]] = word
    return out


def test_node_ids_select_cases_and_a_file_argument_runs_that_file_alone(project):
    r = run(project, "--tilenest-impl", fake(project), M05, E10)
    assert r.returncode == 1, r.stdout + r.stderr
    assert outcomes(r.stdout) == {M05: "FAILED", E10: "PASSED"}
    assert "1 failed, 1 passed" in r.stdout                    # test_own.py not collected
    # a case named without its [RULES], and a group, as pytest's parametrized ids
    r = run(project, "--tilenest-impl", fake(project), "--collect-only", "-q",
            "tilenest-conformance::memory::M05-zero-and-fill", "tilenest-conformance::pipeline")
    listed = [ln for ln in r.stdout.splitlines() if ln.startswith("tilenest-conformance::")]
    pipeline = [c.node_id for c in C.load_suite() if c.group == "pipeline"]
    assert listed == [M05] + pipeline and len(pipeline) > 3
    r = run(project, "--tilenest-impl", fake(project), "test_own.py")
    assert r.returncode == 0 and "1 passed in" in r.stdout, r.stdout
    assert "tilenest-conformance" not in r.stdout.split("short test summary")[-1]
    r = run(project, "--tilenest-impl", fake(project), "tilenest-conformance::memory::M99")
    assert r.returncode == 4
    assert "no conformance case has the node id tilenest-conformance::memory::M99" in r.stderr


def test_unsupported_cases_are_skipped_and_lf_reruns_the_last_failure(project):
    execution = [c for c in C.load_suite() if c.group == "execution"]
    r = run(project, "--tilenest-impl", fake(project), M05, "tilenest-conformance::execution",
            "test_own.py")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"1 failed, 2 passed, {len(execution) - 1} skipped in" in r.stdout
    skipped = next(c for c in execution if c.name != "E10-write-write")
    assert (f"{skipped.recipe.name}:1: unsupported: no support for {skipped.name} yet"
            in r.stdout)                                        # located at its recipe
    r = run(project, "--tilenest-impl", fake(project), "--lf")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "run-last-failure: rerun previous 1 failure" in r.stdout
    assert outcomes(r.stdout) == {M05: "FAILED"}
    assert f"1 failed, {len(C.load_suite())} deselected" in r.stdout   # test_own too


def test_a_command_that_cannot_start_is_one_usage_error(project):
    for template, why in (("no-such-implementation {case}", "is not a command on PATH"),
                          (f"{project / 'fake_impl.py'} {{case}}", "is not executable"),
                          ("python3 'unbalanced {case}", "cannot be split into words")):
        r = run(project, "--tilenest-impl", template)
        out = r.stdout + r.stderr
        assert r.returncode == 4, (template, out)
        assert out.count("usage error") == 1 and why in out, out
        assert "INTERNALERROR" not in out and "ERROR at setup" not in out
    script = project / "no_shebang.sh"
    script.write_text("echo this file has no #! line\n")
    script.chmod(0o755)
    r = run(project, "--tilenest-impl", f"{script} {{case}}", M05, E10)
    out = r.stdout + r.stderr
    assert r.returncode == 4 and "Exec format error" in out, out
    assert out.count("cannot start the implementation") == 1 and "ERROR at setup" not in out


def junit_ids(path: Path) -> dict[tuple[str, str], str]:
    """(classname, name) -> outcome of every conformance testcase."""
    out = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        if tc.get("classname", "").startswith("tilenest-conformance"):
            kinds = [e.tag for e in tc if e.tag in ("failure", "error", "skipped")]
            out[(tc.get("classname", ""), tc.get("name", ""))] = kinds[0] if kinds else "pass"
    return out


def test_junit_ids_are_the_same_from_the_cli_and_the_plugin(project, tmp_path, capsys):
    plugin_xml, cli_xml = tmp_path / "plugin.xml", tmp_path / "cli.xml"
    r = run(project, "--tilenest-impl", fake(project), "-k", "M05-zero or E10-",
            f"--junitxml={plugin_xml}")
    assert r.returncode == 1, r.stdout + r.stderr
    status = C.main(impl=fake(project), select=["M05-zero", "E10-"], junit=str(cli_xml))
    capsys.readouterr()
    assert status == 1
    ids = junit_ids(plugin_xml)
    assert ids == junit_ids(cli_xml)
    assert ids[("tilenest-conformance.memory", "M05-zero-and-fill[M-5]")] == "failure"
    assert ids[("tilenest-conformance.execution", "E10-write-write[E-10]")] == "pass"
    assert list(ids.values()).count("skipped") == len(ids) - 2
