"""Running a Metal kernel on a Mac, through pyobjc's ``Metal`` framework.

:class:`MetalDevice` compiles an MSL source with fast math off (Metal's
default is on; tilenest's numerical contract needs IEEE results), and
:meth:`MetalDevice.run` runs a call's phase functions in order, in one
command buffer, with the parameters of ``arguments.py``: one shared-storage
buffer per tensor (a copy of the array; written arrays are copied back after
the last phase), the constant struct from :meth:`ArgumentLayout.pack`, a
status word per phase, and the dispatches of :func:`.arguments.dispatches`.
:func:`run` is what calling a ``device="gpu"`` kernel does; a nonzero status
raises the error it encodes (``calls.status_error``).

``Metal`` is imported only inside these functions and only on macOS
(``sys.platform == "darwin"``); elsewhere asking for a device raises
:class:`~tilenest.errors.NotAvailableError` with a hint. Nothing here has
run on this project's machines (there is no Mac): the argument layout,
geometry and MSL text it relies on are tested without one, and this module's
calls into the framework are exercised against a stand-in ``Metal`` module
whose dispatches run the same source on the emulator
(``tests/test_metal_runtime.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import NotAvailableError, TilenestError
from ..calls import status_error
from .arguments import ArgumentLayout, Dispatch, bind, dispatches


def on_macos() -> bool:
    """Whether this process runs on macOS, the one system with Metal."""
    return sys.platform == "darwin"


def metal_module() -> Any:
    """pyobjc's ``Metal`` module; NotAvailableError off macOS or without pyobjc."""
    if not on_macos():
        raise NotAvailableError(f"running Metal kernels needs macOS (this is {sys.platform})",
                                hint="validate here on the emulator (device='emulated'), "
                                     "or run on a Mac with `pip install tilenest[metal]`")
    try:
        import Metal
    except ImportError:
        raise NotAvailableError("running Metal kernels needs pyobjc-framework-Metal",
                                hint="pip install 'tilenest[metal]'") from None
    return Metal


def safe_math(Metal: Any, opts: Any) -> None:
    """Turn fast math off in compile options ``opts``: ``mathMode`` safe and
    precise math functions where the SDK has them (macOS 15 and later),
    else ``fastMathEnabled = NO`` (the property they replace)."""
    if hasattr(opts, "setMathMode_"):
        opts.setMathMode_(Metal.MTLMathModeSafe)
        opts.setMathFloatingPointFunctions_(Metal.MTLMathFloatingPointFunctionsPrecise)
    else:
        opts.setFastMathEnabled_(False)


class MetalDevice:
    """The system's default Metal device and a library compiled for it."""

    def __init__(self, source: str) -> None:
        Metal = metal_module()
        self.metal = Metal
        self.device = Metal.MTLCreateSystemDefaultDevice()
        if self.device is None:
            raise NotAvailableError("this Mac reports no Metal device")
        opts = Metal.MTLCompileOptions.alloc().init()
        safe_math(Metal, opts)
        lib, err = self.device.newLibraryWithSource_options_error_(source, opts, None)
        if lib is None:
            raise TilenestError(f"Metal's compiler rejected the source: {err}",
                                hint="the Metal emitter produced invalid MSL; "
                                     "tilenest.backends.metal.check type-checks it without a Mac")
        self.library = lib
        self.queue = self.device.newCommandQueue()
        self._pipelines: dict[str, Any] = {}
        #: the GPU's own time for the last :meth:`run`'s command buffer (all
        #: its dispatches; no buffer copies), in seconds
        self.gpu_seconds = 0.0

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

    def run(self, lay: ArgumentLayout, tensors: Sequence[np.ndarray], struct: bytes,
            dispatches: Sequence[Dispatch]) -> int:
        """Run ``dispatches`` in order in one command buffer over one set of
        buffers: ``tensors`` are the layout's arrays (one shared buffer each,
        a copy; the ones the kernel writes are copied back when all have
        run), ``struct`` the constant buffer's bytes; each dispatch has its
        own status word. Returns the first nonzero status, else 0."""
        M = self.metal
        bufs = [self._buffer(a) for a in tensors]
        statuses = []
        cmd = self.queue.commandBuffer()
        for d in dispatches:
            pipe = self.pipeline(d.name)
            if d.group[0] > pipe.maxTotalThreadsPerThreadgroup():
                raise TilenestError(f"{d.name}: {d.group[0]} threads per program; this "
                                    f"pipeline allows {pipe.maxTotalThreadsPerThreadgroup()}",
                                    hint="use fewer threads per program")
            status = self._buffer(np.zeros(1, dtype=np.int32))
            statuses.append(status)
            enc = cmd.computeCommandEncoder()
            enc.setComputePipelineState_(pipe)
            for t, b in zip(lay.tensors, bufs, strict=True):
                enc.setBuffer_offset_atIndex_(b, 0, t.index)
            enc.setBytes_length_atIndex_(struct, len(struct), lay.struct_index)
            enc.setBuffer_offset_atIndex_(status, 0, lay.status_index)
            if d.threadgroup_bytes:
                enc.setThreadgroupMemoryLength_atIndex_((d.threadgroup_bytes + 15) // 16 * 16, 0)
            enc.dispatchThreadgroups_threadsPerThreadgroup_(M.MTLSizeMake(*d.grid),
                                                            M.MTLSizeMake(*d.group))
            enc.endEncoding()
        cmd.commit()
        cmd.waitUntilCompleted()
        if cmd.error() is not None:
            raise TilenestError(f"the Metal dispatch failed: {cmd.error()}",
                                hint="a kernel that faults on the GPU: validate it on the "
                                     "emulator (device='emulated') to find the access")
        self.gpu_seconds = float(cmd.GPUEndTime() - cmd.GPUStartTime())
        for t, a, b in zip(lay.tensors, tensors, bufs, strict=True):
            if t.written and a.size:
                a.reshape(-1).view(np.uint8)[...] = _contents(b, a.nbytes)
        codes = (int(_contents(st, 4).view(np.int32)[0]) for st in statuses)
        return next((c for c in codes if c), 0)


def run(kernel: Any, keep: list, syms: dict[str, int]) -> None:
    """Run every phase of ``kernel`` (a :class:`~tilenest.backends.metal.MetalKernel`
    on ``device="gpu"``) on the Mac's GPU for one bound call (``keep``: the
    bound arguments with the scratch buffers appended; ``syms``: every
    symbol's value); the library is compiled on the first call. A nonzero
    status word raises the error it encodes."""
    if kernel._gpu is None:
        try:
            kernel._gpu = MetalDevice(kernel.text)
        except NotAvailableError as e:  # off macOS, no pyobjc: point at the kernel
            raise e.with_site(kernel.program.site) from None
    lay = kernel.source.args
    tensors, scalars = bind(lay, kernel.facts, keep)
    code = kernel._gpu.run(lay, tensors, lay.pack(scalars, syms), dispatches(kernel, syms))
    if code:
        raise status_error(kernel.program, kernel.facts, code)


def _contents(buf: Any, n: int) -> np.ndarray:
    """The first ``n`` bytes of a shared buffer, as a uint8 array."""
    return np.frombuffer(buf.contents().as_buffer(n), dtype=np.uint8).copy()
