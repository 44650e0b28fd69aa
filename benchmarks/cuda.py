"""tilenest's CUDA kernels against PyTorch on one NVIDIA GPU, ratios measured in one run.

    python benchmarks/cuda.py [--quick] [--only NAME ...] [--dtypes f32 bf16]
                              [--no-compile] [--samples N] [--seed N] [--out FILE.json]
                              [--gemm-unit all|wgmma|tensor|roles] [--set FIELD=VALUE ...]

Ceilings, measured first in the same process: the device-to-device copy
bandwidth (a 2 GiB tensor copied by torch ``y.copy_(x)`` and by CuPy
``cupy.copyto``, counting bytes read plus bytes written; the faster of the two
is the copy ceiling) and the bf16 cuBLAS rate (``torch.matmul`` at 4096^3 and
8192^3 on random data, reduced-precision reductions off, so it accumulates in
f32 as the tilenest kernel does).

Row workloads (``--only softmax rmsnorm layernorm``): the kernels of
``tilenest.workloads`` on 8192 x 8192 in f32 and bf16 (bf16 storage, f32
arithmetic), every schedule of the workload whose dynamic shared memory fits a
block (the others are listed as skipped), each with the GPU schedule choices of
``tilenest.backends.cuda.tune.SEARCH``, the search ``tn.tune`` runs (threads
per block, loads staged in shared memory or re-read with or without L2 cache
policies; the fastest is starred), against eager PyTorch
(``torch.softmax``, ``F.rms_norm``, ``F.layer_norm``) and ``torch.compile`` of
the same call (a failing torch.compile is reported and the run goes on).
Softmax is also timed against a hand-written kernel (``softmax_rows.cu``:
one block per row, the row held in registers, specialized to 8192 columns),
once under tilenest's numerical contract (``hand``: the prelude's faithful
exp and IEEE division; tests/test_hand_softmax.py checks it against the
oracle) and once with CUDA's ``__expf`` (``hand ex2.approx``, outside the
contract): the first is a reference for what a generated kernel could
reach under the contract, the second shows what the faithful exp costs.
Achieved bandwidth counts the input read once, the output written once and the
weight vectors; it is also given as a fraction of the copy ceiling. The ratio
is baseline time / tilenest time (> 1: tilenest is faster).

GEMM (``--only gemm``): bf16 ``C = A @ B`` with f32 accumulation, 4096^3 and
8192^3 (``--quick``: 4096^3 only), TFLOP/s (2 n^3 operations) and the fraction
of the cuBLAS rate. Schedules (tile sizes) are chosen here (``GEMM_SCHEDULES``:
warpgroup tiles fed by bulk tensor copies, the cuda default, and by
``cp.async`` copies, ``tma=False``, then ``mma.sync`` tiles);
8192^3 runs only the schedule that was fastest at 4096^3. A slow kernel
(a call over ``SLOW_S``) is timed with as many single calls as fit in
``GEMM_BUDGET_S`` (at least two), and 8192^3 is skipped when the 4096^3 time
predicts a call over ``GEMM_SKIP_S``; both are said in the output.

Fused epilogues (``--only epilogues``): ``gemm_relu`` (``max(0.125 (A B) +
0.25, 0)``) and ``gemm_gelu`` (tanh GELU of the same affine map) in bf16 at
4096^3, one tilenest kernel each (the first GEMM schedule), against eager
torch (cuBLAS and then the elementwise ops) and ``torch.compile`` of the same
expression.

Attention (``--only attention``): bf16 causal and non-causal GQA prefill
(B 4, 16 query and 4 key/value heads, T 2048, D 128: ``flash_attention``
with 64- and 128-row query tiles, on 8 warps with one or two blocks per SM)
and decode (one query per head against 8k and 32k cached keys:
``split_kv_attention``, one program per query head, and
``gqa_decode_attention``, one per key/value head with its group of query
heads as the rows of the tiles, their key blocks split over programs by the
``reduce_splits`` schedule field), cases ``ATTENTION_CASES`` (``--quick``:
every other one), against torch's ``scaled_dot_product_attention`` under its
flash backend, under its own backend choice, and ``torch.compile`` of the
same call. TFLOP/s count ``2 B HQ Q K (D + DV)`` operations, half of them
under a causal mask with Q = K. Each tilenest variant is first checked
against SDPA's float32 math backend (relative error norm under
``ATTENTION_TOL``).

FP8 casts (``--only fp8``): per-tensor scaled quantization of an 8192 x 8192
f32 tensor into e4m3fn (``x * s`` with s = ``FP8_SCALE``, so that some
values saturate; the ``fp8_quantize`` kernel of ``tilenest.bench.kernels``)
and its inverse (``fp8_dequantize``: the codes widened and multiplied by
``s``), against eager torch (``clamp`` then ``.to(torch.float8_e4m3fn)``,
which is the same saturating conversion; ``.float() * s``) and
``torch.compile`` of the same, each with the GPU schedule choices of the
row workloads (the default first). Bandwidth counts 4 bytes read or written per
f32 element and 1 per FP8 element. The quantized bits must equal
``numerics.cast``'s (the oracle's conversion) on the host, and the
dequantized values torch's, exactly. Then the scaled FP8 GEMM (``C = (A B)
sa sb`` in bf16 from e4m3fn operands, ``B`` stored transposed: the
``fp8_gemm`` kernel, on ``mma.sync.m16n8k32`` and on ``wgmma`` k32) at
4096^3 and 8192^3
(``--quick``: 4096^3, the fastest tile measured) against ``torch._scaled_mm`` with and
without ``use_fast_accum``.

Correctness first: before timing, every tilenest variant runs once on fresh
random inputs into an output poisoned with NaN; every element must have been
written (no NaN or inf left: the true outputs are finite) and the relative
error norm ||out - ref|| / ||ref|| against torch in float64 on the upcast
inputs must be under ``TOL`` (f32 1e-4, bf16 1e-2). A failing variant is
reported loudly, not timed, and the run exits nonzero. The baselines' errors are
recorded too, as a check of the reference. After timing, each launch's status
word is checked and the timed outputs are checked for NaN.

Timing: the device time between two CUDA events (torch events for torch calls,
CuPy events for tilenest's launches, each on its library's current stream)
around a batch of calls enqueued back to back, rotating among ``ROTATE`` input
sets (each set several times the 50 MB L2 for the row workloads), after one
untimed call that keeps the device busy while the start event is recorded. A
sample is one batch of at least ``SAMPLE_S`` seconds, divided by its number of
calls; the time reported is the median over all samples of ``ROUNDS`` rounds,
the rounds alternating between implementations; ``spread`` is the relative
difference of the rounds' medians (a difference between implementations under
it is noise). Warm-up calls (module load, torch.compile's compile, the
allocator) come first and are not timed. ``launch-bound`` marks a time where
the host took about as long to enqueue a call as the device to run it.

Compile time is ``CudaKernel.compile_seconds`` of the first, uncached compile
(legality proofs, lowering, NVRTC); torch.compile's is the wall time of its
first call. Not a timed test.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# Run as ``python benchmarks/cuda.py``, this folder would come first on the
# import path and this file would shadow the ``cuda`` namespace package
# (cuda-bindings, cuda-pathfinder) that CuPy and PyTorch import.
if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
    sys.path.pop(0)
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

ROW_NAMES = ("softmax", "rmsnorm", "layernorm")
NAMES = (*ROW_NAMES, "gemm", "epilogues", "attention", "fp8")
ROWS = COLS = 8192
#: the inputs of each row workload's torch functions, in their order
ROW_KEYS = {"softmax": ("x",), "rmsnorm": ("x", "w"), "layernorm": ("x", "g", "b")}
EPS = 1e-5
#: input sets timed in rotation, so repeated calls do not read from the L2
ROTATE = 3
#: bytes of the tensor copied to measure the copy ceiling
COPY_BYTES = 2 << 30
GEMM_SIZES = (4096, 8192)
#: (tile, GPU ``Schedule`` overrides) tried at 4096^3 (the first only with
#: --quick); the first (no overrides: the default schedule) and the fastest
#: run at 8192^3
_WG = {"mma_unit": "wgmma", "tma": False, "warp_roles": False}
#: ``mma.sync`` named explicitly (``auto`` takes ``wgmma`` where its plan applies)
_TC = {"mma_unit": "tensor"}
#: warpgroup tensor cores fed by bulk tensor copies (``Schedule.tma``, the
#: cuda default; ``_WG`` above names the ``cp.async`` copies) on block
#: barriers
_TMA = {**_WG, "tma": True}
#: the same, warp-specialized (``Schedule.warp_roles``: a producer warp and
#: completion-barrier handshakes instead of block barriers in the ring)
_ROLES = {**_TMA, "warp_roles": True}
GEMM_SCHEDULES = (# the default schedule: the lowering chooses the warpgroup tensor cores
                  # and a warp-specialized ring as deep as fits (4 versions here)
                  ({"bm": 128, "bn": 256, "bk": 64, "loop": "pipeline"}, {}),
                  ({"bm": 128, "bn": 256, "bk": 64, "loop": "pipeline"}, {**_TMA, "stages": 4}),
                  ({"bm": 128, "bn": 256, "bk": 64, "loop": "pipeline"}, {**_ROLES, "stages": 4}),
                  ({"bm": 256, "bn": 128, "bk": 64, "loop": "pipeline"},
                   {**_ROLES, "stages": 4, "block_threads": 512}),
                  ({"bm": 128, "bn": 128, "bk": 64, "loop": "pipeline"}, {**_ROLES, "stages": 5}),
                  # two blocks a multiprocessor (96 KiB of tiles each): one
                  # block's epilogue overlaps the other's K loop
                  ({"bm": 128, "bn": 128, "bk": 64, "loop": "pipeline"}, {**_ROLES, "stages": 3}),
                  ({"bm": 256, "bn": 128, "bk": 64, "loop": "pipeline"},
                   {**_WG, "stages": 4, "block_threads": 512}),
                  ({"bm": 128, "bn": 256, "bk": 64, "loop": "pipeline"}, {**_TMA, "stages": 3}),
                  ({"bm": 256, "bn": 128, "bk": 64, "loop": "pipeline"},
                   {**_TMA, "stages": 4, "block_threads": 512}),
                  ({"bm": 128, "bn": 128, "bk": 64, "loop": "pipeline"}, {**_TMA, "stages": 4}),
                  ({"bm": 256, "bn": 128, "bk": 64, "loop": "pipeline"},
                   {**_WG, "stages": 3, "block_threads": 512}),
                  ({"bm": 128, "bn": 256, "bk": 64, "loop": "pipeline"}, {**_WG, "stages": 4}),
                  ({"bm": 128, "bn": 256, "bk": 64, "loop": "pipeline"}, {**_WG, "stages": 3}),
                  ({"bm": 128, "bn": 128, "bk": 64, "loop": "pipeline"}, {**_WG, "stages": 3}),
                  ({"bm": 128, "bn": 128, "bk": 128, "loop": "pipeline"}, {**_WG, "stages": 3}),
                  ({"bm": 256, "bn": 128, "bk": 64, "loop": "pipeline"},
                   {**_WG, "stages": 2, "block_threads": 512}),
                  ({"bm": 128, "bn": 128, "bk": 32, "loop": "pipeline"}, {**_TC}),
                  ({"bm": 128, "bn": 128, "bk": 32, "loop": "pipeline"}, {**_TC, "stages": 3}),
                  ({"bm": 128, "bn": 128, "bk": 32, "loop": "pipeline"}, {**_TC, "stages": 4}),
                  ({"bm": 128, "bn": 128, "bk": 64, "loop": "pipeline"}, {**_TC, "stages": 3}),
                  ({"bm": 128, "bn": 64, "bk": 32, "loop": "pipeline"}, {**_TC, "stages": 4}),
                  ({"bm": 64, "bn": 64, "bk": 32, "loop": "pipeline"}, {**_TC, "stages": 4}),
                  ({"bm": 128, "bn": 256, "bk": 32, "loop": "pipeline"}, {**_TC, "block_threads": 512}),
                  ({"bm": 128, "bn": 256, "bk": 32, "loop": "pipeline"},
                   {**_TC, "block_threads": 512, "stages": 3}))
#: fused GEMM epilogues at 4096^3: (workload, torch's unfused form of it)
EPILOGUES = (("gemm_relu", "relu"), ("gemm_gelu", "gelu"))
#: their schedules: the default (warp-specialized), the ring on block
#: barriers, and 128 x 128 tiles two blocks a multiprocessor (one block's
#: epilogue overlaps the other's K loop) (--quick: the first)
EPILOGUE_SCHEDULES = GEMM_SCHEDULES[:2] + GEMM_SCHEDULES[5:6]
EPILOGUE_N = 4096

#: attention cases: (label, sizes, variants, SDPA's is_causal), each variant
#: (workload, kernel constants tried, GPU overrides tried with each). Prefill
#: is causal GQA at T = 2048 and D = 128 (the flash kernel, 64 x 64 tiles);
#: decode is one query per head against a long cache, its key blocks split
#: over ``reduce_splits`` programs (the split-KV kernel, one program per query
#: head, and the GQA decode kernel, one program per key/value head with the
#: group's query heads as rows). SDPA's causal mask is aligned top-left,
#: tilenest's bottom-right: they agree for Q = K, and decode (Q = 1, every
#: key seen) runs SDPA without a mask.
_ATT = {"dh": 128, "dv": 128}
#: prefill on 8 warps, one block per SM or (registers capped at 128) two
_PREFILL_GPU = (# the default schedule: a warpgroup per 64 query rows (128 threads at
                # bq = 64, 256 at 128), both products on warpgroups
                {},
                # 8 warps: at bq = 64 on mma.sync (auto's choice there)
                {"block_threads": 256}, {"block_threads": 256, "min_blocks": 2},
                # four warps on mma.sync: 64 query rows give each its own
                # whole-row tiles
                {"block_threads": 128, "mma_unit": "tensor"},
                # both products on warpgroups with 64 query rows on two
                # warpgroups: they share each row of tiles and pass P through
                # a swizzled shared tile
                {"block_threads": 256, "mma_unit": "wgmma"})
#: prefill query tiles of 64 rows (8 warps share each row of scores) and of
#: 128 (a warp's 16 x 64 score tiles span whole rows: the row folds stay in warps)
_PREFILL_TILES = ({"bq": 64, "bk": 64, **_ATT}, {"bq": 128, "bk": 64, **_ATT})


def _prefill(causal: bool) -> tuple[tuple[str, tuple, tuple], ...]:
    # causal: also with the key blocks every query row sees whole in a loop
    # of their own, with no mask (``split``); last, the default schedule with
    # exp2's own 1-ulp bound instead of the kernel's declared 4 ulp (what the
    # declared bound buys: spec/values.md V-14), and with scores in natural
    # units and ``exp`` at 96 ulp (one multiplication more per score)
    # and each 64-row one with the next block's scores issued ahead (``prefetch``)
    # or the previous block's ``P V`` issued late (``defer_pv``)
    tiles = tuple({**c, "causal": causal} for c in _PREFILL_TILES)
    if causal:
        tiles = tuple({**c, "split": sp} for sp in (False, True) for c in tiles)
    tiles += tuple({**c, flag: True} for flag in ("prefetch", "defer_pv")
                   for c in tiles if c["bq"] == 64)
    return (("flash_attention", tiles, _PREFILL_GPU),
            ("flash_attention", ({**tiles[0], "exp_ulp": 1.0},
                                 {**tiles[0], "log2": False, "exp_ulp": 96.0}), ({},)))


def _decode(splits: tuple[int, ...], gqa_splits: tuple[int, ...]) -> tuple:
    # the default schedule of the GQA kernel first (one program per key/value
    # head, its reduce unsplit: the gap the table's default line shows)
    return (("split_kv_attention", ({"bq": 16, "bk": 64, **_ATT},),
             tuple({"reduce_splits": n} for n in splits)),
            ("gqa_decode_attention", ({"bg": 16, "bk": 64, **_ATT},),
             ({},) + tuple({"block_threads": 128, "reduce_splits": n} for n in gqa_splits)))


_PREFILL_SIZES = {"B": 4, "HQ": 16, "HK": 4, "Q": 2048, "K": 2048, "D": 128, "DV": 128}
ATTENTION_CASES = (
    ("prefill causal B4 H16/4 T2048", _PREFILL_SIZES, _prefill(True), True),
    ("prefill B4 H16/4 T2048", _PREFILL_SIZES, _prefill(False), False),
    ("decode B1 H32/8 KV8k", {"B": 1, "HQ": 32, "HK": 8, "Q": 1, "K": 8192, "D": 128, "DV": 128},
     _decode((8, 16), (8, 16, 32)), False),
    ("decode B8 H32/8 KV32k",
     {"B": 8, "HQ": 32, "HK": 8, "Q": 1, "K": 32768, "D": 128, "DV": 128},
     _decode((4, 8), (4, 8)), False),
)
#: relative error norm allowed for attention against torch's float32 math
ATTENTION_TOL = 2e-2

#: ``grid_blocks`` of an override (``--set grid_blocks=resident``) meaning "as
#: many blocks as the device holds at once" (:func:`resident_blocks` of the
#: kernel compiled without a cap); not searched by default: slower than one
#: block per row for every row kernel measured (spec/lowering.md)
RESIDENT = "resident"
#: relative error norm allowed against the float64 reference, per storage dtype
TOL = {"f32": 1e-4, "bf16": 1e-2}
#: a sample lasts at least this long (seconds of device time)
SAMPLE_S = 2e-3
ROUNDS = 2
#: a call longer than this (seconds) is timed singly, within a budget
SLOW_S = 0.02
#: seconds of single slow calls per GEMM variant (default, --quick)
GEMM_BUDGET_S = (15.0, 6.0)
#: skip 8192^3 when 4096^3 predicts a tilenest call longer than this (seconds)
GEMM_SKIP_S = 12.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(prog="benchmarks/cuda.py",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="fewer samples, one schedule per workload, GEMM 4096^3 only "
                         "(under 2 minutes)")
    ap.add_argument("--only", nargs="+", choices=NAMES, metavar="NAME",
                    help=f"run only these ({', '.join(NAMES)}); the ceilings always run")
    ap.add_argument("--dtypes", nargs="+", choices=("f32", "bf16"), default=["f32", "bf16"],
                    help="storage dtypes of the row workloads (default: f32 bf16)")
    ap.add_argument("--no-compile", action="store_true",
                    help="leave out the torch.compile baselines")
    ap.add_argument("--samples", type=int, help="samples per implementation and round "
                    "(default 25, --quick 8)")
    ap.add_argument("--seed", type=int, help="seed of the random inputs (default: from the "
                    "clock, printed and recorded)")
    ap.add_argument("--block-threads", type=int, help="threads per program of every tilenest "
                    "kernel (default: the cuda schedule's)")
    ap.add_argument("--vector-lanes", type=int, help="consecutive elements per thread and step "
                    "(default: the cuda schedule's)")
    ap.add_argument("--set", action="append", metavar="FIELD=VALUE", dest="set_fields",
                    type=_schedule_field, default=[],
                    help="a field of every tilenest kernel's cuda schedule, e.g. min_blocks=8 "
                         "(repeatable; as `tilenest lower --set`)")
    ap.add_argument("--default-only", action="store_true",
                    help="attention: time only the default schedule of each variant's "
                         "constants (no GPU overrides) beside the baselines")
    ap.add_argument("--row-schedule", action="append", metavar="FIELD=VALUE",
                    dest="row_schedule", type=_kernel_constant, default=[],
                    help="time only the row workloads' schedules with this kernel constant "
                         "(e.g. rp=1; repeatable), and only the attention variants whose "
                         "constants include it (e.g. bq=128)")
    ap.add_argument("--gemm-unit", choices=("all", "wgmma", "tensor", "roles"), default="all",
                    help="GEMM schedules tried: all, the warpgroup ones (mma_unit=wgmma), the "
                         "warp ones (mma.sync), or the warp-specialized ones (warp_roles) after "
                         "the first schedule (bf16 and FP8)")
    ap.add_argument("--case", action="append", metavar="TEXT", dest="cases", default=[],
                    help="time only the attention cases whose label contains TEXT (e.g. "
                         "decode; repeatable; overrides --quick's choice of cases)")
    ap.add_argument("--out", type=Path, metavar="FILE.json", help="write every number here")
    a = ap.parse_args(argv)
    if a.samples is not None and a.samples < 1:
        ap.error("--samples must be at least 1")
    return a


def _kernel_constant(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` of a kernel constant (a Python literal or a bare word)."""
    from tilenest.cli import _assignment

    return _assignment("--row-schedule", text)


