"""The GPU benchmark's command line, without a GPU: the script loads without
torch or CuPy, ``--help`` runs, and the arguments parse as documented."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tilenest as tn

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "cuda.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmarks_cuda", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules[spec.name]


def test_help_runs_without_gpu_libraries():
    r = subprocess.run([sys.executable, str(SCRIPT), "--help"], check=False,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    for flag in ("--quick", "--only", "--out", "--dtypes", "--no-compile"):
        assert flag in r.stdout


def test_loading_imports_neither_torch_nor_cupy():
    code = ("import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('b', {str(SCRIPT)!r})\n"
            "m = importlib.util.module_from_spec(spec); sys.modules['b'] = m\n"
            "spec.loader.exec_module(m)\n"
            "print(sorted({'torch', 'cupy'} & set(sys.modules)))\n")
    r = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_defaults(bench):
    a = bench.parse_args([])
    assert not a.quick and a.only is None and a.out is None and a.seed is None
    assert a.dtypes == ["f32", "bf16"] and not a.no_compile


def test_options_parse(bench):
    a = bench.parse_args(["--quick", "--only", "softmax", "gemm", "--dtypes", "bf16",
                          "--no-compile", "--samples", "3", "--seed", "7", "--out", "r.json"])
    assert a.quick and a.only == ["softmax", "gemm"] and a.dtypes == ["bf16"]
    assert a.no_compile and a.samples == 3 and a.seed == 7 and a.out == Path("r.json")


def test_set_fields_join_the_fixed_overrides_of_every_variant(bench):
    a = bench.parse_args(["--set", "min_blocks=8", "--set", "stage_loads=True",
                          "--block-threads", "512"])
    assert a.set_fields == [("min_blocks", 8), ("stage_loads", True)]
    cfg = bench.Config(quick=False, samples=1, compile=False, gemm_budget_s=1.0,
                       block_threads=a.block_threads, fields=dict(a.set_fields))
    fixed = {"block_threads": 512, "min_blocks": 8, "stage_loads": True}
    assert bench.fixed_gpu(cfg) == fixed
    # the search keeps its variants, each with the fixed fields on top
    assert all(g.items() >= fixed.items() for g in bench.gpu_search(cfg))


def test_case_option_picks_attention_cases_by_label(bench):
    def cfg(argv):  # type: ignore[no-untyped-def]
        a = bench.parse_args(argv)
        return bench.Config(quick=a.quick, samples=1, compile=False, gemm_budget_s=1.0,
                            cases=tuple(a.cases))

    labels = [c[0] for c in bench.ATTENTION_CASES]
    assert [c[0] for c in bench.attention_cases(cfg([]))] == labels
    assert [c[0] for c in bench.attention_cases(cfg(["--quick"]))] == labels[::2]
    decode = [c[0] for c in bench.attention_cases(cfg(["--quick", "--case", "decode"]))]
    assert decode == [x for x in labels if "decode" in x] and len(decode) == 2
    both = bench.attention_cases(cfg(["--case", "B8", "--case", "causal"]))
    assert {c[0] for c in both} == {x for x in labels if "B8" in x or "causal" in x}
    assert bench.attention_cases(cfg(["--case", "no such case"])) == ()


@pytest.mark.parametrize("argv", [["--only", "conv2d"], ["--dtypes", "f16"],
                                  ["--samples", "0"], ["--bogus"], ["--set", "min_blocks=x"],
                                  ["--set", "warps=4"], ["--set", "min_blocks"]])
def test_bad_arguments_are_refused(bench, argv):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2


def test_every_name_is_a_benchmark(bench):
    assert set(bench.NAMES) == {"softmax", "rmsnorm", "layernorm", "gemm", "epilogues",
                                "attention", "fp8"}
    from tilenest.workloads import WORKLOADS

    for wname, which in bench.EPILOGUES:
        assert WORKLOADS[wname].fixed.get("epilogue") == which
    assert all(n in bench.ROW_KEYS for n in bench.ROW_NAMES)


def test_attention_cases_name_workloads_and_their_constants(bench):
    """Every attention case names a library workload, gives every size the
    workload's arguments need, kernel constants its kernel takes, and GPU
    overrides that are Schedule fields."""
    from tilenest.lowering.schedule import check_overrides
    from tilenest.workloads import WORKLOADS

    assert bench.ATTENTION_CASES
    for label, sizes, variants, causal in bench.ATTENTION_CASES:
        assert variants, label
        for wname, consts_tried, gpus in variants:
            wl = WORKLOADS[wname]
            assert set(sizes) == set(wl.sizes["small"]), label
            assert consts_tried and gpus, label
            for consts in consts_tried:
                wl.kernel(tn.bf16, consts)  # a constant the kernel does not take raises
                assert causal == consts.get("causal", False) or sizes["Q"] == 1, label
            for g in gpus:
                check_overrides(dict(g))
    # decode is timed with both the per-query-head and the grouped kernel
    decode = [v[0] for c in bench.ATTENTION_CASES if c[1]["Q"] == 1 for v in c[2]]
    assert {"split_kv_attention", "gqa_decode_attention"} <= set(decode)


def test_attention_table_reports_each_implementation(bench):
    rec = {"case": "decode B1", "best": "x", "baselines": {
        "sdpa flash": {"median_s": 2e-5, "flop_per_s": 1e12, "spread": 0.01, "rel_err": 1e-3},
        "compile": {"error": "RuntimeError: no"}},
        "tilenest": [{"label": "x", "median_s": 1e-5, "flop_per_s": 2e12, "spread": 0.02,
                      "rel_err": 2e-3, "ratio": {"sdpa": 2.0, "compile": None}},
                     {"label": "y", "skipped": "needs 300000 B"}]}
    out = {"ceilings": {"copy": {}, "cublas": {}, "copy_ceiling_bytes_per_s": 1e12},
           "env": {}, "seed": 1, "rows": [], "gemm": [], "attention": [rec], "notes": [],
           "problems": [], "wall_s": 1.0}
    text = bench.table(out)
    assert "*tn x" in text and "2.00x" in text and "needs 300000 B" in text
    assert "torch sdpa flash" in text and "RuntimeError: no" in text


def test_fp8_table_reports_bandwidth_and_ratios(bench):
    rec = {"workload": "quantize f32 -> e4m3fn (saturate)", "bytes": 5, "baselines": {
        "eager": {"median_s": 3e-4, "bytes_per_s": 1e12, "fraction_of_copy": 0.25,
                  "spread": 0.01},
        "compile": {"error": "RuntimeError: no"}},
        "tilenest": [{"label": "default", "median_s": 1e-4, "bytes_per_s": 3.8e12,
                      "fraction_of_copy": 0.92, "spread": 0.02,
                      "ratio": {"eager": 3.0}}]}
    out = {"ceilings": {"copy": {}, "cublas": {}, "copy_ceiling_bytes_per_s": 4e12},
           "env": {}, "seed": 1, "rows": [], "gemm": [], "attention": [], "fp8": [rec],
           "notes": [], "problems": [], "wall_s": 1.0}
    text = bench.table(out)
    line = next(ln for ln in text.splitlines() if "tn default" in ln)
    assert "0.100" in line and "3.80" in line and "92%" in line and "3.00x" in line
    assert "torch eager" in text and "RuntimeError: no" in text


def test_fp8_kernels_compile_for_the_gpu_and_run_on_the_emulator():
    """The FP8 rows' kernels build with NVRTC and, emulated, give the
    oracle's bits (quantize) and the exact scaled widening (dequantize)."""
    from tilenest.backends import cuda
    from tilenest.bench.kernels import kernels
    from tilenest.semantics import dtypes as D, numerics as N

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 100)) * 3).astype(np.float32)
    s = np.float32(64.0)
    q = np.zeros(x.shape, D.f8e4m3fn.np)
    ks = {n: cuda.compile_program(kernels()[n].program, device="emulated")
          for n in ("fp8_quantize", "fp8_dequantize")}
    ks["fp8_quantize"](x, q, s)
    want = N.cast(x * s, D.f32, D.f8e4m3fn, "saturate")
    assert (q.view(np.uint8) == want.view(np.uint8)).all()
    assert (np.abs(q.astype(np.float32)) == 448).any()  # some saturated
    y = np.zeros(x.shape, np.float32)
    ks["fp8_dequantize"](q, y, s)
    assert (y == q.astype(np.float32) * s).all()


