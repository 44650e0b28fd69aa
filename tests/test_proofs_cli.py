"""``tilenest check``: one row per obligation, counterexamples in the user's
terms, the documented exit statuses (0 all proved, 1 any refuted, 2 any
unknown and none refuted), ``--json`` (schema tilenest.check/1), ``--assume``,
and user errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tilenest.proofs.report import parse_spec

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tilenest.cli", "check", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_gemm_split_bound_to_cuda():
    r = run("examples/gemm.py", "--transform", "split(1, 0, 2)", "--target", "cuda")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "0 refuted, 0 unknown" in out
    rows = [ln for ln in out.splitlines() if ln.strip()[:1].isdigit()]
    kinds = {ln.split()[1] for ln in rows}
    assert {"noninterference", "coverage.cover", "tau.cover", "tau.injective", "rewrite",
            "binding.containment", "binding.limit", "pipeline.versions"} <= kinds
    for ln in rows:  # kind, verdict, engine, time, sites
        parts = ln.split()
        assert parts[2] == "proved" and parts[4].endswith("ms") and "gemm.py:" in ln


def test_refuted_row_shows_counterexample_in_user_terms(tmp_path):
    k = tmp_path / "halves.py"
    k.write_text(
        "import tilenest as tn\nfrom tilenest import f32\n"
        "@tn.kernel\n"
        "def halves(x: tn.Tensor[f32, 'N'], y: tn.Tensor[f32, 'M']):\n"
        "    (n,) = x.shape\n"
        "    for p in tn.parallel(tn.shape(n)):\n"
        "        y(tn.coord(p.index() // 2), tn.shape(1)).store(\n"
        "            x[tn.coord(p.index()), tn.shape(1)])\n")
    r = run(str(k))
    assert r.returncode == 5  # refuted
    assert "Traceback" not in r.stderr
    assert "noninterference" in r.stdout and "refuted" in r.stdout
    assert "parameters: M = 1, N = 2" in r.stdout
    assert "writes %y[0]" in r.stdout and "halves.py:7" in r.stdout


def test_unknown_exit_status_and_assume(tmp_path):
    k = tmp_path / "scatter.py"
    k.write_text(
        "import tilenest as tn\nfrom tilenest import f32, i32\n"
        "@tn.kernel\n"
        "def scatter(x: tn.Tensor[f32, 'N'], idx: tn.Tensor[i32, 'N'], y: tn.Tensor[f32, 'M']):\n"
        "    (n,) = x.shape\n"
        "    for p in tn.parallel(tn.shape(n)):\n"
        "        j = idx[tn.coord(p.index()), tn.shape(1)]\n"
        "        k = tn.reduce(j, j.dim(0), tn.add)\n"
        "        y(tn.coord(k), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])\n")
    r = run(str(k))
    assert r.returncode == 6, r.stdout  # unknown, none refuted
    assert "holds by the parallel contract, not proved" in r.stdout
    r = run(str(k), "--assume", "noninterference", "--assume", "coverage.*", "--json")
    assert r.returncode == 0, r.stdout
    d = json.loads(r.stdout)
    assumed = [o for o in d["obligations"] if o["verdict"] == "assumed"]
    assert assumed and all(o["assumed_by"] for o in assumed)
    assert d["summary"]["assumed"] == len(assumed) and d["summary"]["proved"] >= 0


def test_json_schema():
    r = run("examples/softmax.py", "--json")
    assert r.returncode == 0
    d = json.loads(r.stdout)
    assert d["schema"] == "tilenest.check/1" and d["kernel"] == "row_softmax"
    assert set(d) >= {"target", "steps", "summary", "exit_status", "seconds", "obligations"}
    for o in d["obligations"]:
        assert set(o) >= {"kind", "title", "role", "sites", "formula", "verdict", "engine",
                          "seconds", "reason", "counterexample", "counterexample_text"}
        assert o["verdict"] in ("proved", "refuted", "unknown", "assumed")
    ev = [o for o in d["obligations"] if o["role"] == "evidence"]
    assert ev and d["exit_status"] == 0


def test_binding_refutation_exit_and_sites():
    r = run("examples/two_level.py", "--transform", "bind(1:warp, 2:block)", "--target", "cuda")
    assert r.returncode == 5
    assert "contains(warp, block)" in r.stdout
    assert "two_level.py:11" in r.stdout and "two_level.py:12" in r.stdout


@pytest.mark.parametrize("spec,msg,status", [("split(1, 0", "bad transform spec", 2),
                                             ("frobnicate(1)", "unknown transform", 2),
                                             ("split(9, 0, 2)", "no parallel level 9", 1)])
def test_user_errors_are_located_not_tracebacks(spec, msg, status):
    """A spec that does not parse is a usage error (2); one that parses but
    does not fit the kernel is an error in the input (1)."""
    r = run("examples/gemm.py", "--transform", spec)
    assert r.returncode == status
    assert "Traceback" not in r.stderr and msg in r.stderr


def test_parse_spec():
    assert parse_spec("split(1, 0, 2)") == ("split", (1, 0, 2), {})
    assert parse_spec("tile(1, [2, 4])") == ("tile", (1, [2, 4]), {})
    assert parse_spec("bind(1:block, 2:warp)") == ("bind", (), {"scopes": {1: "block",
                                                                           2: "warp"}})
    assert parse_spec("place_reduction(0, 4, order=strided)") == (
        "place_reduction", (0, 4), {"order": "strided"})
    assert parse_spec("schedule(0, offsets=[0, 2], versions=3)")[2] == {
        "offsets": [0, 2], "versions": 3}
