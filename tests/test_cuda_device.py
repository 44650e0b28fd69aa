"""The CUDA backend on a real GPU (marker ``device``: run with ``pytest -m
device`` on a machine with an NVIDIA GPU and CuPy): every example validates
against the interpreter, and the conformance suite passes on the device."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import tilenest as tn
from tilenest.backends import cuda

pytestmark = pytest.mark.device
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.stem for p in (ROOT / "examples").glob("*.py"))


@pytest.fixture(scope="module", autouse=True)
def _gpu():
    if not cuda.gpu_available():
        pytest.fail("no usable CUDA GPU (CuPy and a driver are needed)")


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_validates_on_gpu(name):
    spec = importlib.util.spec_from_file_location(f"ex_{name}", ROOT / "examples" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for kern in [v for v in vars(mod).values() if isinstance(v, tn.Kernel)]:
        ck = cuda.compile_program(kern.program, device="gpu")
        rep = tn.validate(kern, "cuda", compiled=ck, cases=12, seed=5)
        assert rep.ok, rep.summary()


def test_conformance_on_gpu():
    from tilenest.conformance import main

    assert main(backend="cuda") == 0


def _workload_cases() -> list:
    from tilenest.workloads import WORKLOADS

    return [pytest.param(n, s, dt, id=f"{n}-{s}-{dt.name}") for n, w in WORKLOADS.items()
            for s in w.sizes if s != "large" for dt in w.dtypes]


@pytest.mark.parametrize("name,size,dt", _workload_cases())
def test_workload_validates_on_gpu(name, size, dt):
    """Every workload (small and medium sizes, every dtype) compiled for the
    GPU, judged by the interpreter's oracle and by its own FP64 formula."""
    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS[name]
    sched = dict(wl.schedules[0])
    sz = wl.size(size)
    k = wl.kernel(dt, sched, sz)
    ck = cuda.compile_program(k.program, device="gpu")
    _judge(wl, k, ck, sched, sz, dt, wl.args(sz, dt), f"{name} {size} {dt.name}")


def _judge(wl, k, ck, sched, sz, dt, args, what):  # type: ignore[no-untyped-def]
    """Run ``ck`` (workload ``wl``'s kernel ``k`` compiled for the GPU) on
    copies of ``args``; its outputs must be admitted by the interpreter's
    oracle and by the workload's FP64 formula."""
    import numpy as np

    from tilenest.workloads.base import Result, check

    work = {n: (a.copy() if isinstance(a, np.ndarray) else a) for n, a in args.items()}
    ck(*work.values())
    r = Result(wl, sz, dt, sched, k, args, {n: work[n] for n in wl.outputs})
    adm = tn.reference(k, *(a.copy() if isinstance(a, np.ndarray) else a for a in args.values()),
                       trees=getattr(ck, "trees", None) or None)
    adm = adm if isinstance(adm, tuple) else (adm,)
    for a in adm:
        v = a.admits(r.outputs[a.name])
        assert v, f"{what}: oracle ({a.name}): {v}"
    for c in check(r):
        assert c, f"{what}: FP64 formula: {c}"


@pytest.mark.parametrize("size", ["decode", "gqa", "medium"])
@pytest.mark.parametrize("splits", [3, 7])
def test_split_kv_attention_on_gpu(size, splits):
    """The decode attention with its key blocks split over programs
    (``reduce_splits``), judged against the reference evaluating the same
    run tree and against the FP64 formula."""
    from tilenest.lowering import default_schedule
    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS["split_kv_attention"]
    sched = dict(wl.schedules[0])
    sz = wl.size(size)
    k = wl.kernel(tn.bf16, sched, sz)
    ck = cuda.compile_program(k.program, default_schedule(k.program, "cuda",
                                                          reduce_splits=splits), device="gpu")
    assert ck.trees
    _judge(wl, k, ck, sched, sz, tn.bf16, wl.args(sz, tn.bf16), f"split {size} {splits}")


#: warpgroup (wgmma) GEMM schedules: (tile, GPU schedule overrides)
WGMMA_SCHEDULES = [
    ({"bm": 128, "bn": 256, "bk": 64}, {"stages": 3}),
    ({"bm": 128, "bn": 128, "bk": 64}, {"stages": 4}),
    ({"bm": 256, "bn": 128, "bk": 64}, {"stages": 4, "block_threads": 512}),
    ({"bm": 64, "bn": 64, "bk": 128}, {"stages": 2, "block_threads": 128}),
]