def _schedule_field(text: str) -> tuple[str, Any]:
    from tilenest.cli import schedule_field_arg

    return schedule_field_arg(text)


@dataclasses.dataclass
class Config:
    quick: bool
    samples: int
    compile: bool
    gemm_budget_s: float
    block_threads: int | None = None
    vector_lanes: int | None = None
    gemm_unit: str = "all"
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: kernel constants a row workload's schedule must have to be timed
    row_schedule: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: label texts of the attention cases to time (none: all, or --quick's)
    cases: tuple[str, ...] = ()
    #: attention: time only the variants with no GPU override (the default
    #: schedule of each kernel and constants), for a quick before / after
    default_only: bool = False


# ------------------------------------------------------------------------------ timing
class Events:
    """Device timing with one library's CUDA events, on its current stream."""

    def __init__(self, lib: str):
        self.lib = lib
        if lib == "torch":
            import torch

            self._new = lambda: torch.cuda.Event(enable_timing=True)
            self._ms = lambda a, b: a.elapsed_time(b)
            self.sync = torch.cuda.synchronize
        else:
            import cupy as cp

            self._new = cp.cuda.Event
            self._ms = cp.cuda.get_elapsed_time
            self.sync = lambda: cp.cuda.Device().synchronize()

    def batch(self, calls: list[Callable[[], Any]], n: int, prefix: bool) -> tuple[float, float]:
        """(device seconds, host enqueue seconds) per call of ``n`` calls
        enqueued back to back, cycling through ``calls``; with ``prefix`` one
        untimed call first keeps the device busy while the start is recorded."""
        a, b = self._new(), self._new()
        if prefix:
            calls[-1]()
        t0 = time.perf_counter()
        a.record()
        for i in range(n):
            calls[i % len(calls)]()
        b.record()
        host = time.perf_counter() - t0
        b.synchronize()
        return self._ms(a, b) * 1e-3 / n, host / n


@dataclasses.dataclass
class Impl:
    """One implementation to time: its calls (one per input set) and samples."""

    label: str
    lib: str
    calls: list[Callable[[], Any]]
    est_s: float | None = None
    budget_s: float | None = None
    samples: list[list[float]] = dataclasses.field(default_factory=list)
    host_s: list[float] = dataclasses.field(default_factory=list)
    inner: int = 1
    slow: bool = False

    def round(self, cfg: Config, warm: bool) -> None:
        ev = Events(self.lib)
        if warm:
            for c in self.calls:
                c()
            ev.sync()
        if self.est_s is None:
            self.est_s = ev.batch(self.calls, len(self.calls), prefix=False)[0]
        self.slow = self.est_s > SLOW_S
        if self.slow:
            self.inner = 1
            budget = self.budget_s or cfg.gemm_budget_s
            n = max(2, min(cfg.samples, int(budget / self.est_s)))
            prefix = False
        else:
            self.inner = max(1, min(1000, math.ceil(SAMPLE_S / self.est_s)))
            n = cfg.samples
            prefix = True
        got = []
        for _ in range(n):
            dev, host = ev.batch(self.calls, self.inner, prefix)
            got.append(dev)
            self.host_s.append(host)
        self.samples.append(got)

    def stats(self) -> dict[str, Any]:
        flat = sorted(s for r in self.samples for s in r)
        meds = [_median(r) for r in self.samples]
        med = _median(flat)
        host = _median(self.host_s)
        return {"median_s": med, "min_s": flat[0], "max_s": flat[-1],
                "round_medians_s": meds,
                "spread": (max(meds) - min(meds)) / min(meds) if len(meds) > 1 else None,
                "samples": len(flat), "calls_per_sample": self.inner,
                "host_enqueue_s": host, "launch_bound": host >= 0.9 * med, "slow": self.slow}


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def time_impls(impls: list[Impl], cfg: Config) -> dict[str, dict[str, Any]]:
    """Median seconds of each implementation; the rounds alternate between
    them (a slow one is timed in the first round only)."""
    for r in range(ROUNDS):
        for im in impls:
            if r and im.slow:
                continue
            im.round(cfg, warm=(r == 0 and im.est_s is None))
    return {im.label: im.stats() for im in impls}


# ------------------------------------------------------------------------------ device arrays
class Run:
    """State of one benchmark run: libraries, generator, problems, results."""

    def __init__(self, cfg: Config, seed: int):
        import cupy as cp
        import numpy as np
        import torch

        from tilenest.semantics import dtypes as D

        self.cfg, self.seed = cfg, seed
        self.torch, self.cp, self.np, self.D = torch, cp, np, D
        self.gen = torch.Generator(device="cuda")
        self.gen.manual_seed(seed)
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.bf16_path: str | None = None
        #: the measured ceilings (``ceilings``)
        self.ceil: dict[str, Any] = {}
        #: ndarray subclasses reporting a dtype CuPy lacks, by that dtype
        self._shims: dict[Any, Any] = {}

    def problem(self, msg: str) -> None:
        self.problems.append(msg)
        print(f"!!! FAIL: {msg}", flush=True)

    def note(self, msg: str) -> None:
        self.notes.append(msg)
        print(f"note: {msg}", flush=True)

    def tdtype(self, dtn: str) -> Any:
        return {"f32": self.torch.float32, "bf16": self.torch.bfloat16}[dtn]

    def randn(self, shape: tuple[int, ...], dtn: str, scale: float = 1.0,
              shift: float = 0.0) -> Any:
        """Normal random values (never zeros), rounded once to the storage dtype."""
        t = self.torch.randn(shape, generator=self.gen, device="cuda", dtype=self.torch.float32)
        if scale != 1.0:
            t.mul_(scale)
        if shift:
            t.add_(shift)
        return t.to(self.tdtype(dtn))

    def view(self, t: Any) -> Any:
        """A CuPy array on ``t``'s memory with the dtype tilenest checks
        (bf16: ``ml_dtypes.bfloat16``, FP8: ``ml_dtypes.float8_*``). CuPy
        without such a dtype gets an integer array of the same width whose
        ``dtype`` reports it (the launch passes only the pointer);
        ``bf16_path`` records which one was used for bf16."""
        torch, cp = self.torch, self.cp
        storage = {torch.bfloat16: (torch.int16, self.D.bf16),
                   torch.float8_e4m3fn: (torch.uint8, self.D.f8e4m3fn),
                   torch.float8_e5m2: (torch.uint8, self.D.f8e5m2)}
        if t.dtype not in storage:
            return cp.asarray(t)
        bits, dt = storage[t.dtype]
        raw = cp.asarray(t.view(bits))
        want = dt.np
        bf16 = t.dtype == torch.bfloat16
        if not bf16 or self.bf16_path in (None, "cupy"):
            try:
                v = raw.view(want)
                if v.dtype == want:
                    if bf16:
                        self.bf16_path = "cupy"
                    return v
            except Exception:  # noqa: BLE001, S110 - this CuPy lacks the dtype: use the shim
                pass
        if want not in self._shims:
            class Shim(cp.ndarray):  # type: ignore[misc, name-defined]
                """Integer storage reporting a dtype CuPy lacks."""

                @property
                def dtype(self) -> Any:
                    return want

            self._shims[want] = Shim
        if bf16:
            self.bf16_path = "int16 storage, dtype shim"
        return raw.view(array_class=self._shims[want])


def _rel_err(torch: Any, out: Any, ref: Any) -> float:
    d = out.double() - ref
    return float(torch.linalg.vector_norm(d) / torch.linalg.vector_norm(ref))


def _unwritten(torch: Any, out: Any) -> int:
    return int((~torch.isfinite(out)).sum())


def _phases(ck: Any, sizes: dict[str, int]) -> list[dict[str, Any]]:
    """Each launch of ``ck`` at these symbol values: blocks, threads, dynamic
    shared bytes (``CudaKernel.launches``, unchecked: the caller skips what
    does not fit)."""
    return [{"name": i.name, "blocks": n, "threads": i.threads, "shared_bytes": smem}
            for i, n, smem in ck.launches(sizes, check=False)]


def resident_blocks(run: Run, ck: Any, sizes: dict[str, int]) -> int:
    """Blocks of ``ck``'s launches that the device holds at once: the
    multiprocessors times the blocks one of them holds, the least that the
    threads (2048), registers (65536, allocated per warp in units of 256),
    shared memory (the cuda profile's per multiprocessor, less its reservation
    per block) and the 32-block limit
    allow (the Hopper limits; the launch's dynamic shared bytes at these
    sizes)."""
    from tilenest.targets import profile

    gpu = profile("cuda")
    sms = run.torch.cuda.get_device_properties(0).multi_processor_count
    per_sm = 32
    for info, _, smem in ck.launches(sizes, check=False):
        regs = ck.resources[info.name].registers
        warps = -(-info.threads // 32)
        per_warp = -(-regs * 32 // 256) * 256
        per_sm = min(per_sm, 2048 // info.threads, 65536 // (per_warp * warps),
                     gpu.sm_shared_bytes // (smem + ck.resources[info.name].shared_bytes
                                             + gpu.reserved_shared_bytes))
    return max(1, per_sm) * sms


def _resources(ck: Any) -> dict[str, Any]:
    out = {}
    for name, r in ck.resources.items():
        out[name] = dataclasses.asdict(r) if dataclasses.is_dataclass(r) else str(r)
    return out


def _sched_label(s: dict[str, Any]) -> str:
    if set(s) == {"rp"}:
        return f"rp={s['rp']}"
    if "bm" in s:
        rest = "".join(f" {k}={v}" for k, v in s.items() if k not in ("bm", "bn", "bk", "loop"))
        return f"{s['bm']}x{s['bn']}x{s['bk']}" + ("" if s.get("loop") == "pipeline"
                                                    else f" {s.get('loop')}") + rest
    return ",".join(f"{k}={v}" for k, v in s.items())


def _gpu_label(g: dict[str, Any]) -> str:
    if not g:
        return " default"
    return "".join((f" bt{v}" if k == "block_threads" else " staged" if k == "stage_loads" and v
                    else " hints" if k == "cache_hints" and v
                    else f" grid={v}" if k == "grid_blocks"
                    else f" regs{v}" if k == "row_registers"
                    else f" {k}={v}") for k, v in g.items())


def fixed_gpu(cfg: Config) -> dict[str, Any]:
    """The GPU schedule overrides the command line fixes (``--block-threads``,
    ``--vector-lanes``, ``--set``)."""
    return {**{n: v for n, v in (("block_threads", cfg.block_threads),
                                 ("vector_lanes", cfg.vector_lanes)) if v}, **cfg.fields}


def gpu_search(cfg: Config) -> list[dict[str, Any]]:
    """The GPU schedule overrides tried per row-workload schedule: the
    command line's, else the tuner's search (``tune.SEARCH``; ``--quick``:
    the default only)."""
    from tilenest.backends.cuda.tune import SEARCH

    fixed = fixed_gpu(cfg)
    if cfg.quick:
        return [fixed]
    out: list[dict[str, Any]] = []
    for g in SEARCH:
        g = {**g, **fixed}
        if g not in out:
            out.append(g)
    return out


def compile_variant(run: Run, wl: Any, dtn: str, sched: dict[str, Any],
                    sizes: dict[str, int], gpu: dict[str, Any] | None = None
                    ) -> tuple[Any, dict[str, Any]]:
    """Compile one schedule of ``wl`` for the GPU with the ``Schedule``
    overrides ``gpu`` (default: the command line's); (kernel or None, record).
    A launch whose shared memory exceeds a block's opt-in limit is skipped."""
    from tilenest.backends import cuda
    from tilenest.backends.cuda.runtime import MAX_BLOCKS, MAX_SHARED

    over = {**(gpu or {}), **fixed_gpu(run.cfg)}
    rec: dict[str, Any] = {"schedule": dict(sched), "gpu": dict(over),
                           "label": _sched_label(sched) + _gpu_label(over)}
    k = wl.kernel(getattr(run.D, dtn), sched)
    from tilenest.lowering import default_schedule

    if over.get("grid_blocks") == RESIDENT:
        plain = cuda.compile_program(
            k.program, default_schedule(k.program, "cuda", **{**over, "grid_blocks": None}),
            device="gpu")
        over["grid_blocks"] = resident_blocks(run, plain, sizes)
        rec["gpu"] = dict(over)
        rec["label"] = _sched_label(sched) + _gpu_label(over)
    ck = cuda.compile_program(k.program, default_schedule(k.program, "cuda", **over),
                              device="gpu")
    rec["cuda_schedule"] = {"block_threads": ck.schedule.block_threads,
                            "vector_lanes": ck.schedule.vector_lanes,
                            "stage_loads": ck.schedule.stage_loads}
    rec["compile_s"] = ck.compile_seconds
    rec["resources"] = _resources(ck)
    rec["warnings"] = ck.warnings()
    rec["phases"] = ph = _phases(ck, sizes)
    big = [p for p in ph if p["shared_bytes"] > MAX_SHARED or p["blocks"] > MAX_BLOCKS]
    if big:
        rec["skipped"] = (f"needs {max(p['shared_bytes'] for p in big)} B of shared memory "
                          f"per block (limit {MAX_SHARED}) or too many blocks")
        return None, rec
    return ck, rec


def compiled_variant(run: Run, rec: dict[str, Any], what: str, wl: Any, dtn: str,
                     sched: dict[str, Any], sizes: dict[str, int],
                     gpu: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """:func:`compile_variant` with its record appended to ``rec["tilenest"]``:
    ``(kernel, record)``, the kernel None when the compile failed (a problem,
    the record holding the error) or the launch does not fit (a note)."""
    try:
        ck, v = compile_variant(run, wl, dtn, sched, sizes, gpu)
    except Exception as e:  # noqa: BLE001 - reported, the run goes on
        v = {"schedule": dict(sched), "gpu": dict(gpu or {}),
             "label": _sched_label(sched) + _gpu_label(gpu or {}),
             "error": f"{type(e).__name__}: {e}"}
        run.problem(f"{what} {v['label']}: compile: {v['error']}")
        rec["tilenest"].append(v)
        return None, v
    rec["tilenest"].append(v)
    if ck is None:
        run.note(f"{what} {v['label']} skipped: {v['skipped']}")
    return ck, v


# ------------------------------------------------------------------------------ ceilings
def _warm_clocks(run: Run) -> None:
    """Half a second of matrix products, so the clocks are up before timing."""
    torch = run.torch
    a = run.randn((8192, 8192), "bf16")
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        torch.matmul(a, a)
        torch.cuda.synchronize()


def _copy_ceiling(run: Run) -> dict[str, Any]:
    """Device-to-device copy of ``COPY_BYTES`` by torch and by CuPy."""
    torch, cp, cfg = run.torch, run.cp, run.cfg
    n = COPY_BYTES // 4
    x = torch.rand(n, generator=run.gen, device="cuda")
    y = torch.empty_like(x)
    xc, yc = cp.asarray(x), cp.asarray(y)
    torch.cuda.synchronize()
    res = time_impls([Impl("torch copy_", "torch", [lambda: y.copy_(x)])], cfg)
    try:
        res.update(time_impls([Impl("cupy copyto", "cupy", [lambda: cp.copyto(yc, xc)])], cfg))
    except Exception as e:  # noqa: BLE001 - the torch copy still gives a ceiling
        run.note(f"cupy copy failed: {type(e).__name__}: {e}")
    torch.cuda.synchronize()
    if not torch.equal(x, y):
        run.problem("the copy-ceiling copy did not reproduce its input")
    moved = 2 * n * 4
    for k, st in res.items():
        st["bytes"] = moved
        st["bytes_per_s"] = moved / st["median_s"]
        print(f"copy {k}: {moved / 2**30:.0f} GiB moved in {st['median_s'] * 1e3:.3f} ms = "
              f"{st['bytes_per_s'] / 1e12:.2f} TB/s", flush=True)
    return res


def _cublas(run: Run, n: int) -> dict[str, Any]:
    """bf16 ``torch.matmul`` at ``n``^3 (f32 accumulation), rotating input sets."""
    torch = run.torch
    sets = [(run.randn((n, n), "bf16"), run.randn((n, n), "bf16")) for _ in range(ROTATE)]
    c = torch.empty((n, n), dtype=torch.bfloat16, device="cuda")
    calls = [lambda A=A, B=B: torch.matmul(A, B, out=c) for A, B in sets]
    st = time_impls([Impl(f"cublas {n}", "torch", calls)], run.cfg)[f"cublas {n}"]
    st["flop"] = 2 * n**3
    st["flop_per_s"] = 2 * n**3 / st["median_s"]
    print(f"cuBLAS bf16 {n}^3: {st['median_s'] * 1e3:.3f} ms = "
          f"{st['flop_per_s'] / 1e12:.0f} TFLOP/s", flush=True)
    return st


def ceilings(run: Run) -> dict[str, Any]:
    """Copy bandwidth (torch and CuPy) and the bf16 cuBLAS rate, measured here."""
    torch = run.torch
    _warm_clocks(run)
    copy = _copy_ceiling(run)
    torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    cublas = {}
    for n in GEMM_SIZES:
        cublas[str(n)] = _cublas(run, n)
        torch.cuda.empty_cache()
    return {"copy": copy, "copy_ceiling_bytes_per_s": max(v["bytes_per_s"] for v in copy.values()),
            "cublas": cublas,
            "allow_bf16_reduced_precision_reduction": False}


# ------------------------------------------------------------------------------ row workloads
def _row_inputs(run: Run, name: str, dtn: str) -> dict[str, Any]:
    """Random inputs as ``tilenest.workloads`` draws them (scales and shifts)."""
    R, C = ROWS, COLS
    if name == "softmax":
        return {"x": run.randn((R, C), dtn, 3.0)}
    if name == "rmsnorm":
        return {"x": run.randn((R, C), dtn, 2.0), "w": run.randn((C,), dtn)}
    return {"x": run.randn((R, C), dtn, 2.0, 3.0), "g": run.randn((C,), dtn),
            "b": run.randn((C,), dtn)}


def _row_fns(run: Run, name: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(eager torch function of the inputs, float64 reference of the inputs)."""
    torch = run.torch
    F = torch.nn.functional
    C = COLS
    if name == "softmax":
        return (lambda x: torch.softmax(x, -1)), (lambda x: torch.softmax(x.double(), -1))
    if name == "rmsnorm":
        def rms_ref(x: Any, w: Any) -> Any:
            x = x.double()
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w.double()

        return (lambda x, w: F.rms_norm(x, (C,), w, EPS)), rms_ref
    return ((lambda x, g, b: F.layer_norm(x, (C,), g, b, EPS)),
            (lambda x, g, b: F.layer_norm(x.double(), (C,), g.double(), b.double(), EPS)))


def _row_tn_args(run: Run, name: str, ins: dict[str, Any], out: Any,
                 extra: dict[str, Any]) -> tuple[Any, ...]:
    """The tilenest call's arguments, in the kernel's signature order."""
    v = run.view
    eps = run.np.float32(EPS)
    if name == "softmax":
        return (v(ins["x"]), extra["mask"], v(out))
    if name == "rmsnorm":
        return (v(ins["x"]), v(ins["w"]), v(out), eps)
    return (v(ins["x"]), v(extra["res"]), v(ins["g"]), v(ins["b"]), v(extra["h"]), v(out), eps)


def bench_rows(run: Run, name: str, dtn: str) -> dict[str, Any]:
    from tilenest.workloads import WORKLOADS

    torch, cfg = run.torch, run.cfg
    wl = WORKLOADS[name]
    R, C = ROWS, COLS
    tdt = run.tdtype(dtn)
    esize = torch.finfo(tdt).bits // 8
    nw = {"softmax": 0, "rmsnorm": 1, "layernorm": 2}[name]
    nbytes = (2 * R * C + nw * C) * esize
    rec: dict[str, Any] = {"workload": name, "dtype": dtn, "shape": [R, C], "bytes": nbytes,
                           "tilenest": [], "baselines": {}}
    print(f"--- {name} {dtn} {R}x{C}", flush=True)
    eager, ref_fn = _row_fns(run, name)
    keys = ROW_KEYS[name]
    extra: dict[str, Any] = {}
    if name == "softmax":  # the unmasked kernel takes the mask argument but reads none of it
        extra["mask"] = run.cp.asarray(torch.ones((R, C), dtype=torch.bool, device="cuda"))
    if name == "layernorm":  # the residual variant's tensors; this variant neither reads nor stores them
        extra["res"] = run.randn((R, C), dtn)
        extra["h"] = torch.empty((R, C), dtype=tdt, device="cuda")
    sets = [_row_inputs(run, name, dtn) for _ in range(ROTATE)]
    outs = [torch.empty((R, C), dtype=tdt, device="cuda") for _ in sets]
    chk = _row_inputs(run, name, dtn)  # fresh inputs for the correctness checks
    ref = ref_fn(*(chk[k] for k in keys))
    torch.cuda.synchronize()
    scheds = [sc for sc in wl.schedules
              if all(sc.get(f) == val for f, val in cfg.row_schedule.items())]
    if not scheds:
        run.note(f"{name} {dtn}: no schedule of the workload has "
                 f"{cfg.row_schedule} (it has {list(wl.schedules)})")
    impls: list[Impl] = []
    bound_all: list[tuple[dict[str, Any], list[Any]]] = []
    variants = [(sc, g) for sc in scheds for g in gpu_search(cfg)]
    for sched, gpu in variants:
        if cfg.quick and bound_all:
            break
        label = f"tilenest {_sched_label(sched)}{_gpu_label(gpu)}"
        ck, v = compiled_variant(run, rec, f"{name} {dtn}", wl, dtn, sched, {"R": R, "C": C},
                                 gpu)
        if ck is None:
            continue
        try:
            out = outs[0]
            out.fill_(float("nan"))
            torch.cuda.synchronize()
            bl = ck.bound(*_row_tn_args(run, name, chk, out, extra))
            bl.launch()
            bl.check()
            v["unwritten"] = _unwritten(torch, out)
            v["rel_err"] = _rel_err(torch, out, ref) if not v["unwritten"] else None
            ok = not v["unwritten"] and v["rel_err"] < TOL[dtn]
            print(f"{label}: compile {v['compile_s']:.2f} s, check rel err {v['rel_err']}, "
                  f"unwritten {v['unwritten']}: {'ok' if ok else 'WRONG'}", flush=True)
            if not ok:
                run.problem(f"{name} {dtn} {v['label']}: wrong result (rel err {v['rel_err']}, "
                            f"{v['unwritten']} elements not written or not finite; tol "
                            f"{TOL[dtn]})")
                v["error"] = "wrong result"
                continue
            bls = [ck.bound(*_row_tn_args(run, name, s, o, extra))
                   for s, o in zip(sets, outs, strict=True)]
        except Exception as e:  # noqa: BLE001
            run.problem(f"{name} {dtn} {v['label']}: run: {type(e).__name__}: {e}")
            v["error"] = f"{type(e).__name__}: {e}"
            continue
        impls.append(Impl(label, "cupy", [bl.launch for bl in bls]))
        bound_all.append((v, bls))
    if cfg.quick and not bound_all:
        run.note(f"{name} {dtn}: no schedule ran")
    # baselines
    base_calls: dict[str, list[Callable[[], Any]]] = {
        "eager": [lambda s=s: eager(*(s[k] for k in keys)) for s in sets]}
    rec["baselines"]["eager"] = {"rel_err": _rel_err(torch, eager(*(chk[k] for k in keys)), ref)}
    if cfg.compile:
        try:
            cfn = torch.compile(eager, dynamic=False)
            t0 = time.perf_counter()
            got = cfn(*(chk[k] for k in keys))
            torch.cuda.synchronize()
            rec["baselines"]["compile"] = {"compile_s": time.perf_counter() - t0,
                                           "rel_err": _rel_err(torch, got, ref)}
            del got
            base_calls["compile"] = [lambda s=s: cfn(*(s[k] for k in keys)) for s in sets]
        except Exception as e:  # noqa: BLE001 - reported, the run goes on
            msg = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            rec["baselines"]["compile"] = {"error": msg}
            run.note(f"{name} {dtn}: torch.compile failed: {msg}")
    if name == "softmax":
        hand = _hand_softmax(run, dtn, sets, outs, chk, ref)
        for k, (calls, info) in hand.items():
            rec["baselines"][k] = info
            if calls:
                base_calls[k] = calls
    for k, b in rec["baselines"].items():
        if b.get("rel_err") is not None and not b["rel_err"] < TOL[dtn]:
            run.note(f"{name} {dtn}: torch {k} has rel err {b['rel_err']:.3g} against the "
                     f"float64 reference (tol {TOL[dtn]}): check the reference")
    impls += [Impl(k, "cupy" if k in HAND_VARIANTS else "torch", c)
              for k, c in base_calls.items()]
    res = time_impls(impls, cfg)
    ceiling = run.ceil["copy_ceiling_bytes_per_s"]
    for k in base_calls:
        rec["baselines"][k].update(res[k])
    for (v, bls), im in zip(bound_all, impls, strict=False):
        v.update(res[im.label])
        try:
            for bl in bls:
                bl.check()
            bad = sum(_unwritten(torch, o) for o in outs)
            if bad:
                run.problem(f"{name} {dtn} {v['label']}: {bad} non-finite outputs after timing")
        except Exception as e:  # noqa: BLE001
            run.problem(f"{name} {dtn} {v['label']}: after timing: {type(e).__name__}: {e}")
        t = v["median_s"]
        v["ratio"] = {k: rec["baselines"][k]["median_s"] / t for k in base_calls}
    for entry in [*(v for v, _ in bound_all), *(rec["baselines"][k] for k in base_calls)]:
        entry["bytes_per_s"] = nbytes / entry["median_s"]
        entry["fraction_of_copy"] = entry["bytes_per_s"] / ceiling
    if bound_all:
        rec["best"] = min((v for v, _ in bound_all), key=lambda v: v["median_s"])["label"]
    for v, _ in bound_all:
        print(f"tilenest {v['label']}: {v['median_s'] * 1e3:.3f} ms, "
              f"{v['bytes_per_s'] / 1e12:.2f} TB/s ({100 * v['fraction_of_copy']:.0f}% of copy)",
              flush=True)
    for k in base_calls:
        b = rec["baselines"][k]
        print(f"{k if k in HAND_VARIANTS else 'torch ' + k}: {b['median_s'] * 1e3:.3f} ms, "
              f"{b['bytes_per_s'] / 1e12:.2f} TB/s",
              flush=True)
    return rec


HAND_SOURCE = HERE / "softmax_rows.cu"
HAND_THREADS = 256
#: the hand-written softmax kernels timed beside the baselines: label -> (entry
#: name suffix, inside the numerical contract)
HAND_VARIANTS = {"hand": ("", True), "hand ex2.approx": ("_approx", False)}


def hand_source(cols: int = COLS, threads: int = HAND_THREADS) -> str:
    """``softmax_rows.cu`` specialized to rows of ``cols`` columns and blocks
    of ``threads`` threads."""
    return f"#define HAND_COLS {cols}\n#define HAND_THREADS {threads}\n" + HAND_SOURCE.read_text()


def _hand_softmax(run: Run, dtn: str, sets: list[dict[str, Any]], outs: list[Any],
                  chk: dict[str, Any], ref: Any) -> dict[str, tuple[list[Any], dict[str, Any]]]:
    """The hand-written row softmax of ``softmax_rows.cu`` (rows in registers,
    specialized to ``COLS`` columns), compiled by tilenest's NVRTC under the
    same options and prelude as the generated kernels: label -> (calls, record).
    ``hand`` keeps the numerical contract (faithful exp, IEEE division), so it
    is a reference for what the generated kernel could reach; ``hand
    ex2.approx`` does not (its exp is ``__expf``) and shows what the faithful
    exp costs. Each is checked like a baseline before it is timed."""
    from tilenest.backends.cuda import ARCH, prelude_dirs
    from tilenest.backends.cuda.nvrtc import compile_cuda
    from tilenest.backends.cuda.runtime import _load_cubin

    torch, cp = run.torch, run.cp
    src = hand_source()
    out: dict[str, tuple[list[Any], dict[str, Any]]] = {}
    try:
        built = compile_cuda(src, HAND_SOURCE.name, arch=ARCH, include_dirs=prelude_dirs())
        names = {k: f"hand_softmax_{dtn}{suf}" for k, (suf, _) in HAND_VARIANTS.items()}
        mod = _load_cubin(built.cubin, list(names.values()))
    except Exception as e:  # noqa: BLE001 - reported, the run goes on
        run.problem(f"softmax {dtn}: hand-written kernel: {type(e).__name__}: {e}")
        return {k: ([], {"error": f"{type(e).__name__}: {e}"}) for k in HAND_VARIANTS}
    res = built.resources or {}

    def call(fn: Any, x: Any, y: Any) -> Any:
        args = (run.view(x), run.view(y))
        return lambda: fn((ROWS,), (HAND_THREADS,), args, shared_mem=HAND_THREADS // 8)

    for k, name in names.items():
        fn = mod[name]
        info: dict[str, Any] = {"contract": HAND_VARIANTS[k][1],
                                "registers": getattr(res.get(name), "registers", None)}
        probe = torch.empty_like(outs[0]).fill_(float("nan"))
        call(fn, chk["x"], probe)()
        torch.cuda.synchronize()
        info["unwritten"] = _unwritten(torch, probe)
        info["rel_err"] = _rel_err(torch, probe, ref) if not info["unwritten"] else None
        if info["unwritten"] or not info["rel_err"] < TOL[dtn]:
            run.problem(f"softmax {dtn} {k}: wrong result (rel err {info['rel_err']}, "
                        f"{info['unwritten']} elements not written or not finite)")
            out[k] = ([], {**info, "error": "wrong result"})
            continue
        out[k] = ([call(fn, s["x"], o) for s, o in zip(sets, outs, strict=True)], info)
        del probe
    cp.cuda.runtime.deviceSynchronize()
    return out


# ------------------------------------------------------------------------------ GEMM
def bench_gemm(run: Run) -> list[dict[str, Any]]:
    from tilenest.workloads import WORKLOADS

    torch, cfg = run.torch, run.cfg
    wl = WORKLOADS["gemm"]
    recs: list[dict[str, Any]] = []
    sizes = GEMM_SIZES[:1] if cfg.quick else GEMM_SIZES
    if cfg.gemm_unit == "roles":
        pool = GEMM_SCHEDULES[:1] + tuple((t, g) for t, g in GEMM_SCHEDULES if g.get("warp_roles"))
    else:
        pool = [(t, g) for t, g in GEMM_SCHEDULES if cfg.gemm_unit == "all"
                or (g.get("mma_unit") == "wgmma") == (cfg.gemm_unit == "wgmma")]
    scheds: list[tuple[dict[str, Any], dict[str, Any]]] = pool[:1] if cfg.quick else pool
    prev: tuple[int, float] | None = None  # (n, best seconds per call)
    for n in sizes:
        print(f"--- gemm bf16 {n}^3", flush=True)
        rec: dict[str, Any] = {"workload": "gemm", "dtype": "bf16", "n": n, "flop": 2 * n**3,
                               "cublas_flop_per_s": run.ceil["cublas"][str(n)]["flop_per_s"],
                               "tilenest": []}
        recs.append(rec)
        if prev is not None:
            pred = prev[1] * (n / prev[0]) ** 3
            rec["predicted_call_s"] = pred
            if pred > GEMM_SKIP_S:
                rec["skipped"] = (f"{prev[0]}^3 predicts {pred:.1f} s per call "
                                  f"(over {GEMM_SKIP_S} s)")
                run.note(f"gemm {n}^3 skipped: {rec['skipped']}")
                continue
        A0, B0 = run.randn((n, n), "bf16"), run.randn((n, n), "bf16")
        ref = A0.double() @ B0.double()
        sets = [(run.randn((n, n), "bf16"), run.randn((n, n), "bf16")) for _ in range(ROTATE)]
        c = torch.empty((n, n), dtype=torch.bfloat16, device="cuda")
        torch.cuda.synchronize()
        best: tuple[float, dict[str, Any]] | None = None
        for sched, gpu in scheds:
            ck, v = compiled_variant(run, rec, f"gemm {n}", wl, "bf16", sched,
                                     {"M": n, "K": n, "N": n}, gpu or None)
            if ck is None:
                continue
            try:
                c.fill_(float("nan"))
                torch.cuda.synchronize()
                bl = ck.bound(run.view(A0), run.view(B0), run.view(c))
                t0 = time.perf_counter()
                bl.launch()
                bl.check()
                t1 = time.perf_counter() - t0
                v["first_call_s"] = t1
                v["unwritten"] = _unwritten(torch, c)
                v["rel_err"] = _rel_err(torch, c, ref) if not v["unwritten"] else None
                ok = not v["unwritten"] and v["rel_err"] < TOL["bf16"]
                print(f"tilenest {v['label']}: compile {v['compile_s']:.2f} s, first call "
                      f"{t1:.3f} s, check rel err {v['rel_err']}, unwritten {v['unwritten']}: "
                      f"{'ok' if ok else 'WRONG'}", flush=True)
                if not ok:
                    run.problem(f"gemm {n} {v['label']}: wrong result (rel err {v['rel_err']}, "
                                f"{v['unwritten']} elements not written or not finite)")
                    v["error"] = "wrong result"
                    continue
                bls = [ck.bound(run.view(A), run.view(B), run.view(c)) for A, B in sets]
                im = Impl(f"tilenest {v['label']}", "cupy", [b.launch for b in bls],
                          est_s=t1 if t1 > SLOW_S else None, budget_s=cfg.gemm_budget_s)
                st = time_impls([im], cfg)[im.label]
                for b in bls:
                    b.check()
            except Exception as e:  # noqa: BLE001
                run.problem(f"gemm {n} {v['label']}: run: {type(e).__name__}: {e}")
                v["error"] = f"{type(e).__name__}: {e}"
                continue
            v.update(st)
            v["flop_per_s"] = 2 * n**3 / st["median_s"]
            v["fraction_of_cublas"] = v["flop_per_s"] / rec["cublas_flop_per_s"]
            if st["slow"]:
                run.note(f"gemm {n} {v['label']} is slow ({st['median_s']:.2f} s per call): "
                         f"timed with {st['samples']} single calls (budget "
                         f"{cfg.gemm_budget_s:.0f} s)")
            print(f"tilenest {v['label']}: {st['median_s'] * 1e3:.2f} ms, "
                  f"{v['flop_per_s'] / 1e12:.2f} TFLOP/s "
                  f"({100 * v['fraction_of_cublas']:.2f}% of cuBLAS)", flush=True)
            if best is None or st["median_s"] < best[0]:
                best = (st["median_s"], (sched, gpu))
        del A0, B0, ref, sets, c
        torch.cuda.empty_cache()
        if best is None:
            break
        _default_over_best(rec)
        prev = (n, best[0])
        # the default schedule again beside the fastest
        scheds = [pool[0]] + ([best[1]] if best[1] != pool[0] else [])
    return recs


def _default_over_best(rec: dict[str, Any]) -> None:
    """Record in ``rec`` the fastest tilenest time over each default-schedule
    variant's (``default_over_best``, by label: 1.0 where the default is the
    fastest), for the variants timed."""
    timed = [v for v in rec["tilenest"] if "median_s" in v]
    if timed:
        top = min(v["median_s"] for v in timed)
        rec["default_over_best"] = {v["label"]: top / v["median_s"] for v in timed
                                    if v.get("label", "").endswith(" default")}


def bench_epilogues(run: Run) -> list[dict[str, Any]]:
    """``gemm_relu`` and ``gemm_gelu`` at ``EPILOGUE_N``^3 in bf16 as one
    kernel each (the schedules of ``EPILOGUE_SCHEDULES``), against eager
    torch (cuBLAS, then the elementwise ops as separate kernels) and
    ``torch.compile`` of the same expression, checked first against the
    float64 formula."""
    from tilenest.workloads import WORKLOADS

    torch, cfg = run.torch, run.cfg
    F = torch.nn.functional
    n = EPILOGUE_N
    recs: list[dict[str, Any]] = []
    for wname, which in EPILOGUES:
        print(f"--- {wname} bf16 {n}^3", flush=True)
        rec: dict[str, Any] = {"workload": wname, "n": n, "flop": 2 * n**3, "tilenest": [],
                               "baselines": {}}
        recs.append(rec)

        def torch_fn(a: Any, b: Any, which: str = which) -> Any:
            y = torch.matmul(a, b) * 0.125 + 0.25
            return torch.relu(y) if which == "relu" else F.gelu(y, approximate="tanh")

        A0, B0 = run.randn((n, n), "bf16"), run.randn((n, n), "bf16")
        y64 = (A0.double() @ B0.double()) * 0.125 + 0.25
        ref = torch.relu(y64) if which == "relu" else F.gelu(y64, approximate="tanh")
        sets = [(run.randn((n, n), "bf16"), run.randn((n, n), "bf16")) for _ in range(ROTATE)]
        c = torch.empty((n, n), dtype=torch.bfloat16, device="cuda")
        impls: list[Impl] = []
        by_label: dict[str, dict[str, Any]] = {}
        scheds = EPILOGUE_SCHEDULES[:1] if cfg.quick else EPILOGUE_SCHEDULES
        if which == "gelu" and not cfg.quick:  # and with tanh's own 1-ulp bound
            scheds += tuple(({**c, "tanh_ulp": 1.0}, g) for c, g in EPILOGUE_SCHEDULES[::2])
        for sched, gpu in scheds:
            ck, v = compiled_variant(run, rec, wname, WORKLOADS[wname], "bf16", sched,
                                     {"M": n, "K": n, "N": n}, gpu)
            if ck is None:
                continue
            c.fill_(float("nan"))
            bl = ck.bound(run.view(A0), run.view(B0), run.view(c))
            bl.launch()
            bl.check()
            v["unwritten"] = _unwritten(torch, c)
            v["rel_err"] = _rel_err(torch, c, ref) if not v["unwritten"] else None
            if v["unwritten"] or v["rel_err"] >= TOL["bf16"]:
                run.problem(f"{wname} {v['label']}: wrong result (rel err {v['rel_err']}, "
                            f"{v['unwritten']} not written)")
                v["error"] = "wrong result"
                continue
            bls = [ck.bound(run.view(a), run.view(b), run.view(c)) for a, b in sets]
            im = Impl(f"tilenest {v['label']}", "cupy", [x.launch for x in bls])
            impls.append(im)
            by_label[im.label] = v
        for name, compiled in (("eager", False), ("compile", True)):
            fn = torch_fn
            b: dict[str, Any] = {}
            try:
                if compiled:
                    t0 = time.perf_counter()
                    fn = torch.compile(torch_fn)
                    fn(A0, B0)
                    torch.cuda.synchronize()
                    b["compile_s"] = time.perf_counter() - t0
                b["rel_err"] = _rel_err(torch, fn(A0, B0), ref)
            except Exception as e:  # noqa: BLE001
                rec["baselines"][name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
                run.note(f"{wname} {name}: {rec['baselines'][name]['error'][:120]}")
                continue
            rec["baselines"][name] = b
            impls.append(Impl(name, "torch", [lambda a=a, b_=b_, fn=fn: fn(a, b_)
                                              for a, b_ in sets]))
            by_label[name] = b
        if impls:
            for lab, st in time_impls(impls, cfg).items():
                by_label[lab].update(st)
                by_label[lab]["flop_per_s"] = rec["flop"] / st["median_s"]
        for v in rec["tilenest"]:
            if "median_s" in v:
                v["ratio"] = {k: rec["baselines"][k]["median_s"] / v["median_s"]
                              for k in ("eager", "compile") if "median_s" in
                              rec["baselines"].get(k, {})}
                print(f"tilenest {v['label']}: {v['median_s'] * 1e3:.2f} ms, ratios "
                      f"{v['ratio']}", flush=True)
        timed = [v for v in rec["tilenest"] if "median_s" in v]
        if timed:
            rec["best"] = min(timed, key=lambda v: v["median_s"])["label"]
        _default_over_best(rec)
        del A0, B0, y64, ref, sets, c
        torch.cuda.empty_cache()
    return recs


def _sdpa(run: Run, causal: bool, backend: str | None) -> Callable[..., Any]:
    """torch's SDPA (GQA through ``enable_gqa``), under one backend."""
    torch = run.torch
    F = torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    which = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH,
             "efficient": SDPBackend.EFFICIENT_ATTENTION}.get(backend or "", None)

    def call(q: Any, k: Any, v: Any, scale: float) -> Any:
        if which is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                  enable_gqa=True)
        with sdpa_kernel(which):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale,
                                                  enable_gqa=True)

    return call


