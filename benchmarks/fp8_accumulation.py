"""How an NVIDIA GPU's FP8 matrix multiply accumulates, measured (not timed).

    python benchmarks/fp8_accumulation.py [--out FILE.json]

FP8 products are exact in f32 (two 4-bit significands give at most 8 bits),
so a product ``A B`` of e4m3fn matrices with f32 accumulation differs from
the exact value only by how the sums are rounded. This script measures that
on the GPU three ways: through ``torch._scaled_mm`` (cuBLASLt's wgmma
kernels; unit scales, f32 output) with ``use_fast_accum=True`` (the tensor
cores' own accumulation) and with ``False`` (partial sums promoted into f32
registers periodically), one warp's ``mma.sync.m16n8k32`` e4m3
instructions chained through their f32 accumulators (the instruction a
``mma.sync`` lowering would use), and tilenest's own FP8 GEMM on the
warpgroup tensor cores (``mma_unit="wgmma"``, ``wgmma`` k32 e4m3 steps into
f32 registers, f32 output), against the exact sum (``float64``, which holds every partial sum here):

* **kept bits**: one output element sums ``1`` and one product ``2^-p``
  (``p`` = 1..18); the smallest ``p`` whose term is lost is the number of
  fraction bits the accumulation keeps next to a leading ``1``, for the
  small term in the same group of 32 consecutive ``k`` as the ``1`` (one
  instruction's ``k``) and in a later group;
* **direction**: ``1`` plus 31 terms ``2^-p`` each below the kept bits: lost
  each time (truncation) or summed first (wider internal sum);
* **random**: e4m3fn values of a scaled normal distribution, K = 256..8192,
  the largest error per output in units of ``sum_k |a_ik b_kj|`` (the bound
  the numerical contract would state) and its ratio to ``K 2^-24``, the
  first-order bound of f32 accumulation in any order.

Not a timed test: it prints a table and writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path
from typing import Any

# Run as ``python benchmarks/fp8_accumulation.py``, this folder would come
# first on the import path and ``benchmarks/cuda.py`` would shadow the
# ``cuda`` namespace package that CuPy imports.
if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)


def _mm(torch: Any, a: Any, b: Any, fast: bool) -> Any:
    """``a @ b`` by ``torch._scaled_mm`` in f32 (``b`` column-major, as cuBLASLt needs)."""
    one = torch.ones((), device="cuda", dtype=torch.float32)
    return torch._scaled_mm(a, b.t().contiguous().t(), scale_a=one, scale_b=one,
                            out_dtype=torch.float32, use_fast_accum=fast)


def kept_bits(torch: Any, how: str, k: int, at: int) -> int | None:
    """The smallest ``p`` whose product ``2^-p`` at ``k`` index ``at`` is lost
    next to ``1`` at index 0 (None: none of ``p`` <= 18 is lost)."""
    f8 = torch.float8_e4m3fn
    for p in range(1, 19):
        a = torch.zeros((16, k), device="cuda")
        b = torch.zeros((k, 16), device="cuda")
        a[:, 0] = 1.0
        b[0, :] = 1.0
        a[:, at] = 2.0 ** -(p // 2)
        b[at, :] = 2.0 ** -(p - p // 2)
        c = _product(torch, how, a.to(f8), b.to(f8))
        if float(c[0, 0]) != 1.0 + 2.0 ** -p:
            return p
    return None


def many_small(torch: Any, how: str, p: int) -> float:
    """``1 + 31 * 2^-p`` computed: what survives of 31 small terms."""
    f8 = torch.float8_e4m3fn
    a = torch.zeros((16, 32), device="cuda")
    b = torch.zeros((32, 16), device="cuda")
    a[:, 0] = 1.0
    b[0, :] = 1.0
    a[:, 1:] = 2.0 ** -(p // 2)
    b[1:, :] = 2.0 ** -(p - p // 2)
    return float(_product(torch, how, a.to(f8), b.to(f8))[0, 0])


def random_error(torch: Any, how: str, k: int, gen: Any) -> dict[str, float]:
    """The largest error of a 16 x 256 x ``k`` product of random e4m3fn
    matrices, relative to ``sum |a b|`` per output."""
    f8 = torch.float8_e4m3fn
    a = (torch.randn((16, k), device="cuda", generator=gen) * 8).to(f8)
    b = (torch.randn((k, 256), device="cuda", generator=gen) * 8).to(f8)
    got = _product(torch, how, a, b).double()
    ad, bd = a.double(), b.double()
    exact = ad @ bd
    scale = ad.abs() @ bd.abs()
    rel = float(((got - exact).abs() / scale).max())
    return {"k": k, "max_err_over_abs_sum": rel, "over_k_2^-24": rel / (k * 2.0 ** -24)}


#: one warp's ``mma.sync.m16n8k32`` with e4m3 operands, ``K / 32`` of them
#: chained through the f32 accumulator registers: ``a`` is 16 x K row-major,
#: ``bt`` (B transposed) 8 x K row-major, ``d`` 16 x 8 (PTX fragment layouts
#: of m16n8k32 for 8-bit types)
MMA_SYNC_SRC = r"""
extern "C" __global__ void mma_e4m3(const unsigned char* a, const unsigned char* bt,
                                    float* d, int K) {
  int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  float c[4] = {0.f, 0.f, 0.f, 0.f};
  for (int k0 = 0; k0 < K; k0 += 32) {
    unsigned ra[4], rb[2];
    ra[0] = *(const unsigned*)(a + g * K + k0 + t * 4);
    ra[1] = *(const unsigned*)(a + (g + 8) * K + k0 + t * 4);
    ra[2] = *(const unsigned*)(a + g * K + k0 + 16 + t * 4);
    ra[3] = *(const unsigned*)(a + (g + 8) * K + k0 + 16 + t * 4);
    rb[0] = *(const unsigned*)(bt + g * K + k0 + t * 4);
    rb[1] = *(const unsigned*)(bt + g * K + k0 + 16 + t * 4);
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(rb[0]), "r"(rb[1]));
  }
  d[g * 8 + t * 2] = c[0];
  d[g * 8 + t * 2 + 1] = c[1];
  d[(g + 8) * 8 + t * 2] = c[2];
  d[(g + 8) * 8 + t * 2 + 1] = c[3];
}
"""


@functools.cache
def _mma_sync_kernel() -> Any:
    import cupy as cp

    return cp.RawKernel(MMA_SYNC_SRC, "mma_e4m3", options=("-arch=sm_90a",))


def _mma_sync(torch: Any, a: Any, b: Any) -> Any:
    """``a @ b`` (e4m3fn, ``a`` 16 x K, ``b`` K x 8) by chained ``mma.sync``."""
    import cupy as cp

    fn = _mma_sync_kernel()
    K = a.shape[1]
    av = cp.asarray(a.contiguous().view(torch.uint8))
    bv = cp.asarray(b.t().contiguous().view(torch.uint8))
    d = cp.zeros((16, 8), dtype=cp.float32)
    fn((1,), (32,), (av, bv, d, cp.int32(K)))
    return torch.as_tensor(d, device="cuda")


@functools.cache
def _wgmma_kernel(device: str = "gpu") -> Any:
    """tilenest's FP8 GEMM with f32 output on ``wgmma``, compiled for the GPU."""
    import tilenest as tn
    from tilenest.backends import cuda
    from tilenest.bench.kernels import fp8_gemm_kernel
    from tilenest.lowering import default_schedule

    prog = fp8_gemm_kernel(tn.f32).specialize(bm=64, bn=128, bk=128).program
    return cuda.compile_program(prog, default_schedule(prog, "cuda", mma_unit="wgmma",
                                                       stages=3), device=device)


