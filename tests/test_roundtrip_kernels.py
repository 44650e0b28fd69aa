"""Every example and construct kernel captures, prints, parses back equal and
round-trips through JSON (DESIGN.md: interchange)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

import kernels_constructs as K
import tilenest as tn
from tilenest.semantics.jsonio import from_json, to_json
from tilenest.semantics.parser import parse_program
from tilenest.semantics.verify import verify

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example_kernels() -> list[tuple[str, tn.Kernel]]:
    out = []
    for f in sorted(EXAMPLES.glob("*.py")):
        mod = importlib.import_module(f.stem)
        out += [(f"{f.stem}.{n}", k) for n, k in vars(mod).items() if isinstance(k, tn.Kernel)]
    return out


KERNELS = example_kernels() + [(k.fn.__name__, k) for k in K.ALL]


@pytest.mark.parametrize("name,k", KERNELS, ids=[n for n, _ in KERNELS])
def test_text_roundtrip(name, k):
    p = k.program
    text = str(p)
    q = parse_program(text, "rt.tile")
    assert q == p
    assert str(q) == text
    verify(q)


@pytest.mark.parametrize("name,k", KERNELS, ids=[n for n, _ in KERNELS])
def test_json_roundtrip(name, k):
    p = k.program
    d = to_json(p)
    s = json.dumps(d)
    assert from_json(json.loads(s)) == p


def test_examples_cover_required_kinds():
    names = {n.split(".")[0] for n, _ in example_kernels()}
    assert {"softmax", "gemm", "rmsnorm", "two_level", "folds", "ragged"} <= names
    g = dict(example_kernels())["gemm.gemm"].program
    assert any(op.name == "pipeline" for op in g.walk())
    assert sum(op.name == "stage" for op in g.walk()) == 2
    tl = dict(example_kernels())["two_level.scale_rows"].program
    scopes = [op.attr("exec").scope for op in tl.walk() if op.name == "parallel"]
    assert scopes == ["block", "warp"]


def test_capture_is_deterministic():
    a = K.values_zoo.specialize().program
    b = K.values_zoo.specialize().program
    assert a == b and str(a) == str(b)
