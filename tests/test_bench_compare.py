"""``tilenest bench --compare`` and the bandwidth ceilings: the comparison and
the bandwidth fractions are pure functions, tested here on synthetic records
(nothing is timed); the command's wiring is tested with the suite's runner
replaced by synthetic rows, and once end to end on a tiny real run."""

from __future__ import annotations

import argparse
import copy
import io
import json
from contextlib import redirect_stdout

import pytest

from tilenest import bench
from tilenest.bench import codegen, compare
from tilenest.errors import TilenestError

ENV = {"cpu": "AMD EPYC", "cpus": 2, "vector_bits": 512, "machine": "x86_64", "python": "3.11.7",
       "numpy": "2.4.6", "llvmlite": "0.50.0", "tilenest": "0.1.0", "torch": "2.13.0+cpu"}


def _timing(s: float, spread: float = 0.02) -> dict:
    return {"median_s": s, "min_s": s, "max_s": s * (1 + spread), "spread": spread,
            "samples": 5, "calls": 10}


def _row(name: str, shape: str, threads: int, ratios: dict[str, float],
         t: float = 1e-3, nbytes: int | None = None, spread: float = 0.02) -> dict:
    """A codegen row whose baselines took ``ratio * t`` seconds."""
    r = {"name": name, "shape": shape, "workload": f"{name} {shape}", "threads": threads,
         "compile_s": 0.1, "tilenest": _timing(t, spread),
         "baselines": {b: _timing(v * t) for b, v in ratios.items()},
         "ratios": dict(ratios)}
    if nbytes is not None:
        r["bytes"] = nbytes
    return r


def _doc(rows: list[dict], env: dict | None = None, size: str = "large") -> dict:
    return {"schema": bench.SCHEMA, "suite": "codegen", "size": size, "samples": 5,
            "target": "llvm", "threads": sorted({r["threads"] for r in rows}),
            "date": "2026-01-01T00:00:00+00:00", "environment": dict(env or ENV),
            "benchmarks": rows}


def _by_key(c: compare.Comparison) -> dict[str, compare.RowResult]:
    return {r.key: r for r in c.rows}


def test_row_identity_is_name_shape_and_threads():
    a = _row("gemm", "1024x1024x1024", 1, {"numpy": 1.0})
    assert compare.row_key(a) == "gemm 1024x1024x1024 @1"
    assert compare.row_key({**a, "threads": 2}) != compare.row_key(a)
    assert compare.row_key({**a, "shape": "256x256x256"}) != compare.row_key(a)
    # the label (which carries the schedule's tile sizes) is not part of the identity
    assert compare.row_key({**a, "workload": "gemm (64x64x64)"}) == compare.row_key(a)
    # suites without shapes or threads: the label stands for the shape
    assert compare.row_key({"name": "depth", "workload": "depth 2"}) == "depth depth 2"


def test_a_ratio_that_fell_by_more_than_the_limit_is_a_regression():
    old = _doc([_row("gemm", "256x256x256", 1, {"numpy": 1.0, "torch": 0.9}),
                _row("softmax", "4096x4096", 1, {"numpy": 2.0, "torch": 1.0})])
    new = _doc([_row("gemm", "256x256x256", 1, {"numpy": 0.05, "torch": 0.04}),
                _row("softmax", "4096x4096", 1, {"numpy": 1.6, "torch": 0.8})])
    c = compare.compare(old, new)
    rows = _by_key(c)
    assert rows["gemm 256x256x256 @1"].status == "regressed"
    change = {ch.baseline: ch for ch in rows["gemm 256x256x256 @1"].changes}
    assert change["numpy"].recorded == 1.0 and change["numpy"].now == 0.05
    assert change["numpy"].change == pytest.approx(0.05)
    # -20% on both baselines: within the 25% allowed
    assert rows["softmax 4096x4096 @1"].status == "same"
    assert [r.key for r in c.regressed] == ["gemm 256x256x256 @1"]
    assert c.baselines == ("numpy", "torch")
    # a tighter limit flags the softmax too
    tight = compare.compare(old, new, max_drop=0.1)
    assert {r.key for r in tight.regressed} == {"gemm 256x256x256 @1", "softmax 4096x4096 @1"}


