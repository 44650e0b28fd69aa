"""``tilenest bench`` (tilenest.bench): the suites run at their smallest sizes
with one or two samples, and their JSON says what was measured. These check
that the benchmarks run and are reported consistently, never a speed."""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from contextlib import contextmanager, redirect_stdout
from pathlib import Path

import pytest

from tilenest import bench, progress
from tilenest.bench import codegen, timing
from tilenest.errors import NotAvailableError, TilenestError

ROOT = Path(__file__).resolve().parent.parent


def _args(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    bench.add_arguments(ap)
    return ap.parse_args(list(argv))


def _run_json(capsys, *argv: str) -> tuple[int, dict]:
    status = bench.run(_args(*argv, "--json"))
    return status, json.loads(capsys.readouterr().out)


def _check_timing(t: dict) -> None:
    assert t["median_s"] > 0 and t["min_s"] <= t["median_s"] <= t["max_s"]
    assert t["spread"] >= 0 and t["samples"] >= 1 and t["calls"] >= 1


@pytest.fixture(scope="module")
def codegen_run():
    """The codegen suite, small, 2 samples of at least 5 ms, one thread (in a
    worker process, as always): its JSON and the labels its progress bar got."""
    labels: list[str] = []
    real = progress.bar

    @contextmanager
    def bar(description, total):
        labels.append(f"total {total}")
        yield lambda label="", advance=1: labels.append(label)

    progress.bar = bar
    out = io.StringIO()
    try:
        with redirect_stdout(out):
            status = bench.run(_args("--size", "small", "--samples", "2", "--threads", "1",
                                     "--min-sample-ms", "5", "--json"))
    finally:
        progress.bar = real
    assert status == 0
    return json.loads(out.getvalue()), labels


@pytest.fixture(scope="module")
def codegen_doc(codegen_run):
    return codegen_run[0]


def test_codegen_reports_every_benchmark(codegen_doc):
    doc = codegen_doc
    assert doc["schema"] == bench.SCHEMA and doc["suite"] == "codegen"
    assert doc["target"] == "llvm" and doc["threads"] == [1] and doc["samples"] == 2
    rows = doc["benchmarks"]
    assert [r["name"] for r in rows] == list(codegen.NAMES)   # one GEMM shape at small
    for r in rows:
        assert "error" not in r, r
        _check_timing(r["tilenest"])
        assert r["tilenest"]["samples"] >= 2 and r["compile_s"] > 0
        assert "numpy" in r["baselines"]
        for name, base in r["baselines"].items():
            _check_timing(base)
            # the ratio is computed from the baseline timed in this very run
            assert r["ratios"][name] == pytest.approx(base["median_s"]
                                                      / r["tilenest"]["median_s"])
    has_torch = doc["environment"]["torch"] is not None
    assert ("torch" in rows[0]["baselines"]) == has_torch


def test_codegen_table_lists_the_rows(codegen_doc):
    from rich.console import Console

    con = Console(width=200, record=True, file=io.StringIO())
    con.print(codegen.table(codegen_doc["benchmarks"]))
    text = con.export_text()
    for r in codegen_doc["benchmarks"]:
        assert r["workload"] in text and f"{r['ratios']['numpy']:.2f}x" in text


def test_one_progress_step_per_benchmark(codegen_run):
    doc, labels = codegen_run
    rows = doc["benchmarks"]
    assert labels[0] == f"total {len(rows)}" and len(labels) == 1 + len(rows)
    assert labels[1:] == [f"{r['workload']} (1 thread)" for r in rows]


def test_worker_runs_only_what_is_selected():
    rows: list[dict] = []
    codegen.worker(1, "small", 1, bench.selected("codegen", ["add,row_sum"]), rows.append,
                   min_sample_s=0.002)
    assert [r["name"] for r in rows] == ["add", "row_sum"]
    assert all(r["tilenest"]["samples"] == 1 and r["ratios"]["numpy"] > 0 for r in rows)


def test_interpreter_suite(capsys):
    status, doc = _run_json(capsys, "--suite", "interpreter", "--size", "small",
                            "--samples", "1", "--only", "gemm")
    assert status == 0
    rows = doc["benchmarks"]
    assert [r["name"] for r in rows] == ["gemm"]
    for r in rows:
        for t in (r["tilenest"], r["checked"], r["baselines"]["numpy"]):
            _check_timing(t)
        assert r["ratios"]["numpy"] == pytest.approx(r["baselines"]["numpy"]["median_s"]
                                                     / r["tilenest"]["median_s"])


def test_proofs_suite(capsys):
    status, doc = _run_json(capsys, "--suite", "proofs", "--size", "small", "--samples", "1",
                            "--only", "depth")
    assert status == 0
    rows = doc["benchmarks"]
    assert [r["workload"] for r in rows] == ["depth 1", "depth 2"]
    assert rows[0]["ratios"]["depth1"] == 1.0
    assert rows[1]["ratios"]["depth1"] == pytest.approx(rows[0]["tilenest"]["median_s"]
                                                        / rows[1]["tilenest"]["median_s"])
    assert all(r["obligations"] > 0 and r["exit_status"] == 0 for r in rows)


def test_bad_only_name_is_an_error_naming_the_valid_ones():
    with pytest.raises(TilenestError) as e:
        bench.run(_args("--only", "softmax", "bogus"))
    assert "bogus" in e.value.message
    assert all(n in e.value.hint for n in codegen.NAMES)
    with pytest.raises(TilenestError) as e:
        bench.run(_args("--suite", "proofs", "--only", "gemm_strict"))
    assert "proofs" in e.value.message and "depth" in e.value.hint


def test_bad_only_name_on_the_command_line():
    r = subprocess.run([sys.executable, "-m", "tilenest.bench", "--only", "bogus"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and r.stdout == ""
    assert "bogus" in r.stderr and "gemm_strict" in r.stderr and "Traceback" not in r.stderr


def test_samples_must_be_positive(capsys):
    with pytest.raises(SystemExit):
        _args("--samples", "0")
    assert "below the least allowed value 1" in capsys.readouterr().err


def test_cuda_target_without_a_gpu_says_where_gpu_benchmarks_are(monkeypatch):
    from tilenest.backends.cuda import runtime

    monkeypatch.setattr(runtime, "gpu_available", lambda: False)
    with pytest.raises(NotAvailableError) as e:
        bench.run(_args("--target", "cuda"))
    assert "benchmarks/cuda.py" in e.value.hint


def test_help_mentions_the_gpu_script():
    ap = argparse.ArgumentParser()
    bench.add_arguments(ap)
    text = ap.format_help()
    for flag in ("--only", "--samples", "--json", "--suite", "--size", "--target"):
        assert flag in text
    assert "benchmarks/cuda.py" in text


def test_timing_median_and_spread():
    t = timing.Timing.of([3.0, 1.0, 2.0])
    assert (t.median, t.lo, t.hi, t.samples) == (2.0, 1.0, 3.0, 3)
    assert t.spread == pytest.approx(1.0)
    calls: list[str] = []
    ts = timing.measure([lambda: calls.append("a"), lambda: calls.append("b")],
                        timing.Method(samples=3, min_sample_s=0.0, min_calls=2, max_extra=0))
    assert [x.samples for x in ts] == [3, 3] and all(x.calls == 2 for x in ts)
    # rounds alternate: a warm-up and two timed calls of one, then of the other
    assert calls[:6] == ["a"] * 3 + ["b"] * 3 and len(calls) == 18


def test_new_users_kernels_match_numpy_on_ragged_shapes():
    """SwiGLU, the batched A @ B^T, the global sum and the two ceilings,
    compiled at shapes that are no multiple of their tiles or chunks."""
    import numpy as np

    from tilenest.bench.kernels import kernels

    ks = kernels()
    rng = np.random.default_rng(1)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    x, wg, wu, h = f32(70, 50), f32(50, 45), f32(50, 45), np.zeros((70, 45), np.float32)
    ks["swiglu"].specialize(bm=32, bn=16, bk=16).compile(threads=2)(x, wg, wu, h, threads=2)
    g = x.astype(np.float64) @ wg
    np.testing.assert_allclose(h, g / (1 + np.exp(-g)) * (x.astype(np.float64) @ wu),
                               rtol=1e-4, atol=1e-4)
    a, bt, c = f32(3, 37, 20), f32(3, 29, 20), np.zeros((3, 37, 29), np.float32)
    ks["bmm_nt"].specialize(bm=16, bn=16, bk=16).compile(threads=2)(a, bt, c, threads=2)
    np.testing.assert_allclose(c, a.astype(np.float64) @ bt.transpose(0, 2, 1),
                               rtol=1e-4, atol=1e-4)
    v, total = f32(100_003), np.zeros(1, np.float32)
    ks["global_sum"].specialize(chunk=4096).compile(threads=2)(v, total, threads=2)
    assert total[0] == pytest.approx(v.sum(dtype=np.float64), abs=1e-6 * float(np.abs(v).sum()))
    blocks = np.zeros(9, np.float32)
    ks["read"].specialize(rp=8).compile(threads=2)(x, blocks, threads=2)
    want = [x[i:i + 8].sum(dtype=np.float64) for i in range(0, 70, 8)]
    np.testing.assert_allclose(blocks, want, rtol=1e-5, atol=1e-4)
    y = np.zeros_like(x)
    ks["copy"].compile(threads=2)(x, y, threads=2)
    assert np.array_equal(x, y)
