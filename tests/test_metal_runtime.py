"""Calling a ``device="gpu"`` Metal kernel goes through ``metal/runtime.py``.

There is no Mac here, so the framework is replaced by a stand-in ``Metal``
module holding the few pyobjc calls the runtime makes: its library compiles
the source handed to ``newLibraryWithSource`` (the one-string MSL) on the
host emulator, its buffers are byte arrays, and a command buffer runs its
encoders' dispatches in order when committed. What is tested is the runtime's
own work: the source it compiles and its options, the buffer indices, the
packed constant struct, the status words, the copy-back of written tensors,
the dispatch geometry; the arithmetic is the emulated device's, so a gpu call
must give the emulated call's bits.
"""

from __future__ import annotations

import os
import sys
import types

import numpy as np
import pytest

import tilenest as tn
from tilenest.backends import metal
from tilenest.backends.metal import emulated, runtime
from tilenest.backends.simt import emulator
from tilenest.cli import load_programs
from tilenest.errors import BoundsError, NotAvailableError, TilenestError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class _Contents:
    def __init__(self, data: np.ndarray):
        self.data = data

    def as_buffer(self, n: int) -> memoryview:
        return memoryview(self.data)[:n]


class _Buffer:
    def __init__(self, raw: bytes):
        self.data = np.frombuffer(bytearray(raw), np.uint8)

    def contents(self) -> _Contents:
        return _Contents(self.data)


class _Options:
    def __init__(self) -> None:
        self.fast_math = True  # Metal's default

    def init(self) -> _Options:
        return self

    def setFastMathEnabled_(self, on: bool) -> None:
        self.fast_math = on


class _Options15(_Options):
    """Compile options of the macOS 15 SDK: a math mode instead of the flag."""

    def __init__(self) -> None:
        super().__init__()
        self.mode, self.functions = "fast", "fast"

    def setMathMode_(self, mode: str) -> None:
        self.mode = mode

    def setMathFloatingPointFunctions_(self, f: str) -> None:
        self.functions = f


def test_fast_math_is_off_under_both_sdks() -> None:
    fake = types.SimpleNamespace(MTLMathModeSafe="safe",
                                 MTLMathFloatingPointFunctionsPrecise="precise")
    old, new = _Options(), _Options15()
    runtime.safe_math(fake, old)
    runtime.safe_math(fake, new)
    assert old.fast_math is False
    assert (new.mode, new.functions) == ("safe", "precise")


class _Function:
    def __init__(self, library: _Library, name: str):
        self.library, self.name = library, name


class _Library:
    def __init__(self, module: emulator.EmuModule):
        self.module = module

    def newFunctionWithName_(self, name: str) -> _Function | None:
        return _Function(self, name) if name in self.module.kernels else None


class _Pipeline:
    def __init__(self, fn: _Function):
        self.fn = fn

    def maxTotalThreadsPerThreadgroup(self) -> int:
        return 1024


class _Encoder:
    def __init__(self, log: list):
        self.log = log
        self.buffers: dict[int, np.ndarray] = {}
        self.threadgroup_bytes = 0

    def setComputePipelineState_(self, p: _Pipeline) -> None:
        self.pipe = p

    def setBuffer_offset_atIndex_(self, b: _Buffer, offset: int, i: int) -> None:
        self.buffers[i] = b.data[offset:]

    def setBytes_length_atIndex_(self, raw: bytes, n: int, i: int) -> None:
        self.buffers[i] = np.frombuffer(bytes(raw[:n]), np.uint8).copy()

    def setThreadgroupMemoryLength_atIndex_(self, n: int, i: int) -> None:
        assert i == 0 and n % 16 == 0
        self.threadgroup_bytes = n

    def dispatchThreadgroups_threadsPerThreadgroup_(self, grid: tuple, group: tuple) -> None:
        self.grid, self.group = grid, group

    def endEncoding(self) -> None:
        pass

    def run(self) -> None:
        fn = self.pipe.fn
        mod = fn.library.module
        dts = mod.argument_dtypes(fn.name)
        assert sorted(self.buffers) == list(range(len(dts))), "a buffer index is unset"
        args = [self.buffers[i] if dt is None else self.buffers[i].view(dt)
                for i, dt in enumerate(dts)]
        self.log.append((fn.name, self.grid, self.group, self.threadgroup_bytes))
        mod.launch(fn.name, self.grid, self.group, args, shared_bytes=self.threadgroup_bytes)


