"""Loop IR (SIMT form) -> CUDA C++: the glue of the CUDA backend's emitter.

The text is the SIMT emitter core's (:mod:`..simt.emitter`, whose docstring
states what a kernel becomes) in the CUDA spelling (:mod:`.dialect`) with
NVIDIA's extension rules (:mod:`.rules`): one ``extern "C" __global__``
function per phase, ``threadIdx.x``/``blockIdx.x``, ``__syncthreads()``,
``__shfl_*_sync`` collectives, ``mma.sync``/``wgmma`` tensor cores,
``cp.async`` and L2 policies. Every scalar operation is the prelude's
(``prelude/tn_prelude.cuh``) realization of its ``numerics.py`` meaning, or
a C++ operator where that is the same thing (IEEE float arithmetic with
``--fmad=false``, comparisons).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...lowering import loopir as L
from ..simt.analysis import implies as _implies  # noqa: F401  (named by tests)
from ..simt.analysis import in_place as _in_place  # noqa: F401
from ..simt.emitter import KernelInfo, Source
from .dialect import REG, const  # noqa: F401  (the CUDA spelling of types and literals)
from .rules import CudaEmitter as Emitter
from .rules import wgmma_wrapper  # noqa: F401
from .tensormaps import MapSpec


@dataclass(frozen=True)
class CudaKernelInfo(KernelInfo):
    """One emitted ``__global__`` function (:class:`..simt.emitter.KernelInfo`)."""


@dataclass(frozen=True)
class CudaSource(Source):
    """The CUDA C++ text of a kernel and its launch facts
    (:class:`..simt.emitter.Source`); ``maps``: the tensor maps its bulk
    copies read, passed after the status word (``tensormaps.py``)."""

    maps: tuple[MapSpec, ...] = ()


def _source(em: Emitter) -> CudaSource:
    """``em``'s source as a :class:`CudaSource` of :class:`CudaKernelInfo`."""
    src = em.source()
    infos = tuple(CudaKernelInfo(**{f: getattr(i, f) for f in i.__dataclass_fields__})
                  for i in src.kernels)
    return CudaSource(src.text, infos, src.index_bits, src.index, tuple(em.tensor_maps))


def emit_cuda(k: L.Kernel, aliased: frozenset[str] = frozenset(),
              index_bits: int = 64, min_blocks: int | None = None,
              hints: bool = False, grid_blocks: int | None = None) -> CudaSource:
    """The CUDA C++ source of SIMT-form kernel ``k`` (see the module docstring).

    With ``index_bits=32`` the index arithmetic is 32-bit wherever every index
    expression emitted is bounded by the loop ranges: the source then carries
    the ``index.width`` obligation (:func:`tilenest.proofs.gpu.index_width`),
    whose precondition a launch must meet; otherwise (a data-dependent index,
    or a bound over the limit for every size) the code is 64-bit and
    ``index`` says why. ``hints``: L2 cache policies on the wide global
    accesses (``Schedule.cache_hints``, :func:`cache_hints`); ``grid_blocks``:
    a cap on the blocks of a parallel phase, each looping over programs."""
    from ...proofs import gpu

    kw = {"aliased": aliased, "min_blocks": min_blocks, "hints": hints,
          "grid_blocks": grid_blocks}
    if index_bits == 64:
        return _source(Emitter(k, **kw))
    em = Emitter(k, narrow=True, **kw)
    src = _source(em)
    ob = gpu.index_width(k, em.roots)
    if isinstance(ob, str):
        return replace(_source(Emitter(k, **kw)), index=ob)
    return replace(src, index_bits=32, index=ob)