def attention_cases(cfg: Config) -> tuple:
    """The attention cases a run times: those whose label contains one of
    ``cfg.cases``, else every other one with ``--quick``, else all."""
    if cfg.cases:
        return tuple(c for c in ATTENTION_CASES if any(t in c[0] for t in cfg.cases))
    return ATTENTION_CASES[::2] if cfg.quick else ATTENTION_CASES


def bench_attention(run: Run) -> list[dict[str, Any]]:
    """Every case of ``ATTENTION_CASES``: each GPU override of the tilenest
    kernel (checked against torch's float32 math SDPA first), SDPA under its
    flash backend (or its default choice where flash refuses the case) and
    ``torch.compile`` of the same SDPA call, in one run."""
    from tilenest.backends.cuda.tune import same_code_key
    from tilenest.workloads import WORKLOADS

    torch, cfg = run.torch, run.cfg
    recs: list[dict[str, Any]] = []
    cases = attention_cases(cfg)
    for label, sz, variants, causal in cases:
        print(f"--- attention {label}", flush=True)
        B, HQ, HK, Q, K, D, DV = (sz[x] for x in ("B", "HQ", "HK", "Q", "K", "D", "DV"))
        scale = 1.0 / math.sqrt(D)
        flop = 2 * B * HQ * Q * K * (D + DV) * (0.5 if causal and Q == K else 1.0)
        rec: dict[str, Any] = {"workload": " ".join(dict.fromkeys(w for w, _, _ in variants)),
                               "case": label,
                               "sizes": sz, "flop": flop, "causal": causal, "tilenest": [],
                               "baselines": {}}
        recs.append(rec)

        def inputs() -> tuple[Any, Any, Any]:
            return (run.randn((B, HQ, Q, D), "bf16"), run.randn((B, HK, K, D), "bf16"),
                    run.randn((B, HK, K, DV), "bf16"))

        q0, k0, v0 = inputs()
        ref = _sdpa(run, causal, "math")(q0.float(), k0.float(), v0.float(), scale).double()
        sets = [inputs() for _ in range(ROTATE)]
        o = torch.empty((B, HQ, Q, DV), dtype=torch.bfloat16, device="cuda")
        impls: list[Impl] = []
        by_label: dict[str, dict[str, Any]] = {}
        sources: dict[str, str] = {}  # the code (up to names) -> the first variant's label
        for wname, consts, gpu in ((w, c, g) for w, cs, gs in variants for c in cs for g in gs
                                   if all(c.get(f) == val for f, val in cfg.row_schedule.items())
                                   and not (cfg.default_only and g)):
            ck, v = compiled_variant(run, rec, f"attention {label}", WORKLOADS[wname], "bf16",
                                     consts, sz, gpu)
            v["workload"] = wname
            if ck is None:
                continue
            same = sources.setdefault(same_code_key(ck), v["label"])
            if same != v["label"]:  # the default schedule is one of the explicit ones
                v["skipped"] = f"same source as {same}"
                print(f"tilenest {v['label']}: {v['skipped']}", flush=True)
                continue
            try:
                o.fill_(float("nan"))
                sc = run.np.float32(scale)
                bl = ck.bound(run.view(q0), run.view(k0), run.view(v0), run.view(o), sc)
                bl.launch()
                bl.check()
                v["unwritten"] = _unwritten(torch, o)
                v["rel_err"] = _rel_err(torch, o, ref) if not v["unwritten"] else None
                ok = not v["unwritten"] and v["rel_err"] < ATTENTION_TOL
                print(f"tilenest {v['label']}: compile {v['compile_s']:.2f} s, rel err "
                      f"{v['rel_err']}, unwritten {v['unwritten']}: "
                      f"{'ok' if ok else 'WRONG'}", flush=True)
                if not ok:
                    run.problem(f"attention {label} {v['label']}: wrong result")
                    v["error"] = "wrong result"
                    continue
                bls = [ck.bound(run.view(a), run.view(b), run.view(c), run.view(o), sc)
                       for a, b, c in sets]
                im = Impl(f"tilenest {v['label']}", "cupy", [x.launch for x in bls])
                impls.append(im)
                by_label[im.label] = v
            except Exception as e:  # noqa: BLE001
                run.problem(f"attention {label} {v['label']}: run: {type(e).__name__}: {e}")
                v["error"] = f"{type(e).__name__}: {e}"
        for name, backend, compiled in (("sdpa flash", "flash", False),
                                        ("sdpa", None, False), ("compile", None, True)):
            fn = _sdpa(run, causal, backend)
            b: dict[str, Any] = {}
            try:
                if compiled:
                    t0 = time.perf_counter()
                    fn = torch.compile(fn)
                    fn(q0, k0, v0, scale)
                    torch.cuda.synchronize()
                    b["compile_s"] = time.perf_counter() - t0
                b["rel_err"] = _rel_err(torch, fn(q0, k0, v0, scale), ref)
            except Exception as e:  # noqa: BLE001 - e.g. a backend that refuses the case
                rec["baselines"][name] = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
                run.note(f"attention {label} {name}: {rec['baselines'][name]['error'][:120]}")
                continue
            rec["baselines"][name] = b
            im = Impl(name, "torch", [lambda a=a, k_=k_, c=c, fn=fn: fn(a, k_, c, scale)
                                      for a, k_, c in sets])
            impls.append(im)
            by_label[name] = b
        if impls:
            for lab, st in time_impls(impls, cfg).items():
                by_label[lab].update(st)
                by_label[lab]["flop_per_s"] = flop / st["median_s"]
        base = [b for k, b in rec["baselines"].items() if k != "compile" and "median_s" in b]
        best_sdpa = min((b["median_s"] for b in base), default=None)
        for v in rec["tilenest"]:
            if "median_s" in v:
                comp = rec["baselines"].get("compile", {}).get("median_s")
                v["ratio"] = {"sdpa": best_sdpa / v["median_s"] if best_sdpa else None,
                              "compile": comp / v["median_s"] if comp else None}
                print(f"tilenest {v['label']}: {v['median_s'] * 1e3:.3f} ms, "
                      f"{v['flop_per_s'] / 1e12:.1f} TFLOP/s, best SDPA / tilenest "
                      f"{v['ratio']['sdpa']}", flush=True)
        timed = [v for v in rec["tilenest"] if "median_s" in v]
        if timed:
            rec["best"] = min(timed, key=lambda v: v["median_s"])["label"]
        _default_over_best(rec)
        del q0, k0, v0, ref, sets, o
        torch.cuda.empty_cache()
    return recs


