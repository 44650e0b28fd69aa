"""``tilenest check --sarif FILE``: a SARIF 2.1.0 log whose results are the
refuted (error) and unknown (warning) obligations at their kernel source
lines, with stable fingerprints; the printed report and the exit status are
those of ``check`` without ``--sarif``; a bad path is a located usage error.

The structure is checked offline by a small hand-written validator of the
SARIF 2.1.0 fields this log uses (not the full JSON schema)."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tilenest
from tilenest import cli, sarif
from tilenest.errors import Site

ROOT = Path(__file__).resolve().parent.parent
SOFTMAX = ROOT / "examples" / "softmax.py"

HALVES = (  # two programs write y[p // 2]: noninterference and coverage.once refuted at line 7
    "import tilenest as tn\nfrom tilenest import f32\n"
    "@tn.kernel\n"
    "def halves(x: tn.Tensor[f32, 'N'], y: tn.Tensor[f32, 'M']):\n"
    "    (n,) = x.shape\n"
    "    for p in tn.parallel(tn.shape(n)):\n"
    "        y(tn.coord(p.index() // 2), tn.shape(1)).store(\n"
    "            x[tn.coord(p.index()), tn.shape(1)])\n")

SCATTER = (  # a store at a data-dependent index: noninterference unknown
    "import tilenest as tn\nfrom tilenest import f32, i32\n"
    "@tn.kernel\n"
    "def scatter(x: tn.Tensor[f32, 'N'], idx: tn.Tensor[i32, 'N'], y: tn.Tensor[f32, 'M']):\n"
    "    (n,) = x.shape\n"
    "    for p in tn.parallel(tn.shape(n)):\n"
    "        j = idx[tn.coord(p.index()), tn.shape(1)]\n"
    "        k = tn.reduce(j, j.dim(0), tn.add)\n"
    "        y(tn.coord(k), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])\n")

LEVELS = ("none", "note", "warning", "error")


# ---------------------------------------------------------------------------
# a validator of the SARIF 2.1.0 fields used here (required ones and types)


def _expect(cond: bool, where: str, what: str) -> None:
    if not cond:
        raise AssertionError(f"SARIF {where}: {what}")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _message(m: Any, where: str) -> None:
    _expect(isinstance(m, dict) and isinstance(m.get("text"), str) and m["text"], where,
            "a message object with non-empty text")


def _location(loc: Any, where: str) -> None:
    _expect(isinstance(loc, dict), where, "a location object")
    phys = loc.get("physicalLocation")
    _expect(isinstance(phys, dict), where, "physicalLocation")
    art = phys.get("artifactLocation")
    _expect(isinstance(art, dict) and isinstance(art.get("uri"), str) and art["uri"], where,
            "artifactLocation.uri")
    _expect(" " not in art["uri"] and "\\" not in art["uri"], where, "uri is a URI reference")
    if "uriBaseId" in art:
        _expect(isinstance(art["uriBaseId"], str), where, "uriBaseId is a string")
        _expect(not art["uri"].startswith("/") and ":" not in art["uri"].split("/")[0],
                where, "a uri with a uriBaseId is relative")
    region = phys.get("region")
    _expect(isinstance(region, dict), where, "region")
    _expect(_is_int(region.get("startLine")) and region["startLine"] >= 1, where,
            "region.startLine >= 1")
    if "startColumn" in region:
        _expect(_is_int(region["startColumn"]) and region["startColumn"] >= 1, where,
                "region.startColumn >= 1")
    if "message" in loc:
        _message(loc["message"], where + ".message")


def validate(doc: Any) -> None:
    """Raise AssertionError naming the first field of ``doc`` that is missing
    or of the wrong type for a SARIF 2.1.0 log."""
    _expect(isinstance(doc, dict), "log", "an object")
    _expect(doc.get("version") == "2.1.0", "log", "version 2.1.0")
    _expect(isinstance(doc.get("$schema"), str) and doc["$schema"].startswith("https://")
            and doc["$schema"].endswith("sarif-schema-2.1.0.json"), "log", "the 2.1.0 $schema")
    runs = doc.get("runs")
    _expect(isinstance(runs, list) and len(runs) == 1, "log", "one run")
    for ri, run in enumerate(runs):
        w = f"runs[{ri}]"
        driver = run.get("tool", {}).get("driver")
        _expect(isinstance(driver, dict) and isinstance(driver.get("name"), str), w,
                "tool.driver.name")
        _expect(isinstance(driver.get("version"), str), w, "tool.driver.version")
        rules = driver.get("rules")
        _expect(isinstance(rules, list), w, "tool.driver.rules is a list")
        ids = [r.get("id") for r in rules]
        _expect(all(isinstance(i, str) and i for i in ids), w, "every rule has an id")
        _expect(len(set(ids)) == len(ids), w, "rule ids are unique")
        for i, r in enumerate(rules):
            for f in ("shortDescription", "fullDescription", "help"):
                _message(r.get(f), f"{w}.rules[{i}].{f}")
            if "defaultConfiguration" in r:
                _expect(r["defaultConfiguration"].get("level") in LEVELS, w, "rule level")
        bases = run.get("originalUriBaseIds", {})
        _expect(isinstance(bases, dict), w, "originalUriBaseIds is an object")
        for k, v in bases.items():
            _expect(isinstance(v.get("uri"), str) and v["uri"].endswith("/"), w,
                    f"originalUriBaseIds[{k}].uri names a folder")
        invs = run.get("invocations")
        _expect(isinstance(invs, list) and invs, w, "invocations")
        _expect(isinstance(invs[0].get("executionSuccessful"), bool), w,
                "invocations[0].executionSuccessful is a boolean")
        if "exitCode" in invs[0]:
            _expect(_is_int(invs[0]["exitCode"]), w, "exitCode is an integer")
        for n in invs[0].get("toolExecutionNotifications", []):
            _message(n.get("message"), w + ".toolExecutionNotifications")
        results = run.get("results")
        _expect(isinstance(results, list), w, "results is a list")
        for i, res in enumerate(results):
            wr = f"{w}.results[{i}]"
            _expect(isinstance(res.get("ruleId"), str), wr, "ruleId")
            if "ruleIndex" in res:
                _expect(_is_int(res["ruleIndex"]) and 0 <= res["ruleIndex"] < len(rules)
                        and rules[res["ruleIndex"]]["id"] == res["ruleId"], wr,
                        "ruleIndex points at the rule of ruleId")
            _expect(res.get("level") in LEVELS, wr, "level")
            _message(res.get("message"), wr + ".message")
            locs = res.get("locations")
            _expect(isinstance(locs, list) and locs, wr, "at least one location")
            for j, loc in enumerate(locs):
                _location(loc, f"{wr}.locations[{j}]")
            for j, loc in enumerate(res.get("relatedLocations", [])):
                _location(loc, f"{wr}.relatedLocations[{j}]")
                _expect(_is_int(loc.get("id")), wr, "a related location has an integer id")
            fp = res.get("partialFingerprints")
            _expect(isinstance(fp, dict) and fp and all(
                isinstance(k, str) and isinstance(v, str) and v for k, v in fp.items()), wr,
                "partialFingerprints maps names to strings")
            for s in res.get("suppressions", []):
                _expect(s.get("kind") in ("inSource", "external"), wr, "suppression kind")


# ---------------------------------------------------------------------------
# helpers


def run_check(tmp_path: Path, monkeypatch: Any, capsys: Any, *args: str,
              sarif_name: str | None = "out.sarif") -> tuple[int, str, str, dict | None]:
    """``tilenest check ARGS [--sarif tmp/out.sarif]`` in-process, from ``tmp_path``."""
    monkeypatch.chdir(tmp_path)
    extra = ["--sarif", sarif_name] if sarif_name is not None else []
    status = cli.main(["check", *args, *extra])
    out, err = capsys.readouterr()
    doc = None
    if sarif_name is not None and (tmp_path / sarif_name).is_file():
        doc = json.loads((tmp_path / sarif_name).read_text())
    return status, out, err, doc


def results(doc: dict, level: str | None = None) -> list[dict]:
    return [r for r in doc["runs"][0]["results"] if level is None or r["level"] == level]


def where(r: dict) -> tuple[str, int, int | None]:
    phys = r["locations"][0]["physicalLocation"]
    return (phys["artifactLocation"]["uri"], phys["region"]["startLine"],
            phys["region"].get("startColumn"))


_TIMES = re.compile(r" *\d+(\.\d+)?(ms| s)")


# ---------------------------------------------------------------------------
# tests


def test_refuted_obligations_are_errors_at_their_source_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "halves.py").write_text(HALVES)
    status, out, err, doc = run_check(tmp_path, monkeypatch, capsys, "halves.py")
    assert status == 5 and "Traceback" not in err
    assert doc is not None
    validate(doc)
    errors = results(doc, "error")
    by_rule = {r["ruleId"]: r for r in errors}
    assert {"noninterference", "coverage.once"} <= set(by_rule)
    for rid in ("noninterference", "coverage.once"):
        r = by_rule[rid]
        assert where(r) == ("halves.py", 7, 9)
        assert r["locations"][0]["physicalLocation"]["artifactLocation"]["uriBaseId"] \
            == sarif.SRCROOT
    ni = by_rule["noninterference"]
    assert ni["message"]["text"].startswith("level 1: two children never touch one element")
    assert "parameters: M = 1, N = 2" in ni["message"]["text"]  # the counterexample
    assert ni["relatedLocations"][0]["physicalLocation"]["region"]["startLine"] == 6
    run = doc["runs"][0]
    assert run["originalUriBaseIds"][sarif.SRCROOT]["uri"] == tmp_path.resolve().as_uri() + "/"
    assert run["invocations"][0] == {"executionSuccessful": True, "exitCode": 5}
    driver = run["tool"]["driver"]
    assert driver["name"] == "tilenest" and driver["version"] == tilenest.__version__
    assert {r["id"] for r in driver["rules"]} == {"noninterference", "coverage.cover",
                                                    "coverage.once"}
    # the terminal report and the exit status are those of a check without --sarif
    status2, out2, _, _ = run_check(tmp_path, monkeypatch, capsys, "halves.py", sarif_name=None)
    assert status2 == status
    assert _TIMES.sub("T", out2) == _TIMES.sub("T", out)


def test_a_kernel_that_passes_has_no_results(tmp_path, monkeypatch, capsys):
    status, out, _, doc = run_check(tmp_path, monkeypatch, capsys, str(SOFTMAX))
    assert status == 0 and "0 refuted, 0 unknown" in out
    assert doc is not None
    validate(doc)
    # neither the proved obligations nor the float-add law refuted as evidence
    # (it does not decide the verdict) are alerts on a dashboard
    assert "refuted*" in out and results(doc) == []
    assert doc["runs"][0]["invocations"][0]["exitCode"] == 0
    summary = doc["runs"][0]["properties"]["tilenest"]["kernels"][0]["summary"]
    assert summary["proved"] == 6 and summary["refuted"] == 0 and summary["evidence"] >= 1


def test_rules_link_their_section_of_the_docs_site(tmp_path, monkeypatch, capsys):
    (tmp_path / "halves.py").write_text(HALVES)
    monkeypatch.setenv("TILENEST_DOCS_URL", "https://docs.example.org/tilenest")
    _, _, _, doc = run_check(tmp_path, monkeypatch, capsys, "halves.py")
    assert doc is not None
    validate(doc)
    rules = {r["id"]: r for r in doc["runs"][0]["tool"]["driver"]["rules"]}
    assert rules["noninterference"]["helpUri"] == \
        "https://docs.example.org/tilenest/spec/obligations/#o-2"
    assert rules["coverage.once"]["helpUri"].endswith("/spec/obligations/#o-3")
    # the anchor is one the docs site gives the catalogue's heading
    assert "## O-3 Coverage" in (ROOT / "spec" / "obligations.md").read_text()
    monkeypatch.setenv("TILENEST_DOCS_URL", "")
    monkeypatch.setattr(sarif, "docs_root", lambda: None)
    assert "helpUri" not in sarif.rule("noninterference")  # never a relative URI


def test_unknown_is_a_warning_and_assumed_is_a_suppressed_note(tmp_path, monkeypatch, capsys):
    (tmp_path / "scatter.py").write_text(SCATTER)
    status, _, _, doc = run_check(tmp_path, monkeypatch, capsys, "scatter.py")
    assert status == 6 and doc is not None
    validate(doc)
    warnings = results(doc, "warning")
    assert warnings and not results(doc, "error")
    assert all(where(r)[0] == "scatter.py" and where(r)[1] >= 6 for r in warnings)
    assert any("unknown: " in r["message"]["text"] for r in warnings)
    assert doc["runs"][0]["invocations"][0]["exitCode"] == 6
    status, _, _, doc = run_check(tmp_path, monkeypatch, capsys, "scatter.py", "--assume",
                                  "noninterference", "--assume", "coverage.*")
    assert status == 0 and doc is not None
    validate(doc)
    assumed = [r for r in results(doc) if r["properties"]["tilenest"]["verdict"] == "assumed"]
    assert assumed and all(r["level"] == "note" for r in assumed)
    assert all(r["suppressions"][0]["kind"] == "external"
               and "--assume" in r["suppressions"][0]["justification"] for r in assumed)
    assert not results(doc, "warning") and not results(doc, "error")


def test_fingerprints_survive_moving_the_kernel(tmp_path, monkeypatch, capsys):
    (tmp_path / "halves.py").write_text(HALVES)
    _, _, _, before = run_check(tmp_path, monkeypatch, capsys, "halves.py")
    (tmp_path / "halves.py").write_text("# a comment that moves the kernel down\n\n" + HALVES)
    _, _, _, after = run_check(tmp_path, monkeypatch, capsys, "halves.py")
    assert before is not None and after is not None

    def fps(doc: dict) -> dict[str, str]:
        return {r["ruleId"]: r["partialFingerprints"][sarif.FINGERPRINT] for r in results(doc)}

    assert fps(before) == fps(after)
    assert len(set(fps(before).values())) == len(fps(before))  # one per obligation
    assert [where(r)[1] for r in results(after)] == [where(r)[1] + 2 for r in results(before)]


@pytest.mark.parametrize("make, name, says", [
    (lambda d: (d / "adir").mkdir(), "adir", "is a directory"),
    (lambda d: None, "missing/out.sarif", "does not exist"),
    (lambda d: (d / "afile").write_text(""), "afile/out.sarif", "is a file, not a directory"),
    (lambda d: None, "-", "goes to a file"),
])
def test_bad_sarif_path_is_a_usage_error_with_a_hint(tmp_path, monkeypatch, capsys, make, name,
                                                     says):
    make(tmp_path)
    status, out, err, _ = run_check(tmp_path, monkeypatch, capsys, str(SOFTMAX),
                                    sarif_name=name)
    assert status == 2
    assert "usage error: --sarif" in err and says in err and "hint:" in err
    assert "Traceback" not in err
    assert out == ""  # refused before the check runs


def test_a_check_that_stops_writes_an_unsuccessful_log(tmp_path, monkeypatch, capsys):
    status, _, err, doc = run_check(tmp_path, monkeypatch, capsys, "nope.py")
    assert status == 2 and "no such file" in err
    assert doc is not None
    validate(doc)
    inv = doc["runs"][0]["invocations"][0]
    assert inv["executionSuccessful"] is False and results(doc) == []
    assert "no such file" in inv["toolExecutionNotifications"][0]["message"]["text"]


def test_validator_rejects_broken_logs(tmp_path, monkeypatch, capsys):
    (tmp_path / "halves.py").write_text(HALVES)
    _, _, _, doc = run_check(tmp_path, monkeypatch, capsys, "halves.py")
    assert doc is not None
    validate(doc)

    def broken(edit: Any) -> dict:
        d = copy.deepcopy(doc)
        edit(d)
        return d

    for edit in (
            lambda d: d.pop("version"),
            lambda d: d["runs"][0]["tool"]["driver"].pop("name"),
            lambda d: d["runs"][0]["invocations"][0].update(executionSuccessful="yes"),
            lambda d: d["runs"][0]["results"][0].update(level="fatal"),
            lambda d: d["runs"][0]["results"][0].update(ruleIndex=99),
            lambda d: d["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
            .pop("startLine"),
            lambda d: d["runs"][0]["results"][0].pop("partialFingerprints")):
        with pytest.raises(AssertionError, match="SARIF"):
            validate(broken(edit))


def test_locations_of_sites_without_a_file_or_outside_the_root(tmp_path):
    inp = tmp_path / "k.tile"
    inp.write_text("")
    loc = sarif.location(Site(None, 3, 5), inp, tmp_path)  # a TileIR text position
    assert loc["physicalLocation"]["artifactLocation"] == {"uri": "k.tile",
                                                           "uriBaseId": sarif.SRCROOT}
    assert loc["physicalLocation"]["region"] == {"startLine": 3, "startColumn": 5}
    loc = sarif.location(None, inp, tmp_path)  # no site at all: the input file, line 1
    assert loc["physicalLocation"]["region"] == {"startLine": 1}
    elsewhere = tmp_path.parent / "a b.py"
    loc = sarif.location(Site(str(elsewhere), 2), inp, tmp_path / "sub")
    assert loc["physicalLocation"]["artifactLocation"] == {"uri": elsewhere.as_uri()}
    assert "%20" in elsewhere.as_uri()
    loc = sarif.location(Site(str(tmp_path / "dir with space" / "k.py"), 2), inp, tmp_path)
    assert loc["physicalLocation"]["artifactLocation"]["uri"] == "dir%20with%20space/k.py"


def test_cli_subprocess_writes_the_log(tmp_path):
    (tmp_path / "halves.py").write_text(HALVES)
    r = subprocess.run([sys.executable, "-m", "tilenest.cli", "check", "halves.py",
                        "--sarif", "check.sarif"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=120, check=False)
    assert r.returncode == 5, r.stderr
    doc = json.loads((tmp_path / "check.sarif").read_text())
    validate(doc)
    assert ("halves.py", 7, 9) in {where(x) for x in results(doc, "error")}