def test_one_baseline_falling_is_enough():
    old = _doc([_row("add", "4096x4096", 2, {"numpy": 1.0, "torch": 1.0})])
    new = _doc([_row("add", "4096x4096", 2, {"numpy": 1.1, "torch": 0.7})])
    (r,) = compare.compare(old, new).rows
    assert r.status == "regressed"


def test_an_improvement_is_not_flagged():
    old = _doc([_row("gemm", "1024x1024x1024", 2, {"numpy": 0.05, "torch": 0.05})])
    new = _doc([_row("gemm", "1024x1024x1024", 2, {"numpy": 1.1, "torch": 1.0})])
    c = compare.compare(old, new)
    assert c.rows[0].status == "improved" and not c.regressed
    assert c.rows[0].changes[0].change == pytest.approx(22.0)
    lines = compare.summary(c, "base.json")
    assert lines[-1].startswith("no regression: 1 row(s) compared")


def test_missing_rows_are_reported_on_both_sides():
    old = _doc([_row("gemm", "256x256x256", 1, {"numpy": 1.0}),
                _row("gemm", "256x256x256", 2, {"numpy": 1.0}),
                _row("add", "4096x4096", 1, {"numpy": 1.0})])
    new = _doc([_row("gemm", "256x256x256", 1, {"numpy": 1.0}),
                _row("swiglu", "512x1024x1024", 1, {"numpy": 0.5})])
    c = compare.compare(old, new)
    assert c.not_run == ("gemm 256x256x256 @2", "add 4096x4096 @1")
    rows = _by_key(c)
    assert rows["swiglu 512x1024x1024 @1"].status == "new"
    assert rows["gemm 256x256x256 @1"].status == "same"
    text = "\n".join(compare.summary(c, "base.json"))
    assert "2 row(s) of base.json not run now: gemm 256x256x256 @2, add 4096x4096 @1" in text
    assert "without a recorded ratio to compare: swiglu 512x1024x1024 @1" in text
    assert compare.compare(old, new).to_json()["not_run"] == list(c.not_run)


def test_failed_rows_and_baselines_on_one_side_only_are_reported():
    old = _doc([_row("softmax", "4096x4096", 1, {"numpy": 1.0}),
                {"name": "rmsnorm", "shape": "4096x4096", "workload": "rmsnorm", "threads": 1,
                 "error": "differs"},
                _row("add", "4096x4096", 1, {"numpy": 1.0, "torch": 2.0})])
    new = _doc([{"name": "softmax", "shape": "4096x4096", "workload": "softmax 4096x4096",
                 "threads": 1, "error": "the compiled result differs from numpy"},
                _row("rmsnorm", "4096x4096", 1, {"numpy": 1.0}),
                _row("add", "4096x4096", 1, {"numpy": 1.0})])
    rows = _by_key(compare.compare(old, new))
    assert rows["softmax 4096x4096 @1"].status == "error"
    assert rows["rmsnorm 4096x4096 @1"].status == "new"
    assert "failed when the file was recorded" in rows["rmsnorm 4096x4096 @1"].notes[0]
    assert rows["add 4096x4096 @1"].status == "same"
    assert rows["add 4096x4096 @1"].notes == ("torch: only in the file",)


def test_a_noisy_row_gets_a_note():
    old = _doc([_row("add", "128x128", 1, {"numpy": 1.0})])
    new = _doc([_row("add", "128x128", 1, {"numpy": 1.0}, spread=0.6)])
    (r,) = compare.compare(old, new).rows
    assert r.notes == ("noisy: samples spread 60%",)