# ------------------------------------------------------------------------------ report
def _f(x: Any, fmt: str, scale: float = 1.0) -> str:
    """``x * scale`` in ``fmt``; None as a dash of the same width."""
    if x is None:
        w = fmt.split(".")[0]
        return "-".rjust(int(w) if w.isdigit() else 1)
    return format(x * scale, fmt)


def _x(r: float | None) -> str:
    return f"{'-':>9}" if r is None else f"{r:8.2f}x"


def table(out: dict[str, Any]) -> str:
    """The compact summary printed last."""
    L: list[str] = []
    ce = out["ceilings"]
    cp = ", ".join(f"{k} {v['bytes_per_s'] / 1e12:.2f}" for k, v in ce["copy"].items())
    cb = ", ".join(f"{n}^3 {v['flop_per_s'] / 1e12:.0f}" for n, v in ce["cublas"].items())
    L.append(f"{out['env'].get('device', '?')}  seed {out['seed']}  bf16 arrays: "
             f"{out.get('bf16_path') or '-'}")
    L.append(f"copy TB/s (read+write): {cp}  -> ceiling "
             f"{ce['copy_ceiling_bytes_per_s'] / 1e12:.2f};  cuBLAS bf16 TFLOP/s: {cb}")
    if out["rows"]:
        L.append("")
        L.append(f"{'rows ' + str(ROWS) + 'x' + str(COLS):<17}{'impl':<26}{'ms':>8}{'TB/s':>7}"
                 f"{'%copy':>7}{'eager/tn':>9}{'comp/tn':>9}{'spread':>7}{'comp s':>7}"
                 f"{'rel err':>9}")
        for r in out["rows"]:
            w = f"{r['workload']} {r['dtype']}"
            for v in r["tilenest"]:
                lab = ("*" if v.get("label") == r.get("best") else "") + "tn " + v.get(
                    "label", _sched_label(v.get("schedule", {})))
                if "median_s" not in v:
                    why = v.get("skipped") or v.get("error") or "not timed"
                    L.append(f"{w:<17}{lab:<26}  {why[:70]}")
                    continue
                rt = v.get("ratio", {})
                L.append(f"{w:<17}{lab:<26}{_f(v['median_s'], '8.3f', 1e3)}"
                         f"{_f(v['bytes_per_s'], '7.2f', 1e-12)}"
                         f"{_f(v['fraction_of_copy'], '6.0f', 100)}%"
                         f"{_x(rt.get('eager'))}{_x(rt.get('compile'))}"
                         f"{_f(v.get('spread'), '6.1f', 100)}%{_f(v['compile_s'], '7.2f')}"
                         f"{_f(v.get('rel_err'), '9.1e')}"
                         + (" launch-bound" if v.get("launch_bound") else ""))
            for k, b in r["baselines"].items():
                name = k if k in HAND_VARIANTS else "torch " + k
                if "median_s" not in b:
                    L.append(f"{w:<17}{name:<26}  {b.get('error', 'not timed')[:70]}")
                    continue
                L.append(f"{w:<17}{name:<26}{_f(b['median_s'], '8.3f', 1e3)}"
                         f"{_f(b['bytes_per_s'], '7.2f', 1e-12)}"
                         f"{_f(b['fraction_of_copy'], '6.0f', 100)}%{'':>18}"
                         f"{_f(b.get('spread'), '6.1f', 100)}%{_f(b.get('compile_s'), '7.2f')}"
                         f"{_f(b.get('rel_err'), '9.1e')}"
                         + (" launch-bound" if b.get("launch_bound") else ""))
    if out["gemm"]:
        L.append("")
        L.append(f"{'gemm bf16':<17}{'impl':<17}{'ms':>10}{'TFLOP/s':>9}{'%cuBLAS':>9}"
                 f"{'samples':>8}{'comp s':>7}{'rel err':>9}")
        for r in out["gemm"]:
            w = f"{r['n']}^3"
            L.append(f"{w:<17}{'cuBLAS':<17}{'':>10}{r['cublas_flop_per_s'] / 1e12:9.0f}")
            if r.get("skipped"):
                L.append(f"{w:<17}{'tilenest':<17}  skipped: {r['skipped']}")
            for v in r["tilenest"]:
                lab = "tn " + v.get("label", "?")
                if "median_s" not in v:
                    why = v.get("skipped") or v.get("error") or "not timed"
                    L.append(f"{w:<17}{lab:<17}  {why[:70]}")
                    continue
                L.append(f"{w:<17}{lab:<17}{_f(v['median_s'], '10.2f', 1e3)}"
                         f"{_f(v['flop_per_s'], '9.2f', 1e-12)}"
                         f"{_f(v['fraction_of_cublas'], '8.2f', 100)}%{v['samples']:>8}"
                         f"{_f(v['compile_s'], '7.2f')}{_f(v.get('rel_err'), '9.1e')}"
                         + (" (slow: single calls)" if v.get("slow") else ""))
            _default_line(L, w, r, 17)
    if out.get("epilogues"):
        L.append("")
        L.append(f"{'epilogue bf16':<17}{'impl':<26}{'ms':>9}{'TFLOP/s':>9}{'eager/tn':>9}"
                 f"{'comp/tn':>9}{'spread':>7}{'rel err':>9}")
        for r in out["epilogues"]:
            _impl_lines(L, f"{r['workload']} {r['n']}", r, (17, 26), ("eager", "compile"))
            _default_line(L, f"{r['workload']} {r['n']}", r, 17)
    if out.get("attention"):
        L.append("")
        L.append(f"{'attention bf16':<31}{'impl':<50}{'ms':>9}{'TFLOP/s':>9}{'sdpa/tn':>9}"
                 f"{'comp/tn':>9}{'spread':>7}{'rel err':>9}")
        for r in out["attention"]:
            _impl_lines(L, r["case"], r, (31, 50), ("sdpa", "compile"))
            _default_line(L, r["case"], r, 31)
    if out.get("fp8"):
        _fp8_lines(L, out["fp8"])
    if out.get("fp8_gemm"):
        L.append("")
        L.append(f"{'fp8 GEMM -> bf16':<17}{'impl':<40}{'ms':>9}{'TFLOP/s':>9}"
                 f"{'smm/tn':>9}{'fast/tn':>9}{'spread':>7}{'rel err':>9}")
        for r in out["fp8_gemm"]:
            _impl_lines(L, f"{r['n']}^3", r, (17, 40), ("scaled_mm", "scaled_mm fast"))
            _default_line(L, f"{r['n']}^3", r, 17)
    L.append("")
    L.append("ratios: baseline time / tilenest time (> 1: tilenest faster); spread: "
             "difference of the two rounds' medians; *: the fastest tilenest schedule")
    for n in out["notes"]:
        L.append(f"note: {n}")
    L.append(f"total {out['wall_s']:.0f} s; "
             + (f"{len(out['problems'])} FAILURE(S):" if out["problems"] else "all checks passed"))
    for p in out["problems"]:
        L.append(f"FAIL: {p}")
    return "\n".join(L)