@pytest.mark.parametrize("tile,gpu", WGMMA_SCHEDULES,
                         ids=[f"{t['bm']}x{t['bn']}x{t['bk']}-{g.get('block_threads', 256)}"
                              for t, g in WGMMA_SCHEDULES])
@pytest.mark.parametrize("M,N,K", [(256, 512, 256), (300, 260, 200), (1037, 515, 333)])
def test_wgmma_gemm_on_gpu(tile, gpu, M, N, K):
    """The warpgroup GEMM (``mma_unit="wgmma"``: swizzled shared tiles read
    by ``wgmma.mma_async`` through matrix descriptors) on the GPU, ragged
    sizes included, judged by the interpreter's oracle and the FP64 bound:
    the hardware reads the layout the emulator assumes."""
    from tilenest.lowering import default_schedule
    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS["gemm"]
    sched = {**tile, "loop": "pipeline"}
    sz = {"M": M, "N": N, "K": K}
    k = wl.kernel(tn.bf16, sched, sz)
    ck = cuda.compile_program(k.program, default_schedule(k.program, "cuda", mma_unit="wgmma",
                                                          **gpu), device="gpu")
    assert "wgmma.mma_async" in ck.source.text
    _judge(wl, k, ck, sched, sz, tn.bf16, wl.args(sz, tn.bf16, seed=M + N + K),
           f"wgmma {tile} {gpu} at {sz}")


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtn", ["f32", "bf16"])
def test_staged_rows_on_gpu(name, dtn):
    """Rows staged in shared memory (``stage_loads``), the staging stores
    made ``cp.async`` copies (``lowering/async_copy.py``), on the GPU at the
    medium size (full vector groups, a partial one, groups past the end)."""
    from tilenest.lowering import default_schedule
    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS[name]
    dt = getattr(tn, dtn)
    sched = {"rp": 1}  # one row per program (rp > 1: see async_copy's module doc)
    sz = wl.size("medium")
    k = wl.kernel(dt, sched, sz)
    s = default_schedule(k.program, "cuda", stage_loads=True)
    ck = cuda.compile_program(k.program, s, device="gpu")
    assert "tn_cp_async<" in ck.source.text
    _judge(wl, k, ck, sched, sz, dt, wl.args(sz, dt), f"{name} staged {dtn}")


def test_device_min_max_and_conversions():
    """The device's one-instruction forms (``max.NaN``/``min.NaN``,
    ``cvt.rn.bf16.f32``, ``cvt.rn.f16.f32``, ``cvt.f32.f16``) against the
    interpreter on the values where they could differ from the portable
    code: signed zeros, NaNs, infinities, subnormals, halfway cases."""
    import numpy as np

    vals = np.array([0.0, -0.0, np.nan, -np.nan, np.inf, -np.inf, 1.0, -1.0, 1e-40, -1e-40,
                     65504.0, 65520.0, 5.96e-8, 2.98e-8, 1.0 + 2**-8, 1.0 + 3 * 2**-9,
                     3.0e38, -3.4e38, 1.1754942e-38], dtype=np.float32)
    a = np.repeat(vals, len(vals))
    b = np.tile(vals, len(vals))

    @tn.kernel
    def conv(x: tn.Tensor[tn.f32, "N"], y: tn.Tensor[tn.f32, "N"],
             hi: tn.Tensor[tn.f32, "N"], lo: tn.Tensor[tn.f32, "N"],
             hb: tn.Tensor[tn.bf16, "N"], hh: tn.Tensor[tn.f16, "N"],
             back: tn.Tensor[tn.f32, "N"]):
        (n,) = x.shape
        (d,) = x.dims()
        y, hi, lo, hb, hh, back = (a.with_dims(d) for a in (y, hi, lo, hb, hh, back))
        for p in tn.parallel(tn.shape(1)):
            t = x[tn.coord(0), tn.shape(n)]
            u = y[tn.coord(0), tn.shape(n)]
            hi(tn.coord(0), tn.shape(n)).store(tn.maximum(t, u))
            lo(tn.coord(0), tn.shape(n)).store(tn.minimum(t, u))
            hb(tn.coord(0), tn.shape(n)).store(tn.cast(t, tn.bf16))
            hh(tn.coord(0), tn.shape(n)).store(tn.cast(t, tn.f16))
            back(tn.coord(0), tn.shape(n)).store(tn.cast(tn.cast(t, tn.f16), tn.f32))

    ck = cuda.compile_program(conv.program, device="gpu")
    n = len(a)
    args = (a, b, np.full(n, np.nan, np.float32), np.full(n, np.nan, np.float32),
            np.zeros(n, tn.bf16.np), np.zeros(n, np.float16), np.full(n, np.nan, np.float32))
    rep = tn.validate(conv, "cuda", compiled=ck, inputs=args)
    assert rep.ok, rep.summary()


