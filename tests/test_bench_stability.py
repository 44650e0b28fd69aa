"""``tilenest bench``: calibration until samples are stable, warnings for
rows that stay noisy, tables that fit 80 columns, an ASCII-only output, and
:func:`tilenest.bench.do_bench` for a user's own kernel."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from tilenest.bench import codegen, do_bench, timing
from tilenest.bench.timing import Method, measure, noise, noisy, plus_minus

ROOT = Path(__file__).resolve().parent.parent


def _fake_samples(monkeypatch, per_fn: list[list[float]]) -> list[int]:
    """Make ``timing._sample`` return the given per-call times, function by
    function in turn; returns the count of samples taken of each."""
    taken = [0] * len(per_fn)
    order = iter(range(10**6))

    def sample(fn, method, first):
        i = fn()
        t = per_fn[i][min(taken[i], len(per_fn[i]) - 1)]
        taken[i] += 1
        next(order)
        return t, 1

    monkeypatch.setattr(timing, "_sample", sample)
    return taken


def test_noise_is_the_interquartile_range_over_the_median():
    assert noise([1.0]) == 0.0
    assert noise([1.0, 1.0, 1.0, 1.0]) == 0.0
    assert noise([1.0, 1.0, 1.0, 1.0, 9.0]) == 0.0  # one outlier does not move it
    assert noise([1.0, 2.0, 3.0, 4.0, 5.0]) == pytest.approx((4.0 - 2.0) / 3.0)


def test_noisy_samples_are_calibrated_until_stable(monkeypatch):
    # the first three samples of fn 0 scatter, then they settle at 1.0
    taken = _fake_samples(monkeypatch, [[1.0, 1.6, 0.7] + [1.0] * 20, [2.0] * 30])
    ts = measure([lambda: 0, lambda: 1], Method(samples=3))
    assert taken[0] > 3 and taken[0] == taken[1]  # extra rounds for both, alternating
    assert ts[0].noise <= timing.NOISE_LIMIT and ts[0].samples == taken[0]
    assert ts[0].median == 1.0


def test_calibration_is_bounded(monkeypatch):
    taken = _fake_samples(monkeypatch, [[1.0, 2.0, 3.0, 4.0] * 10])
    ts = measure([lambda: 0], Method(samples=4))
    assert taken == [8]  # as many rounds again, and no more
    assert ts[0].noise > timing.NOISE_LIMIT
    taken = _fake_samples(monkeypatch, [[1.0, 2.0, 3.0, 4.0] * 10])
    measure([lambda: 0], Method(samples=4, max_extra=1))
    assert taken == [5]
    taken = _fake_samples(monkeypatch, [[1.0] * 10])
    measure([lambda: 0], Method(samples=4))
    assert taken == [4]  # stable: no extra round


def _row(name: str, noise_: float, threads: int = 1) -> dict:
    t = {"median_s": 1e-3, "min_s": 9e-4, "max_s": 1.2e-3, "spread": 0.3, "noise": noise_,
         "samples": 10, "calls": 4}
    return {"name": name, "workload": f"{name} 4096x4096", "shape": "4096x4096",
            "threads": threads, "tilenest": t, "baselines": {"numpy": dict(t, noise=0.01),
                                                             "torch": dict(t, noise=0.01)},
            "ratios": {"numpy": 1.234, "torch": 0.987}, "compile_s": 0.51,
            "bandwidth": {"bytes_per_s": 3e10, "ceiling": "copy", "fraction": 0.83}}


def test_rows_that_stay_noisy_are_named_in_a_warning():
    ws = noisy([_row("softmax", 0.25, threads=2), _row("add", 0.02)])
    assert len(ws) == 1
    assert ws[0].startswith("softmax 4096x4096 @2 threads: the tilenest samples vary by 25%")


def _render(table, width: int) -> str:
    out = io.StringIO()
    Console(width=width, file=out, force_terminal=False, color_system=None).print(table)
    return out.getvalue()


def test_the_codegen_table_fits_80_columns():
    rows = [_row("softmax", 0.02), _row("layernorm", 0.02, threads=16),
            {**_row("gemm_strict", 0.02), "workload": "gemm_strict 1024x1024x1024"}]
    wide = _render(codegen.table(rows), 200)
    assert "compile s" in wide and "of ceiling" in wide
    for width in (80, 100):
        text = _render(codegen.table(rows, width), width)
        lines = text.splitlines()
        assert max(len(ln) for ln in lines) <= width, text
        assert "\u2026" not in text and "..." not in text  # nothing cut short
        for cell in ("1.000", "1.23x", "0.99x", "softmax", "layernorm"):
            assert cell in text, (cell, text)
        assert "left out at" in text and "--json has every column" in text
    assert "of ceiling" in _render(codegen.table(rows, 100), 100)


def test_plus_minus_follows_the_output_encoding():
    ascii_out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    utf8_out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    assert plus_minus(ascii_out) == "+-" and plus_minus(utf8_out) == "\u00b1"


def test_bench_runs_with_an_ascii_only_output():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "ascii", "CI": "1",
           "COLUMNS": "80"}
    r = subprocess.run([sys.executable, "-m", "tilenest.cli", "bench", "--suite",
                        "interpreter", "--size", "small", "--samples", "1", "--only", "sum"],
                       capture_output=True, text=True, env=env, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert "+-" in r.stdout and "Traceback" not in r.stderr
    assert max(len(ln) for ln in r.stdout.splitlines()) <= 80, r.stdout


def test_do_bench_times_a_function_against_its_baseline():
    r = do_bench(lambda: time.sleep(0.002), baseline=lambda: time.sleep(0.006), samples=3,
                 min_sample_ms=5)
    assert r.baseline is not None and r.ratio is not None
    assert 1.5 < r.ratio < 6  # the baseline takes about three times as long
    assert r.time.samples >= 3 and r.time.median >= 0.002
    assert "ratio" in str(r) and "kernel" in str(r)
    alone = do_bench(lambda: None, samples=2, min_sample_ms=1)
    assert alone.baseline is None and alone.ratio is None


def test_do_bench_times_a_compiled_kernel():
    import tilenest as tn

    @tn.kernel
    def add1(x: tn.Tensor[tn.f32, 1], y: tn.Tensor[tn.f32, 1]):
        (n,) = x.shape
        for p in tn.parallel(tn.shape(tn.cdiv(n, 256))):
            o = tn.coord(p.index() * 256)
            y(o, tn.shape(256)).store(x[o, tn.shape(256)] + 1.0)

    ck = add1.compile()
    x = np.arange(1 << 16, dtype=np.float32)
    y = np.empty_like(x)
    z = np.empty_like(x)
    r = do_bench(lambda: ck(x, y), baseline=lambda: np.add(x, 1.0, out=z), samples=3,
                 min_sample_ms=5)
    assert np.array_equal(y, z)
    assert r.ratio is not None and r.ratio > 0 and r.time.calls >= 1


def test_do_bench_rejects_a_bad_method():
    from tilenest.errors import TilenestError

    with pytest.raises(TilenestError, match="samples=0"):
        do_bench(lambda: None, samples=0)
    with pytest.raises(TilenestError, match="min_sample_ms"):
        do_bench(lambda: None, min_sample_ms=0)