def _default_line(L: list[str], w: str, r: dict[str, Any], cw: int) -> None:
    """Each default schedule's rate as a fraction of the fastest variant's
    (``_default_over_best``)."""
    for lab, x in r.get("default_over_best", {}).items():
        L.append(f"{w:<{cw}}{lab}: {100 * x:.0f}% of the fastest's rate")


def _impl_lines(L: list[str], w: str, r: dict[str, Any], cols: tuple[int, int],
                ratios: tuple[str, str]) -> None:
    """One table row per tilenest variant (the fastest starred; a skipped or
    failed one with its reason) and per torch baseline of record ``r``, in
    columns ``cols`` (case, implementation) with the two ``ratios``."""
    cw, lw = cols
    for v in r["tilenest"]:
        lab = ("*" if v.get("label") == r.get("best") else "") + "tn " + v.get("label", "?")
        if "median_s" not in v:
            why = v.get("skipped") or v.get("error") or "not timed"
            L.append(f"{w:<{cw}}{lab[:lw - 1]:<{lw}}  {why[:70]}")
            continue
        rt = v.get("ratio", {})
        L.append(f"{w:<{cw}}{lab[:lw - 1]:<{lw}}{_f(v['median_s'], '9.3f', 1e3)}"
                 f"{_f(v['flop_per_s'], '9.1f', 1e-12)}{_x(rt.get(ratios[0]))}"
                 f"{_x(rt.get(ratios[1]))}{_f(v.get('spread'), '6.1f', 100)}%"
                 f"{_f(v.get('rel_err'), '9.1e')}")
    for k, b in r["baselines"].items():
        if "median_s" not in b:
            L.append(f"{w:<{cw}}{'torch ' + k:<{lw}}  {b.get('error', 'not timed')[:70]}")
            continue
        L.append(f"{w:<{cw}}{'torch ' + k:<{lw}}{_f(b['median_s'], '9.3f', 1e3)}"
                 f"{_f(b['flop_per_s'], '9.1f', 1e-12)}{'':>18}"
                 f"{_f(b.get('spread'), '6.1f', 100)}%{_f(b.get('rel_err'), '9.1e')}")