def _device_function(src: str, name: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """The ``__global__`` function ``name`` of CUDA source ``src`` (which may
    include the prelude), compiled by NVRTC and loaded by CuPy."""
    import cupy as cp

    from tilenest.backends.cuda import ARCH, prelude_dirs
    from tilenest.backends.cuda.nvrtc import compile_cuda

    built = compile_cuda(src, f"{name}.cu", arch=ARCH, include_dirs=prelude_dirs(), cache=False)
    path = tmp_path / f"{name}.cubin"
    path.write_bytes(built.cubin)
    return cp.RawModule(path=str(path)).get_function(name)


@pytest.mark.slow
def test_shared_divisor_form_is_ieee_division_for_every_significand_pair(tmp_path):
    """The proof behind ``tn_fdiv_by`` (spec/lowering.md L-6): for a and b in
    [1, 2), where the fast form always applies, its quotient equals the IEEE
    quotient for all 2^23 x 2^23 significand pairs (about a minute on an
    H200); scaling by powers of two carries this to the whole range that
    ``tn_fdiv_prep`` admits."""
    import cupy as cp

    src = r'''
#include "tn_prelude.cuh"
extern "C" __global__ void pairs(unsigned b0, unsigned long long* bad) {
  float b = tn_bitsf(0x3f800000u + b0 + blockIdx.x);
  tn_fdivisor d = tn_fdiv_prep(b);
  unsigned long long n = 0;
  for (unsigned i = threadIdx.x; i < (1u << 23); i += blockDim.x) {
    float a = tn_bitsf(0x3f800000u + i);
    n += tn_fbits(tn_fdiv_by(a, d)) != tn_fbits(__fdiv_rn(a, b));
  }
  if (n) atomicAdd(bad, n);
}
'''
    fn = _device_function(src, "pairs", tmp_path)
    bad = cp.zeros(1, cp.uint64)
    step = 1 << 15
    for b0 in range(0, 1 << 23, step):
        fn((step,), (512,), (cp.uint32(b0), bad))
    cp.cuda.Device().synchronize()
    assert int(bad[0]) == 0


#: a sweep of an f32 function ``FN`` over every f32 input against the
#: double reference ``REF``: the largest error in ulp of f32 of the results
#: that ``CASES`` leaves to measure (it sets ``double t`` to the result as
#: measured), and the count of results breaking the exact cases (``nbad``)
_SWEEP = r"""
#include "tn_prelude.cuh"
// ulp of f32 at |y| (y a double within the f32 range): 2^(max(e, -126) - 23)
__device__ double ulp32(double y) {
  int e = ilogb(fabs(y));
  return ldexp(1.0, (e < -126 ? -126 : e) - 23);
}
extern "C" __global__ void sweep(unsigned long long* worst, unsigned long long* bad) {
  double mx = 0.0;
  unsigned long long nbad = 0;
  unsigned stride = gridDim.x * blockDim.x;
  for (unsigned long long u = blockIdx.x * blockDim.x + threadIdx.x; u < (1ull << 32); u += stride) {
    float x = tn_bitsf((unsigned)u);
    float y = FN(x);
    if (x != x) { nbad += !(y != y); continue; }
    CASES
    double err = fabs(t - ref) / ulp32(ref);
    mx = err > mx ? err : mx;
  }
  atomicMax(worst, (unsigned long long)__double_as_longlong(mx));
  if (nbad) atomicAdd(bad, nbad);
}
"""


def _sweep(fn: str, ref: str, cases: str, tmp_path: Path) -> tuple[float, int]:
    """Run :data:`_SWEEP` for ``fn`` against ``ref`` with ``cases``:
    ``(the largest error in ulp of f32, the count of broken exact cases)``."""
    src = f"#define FN {fn}\n#define REF {ref}\n" + _SWEEP.replace("CASES", cases)
    kern = _device_function(src, "sweep", tmp_path)
    import cupy as cp

    worst = cp.zeros(1, cp.uint64)
    bad = cp.zeros(1, cp.uint64)
    kern((132 * 16,), (256,), (worst, bad))
    cp.cuda.Device().synchronize()
    return float(worst.view(cp.float64)[0]), int(bad[0])


def sweep_exp(fn: str, tmp_path: Path, declared: bool = False,
              ref: str = "exp") -> tuple[float, int]:
    """The prelude's f32 function ``fn`` (an ``exp``, or with ``ref="exp2"``
    an ``exp2``) as the GPU computes it, over all 2^32 f32 inputs against
    CUDA's double ``exp`` (``exp2``) (within about 1 ulp
    of double, far below the f32 ulp): ``(the largest error in ulp of f32,
    the count of inputs whose result breaks the contract's exact cases)``.
    NaN must stay NaN and the infinite inputs give exactly 0 and infinity.
    Under a function's own bound a result the reference rounds to infinity
    must be infinity and no other may be (spec V-14); under a ``declared``
    one an infinity stands for every value from 2^128 on and is measured by
    distance like any other result (``shadow.within_ulp``)."""
    edges = ("double t = tn_fbits(y) == 0x7f800000u ? fmax(0x1p128, ref) : (double)y;"
             if declared else
             "if (ref >= 0x1.fffffefffffffp+127) { nbad += tn_fbits(y) != 0x7f800000u; continue; }\n"
             "    if (!(fabs((double)y) <= 0x1.fffffep+127)) { ++nbad; continue; }\n"
             "    double t = (double)y;")
    cases = ("if ((tn_fbits(x) & 0x7fffffffu) == 0x7f800000u) {  // an infinity: exactly 0 or inf\n"
             "      nbad += tn_fbits(y) != (x > 0 ? 0x7f800000u : 0u);\n"
             "      continue;\n"
             "    }\n"
             "    if (y != y || y < 0) { ++nbad; continue; }\n"
             "    double ref = REF((double)x);\n"
             f"    {edges}")
    return _sweep(fn, ref, cases, tmp_path)


def sweep_tanh(fn: str, tmp_path: Path) -> tuple[float, int]:
    """The prelude's f32 function ``fn`` (a ``tanh``) as the GPU computes it,
    over all 2^32 f32 inputs against CUDA's double ``tanh``: ``(the largest
    error in ulp of f32, the count of inputs whose result breaks the exact
    cases)`` -- NaN stays NaN, +-0 and +-inf give exactly +-0 and +-1, and
    the result is odd (``fn(-x)`` is ``-fn(x)`` bit for bit)."""
    cases = ("nbad += tn_fbits(FN(-x)) != (tn_fbits(y) ^ 0x80000000u);\n"
             "    if (x == 0.0f) { nbad += tn_fbits(y) != tn_fbits(x); continue; }\n"
             "    if ((tn_fbits(x) & 0x7fffffffu) == 0x7f800000u) {\n"
             "      nbad += y != (x > 0 ? 1.0f : -1.0f);\n"
             "      continue;\n"
             "    }\n"
             "    double ref = REF((double)x);\n"
             "    double t = (double)y;")
    return _sweep(fn, "tanh", cases, tmp_path)


@pytest.mark.slow
def test_tanh_approx_for_every_f32_input_on_gpu(tmp_path):
    """``tn_tanh_approx`` (the cuda row's tanh on f32 under a declared bound)
    as the GPU computes it over every f32 input (:func:`sweep_tanh`): within
    the bound the row states (``dialect.CUDA.approx``), and within the 2.2
    ulp that the host model reaches with the special function unit anywhere
    within the PTX ISA's promises (``benchmarks/tanh_approx.py``); the exact
    cases exact."""
    from tilenest.backends.cuda.dialect import CUDA

    err, bad = sweep_tanh("tn_tanh_approx", tmp_path)
    bound = dict(CUDA.approx[("tanh", "f32")])["tn_tanh_approx"]
    print(f"tn_tanh_approx: at most {err:.3f} ulp over every f32 input (bound {bound:g})")
    assert bad == 0
    assert 0.5 <= err <= 2.2 < bound, err


@pytest.mark.slow
def test_exp_is_faithful_for_every_f32_input_on_gpu(tmp_path):
    """``tn_exp_f32`` as the GPU computes it (spec/lowering.md: the bound of
    ``exp``) over every f32 input (:func:`sweep_exp`): at most ``BOUND["exp"]``
    ulp of f32 everywhere, the exact cases exact (a few seconds on an H200)."""
    from test_llvm_math import BOUND

    err, bad = sweep_exp("tn_exp_f32", tmp_path)
    assert bad == 0
    assert 0.5 <= err <= BOUND["exp"], err


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtn", ["f32", "bf16"])
def test_cache_hints_on_gpu(name, dtn):
    """The L2 policies of ``cache_hints`` (``createpolicy`` + ``ld...cache_hint``,
    ``ld.global.cs``, ``st.global.cs``) load and store the same values on the
    GPU, at the medium size (full groups, a partial one, groups past the end)."""
    from tilenest.lowering import default_schedule
    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS[name]
    dt = getattr(tn, dtn)
    sched = {"rp": 1}
    sz = wl.size("medium")
    k = wl.kernel(dt, sched, sz)
    ck = cuda.compile_program(k.program, default_schedule(k.program, "cuda", cache_hints=True),
                              device="gpu")
    assert "tn_vload_keep<" in ck.source.text and "tn_vstore_stream<" in ck.source.text
    _judge(wl, k, ck, sched, sz, dt, wl.args(sz, dt), f"{name} cache hints {dtn}")


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("gpu", [{"grid_blocks": 4}, {"grid_blocks": 7, "stage_loads": True}])
def test_grid_stride_blocks_on_gpu(name, gpu):
    """``grid_blocks``: fewer blocks than rows, each taking rows in turn (a
    count that divides the 33 rows of the medium size and one that does not,
    staged rows reusing shared memory from one row to the next)."""
    from tilenest.lowering import default_schedule
    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS[name]
    sched = {"rp": 1}
    sz = wl.size("medium")
    k = wl.kernel(tn.f32, sched, sz)
    ck = cuda.compile_program(k.program, default_schedule(k.program, "cuda", **gpu),
                              device="gpu")
    assert "gridDim.x" in ck.source.text
    assert ck.launches(sz)[0][1] == gpu["grid_blocks"]
    _judge(wl, k, ck, sched, sz, tn.f32, wl.args(sz, tn.f32), f"{name} {gpu}")


@pytest.mark.parametrize("name,dtn,size", [
    ("softmax", "f32", "medium"), ("softmax", "bf16", "medium"),
    ("masked_softmax", "f32", "medium"), ("masked_softmax", "bf16", "medium"),
    ("sort", "f32", "small"), ("topk", "f32", "small")])
def test_row_registers_on_gpu(name, dtn, size):
    """``row_registers``: a thread-private row split between registers (the
    first 8 elements of each of 32 threads) and shared memory (the rest)."""
    from tilenest.lowering import default_schedule
    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS[name]
    dt = getattr(tn, dtn)
    sched = dict(wl.schedules[0])
    sz = wl.size(size)
    k = wl.kernel(dt, sched, sz)
    ck = cuda.compile_program(k.program, default_schedule(
        k.program, "cuda", block_threads=32, row_registers=8), device="gpu")
    assert "_reg[" in ck.source.text
    _judge(wl, k, ck, sched, sz, dt, wl.args(sz, dt), f"{name} row registers {dtn}")


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtn", ["f32", "bf16"])
def test_row_registers_at_benchmark_width_on_gpu(name, dtn):
    """The benchmark's configuration (256 threads, 32 elements per thread in
    registers: 8192 columns) on rows 1000 columns wider, whose last columns
    live in shared memory (a softmax's exponentials) or are read from global
    memory again (the input, cached in registers for the first 8192)."""
    from tilenest.lowering import default_schedule
    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS[name]
    dt = getattr(tn, dtn)
    sched = {"rp": 1}
    sz = {"R": 5, "C": 8192 + 1000}
    k = wl.kernel(dt, sched, sz)
    # without L2 policies: their 64-bit policy registers make ptxas spill 8
    # bytes of LayerNorm f32 to stay at 64 registers (spec/lowering.md,
    # Known gaps), which would hide an array placed in local memory
    plain = cuda.compile_program(k.program, default_schedule(
        k.program, "cuda", row_registers=32, cache_hints=False), device="gpu")
    (r,) = plain.resources.values()
    # no stack frame (an ELF fact: a spill or an array in local memory needs
    # one); ptxas's spill counts are known only where NVRTC reports them
    assert r.stack_frame_bytes == 0 and not r.spill_store_bytes, r
    # the benchmark's schedule (with the policies): no array in local memory
    ck = cuda.compile_program(k.program, default_schedule(k.program, "cuda", row_registers=32),
                              device="gpu")
    assert ".local" not in cuda._build(ck.source, want_ptx=True).ptx
    assert "b_x_reg[" in ck.source.text
    _judge(wl, k, ck, sched, sz, dt, wl.args(sz, dt), f"{name} row registers {dtn} at {sz}")


@pytest.mark.parametrize("where", ["host", "device"])
def test_tune_on_gpu(where):
    """``tn.tune`` on the GPU: every distinct candidate of the default search
    is timed on CUDA events, the chosen kernel validates, and the call's
    arrays (numpy, or CuPy used in place) are left as they were."""
    import cupy as cp
    import numpy as np

    from tilenest.workloads import WORKLOADS

    wl = WORKLOADS["softmax"]
    sz = {"R": 2048, "C": 8192}
    k = wl.kernel(tn.f32, {"rp": 1})
    args = wl.args(sz, tn.f32)
    call = tuple(cp.asarray(a) if where == "device" and isinstance(a, np.ndarray) else a
                 for a in args.values())
    before = [cp.asnumpy(a) if isinstance(a, cp.ndarray) else np.copy(a) for a in call]
    rep = tn.tune(k, *call, samples=3, cases=3)
    assert {t.status for t in rep.trials} <= {"timed", "same"}, rep.table()
    timed = [t for t in rep.trials if t.status == "timed"]
    assert len(timed) >= 4 and all(len(t.samples) == 3 and t.seconds > 0 for t in timed)
    assert not any(t.launch_bound for t in timed), rep.table()  # 64 MiB each way: device-bound
    assert all(t.bound is None for t in rep.trials)  # no device copies kept
    after = [cp.asnumpy(a) if isinstance(a, cp.ndarray) else a for a in call]
    for a, b in zip(after, before):
        assert np.array_equal(a, b, equal_nan=True)
    assert tn.validate(k, "cuda", compiled=rep.compiled, cases=4, seed=9).ok
    print(rep.table())


def test_tune_record_on_gpu(tmp_path, monkeypatch):
    """``tn.tune(record=True)`` on the GPU: the second tuning of the same
    call (keyed by the GPU's name and driver) returns the recorded choice
    without timing, and its kernel validates."""
    from tilenest.backends.cuda import tune as T
    from tilenest.workloads import WORKLOADS

    monkeypatch.setenv("TILENEST_CACHE_DIR", str(tmp_path))
    wl = WORKLOADS["rmsnorm"]
    k = wl.kernel(tn.f32, dict(wl.schedules[0]))
    args = tuple(wl.args({"R": 512, "C": 4096}, tn.f32).values())
    first = tn.tune(k, *args, samples=2, cases=2, record=True)
    assert not first.recorded
    monkeypatch.setattr(T, "_gpu_timer", lambda: pytest.fail("a recorded tuning timed again"))
    again = tn.tune(k, *args, samples=2, cases=2, record=True)
    assert again.recorded and again.best == first.best
    assert [t.seconds for t in again.trials] == [t.seconds for t in first.trials]
    assert tn.validate(k, "cuda", compiled=again.compiled, cases=3, seed=2).ok
