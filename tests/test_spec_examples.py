"""Every rule of spec/ carries an example; each runs on its own and checks the
rule it illustrates (spec/README.md, "Examples")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SPEC = Path(__file__).resolve().parent.parent / "spec"
BLOCK = re.compile(r"^```python \{rule=([A-Z]-\d+)\}\n(.*?)^```", re.S | re.M)


def blocks():
    out = []
    for f in sorted(SPEC.glob("*.md")):
        if f.name == "interchange.md":  # run by tests/test_interchange.py
            continue
        for m in BLOCK.finditer(f.read_text()):
            out.append((f"{f.stem}:{m.group(1)}", m.group(2)))
    return out


BLOCKS = blocks()


def test_every_rule_has_an_example():
    for f in sorted(SPEC.glob("*.md")):
        text = f.read_text()
        rules = re.findall(r"^### ([A-Z]-\d+)", text, re.M)
        examples = set(re.findall(r"\{rule=([A-Z]-\d+)\}", text))
        missing = [r for r in rules if r not in examples and "withdrawn" not in r]
        assert not missing, f"{f.name}: rules without an example: {missing}"
    assert len(BLOCKS) >= 50


@pytest.mark.parametrize("name,code", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_spec_example(name, code, tmp_path, monkeypatch):
    src = tmp_path / f"{name.replace(':', '_')}.py"
    src.write_text(code)
    monkeypatch.chdir(tmp_path)
    exec(compile(code, str(src), "exec"), {"__name__": f"spec_{name}", "__file__": str(src)})
