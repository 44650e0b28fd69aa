"""scripts/simt_sources.py: the manifest of generated CUDA sources is stable
from run to run, and its comparison reports every changed, missing, new or
refused source."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "simt_sources.py"
#: one small workload schedule: its default and the tuner's eight variants
ONLY = "workload/add/f32/br=1,bc=128"


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("_simt_sources_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules[spec.name]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--quiet", *args], check=False,
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    """The manifest of ``ONLY`` written by a process of its own."""
    out = tmp_path_factory.mktemp("manifest") / "a.json"
    r = _run("--only", ONLY, "--out", str(out))
    assert r.returncode == 0, r.stderr
    return out


def test_manifest_is_stable_and_compare_passes(fresh, tmp_path):
    a, b = fresh, tmp_path / "b.json"
    r2 = _run("--only", ONLY, "--out", str(b), "--compare", str(a), "--dump",
              str(tmp_path / "src"))
    assert r2.returncode == 0, r2.stdout + r2.stderr
    first = json.loads(a.read_text())
    assert first == json.loads(b.read_text())
    assert ONLY in first and len(first) >= 2 and all(k.startswith(ONLY) for k in first)
    # each dumped source is the text whose hash the manifest holds
    for key, value in first.items():
        text = (tmp_path / "src" / (key + ".cu")).read_text()
        assert "__global__" in text
        assert hashlib.sha256(text.encode()).hexdigest() == value


def test_compare_of_stored_manifests_names_each_difference(tmp_path):
    old = {"k/same": "1", "k/changed": "2", "k/gone": "3"}
    new = {"k/same": "1", "k/changed": "9", "k/added": "4"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    (tmp_path / "new.json").write_text(json.dumps(new))
    r = _run("--compare", str(tmp_path / "old.json"), "--against", str(tmp_path / "new.json"))
    assert r.returncode == 1
    lines = r.stdout.splitlines()
    assert any(ln.startswith("changed") and "k/changed" in ln for ln in lines)
    assert any(ln.startswith("missing") and "k/gone" in ln for ln in lines)
    assert any(ln.startswith("new") and "k/added" in ln for ln in lines)
    assert not any("k/same" in ln for ln in lines)
    same = _run("--compare", str(tmp_path / "old.json"), "--against", str(tmp_path / "old.json"))
    assert same.returncode == 0 and same.stdout == ""


def test_an_edited_source_and_a_refusal_are_differences(tool, fresh, monkeypatch):
    from tilenest.backends import Target
    from tilenest.errors import UsageError

    # emitting other kernels first in this process changes nothing: each
    # key's text is the one a fresh process emits
    tool.manifest("workload/softmax/f32/rp=[4]", progress=False)
    base = tool.manifest(ONLY, progress=False)
    assert base == json.loads(fresh.read_text())
    emit = Target.emit
    victim = ONLY + "+row_registers=0,cache_hints=False,block_threads=512"
    assert victim in base

    def edited(self, program, stage, schedule=None):
        text = emit(self, program, stage, schedule)
        if schedule is not None and schedule.block_threads == 512:
            if schedule.cache_hints or schedule.stage_loads:
                raise UsageError("refused for the test")
            return text + "// one more line\n"
        return text

    monkeypatch.setattr(Target, "emit", edited)
    now = tool.manifest(ONLY, progress=False)
    diff = tool.compare(base, now, ONLY)
    assert any(ln.startswith("changed") and f"{victim}  (" in ln for ln in diff)
    refused = [k for k, v in now.items() if v == "refused: UsageError"]
    assert refused and all("block_threads=512" in k for k in refused)
    assert len(diff) == 1 + len(refused)
