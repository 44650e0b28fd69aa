"""Loop IR (SIMT form) -> Metal Shading Language: the glue of the Metal
backend's emitter.

The text is the SIMT emitter core's (:mod:`..simt.emitter`, whose docstring
states what a kernel becomes) in the Metal spelling (:mod:`.dialect`) with
Metal's rules (:mod:`.rules`). Every source has this shape:

* it starts with ``#include "tn_metal.h"`` (the prelude,
  ``prelude/tn_metal.h``, which includes the portable ``tn_scalar.h`` and
  ``tn_mathf.h``); :func:`standalone` pastes the whole include chain in, for
  Metal's runtime, which compiles one string;
* then the argument struct of :mod:`.arguments`;
* then one ``kernel void <kernel>_<phase>(...)`` per phase, whose parameters
  are the argument contract's (tensors, the ``constant`` struct, the status
  word), ``threadgroup uchar* tn_smem [[threadgroup(0)]]`` when the phase
  uses shared buffers, and the builtins ``tn_tgpos``, ``tn_tpos``,
  ``tn_tgsize``, ``tn_lane``, ``tn_simd`` (:data:`.rules.BUILTINS`), in
  that order. One threadgroup runs one program (1-D dispatch: the program
  is ``tn_tgpos.x``, the thread ``tn_tpos.x``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any, Collection

from ...lowering import loopir as L
from ..simt.emitter import KernelInfo, Source
from . import arguments as ARG
from .rules import MetalEmitter


@dataclass(frozen=True)
class MetalKernelInfo(KernelInfo):
    """One emitted ``kernel`` function (:class:`..simt.emitter.KernelInfo`);
    ``threadgroup``: whether it takes ``tn_smem`` (then
    :attr:`shared_bytes` of threadgroup memory are bound at index 0)."""

    threadgroup: bool = False


@dataclass(frozen=True)
class MetalSource(Source):
    """The MSL text of a kernel, its launch facts and its argument layout."""

    args: Any = None


def written_buffers(k: L.Kernel) -> set[str]:
    """The global buffers some statement of ``k`` stores to."""
    return {s.buf.name for ph in k.phases for s in L.walk(ph.body)
            if isinstance(s, L.Store) and s.buf.space not in ("shared", "local")}


def _source(em: MetalEmitter, lay: ARG.ArgumentLayout) -> MetalSource:
    src = em.source()
    infos = []
    for i in src.kernels:
        d = {f: getattr(i, f) for f in KernelInfo.__dataclass_fields__}
        d["threadgroup"] = em.uses_shared.get(i.phase, False)
        infos.append(MetalKernelInfo(**d))
    return MetalSource(src.text, tuple(infos), src.index_bits, src.index, lay)


def emit_msl(k: L.Kernel, written: Collection[str] = (), index_bits: int = 64,
             arguments: int | None = None, grid_blocks: int | None = None) -> MetalSource:
    """The MSL source of SIMT-form kernel ``k`` (see the module docstring).
    ``written``: the tensor arguments the program stores to (besides those
    its loop IR visibly stores); ``arguments``: the caller's argument count
    (:func:`.arguments.layout`). ``index_bits=32`` narrows the index
    arithmetic under the ``index.width`` obligation, as ``emit_cuda`` does.
    Raises :class:`~tilenest.errors.NotAvailableError` for what Metal cannot
    run exactly (f64, partial-mask collectives, swizzled tiles)."""
    from ...proofs import gpu

    lay = ARG.layout(k, set(written) | written_buffers(k), arguments)
    kw: dict[str, Any] = {"grid_blocks": grid_blocks}
    if index_bits == 64:
        return _source(MetalEmitter(k, lay, **kw), lay)
    em = MetalEmitter(k, lay, narrow=True, **kw)
    src = _source(em, lay)
    ob = gpu.index_width(k, em.roots)
    if isinstance(ob, str):
        return replace(_source(MetalEmitter(k, lay, **kw), lay), index=ob)
    return replace(src, index_bits=32, index=ob)


def prelude_dirs() -> tuple[str, ...]:
    """The folders holding the Metal prelude and the portable headers it includes."""
    here = os.path.dirname(__file__)
    return (os.path.join(here, "prelude"),
            os.path.join(os.path.dirname(here), "simt", "prelude"))


_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$')
_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$")


def standalone(source: str) -> str:
    """``source`` with every ``#include "..."`` of the prelude chain replaced
    by the header's text (each header once, ``#pragma once`` dropped):
    one string for Metal's runtime compiler. ``<metal_stdlib>`` stays."""
    done: set[str] = set()

    def expand(text: str) -> list[str]:
        out: list[str] = []
        for line in text.split("\n"):
            if _ONCE.match(line):
                continue
            m = _INCLUDE.match(line)
            if not m:
                out.append(line)
                continue
            name = m.group(1)
            if name in done:
                continue
            path = next((os.path.join(d, name) for d in prelude_dirs()
                         if os.path.isfile(os.path.join(d, name))), None)
            if path is None:
                raise FileNotFoundError(f"prelude header {name} not found in {prelude_dirs()}")
            done.add(name)
            with open(path) as f:
                out.append(f"// ---- {name}")
                out += expand(f.read())
                out.append(f"// ---- end of {name}")
        return out

    return "\n".join(expand(source))
