"""Real kernels written in the DSL, each with an independent FP64 oracle.

See :mod:`tilenest.workloads.base` for what a workload is, and
:mod:`tilenest.workloads.bounds` for how each per-element error bound is
derived. ``WORKLOADS`` maps each name to its
:class:`~tilenest.workloads.base.Workload`; ``python -m tilenest.workloads``
runs them all and prints a table."""

from __future__ import annotations

from . import (attention, elementwise, embedding, gemm, losses, norms, rows, scans, selection,
               softmax)
from .base import Result, Workload, admitted, check, reference, run

FAMILIES = (gemm, elementwise, rows, softmax, norms, losses, attention, scans, selection,
            embedding)

WORKLOADS: dict[str, Workload] = {w.name: w for m in FAMILIES for w in m.WORKLOADS}

__all__ = ["WORKLOADS", "FAMILIES", "Workload", "Result", "run", "check", "admitted",
           "reference"]
