"""TileIR modules (spec/interchange.md I-19): a text or JSON document of several
kernels reads back equal through every reader, and the one-kernel readers say
which kernels there are when they are not told which one to take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import tilenest as tn
from tilenest import cli
from tilenest.errors import ParseError
from tilenest.semantics import jsonio
from tilenest.semantics.loading import load_module_file, load_program_file
from tilenest.semantics.parser import parse_module, read_module_unverified

ROOT = Path(__file__).resolve().parent.parent
TWO = ROOT / "examples" / "causal_attention.py"  # defines two kernels


def _show(capsys, *args: str) -> str:
    assert cli.main(["show", *args]) == 0
    return capsys.readouterr().out


def test_show_of_a_file_of_two_kernels_parses_back(capsys, tmp_path):
    text = _show(capsys, str(TWO))
    m = tn.parse_module(text, "two.tile")
    assert m.names == ("causal_attention", "causal_attention_blocked")
    assert str(m) == text
    f = tmp_path / "two.tile"
    f.write_text(text)
    assert _show(capsys, str(f)) == text  # the CLI reads its own output
    assert load_module_file(f) == m


def test_show_json_of_two_kernels_is_one_module_document(capsys, tmp_path):
    doc = _show(capsys, str(TWO), "--json")
    d = json.loads(doc)
    assert d["schema"] == "tilenest.tileir/1"
    assert [k["name"] for k in d["kernels"]] == ["causal_attention", "causal_attention_blocked"]
    f = tmp_path / "two.json"
    f.write_text(doc)
    text = _show(capsys, str(TWO))
    assert _show(capsys, str(f)) == text
    assert jsonio.loads_module(doc) == tn.parse_module(text)
    one = _show(capsys, str(f), "--kernel", "causal_attention_blocked")
    assert one == str(tn.parse(text, kernel="causal_attention_blocked"))


def test_one_kernel_readers_name_the_kernels(capsys, tmp_path):
    text = _show(capsys, str(TWO))
    with pytest.raises(ParseError, match="2 kernels") as e:
        tn.parse(text)
    assert "@causal_attention, @causal_attention_blocked" in e.value.message
    assert "parse_module" in e.value.hint
    with pytest.raises(ParseError, match="no kernel @nope"):
        tn.parse(text, kernel="nope")
    f = tmp_path / "two.tile"
    f.write_text(text)
    assert load_program_file(f, "causal_attention").name == "causal_attention"
    with pytest.raises(ParseError, match="2 kernels"):
        load_program_file(f)


def test_a_single_kernel_text_is_a_module_of_one(capsys):
    text = _show(capsys, str(ROOT / "examples" / "softmax.py"))
    p = tn.parse(text)
    m = tn.parse_module(text)
    assert len(m) == 1 and m[0] == p and m[p.name] == p
    assert str(m) == text == str(p)
    assert jsonio.to_json_module(m) == jsonio.to_json(p)  # a module of one is its program


def test_kernels_of_a_module_are_self_contained():
    """Each kernel has its own symbols, dims and op ids from 0: the same names
    in two kernels are no clash, and each reads as it would alone."""
    one = ("kernel @a(%t: tensor<f32, [#d:N]>) syms [N] assume [] dims [#d = \"d\"] {\n"
           "  %x = const {value = 1.0} : f32\n}\n")
    two = one.replace("@a", "@b")
    m = parse_module(one + "\n" + two)
    assert m[0] == tn.parse(one) and m[1] == tn.parse(two)
    assert [op.oid for op in m[1].walk()] == [op.oid for op in m[0].walk()] == [0]


def test_a_kernel_name_given_twice_is_located():
    k = "kernel @a(%x: f32) syms [] dims [] {\n  %y = add %x, %x : f32\n}\n"
    with pytest.raises(ParseError, match="@a is defined twice") as e:
        parse_module(k + "\n" + k, "m.tile")
    assert (e.value.sites[0].line, e.value.sites[0].col) == (5, 8)
    assert "m.tile:1:8" in e.value.hint
    d = jsonio.to_json_module(read_module_unverified(k + "\n" + k.replace("@a", "@b")))
    d["kernels"][1]["name"] = "a"
    with pytest.raises(ParseError, match=r"kernels\[1\]\.name: kernel 'a' is defined twice"):
        jsonio.from_json_module(d)


def test_json_module_errors_name_the_kernel_path():
    k = "kernel @a(%x: f32) syms [] dims [] {\n  %y = add %x, %x : f32\n}\n"
    d = jsonio.to_json_module(read_module_unverified(k + "\n" + k.replace("@a", "@b")))
    d["kernels"][1]["body"]["ops"][0]["operands"] = ["nope"]
    with pytest.raises(ParseError, match=r"error: kernels\[1\]\.body\.ops\[0\]\.operands"):
        jsonio.from_json_module(d)
    with pytest.raises(ParseError, match="at least one kernel"):
        jsonio.from_json_module({"schema": "tilenest.tileir/1", "kernels": []})
    with pytest.raises(ParseError, match="not a list") as e:
        jsonio.from_json_module([jsonio.to_json(tn.parse(k))])
    assert '"kernels"' in e.value.hint


def test_a_conformance_case_of_two_kernels_is_refused_by_name(capsys, tmp_path):
    """A case program is a module of one kernel (spec/conformance/README.md):
    the runner's loader names the kernels of a file of several."""
    from tilenest.conformance import load_program

    f = tmp_path / "two.tile"
    f.write_text(_show(capsys, str(TWO)))
    with pytest.raises(ParseError, match=r"2 kernels \(@causal_attention, "):
        load_program(f)
    one = tmp_path / "one.tile"
    one.write_text(str(tn.parse(f.read_text(), kernel="causal_attention")))
    assert load_program(one).name == "causal_attention"
