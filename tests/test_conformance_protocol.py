"""The external protocol of ``tilenest conformance --impl`` under odd and hostile
implementations and recipes (tilenest.conformance_files): shell-quoted
placeholders, outputs that are FIFOs, lying ``.npy`` headers or random bytes,
commands that cannot start, cases an implementation declares unsupported, and
recipes with the wrong shape or a name that leaves its folder."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tilenest import conformance as C
from tilenest import conformance_files as F
from tilenest.errors import TilenestError, UsageError


@pytest.fixture(scope="module")
def cases() -> dict[str, C.Case]:
    return {c.name: c for c in C.load_suite()}


def script_impl(tmp_path: Path, body: str) -> str:
    """A template running ``body`` as a Python implementation (argv: case,
    inputs, outputs)."""
    script = tmp_path / "impl.py"
    script.write_text("import json, os, sys\nfrom pathlib import Path\n"
                      "case, inputs, outputs = (Path(a) for a in sys.argv[1:4])\n" + body)
    return f"{sys.executable} {script} {{case}} {{inputs}} {{outputs}}"


def one(case: C.Case, template: str, timeout: float = 20.0) -> C.CaseResult:
    (r,) = C.run_suite([case], C.External(template, timeout), check_companions=False).results
    return r


# ------------------------------------------------------------------ shell templates
HOSTILE = "a b;c'd\"e$HOME`true`\\f\ng*"


@pytest.mark.parametrize("script", ["printf '%s|' {case} {inputs}",
                                    "printf '%s|' '{case}' \"{inputs}\"",
                                    "printf '%s|' 'x{case}y' \"x{inputs}y\""])
def test_placeholders_in_a_shell_script_reach_it_as_data(script):
    t = F.Template.parse(f"sh -c {shlex.quote(script)} {{case}}")
    assert t.script == 2
    argv = t.argv({"{case}": HOSTILE, "{inputs}": HOSTILE + "2", "{outputs}": "o"})
    assert argv[3] == HOSTILE                                   # $0: an ordinary word
    got = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    wrap = ("x", "y") if "x{case}y" in script else ("", "")
    assert got == f"{wrap[0]}{HOSTILE}{wrap[1]}|{wrap[0]}{HOSTILE}2{wrap[1]}|"


def test_shell_scripts_are_found_behind_env_and_options():
    for text, idx in (("env A=1 bash -e -o pipefail -c 'run {case}'", 7),
                      ("/bin/sh -ec 'run {case}'", 2),
                      ("env -u HOME -C /tmp sh -c 'run {case}'", 7),
                      ("env -S 'sh -c' 'run {case}'", None),
                      ("sh script.sh {case}", None),            # a script file: argv words
                      ("python3 -c 'print(1)' {case}", None)):
        assert F.Template.parse(text).script == idx, text


def test_a_suite_folder_with_a_semicolon_runs_nothing_it_names(cases, tmp_path):
    """The suite lives in a folder whose name is a shell command; a template
    through ``sh -c`` gets it as one quoted word."""
    c = cases["E10-write-write"]
    folder = tmp_path / "suite;touch PWNED;x" / "execution"
    folder.mkdir(parents=True)
    for f in (c.recipe, c.program):
        shutil.copy(f, folder / f.name)
    (copy,) = C.load_suite(folder.parent)
    impl = tmp_path / "impl.sh"
    impl.write_text('printf \'{"kind": "race", "message": "m"}\' > "$3/error.json"\n')
    r = one(copy, f"sh -c 'cd {tmp_path} && sh {impl} {{case}} {{inputs}} {{outputs}}' x")
    assert r.status == "pass", r.detail
    assert not (tmp_path / "PWNED").exists()


# ----------------------------------------------------------------------- outputs
def test_an_output_fifo_does_not_block_the_run(cases, tmp_path):
    """The implementation leaves a FIFO as its output and a background child
    that would open it for writing only after 20 s."""
    template = script_impl(tmp_path, (
        "import subprocess\n"
        "fifo = outputs / 'y.npy'\n"
        "os.mkfifo(fifo)\n"
        "subprocess.Popen([sys.executable, '-c', 'import sys, time; time.sleep(20); "
        "open(sys.argv[1], \"wb\").write(b\"x\")', str(fifo)],\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"))
    t0 = time.monotonic()
    r = one(cases["V09-no-fma"], template, timeout=10.0)
    assert time.monotonic() - t0 < 8.0
    assert r.status == "fail" and "y.npy is a FIFO, not a regular file" in r.detail


def _header(path: Path, shape: tuple[int, ...], descr: str = "<f4") -> None:
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False,
                                                 "shape": shape})
        f.write(b"\0" * 64)


def test_a_header_claiming_2_to_the_40_elements_is_too_large(cases, tmp_path):
    body = "import numpy as np\n" + (
        "with open(outputs / 'y.npy', 'wb') as f:\n"
        "    np.lib.format.write_array_header_1_0(f, {'descr': '<f4', 'fortran_order': False,"
        " 'shape': (2**40,)})\n"
        "    f.write(bytes(64))\n")
    r = one(cases["V09-no-fma"], script_impl(tmp_path, body))
    assert r.status == "fail"
    assert r.detail.startswith("y.npy is too large: its header claims shape (1099511627776,)")


def test_unreadable_outputs_are_named_for_what_they_are(tmp_path):
    f = tmp_path / "y.npy"
    f.write_bytes(np.random.default_rng(0).bytes(256))
    with pytest.raises(F.OutputError, match=r"^y.npy is not an .npy file"):
        F.read_npy(f, 1 << 20)
    np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(F.OutputError, match="holds Python objects"):
        F.read_npy(f, 1 << 20)
    _header(f, (1000,))
    with pytest.raises(F.OutputError, match="truncated: its header claims 4000 bytes"):
        F.read_npy(f, 1 << 20)
    f.unlink()
    f.mkdir()
    with pytest.raises(F.OutputError, match="y.npy is a folder, not a regular file"):
        F.read_npy(f, 1 << 20)
    g = tmp_path / "z.npy"
    np.save(g, np.arange(6, dtype=np.int16).reshape(2, 3).T)    # Fortran order
    a = F.read_npy(g, 1 << 20)
    assert a.dtype == np.int16 and a.tolist() == [[0, 3], [1, 4], [2, 5]]
    np.save(g, np.zeros((0, 4), np.float32))
    assert F.read_npy(g, 1 << 20).shape == (0, 4)


def test_random_bytes_as_an_output_are_not_an_npy_file(cases, tmp_path):
    body = "(outputs / 'y.npy').write_bytes(bytes(range(256)) * 3)\n"
    r = one(cases["V09-no-fma"], script_impl(tmp_path, body))
    assert r.status == "fail" and r.detail.startswith("y.npy is not an .npy file"), r.detail


# ------------------------------------------------------------- starting the command
def test_templates_that_cannot_be_used_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="cannot be split into words: No closing quotation"):
        C.External("impl 'unbalanced {case}")
    with pytest.raises(UsageError, match="no-such-impl-xyz is not a command on PATH"):
        C.External("no-such-impl-xyz {case}")
    with pytest.raises(UsageError, match="no-such-impl-xyz is not a command on PATH"):
        C.External("env -i A=1 no-such-impl-xyz {case}")
    script = tmp_path / "impl.py"
    script.write_text("print(1)\n")
    with pytest.raises(UsageError, match="impl.py is not executable") as e:
        C.External(f"{script} {{case}}")
    assert "python3" in (e.value.hint or "")


def test_a_command_that_cannot_start_ends_the_run_once(cases, tmp_path, capsys):
    with pytest.raises(UsageError, match="cannot start the implementation"):
        C.main(impl="no-such-impl-xyz {case}", select=["V09-no-fma", "E10-write-write"])
    script = tmp_path / "noshebang"
    script.write_text("echo no interpreter line\n")
    script.chmod(0o755)
    with pytest.raises(F.CannotStart, match="Exec format error"):
        C.main(impl=f"{script} {{case}}", select=["V09-no-fma", "E10-write-write"])
    assert capsys.readouterr().out == ""                        # no report of 2 failures


# -------------------------------------------------------------------- unsupported
def test_a_case_declared_unsupported_is_skipped_with_its_reason(cases, tmp_path, capsys):
    body = ("(outputs / 'error.json').write_text(json.dumps({'kind': 'unsupported', "
            "'reason': 'no bf16 here'}))\n")
    template = script_impl(tmp_path, body)
    r = one(cases["V09-no-fma"], template)
    assert (r.status, r.detail) == ("skip", "unsupported: no bf16 here") and r.case
    j = tmp_path / "r.json"
    status = C.main(impl=template, select=["V09-no-fma", "E10-write-write"],
                    json_report=str(j))
    out = capsys.readouterr().out
    assert status == 0
    summary = json.loads(j.read_text())["summary"]
    assert (summary["skipped"], summary["passed"], summary["failed"]) == (2, 0, 0)
    assert "2 skipped (unsupported by the implementation)" in out


def test_unsupported_never_hides_a_broken_case(cases):
    import dataclasses

    c = dataclasses.replace(cases["V09-no-fma"], expect={"verdict": "error", "error": "race"})
    st, why = C.judge(c, C.oracle(c), C.Outcome(unsupported="x"))
    assert st == "error" and "the oracle admits the call" in why


# ------------------------------------------------------------------------ recipes
def _recipe(tmp_path: Path, cases: dict[str, C.Case], edit: object) -> Path:
    src = cases["V09-no-fma"]
    d = json.loads(src.recipe.read_text())
    d = edit(d) if callable(edit) else edit
    folder = tmp_path / "cases" / "values"
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(src.program, folder / src.program.name)
    (folder / "case.json").write_text(json.dumps(d, indent=1))
    return folder / "case.json"


def _set(key: str, value: object):  # type: ignore[no-untyped-def]
    def edit(d: dict) -> dict:
        d[key] = value
        return d
    return edit


def _set_arg(key: str, value: object):  # type: ignore[no-untyped-def]
    def edit(d: dict) -> dict:
        d["args"][0][key] = value
        return d
    return edit


@pytest.mark.parametrize("edit, message, key", [
    ([1, 2], "the document is a JSON list, not an object", None),
    (_set("expect", "admitted"), "'expect' must be an object", "expect"),
    (_set("rules", 7), "'rules' must be a non-empty list", "rules"),
    (_set("name", "a/b"), "'name' is \"a/b\", not a plain file name", "name"),
    (_set("program", "/etc/passwd"), "'program' is \"/etc/passwd\"", "program"),
    (_set("args", {"a": 1}), "'args' must be a list", "args"),
    (_set("params", {"n": "4"}), "'params' must be an object mapping", "params"),
    (_set_arg("name", "../x"), "args[0]: 'name' must be a plain file name", "args"),
    (_set_arg("shape", [-1]), "args[0]: 'shape' must be a list of non-negative", "args"),
])
def test_malformed_recipes_are_located_errors(cases, tmp_path, edit, message, key):
    path = _recipe(tmp_path, cases, edit)
    lines = path.read_text().splitlines()
    line = 1 + next((i for i, ln in enumerate(lines) if f'"{key}"' in ln), 0)
    with pytest.raises(TilenestError) as e:
        C.load_case(path)
    assert message in e.value.message
    assert [(site.file, site.line) for site in e.value.sites] == [(str(path), line)]
    with pytest.raises(TilenestError, match="conformance recipe"):
        C.main(suite=str(tmp_path))


def test_a_recipe_name_cannot_move_the_case_folder_out_of_keep(cases, tmp_path):
    """``--keep DIR`` puts each case's folder in DIR under the case's name; a
    name with separators reached outside DIR (through any folder named
    ``tn-conf-a``). Such a name is refused when the recipe is read."""
    keep = tmp_path / "keep"
    (keep / "tn-conf-a").mkdir(parents=True)
    suite = _recipe(tmp_path / "suite", cases, _set("name", "a/../../escaped")).parents[2]
    template = script_impl(tmp_path, "(outputs / 'error.json').write_text("
                                     "'{\"kind\": \"unsupported\"}')\n")
    with pytest.raises(TilenestError, match="not a plain file name") as e:
        C.main(suite=str(suite), impl=template, keep=str(keep))
    assert [site.file for site in e.value.sites] == [str(suite / "cases" / "values" / "case.json")]
    assert not list(tmp_path.glob("escaped*"))


def test_default_suite_is_the_source_trees_and_the_packaged_link_matches():
    suite = C.default_suite()
    root = Path(C.__file__).resolve().parent.parent
    assert suite == root / "spec" / "conformance"
    packaged = Path(C.__file__).resolve().parent / "conformance_suite" / "cases"
    assert packaged.is_symlink() and packaged.resolve() == (suite / "cases").resolve()
    assert os.readlink(packaged) == os.path.join("..", "..", "spec", "conformance", "cases")