#: what the default cuda schedule of the benchmark's GEMM tiles lowers to
DEFAULT_GEMM = {"mma_unit": "wgmma", "tma": True, "warp_roles": True}


def test_every_fp8_gemm_variant_lowers_for_its_unit(bench):
    """Each scaled FP8 GEMM variant the benchmark times lowers to the tensor
    cores it names (``mma.sync`` m16n8k32, or ``wgmma`` k32 steps)."""
    from tilenest.bench.kernels import kernels
    from tilenest.lowering import default_schedule, lower_verified, print_kernel

    assert bench.FP8_GEMM_TILES[0][1] == {}  # the default schedule, timed first
    for consts, over in bench.FP8_GEMM_TILES:
        k = kernels()["fp8_gemm"].specialize(**consts)
        text = print_kernel(lower_verified(k.program, default_schedule(k.program, "cuda",
                                                                         **over)))
        # the default schedule: warpgroups, bulk copies, a warp-specialized ring
        gpu = over or DEFAULT_GEMM
        assert "mma on tensor cores" in text, (consts, gpu)
        assert ("warpgroup tiles of wgmma" in text) == (gpu.get("mma_unit") == "wgmma")
        # the variants fed by bulk tensor copies copy both operands so (a
        # warp-specialized ring once per step, with no prologue)
        assert text.count("bulk(") >= (0 if not gpu.get("tma") else 2 if gpu.get("warp_roles")
                                       else 4), (consts, gpu)
        assert ("bulk(" in text) == bool(gpu.get("tma")), (consts, gpu)
        assert (" roles(" in text) == bool(gpu.get("warp_roles")), (consts, gpu)


