"""Lowering: Candidate TileIR -> Scheduled TileIR -> loop IR.

Stages (each inspectable; ``tilenest lower --emit NAME``):

* ``schedule`` -- the :class:`Schedule` (default per target, or given), with
  the storage plan of intermediates and any transforms applied through the
  proofs layer (``schedule.apply_transforms``);
* ``loopir``   -- :func:`lower` builds the :class:`~tilenest.lowering.loopir.Kernel`
  and :func:`verify_kernel` checks it.

Backends consume the loop IR (``tilenest.backends.llvm``).
"""

from __future__ import annotations

from . import loopir
from .core import RULES, lower
from .loopir import Kernel, print_kernel
from .schedule import Schedule, default_schedule, host_vector_bits, storage_plan
from .verify import verify_kernel

__all__ = ["RULES", "Kernel", "Schedule", "default_schedule", "host_vector_bits", "lower",
           "loopir", "print_kernel", "storage_plan", "verify_kernel", "lower_verified"]


def lower_verified(program, schedule: Schedule | None = None) -> Kernel:
    """:func:`lower` followed by :func:`verify_kernel`."""
    k = lower(program, schedule)
    verify_kernel(k)
    return k
