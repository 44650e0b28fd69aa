"""The docs site (mkdocs.yml, docs/): it builds with warnings as errors, and
every code block of its hand-written pages runs.

Pages under spec/ of the site are the spec files themselves; their examples
are run by tests/test_spec_examples.py and tests/test_interchange.py, so only
the blocks of docs/*.md are run here. A ```python block runs on its own (a
fresh namespace, a temporary working directory); a ```sh block's lines that
start with ``tilenest`` run from the repository root and must exit 0. A block
is skipped only when the line before its fence is
``<!-- docs-test: skip REASON -->`` with a non-empty reason."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^(?:<!--\s*docs-test:\s*skip(?P<reason>[^\n]*?)-->\n)?"
                   r"```(?P<lang>[\w-]*)[^\n]*\n(?P<code>.*?)^```\s*$", re.S | re.M)


def pages() -> list[Path]:
    """The hand-written pages (the hook folder holds no pages)."""
    return sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.relative_to(DOCS).parts)


def blocks(lang: str) -> list[tuple[str, str, str | None]]:
    """(id, code, skip reason or None) of every ``lang`` block of the pages."""
    out = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        n = 0
        for m in BLOCK.finditer(text):
            if m.group("lang") != lang:
                continue
            n += 1
            line = text.count("\n", 0, m.start("code"))
            name = f"{page.relative_to(DOCS).as_posix()}:{line}"
            reason = m.group("reason")
            out.append((name, m.group("code"), None if reason is None else reason.strip()))
    return out


PYTHON = blocks("python")
SHELL = [(name, line.split("#")[0].strip(), reason)
         for name, code, reason in blocks("sh")
         for line in code.splitlines() if line.startswith("tilenest ")]
HAS_MKDOCS = all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings"))


def test_blocks_found_and_skips_give_a_reason():
    assert len(PYTHON) >= 8 and len(SHELL) >= 3
    for name, _, reason in PYTHON + SHELL:
        assert reason is None or reason, f"{name}: a skipped block must say why"


@pytest.mark.skipif(not HAS_MKDOCS, reason="mkdocs, mkdocs-material or mkdocstrings is not "
                    "installed (pip install -e '.[docs]')")
def test_site_builds_strict(tmp_path):
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                        "--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    for page in ("index.html", "getting-started/index.html", "spec/values/index.html",
                 "spec/obligations/index.html", "targets/llvm/index.html",
                 "targets/cuda/index.html", "api/index.html"):
        assert (site / page).is_file(), page
    # rule anchors and included spec sections are there
    assert 'id="v-1"' in (site / "spec/values/index.html").read_text()
    assert "The LLVM backend" in (site / "targets/llvm/index.html").read_text()
    assert "class Schedule" in (site / "api/index.html").read_text() or \
        "Schedule" in (site / "api/index.html").read_text()


@pytest.mark.parametrize("name,code,reason", PYTHON, ids=[b[0] for b in PYTHON])
def test_python_block(name, code, reason, tmp_path, monkeypatch):
    if reason is not None:
        pytest.skip(reason)
    src = tmp_path / (re.sub(r"\W", "_", name) + ".py")
    src.write_text(code)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TILENEST_CACHE_DIR", str(tmp_path / "cache"))
    exec(compile(code, str(src), "exec"), {"__name__": "docs_block", "__file__": str(src)})


@pytest.mark.parametrize("name,command,reason", SHELL, ids=[f"{b[0]}:{b[1]}" for b in SHELL])
def test_shell_command(name, command, reason, tmp_path):
    if reason is not None:
        pytest.skip(reason)
    exe = Path(sys.executable).with_name("tilenest")
    argv = [str(exe) if exe.exists() else "tilenest", *shlex.split(command)[1:]]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "TILENEST_CACHE_DIR": str(tmp_path / "cache")})
    assert r.returncode == 0, f"{command}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    assert r.stdout.strip(), f"{command} printed nothing"