# ------------------------------------------------------------------------------ FP8 casts
#: the per-tensor scale of the FP8 cast rows: x ~ 3 N(0, 1) times 64 puts a few
#: percent of the values past e4m3fn's 448, so saturation is exercised
FP8_SCALE = 64.0


def bench_fp8(run: Run) -> list[dict[str, Any]]:
    """Quantize f32 -> e4m3fn and dequantize back over ``ROWS x COLS`` (see
    the module docstring): each GPU schedule choice of :func:`gpu_search`
    (the default first) against eager torch and ``torch.compile``; the
    results checked before timing."""
    import numpy as np

    from tilenest.backends import cuda
    from tilenest.bench.kernels import kernels
    from tilenest.lowering import default_schedule
    from tilenest.semantics import numerics as N

    torch, cfg = run.torch, run.cfg
    R, C = ROWS, COLS
    s = FP8_SCALE
    f8 = torch.float8_e4m3fn
    top = float(N.FP8_MAX["f8e4m3fn"])
    xs = [run.randn((R, C), "f32", 3.0) for _ in range(ROTATE)]
    qs = [torch.empty((R, C), dtype=f8, device="cuda") for _ in xs]
    ys = [torch.empty((R, C), dtype=torch.float32, device="cuda") for _ in xs]
    for x, q in zip(xs, qs, strict=True):  # the dequantize inputs: torch's codes
        q.copy_(torch.clamp(x * s, -top, top).to(f8))

    def quant(x: Any) -> Any:
        return torch.clamp(x * s, -top, top).to(f8)

    def dequant(q: Any) -> Any:
        return q.to(torch.float32) * s

    out = []
    for name, eager, ins, outs in (("fp8_quantize", quant, xs, qs),
                                   ("fp8_dequantize", dequant, qs, ys)):
        label = {"fp8_quantize": "quantize f32 -> e4m3fn (saturate)",
                 "fp8_dequantize": "dequantize e4m3fn -> f32"}[name]
        rec: dict[str, Any] = {"workload": label, "shape": [R, C], "bytes": 5 * R * C,
                               "tilenest": [], "baselines": {}}
        print(f"--- fp8 {label} {R}x{C}", flush=True)
        k = kernels()[name]
        impls: list[Impl] = []
        timed: list[dict[str, Any]] = []
        for gpu in gpu_search(cfg):
            v: dict[str, Any] = {"label": _gpu_label(gpu).strip() or "default",
                                 "gpu": dict(gpu)}
            rec["tilenest"].append(v)
            try:
                ck = cuda.compile_program(k.program, default_schedule(k.program, "cuda", **gpu),
                                          device="gpu")
                v["compile_s"] = ck.compile_seconds
                v["resources"] = _resources(ck)
                bad = _fp8_mismatches(run, ck, name, qs[0], dequant)
                v["mismatches"] = bad
                print(f"tilenest {v['label']}: compile {v['compile_s']:.2f} s, {bad} elements "
                      f"differ from the reference: {'ok' if not bad else 'WRONG'}", flush=True)
                if bad:
                    run.problem(f"fp8 {label} {v['label']}: {bad} elements differ from the "
                                "reference")
                    v["error"] = "wrong result"
                    continue
                bls = [ck.bound(run.view(x), run.view(y), np.float32(s))
                       for x, y in zip(ins, outs, strict=True)]
            except Exception as e:  # noqa: BLE001 - reported, the run goes on
                v["error"] = f"{type(e).__name__}: {e}"
                run.problem(f"fp8 {label} {v['label']}: {v['error']}")
                continue
            impls.append(Impl(f"tilenest {v['label']}", "cupy", [b.launch for b in bls]))
            timed.append(v)
        base = {"eager": [lambda a=a, f=eager: f(a) for a in ins]}
        if cfg.compile:
            try:
                cfn = torch.compile(eager, dynamic=False)
                t0 = time.perf_counter()
                cfn(ins[0])
                torch.cuda.synchronize()
                rec["baselines"]["compile"] = {"compile_s": time.perf_counter() - t0}
                base["compile"] = [lambda a=a, f=cfn: f(a) for a in ins]
            except Exception as e:  # noqa: BLE001
                rec["baselines"]["compile"] = {"error": f"{type(e).__name__}: {e}"}
                run.note(f"fp8 {label}: torch.compile failed: {e}")
        rec["baselines"].setdefault("eager", {})
        impls += [Impl(k2, "torch", c) for k2, c in base.items()]
        res = time_impls(impls, cfg)
        ceiling = run.ceil["copy_ceiling_bytes_per_s"]
        entries = [(f"tilenest {v['label']}", v) for v in timed]
        entries += [(k2, rec["baselines"][k2]) for k2 in base]
        for key, e in entries:
            e.update(res[key])
            e["bytes_per_s"] = rec["bytes"] / e["median_s"]
            e["fraction_of_copy"] = e["bytes_per_s"] / ceiling
            print(f"{key}: {e['median_s'] * 1e3:.3f} ms, {e['bytes_per_s'] / 1e12:.2f} TB/s "
                  f"({100 * e['fraction_of_copy']:.0f}% of copy)", flush=True)
        for v in timed:
            v["ratio"] = {k2: rec["baselines"][k2]["median_s"] / v["median_s"] for k2 in base}
        if timed:
            rec["best"] = min(timed, key=lambda v: v["median_s"])["label"]
        out.append(rec)
    return out


