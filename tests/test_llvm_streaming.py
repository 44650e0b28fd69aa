"""Streaming stores of large outputs (``backends/llvm/streaming.py``).

Which loops may stream is decided per phase (an argument stored once per
loop, at unit stride, unguarded, never loaded by the phase); whether they do
is decided per call (the argument's size, the store's alignment). These
tests pin the plan, the instructions the row kernels' output loops compile
to on AVX2 and AVX-512, the fence, and that results are the same bits with
and without streaming for every alignment of the output and ragged rows.
"""

from __future__ import annotations

import numpy as np
import pytest

import tilenest as tn
from tilenest import f32
from tilenest.backends.llvm import stage_serial
from tilenest.backends.llvm import streaming as ST
from tilenest.bench.kernels import kernels
from tilenest.lowering import default_schedule, lower_verified

from test_llvm_vector import assembly, cycles, loops


def _plan(kernel) -> dict:
    prog = kernel.program
    k = stage_serial(lower_verified(prog, default_schedule(prog, "llvm")))
    out: dict = {}
    for ph in k.phases:
        out.update({v: s.buf.name for v, s in ST.plan(k, ph).items()})
    return out


@tn.kernel
def _accumulate(x: tn.Tensor[f32, "R C"], y: tn.Tensor[f32, "R C"]):
    rows, cols = x.shape
    y = y.with_dims(*x.dims())
    for p in tn.parallel(tn.shape(rows)):
        at = tn.coord(p.index(), 0)
        y(at, tn.shape(1, cols)).store(y[at, tn.shape(1, cols)] + x[at, tn.shape(1, cols)])


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm", "add", "copy"])
def test_the_row_kernels_outputs_may_stream(name):
    assert set(_plan(kernels()[name]).values()) == {"y"}


def test_an_output_the_phase_reads_back_does_not_stream():
    assert _plan(_accumulate) == {}


def test_an_output_that_may_alias_an_input_does_not_stream():
    prog = kernels()["add"].program
    k = stage_serial(lower_verified(prog, default_schedule(prog, "llvm")))
    (ph,) = k.phases
    assert ST.plan(k, ph, frozenset({"x", "y"})) == {}
    assert set(s.buf.name for s in ST.plan(k, ph, frozenset({"x", "z"})).values()) == {"y"}


def test_in_place_softmax_streams_nothing_and_is_right(stream_everything):
    """``x`` passed as both input and output: the aliased variant reads the
    row it writes, so its stores stay ordinary."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 300)).astype(np.float32)
    want = np.exp(x - x.max(1, keepdims=True))
    want = want / want.sum(1, keepdims=True)
    kernels()["softmax"].compile(cache=False)(x, x)
    np.testing.assert_allclose(x, want, rtol=1e-6)


@pytest.mark.parametrize("level, width", [("x86-64-v3", "%ymm"), ("x86-64-v4", "%zmm")])
def test_the_output_loop_is_packed_streaming_stores_and_the_body_fences(level, width):
    """The streaming form of RMSNorm's output loop stores with ``vmovntps``
    at the full vector width; the ordinary form stays; the body ends with
    ``sfence``. Without streaming (``MIN_BYTES`` out of reach is not a
    compile-time choice) the instruction would be absent."""
    asm = assembly(kernels()["rmsnorm"], level)
    nt = [lp for lp in loops(asm) if any(i.startswith("vmovntps") for i in lp)]
    assert nt, "no loop stores with vmovntps"
    stores = [i for lp in nt for i in lp if i.startswith("vmovntps")]
    assert all(width in i for i in stores), stores
    assert "sfence" in asm
    assert not [lp for lp in loops(assembly(_accumulate, level))
                if any(i.startswith("vmovnt") for i in lp)]


@pytest.mark.parametrize("name", ["softmax", "layernorm", "add", "copy"])
def test_every_row_kernel_has_a_streaming_output_loop(name):
    """(softmax's output loop branches to a plain division when a lane's
    quotient is outside the shared divisor's range: a loop of two blocks)"""
    asm = assembly(kernels()[name], "x86-64-v4")
    assert any(any(i.startswith("vmovntps") and "%zmm" in i for i in lp) for lp in cycles(asm))
    assert "sfence" in asm


@pytest.fixture
def stream_everything(monkeypatch):
    """Every call streams where the plan allows (no size threshold)."""
    monkeypatch.setattr(ST, "MIN_BYTES", 0)


def _reference(x, w):
    x64 = x.astype(np.float64)
    return x64 / np.sqrt((x64 * x64).mean(1, keepdims=True) + 1e-5) * w


@pytest.mark.parametrize("cols", [1, 15, 37, 160, 1000])
def test_same_bits_for_every_alignment_of_the_output(stream_everything, cols, monkeypatch):
    """The output starts at each 4-byte offset within a 64-byte line (the
    scalar head before the first aligned vector step is 0..15 elements,
    possibly the whole row); the streamed results are the ordinary ones bit
    for bit."""
    rng = np.random.default_rng(cols)
    rows = 7
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    k = kernels()["rmsnorm"]
    streamed = k.compile(cache=False)
    monkeypatch.setattr(ST, "MIN_BYTES", 1 << 62)
    plain = k.compile(cache=False)
    want = np.empty_like(x)
    plain(x, w, want, np.float32(1e-5))
    np.testing.assert_allclose(want, _reference(x, w), rtol=2e-6, atol=1e-6)
    for off in range(16):
        buf = np.full(rows * cols + 32, np.nan, np.float32)
        base = (-(buf.ctypes.data // 4)) % 16  # the first 64-byte-aligned element
        y = buf[base + off: base + off + rows * cols].reshape(rows, cols)
        streamed(x, w, y, np.float32(1e-5))
        assert y.tobytes() == want.tobytes(), off
        assert np.isnan(buf[:base + off]).all() and np.isnan(buf[base + off + rows * cols:]).all()