def test_a_different_machine_or_setup_is_warned_about():
    old = _doc([_row("add", "4096x4096", 1, {"numpy": 1.0})])
    same = compare.compare(old, copy.deepcopy(old))
    assert same.warnings == ()
    env = {**ENV, "cpu": "Intel Xeon", "cpus": 8, "numpy": "2.5.0", "vector_bits": 256}
    new = _doc([_row("add", "4096x4096", 1, {"numpy": 1.0})], env=env, size="small")
    w = compare.compare(old, new).warnings
    assert "size differs: recorded large, now small" in w
    assert "the machine differs: cpu recorded AMD EPYC, now Intel Xeon" in w
    assert "the machine differs: cpus recorded 2, now 8" in w
    assert "the software differs: numpy recorded 2.4.6, now 2.5.0" in w
    assert "the machine differs: vector_bits recorded 512, now 256" in w  # AVX-512 vs AVX2
    assert len(w) == 5
    assert all(f"warning: {x}" in compare.summary(compare.compare(old, new), "f")
               for x in w)


def test_the_table_marks_regressions():
    from rich.console import Console

    old = _doc([_row("gemm", "256x256x256", 1, {"numpy": 1.0}),
                _row("add", "4096x4096", 1, {"numpy": 1.0})])
    new = _doc([_row("gemm", "256x256x256", 1, {"numpy": 0.5}),
                _row("add", "4096x4096", 1, {"numpy": 1.0})])
    c = compare.compare(old, new)
    con = Console(width=200, record=True, file=io.StringIO())
    con.print(compare.table(c, "base.json"))
    lines = con.export_text().splitlines()
    gemm = next(x for x in lines if "gemm 256x256x256 @1" in x)
    add = next(x for x in lines if "add 4096x4096 @1" in x)
    assert "REGRESSED" in gemm and "0.50x" in gemm and "1.00x" in gemm and "-50%" in gemm
    assert "REGRESSED" not in add
    assert compare.summary(c, "base.json")[-1] == (
        "REGRESSED: 1 row(s) whose ratio fell by more than 25%: gemm 256x256x256 @1")


def test_load_checks_the_file(tmp_path):
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_doc([_row("add", "4096x4096", 1, {"numpy": 1.0})])))
    assert compare.load(good, "codegen")["benchmarks"][0]["name"] == "add"
    with pytest.raises(TilenestError, match="no such file") as e:
        compare.load(tmp_path / "absent.json", "codegen")
    assert "--save" in e.value.hint
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(TilenestError, match="is not JSON"):
        compare.load(bad, "codegen")
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(TilenestError, match="not a benchmark record"):
        compare.load(bad, "codegen")
    bad.write_text(json.dumps({**_doc([]), "benchmarks": [{"name": "x"}]}))
    with pytest.raises(TilenestError, match="row 0 has no name or no ratios"):
        compare.load(bad, "codegen")
    with pytest.raises(TilenestError, match="records the codegen suite") as e:
        compare.load(good, "proofs")
    assert e.value.hint == "pass --suite codegen"


# ---------------------------------------------------------------------------
# the bandwidth ceilings