def _fp8_view(torch: Any, t: Any) -> Any:
    """A CuPy array on the e4m3fn tensor ``t``'s memory with the dtype
    ``ml_dtypes.float8_e4m3fn`` (what tilenest checks; the launch passes only
    the pointer)."""
    import cupy as cp
    import ml_dtypes

    return cp.asarray(t.contiguous().view(torch.uint8)).view(ml_dtypes.float8_e4m3fn)


def _wgmma(torch: Any, a: Any, b: Any) -> Any:
    """``a @ b`` (e4m3fn) by tilenest's FP8 GEMM on ``wgmma``, in f32 (unit scales)."""
    import cupy as cp
    import numpy as np

    ck = _wgmma_kernel()
    c = cp.full((a.shape[0], b.shape[1]), float("nan"), dtype=cp.float32)
    one = np.float32(1.0)
    ck.bound(_fp8_view(torch, a), _fp8_view(torch, b.t().contiguous()), c, one, one).launch()
    return torch.as_tensor(c, device="cuda")


def _product(torch: Any, how: str, a: Any, b: Any) -> Any:
    """``a @ b`` of e4m3fn matrices in f32 by ``how``: "fast", "promoted"
    (``torch._scaled_mm``), "mma.sync" (the first 8 columns) or "wgmma"
    (tilenest's kernel)."""
    if how == "mma.sync":
        return _mm_sync_full(torch, a, b)
    if how == "wgmma":
        return _wgmma(torch, a, b)
    return _mm(torch, a, b, how == "fast")


