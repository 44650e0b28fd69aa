"""How an NVIDIA GPU's FP8 matrix multiply accumulates, measured (not timed).

    python benchmarks/fp8_accumulation.py [--out FILE.json]

FP8 products are exact in f32 (two 4-bit significands give at most 8 bits),
so a product ``A B`` of e4m3fn matrices with f32 accumulation differs from
the exact value only by how the sums are rounded. This script measures that
on the GPU through ``torch._scaled_mm`` (cuBLASLt; unit scales, f32 output),
once with ``use_fast_accum=True`` (the tensor cores' own accumulation) and
once with ``False`` (partial sums promoted into f32 registers periodically),
against the exact sum (``float64``, which holds every partial sum here):

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
import json
import sys
from pathlib import Path
from typing import Any


def _mm(torch: Any, a: Any, b: Any, fast: bool) -> Any:
    """``a @ b`` by ``torch._scaled_mm`` in f32 (``b`` column-major, as cuBLASLt needs)."""
    one = torch.ones((), device="cuda", dtype=torch.float32)
    return torch._scaled_mm(a, b.t().contiguous().t(), scale_a=one, scale_b=one,
                            out_dtype=torch.float32, use_fast_accum=fast)


def kept_bits(torch: Any, fast: bool, k: int, at: int) -> int | None:
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
        c = _mm(torch, a.to(f8), b.to(f8), fast)
        if float(c[0, 0]) != 1.0 + 2.0 ** -p:
            return p
    return None


def many_small(torch: Any, fast: bool, p: int) -> float:
    """``1 + 31 * 2^-p`` computed: what survives of 31 small terms."""
    f8 = torch.float8_e4m3fn
    a = torch.zeros((16, 32), device="cuda")
    b = torch.zeros((32, 16), device="cuda")
    a[:, 0] = 1.0
    b[0, :] = 1.0
    a[:, 1:] = 2.0 ** -(p // 2)
    b[1:, :] = 2.0 ** -(p - p // 2)
    return float(_mm(torch, a.to(f8), b.to(f8), fast)[0, 0])


def random_error(torch: Any, fast: bool, k: int, gen: Any) -> dict[str, float]:
    """The largest error of a 256 x 256 x ``k`` product of random e4m3fn
    matrices, relative to ``sum |a b|`` per output."""
    f8 = torch.float8_e4m3fn
    a = (torch.randn((256, k), device="cuda", generator=gen) * 8).to(f8)
    b = (torch.randn((k, 256), device="cuda", generator=gen) * 8).to(f8)
    got = _mm(torch, a, b, fast).double()
    ad, bd = a.double(), b.double()
    exact = ad @ bd
    scale = ad.abs() @ bd.abs()
    rel = float(((got - exact).abs() / scale).max())
    return {"k": k, "max_err_over_abs_sum": rel, "over_k_2^-24": rel / (k * 2.0 ** -24)}


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
    for fast in (True, False):
        mode = "fast accumulation" if fast else "promoted accumulation"
        r: dict[str, Any] = {
            "kept_bits_same_group": kept_bits(torch, fast, 64, 5),
            "kept_bits_later_group": kept_bits(torch, fast, 64, 40),
            "kept_bits_k4096_last": kept_bits(torch, fast, 4096, 4095)}
        p = (r["kept_bits_same_group"] or 19) + 2
        got = many_small(torch, fast, p)
        r["many_small"] = {"p": p, "got": got, "exact": 1.0 + 31 * 2.0 ** -p,
                           "lost_all": got == 1.0}
        r["random"] = [random_error(torch, fast, k, gen) for k in (256, 1024, 4096, 8192)]
        out["modes"][mode] = r
        print(f"--- {mode} (use_fast_accum={fast})")
        print(f"  first lost term next to 1 (2^-p): same 32-group p = "
              f"{r['kept_bits_same_group']}, later group p = {r['kept_bits_later_group']}, "
              f"k = 4095 of 4096 p = {r['kept_bits_k4096_last']}")
        print(f"  1 + 31 * 2^-{p}: got {got!r}, exact {r['many_small']['exact']!r}")
        for e in r["random"]:
            print(f"  random K = {e['k']:5d}: max |err| / sum|ab| = "
                  f"{e['max_err_over_abs_sum']:.3e} = {e['over_k_2^-24']:.3f} x K 2^-24")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=2))
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
