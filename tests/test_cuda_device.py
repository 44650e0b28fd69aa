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
