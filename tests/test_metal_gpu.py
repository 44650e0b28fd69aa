"""Metal kernels on an Apple GPU agree with the interpreter (macOS only).

Marked ``device``: run on a Mac with ``pytest -m device tests/test_metal_gpu.py``
after ``pip install -e '.[test,metal]'``. Every example validates on the GPU
(the default Metal device on macOS) through the CLI, and a row softmax's
result is one the interpreter admits. Elsewhere every test here skips.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = [pytest.mark.device, pytest.mark.metal,
              pytest.mark.skipif(sys.platform != "darwin", reason="needs macOS and a Metal GPU")]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "examples", "*.py")))


@pytest.mark.parametrize("example", EXAMPLES)
def test_every_example_validates_on_the_gpu(example: str) -> None:
    r = subprocess.run([sys.executable, "-m", "tilenest.cli", "validate", f"examples/{example}",
                        "--target", "metal"], capture_output=True, text=True, cwd=ROOT,
                       timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "validated" in r.stdout
    assert not [ln for ln in r.stdout.splitlines() if ln.startswith(("refused", "MISMATCH"))]


def test_a_softmax_on_the_gpu_is_admitted_by_the_interpreter() -> None:
    import tilenest as tn
    from tilenest.bench.kernels import kernels

    k = kernels()["softmax"]
    ck = k.compile(target="metal")
    assert ck.device == "gpu"
    x = np.random.default_rng(0).standard_normal((64, 1000)).astype(np.float32)
    y = ck(x, np.full_like(x, np.nan))
    ref = tn.reference(k, x, np.zeros_like(x))
    v = ref.admits(y)
    assert v, v.reason


def test_f32_subnormals_are_kept_on_the_gpu() -> None:
    """The numerical contract keeps subnormal f32 inputs and results (no
    flush to zero); with fast math off an Apple GPU must give numpy's bits
    for products and quotients that land in or start from the subnormal
    range."""
    import tilenest as tn
    from tilenest import f32

    @tn.kernel
    def scale(x: tn.Tensor[f32, "N"], y: tn.Tensor[f32, "N"], z: tn.Tensor[f32, "N"]):
        (n,) = x.shape
        for p in tn.parallel(tn.shape(n // 64)):
            o = tn.coord(p.index() * 64)
            v = x[o, tn.shape(64)]
            y(o, tn.shape(64)).store(v * 0.25)
            z(o, tn.shape(64)).store(v / 3.0)

    tiny = np.float32(2.0 ** -126)
    x = (tiny * np.linspace(-8, 8, 256)).astype(np.float32)
    x[:64] = np.frombuffer(np.arange(1, 65, dtype=np.uint32).tobytes(), np.float32)
    ck = scale.compile(target="metal")
    y, z = ck(x, np.zeros_like(x), np.zeros_like(x))
    assert y.tobytes() == (x * np.float32(0.25)).tobytes(), "f32 subnormal products differ"
    assert z.tobytes() == (x / np.float32(3.0)).tobytes(), "f32 subnormal quotients differ"
