"""Interpreter speed: the batched reference interpreter against the same math
done directly in numpy, in one run.

Each benchmark times numpy, the interpreter in its fast batched mode with the
race and pipeline-order checks off (``tilenest``), and with both checks on
(``checked``), in alternating rounds. The interpreter runs the captured
program (``tilenest.interpreter.interpret``), so a kernel call's argument
binding in the frontend is not counted; a sample is one call, or as many as
last 50 ms (numpy, small sizes), after one untimed warm-up call per function
(an interpreted call at the large size lasts seconds). The
interpreter's outputs are checked against numpy. Ratios are numpy time /
interpreter time (below 1: the interpreter is slower).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .timing import Method, measure, plus_minus

NAMES = ("softmax", "rmsnorm", "gemm", "splitk", "sum")
#: per size: the row workloads' R (R x R), the GEMM's n (n^3, 64^3 tiles) and the
#: length of the reduce region's sum
SIZES = {"small": (128, 64, 10_000), "medium": (1024, 256, 100_000),
         "large": (4096, 1024, 1_000_000)}


def _region_sum() -> Any:
    """A global sum written as a ``reduce`` region over single elements (one
    contribution per element, the default tree policy)."""
    import tilenest as tn
    from tilenest import f32

    @tn.kernel
    def region_sum(x: tn.Tensor[f32, 1], y: tn.Tensor[f32, 1]):
        (n,) = x.shape
        y = y.with_dims(*x.dims())
        total = tn.zeros(f32, tn.shape(1), dims=x.dims())
        for r in tn.reduce(tn.shape(n)):
            total = total + x[tn.coord(r.index()), tn.shape(1)]
        y(tn.coord(0), tn.shape(1)).store(total)

    return region_sum


def _split_k_gemm() -> Any:
    """A tiled GEMM whose K steps are a ``reduce`` under ``contract=tn.add``
    (R-9: the products of all steps form one sum, grouped at will), where the
    pipelined ``gemm`` orders its steps."""
    import tilenest as tn
    from tilenest import f32

    @tn.kernel
    def split_k_gemm(A: tn.Tensor[f32, 2], B: tn.Tensor[f32, 2], C: tn.Tensor[f32, 2], *,
                     bm=64, bn=64, bk=64):
        M, K = A.shape
        N = B.shape[1]
        m, k = A.dims()
        n = C.dim(1)
        B = B.with_dims(k, n)
        C = C.with_dims(m, n)
        for p in tn.parallel(tn.shape(tn.cdiv(M, bm), tn.cdiv(N, bn))):
            i, j = p.index(0), p.index(1)
            acc = tn.zeros(f32, tn.shape(bm, bn), dims=(m, n))
            for kk in tn.reduce(tn.shape(tn.cdiv(K, bk)), contract=tn.add):
                a = A[tn.coord(i * bm, kk.index() * bk), tn.shape(bm, bk), tn.bounds.zero]
                b = B[tn.coord(kk.index() * bk, j * bn), tn.shape(bk, bn), tn.bounds.zero]
                acc = tn.mma(a, b, acc, allow_reassociation=True)
            C(tn.coord(i * bm, j * bn), tn.shape(bm, bn)).store(acc)

    return split_k_gemm


def run(size: str, samples: int, only: tuple[str, ...],
        step: Callable[..., None]) -> list[dict[str, Any]]:
    """A row per selected benchmark; ``step(label)`` after each."""
    import numpy as np

    from tilenest.interpreter import interpret

    from .kernels import kernels

    ks = kernels()
    n, g, m = SIZES[size]
    rng = np.random.default_rng(0)
    method = Method(samples=samples, min_sample_s=0.05, warm_each=False)
    fast = {"fast": True, "check_races": False, "check_pipelines": False, "poison": False}
    rows: list[dict[str, Any]] = []

    def bench(name: str, workload: str, kern: Any, args: tuple[Any, ...], out: Any,
              np_fn: Callable[[], Any], rtol: float, atol: float) -> None:
        prog = kern.program  # capture outside the timing
        interpret(prog, *args, **fast)
        row: dict[str, Any] = {"name": name, "workload": workload}
        if not np.allclose(out, np_fn(), rtol=rtol, atol=atol):
            row["error"] = "the interpreter's result differs from numpy"
        else:
            t = measure([lambda: interpret(prog, *args, **fast), np_fn,
                         lambda: interpret(prog, *args, fast=True, poison=False)], method)
            row["tilenest"] = t[0].to_json()
            row["checked"] = t[2].to_json()
            row["baselines"] = {"numpy": t[1].to_json()}
            row["ratios"] = {"numpy": t[1].median / t[0].median,
                             "numpy_checked": t[1].median / t[2].median}
        rows.append(row)
        step(workload)

    x = rng.standard_normal((n, n)).astype(np.float32)
    y = np.zeros_like(x)
    if "softmax" in only:
        def np_softmax() -> Any:
            e = np.exp(x - x.max(axis=1, keepdims=True))
            return e / e.sum(axis=1, keepdims=True)

        bench("softmax", f"row softmax {n}x{n} f32", ks["softmax"], (x, y), y, np_softmax,
              1e-5, 1e-7)
    if "rmsnorm" in only:
        w = rng.standard_normal(n).astype(np.float32)
        eps = np.float32(1e-5)

        def np_rmsnorm() -> Any:
            return x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps) * w

        bench("rmsnorm", f"rmsnorm {n}x{n} f32", ks["rmsnorm_rows"].specialize(
            rows_per_program=16), (x, w, y, eps), y, np_rmsnorm, 1e-4, 1e-5)
    if "gemm" in only:
        A = rng.standard_normal((g, g)).astype(np.float32)
        B = rng.standard_normal((g, g)).astype(np.float32)
        C = np.zeros((g, g), np.float32)
        bench("gemm", f"tiled gemm {g}^3 f32 (64^3 tiles)",
              ks["gemm"].specialize(bm=64, bn=64, bk=64), (A, B, C), C, lambda: A @ B,
              1e-3, 1e-3)
    if "splitk" in only:
        A = rng.standard_normal((g, g)).astype(np.float32)
        B = rng.standard_normal((g, g)).astype(np.float32)
        C = np.zeros((g, g), np.float32)
        bench("splitk", f"split-K gemm {g}^3 f32 (reduce, 64^3 tiles)", _split_k_gemm(),
              (A, B, C), C, lambda: A @ B, 1e-3, 1e-3)
    if "sum" in only:
        v = rng.standard_normal(m).astype(np.float32)
        s = np.zeros(1, np.float32)
        bench("sum", f"reduce-region sum {m} f32", _region_sum(), (v, s), s,
              lambda: v.sum(keepdims=True), 1e-4, 1e-2)
    return rows


def table(rows: list[dict[str, Any]]) -> Any:
    """A rich Table: medians in ms with spreads; ratios numpy / interpreter."""
    from rich.table import Table

    pm = plus_minus()
    t = Table(title="tilenest interpreter vs numpy (ratio = numpy time / interpreter time; "
                    f"median of samples, {pm} spread)")
    for c in ("benchmark", "numpy ms", "interpreter ms", "ratio", "+checks ms", "ratio "):
        t.add_column(c, justify="left" if c == "benchmark" else "right",
                     no_wrap=c.startswith("ratio"))
    for r in rows:
        if "error" in r:
            t.add_row(r["workload"], f"[red]{r['error']}[/red]", "", "", "", "")
            continue
        tm = [r["baselines"]["numpy"], r["tilenest"], r["checked"]]
        a, b, c = (f"{x['median_s'] * 1e3:.2f} {pm}{x['spread']:.0%}" for x in tm)
        t.add_row(r["workload"], a, b, f"{r['ratios']['numpy']:.3f}x", c,
                  f"{r['ratios']['numpy_checked']:.3f}x")
    return t
