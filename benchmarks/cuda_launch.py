"""Launch one tilenest CUDA kernel variant a few times, for a profiler or a checker.

    python benchmarks/cuda_launch.py softmax|rmsnorm|layernorm|gemm|attention [--dtype bf16]
        [--schedule k=v,...] [--gpu k=v,...] [--n 4096] [--launches 3]
        [--cubin FILE] [--source FILE]

Meant to run under ``ncu`` or ``compute-sanitizer`` on the GPU, e.g.

    ncu --clock-control none -k regex:softmax --launch-skip 1 --launch-count 1 \\
        --section SpeedOfLight --section WarpStateStats \\
        python benchmarks/cuda_launch.py softmax --dtype bf16

The variant is compiled exactly as ``benchmarks/cuda.py`` compiles it
(``--schedule`` the workload's schedule, default its first, or for ``gemm``
that file's first GEMM schedule, for ``attention`` ``flash_attention`` with
that file's first prefill tile, causal; ``--gpu`` the ``Schedule``
overrides), on the inputs that file draws (row workloads at 8192 x 8192,
GEMM at ``--n``, attention at the prefill sizes, bf16).
The first launch is checked against torch in float64 as the benchmark checks
it (a wrong result exits nonzero); then ``--launches`` more run back to back
and their mean device time (CUDA events, no input rotation: use the
benchmark for figures) is printed. ``--cubin`` / ``--source`` write the
NVRTC cubin / the CUDA C++ (for ``cuobjdump --dump-sass``).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if sys.path and Path(sys.path[0] or ".").resolve() == HERE:
    sys.path.pop(0)  # as in cuda.py: this folder would shadow the ``cuda`` package


def _bench() -> Any:
    """``benchmarks/cuda.py`` as a module (its helpers, one definition of the
    inputs, the checks and the compile)."""
    spec = importlib.util.spec_from_file_location("tilenest_bench_cuda", HERE / "cuda.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _pairs(text: str | None) -> dict[str, Any]:
    """``k=v,k=v`` with Python literal values (bare words stay strings)."""
    out: dict[str, Any] = {}
    for item in filter(None, (text or "").split(",")):
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"cuda_launch: '{item}' is not key=value")
        try:
            out[k.strip()] = ast.literal_eval(v.strip())
        except (ValueError, SyntaxError):
            out[k.strip()] = v.strip()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/cuda_launch.py",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("workload", choices=("softmax", "rmsnorm", "layernorm", "gemm", "attention"))
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="bf16")
    ap.add_argument("--schedule", help="the workload's schedule, k=v,... (default: the first)")
    ap.add_argument("--gpu", help="Schedule overrides, k=v,...")
    ap.add_argument("--n", type=int, default=4096, help="GEMM size n (n^3)")
    ap.add_argument("--launches", type=int, default=3)
    ap.add_argument("--cubin", type=Path)
    ap.add_argument("--source", type=Path)
    a = ap.parse_args(argv)
    B = _bench()
    cfg = B.Config(quick=True, samples=1, compile=False, gemm_budget_s=1.0)
    run = B.Run(cfg, seed=1)
    torch = run.torch
    from tilenest.workloads import WORKLOADS

    gpu = _pairs(a.gpu)
    if a.workload == "gemm":
        if a.dtype != "bf16":
            raise SystemExit("cuda_launch: the GEMM benchmark is bf16 only")
        sched = _pairs(a.schedule) or dict(B.GEMM_SCHEDULES[0][0])
        gpu = gpu or dict(B.GEMM_SCHEDULES[0][1])
        n = a.n
        ck, rec = B.compile_variant(run, WORKLOADS["gemm"], "bf16", sched,
                                    {"M": n, "K": n, "N": n}, gpu)
        A, Bm = run.randn((n, n), "bf16"), run.randn((n, n), "bf16")
        out = torch.empty((n, n), dtype=torch.bfloat16, device="cuda")
        ref = A.double() @ Bm.double()
        args: tuple[Any, ...] = (run.view(A), run.view(Bm), run.view(out))
    elif a.workload == "attention":
        if a.dtype != "bf16":
            raise SystemExit("cuda_launch: the attention benchmark is bf16 only")
        sched = _pairs(a.schedule) or {**B._PREFILL_TILES[0], "causal": True}
        sz = B._PREFILL_SIZES
        ck, rec = B.compile_variant(run, WORKLOADS["flash_attention"], "bf16", sched, sz, gpu)
        b, hq, hk, t, d = (sz[x] for x in ("B", "HQ", "HK", "Q", "D"))
        q, k, v = (run.randn((b, h, t, d), "bf16") for h in (hq, hk, hk))
        out = torch.empty((b, hq, t, d), dtype=torch.bfloat16, device="cuda")
        scale = 1.0 / d ** 0.5
        ref = B._sdpa(run, bool(sched.get("causal")), "math")(
            q.float(), k.float(), v.float(), scale).double()
        args = (run.view(q), run.view(k), run.view(v), run.view(out), run.np.float32(scale))
    else:
        wl = WORKLOADS[a.workload]
        sched = _pairs(a.schedule) or dict(wl.schedules[0])
        ck, rec = B.compile_variant(run, wl, a.dtype, sched, {"R": B.ROWS, "C": B.COLS}, gpu)
        R, C = B.ROWS, B.COLS
        ins = B._row_inputs(run, a.workload, a.dtype)
        out = torch.empty((R, C), dtype=run.tdtype(a.dtype), device="cuda")
        extra = {"mask": run.cp.asarray(torch.ones((R, C), dtype=torch.bool, device="cuda")),
                 "res": run.randn((R, C), a.dtype),
                 "h": torch.empty((R, C), dtype=run.tdtype(a.dtype), device="cuda")}
        ref = B._row_fns(run, a.workload)[1](*(ins[k] for k in B.ROW_KEYS[a.workload]))
        args = B._row_tn_args(run, a.workload, ins, out, extra)
    print(f"{a.workload} {a.dtype} {rec['label']}: compile {rec['compile_s']:.2f} s, "
          f"resources {rec['resources']}", flush=True)
    if ck is None:
        print(f"skipped: {rec['skipped']}", file=sys.stderr)
        return 1
    if a.cubin:
        a.cubin.write_bytes(ck.built.cubin)
    if a.source:
        a.source.write_text(ck.source.text)
    out.fill_(float("nan"))
    torch.cuda.synchronize()
    bl = ck.bound(*args)
    bl.launch()
    bl.check()
    bad, err = B._unwritten(torch, out), None
    if not bad:
        err = B._rel_err(torch, out, ref)
    ok = not bad and err < (B.ATTENTION_TOL if a.workload == "attention" else B.TOL[a.dtype])
    print(f"check: rel err {err}, unwritten {bad}: {'ok' if ok else 'WRONG'}", flush=True)
    if not ok:
        return 1
    cp = run.cp
    t0, t1 = cp.cuda.Event(), cp.cuda.Event()
    t0.record()
    for _ in range(a.launches):
        bl.launch()
    t1.record()
    t1.synchronize()
    bl.check()
    ms = cp.cuda.get_elapsed_time(t0, t1) / max(a.launches, 1)
    print(f"{a.launches} launches: {ms * 1e3:.1f} us each (same inputs, L2 warm)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