class _CommandBuffer:
    def __init__(self, log: list):
        self.log, self.encoders = log, []

    def computeCommandEncoder(self) -> _Encoder:
        e = _Encoder(self.log)
        self.encoders.append(e)
        return e

    def commit(self) -> None:
        for e in self.encoders:
            e.run()

    def waitUntilCompleted(self) -> None:
        pass

    def error(self) -> None:
        return None

    def GPUStartTime(self) -> float:
        return 10.0

    def GPUEndTime(self) -> float:
        return 10.25


class _Queue:
    def __init__(self, log: list):
        self.log = log

    def commandBuffer(self) -> _CommandBuffer:
        return _CommandBuffer(self.log)


class _Device:
    def __init__(self) -> None:
        self.sources: list[tuple[str, bool]] = []
        self.log: list = []

    def newLibraryWithSource_options_error_(self, src: str, opts: _Options, err: None):
        self.sources.append((src, opts.fast_math))
        assert '#include "' not in src, "the runtime compiles one string"
        mod = emulator.build(src, dialect="metal", include_dirs=(emulated.EMU_INCLUDE,))
        return _Library(mod), None

    def newCommandQueue(self) -> _Queue:
        return _Queue(self.log)

    def newBufferWithBytes_length_options_(self, raw: bytes, n: int, mode: int) -> _Buffer:
        assert len(raw) == n and mode == _MODE
        return _Buffer(raw)

    def newComputePipelineStateWithFunction_error_(self, fn: _Function, err: None):
        return _Pipeline(fn), None


_MODE = 7  # the stand-in's MTLResourceStorageModeShared


@pytest.fixture
def gpu(monkeypatch) -> _Device:
    """A "Mac" whose Metal framework is the stand-in; the device it reports."""
    dev = _Device()
    fake = types.ModuleType("Metal")
    fake.MTLCreateSystemDefaultDevice = lambda: dev
    fake.MTLCompileOptions = types.SimpleNamespace(alloc=_Options)
    fake.MTLResourceStorageModeShared = _MODE
    fake.MTLSizeMake = lambda *xyz: tuple(xyz)
    monkeypatch.setattr(runtime, "on_macos", lambda: True)
    monkeypatch.setitem(sys.modules, "Metal", fake)
    return dev


def _program(example: str, name: str) -> tn.TileProgram:
    return dict(load_programs(os.path.join(ROOT, "examples", example)))[name]


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_a_gpu_call_runs_the_whole_source_without_fast_math(gpu: _Device) -> None:
    prog = _program("softmax.py", "row_softmax")
    k = metal.compile_program(prog, device="gpu")
    x = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32)
    y = k(x, np.zeros_like(x))
    ref = metal.compile_program(prog, device="emulated")(x, np.zeros_like(x), policy="in_order")
    assert _same_bits(y, ref)
    np.testing.assert_allclose(y, np.exp(x) / np.exp(x).sum(1, keepdims=True), rtol=1e-5)
    [(src, fast)] = gpu.sources
    assert src == k.text and fast is False
    k(x, np.zeros_like(x))
    assert len(gpu.sources) == 1, "the library is compiled once per kernel"
    assert k._gpu.gpu_seconds == 0.25
    (name, grid, group, _tg), *_ = gpu.log
    assert name.startswith("row_softmax") and grid == (6, 1, 1)
    assert group[0] == k.source.kernels[0].threads


def test_scalars_scratch_buffers_and_several_phases(gpu: _Device) -> None:
    """A top-level ``reduce`` over chunks: several dispatches in one command
    buffer sharing a scratch buffer, the chunk size in the constant struct."""
    from tilenest.bench.kernels import kernels

    gs = kernels()["global_sum"].specialize(chunk=256)
    x = np.random.default_rng(1).standard_normal(5000).astype(np.float32)
    k = metal.compile_program(gs.program, device="gpu")
    t = k(x, np.zeros(1, np.float32))
    assert len(gpu.log) == len(k.source.kernels) > 1
    ref = metal.compile_program(gs.program, device="emulated")(x, np.zeros(1, np.float32),
                                                               policy="in_order")
    assert _same_bits(t, ref)
    assert t[0] == pytest.approx(float(x.astype(np.float64).sum()), rel=1e-5, abs=1e-4)