#: the scaled FP8 GEMM (e4m3fn x e4m3fn -> bf16, per-tensor scales): sizes
#: and the kernel constants tried (``tilenest.bench.kernels``' ``fp8_gemm``)
FP8_GEMM_SIZES = (4096, 8192)
FP8_GEMM_TILES = (# the default schedule first (``--quick`` times it alone): warpgroup
                  # tensor cores on K-major swizzled tiles (k32 steps, a whole
                  # 128-byte panel of K per tile) fed by bulk tensor copies, the
                  # ring warp-specialized 4 versions deep
                  ({"bm": 128, "bn": 256, "bk": 128}, {}),
                  # on block barriers
                  ({"bm": 128, "bn": 128, "bk": 128}, {**_TMA, "stages": 4}),
                  # the same, warp-specialized
                  ({"bm": 128, "bn": 128, "bk": 128}, {**_ROLES, "stages": 4}),
                  ({"bm": 128, "bn": 256, "bk": 128}, {**_ROLES, "stages": 3}),
                  ({"bm": 128, "bn": 256, "bk": 128}, {**_ROLES, "stages": 4}),
                  # two blocks a multiprocessor (96 KiB of tiles each)
                  ({"bm": 128, "bn": 128, "bk": 128}, {**_ROLES, "stages": 3}),
                  ({"bm": 256, "bn": 128, "bk": 128}, {**_ROLES, "stages": 3,
                                                         "block_threads": 512}),
                  ({"bm": 128, "bn": 256, "bk": 128}, {**_TMA, "stages": 3}),
                  ({"bm": 256, "bn": 128, "bk": 128}, {**_TMA, "stages": 3,
                                                        "block_threads": 512}),
                  # the same fed by cp.async copies
                  ({"bm": 128, "bn": 256, "bk": 128}, {**_WG, "stages": 3}),
                  ({"bm": 256, "bn": 128, "bk": 128}, {**_WG, "stages": 3,
                                                       "block_threads": 512}),
                  ({"bm": 128, "bn": 128, "bk": 128}, {**_WG, "stages": 4}),
                  # mma.sync tensor cores
                  ({"bm": 128, "bn": 128, "bk": 64}, {**_TC}),
                  ({"bm": 128, "bn": 256, "bk": 64}, {**_TC, "block_threads": 512}),
                  ({"bm": 128, "bn": 128, "bk": 128}, {**_TC, "stages": 3}))


