"""Compiled Metal kernels run on the emulated device and agree with the interpreter.

The generated MSL itself runs on the host emulator's ``metal`` dialect
(``backends/metal/emulated.py``): every example validates through the CLI
against the reference interpreter, a row softmax gives the interpreter's
admitted result under every thread interleaving policy and poison, the
default device off macOS is the emulator, a nonzero status word raises the
error of its site, and an f64 program is refused with its line.
"""

from __future__ import annotations

import functools
import glob
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import metal
from tilenest.backends.simt.emulator import POISONS, POLICIES
from tilenest.cli import load_programs
from tilenest.errors import BoundsError, NotAvailableError
from tilenest.targets import row

from suite_shares import metal_share

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "examples", "*.py")))
#: examples validated by default with fewer generated cases and smaller
#: threadgroups: the attention example's 20 cases at its 256 threads per
#: threadgroup take some 90 s on the emulator (every thread of a threadgroup
#: meets every barrier of every key block); 4 cases at 64 threads take 11 s.
#: Under -m slow they validate with the CLI's defaults.
QUICK = {"causal_attention.py": ("--cases", "4", "--set", "block_threads=64")}


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tilenest.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=timeout)


def _program(example: str, name: str) -> tn.TileProgram:
    return dict(load_programs(os.path.join(ROOT, "examples", example)))[name]


def _validate_example(example: str, *extra: str) -> None:
    r = _cli("validate", f"examples/{example}", "--target", "metal", *extra)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validated" in r.stdout and "target='metal'" in r.stdout
    assert not [ln for ln in r.stdout.splitlines() if ln.startswith(("refused", "MISMATCH"))]


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_validates_on_metal(example: str) -> None:
    _validate_example(example, *QUICK.get(example, ()))


@pytest.mark.slow
@pytest.mark.parametrize("example", sorted(QUICK))
def test_the_quick_examples_validate_with_the_defaults_on_metal(example: str) -> None:
    _validate_example(example)


def test_the_default_device_off_macos_is_the_emulator() -> None:
    k = metal.compile_program(_program("ragged.py", "axpy"))
    assert k.device == ("gpu" if sys.platform == "darwin" else "emulated")
    assert row("metal").runs and row("metal").host_run == {"device": "emulated"}


def test_row_softmax_under_every_policy_and_poison() -> None:
    """Every interleaving policy, each with every poison, gives a result the
    reference admits (compared on several sizes, none skipped)."""
    prog = _program("softmax.py", "row_softmax")
    k = metal.compile_program(prog, device="emulated")
    assert {h["policy"] for h in k.interleavings} == set(POLICIES)
    for policy in POLICIES:
        for poison in POISONS:
            run = functools.partial(k, policy=policy, poison=poison, seed=3)
            rep = tn.validate(prog, compiled=run, cases=3, seed=1)
            assert rep.ok and rep.count("ok") == 3, (policy, poison, rep)


def test_softmax_values_and_the_read_only_input() -> None:
    prog = _program("softmax.py", "row_softmax")
    k = metal.compile_program(prog, device="emulated")
    x = np.random.default_rng(0).standard_normal((5, 300)).astype(np.float32)
    x.flags.writeable = False  # an input the kernel only reads
    y = np.zeros_like(x)
    k(x, y, policy="reversed", poison="nan")
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


@tn.kernel
def _head(x: tn.Tensor[tn.f32, 1], y: tn.Tensor[tn.f32, 1]):
    y(tn.coord(0), tn.shape(4), tn.bounds.assume).store(
        x[tn.coord(0), tn.shape(4), tn.bounds.assume])  # the promise


def test_a_failing_check_raises_the_error_of_its_site() -> None:
    """In a checked build a broken ``bounds.assume`` promise stores its code
    in the status word; the call raises the BoundsError of the promise's site."""
    k = metal.compile_program(_head.program, device="emulated", check_assumes=True)
    x, y = np.arange(4, dtype=np.float32), np.zeros(4, np.float32)
    k(x, y)
    assert y.tolist() == [0, 1, 2, 3]
    with pytest.raises(BoundsError, match="bounds.assume promise") as e:
        k(np.arange(3, dtype=np.float32), y)
    line = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1)
                if "# the promise" in t)
    assert any(s.line == line for s in e.value.sites), e.value.sites


F64 = """\
import tilenest as tn
from tilenest import f32, f64


@tn.kernel
def widen(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], *, block=64):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, block))):
        o = tn.coord(p.index() * block)
        wide = x[o, tn.shape(block)].astype(f64)
        y(o, tn.shape(block)).store((wide * 2.0).astype(f32))
"""