def test_a_ceiling_is_the_best_of_its_implementations():
    mb = 64 << 20
    rows = [_row("read", "4096x4096", 1, {"numpy": 1.2, "torch": 0.8}, t=2e-3, nbytes=mb),
            _row("copy", "4096x4096", 1, {"numpy": 0.9, "torch": 1.0}, t=5e-3,
                 nbytes=2 * mb),
            _row("row_sum", "4096x4096", 1, {"numpy": 1.0}, t=2e-3, nbytes=mb),
            _row("softmax", "4096x4096", 1, {"numpy": 1.0}, t=10e-3, nbytes=2 * mb),
            _row("global_sum", "10000000", 1, {"numpy": 1.0}, t=4e-3, nbytes=40_000_000),
            _row("gemm", "256x256x256", 1, {"numpy": 1.0})]
    out = {r["name"]: r for r in codegen.attach_bandwidth(rows)}
    # torch read it in 0.8 * 2 ms, numpy copied in 0.9 * 5 ms
    assert out["read"]["ceiling"] == {"bytes_per_s": pytest.approx(mb / 1.6e-3), "by": "torch"}
    assert out["copy"]["ceiling"]["by"] == "numpy"
    assert out["row_sum"]["bandwidth"]["ceiling"] == "read"
    assert out["row_sum"]["bandwidth"]["fraction"] == pytest.approx(0.8)
    assert out["softmax"]["bandwidth"]["ceiling"] == "copy"
    assert out["softmax"]["bandwidth"]["fraction"] == pytest.approx(0.5 * 0.9 * 5 / 10 * 2)
    assert out["global_sum"]["bandwidth"]["fraction"] == pytest.approx(
        40e6 / 4e-3 / (mb / 1.6e-3))
    assert "bandwidth" not in out["gemm"] and "ceiling" not in out["gemm"]
    assert rows[0].get("ceiling") is None   # a pure function: its input is unchanged


