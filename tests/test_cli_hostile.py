"""The command line under hostile and careless input: its exit codes (one
meaning per number), files that are not regular files, output that cannot be
written, sizes too large to allocate, malformed campaign state, out-of-range
options and schedule fields, a kernel module raising a BaseException, a
deleted working directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tilenest import cli
from tilenest.errors import TilenestError, UsageError

ROOT = Path(__file__).resolve().parent.parent
SOFTMAX = str(ROOT / "examples" / "softmax.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "1"}

ADD = """\
import tilenest as tn

@tn.kernel
def add(x: tn.Tensor[tn.f32, 1], y: tn.Tensor[tn.f32, 1]):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(tn.cdiv(n, 4))):
        o = tn.coord(p.index() * 4)
        y(o, tn.shape(4)).store(x[o, tn.shape(4)] + 1.0)
"""

HALVES = """\
import tilenest as tn
from tilenest import f32

@tn.kernel
def halves(x: tn.Tensor[f32, 'N'], y: tn.Tensor[f32, 'M']):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        y(tn.coord(p.index() // 2), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])
"""

SCATTER = """\
import tilenest as tn
from tilenest import f32, i32

@tn.kernel
def scatter(x: tn.Tensor[f32, 'N'], idx: tn.Tensor[i32, 'N'], y: tn.Tensor[f32, 'M']):
    (n,) = x.shape
    for p in tn.parallel(tn.shape(n)):
        j = idx[tn.coord(p.index()), tn.shape(1)]
        k = tn.reduce(j, j.dim(0), tn.add)
        y(tn.coord(k), tn.shape(1)).store(x[tn.coord(p.index()), tn.shape(1)])
"""


def _main(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _cli(*argv: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tilenest.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, env=ENV, check=False, **kw)


@pytest.fixture
def add_py(tmp_path: Path) -> Path:
    f = tmp_path / "add.py"
    f.write_text(ADD)
    return f


# ---------------------------------------------------------------------------
# item 8: every exit code means one thing


def test_the_exit_code_table_is_the_one_the_module_documents():
    doc = cli.__doc__ or ""
    for code, name in ((1, "EXIT_USER_ERROR"), (2, "EXIT_USAGE"), (3, "EXIT_NOT_AVAILABLE"),
                       (4, "EXIT_REGRESSED"), (5, "EXIT_REFUTED"), (6, "EXIT_UNKNOWN"),
                       (70, "EXIT_INTERNAL"), (74, "EXIT_IO"), (130, "EXIT_INTERRUPTED")):
        assert getattr(cli, name) == code
        assert f"\n{code:<4} " in doc or f"\n{code} " in doc, code
    from tilenest.bench.compare import EXIT_REGRESSED
    from tilenest.proofs import obligation

    assert (obligation.EXIT_REFUTED, obligation.EXIT_UNKNOWN, EXIT_REGRESSED) == (5, 6, 4)


@pytest.mark.parametrize("argv", [
    ["show", SOFTMAX, "--bogus"],                     # a bad flag
    ["frobnicate"],                                   # an unknown subcommand
    ["lower", SOFTMAX, "--target", "tpu"],            # an unknown target
    ["validate", SOFTMAX, "--target", "tpu"],
    ["check", SOFTMAX, "--target", "gpu"],
    ["check", SOFTMAX, "--transform", "split(1"],     # a malformed option value
    ["check", "no_such_kernel.py"],                   # a file that does not exist
    ["bench", "--only", "bogus"],
])
def test_usage_errors_exit_2(capsys, argv):
    rc, out, err = _main(capsys, *argv)
    assert rc == 2, err
    assert "Traceback" not in err


def test_check_verdicts_have_codes_no_usage_error_shares(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "halves.py").write_text(HALVES)
    (tmp_path / "scatter.py").write_text(SCATTER)
    assert _main(capsys, "check", SOFTMAX)[0] == 0
    assert _main(capsys, "check", "halves.py")[0] == cli.EXIT_REFUTED == 5
    assert _main(capsys, "check", "scatter.py")[0] == cli.EXIT_UNKNOWN == 6
    assert _main(capsys, "check", "halves.py", "--tiemout", "1")[0] == 2  # the typo
    (tmp_path / "bad.tile").write_text("kernel @k(")
    assert _main(capsys, "check", "bad.tile")[0] == 1  # bad input, not a verdict


def test_an_internal_error_is_70_even_when_a_command_diagnosed_it(monkeypatch, capsys):
    from tilenest.errors import InternalError

    def boom(a):
        raise InternalError("the checker failed while deciding something")

    monkeypatch.setattr(cli, "cmd_show", boom)
    assert _main(capsys, "show", SOFTMAX)[0] == 70
    monkeypatch.setattr(cli, "cmd_show", lambda a: cli._parse_arg("3", None))  # fails inside
    rc, _, err = _main(capsys, "show", SOFTMAX)
    assert rc == 70 and "internal error" in err


def test_check_timeout_beyond_any_budget_is_a_usage_error(capsys):
    rc, _, err = _main(capsys, "check", SOFTMAX, "--timeout", "1e308")
    assert rc == 2 and "--timeout" in err and "longest time limit" in err
    rc, _, err = _main(capsys, "campaign", "text", "--count", "1", "--seed", "0",
                       "--shrink-secs", "nan")
    assert rc == 2 and "--shrink-secs" in err


# ---------------------------------------------------------------------------
# item 20: files that are not regular files, output that cannot be written


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    p = tmp_path / "k.py"
    os.mkfifo(p)
    return p


@pytest.mark.parametrize("cmd", ["show", "check", "lower", "validate", "run"])
def test_a_fifo_as_the_kernel_file_is_refused_at_once(fifo, cmd, capsys):
    rc, _, err = _main(capsys, cmd, str(fifo))  # would block forever if opened
    assert rc == 2 and "is a FIFO (named pipe), not a regular file" in err


@pytest.mark.parametrize("device", ["/dev/urandom", "/dev/zero"])
def test_a_device_as_the_kernel_file_is_refused(device, capsys):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    for cmd in ("show", "check"):
        rc, _, err = _main(capsys, cmd, device)
        assert rc == 2 and "is a character device, not a regular file" in err


def test_other_files_named_on_the_command_line_must_be_regular(fifo, add_py, tmp_path,
                                                               capsys):
    npy = tmp_path / "x.npy"
    os.mkfifo(npy)
    rc, _, err = _main(capsys, "run", str(add_py), str(npy), "zeros:4")
    assert rc == 2 and "argument 'x'" in err and "FIFO" in err
    rc, _, err = _main(capsys, "bench", "--compare", str(fifo))
    assert rc == 2 and "FIFO" in err
    rc, _, err = _main(capsys, "campaign", "text", "--count", "1", "--seed", "0", "--state",
                       str(fifo))
    assert rc == 2 and "FIFO" in err


def test_an_overlong_path_is_a_usage_error(capsys, tmp_path):
    long = str(tmp_path / ("a" * 5000 + ".py"))
    for argv in (["show", long], ["check", long], ["run", SOFTMAX, long + ".npy", "zeros:4x5"],
                 ["conformance", "--junit", long]):
        rc, _, err = _main(capsys, *argv)
        assert rc == 2, (argv, err)
        assert "too long" in err and "Traceback" not in err and len(err) < 1000


def test_a_file_over_the_size_limit_is_refused(tmp_path, monkeypatch, capsys):
    from tilenest import userfiles

    f = tmp_path / "big.tile"
    f.write_text("x" * 2000)
    monkeypatch.setattr(userfiles, "MAX_FILE_BYTES", 1000)
    with pytest.raises(UsageError, match="2000 bytes; a kernel or IR file is read only up to"):
        userfiles.regular_file(f, "kernel or IR file", limit=userfiles.MAX_FILE_BYTES)


def test_a_full_or_closed_stdout_is_one_line_io_error(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "tilenest.cli", "show", "--json", SOFTMAX],
                           stdout=full, stderr=subprocess.PIPE, text=True, env=ENV,
                           timeout=120, check=False)
    assert r.returncode == 74
    assert r.stderr.strip().splitlines() == [
        "error: cannot write the output: No space left on device"], r.stderr
    r = subprocess.run(f"exec {sys.executable} -m tilenest.cli show {SOFTMAX} >&-", shell=True,
                       stderr=subprocess.PIPE, text=True, env=ENV, timeout=120, check=False)
    assert r.returncode == 74
    assert r.stderr.strip().splitlines() == [
        "error: cannot write the output: standard output is closed"], r.stderr


def test_arrays_too_large_are_refused_before_allocation(add_py, tmp_path, capsys):
    rc, _, err = _main(capsys, "run", str(add_py), "zeros:100000000000", "zeros:4")
    assert rc == 2 and "argument 'x' (zeros:100000000000)" in err and "too large" in err
    rc, _, err = _main(capsys, "run", SOFTMAX, "random:100000x100000", "zeros:4x5")
    assert rc == 2 and "too large" in err
    # a .npy header claiming 2**40 elements, with no data behind it
    from numpy.lib import format as npformat

    f = tmp_path / "huge.npy"
    with f.open("wb") as out:
        npformat.write_array_header_1_0(out, {"descr": "<f4", "fortran_order": False,
                                              "shape": (2**40,)})
    rc, _, err = _main(capsys, "run", str(add_py), str(f), "zeros:4")
    assert rc == 2 and "claims 1099511627776 elements" in err and "holds 0 bytes" in err
    np.save(tmp_path / "ok.npy", np.arange(8, dtype=np.float32))
    rc, out, err = _main(capsys, "run", str(add_py), str(tmp_path / "ok.npy"), "zeros:8",
                         "--out-dir", str(tmp_path / "o"))
    assert rc == 0, err
    assert np.array_equal(np.load(tmp_path / "o" / "y.npy"), np.arange(8) + 1.0)


def test_a_base_exception_from_the_kernel_module_is_located(tmp_path, capsys):
    f = tmp_path / "boom.py"
    f.write_text("class Boom(BaseException):\n    pass\n\nraise Boom('custom')\n")
    rc, _, err = _main(capsys, "show", str(f))
    assert rc == 1 and "raised Boom: custom" in err and "boom.py:4" in err
    g = tmp_path / "boom2.py"
    g.write_text(ADD.replace("    (n,) = x.shape\n", "    (n,) = x.shape\n    helper()\n")
                 + "\n\nclass Boom(BaseException):\n    pass\n\n\ndef helper():\n"
                   "    raise Boom('inside')\n")
    rc, _, err = _main(capsys, "show", str(g))
    assert rc == 1 and "raised Boom: inside" in err and "Traceback" not in err


def test_a_deleted_working_directory_is_a_user_error(tmp_path, add_py):
    gone = tmp_path / "gone"
    gone.mkdir()
    r = subprocess.run(f"cd {gone} && rmdir {gone} && exec {sys.executable} -m tilenest.cli "
                       f"show {add_py}", shell=True, capture_output=True, text=True, env=ENV,
                       timeout=120, check=False)
    assert r.returncode == 1, r.stderr
    assert "working directory" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------
# item 25: campaign state files, schedule fields


def _state(tmp_path: Path, *lines: object) -> Path:
    p = tmp_path / "state.jsonl"
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return p


HEAD = {"campaign": "text", "seed": 0}


@pytest.mark.parametrize("lines, says", [
    (([1, 2],), ":1: not a campaign state file"),
    (("null",), ":1: not a campaign state file"),
    ((HEAD, [1], {"i": 0, "status": "ok"}), ":2: corrupt record (a JSON list"),
    ((HEAD, {"status": "ok"}, HEAD), ":2: corrupt record (its item index 'i' is None"),
    ((HEAD, {"i": "0", "status": "ok"}, HEAD), "'i' is '0'"),
    ((HEAD, {"i": -1, "status": "ok"}, HEAD), "'i' is -1"),
    ((HEAD, {"i": 0}, HEAD), "its 'status' is None"),
    ((HEAD, {"i": 0, "status": "ok", "targets": 3}, HEAD), "'targets'"),
    ((HEAD, {"i": 0, "status": "ok", "secs": "x"}, HEAD), "'secs'"),
])
def test_malformed_state_files_are_located_errors(tmp_path, lines, says):
    from tilenest.validation.campaign import load_state

    p = _state(tmp_path, *lines)
    with pytest.raises(TilenestError) as e:
        load_state(p, "text", 0, 4)
    assert says in e.value.message and str(p) in e.value.message


def test_records_outside_the_campaign_are_not_counted(tmp_path):
    from tilenest.validation.campaign import load_state

    p = _state(tmp_path, HEAD, *({"i": i, "status": "ok"} for i in range(3)))
    st = load_state(p, "text", 0, 2)
    assert sorted(st.records) == [0, 1]
    assert st.summary()["done"] == 2 and st.summary()["count"] == 2


def test_a_malformed_state_file_through_the_cli(tmp_path, capsys):
    p = _state(tmp_path, {"campaign": "fuzz-text", "seed": 0}, {"i": "zero", "status": "ok"},
               HEAD)
    rc, _, err = _main(capsys, "campaign", "text", "--count", "1", "--seed", "0", "--state",
                       str(p))
    assert rc == 1 and "corrupt record" in err and "Traceback" not in err


@pytest.mark.parametrize("field, says", [("block_threads=0", "a positive int"),
                                         ("threads=0", "a positive int"),
                                         ("vector_bits=7", "128, 256 or 512"),
                                         ("chunk=0", "a positive int"),
                                         ("vector_lanes=3", "1, 2, 4 or 8"),
                                         ("index_bits=16", "32 or 64")])
def test_schedule_fields_out_of_range_are_usage_errors(field, says, capsys):
    rc, _, err = _main(capsys, "lower", SOFTMAX, "--set", field)
    assert rc == 2 and f"--set {field}" in err and says in err


def test_a_block_size_the_simt_form_cannot_run_is_refused_when_lowered(capsys):
    rc, _, err = _main(capsys, "lower", SOFTMAX, "--target", "cuda", "--set", "block_threads=48")
    assert rc == 2 and "block_threads=48" in err and "multiple of 32" in err


def test_schedule_values_are_checked_wherever_a_schedule_is_made():
    from tilenest.lowering.schedule import Schedule, default_schedule

    (_, prog), = cli.load_programs(SOFTMAX)
    with pytest.raises(UsageError, match="block_threads=0: threads per program"):
        default_schedule(prog, "cuda", block_threads=0)  # not silently 256
    with pytest.raises(UsageError, match="threads=0"):
        Schedule(threads=0)
    with pytest.raises(UsageError, match="chunk=0"):
        default_schedule(prog).with_(chunk=0)
    assert default_schedule(prog, "cuda", block_threads=128).block_threads == 128