def test_an_f64_kernel_is_refused_with_its_line(tmp_path) -> None:
    path = tmp_path / "widen.py"
    path.write_text(textwrap.dedent(F64))
    line = next(i for i, t in enumerate(F64.splitlines(), 1) if ".astype(f64)" in t)
    r = _cli("validate", str(path), "--target", "metal")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    out = r.stdout + r.stderr
    assert "not available widen" in out and "op 'cast' computes in f64" in out, out
    assert f"widen.py:{line}:" in out, out
    prog = dict(load_programs(str(path)))["widen"]
    with pytest.raises(NotAvailableError) as e:
        tn.validate(prog, "metal", cases=1)
    assert any(s.line == line for s in e.value.sites), e.value.sites


def _conformance(*args: str) -> dict:
    r = _cli("conformance", "--target", "metal", "--json", *args, timeout=1800)
    assert r.stdout.startswith("{"), r.stderr[-4000:]
    return json.loads(r.stdout)


def test_bf16_tensors_travel_as_their_bits() -> None:
    """A bf16 tensor reaches the emulated kernel as its 16-bit patterns (the
    conformance case that stores bf16 values passes)."""
    rep = _conformance("--case", "V13-bf16-storage")
    assert rep["summary"]["cases"] == 1 and rep["summary"]["passed"] == 1, rep["cases"]


def test_an_f64_case_is_unsupported_with_the_line_of_its_text() -> None:
    """A conformance case whose program holds f64 is skipped as unsupported
    by the metal row (no f64), with Metal's refusal at the kernel's line in
    the case's TileIR text; the run still succeeds."""
    r = _cli("conformance", "--target", "metal", "--json", "--case", "V13-casts")
    assert r.returncode == 0, r.stdout + r.stderr
    [c] = json.loads(r.stdout)["cases"]
    assert c["status"] == "skip" and "metal target has no f64" in c["detail"], c
    assert "V13-casts.tile:1:" in c["detail"], c


def test_a_refusal_in_a_text_program_names_the_op_line(tmp_path) -> None:
    """Ops read from TileIR text carry where they were read: an op computing
    in f64 is refused at its line of the text (the program has no Python
    source lines), and the site does not change the program's equality."""
    text = textwrap.dedent("""\
        kernel @w(%x: tensor<f32, [#n:n]>, %y: tensor<f32, [#n:n]>)
            syms [n] assume [] dims [#n = "x.0"] {
          %v = tensor.load %x {vars = ($0), map = ($0), valid = true, bounds = zero} : tile<f32, [#n:4]>
          %d = cast %v : tile<f64, [#n:4]>
          %f = cast %d : tile<f32, [#n:4]>
          tensor.store %y, %f {vars = ($0), map = ($0), valid = true, bounds = zero}
        }
        """)
    from tilenest.semantics.printer import print_program

    prog = tn.parse(text, "w.tile")
    assert print_program(prog) == print_program(tn.parse(text))  # no site in the text
    assert prog == tn.parse(print_program(prog))
    with pytest.raises(NotAvailableError, match="op 'cast' computes in f64") as e:
        metal.compile_program(prog, device="emulated")
    assert [(s.file, s.line) for s in e.value.sites] == [("w.tile", 4)], e.value.sites


def _check_metal_report(rep: dict) -> None:
    """Every case passes except those whose programs hold f64 values, which
    the metal row cannot run, and the FP8 ones (V-24), which it does not
    compile yet: those are unsupported (skipped) with the site of Metal's
    refusal."""
    bad = [c for c in rep["cases"] if c["status"] != "pass"]
    assert rep["summary"]["passed"] + len(bad) == rep["summary"]["cases"]
    assert all(c["status"] == "skip" and ".tile:" in c["detail"] and (
        "no double" in c["detail"] or "does not compile FP8" in c["detail"]) for c in bad), bad
    assert any("does not compile FP8" in c["detail"] for c in bad)
    assert {c["name"] for c in rep["cases"] if c["name"].startswith("V24-")
            and c["expect"] == "admitted"} <= {c["name"] for c in bad}


def test_conformance_share_on_metal() -> None:
    """A third of the conformance suite, from every rule group, on the
    emulated Metal device (``suite_shares.metal_share``: CUDA runs the rest)."""
    names = metal_share()
    rep = _conformance(*[a for n in names for a in ("--case", n)])
    assert sorted(c["name"] for c in rep["cases"]) == names  # exactly the sample, once each
    _check_metal_report(rep)


@pytest.mark.slow
def test_conformance_on_metal() -> None:
    """The whole conformance suite on the emulated Metal device."""
    _check_metal_report(_conformance())