def test_a_runtime_scalar_and_a_strided_input(gpu: _Device) -> None:
    """``eps`` travels in the constant struct, a strided view of a larger
    array as the memory from its first element on with its strides as
    symbols; the output is written back into the caller's array."""
    prog = _program("rmsnorm.py", "rmsnorm")
    k = metal.compile_program(prog, device="gpu")
    rng = np.random.default_rng(2)
    big = rng.standard_normal((5, 80)).astype(np.float32)
    x = big[:, 8:72]
    w = rng.standard_normal(64).astype(np.float32)
    y = np.zeros((5, 64), np.float32)
    out = k(x, w, y, np.float32(0.5))
    assert out is y or np.shares_memory(out, y)
    ref = metal.compile_program(prog, device="emulated")(
        np.ascontiguousarray(x), w, np.zeros_like(y), np.float32(0.5), policy="in_order")
    assert _same_bits(y, ref)
    want = x / np.sqrt((x * x).mean(1, keepdims=True) + 0.5) * w
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


@tn.kernel
def _head(x: tn.Tensor[tn.f32, 1], y: tn.Tensor[tn.f32, 1]):
    y(tn.coord(0), tn.shape(4), tn.bounds.assume).store(
        x[tn.coord(0), tn.shape(4), tn.bounds.assume])  # the promise


def test_a_failing_check_on_the_gpu_raises_the_error_of_its_site(gpu: _Device) -> None:
    k = metal.compile_program(_head.program, device="gpu", check_assumes=True)
    y = np.zeros(4, np.float32)
    k(np.arange(4, dtype=np.float32), y)
    assert y.tolist() == [0, 1, 2, 3]
    with pytest.raises(BoundsError, match="bounds.assume promise"):
        k(np.arange(3, dtype=np.float32), y)


def test_emulator_choices_are_refused_on_the_gpu(gpu: _Device) -> None:
    k = metal.compile_program(_head.program, device="gpu")
    x = np.arange(4, dtype=np.float32)
    with pytest.raises(TilenestError, match="emulated run") as e:
        k(x, np.zeros(4, np.float32), policy="reverse")
    assert e.value.hint


@pytest.mark.skipif(sys.platform == "darwin", reason="off macOS only")
def test_a_gpu_kernel_off_macos_is_refused_when_called() -> None:
    k = metal.compile_program(_head.program, device="gpu")
    with pytest.raises(NotAvailableError, match="needs macOS") as e:
        k(np.arange(4, dtype=np.float32), np.zeros(4, np.float32))
    assert [os.path.basename(s.file) for s in e.value.sites] == ["test_metal_runtime.py"]


def _metal_benchmark():
    import importlib.util

    spec = importlib.util.spec_from_file_location("metal_bench",
                                                  os.path.join(ROOT, "benchmarks", "metal.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", ["softmax", "rmsnorm", "layernorm", "gemm"])
def test_the_metal_benchmark_judges_by_the_right_formula(name: str) -> None:
    """Each workload of ``benchmarks/metal.py``, at a small size on the
    emulated device: its kernel fills the NaN output and meets the float64
    formula the benchmark judges the GPU by (and torch's op does too)."""
    mb = _metal_benchmark()
    a = mb.parse_args(["--rows", "6", "--cols", "96", "--gemm", "64"])
    kernel, args, torch_fn, ref_fn, work, unit = mb.case(name, a, np.random.default_rng(3))
    out = next(v for v in args if isinstance(v, np.ndarray) and np.isnan(v).all())
    kernel.compile(target="metal", device="emulated")(*args)
    assert not np.isnan(out).any() and mb.rel_err(out, ref_fn()) < mb.TOL
    torch = pytest.importorskip("torch")
    tins = [torch.from_numpy(v) for v in args
            if isinstance(v, np.ndarray) and v.ndim and v is not out]
    assert mb.rel_err(torch_fn(*tins).numpy(), ref_fn()) < mb.TOL


@pytest.mark.skipif(sys.platform == "darwin", reason="off macOS only")
def test_the_metal_benchmark_says_it_needs_a_mac(capsys) -> None:
    assert _metal_benchmark().main(["--only", "softmax"]) == 2
    assert "needs macOS" in capsys.readouterr().err