def test_every_tma_gemm_variant_copies_its_tiles_in_bulk(bench):
    from tilenest.lowering import default_schedule, lower_verified, print_kernel
    from tilenest.workloads import WORKLOADS

    assert bench.GEMM_SCHEDULES[0][1] == {}  # the default schedule, timed first
    tma = [(t, g) for t, g in bench.GEMM_SCHEDULES if g.get("tma") or not g]
    assert tma
    for consts, gpu in tma:
        k = WORKLOADS["gemm"].kernel(tn.bf16, consts)
        text = print_kernel(lower_verified(k.program, default_schedule(k.program, "cuda",
                                                                         **gpu)))
        assert "bulk(A[" in text and "bulk(B[" in text, (consts, gpu)


LAUNCH = SCRIPT.parent / "cuda_launch.py"


def test_launcher_help_and_its_pairs():
    """``benchmarks/cuda_launch.py`` (one variant for a profiler): ``--help``
    runs without a GPU, and ``k=v,...`` parses to literals, bare words as
    strings, a pair without ``=`` an error naming it."""
    r = subprocess.run([sys.executable, str(LAUNCH), "--help"], check=False,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--schedule" in r.stdout and "--cubin" in r.stdout
    spec = importlib.util.spec_from_file_location("benchmarks_cuda_launch", LAUNCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod._pairs("bm=256,loop=pipeline,stage_loads=True,") == {
        "bm": 256, "loop": "pipeline", "stage_loads": True}
    assert mod._pairs(None) == {}
    with pytest.raises(SystemExit, match="'bm' is not key=value"):
        mod._pairs("bm")


def test_hand_softmax_compiles_for_the_gpu_at_the_benchmark_size(bench):
    """The hand-written reference softmax the benchmark times (benchmarks/
    softmax_rows.cu, checked against the oracle in tests/test_hand_softmax.py)
    compiles with NVRTC at the benchmark's size, every entry without spills and
    within the registers its block size leaves a thread."""
    from tilenest.backends.cuda import ARCH, prelude_dirs
    from tilenest.backends.cuda.nvrtc import compile_cuda

    built = compile_cuda(bench.hand_source(), bench.HAND_SOURCE.name, arch=ARCH,
                         include_dirs=prelude_dirs())
    want = {f"hand_softmax_{d}{suf}" for d in ("f32", "bf16")
            for suf, _ in bench.HAND_VARIANTS.values()}
    assert set(built.resources) == want
    for name, r in built.resources.items():
        assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0, (name, r)
        assert r.registers <= 65536 // bench.HAND_THREADS, (name, r)
