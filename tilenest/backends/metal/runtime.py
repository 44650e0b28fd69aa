"""Running a Metal kernel on a Mac, through pyobjc's ``Metal`` framework.

:class:`MetalDevice` compiles an MSL source with fast math off (Metal's
default is on; tilenest's numerical contract needs IEEE results), and
:meth:`MetalDevice.dispatch` runs one phase function over numpy arrays with
the parameters of ``arguments.py``: one shared-storage buffer per tensor
(a copy of the array; written arrays are copied back after the run), the
constant struct from :meth:`ArgumentLayout.pack`, the status word, and the
dispatch size of :func:`launch_geometry`. A nonzero status raises the error
it encodes (``calls.status_error``).

``Metal`` is imported only inside these functions and only on macOS
(``sys.platform == "darwin"``); elsewhere asking for a device raises
:class:`~tilenest.errors.NotAvailableError` with a hint. Nothing here has
run on this project's machines (there is no Mac): the argument layout,
geometry and MSL text it relies on are tested without one.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...errors import NotAvailableError, TilenestError
from .arguments import ArgumentLayout, launch_geometry


def metal_module() -> Any:
    """pyobjc's ``Metal`` module; NotAvailableError off macOS or without pyobjc."""
    if sys.platform != "darwin":
        raise NotAvailableError(f"running Metal kernels needs macOS (this is {sys.platform})",
                                hint="validate here on the emulator (device='emulated'), "
                                     "or run on a Mac with `pip install tilenest[metal]`")
    try:
        import Metal
    except ImportError:
        raise NotAvailableError("running Metal kernels needs pyobjc-framework-Metal",
                                hint="pip install 'tilenest[metal]'") from None
    return Metal


class MetalDevice:
    """The system's default Metal device and a library compiled for it."""

    def __init__(self, source: str) -> None:
        Metal = metal_module()
        self.metal = Metal
        self.device = Metal.MTLCreateSystemDefaultDevice()
        if self.device is None:
            raise NotAvailableError("this Mac reports no Metal device")
        opts = Metal.MTLCompileOptions.alloc().init()
        opts.setFastMathEnabled_(False)  # MTLMathModeSafe: IEEE results
        lib, err = self.device.newLibraryWithSource_options_error_(source, opts, None)
        if lib is None:
            raise TilenestError(f"Metal's compiler rejected the source: {err}",
                                hint="the Metal emitter produced invalid MSL; "
                                     "tilenest.backends.metal.check type-checks it without a Mac")
        self.library = lib
        self.queue = self.device.newCommandQueue()
        self._pipelines: dict[str, Any] = {}

    def pipeline(self, name: str) -> Any:
        """The compute pipeline state of the kernel function ``name`` (cached)."""
        p = self._pipelines.get(name)
        if p is None:
            fn = self.library.newFunctionWithName_(name)
            if fn is None:
                raise TilenestError(f"the Metal library has no function {name}")
            p, err = self.device.newComputePipelineStateWithFunction_error_(fn, None)
            if p is None:
                raise TilenestError(f"Metal could not build a pipeline for {name}: {err}")
            self._pipelines[name] = p
        return p

    def _buffer(self, a: np.ndarray) -> Any:
        raw = np.ascontiguousarray(a).view(np.uint8).reshape(-1).tobytes() or bytes(4)
        return self.device.newBufferWithBytes_length_options_(
            raw, len(raw), self.metal.MTLResourceStorageModeShared)

    def dispatch(self, name: str, lay: ArgumentLayout, arrays: Sequence[np.ndarray],
                 scalars: Mapping[str, Any], symbols: Mapping[str, int], programs: int,
                 threads: int, threadgroup_bytes: int) -> int:
        """Run kernel function ``name`` once: ``arrays`` are the layout's
        tensors in order (written ones are updated in place), ``scalars`` and
        ``symbols`` fill the constant struct. Returns the status word."""
        grid, group = launch_geometry(name, programs, threads, threadgroup_bytes)
        if grid[0] == 0:
            return 0
        M = self.metal
        pipe = self.pipeline(name)
        if threads > pipe.maxTotalThreadsPerThreadgroup():
            raise TilenestError(f"{name}: {threads} threads per program; this pipeline "
                                f"allows {pipe.maxTotalThreadsPerThreadgroup()}",
                                hint="use fewer threads per program")
        bufs = [self._buffer(a.view(np.uint8) if a.dtype == np.bool_ else a) for a in arrays]
        status = self._buffer(np.zeros(1, dtype=np.int32))
        raw = lay.pack(scalars, symbols)
        cmd = self.queue.commandBuffer()
        enc = cmd.computeCommandEncoder()
        enc.setComputePipelineState_(pipe)
        for t, b in zip(lay.tensors, bufs, strict=True):
            enc.setBuffer_offset_atIndex_(b, 0, t.index)
        enc.setBytes_length_atIndex_(raw, len(raw), lay.struct_index)
        enc.setBuffer_offset_atIndex_(status, 0, lay.status_index)
        if threadgroup_bytes:
            enc.setThreadgroupMemoryLength_atIndex_((threadgroup_bytes + 15) // 16 * 16, 0)
        enc.dispatchThreadgroups_threadsPerThreadgroup_(M.MTLSizeMake(*grid), M.MTLSizeMake(*group))
        enc.endEncoding()
        cmd.commit()
        cmd.waitUntilCompleted()
        if cmd.error() is not None:
            raise TilenestError(f"{name}: the Metal dispatch failed: {cmd.error()}")
        for t, a, b in zip(lay.tensors, arrays, bufs, strict=True):
            if t.written and a.size:
                a.reshape(-1).view(np.uint8)[...] = _contents(b, a.nbytes)
        return int(_contents(status, 4).view(np.int32)[0])


def _contents(buf: Any, n: int) -> np.ndarray:
    """The first ``n`` bytes of a shared buffer, as a uint8 array."""
    return np.frombuffer(buf.contents().as_buffer(n), dtype=np.uint8).copy()
