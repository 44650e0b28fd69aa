"""The command line: show works on kernel and IR files, user errors print a
located message (never a traceback), unbuilt subcommands say so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tilenest import cli

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tilenest.cli", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_show_kernel_file_and_json(tmp_path):
    r = run("show", "examples/gemm.py")
    assert r.returncode == 0, r.stderr
    assert "kernel @gemm" in r.stdout and "pipeline" in r.stdout
    r = run("show", "examples/softmax.py", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["schema"] == "tilenest.tileir/1"
    # the printed text re-parses
    t = tmp_path / "softmax.tile"
    t.write_text(run("show", "examples/softmax.py").stdout)
    r2 = run("show", str(t))
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout.strip() == t.read_text().strip()


def test_bad_ir_text_gives_line_col_not_traceback(tmp_path):
    bad = tmp_path / "bad.tile"
    bad.write_text('kernel @k() syms [] assume [] dims [] {\n  %0 = frobnicate : f32\n}\n')
    r = run("show", str(bad))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert f"{bad}:2:" in r.stderr
    assert "parse error" in r.stderr


def test_ill_typed_kernel_reports_user_line(tmp_path):
    src = tmp_path / "k.py"
    src.write_text(
        "import tilenest as tn\n"
        "@tn.kernel\n"
        "def k(x: tn.Tensor[tn.f32, 1], y: tn.Tensor[tn.i32, 1]):\n"
        "    for p in tn.parallel(tn.shape(1)):\n"
        "        y(tn.coord(0), tn.shape(4)).store(x[tn.coord(0), tn.shape(4)])\n")
    r = run("show", str(src))
    assert r.returncode == 1
    assert "Traceback" not in r.stderr
    assert "k.py:5:" in r.stderr and "hint:" in r.stderr


def test_every_subcommand_exists():
    for cmd in ("show", "run", "check", "lower", "validate", "conformance", "bench"):
        r = run(cmd, "--help")
        assert r.returncode == 0, (cmd, r.stderr)


def test_bench_with_an_unknown_benchmark_names_the_valid_ones():
    r = run("bench", "--only", "bogus")
    assert r.returncode == 2 and "valid names" in r.stderr and "Traceback" not in r.stderr


def test_run_writes_outputs_and_reports_races(tmp_path):
    import numpy as np

    x = np.random.default_rng(0).standard_normal((5, 9)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = run("run", "examples/softmax.py", str(tmp_path / "x.npy"), "zeros:5x9",
            "--out-dir", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr
    y = np.load(tmp_path / "y.npy")
    e = np.exp(x - x.max(1, keepdims=True))
    assert np.allclose(y, e / e.sum(1, keepdims=True), rtol=1e-5)
    racy = tmp_path / "racy.py"
    racy.write_text(
        "import tilenest as tn\n"
        "@tn.kernel\n"
        "def k(x: tn.Tensor[tn.f32, 1], y: tn.Tensor[tn.f32, 1]):\n"
        "    (n,) = x.shape\n"
        "    for p in tn.parallel(tn.shape(n)):\n"
        "        y(tn.coord(0), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])\n")
    r = run("run", str(racy), "random:4", "zeros:4", "--out-dir", str(tmp_path))
    assert r.returncode == 1 and "race" in r.stderr and "Traceback" not in r.stderr
    assert "racy.py:6:" in r.stderr


def test_missing_file():
    r = run("show", "nope.py")
    assert r.returncode == 2 and "no such file" in r.stderr


#: a kernel file holding the bf16 GEMM workload's kernel (tile constants bm, bn, bk)
GEMM_BF16 = """import tilenest as tn
from tilenest.workloads.gemm import gemm_kernel

gemm = gemm_kernel(tn.bf16)
"""


def test_lower_takes_constants_and_schedule_fields(tmp_path, capsys):
    """``--const`` specializes the kernel, ``--set`` sets schedule fields:
    the warpgroup GEMM's loop IR; the same kernel's default tile is refused
    for wgmma with the reason."""
    f = tmp_path / "gemm_bf16.py"
    f.write_text(GEMM_BF16)
    rc = cli.main(["lower", str(f), "--target", "cuda", "--const", "bm=128", "--const",
                   "bn=256", "--const", "bk=64", "--set", "mma_unit=wgmma", "--set", "stages=3"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "swizzle128(128x64)" in out and "group_mma.overlap.64x256x64" in out
    rc = cli.main(["lower", str(f), "--target", "cuda", "--set", "mma_unit=wgmma",
                   "--const", "bm=32", "--const", "bn=64", "--const", "bk=64"])
    err = capsys.readouterr().err
    assert rc == 1 and "wgmma needs rows in multiples of 64" in err and "Traceback" not in err


@pytest.mark.parametrize("target,field", [("cuda", "threads=4"), ("cuda", "chunk=8"),
                                          ("llvm", "min_blocks=2"), ("llvm", "index_bits=64")])
def test_schedule_field_the_target_never_reads_is_refused(target, field, capsys):
    """A ``--set`` field the target does not use would change nothing: an
    error naming the field and the target, not a silent no-op."""
    rc = cli.main(["lower", str(ROOT / "examples" / "softmax.py"), "--target", target,
                   "--emit", "loopir", "--set", field])
    err = capsys.readouterr().err
    name = field.partition("=")[0]
    assert rc == 2 and f"{name} is not used by the {target} target" in err
    assert "hint:" in err and "Traceback" not in err


def test_const_on_tileir_is_an_error(tmp_path, capsys):
    f = tmp_path / "k.json"
    assert cli.main(["show", str(ROOT / "examples" / "softmax.py"), "--json"]) == 0
    f.write_text(capsys.readouterr().out)
    rc = cli.main(["lower", str(f), "--const", "rp=2"])
    err = capsys.readouterr().err
    assert rc == 1 and "--const" in err and "TileIR" in err


def test_validate_takes_several_files():
    """`tilenest validate examples/*.py` validates the kernels of every file;
    `--kernel` picks that kernel from the files that define it."""
    r = run("validate", "examples/softmax.py", "examples/rmsnorm.py", "--cases", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validated row_softmax" in r.stdout and "validated rmsnorm" in r.stdout
    r = run("validate", "examples/softmax.py", "examples/rmsnorm.py", "--cases", "2",
            "--kernel", "rmsnorm")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validated rmsnorm" in r.stdout and "row_softmax" not in r.stdout
    r = run("validate", "examples/softmax.py", "examples/rmsnorm.py", "--kernel", "nope")
    assert r.returncode == 2 and "none of the 2 files defines it" in r.stderr
