"""Running a compiled Metal kernel on the emulated device (no Mac needed).

The generated MSL itself is compiled as host C++ by the SIMT emulator in its
``metal`` dialect (``backends/simt/emulator.py`` with the metal row's limits;
no NVRTC), the include path holding the Metal prelude and the portable
headers it includes (:func:`.emit.prelude_dirs`). A call runs the phases one
after another, as a Mac would dispatch them: each phase function over
``programs`` threadgroups of ``threads`` threads, with the parameters of
:mod:`.arguments` -- the tensors (the caller's, then the scratch buffers of
``calls.scratch_arrays``), the constant struct packed by
:meth:`~.arguments.ArgumentLayout.pack`, the status word -- and, for a phase
that has shared buffers, its threadgroup memory (poisoned before every
threadgroup). :func:`~.arguments.launch_geometry` refuses a dispatch beyond
the metal profile, and a nonzero status word raises the error it encodes
(``calls.status_error``). ``policy``, ``seed`` and ``poison`` choose the
thread interleaving and the poison, as for CUDA's emulated device.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

from ..calls import status_error
from .arguments import bind, dispatches

_LOCK = threading.Lock()


#: the emulator's ``<metal_stdlib>``: empty, the dialect's shim defines the library
EMU_INCLUDE = os.path.join(os.path.dirname(__file__), "emu")


def include_dirs() -> tuple[str, ...]:
    """The emulated build's include path: the Metal prelude, the portable
    SIMT prelude it includes, and the folder of the emulator's ``<metal_stdlib>``."""
    from .emit import prelude_dirs

    return (*prelude_dirs(), EMU_INCLUDE)


def module(kernel: Any) -> Any:
    """The emulator module of ``kernel``'s MSL (built once per kernel; the
    emulator's disk cache keeps the library across processes)."""
    if kernel._emu is None:
        with _LOCK:
            if kernel._emu is None:
                from ..simt import emulator
                src = kernel.source
                kernel._emu = emulator.build(src.text, dialect="metal",
                                             include_dirs=include_dirs())
    return kernel._emu


def arguments(lay: Any, facts: Any, keep: list, syms: dict[str, int],
              status: np.ndarray) -> list:
    """The launch arguments of every phase function, in the order of the
    argument contract: the arrays of :func:`~.arguments.bind`, the constant
    struct's bytes, the status word."""
    tensors, scalars = bind(lay, facts, keep)
    return [*tensors, np.frombuffer(lay.pack(scalars, syms), dtype=np.uint8).copy(), status]


def run(kernel: Any, keep: list, syms: dict[str, int], policy: str, seed: int,
        poison: str) -> None:
    """Run every phase of ``kernel`` (a :class:`~tilenest.backends.metal.MetalKernel`)
    on the emulator for one bound call (``keep``: the bound arguments with the
    scratch buffers appended; ``syms``: every symbol's value)."""
    mod = module(kernel)
    lay = kernel.source.args
    for d in dispatches(kernel, syms):
        status = np.zeros(1, dtype=np.int32)
        args = arguments(lay, kernel.facts, keep, syms, status)
        mod.launch(d.name, d.grid, d.group, args, shared_bytes=d.threadgroup_bytes,
                   policy=policy, seed=seed, poison=poison)
        if status[0]:
            raise status_error(kernel.program, kernel.facts, int(status[0]))