def bench_fp8_gemm(run: Run) -> list[dict[str, Any]]:
    """``C = (A B) sa sb`` in bf16 from e4m3fn ``A`` (n x n) and ``B`` stored
    transposed, against ``torch._scaled_mm`` with and without its fast
    accumulation, each tilenest variant first checked against the promoted
    ``torch._scaled_mm`` (relative error norm under ``TOL["bf16"]``)."""
    import numpy as np

    from tilenest.backends import cuda
    from tilenest.bench.kernels import kernels
    from tilenest.lowering import default_schedule

    torch, cfg = run.torch, run.cfg
    f8 = torch.float8_e4m3fn
    sa, sb = 0.5, 0.25
    out = []
    best: tuple[dict[str, Any], dict[str, Any]] | None = None
    for n in FP8_GEMM_SIZES[:1] if cfg.quick else FP8_GEMM_SIZES:
        rec: dict[str, Any] = {"workload": "fp8_gemm", "n": n, "tilenest": [], "baselines": {}}
        print(f"--- fp8 scaled GEMM e4m3fn {n}^3 -> bf16", flush=True)
        sets = [((torch.randn((n, n), generator=run.gen, device="cuda") * 4).to(f8),
                 (torch.randn((n, n), generator=run.gen, device="cuda") * 4).to(f8))
                for _ in range(ROTATE)]
        cs = [torch.empty((n, n), dtype=torch.bfloat16, device="cuda") for _ in sets]
        one = {k: torch.tensor(v, device="cuda") for k, v in (("a", sa), ("b", sb))}

        def scaled(a: Any, bt: Any, fast: bool) -> Any:
            return torch._scaled_mm(a, bt.t(), scale_a=one["a"], scale_b=one["b"],
                                    out_dtype=torch.bfloat16, use_fast_accum=fast)

        ref = scaled(*sets[0], False).double()
        impls: list[Impl] = []
        timed = []
        pool = FP8_GEMM_TILES
        if cfg.gemm_unit == "roles":  # the first tile and the warp-specialized ones
            pool = pool[:1] + tuple((c, g) for c, g in pool if g.get("warp_roles"))
        # at the larger sizes the default and the fastest of the first
        tiles = pool if n == FP8_GEMM_SIZES[0] or best is None else (
            (pool[0],) + ((best,) if best != pool[0] else ()))
        for consts, gpu in tiles[:1] if cfg.quick else tiles:
            v: dict[str, Any] = {"label": f"{consts['bm']}x{consts['bn']}x{consts['bk']}"
                                 + _gpu_label(gpu), "consts": consts, "gpu": gpu}
            rec["tilenest"].append(v)
            try:
                k = kernels()["fp8_gemm"].specialize(**consts)
                ck = cuda.compile_program(k.program,
                                          default_schedule(k.program, "cuda", **gpu,
                                                           **fixed_gpu(cfg)), device="gpu")
                v["compile_s"] = ck.compile_seconds
                v["resources"] = _resources(ck)
                got = torch.full((n, n), float("nan"), dtype=torch.bfloat16, device="cuda")
                bl = ck.bound(run.view(sets[0][0]), run.view(sets[0][1]), run.view(got),
                              np.float32(sa), np.float32(sb))
                bl.launch()
                bl.check()
                v["rel_err"] = _rel_err(torch, got, ref)
                ok = v["rel_err"] < TOL["bf16"] and not _unwritten(torch, got)
                print(f"tilenest {v['label']}: compile {v['compile_s']:.1f} s, rel err "
                      f"{v['rel_err']:.2e}: {'ok' if ok else 'WRONG'}", flush=True)
                if not ok:
                    run.problem(f"fp8 GEMM {n} {v['label']}: wrong result (rel err "
                                f"{v['rel_err']})")
                    v["error"] = "wrong result"
                    continue
                bls = [ck.bound(run.view(a), run.view(b), run.view(c), np.float32(sa),
                                np.float32(sb)) for (a, b), c in zip(sets, cs, strict=True)]
            except Exception as e:  # noqa: BLE001 - reported, the run goes on
                v["error"] = f"{type(e).__name__}: {e}"
                run.problem(f"fp8 GEMM {n} {v['label']}: {v['error']}")
                continue
            impls.append(Impl(f"tilenest {v['label']}", "cupy", [b.launch for b in bls]))
            timed.append(v)
        base = {f"scaled_mm{' fast' if fast else ''}":
                [lambda a=a, b=b, f=fast: scaled(a, b, f) for a, b in sets]
                for fast in (False, True)}
        for k2 in base:
            rec["baselines"][k2] = {"rel_err": _rel_err(
                torch, scaled(*sets[0], k2.endswith("fast")), ref)}
        impls += [Impl(k2, "torch", c) for k2, c in base.items()]
        res = time_impls(impls, cfg)
        flop = 2 * n**3
        for key, e in [(f"tilenest {v['label']}", v) for v in timed] + [
                (k2, rec["baselines"][k2]) for k2 in base]:
            e.update(res[key])
            e["flop_per_s"] = flop / e["median_s"]
            print(f"{key}: {e['median_s'] * 1e3:.3f} ms, {e['flop_per_s'] / 1e12:.0f} TFLOP/s",
                  flush=True)
        for v in timed:
            v["ratio"] = {k2: rec["baselines"][k2]["median_s"] / v["median_s"] for k2 in base}
        if timed:
            top = min(timed, key=lambda v: v["median_s"])
            rec["best"] = top["label"]
            best = (top["consts"], top["gpu"])
        _default_over_best(rec)
        out.append(rec)
    return out


def _fp8_mismatches(run: Run, ck: Any, name: str, q: Any, dequant: Callable[[Any], Any]) -> int:
    """Elements of one call of FP8 kernel ``ck`` on fresh inputs, into an
    output poisoned with NaN, that differ from the reference: quantize against
    ``numerics.cast`` on the host (bits), dequantize against torch (values)."""
    import numpy as np

    from tilenest.semantics import numerics as N

    torch, D = run.torch, run.D
    s = np.float32(FP8_SCALE)
    if name == "fp8_quantize":
        chk = run.randn((ROWS, COLS), "f32", 3.0)
        got = torch.full((ROWS, COLS), float("nan"), device="cuda").to(torch.float8_e4m3fn)
        ck.bound(run.view(chk), run.view(got), s).launch()
        torch.cuda.synchronize()
        want = N.cast(chk.cpu().numpy() * s, D.f32, D.f8e4m3fn, "saturate")
        return int(np.count_nonzero(got.view(torch.uint8).cpu().numpy() != want.view(np.uint8)))
    got = torch.full((ROWS, COLS), float("nan"), device="cuda")
    ck.bound(run.view(q), run.view(got), s).launch()
    torch.cuda.synchronize()
    return int((got != dequant(q)).sum())


def _fp8_lines(L: list[str], recs: list[dict[str, Any]]) -> None:
    """The FP8 cast rows of the summary table."""
    L.append("")
    L.append(f"{'fp8 ' + str(ROWS) + 'x' + str(COLS):<36}{'impl':<34}{'ms':>8}{'TB/s':>7}"
             f"{'%copy':>7}{'eager/tn':>9}{'comp/tn':>9}{'spread':>7}")
    for r in recs:
        rows = [(("*" if v["label"] == r.get("best") else "") + "tn " + v["label"], v)
                for v in r["tilenest"]]
        rows += [("torch " + k, b) for k, b in r["baselines"].items()]
        for lab, e in rows:
            if "median_s" not in e:
                L.append(f"{r['workload']:<36}{lab[:33]:<34}  {e.get('error', 'not timed')[:60]}")
                continue
            rt = e.get("ratio", {})
            L.append(f"{r['workload']:<36}{lab[:33]:<34}{_f(e['median_s'], '8.3f', 1e3)}"
                     f"{_f(e['bytes_per_s'], '7.2f', 1e-12)}"
                     f"{_f(e['fraction_of_copy'], '6.0f', 100)}%{_x(rt.get('eager'))}"
                     f"{_x(rt.get('compile'))}{_f(e.get('spread'), '6.1f', 100)}%")


def _env(run: Run) -> dict[str, Any]:
    torch, cp = run.torch, run.cp
    p = torch.cuda.get_device_properties(0)
    env: dict[str, Any] = {"device": p.name, "sm_count": p.multi_processor_count,
                           "l2_bytes": getattr(p, "L2_cache_size", None),
                           "memory_bytes": p.total_memory, "torch": torch.__version__,
                           "torch_cuda": torch.version.cuda, "cupy": cp.__version__,
                           "python": sys.version.split()[0]}
    try:
        import triton

        env["triton"] = triton.__version__
    except Exception:  # noqa: BLE001
        env["triton"] = None
    try:
        from tilenest.backends.cuda.nvrtc import nvrtc_library

        lib = nvrtc_library()
        env["nvrtc"] = {"path": str(lib.path), "version": list(lib.version),
                        "origin": lib.origin}
    except Exception as e:  # noqa: BLE001
        env["nvrtc"] = f"{type(e).__name__}: {e}"
    return env


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    t_start = time.perf_counter()
    cfg = Config(quick=a.quick, samples=a.samples or (8 if a.quick else 25),
                 compile=not a.no_compile, gemm_budget_s=GEMM_BUDGET_S[1 if a.quick else 0],
                 block_threads=a.block_threads, vector_lanes=a.vector_lanes,
                 gemm_unit=a.gemm_unit, fields=dict(a.set_fields),
                 row_schedule=dict(a.row_schedule), cases=tuple(a.cases),
                 default_only=a.default_only)
    seed = a.seed if a.seed is not None else time.time_ns() % (2**31)
    only = set(a.only or NAMES)
    print(f"seed {seed}", flush=True)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device is visible to torch", file=sys.stderr)
        return 2
    from tilenest.backends import cuda

    cuda.clear_cache()
    run = Run(cfg, seed)
    out: dict[str, Any] = {"args": {k: (str(v) if isinstance(v, Path) else v)
                                    for k, v in vars(a).items()},
                           "seed": seed, "env": _env(run), "config": dataclasses.asdict(cfg),
                           "method": {"rotate": ROTATE, "rounds": ROUNDS, "sample_s": SAMPLE_S,
                                      "tol": TOL, "eps": EPS, "slow_s": SLOW_S,
                                      "gemm_skip_s": GEMM_SKIP_S},
                           "rows": [], "gemm": [], "epilogues": [], "attention": [], "fp8": [], "fp8_gemm": []}
    print(f"{out['env']['device']}, torch {torch.__version__}, cupy {run.cp.__version__}",
          flush=True)
    run.ceil = out["ceilings"] = ceilings(run)
    for name in ROW_NAMES:
        if name not in only:
            continue
        for dtn in a.dtypes:
            try:
                out["rows"].append(bench_rows(run, name, dtn))
            except Exception as e:  # noqa: BLE001 - one workload's crash must not hide the rest
                run.problem(f"{name} {dtn}: {type(e).__name__}: {e}")
            run.torch.cuda.empty_cache()
    if "gemm" in only:
        try:
            out["gemm"] = bench_gemm(run)
        except Exception as e:  # noqa: BLE001
            run.problem(f"gemm: {type(e).__name__}: {e}")
    if "epilogues" in only:
        try:
            out["epilogues"] = bench_epilogues(run)
        except Exception as e:  # noqa: BLE001
            run.problem(f"epilogues: {type(e).__name__}: {e}")
    if "attention" in only:
        try:
            out["attention"] = bench_attention(run)
        except Exception as e:  # noqa: BLE001
            run.problem(f"attention: {type(e).__name__}: {e}")
    if "fp8" in only:
        try:
            out["fp8"] = bench_fp8(run)
        except Exception as e:  # noqa: BLE001
            run.problem(f"fp8: {type(e).__name__}: {e}")
        run.torch.cuda.empty_cache()
        try:
            out["fp8_gemm"] = bench_fp8_gemm(run)
        except Exception as e:  # noqa: BLE001
            run.problem(f"fp8 GEMM: {type(e).__name__}: {e}")
    out["bf16_path"] = run.bf16_path
    out["notes"], out["problems"] = run.notes, run.problems
    out["wall_s"] = time.perf_counter() - t_start
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=2, default=str))
        print(f"wrote {a.out}", flush=True)
    print()
    print(table(out), flush=True)
    return 1 if run.problems else 0


if __name__ == "__main__":
    sys.exit(main())