def _mm_sync_full(torch: Any, a: Any, b: Any) -> Any:
    """``a @ b`` for 16-row ``a``, by 8-column slices of ``b``."""
    cols = [_mma_sync(torch, a, b[:, j:j + 8]) for j in range(0, b.shape[1], 8)]
    return torch.cat(cols, dim=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="write the numbers here as JSON")
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device is visible to torch", file=sys.stderr)
        return 2
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    dev = torch.cuda.get_device_name()
    out: dict[str, Any] = {"device": dev, "torch": torch.__version__, "modes": {}}
    print(f"{dev}, torch {torch.__version__}")
    for how in ("fast", "promoted", "mma.sync", "wgmma"):
        mode = {"fast": "torch._scaled_mm, use_fast_accum=True",
                "promoted": "torch._scaled_mm, use_fast_accum=False",
                "mma.sync": "mma.sync.m16n8k32 e4m3, chained in f32 registers",
                "wgmma": "tilenest FP8 GEMM on wgmma (k32 e4m3 steps, f32 registers)"}[how]
        try:
            r: dict[str, Any] = {
                "kept_bits_same_group": kept_bits(torch, how, 64, 5),
                "kept_bits_later_group": kept_bits(torch, how, 64, 40),
                "kept_bits_k4096_last": kept_bits(torch, how, 4096, 4095)}
            p = (r["kept_bits_same_group"] or 19) + 2
            got = many_small(torch, how, min(p, 18))
            r["many_small"] = {"p": min(p, 18), "got": got,
                               "exact": 1.0 + 31 * 2.0 ** -min(p, 18), "lost_all": got == 1.0}
            r["random"] = [random_error(torch, how, k, gen) for k in (256, 1024, 4096, 8192)]
        except Exception as e:  # noqa: BLE001 - one probe's failure must not hide the others
            print(f"--- {mode}: {type(e).__name__}: {e}")
            out["modes"][mode] = {"error": f"{type(e).__name__}: {e}"}
            continue
        out["modes"][mode] = r
        print(f"--- {mode}")
        print(f"  first lost term next to 1 (2^-p): same 32-group p = "
              f"{r['kept_bits_same_group']}, later group p = {r['kept_bits_later_group']}, "
              f"k = 4095 of 4096 p = {r['kept_bits_k4096_last']}")
        print(f"  1 + 31 * 2^-{r['many_small']['p']}: got {got!r}, "
              f"exact {r['many_small']['exact']!r}")
        for row in r["random"]:
            print(f"  random K = {row['k']:5d}: max |err| / sum|ab| = "
                  f"{row['max_err_over_abs_sum']:.3e} = {row['over_k_2^-24']:.3f} x K 2^-24")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=2))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
