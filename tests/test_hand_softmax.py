"""The hand-written softmax that benchmarks/cuda.py times beside the baselines
(``benchmarks/softmax_rows.cu``): its contract variant must be a conforming
realization of the softmax workload -- every output admitted by the oracle --
on the emulated device under every interleaving policy, and every variant must
compile for the GPU at the benchmark's size without spilling
(tests/test_benchmarks_cuda.py). A reference
point that computed something else would make its figures meaningless."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends.cuda import ARCH, prelude_dir, prelude_dirs
from tilenest.backends.cuda.nvrtc import compile_cuda
from tilenest.backends.simt import emulator as E
from tilenest.workloads.base import normal, sentinel
from tilenest.workloads.softmax import softmax_kernel

SOURCE = Path(__file__).resolve().parent.parent / "benchmarks" / "softmax_rows.cu"
ENTRIES = ("hand_softmax_f32", "hand_softmax_f32_approx", "hand_softmax_bf16",
           "hand_softmax_bf16_approx")
ROWS, COLS, THREADS = 3, 1024, 64  # bf16: 2 groups of 8 per thread, f32: 4 of 4; 2 warps


def _source(cols: int, threads: int) -> str:
    return f"#define HAND_COLS {cols}\n#define HAND_THREADS {threads}\n" + SOURCE.read_text()


@pytest.fixture(scope="module")
def module() -> E.EmuModule:
    kinds = {n: [f"const {t}*", f"{t}*"] for n in ENTRIES
             for t in (("float",) if "f32" in n else ("tn_bf16",))}
    return E.build(_source(COLS, THREADS), kinds, include_dirs=[prelude_dir()])


def _inputs(dt: tn.DType, seed: int) -> np.ndarray:
    x = normal(np.random.default_rng(seed), (ROWS, COLS), dt, 3.0)
    x[1, 5] = -200.0  # an exp argument outside the common case: the whole function
    x[2, :] = x[2, 0]  # a constant row: every quotient 1/COLS
    return x


def _run(module: E.EmuModule, name: str, x: np.ndarray, dt: tn.DType, policy: str) -> np.ndarray:
    y = sentinel(x.shape, dt)
    module.launch(name, (ROWS, 1, 1), (THREADS, 1, 1), [x, y], shared_bytes=THREADS // 8,
                  policy=policy, seed=3)
    return y


@pytest.mark.parametrize("dtn", ["f32", "bf16"])
@pytest.mark.parametrize("policy", E.POLICIES)
def test_contract_variant_is_admitted_by_the_oracle(module, admitted, dtn, policy):
    dt = getattr(tn, dtn)
    x = _inputs(dt, seed=len(policy))
    y = _run(module, f"hand_softmax_{dtn}", x, dt, policy)
    want = admitted(softmax_kernel(dt, False), {"x": x, "mask": np.ones(x.shape, bool),
                                                 "y": sentinel(x.shape, dt)})
    verdict = want.admits({"y": y})
    assert verdict, verdict


@pytest.mark.parametrize("dtn", ["f32", "bf16"])
def test_approximate_variant_computes_the_same_softmax(module, dtn):
    """The ``ex2.approx`` variant differs only in its exp. The emulator's
    ``__expf`` is the accurate function, so here it must agree closely with the
    contract variant; on the GPU its exp is the hardware approximation, outside
    the 1-ulp bound the contract grants exp (the benchmark says so)."""
    dt = getattr(tn, dtn)
    x = _inputs(dt, seed=7)
    y = _run(module, f"hand_softmax_{dtn}_approx", x, dt, "in_order").astype(np.float64)
    ref = _run(module, f"hand_softmax_{dtn}", x, dt, "in_order").astype(np.float64)
    assert np.isfinite(y).all()
    assert np.allclose(y, ref, rtol=2e-2 if dtn == "bf16" else 1e-5, atol=0)


def test_wrong_column_count_is_refused_at_compile_time():
    with pytest.raises(Exception, match="whole 16-byte groups"):
        compile_cuda(_source(1000, 256), SOURCE.name, arch=ARCH, include_dirs=prelude_dirs(),
                     cache=False)