def test_a_ceiling_counts_only_at_its_own_thread_count_and_shape():
    mb = 64 << 20
    rows = [_row("copy", "4096x4096", 2, {"numpy": 1.0}, t=1e-3, nbytes=2 * mb),
            _row("copy", "1024x1024", 1, {"numpy": 1.0}, t=1e-3, nbytes=2 * mb // 16),
            _row("add", "4096x4096", 1, {"numpy": 1.0}, t=1e-3, nbytes=3 * mb),
            _row("add", "1024x1024", 1, {"numpy": 1.0}, t=1e-3, nbytes=3 * mb // 16)]
    out = codegen.attach_bandwidth(rows)
    assert "bandwidth" not in out[2]          # no 1-thread copy at 4096
    assert out[3]["bandwidth"]["fraction"] == pytest.approx(1.5)


def test_selected_rows_bring_their_ceilings():
    assert codegen.with_ceilings(("add",)) == ("copy", "add")
    assert codegen.with_ceilings(("row_sum", "softmax")) == ("read", "copy", "softmax",
                                                              "row_sum")
    assert codegen.with_ceilings(("global_sum", "gemm")) == ("read", "global_sum", "gemm")
    assert codegen.with_ceilings(("gemm",)) == ("gemm",)


def test_gemm_tiles_cover_the_problem_without_padding_it():
    mb = 512 << 10  # a 512 KiB L2: packed B tiles of at most 128 x 512 f32
    assert codegen.gemm_tiles(64, 64, 1, k=64, cols=16, l2_bytes=mb) == \
        {"bm": 64, "bn": 64, "bk": 64}
    # two programs per thread at two threads
    assert codegen.gemm_tiles(64, 64, 2, k=64, cols=16, l2_bytes=mb) == \
        {"bm": 32, "bn": 32, "bk": 64}
    assert codegen.gemm_tiles(64, 64, 2, batch=2, k=32, cols=16, l2_bytes=mb) == \
        {"bm": 32, "bn": 64, "bk": 32}
    assert codegen.gemm_tiles(1024, 1024, 1, k=1024, cols=16, l2_bytes=mb) == \
        {"bm": 1024, "bn": 512, "bk": 128}
    assert codegen.gemm_tiles(1024, 1024, 2, k=1024, cols=16, l2_bytes=mb) == \
        {"bm": 512, "bn": 512, "bk": 128}
    assert codegen.gemm_tiles(256, 256, 2, k=256, cols=16, l2_bytes=mb) == \
        {"bm": 128, "bn": 128, "bk": 128}
    # a ragged extent is cut into equal tiles of the register block's rows and
    # whole vectors of columns, padding it least: 1000 columns in two tiles of
    # 512 pad 24, in three of 336 pad 8
    assert codegen.gemm_tiles(1000, 1000, 1, k=1000, rows=8, cols=16, l2_bytes=mb) == \
        {"bm": 1000, "bn": 336, "bk": 128}
    assert codegen.gemm_tiles(1000, 1000, 2, k=1000, rows=8, cols=16, l2_bytes=mb)["bm"] == 504
    assert codegen.gemm_tiles(3000, 1000, 1, k=1000, rows=8, cols=16, l2_bytes=mb)["bm"] == 1000
    assert codegen.gemm_tiles(1000, 1000, 2, k=1000, rows=6, cols=16, l2_bytes=mb)["bm"] == 504


def test_gemm_tiles_keep_the_packed_b_tiles_in_half_the_l2():
    mib = 1 << 20
    # 1 MiB of L2: one 128 x 1024 f32 B tile (512 KiB); one program at one thread
    assert codegen.gemm_tiles(1024, 1024, 1, k=1024, cols=16, l2_bytes=mib) == \
        {"bm": 1024, "bn": 1024, "bk": 128}
    assert codegen.gemm_tiles(1000, 1000, 1, k=1000, rows=8, cols=16, l2_bytes=mib) == \
        {"bm": 1000, "bn": 1008, "bk": 128}
    # SwiGLU packs two B tiles: 512 columns each
    assert codegen.gemm_tiles(512, 1024, 1, k=1024, cols=16, l2_bytes=mib, b_tiles=2)["bn"] \
        == 512
    # a smaller L2 narrows the tile; a larger one stops at 1024 columns
    assert codegen.gemm_tiles(1024, 1024, 1, k=1024, cols=16, l2_bytes=256 << 10)["bn"] == 256
    assert codegen.gemm_tiles(4096, 4096, 1, k=4096, cols=16, l2_bytes=8 * mib)["bn"] == 1024


def _cache_tree(root, entries):  # type: ignore[no-untyped-def]
    for i, (level, kind, size) in enumerate(entries):
        d = root / f"index{i}"
        d.mkdir(parents=True)
        for name, text in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(text + "\n")
    return str(root)


@pytest.mark.parametrize("entries,want", [
    ([("1", "Data", "32K"), ("1", "Instruction", "32K"), ("2", "Unified", "1024K"),
      ("3", "Unified", "32768K")], 1 << 20),
    ([("1", "Data", "48K"), ("2", "Unified", "2M")], 2 << 20),
    ([("1", "Data", "32K"), ("3", "Unified", "8M")], 512 << 10),  # no L2: the default
    ([("2", "Unified", "odd")], 512 << 10),  # unreadable size: the default
], ids=["1024K", "2M", "no-l2", "unreadable"])
def test_host_l2_is_read_from_sysfs_or_defaulted(tmp_path, entries, want):
    assert codegen.host_l2_bytes(_cache_tree(tmp_path, entries)) == want
    assert codegen.host_l2_bytes(str(tmp_path / "missing")) == 512 << 10


# ---------------------------------------------------------------------------
# the command


def _args(*argv: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    bench.add_arguments(ap)
    return ap.parse_args(list(argv))


def _run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        status = bench.run(_args(*argv))
    return status, out.getvalue()


@pytest.fixture
def fake_suite(monkeypatch):
    """``codegen.run`` replaced: it returns the rows in ``rows`` (times scaled
    by ``slow`` for the gemm rows), so the command's wiring is tested untimed."""
    state = {"slow": 1.0}

    def run(threads, size, samples, names, step, *rest):
        rows = []
        for t in threads:
            for n in names:
                ratio = 1.0 / state["slow"] if n == "gemm" else 1.0
                shape = codegen.shape_label(codegen.shapes(size, n)[0])
                rows.append(_row(n, shape, t, {"numpy": ratio}, nbytes=1000))
                step(n)
        return rows

    monkeypatch.setattr(codegen, "run", run)
    return state


def test_compare_command_exit_status_and_report(fake_suite, tmp_path):
    rec = tmp_path / "base.json"
    status, _ = _run("--only", "gemm", "add", "--threads", "1", "2", "--save", str(rec))
    assert status == 0
    doc = json.loads(rec.read_text())
    assert doc["threads"] == [1, 2] and doc["size"] == "medium" and doc["date"]
    assert doc["shapes"] == {"copy": ["1024x1024"], "add": ["1024x1024"],
                             "gemm": ["256x256x256"]}
    for key in ("cpu", "cpus", "numpy", "llvmlite", "tilenest", "python"):
        assert key in doc["environment"]
    assert [compare.row_key(r) for r in doc["benchmarks"]] == [
        "copy 1024x1024 @1", "add 1024x1024 @1", "gemm 256x256x256 @1",
        "copy 1024x1024 @2", "add 1024x1024 @2", "gemm 256x256x256 @2"]
    assert doc["benchmarks"][1]["bandwidth"]["ceiling"] == "copy"

    status, text = _run("--only", "gemm", "add", "--threads", "1", "2", "--compare", str(rec))
    assert status == 0 and "no regression: 6 row(s) compared" in text

    fake_suite["slow"] = 20.0
    status, text = _run("--only", "gemm", "add", "--threads", "1", "--compare", str(rec))
    assert status == compare.EXIT_REGRESSED == 4
    assert "REGRESSED: 1 row(s) whose ratio fell by more than 25%: gemm 256x256x256 @1" in text
    assert "3 row(s) of " in text and "not run now" in text   # the 2-thread rows

    status, text = _run("--only", "gemm", "--threads", "1", "--compare", str(rec), "--json")
    assert status == 4
    cmp = json.loads(text)["comparison"]
    assert cmp["regressed"] == ["gemm 256x256x256 @1"]
    assert cmp["rows"][0]["ratios"]["numpy"]["change"] == pytest.approx(0.05)


def test_compare_with_a_bad_file_fails_before_running(fake_suite, tmp_path):
    with pytest.raises(TilenestError, match="no such file"):
        bench.run(_args("--compare", str(tmp_path / "none.json")))
    with pytest.raises(TilenestError, match="cannot write the benchmark record"):
        bench.run(_args("--only", "add", "--threads", "1", "--save",
                        str(tmp_path / "no" / "such" / "dir.json")))


def test_max_drop_must_be_a_fraction(capsys):
    assert _args("--max-drop", "0.1").max_drop == 0.1
    with pytest.raises(SystemExit):
        _args("--max-drop", "25")
    assert "between 0 and 1" in capsys.readouterr().err


def test_end_to_end_on_a_tiny_run(tmp_path):
    """A real run (small add and its copy ceiling, one thread) saved, then a
    second real run compared with it: every row matched, none regressed (the
    allowed drop is 90%: the test is of the path, not of the speed)."""
    rec = tmp_path / "rec.json"
    base = ("--size", "small", "--only", "add", "--samples", "3", "--threads", "1",
            "--min-sample-ms", "5")
    status, _ = _run(*base, "--save", str(rec))
    assert status == 0
    recorded = compare.load(rec, "codegen")
    assert [r["name"] for r in recorded["benchmarks"]] == ["copy", "add"]
    assert recorded["benchmarks"][1]["bandwidth"]["fraction"] > 0
    status, text = _run(*base, "--compare", str(rec), "--max-drop", "0.9", "--json")
    assert status == 0
    cmp = json.loads(text)["comparison"]
    assert [r["key"] for r in cmp["rows"]] == ["copy 128x128 @1", "add 128x128 @1"]
    assert cmp["not_run"] == [] and cmp["regressed"] == [] and cmp["warnings"] == []
    assert all(set(r["ratios"]) >= {"numpy"} for r in cmp["rows"])
